"""Byte-pair encoding of pre-tokenized pieces, compiled with numba.

Same algorithm as tiktoken (``_educational.bpe_encode`` is the readable spec):

1. a piece that is itself a vocabulary token is that token;
2. otherwise start from single bytes and repeatedly merge the adjacent pair whose
   concatenation has the lowest rank, the leftmost one on ties.

Tables are built once per vocabulary (``BpeTables``): a dense 256x256 table for
the first round of byte pairs, a pair -> merged-token table for later rounds
and a byte-span hash table for whole-piece look-ups. Pieces of up to
``SMALL_PIECE_BYTES`` merge in a fixed scratch buffer with a linear min-rank scan;
longer ones use a heap over a linked list of parts (O(n log n), so a 25,000
letter run stays fast). A piece cache kept across calls (lent to one call at a time)
makes a repeated word merge once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import hashing
from .hugepages import empty_in_huge_pages
from .jit import index, kernel, leaf
from .hashing import (
    EMPTY,
    build_span_table,
    find_span,
    hash_span,
    int_slot,
    mix64,
    spans_equal,
    table_size_for,
)

NO_MERGE = np.int32(0x7FFFFFFF)  # rank of a pair that is not in the vocabulary
SMALL_PIECE_BYTES = 32  # pieces up to this size merge in the scratch buffer
# Long pieces made of few runs of equal bytes merge as blocks of equal parts (merge_repetitive_piece):
REPETITIVE_MIN_PIECE_BYTES = 256  # shorter ones are cheap enough for the heap
REPETITIVE_MAX_BLOCKS = 64  # more runs than this: not repetitive, the heap is as good
REPETITIVE_WORK_PER_BYTE = 4  # block visits allowed per byte before handing over to the heap
PAIR_SHIFT = 32  # pair key = left << PAIR_SHIFT | right
RANK_SHIFT = 32  # heap entry = rank << RANK_SHIFT | part index
LOW_32_BITS = (1 << 32) - 1
SHORT_TOKEN_BYTES = 7  # tokens this short are found by one integer compare
SHORT_LENGTH_SHIFT = 56  # short key = bytes little-endian | length << SHORT_LENGTH_SHIFT
NO_SHORT_KEY = np.uint64(0)  # an empty slot (real keys carry a non-zero length)
PACKED_ID_BITS = 20  # a short piece's value: up to 3 ids below 2**20 and their count in one uint64
PACKED_ID_MASK = (1 << PACKED_ID_BITS) - 1
MAX_PACKED_IDS = 3
MAX_VOCABULARY_TOKENS = 1 << PACKED_ID_BITS  # every rank must fit a packed id
PACKED_COUNT_SHIFT = MAX_PACKED_IDS * PACKED_ID_BITS
CACHE_DIR_ENV = "KIMI_TOK_CACHE_DIR"
TABLES_FORMAT = 2  # part of the cache file name, with a digest of this module's source


class BpeTables(NamedTuple):
    """Everything the BPE kernels read, built once per vocabulary."""

    token_bytes: np.ndarray  # uint8, every token's bytes in rank order
    token_offsets: np.ndarray  # int64[n + 1]
    token_slots: np.ndarray  # int32 hash slots -> rank
    byte_rank: np.ndarray  # int32[256]
    byte_pair_rank: np.ndarray  # int32[256 * 256], NO_MERGE when absent
    pair_slots: np.ndarray  # int64 pairs (left << PAIR_SHIFT | right, merged rank)
    short_slots: np.ndarray  # uint64 pairs (short key, packed ids): one cache line per probe


def cached_bpe_tables(token_bytes: np.ndarray, token_offsets: np.ndarray) -> BpeTables:
    """``build_bpe_tables``, saved once per vocabulary under ``$KIMI_TOK_CACHE_DIR``
    (default ``~/.cache/kimi_tok``) and read back on later loads (measured: 0.21 s to
    build the K3 tables, ~0.02 s to read them). An unwritable or damaged cache only
    means building them again.
    """
    root = cache_root()
    path = root / f"bpe-tables-v{TABLES_FORMAT}-{tables_digest(token_bytes, token_offsets)}.npz"
    try:
        with np.load(path) as stored:
            return BpeTables(**{name: stored[name] for name in BpeTables._fields})
    except Exception:  # missing, truncated, not an npz, wrong fields: whatever it is, rebuild
        pass
    tables = build_bpe_tables(token_bytes, token_offsets)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **tables._asdict())
        os.replace(tmp, path)
    except OSError:
        pass
    return tables


def cache_root() -> Path:
    """``$KIMI_TOK_CACHE_DIR``, default ``~/.cache/kimi_tok``."""
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "kimi_tok")


def tables_digest(token_bytes: np.ndarray, token_offsets: np.ndarray) -> str:
    """Names the tables of a vocabulary as built by the source that decides their layout (this
    module and ``hashing.py``, whose hashes place the keys), so a changed layout never reads
    tables built by other code."""
    source = b"".join(Path(module.__file__).read_bytes() for module in (sys.modules[__name__], hashing))
    return hashlib.sha256(token_bytes.tobytes() + token_offsets.tobytes() + source).hexdigest()[:32]


def save_mappable_tables(tables: BpeTables) -> Path:
    """The tables as one ``.npy`` file per array (memory-mappable), saved once per vocabulary
    under the cache root, or under the temporary directory where that cannot be written."""
    name = f"bpe-tables-v{TABLES_FORMAT}-{tables_digest(tables.token_bytes, tables.token_offsets)}"
    try:
        return _save_arrays(tables, cache_root() / name)
    except OSError:  # a read-only cache root
        return _save_arrays(tables, Path(tempfile.gettempdir()) / f"kimi_tok-{os.getuid()}" / name)


def _save_arrays(tables: BpeTables, path: Path) -> Path:
    if all((path / f"{name}.npy").is_file() for name in BpeTables._fields):
        return path
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for name, array in tables._asdict().items():
        np.save(tmp / f"{name}.npy", array)
    try:
        os.replace(tmp, path)
    except OSError:  # another process saved them first
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def map_tables(path: Path) -> BpeTables:
    """Tables saved by ``save_mappable_tables``, memory-mapped copy-on-write: worker processes
    share the pages, and the arrays keep the writable type the compiled kernels were built for."""
    return BpeTables(**{name: np.asarray(np.load(path / f"{name}.npy", mmap_mode="c")) for name in BpeTables._fields})


def build_bpe_tables(token_bytes: np.ndarray, token_offsets: np.ndarray) -> BpeTables:
    """Build the tables for a vocabulary whose rank ``i`` is ``token_bytes[off[i]:off[i+1]]``.

    Raises ``ValueError`` when a token repeats or a single byte has no token.
    """
    n_tokens = token_offsets.shape[0] - 1
    if n_tokens > MAX_VOCABULARY_TOKENS:
        raise ValueError(
            f"vocabulary of {n_tokens:,} tokens: at most {MAX_VOCABULARY_TOKENS:,} are supported "
            f"(short pieces pack their ids in {PACKED_ID_BITS} bits)"
        )
    slots, duplicate = build_span_table(token_bytes, token_offsets, table_size_for(n_tokens))
    if duplicate >= 0:
        raise ValueError(f"vocabulary token of rank {duplicate} repeats an earlier token")
    byte_rank, byte_pair_rank = _byte_tables(token_bytes, token_offsets, slots)
    missing = np.flatnonzero(byte_rank < 0)
    if missing.size:
        raise ValueError(
            f"vocabulary lacks single-byte tokens (byte-level BPE needs all 256), e.g. byte {missing[0]}"
        )
    n_pairs = _count_pairs(token_bytes, token_offsets, slots)
    pair_slots = _build_pair_table(
        token_bytes, token_offsets, slots, table_size_for(n_pairs)
    )
    n_short = int(np.count_nonzero(np.diff(token_offsets) <= SHORT_TOKEN_BYTES))
    short_slots = _build_short_table(token_bytes, token_offsets, table_size_for(n_short))
    return BpeTables(
        token_bytes, token_offsets, slots, byte_rank, byte_pair_rank, pair_slots, short_slots
    )


@leaf
def short_key(buf, start, end):
    """The bytes of a piece of at most ``SHORT_TOKEN_BYTES`` packed with its length."""
    key = np.uint64(end - start) << np.uint64(SHORT_LENGTH_SHIFT)
    for k in range(end - start):
        key |= np.uint64(buf[index(start + k)]) << np.uint64(8 * k)
    return key


@kernel
def _build_short_table(token_bytes, token_offsets, n_slots):
    table = np.zeros(2 * n_slots, dtype=np.uint64)
    mask = n_slots - 1
    for rank in range(token_offsets.shape[0] - 1):
        start = token_offsets[rank]
        end = token_offsets[rank + 1]
        if end - start > SHORT_TOKEN_BYTES:
            continue
        key = short_key(token_bytes, start, end)
        slot = np.int64(mix64(key) & np.uint64(mask))
        while table[2 * slot] != NO_SHORT_KEY:
            slot = (slot + 1) & mask
        table[2 * slot] = key
        table[2 * slot + 1] = (np.uint64(1) << np.uint64(PACKED_COUNT_SHIFT)) | np.uint64(rank)
    return table


@leaf
def find_short_piece(table, key):
    """``(packed ids or 0, slot)`` of a short piece's ``key`` in a short table."""
    mask = (table.shape[0] >> 1) - 1
    slot = np.int64(mix64(key) & np.uint64(mask))
    while True:
        stored = table[index(2 * slot)]
        if stored == key:
            return table[index(2 * slot + 1)], slot
        if stored == NO_SHORT_KEY:
            return np.uint64(0), slot
        slot = (slot + 1) & mask


