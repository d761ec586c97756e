"""Piece caches: merged pieces (piece bytes -> ids) kept across calls, lent to one call at a time.

A repeated word is merged once. Merged short pieces (up to ``tables.SHORT_PIECE_BYTES``) go into
a table laid out like the vocabulary's short table and probed with the same key and hash; the
others into a general table whose keys and ids live in arenas.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from ...native.hashing import EMPTY, hash_span, spans_equal
from ...native.hugepages import empty_in_huge_pages
from ...native.jit import index, kernel, leaf
from .merge import MEMO_BITS
from .tables import COUNT_SHIFT, ENTRY_WORDS, MAX_INLINE_IDS, find_entry, put_entry, short_hash


class PieceCache(NamedTuple):
    """Merged pieces (piece bytes -> ids) kept across calls; one call at a time uses one.

    Short pieces of at most ``MAX_INLINE_IDS`` ids go to ``short_slots`` (short entries, as in
    ``BpeTables.short_slots``); other pieces to a general table whose keys and ids live in
    fixed arenas. When a part is full it starts over, so memory stays at the size
    ``new_piece_cache`` allocated.
    """

    slots: np.ndarray  # int64 entry index per slot, EMPTY if free
    key_at: np.ndarray  # int64 offset of each entry's piece bytes in key_bytes
    key_len: np.ndarray  # int64
    ids_at: np.ndarray  # int64 offset of each entry's ids in ids
    ids_len: np.ndarray  # int64
    key_bytes: np.ndarray  # uint8 arena
    ids: np.ndarray  # int32 arena
    used: np.ndarray  # int64[4]: entries, key bytes, ids in use, short pieces added
    short_slots: np.ndarray  # uint64 short entries of merged short pieces
    pair_memo: np.ndarray  # uint64[2**merge.MEMO_BITS]: this thread's recent pair look-ups (merge.merge_rank)


ENTRIES, KEY_BYTES_USED, IDS_USED, SHORT_ADDED = 0, 1, 2, 3  # indices into PieceCache.used
SHORT_ADDED_LIMIT_DIVISOR = 2  # merged short pieces fill at most 1/2 of the short entries, then start over
# Caches start small and double when a call leaves one a quarter full (short table) or half full (the
# general table), up to the MAX_ sizes (about 80 MB): a steady stream of text in one language keeps most
# of its words cached, as the peers' growing caches do (docs/performance.md)
SHORT_CACHE_ENTRIES = 1 << 15
MAX_SHORT_CACHE_ENTRIES = 1 << 20
IN_GENERAL_TABLE = 15  # the id count of a short entry whose ids (more than MAX_INLINE_IDS) are in the general table
PIECE_CACHE_ENTRIES = 1 << 14
PIECE_CACHE_KEY_BYTES = 1 << 20
PIECE_CACHE_IDS = 1 << 18
MAX_PIECE_CACHE_ENTRIES = 1 << 18
MAX_PIECE_CACHE_KEY_BYTES = 1 << 24
MAX_PIECE_CACHE_IDS = 1 << 22


def new_piece_cache(entries: int = PIECE_CACHE_ENTRIES,
                    key_bytes: int = PIECE_CACHE_KEY_BYTES, ids: int = PIECE_CACHE_IDS,
                    short_slots: np.ndarray | None = None, short_entries: int = SHORT_CACHE_ENTRIES) -> PieceCache:
    """An empty cache for one thread (about 3 MB at first; ``grown_piece_cache`` doubles it as it fills),
    or with ``short_slots``: a zeroed short table made by the caller."""
    for name, n in (("entries", entries), ("short_entries", short_entries)):
        if n < 1 or n & (n - 1):
            raise ValueError(f"piece cache {name} must be a power of two, not {n}")
    layout = [(2 * entries, np.int64), (entries, np.int64), (entries, np.int64), (entries, np.int64),
              (entries, np.int64), (key_bytes, np.uint8), (ids, np.int32), (4, np.int64)]
    if short_slots is None:
        layout.append((ENTRY_WORDS * short_entries, np.uint64))
    layout.append((1 << MEMO_BITS, np.uint64))
    arrays = empty_in_huge_pages(layout)  # probed at random: in huge pages (see hugepages.py)
    arrays[-1].fill(0)
    if short_slots is None:
        arrays[-2].fill(0)
    else:
        arrays.insert(-1, short_slots)
    cache = PieceCache(*arrays)
    cache.slots.fill(EMPTY)
    cache.used.fill(0)
    return cache


class PieceCachePool:
    """Piece caches (or sets of them, one per route) lent to one call at a time: kernels write
    to them, so no two calls share one.

    A call borrows a free cache, or a new one when none is free; on return at most
    ``keep`` caches are kept, so memory stays bounded however many threads call,
    and a cache warmed by one thread serves the next call on any thread.
    """

    def __init__(self, make: Callable[[], PieceCache], keep: int,
                 grow: Callable[[PieceCache], PieceCache] | None = None) -> None:
        self._make = make
        self._keep = keep
        self._grow = grow  # applied to a cache given back, e.g. ``grown_piece_cache``
        self._free: list[PieceCache] = []
        self._lock = threading.Lock()

    @contextmanager
    def borrow(self, make: bool = True):
        """A cache for the ``with`` block, kept for later calls only if the block ends normally:
        after an error or Ctrl-C a worker thread may still be writing to it. When none is free,
        a new one, or None if not ``make`` (a new cache costs ~6 ms of page faults on a thread
        whose allocator has no free memory; see ``add_spare``)."""
        with self._lock:
            cache = self._free.pop() if self._free else None
        if cache is None:
            if not make:
                yield None
                return
            cache = self._make()
        yield cache
        self._put_back(cache)

    def _put_back(self, cache: PieceCache) -> None:
        if self._grow is not None:
            cache = self._grow(cache)
        with self._lock:
            if len(self._free) < self._keep:
                self._free.append(cache)

    def add_spare(self) -> None:
        """One more free cache, made now (on a thread with time to spare) for a later borrower."""
        self._put_back(self._make())

    def kept(self) -> list[PieceCache]:
        """The caches kept between calls (for tests and inspection)."""
        with self._lock:
            return list(self._free)


def grown_piece_cache(cache: PieceCache) -> PieceCache:
    """``cache``, or a copy with its tables doubled (entries moved over) where a call left them a
    quarter full (short table) or half full (general table) and they are below their maximum."""
    used = cache.used
    short_entries = cache.short_slots.shape[0] // ENTRY_WORDS
    grow_short = used[SHORT_ADDED] * 4 >= short_entries and short_entries < MAX_SHORT_CACHE_ENTRIES
    entries = cache.key_at.shape[0]
    grow_general = (used[ENTRIES] * 2 >= entries or used[KEY_BYTES_USED] * 2 >= cache.key_bytes.shape[0]
                    or used[IDS_USED] * 2 >= cache.ids.shape[0]) and entries < MAX_PIECE_CACHE_ENTRIES
    if not (grow_short or grow_general):
        return cache
    factor = 2 if grow_general else 1
    new = new_piece_cache(entries=entries * factor, key_bytes=cache.key_bytes.shape[0] * factor,
                          ids=cache.ids.shape[0] * factor, short_entries=short_entries * (2 if grow_short else 1))
    _move_entries(cache, new)
    return new


@kernel
def _move_entries(old, new):
    """Every piece of ``old`` into the empty, larger ``new`` (and its pair memo)."""
    old_short, new_short = old.short_slots, new.short_slots
    for entry in range(old_short.shape[0] // ENTRY_WORDS):
        at = entry * ENTRY_WORDS
        hi = old_short[at + 1]
        if hi == 0:
            continue
        lo = old_short[at]
        free, _ = find_entry(new_short, lo, hi, short_hash(lo, hi))
        for k in range(ENTRY_WORDS):
            new_short[free * ENTRY_WORDS + k] = old_short[at + k]
    new.used[SHORT_ADDED] = old.used[SHORT_ADDED]
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
    for k in range(3):
        new.used[k] = old.used[k]
    new.pair_memo[:] = old.pair_memo


@leaf
def _cache_find(cache, buf, start, end, h):
    """``(entry or EMPTY, slot)`` for the piece ``buf[start:end]`` with hash ``h``."""
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


@leaf
def _cache_store(cache, slot, buf, start, end, ids, ids_start, ids_end):
    """Remember ``ids[ids_start:ids_end]`` for the piece ``buf[start:end]`` at a free ``slot``."""
    used = cache.used
    length = end - start
    n_ids = ids_end - ids_start
    if length > cache.key_bytes.shape[0] or n_ids > cache.ids.shape[0]:
        return
    if (used[ENTRIES] == cache.key_at.shape[0] or used[KEY_BYTES_USED] + length > cache.key_bytes.shape[0]
            or used[IDS_USED] + n_ids > cache.ids.shape[0]):
        for k in range(cache.slots.shape[0]):  # full: start over
            cache.slots[index(k)] = EMPTY
        used[ENTRIES] = 0
        used[KEY_BYTES_USED] = 0
        used[IDS_USED] = 0
        mask = cache.slots.shape[0] - 1
        slot = np.int64(hash_span(buf, start, end) & np.uint64(mask))
    entry = used[ENTRIES]
    cache.slots[index(slot)] = entry
    cache.key_at[index(entry)] = used[KEY_BYTES_USED]
    cache.key_len[index(entry)] = length
    for k in range(length):
        cache.key_bytes[index(used[KEY_BYTES_USED] + k)] = buf[index(start + k)]
    cache.ids_at[index(entry)] = used[IDS_USED]
    cache.ids_len[index(entry)] = n_ids
    for k in range(n_ids):
        cache.ids[index(used[IDS_USED] + k)] = ids[index(ids_start + k)]
    used[ENTRIES] += 1
    used[KEY_BYTES_USED] += length
    used[IDS_USED] += n_ids


@leaf
def add_short_piece(cache, lo, hi, h, entry, out, ids_start, ids_end):
    """Add a merged short piece (key ``(lo, hi)``, hash ``h``, free ``entry``) to this thread's short
    table; returns whether its ids fit the entry (else the entry only says ``IN_GENERAL_TABLE``
    and the caller stores the ids there). Past 1/``SHORT_ADDED_LIMIT_DIVISOR`` of the
    entries the table starts over (a memset; no resizing, so memory stays bounded)."""
    n_ids = ids_end - ids_start
    table = cache.short_slots
    n_entries = table.shape[0] // ENTRY_WORDS
    if cache.used[SHORT_ADDED] * SHORT_ADDED_LIMIT_DIVISOR >= n_entries:
        for k in range(table.shape[0]):
            table[index(k)] = 0
        cache.used[SHORT_ADDED] = 0
        entry = np.int64(h & np.uint64(n_entries - 1))
    cache.used[SHORT_ADDED] += 1
    if n_ids > MAX_INLINE_IDS:  # a marker: its ids are in the general table
        put_entry(table, entry, lo, hi, out, ids_start, 0)
        table[index(entry * ENTRY_WORDS + 2)] = np.uint64(IN_GENERAL_TABLE) << np.uint64(COUNT_SHIFT)
        return False
    put_entry(table, entry, lo, hi, out, ids_start, n_ids)
    return True
