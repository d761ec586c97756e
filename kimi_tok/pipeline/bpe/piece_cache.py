"""Piece caches: merged pieces (piece bytes -> ids) kept across calls, lent to one call at a time.

A repeated word is merged once. Merged short pieces (up to ``tables.SHORT_PIECE_BYTES``) go into
a table laid out like the vocabulary's short table and probed with the same key and hash; the
others into a general table whose keys and ids live in arenas.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from ...native.hashing import EMPTY, hash_span, spans_equal
from ...native.hugepages import zeros_in_huge_pages
from ...native.jit import index, kernel, leaf, leaf_inline
from .merge import MEMO_BITS
from .tables import ENTRY_WORDS, find_entry, short_hash


class PieceCache(NamedTuple):
    """Merged pieces (piece bytes -> ids) kept across calls; one call at a time uses one.

    ``short_slots`` starts as a copy of the vocabulary's short table (``BpeTables.short_slots``) and
    takes the merged short pieces of at most ``MAX_INLINE_IDS`` ids too, so that one probe answers
    both "is it a token" and "was it merged before"; other pieces go to a general table whose keys
    and ids live in arenas. When a part is full it starts over, so memory stays at the size
    ``new_piece_cache`` allocated.
    """

    slots: np.ndarray  # int64 entry index per slot, EMPTY if free
    key_at: np.ndarray  # int64 offset of each entry's piece bytes in key_bytes
    key_len: np.ndarray  # int64
    ids_at: np.ndarray  # int64 offset of each entry's ids in ids
    ids_len: np.ndarray  # int64
    key_bytes: np.ndarray  # uint8 arena
    ids: np.ndarray  # int32 arena
    used: np.ndarray  # int64[N_USED]: counts (ENTRIES, ..., SHORT_RESETS)
    short_slots: np.ndarray  # uint64 short entries of merged short pieces
    pair_memo: np.ndarray  # uint64[2**merge.MEMO_BITS]: this thread's recent pair look-ups (merge.merge_rank)


# indices into PieceCache.used: general entries, key bytes, ids in use; short pieces added, the vocabulary's
# entries in the short table, times the short table started over
ENTRIES, KEY_BYTES_USED, IDS_USED, SHORT_ADDED, SHORT_BASE, SHORT_RESETS = 0, 1, 2, 3, 4, 5
N_USED = 6
# a short table starts over (the vocabulary's entries put back) past half full during a call: a piece added
# later lands further from its slot and is read slower ever after (added at 0.5 full +17%, at 0.7 +37% on cached
# French; docs/performance.md, "The short table's load"). One that did not start from the vocabulary's entries
# grows 2x when a call leaves it 3/8 full (up to MAX_SHORT_CACHE_ENTRIES). One that did starts at
# SEEDED_SHORT_FACTOR times the vocabulary's table (the vocabulary 16% of it) and never grows: moving a table of
# 8-64 MB took 80-233 ms, a stall of the call that gave the cache back
SHORT_FULL_EIGHTHS = 4
SHORT_GROW_EIGHTHS = 3
SEEDED_SHORT_FACTOR = 4
# An unseeded short table (the routes' caches) starts small and grows 2x when a call leaves it 3/8 full, up to
# MAX_SHORT_CACHE_ENTRIES. The general table is reserved at its full size (about 44 MB of address space, backed
# as entries are written): growing it in the call that gave the cache back cost 15-70 ms per growth, most of
# it the first writes to the new memory (docs/performance.md, "Piece caches reserved at full size"). A cache
# made smaller (``new_piece_cache``'s sizes) grows 4x at half full, up to the MAX_ sizes.
SHORT_CACHE_ENTRIES = 1 << 15
MAX_SHORT_CACHE_ENTRIES = 1 << 21
IN_GENERAL_TABLE = 15  # the id count of a short entry whose ids (more than MAX_INLINE_IDS) are in the general table
MAX_PIECE_CACHE_ENTRIES = 1 << 18
MAX_PIECE_CACHE_KEY_BYTES = 1 << 24
MAX_PIECE_CACHE_IDS = 1 << 22


def new_piece_cache(vocabulary_short: np.ndarray | None = None, entries: int = MAX_PIECE_CACHE_ENTRIES,
                    key_bytes: int = MAX_PIECE_CACHE_KEY_BYTES, ids: int = MAX_PIECE_CACHE_IDS,
                    short_slots: np.ndarray | None = None, short_entries: int = SHORT_CACHE_ENTRIES) -> PieceCache:
    """An empty cache for one thread whose short table holds the entries of ``vocabulary_short`` (a
    vocabulary's ``BpeTables.short_slots``) in ``SEEDED_SHORT_FACTOR`` times its size, or is
    ``short_slots`` (a zeroed table made by the caller), or a zeroed one of ``short_entries``;
    ``grown_piece_cache`` makes an unseeded short table (and a general table made smaller than the maximum)
    larger as calls fill them."""
    for name, n in (("entries", entries), ("short_entries", short_entries)):
        if n < 1 or n & (n - 1):
            raise ValueError(f"piece cache {name} must be a power of two, not {n}")
    general = _new_general_table(entries, key_bytes, ids)
    base = 0
    if vocabulary_short is not None:
        short_slots = _new_short_table(SEEDED_SHORT_FACTOR * vocabulary_short.shape[0] // ENTRY_WORDS)
        _move_short_entries(vocabulary_short, short_slots)
        base = int(np.count_nonzero(vocabulary_short[1::ENTRY_WORDS]))
    elif short_slots is None:
        short_slots = _new_short_table(short_entries)
    general[-1][SHORT_BASE] = base
    return PieceCache(*general, short_slots, _new_short_table(0, memo=True))


def _new_general_table(entries: int, key_bytes: int, ids: int) -> list[np.ndarray]:
    """slots, key_at, key_len, ids_at, ids_len, key_bytes, ids, used: empty. Small pages, backed as entries
    are written: huge pages would back 2 MB of each array at its first entry (14 MB a cache for a few
    pieces), and calls read as fast (docs/performance.md, "Piece caches reserved at full size")."""
    arrays = [np.zeros(shape, dtype=dtype) for shape, dtype in (
        (2 * entries, np.int64), (entries, np.int64), (entries, np.int64), (entries, np.int64), (entries, np.int64),
        (key_bytes, np.uint8), (ids, np.int32), (N_USED, np.int64))]
    arrays[0].fill(EMPTY)
    return arrays


def _new_short_table(entries: int, memo: bool = False) -> np.ndarray:
    """A zeroed table of ``entries`` short entries, or (``memo``) a zeroed pair memo; its pages are backed
    only as they are written."""
    shape = (1 << MEMO_BITS) if memo else ENTRY_WORDS * entries
    return zeros_in_huge_pages([(shape, np.uint64)])[0]


class PieceCachePool:
    """Piece caches (or sets of them, one per route) lent to one call at a time: kernels write
    to them, so no two calls share one.

    A call borrows a free cache, or a new one when none is free; on return at most
    ``keep`` caches are kept, so memory stays bounded however many threads call, and a cache
    warmed by one thread serves the next call on any thread. The free list is a plain list whose
    ``pop`` and ``append`` are atomic: no lock, whose first use after other work costs a short
    call ~15 us.
    """

    def __init__(self, make: Callable[[], PieceCache], keep: int,
                 grow: Callable[[PieceCache], PieceCache] | None = None) -> None:
        self._make = make
        self._keep = keep
        self._grow = grow  # applied to a cache given back, e.g. ``grown_piece_cache``
        self._free: list[tuple[PieceCache, object]] = []  # (cache, the bundle given back with it, or None)

    @contextmanager
    def borrow(self, make: bool = True):
        """A cache for the ``with`` block, kept for later calls only if the block ends normally:
        after an error or Ctrl-C a worker thread may still be writing to it. When none is free,
        a new one, or None if not ``make`` (a new cache costs ~6 ms of page faults on a thread
        whose allocator has no free memory; see ``add_spare``)."""
        cache, bundle = self.take(make=False)
        if cache is None:
            if not make:
                yield None
                return
            cache = self._make()
        yield cache
        self.give_back(cache, bundle)

    def take(self, make: bool = True) -> tuple[PieceCache | None, object]:
        """``borrow`` without a ``with`` block (a short call's few microseconds): a free cache (or a new
        one; ``(None, None)`` if not ``make``) and the bundle given back with it (what a short call keeps with
        the cache: its ``native.bundles`` object and the compiled call for it, ``SubstringEncoder.encode_pairs``;
        None if none was, or the cache grew since). Hand both to ``give_back`` unless the call using them failed."""
        try:
            return self._free.pop()  # one list operation, atomic: no lock (a lock costs ~15 us after other work)
        except IndexError:
            return (self._make(), None) if make else (None, None)

    def give_back(self, cache: PieceCache, bundle: object = None, may_grow: bool = True) -> None:
        """A cache from ``take`` (with its bundle) or ``borrow``, kept for later calls while fewer than
        ``keep`` are; the bundle of a cache that grows is dropped (it holds the old arrays). ``may_grow``
        False: the caller knows the cache needs no growing (``growth_needed``)."""
        if may_grow and self._grow is not None:
            grown = self._grow(cache)
            if grown is not cache:
                cache, bundle = grown, None
        free = self._free
        free.append((cache, bundle))
        while len(free) > self._keep:  # each thread trims after its own append, so at most keep stay
            try:
                free.pop()
            except IndexError:  # other threads took the rest meanwhile
                break

    def new(self) -> PieceCache:
        """A new cache for a thread that keeps it (the short-call helper), not one from the free list: the
        call that starts such a thread may be fanning out, and its threads need the free ones (one that found
        none made a cache in the call, 40-85 ms of fresh huge pages; docs/performance.md)."""
        return self._make()

    def add_spare(self) -> None:
        """One more free cache, made now (on a thread with time to spare) for a later borrower."""
        self.give_back(self._make())

    def kept(self) -> list[PieceCache]:
        """The caches kept between calls (for tests and inspection)."""
        return [cache for cache, _ in list(self._free)]


def grown_piece_cache(cache: PieceCache) -> PieceCache:
    """``cache``, or a copy with a larger table (its entries moved over) where a call left an unseeded
    short table 3/8 full or had to start over (then 2x), or the general table half full (then 4x: few
    growths, as fresh memory costs page faults), up to their maximum; the other table is shared."""
    grow_short, grow_general = growth_needed(cache)
    used = cache.used
    short_entries = cache.short_slots.shape[0] // ENTRY_WORDS
    entries = cache.key_at.shape[0]
    if grow_short:
        short_slots = _new_short_table(2 * short_entries)
        _move_short_entries(cache.short_slots, short_slots)
        cache = cache._replace(short_slots=short_slots)
        used[SHORT_RESETS] = 0
    if grow_general:
        factor = min(4, MAX_PIECE_CACHE_ENTRIES // entries)
        general = PieceCache(*_new_general_table(factor * entries, factor * cache.key_bytes.shape[0],
                                                 factor * cache.ids.shape[0]), cache.short_slots, cache.pair_memo)
        _move_general_entries(cache, general)
        cache = general
    return cache


@leaf
def growth_needed(cache):
    """``(grow_short, grow_general)``: whether ``grown_piece_cache`` grows the short table (not seeded
    from the vocabulary, and 3/8 full or started over) and the general table (half full), each below its
    maximum. A short call's kernel answers it too, so that giving its cache back reads no NumPy scalars
    (~14 us after other work; docs/performance.md, "The fixed cost of a short call")."""
    used = cache.used
    short_entries = cache.short_slots.shape[0] // ENTRY_WORDS
    grow_short = (used[SHORT_BASE] == 0 and (used[SHORT_RESETS] > 0 or used[SHORT_ADDED] * 8 >= short_entries
                                              * SHORT_GROW_EIGHTHS) and short_entries < MAX_SHORT_CACHE_ENTRIES)
    entries = cache.key_at.shape[0]
    grow_general = (used[ENTRIES] * 2 >= entries or used[KEY_BYTES_USED] * 2 >= cache.key_bytes.shape[0]
                    or used[IDS_USED] * 2 >= cache.ids.shape[0]) and entries < MAX_PIECE_CACHE_ENTRIES
    return grow_short, grow_general


@kernel
def _move_short_entries(old, new):
    """Every short entry of ``old`` into the empty, larger ``new``."""
    for entry in range(old.shape[0] // ENTRY_WORDS):
        at = entry * ENTRY_WORDS
        hi = old[at + 1]
        if hi == 0:
            continue
        lo = old[at]
        free, _ = find_entry(new, lo, hi, short_hash(lo, hi))
        for k in range(ENTRY_WORDS):
            new[free * ENTRY_WORDS + k] = old[at + k]
    return 0


@kernel
def _move_general_entries(old, new):
    """Every entry of ``old``'s general table into ``new``'s empty, larger one (and the counts)."""
    mask = new.slots.shape[0] - 1
    for entry in range(old.used[ENTRIES]):
        start = old.key_at[entry]
        end = start + old.key_len[entry]
        slot = np.int64(hash_span(old.key_bytes, start, end) & np.uint64(mask))
        while new.slots[slot] != EMPTY:
            slot = (slot + 1) & mask
        new.slots[slot] = entry
        new.key_at[entry] = start
        new.key_len[entry] = old.key_len[entry]
        new.ids_at[entry] = old.ids_at[entry]
        new.ids_len[entry] = old.ids_len[entry]
    new.key_bytes[:old.used[KEY_BYTES_USED]] = old.key_bytes[:old.used[KEY_BYTES_USED]]
    new.ids[:old.used[IDS_USED]] = old.ids[:old.used[IDS_USED]]
    for k in range(old.used.shape[0]):
        new.used[k] = old.used[k]
    return 0


@leaf_inline
def cache_find(cache, buf, start, end, h):
    """``(entry or EMPTY, slot)`` for the piece ``buf[start:end]`` with hash ``h`` in the general table."""
    mask = cache.slots.shape[0] - 1
    length = end - start
    slot = np.int64(h & np.uint64(mask))
    while True:
        entry = cache.slots[index(slot)]
        if entry == EMPTY:
            return EMPTY, slot
        if cache.key_len[index(entry)] == length and spans_equal(cache.key_bytes, cache.key_at[index(entry)], buf,
                                                                 start, length):
            return entry, slot
        slot = (slot + 1) & mask


@leaf_inline
def cache_store(cache, slot, h, buf, start, end, ids, ids_start, ids_end):
    """Remember ``ids[ids_start:ids_end]`` for the piece ``buf[start:end]`` (hash ``h``) at a free
    ``slot`` of the general table; a full table starts over."""
    used = cache.used
    length = end - start
    n_ids = ids_end - ids_start
    if length > cache.key_bytes.shape[0] or n_ids > cache.ids.shape[0]:
        return
    if (used[index(ENTRIES)] == cache.key_at.shape[0] or used[index(KEY_BYTES_USED)] + length > cache.key_bytes.shape[0]
            or used[index(IDS_USED)] + n_ids > cache.ids.shape[0]):
        _start_general_table_over(cache)
        slot = np.int64(h & np.uint64(cache.slots.shape[0] - 1))
    entry = used[index(ENTRIES)]
    cache.slots[index(slot)] = entry
    key_at = used[index(KEY_BYTES_USED)]
    ids_at = used[index(IDS_USED)]
    cache.key_at[index(entry)] = key_at
    cache.key_len[index(entry)] = length
    for k in range(length):
        cache.key_bytes[index(key_at + k)] = buf[index(start + k)]
    cache.ids_at[index(entry)] = ids_at
    cache.ids_len[index(entry)] = n_ids
    for k in range(n_ids):
        cache.ids[index(ids_at + k)] = ids[index(ids_start + k)]
    used[index(ENTRIES)] = entry + 1
    used[index(KEY_BYTES_USED)] = key_at + length
    used[index(IDS_USED)] = ids_at + n_ids


@leaf
def _start_general_table_over(cache):
    for k in range(cache.slots.shape[0]):
        cache.slots[index(k)] = EMPTY
    cache.used[index(ENTRIES)] = 0
    cache.used[index(KEY_BYTES_USED)] = 0
    cache.used[index(IDS_USED)] = 0


def empty_piece_cache(tables, cache: PieceCache) -> None:
    """Forget every merged piece and pair look-up of ``cache`` (a piece cache of ``tables``' vocabulary), as
    before a process's first call: for benchmarks of merging (``bench.bpe_ab --fresh``)."""
    start_short_table_over(tables, cache)
    _start_general_table_over(cache)
    cache.pair_memo[:] = 0


@leaf
def start_short_table_over(tables, cache):
    """Empty the short table of its merged pieces: the vocabulary's entries only (or none, for a table
    that did not start from them)."""
    table = cache.short_slots
    for k in range(table.shape[0]):
        table[index(k)] = 0
    if cache.used[SHORT_BASE] > 0:
        vocabulary = tables.short_slots
        for entry in range(vocabulary.shape[0] // ENTRY_WORDS):
            at = entry * ENTRY_WORDS
            hi = vocabulary[index(at + 1)]
            if hi != 0:
                lo = vocabulary[index(at)]
                free, _ = find_entry(table, lo, hi, short_hash(lo, hi))
                for k in range(ENTRY_WORDS):
                    table[index(free * ENTRY_WORDS + k)] = vocabulary[index(at + k)]
    cache.used[SHORT_ADDED] = 0
    cache.used[SHORT_RESETS] += 1