@leaf
def packed_count(packed):
    return np.int64(packed >> np.uint64(PACKED_COUNT_SHIFT))


@leaf
def packed_id(packed, k):
    return np.int64((packed >> np.uint64(PACKED_ID_BITS * k)) & np.uint64(PACKED_ID_MASK))


@leaf
def find_short_token(table, buf, start, end):
    """Rank of the token ``buf[start:end]`` (at most ``SHORT_TOKEN_BYTES``), or ``EMPTY``."""
    packed, _ = find_short_piece(table, short_key(buf, start, end))
    if packed_count(packed) != 1:
        return EMPTY
    return packed_id(packed, 0)


@kernel
def _byte_tables(token_bytes, token_offsets, slots):
    byte_rank = np.full(256, EMPTY, dtype=np.int32)
    byte_pair_rank = np.full(256 * 256, NO_MERGE, dtype=np.int32)
    probe = np.zeros(2, dtype=np.uint8)
    for a in range(256):
        probe[0] = a
        byte_rank[a] = find_span(slots, token_bytes, token_offsets, probe, 0, 1, hash_span(probe, 0, 1))
        for b in range(256):
            probe[1] = b
            rank = find_span(slots, token_bytes, token_offsets, probe, 0, 2, hash_span(probe, 0, 2))
            if rank != EMPTY:
                byte_pair_rank[a * 256 + b] = rank
    return byte_rank, byte_pair_rank


@kernel
def _for_each_split(token_bytes, token_offsets, slots, pair_slots, count_only):
    """Visit every split of every token into two tokens; count or insert the pairs."""
    n_pairs = 0
    mask = (pair_slots.shape[0] >> 1) - 1
    for merged in range(token_offsets.shape[0] - 1):
        start = token_offsets[merged]
        end = token_offsets[merged + 1]
        for cut in range(start + 1, end):
            left = find_span(slots, token_bytes, token_offsets, token_bytes, start, cut,
                             hash_span(token_bytes, start, cut))
            if left == EMPTY:
                continue
            right = find_span(slots, token_bytes, token_offsets, token_bytes, cut, end,
                              hash_span(token_bytes, cut, end))
            if right == EMPTY:
                continue
            n_pairs += 1
            if not count_only:
                key = (np.int64(left) << PAIR_SHIFT) | right
                slot = int_slot(key, mask)
                while pair_slots[2 * slot] != EMPTY:
                    slot = (slot + 1) & mask
                pair_slots[2 * slot] = key
                pair_slots[2 * slot + 1] = merged
    return n_pairs


def _count_pairs(token_bytes, token_offsets, slots) -> int:
    return _for_each_split(token_bytes, token_offsets, slots, np.full(2, EMPTY, dtype=np.int64), True)


def _build_pair_table(token_bytes, token_offsets, slots, n_slots):
    pair_slots = np.full(2 * n_slots, EMPTY, dtype=np.int64)
    _for_each_split(token_bytes, token_offsets, slots, pair_slots, False)
    return pair_slots


@leaf
def pair_rank(tables, left, right):
    """Rank of the token whose bytes are ``left`` + ``right``, or ``NO_MERGE``."""
    key = (np.int64(left) << PAIR_SHIFT) | right
    table = tables.pair_slots
    mask = (table.shape[0] >> 1) - 1
    slot = int_slot(key, mask)
    while True:
        stored = table[index(2 * slot)]
        if stored == key:
            return np.int32(table[index(2 * slot + 1)])
        if stored == EMPTY:
            return NO_MERGE
        slot = (slot + 1) & mask


@leaf
def merge_small_piece(tables, buf, start, end, parts, ranks):
    """Merge ``buf[start:end]`` (at most ``SMALL_PIECE_BYTES``) in place; returns the part count.

    ``parts[:count]`` are the resulting token ids. ``ranks[i]`` is the rank of
    merging part ``i`` with part ``i + 1``.
    """
    count = end - start
    for i in range(count):
        parts[index(i)] = tables.byte_rank[index(buf[index(start + i)])]
    for i in range(count - 1):
        pair = np.int64(buf[index(start + i)]) * 256 + buf[index(start + i + 1)]
        ranks[index(i)] = tables.byte_pair_rank[index(pair)]
    while count > 1:
        best = NO_MERGE
        at = -1
        for i in range(count - 1):
            if ranks[index(i)] < best:
                best = ranks[index(i)]
                at = i
        if at < 0:
            break
        parts[index(at)] = best
        for i in range(at + 1, count - 1):
            parts[index(i)] = parts[index(i + 1)]
        for i in range(at + 1, count - 2):
            ranks[index(i)] = ranks[index(i + 1)]
        count -= 1
        if at > 0:
            ranks[index(at - 1)] = pair_rank(tables, parts[index(at - 1)], parts[index(at)])
        if at < count - 1:
            ranks[index(at)] = pair_rank(tables, parts[index(at)], parts[index(at + 1)])
    return count


@leaf
def _heap_push(heap, size, value):
    i = size
    while i > 0:  # move the hole up while the parent is larger
        parent = (i - 1) >> 1
        if heap[index(parent)] <= value:
            break
        heap[index(i)] = heap[index(parent)]
        i = parent
    heap[index(i)] = value
    return size + 1


@leaf
def _heap_pop(heap, size):
    """Remove the smallest entry. Bottom-up: the hole left at the root goes down along the smaller
    children to a leaf, then the last entry rises from there (about half the comparisons of a
    plain sift-down, since the last entry usually belongs near the bottom)."""
    top = heap[0]
    size -= 1
    last = heap[index(size)]
    i = 0
    child = 1
    while child < size:
        if child + 1 < size and heap[index(child + 1)] < heap[index(child)]:
            child += 1
        heap[index(i)] = heap[index(child)]
        i = child
        child = 2 * i + 1
    while i > 0:
        parent = (i - 1) >> 1
        if heap[index(parent)] <= last:
            break
        heap[index(i)] = heap[index(parent)]
        i = parent
    heap[index(i)] = last
    return top, size


class MergeScratch(NamedTuple):
    """Work arrays for merging, allocated once per call (merging never allocates)."""

    parts: np.ndarray  # int32 token id of each part
    ranks: np.ndarray  # int32 rank of merging part i with the next part
    next_part: np.ndarray  # int64 linked list of live parts (long pieces)
    prev_part: np.ndarray  # int64
    heap: np.ndarray  # int64 entries rank << RANK_SHIFT | part


@kernel
def new_merge_scratch(longest_piece):
    n = max(longest_piece, SMALL_PIECE_BYTES)
    return MergeScratch(
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=np.int64),
        np.empty(2 * n, dtype=np.int64),
    )


@leaf
def merge_long_piece(tables, buf, start, end, out, n_out, scratch):
    """Merge a piece of any length with a heap of (rank, position); returns the new ``n_out``.

    A heap entry is live while its left part still exists and still has that
    rank with its current right neighbour: a changed neighbour means longer
    bytes, hence a different rank, so stale entries are recognised exactly.
    """
    count = end - start
    parts = scratch.parts
    ranks = scratch.ranks
    next_part = scratch.next_part
    prev_part = scratch.prev_part
    heap = scratch.heap
    size = 0
    for i in range(count):
        parts[index(i)] = tables.byte_rank[index(buf[index(start + i)])]
        next_part[index(i)] = i + 1
        prev_part[index(i)] = i - 1
        ranks[index(i)] = NO_MERGE
    for i in range(count - 1):
        pair = np.int64(buf[index(start + i)]) * 256 + buf[index(start + i + 1)]
        ranks[index(i)] = tables.byte_pair_rank[index(pair)]
        if ranks[index(i)] != NO_MERGE:
            size = _heap_push(heap, size, (np.int64(ranks[index(i)]) << RANK_SHIFT) | i)
    while size > 0:
        entry, size = _heap_pop(heap, size)
        rank = np.int32(entry >> RANK_SHIFT)
        at = entry & LOW_32_BITS
        if parts[index(at)] < 0:
            continue  # stale: the part was merged into its left neighbour
        if ranks[index(at)] != rank:
            continue  # stale: the part's right neighbour changed
        right = next_part[index(at)]
        parts[index(at)] = rank
        parts[index(right)] = -1
        after = next_part[index(right)]
        next_part[index(at)] = after
        ranks[index(at)] = NO_MERGE
        if after < count:
            prev_part[index(after)] = at
            ranks[index(at)] = pair_rank(tables, rank, parts[index(after)])
            if ranks[index(at)] != NO_MERGE:
                size = _heap_push(heap, size, (np.int64(ranks[index(at)]) << RANK_SHIFT) | at)
        before = prev_part[index(at)]
        if before >= 0:
            ranks[index(before)] = pair_rank(tables, parts[index(before)], rank)
            if ranks[index(before)] != NO_MERGE:
                size = _heap_push(heap, size, (np.int64(ranks[index(before)]) << RANK_SHIFT) | before)
    i = 0
    while i < count:
        out[index(n_out)] = parts[index(i)]
        n_out += 1
        i = next_part[index(i)]
    return n_out


@leaf
def _put_block(tok, cnt, n_blocks, token, count):
    """Append ``count`` copies of ``token`` to a block list, joining an equal last block."""
    if count == 0:
        return n_blocks
    if n_blocks > 0 and tok[n_blocks - 1] == token:
        cnt[n_blocks - 1] += count
        return n_blocks
    tok[n_blocks] = token
    cnt[n_blocks] = count
    return n_blocks + 1


@leaf
def _best_block_pair(tables, tok, cnt, n_blocks):
    """``(rank, block, inside)`` of the leftmost lowest-rank pair: two parts inside block
    ``block`` (``inside``) or its last part with the next block's first; ``block`` -1 if none.
    Pairs inside a block come before the pair at its end, hence the order of the checks."""
    best = NO_MERGE
    at = -1
    inside = False
    for b in range(n_blocks):
        if cnt[b] >= 2:
            rank = pair_rank(tables, tok[b], tok[b])
            if rank < best:
                best, at, inside = rank, b, True
        if b + 1 < n_blocks:
            rank = pair_rank(tables, tok[b], tok[b + 1])
            if rank < best:
                best, at, inside = rank, b, False
    return best, at, inside


@leaf
def merge_repetitive_piece(tables, buf, start, end, out, n_out, scratch):
    """Merge a long piece made of a few runs of equal bytes (whitespace runs, "=====", "aaaa")
    as blocks of equal parts; returns the new ``n_out``, or -1 if the piece does not suit
    (then the heap merges it; the result would be the same).

    BPE merges the leftmost lowest-rank pair, one at a time. In a block of k equal parts t
    whose pair t+t = m is that pair, the merges go left to right through the block as long
    as no pair they create (previous part + m, m + t, m + m) ranks below m: then all k // 2
    happen before anything else and the block becomes k // 2 parts m (and one t if k is
    odd). Otherwise one merge is done. A run of 25,000 spaces takes a few dozen steps.
    """
    tok, cnt = scratch.parts, scratch.next_part
    new_tok, new_cnt = scratch.ranks, scratch.prev_part
    n_blocks = 0
    i = start
    while i < end:
        j = i + 1
        while j < end and buf[j] == buf[i]:
            j += 1
        if n_blocks == REPETITIVE_MAX_BLOCKS:
            return -1
        n_blocks = _put_block(tok, cnt, n_blocks, tables.byte_rank[buf[i]], j - i)
        i = j
    work_left = REPETITIVE_WORK_PER_BYTE * (end - start)
    while True:
        best, at, inside = _best_block_pair(tables, tok, cnt, n_blocks)
        if at < 0:
            break
        work_left -= n_blocks
        if work_left < 0:
            return -1
        n_new = 0
        for b in range(at):
            n_new = _put_block(new_tok, new_cnt, n_new, tok[b], cnt[b])
        if inside:
            part, k = tok[at], cnt[at]
            all_at_once = (k >= 4 and pair_rank(tables, best, part) > best and pair_rank(tables, best, best) > best
                           and (at == 0 or pair_rank(tables, tok[at - 1], best) > best))
            if all_at_once:
                n_new = _put_block(new_tok, new_cnt, n_new, best, k // 2)
                n_new = _put_block(new_tok, new_cnt, n_new, part, k % 2)
            else:
                n_new = _put_block(new_tok, new_cnt, n_new, best, 1)
                n_new = _put_block(new_tok, new_cnt, n_new, part, k - 2)
            rest = at + 1
        else:
            n_new = _put_block(new_tok, new_cnt, n_new, tok[at], cnt[at] - 1)
            n_new = _put_block(new_tok, new_cnt, n_new, best, 1)
            n_new = _put_block(new_tok, new_cnt, n_new, tok[at + 1], cnt[at + 1] - 1)
            rest = at + 2
        for b in range(rest, n_blocks):
            n_new = _put_block(new_tok, new_cnt, n_new, tok[b], cnt[b])
            if n_new > REPETITIVE_MAX_BLOCKS:
                return -1
        tok, new_tok = new_tok, tok
        cnt, new_cnt = new_cnt, cnt
        n_blocks = n_new
    for b in range(n_blocks):
        for _ in range(cnt[b]):
            out[n_out] = tok[b]
            n_out += 1
    return n_out


@leaf
def merge_piece(tables, buf, start, end, out, n_out, scratch):
    """Merge a piece that is not a token; writes its ids at ``out[n_out:]``."""
    if end - start <= SMALL_PIECE_BYTES:
        count = merge_small_piece(tables, buf, start, end, scratch.parts, scratch.ranks)
        for i in range(count):
            out[index(n_out + i)] = scratch.parts[index(i)]
        return n_out + count
    if end - start >= REPETITIVE_MIN_PIECE_BYTES:
        n_new = merge_repetitive_piece(tables, buf, start, end, out, n_out, scratch)
        if n_new >= 0:
            return n_new
    return merge_long_piece(tables, buf, start, end, out, n_out, scratch)


class PieceCache(NamedTuple):
    """Merged pieces (piece bytes -> ids) kept across calls; one call at a time uses one.

    Short pieces whose ids pack in a uint64 are added to the thread's copy of the
    short-token table, so one probe answers both "is it a token" and "was it
    merged before". Other pieces go to a general table whose keys and ids live in
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
    short_slots: np.ndarray  # this thread's copy of BpeTables.short_slots plus merged short pieces


ENTRIES, KEY_BYTES_USED, IDS_USED, SHORT_ADDED = 0, 1, 2, 3  # indices into PieceCache.used
SHORT_ADDED_LIMIT_DIVISOR = 4  # merged short pieces fill at most 1/4 of the short table's slots
PIECE_CACHE_ENTRIES = 1 << 17
PIECE_CACHE_KEY_BYTES = 1 << 22
PIECE_CACHE_IDS = 1 << 20


def new_piece_cache(tables: BpeTables, entries: int = PIECE_CACHE_ENTRIES,
                    key_bytes: int = PIECE_CACHE_KEY_BYTES, ids: int = PIECE_CACHE_IDS,
                    short_slots: np.ndarray | None = None) -> PieceCache:
    """An empty cache for one thread (about 14 MB plus a copy of the short-token table,
    or ``short_slots``: such a copy made by the caller)."""
    if entries < 1 or entries & (entries - 1):
        raise ValueError(f"piece cache entries must be a power of two, not {entries}")
    layout = [(2 * entries, np.int64), (entries, np.int64), (entries, np.int64), (entries, np.int64),
              (entries, np.int64), (key_bytes, np.uint8), (ids, np.int32), (4, np.int64)]
    if short_slots is None:
        layout.append((tables.short_slots.shape, tables.short_slots.dtype))
    arrays = empty_in_huge_pages(layout)  # probed at random: in huge pages (see hugepages.py)
    if short_slots is None:
        arrays[-1][...] = tables.short_slots
    else:
        arrays.append(short_slots)
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

    def __init__(self, make: Callable[[], PieceCache], keep: int) -> None:
        self._make = make
        self._keep = keep
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
def find_token(tables, buf, start, end):
    """Rank of the token whose bytes are ``buf[start:end]`` (non-empty), or ``EMPTY``."""
    length = end - start
    if length == 1:
        return np.int64(tables.byte_rank[index(buf[index(start)])])
    if length <= SHORT_TOKEN_BYTES:
        return find_short_token(tables.short_slots, buf, start, end)
    return find_span(tables.token_slots, tables.token_bytes, tables.token_offsets, buf, start, end,
                     hash_span(buf, start, end))


@leaf
def _add_short_piece(tables, cache, key, slot, out, ids_start, ids_end):
    """Add a merged short piece to this thread's short table if its ids pack; returns success.

    Past ``SHORT_ADDED_LIMIT_DIVISOR`` the table is reset to the vocabulary's.
    """
    n_ids = ids_end - ids_start
    if n_ids > MAX_PACKED_IDS:
        return False
    packed = np.uint64(n_ids) << np.uint64(PACKED_COUNT_SHIFT)
    for k in range(n_ids):
        if out[ids_start + k] > PACKED_ID_MASK:
            return False
        packed |= np.uint64(out[ids_start + k]) << np.uint64(PACKED_ID_BITS * k)
    table = cache.short_slots
    if cache.used[SHORT_ADDED] * SHORT_ADDED_LIMIT_DIVISOR >= (table.shape[0] >> 1):
        for k in range(table.shape[0]):
            table[k] = tables.short_slots[k]
        cache.used[SHORT_ADDED] = 0
        _, slot = find_short_piece(table, key)
    table[2 * slot] = key
    table[2 * slot + 1] = packed
    cache.used[SHORT_ADDED] += 1
    return True


@leaf
def encode_unknown_piece(tables, cache, buf, start, end, out, n_out, scratch, short_slot):
    """Ids of a piece that is not a token: from the piece cache, else merged and cached.

    A short piece (``short_slot >= 0``: its free slot in the thread's short table)
    whose ids pack goes to the short table, anything else to the general cache.
    """
    entry, slot = _cache_find(cache, buf, start, end, hash_span(buf, start, end))
    if entry != EMPTY:
        first = cache.ids_at[index(entry)]
        n_ids = cache.ids_len[index(entry)]
        for i in range(n_ids):
            out[index(n_out + i)] = cache.ids[index(first + i)]
        return n_out + n_ids
    n_new = merge_piece(tables, buf, start, end, out, n_out, scratch)
    if short_slot >= 0 and _add_short_piece(tables, cache, short_key(buf, start, end), short_slot, out, n_out, n_new):
        return n_new
    _cache_store(cache, slot, buf, start, end, out, n_out, n_new)
    return n_new


@leaf
def _encode_all(tables, buf, run_start, run_special, first_piece, piece_end, out, run_out_end, cache, scratch):
    n_out = 0
    byte_rank = tables.byte_rank
    byte_pair_rank = tables.byte_pair_rank
    short_slots = cache.short_slots
    for r in range(run_start.shape[0]):
        if run_special[index(r)] >= 0:
            out[index(n_out)] = run_special[index(r)]
            n_out += 1
            run_out_end[index(r)] = n_out
            continue
        start = run_start[index(r)]
        for p in range(first_piece[index(r)], first_piece[index(r + 1)]):
            end = piece_end[index(p)]
            length = end - start
            if length == 1:
                out[index(n_out)] = byte_rank[index(buf[index(start)])]
                n_out += 1
            elif length == 2:  # a fifth of all pieces: the 256 KB byte-pair table answers
                rank = byte_pair_rank[index(np.int64(buf[index(start)]) * 256 + buf[index(start + 1)])]
                if rank != NO_MERGE:
                    out[index(n_out)] = rank
                    n_out += 1
                else:  # not a token, so no merge applies: its two bytes
                    out[index(n_out)] = byte_rank[index(buf[index(start)])]
                    out[index(n_out + 1)] = byte_rank[index(buf[index(start + 1)])]
                    n_out += 2
            elif length <= SHORT_TOKEN_BYTES:
                # one probe answers tokens and short pieces merged before
                packed, slot = find_short_piece(short_slots, short_key(buf, start, end))
                if packed != 0:
                    for k in range(packed_count(packed)):
                        out[index(n_out)] = packed_id(packed, k)
                        n_out += 1
                else:
                    n_out = encode_unknown_piece(tables, cache, buf, start, end, out, n_out, scratch, slot)
            else:
                rank = find_span(tables.token_slots, tables.token_bytes, tables.token_offsets, buf, start, end,
                                 hash_span(buf, start, end))
                if rank != EMPTY:
                    out[index(n_out)] = rank
                    n_out += 1
                else:
                    n_out = encode_unknown_piece(tables, cache, buf, start, end, out, n_out, scratch, -1)
            start = end
        run_out_end[index(r)] = n_out
    return n_out


@leaf
def longest_piece(run_start, run_special, first_piece, piece_end):
    longest = 0
    for r in range(run_start.shape[0]):
        if run_special[r] >= 0:
            continue
        start = run_start[r]
        for p in range(first_piece[r], first_piece[r + 1]):
            longest = max(longest, piece_end[p] - start)
            start = piece_end[p]
    return longest


def max_ids(buf_len: int, n_runs: int) -> int:
    """An upper bound on the ids of a call: every id covers at least one byte."""
    return buf_len + n_runs


@kernel
def encode_runs(tables, buf, run_start, run_end, run_special, first_piece, piece_end, out, run_out_end, cache):
    """Ids of every run into ``out`` (sized by ``max_ids``); returns how many were written.

    ``run_out_end[r]`` receives the end of run ``r``'s ids in ``out``. ``cache`` is
    the calling thread's ``PieceCache`` (never shared between threads).
    """
    scratch = new_merge_scratch(longest_piece(run_start, run_special, first_piece, piece_end))
    return _encode_all(tables, buf, run_start, run_special, first_piece, piece_end, out, run_out_end,
                       cache, scratch)


@leaf
def lookup_token(tables, buf):
    """Rank of the token whose bytes are ``buf``, or ``EMPTY``."""
    return find_token(tables, buf, 0, buf.shape[0])
