"""The BPE tables of one vocabulary, built once and cached on disk (``BpeTables``).

Same algorithm as tiktoken (``_educational.bpe_merge`` is the readable spec):

1. a piece that is itself a vocabulary token is that token;
2. otherwise start from single bytes and repeatedly merge the adjacent pair whose
   concatenation has the lowest rank, the leftmost one on ties.

The tables answer the questions merging asks:

* ``short_slots``: every token of up to ``SHORT_PIECE_BYTES`` bytes under a two-word key (the
  piece's bytes little-endian, its length in the top byte), found with one probe of a 32-byte
  entry; a piece cache keeps merged short pieces in a table of the same layout;
* ``token_slots``: a byte-span hash table of all tokens, for longer pieces;
* ``byte_rank`` and ``byte_pair_rank``: dense tables for single bytes and byte pairs (the pair table's
  second half repeats each byte's rank along its row, so a piece of one or two bytes is one load:
  ``byte_piece_index``);
* ``pair_slots``: the merges, one ``uint64`` per slot (left, right, merged: 20 bits each). Only
  each token's own split is kept: the last merge BPE makes on that token's bytes alone. Inside
  any piece, the merges within the span of a token that BPE builds are the merges BPE makes on
  that token alone (a merge inside the span depends only on the parts inside it, and the
  leftmost-lowest rule picks inside the span what it picks there alone), so a token is always
  built from its own split: the other ways to cut it into two tokens never merge. That makes
  the table a quarter of the size of one holding every split (docs/performance.md).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...native import atomics
from ...native.hashing import EMPTY, find_span, hash_span, int_slot, mix64
from ...native.jit import index, kernel, leaf, leaf_inline

NO_MERGE = np.int32(0x7FFFFFFF)  # rank of a pair that does not merge
ID_BITS = 20  # ranks below 2**20: packed three to a word (pairs, short entries)
ID_MASK = (1 << ID_BITS) - 1
MAX_VOCABULARY_TOKENS = 1 << ID_BITS
PAIR_SHIFT = 32  # the all-splits table of the build: key = left << PAIR_SHIFT | right
NO_PAIR = np.uint64(0xFFFFFFFFFFFFFFFF)  # an empty slot of pair_slots (real entries are below 2**60)
FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: multiplicative hashing
SHORT_PIECE_BYTES = 15  # pieces this short have a two-word key: bytes 0-7, bytes 8-14 | length << 56
LENGTH_SHIFT = 56
ENTRY_WORDS = 4  # a short entry: key lo, key hi (0: a free slot), then up to MAX_INLINE_IDS packed ids
IDS_PER_WORD = 3
MAX_INLINE_IDS = 2 * IDS_PER_WORD
COUNT_SHIFT = 60  # the id count, in the top bits of the first ids word
# Few tokens are longer than SHORT_PIECE_BYTES (862 of K3's): a 64 Kbit filter of their hashes, which stays in
# the L1 cache, answers "not a token" for most long pieces without a probe of the span table
LONG_TOKEN_WORDS = 1 << 10
# Most pairs a merge looks up do not merge. A 256 KB filter of the own splits' hashes, which stays in the L2
# cache, answers "does not merge" for ~95% of those without a probe of the 4 MB pair table
PAIR_FILTER_BITS = 21
PAIR_FILTER_WORDS = (1 << PAIR_FILTER_BITS) // 64
LONG_TOKEN_BIT_SHIFT = 48  # the filter takes the hash's high bits (the span table its low bits)


class BpeTables(NamedTuple):
    """Everything the BPE kernels read, built once per vocabulary."""

    token_bytes: np.ndarray  # uint8, every token's bytes in rank order
    token_offsets: np.ndarray  # int64[n + 1]
    token_slots: np.ndarray  # int32 hash slots -> rank (all tokens; probed for long pieces)
    byte_rank: np.ndarray  # int32[256]
    byte_pair_rank: np.ndarray  # int32[2 * 256 * 256]: pairs (NO_MERGE when absent), then byte_rank by first byte
    pair_slots: np.ndarray  # uint64 left << 40 | right << 20 | merged, one per token's own split
    short_slots: np.ndarray  # uint64 entries of ENTRY_WORDS: every token of up to SHORT_PIECE_BYTES
    char_starts: np.ndarray  # uint64 per code point: the ids a merge may start a character from (char_starts.py)
    long_token_bits: np.ndarray  # uint64[LONG_TOKEN_WORDS]: a bit per hash of the tokens longer than SHORT_PIECE_BYTES
    pair_filter: np.ndarray  # uint64[PAIR_FILTER_WORDS]: a bit per hash of each own split (pairs that may merge)
    seam_blocks: np.ndarray  # int32 per block of 128 code points: its table in seam_words, or -1 (seams.py)
    seam_words: np.ndarray  # uint64: per block, which adjacent characters a token may cross, and each one's own ids


def short_table_entries(n_keys: int) -> int:
    """Entries of a short table for ``n_keys``: a power of two at most 5/8 full (a piece cache's copy is
    ``piece_cache.SEEDED_SHORT_FACTOR`` times larger)."""
    entries = 16
    while entries * 5 < n_keys * 8:
        entries *= 2
    return entries


@leaf_inline
def short_key(buf, start, end):
    """``(lo, hi)``: the bytes of a piece of at most ``SHORT_PIECE_BYTES``, little-endian, with its
    length in the top byte of ``hi`` (so ``hi`` is never 0). Two unaligned loads where the buffer
    holds 16 bytes from ``start``, else a byte loop."""
    length = end - start
    if start + 16 <= buf.shape[0]:
        lo = atomics.load_u64(buf, start)
        hi = atomics.load_u64(buf, start + 8)
        if length < 8:
            lo &= (np.uint64(1) << np.uint64(8 * length)) - np.uint64(1)
            hi = np.uint64(0)
        else:
            hi &= (np.uint64(1) << np.uint64(8 * (length - 8))) - np.uint64(1)
    else:
        lo = np.uint64(0)
        hi = np.uint64(0)
        for k in range(min(length, 8)):
            lo |= np.uint64(buf[index(start + k)]) << np.uint64(8 * k)
        for k in range(8, length):
            hi |= np.uint64(buf[index(start + k)]) << np.uint64(8 * (k - 8))
    return lo, hi | (np.uint64(length) << np.uint64(LENGTH_SHIFT))


@leaf_inline
def short_hash(lo, hi):
    return mix64(lo ^ (hi * FIBONACCI))


@leaf_inline
def find_entry(table, lo, hi, h):
    """``(entry, found)``: the entry holding key ``(lo, hi)`` in a table of short entries, or the free
    entry where it would go."""
    mask = np.uint64((table.shape[0] // ENTRY_WORDS) - 1)
    entry = h & mask
    while True:
        at = entry * np.uint64(ENTRY_WORDS)
        stored = table[index(at + 1)]
        if stored == hi and table[index(at)] == lo:
            return np.int64(entry), True
        if stored == 0:
            return np.int64(entry), False
        entry = (entry + np.uint64(1)) & mask


@leaf
def entry_count(table, entry):
    return np.int64(table[index(entry * ENTRY_WORDS + 2)] >> np.uint64(COUNT_SHIFT))


@leaf_inline
def entry_id(table, entry, k):
    """Id ``k`` of an entry (``k < entry_count``)."""
    word = table[index(entry * ENTRY_WORDS + 2 + k // IDS_PER_WORD)]
    return np.int64((word >> np.uint64(ID_BITS * (k % IDS_PER_WORD))) & np.uint64(ID_MASK))


@leaf
def put_entry(table, entry, lo, hi, ids, first, n_ids):
    """Write ``ids[first:first + n_ids]`` (at most ``MAX_INLINE_IDS``, each below 2**20) under the
    key ``(lo, hi)`` at a free ``entry``."""
    word0 = np.uint64(n_ids) << np.uint64(COUNT_SHIFT)
    word1 = np.uint64(0)
    for k in range(n_ids):
        value = np.uint64(ids[index(first + k)]) << np.uint64(ID_BITS * (k % IDS_PER_WORD))
        if k < IDS_PER_WORD:
            word0 |= value
        else:
            word1 |= value
    at = entry * ENTRY_WORDS
    table[index(at)] = lo
    table[index(at + 2)] = word0
    table[index(at + 3)] = word1
    table[index(at + 1)] = hi


@kernel
def _build_short_table(token_bytes, token_offsets, n_slots):
    table = np.zeros(ENTRY_WORDS * n_slots, dtype=np.uint64)
    rank = np.zeros(1, dtype=np.int64)
    for r in range(token_offsets.shape[0] - 1):
        start = token_offsets[r]
        end = token_offsets[r + 1]
        if end - start > SHORT_PIECE_BYTES:
            continue
        lo, hi = short_key(token_bytes, start, end)
        entry, _ = find_entry(table, lo, hi, short_hash(lo, hi))
        rank[0] = r
        put_entry(table, entry, lo, hi, rank, 0, 1)
    return table


@leaf
def find_short_token(table, buf, start, end):
    """Rank of the token ``buf[start:end]`` (at most ``SHORT_PIECE_BYTES``), or ``EMPTY``."""
    lo, hi = short_key(buf, start, end)
    entry, found = find_entry(table, lo, hi, short_hash(lo, hi))
    if not found:
        return EMPTY
    return entry_id(table, entry, 0)


@leaf_inline
def byte_piece_index(length, first, last):
    """Where ``byte_pair_rank`` holds the id of a piece of one byte (``length`` 1) or two (its first and last
    byte): no branch on the length."""
    return (np.int64(length == 1) << np.int64(16)) | (np.int64(first) << np.int64(8)) | np.int64(last)


@kernel
def _byte_tables(token_bytes, token_offsets, slots):
    byte_rank = np.full(256, EMPTY, dtype=np.int32)
    byte_pair_rank = np.full(2 * 256 * 256, NO_MERGE, dtype=np.int32)
    probe = np.zeros(2, dtype=np.uint8)
    for a in range(256):
        probe[0] = a
        byte_rank[a] = find_span(slots, token_bytes, token_offsets, probe, 0, 1, hash_span(probe, 0, 1))
        for b in range(256):
            probe[1] = b
            rank = find_span(slots, token_bytes, token_offsets, probe, 0, 2, hash_span(probe, 0, 2))
            if rank != EMPTY:
                byte_pair_rank[a * 256 + b] = rank
            byte_pair_rank[byte_piece_index(1, a, b)] = byte_rank[a]
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


@kernel
def own_splits(token_bytes, token_offsets, byte_rank, all_splits):
    """``(left, right)``: each token's own split, the last merge BPE makes on its bytes alone (with
    ``all_splits``, the table of every way to cut a token into two); -1 for single bytes and for
    tokens BPE never builds (their bytes alone end in several parts)."""
    n_tokens = token_offsets.shape[0] - 1
    left = np.full(n_tokens, -1, dtype=np.int64)
    right = np.full(n_tokens, -1, dtype=np.int64)
    longest = 0
    for t in range(n_tokens):
        longest = max(longest, token_offsets[t + 1] - token_offsets[t])
    parts = np.empty(longest, dtype=np.int64)
    ranks = np.empty(longest, dtype=np.int64)
    mask = (all_splits.shape[0] >> 1) - 1
    for t in range(n_tokens):
        start = token_offsets[t]
        count = token_offsets[t + 1] - start
        if count < 2:
            continue
        for i in range(count):
            parts[i] = byte_rank[token_bytes[start + i]]
        for i in range(count - 1):
            ranks[i] = _any_split_rank(all_splits, mask, parts[i], parts[i + 1])
        last_left = -1
        last_right = -1
        while count > 1:
            at = -1
            best = np.int64(NO_MERGE)
            for i in range(count - 1):
                if ranks[i] < best:
                    best = ranks[i]
                    at = i
            if at < 0:
                break
            last_left = parts[at]
            last_right = parts[at + 1]
            parts[at] = best
            for i in range(at + 1, count - 1):
                parts[i] = parts[i + 1]
                ranks[i] = ranks[i + 1]
            count -= 1
            if at > 0:
                ranks[at - 1] = _any_split_rank(all_splits, mask, parts[at - 1], parts[at])
            if at < count - 1:
                ranks[at] = _any_split_rank(all_splits, mask, parts[at], parts[at + 1])
        if count == 1:
            left[t] = last_left
            right[t] = last_right
    return left, right


@leaf
def _any_split_rank(all_splits, mask, a, b):
    key = (np.int64(a) << PAIR_SHIFT) | b
    slot = int_slot(key, mask)
    while True:
        stored = all_splits[2 * slot]
        if stored == key:
            return all_splits[2 * slot + 1]
        if stored == EMPTY:
            return np.int64(NO_MERGE)
        slot = (slot + 1) & mask


@leaf
def pair_key(left, right):
    return (np.uint64(left) << np.uint64(ID_BITS)) | np.uint64(right)


@leaf
def pair_slot(key, mask):
    return ((key * FIBONACCI) >> np.uint64(32)) & mask


@kernel
def _build_own_split_table(left, right, n_slots):
    table = np.full(n_slots, NO_PAIR, dtype=np.uint64)
    mask = np.uint64(n_slots - 1)
    for merged in range(left.shape[0]):
        if left[merged] < 0:
            continue
        key = pair_key(left[merged], right[merged])
        slot = pair_slot(key, mask)
        while table[slot] != NO_PAIR:
            slot = (slot + np.uint64(1)) & mask
        table[slot] = (key << np.uint64(ID_BITS)) | np.uint64(merged)
    return table


@leaf
def pair_rank(tables, left, right):
    """The token ``left`` and ``right`` merge into (its rank), or ``NO_MERGE``: only a token's own
    split merges (see the module docstring)."""
    table = tables.pair_slots
    mask = np.uint64(table.shape[0] - 1)
    key = pair_key(left, right)
    slot = pair_slot(key, mask)
    while True:
        stored = table[index(slot)]
        if (stored >> np.uint64(ID_BITS)) == key:
            return np.int32(stored & np.uint64(ID_MASK))
        if stored == NO_PAIR:
            return NO_MERGE
        slot = (slot + np.uint64(1)) & mask


@leaf_inline
def pair_filter_bit(key):
    """The filter bit of a pair key (the top bits of the multiplicative hash the pair memo takes too)."""
    return (key * FIBONACCI) >> np.uint64(64 - PAIR_FILTER_BITS)


@kernel
def build_pair_filter(left, right):
    bits = np.zeros(PAIR_FILTER_WORDS, dtype=np.uint64)
    for merged in range(left.shape[0]):
        if left[merged] >= 0:
            bit = pair_filter_bit(pair_key(left[merged], right[merged]))
            bits[bit >> np.uint64(6)] |= np.uint64(1) << (bit & np.uint64(63))
    return bits


@leaf_inline
def prefetch_pair(tables, key):
    """Start loading what ``may_merge`` and ``pair_rank`` read for this pair key (its filter word and
    first table slot), so that the look-ups of a merge step overlap instead of waiting in turn."""
    atomics.prefetch(tables.pair_filter, pair_filter_bit(key) >> np.uint64(6))
    atomics.prefetch(tables.pair_slots, pair_slot(key, np.uint64(tables.pair_slots.shape[0] - 1)))


@leaf_inline
def may_merge(tables, key):
    """False when the pair with this key (``pair_key``) certainly does not merge."""
    bit = pair_filter_bit(key)
    return ((tables.pair_filter[index(bit >> np.uint64(6))] >> (bit & np.uint64(63))) & np.uint64(1)) != 0


@leaf
def _long_token_bit(h):
    return (h >> np.uint64(LONG_TOKEN_BIT_SHIFT)) & np.uint64(LONG_TOKEN_WORDS * 64 - 1)


@leaf
def maybe_long_token(tables, h):
    """Whether a piece longer than ``SHORT_PIECE_BYTES`` with hash ``h`` (``hash_span``) may be a token
    (False: certainly not)."""
    bit = _long_token_bit(h)
    return ((tables.long_token_bits[index(bit >> np.uint64(6))] >> (bit & np.uint64(63))) & np.uint64(1)) != 0


@kernel
def build_long_token_bits(token_bytes, token_offsets):
    bits = np.zeros(LONG_TOKEN_WORDS, dtype=np.uint64)
    for t in range(token_offsets.shape[0] - 1):
        start, end = token_offsets[t], token_offsets[t + 1]
        if end - start > SHORT_PIECE_BYTES:
            bit = _long_token_bit(hash_span(token_bytes, start, end))
            bits[bit >> np.uint64(6)] |= np.uint64(1) << (bit & np.uint64(63))
    return bits


@leaf
def find_token(tables, buf, start, end):
    """Rank of the token whose bytes are ``buf[start:end]`` (non-empty), or ``EMPTY``."""
    length = end - start
    if length == 1:
        return np.int64(tables.byte_rank[index(buf[index(start)])])
    if length <= SHORT_PIECE_BYTES:
        return find_short_token(tables.short_slots, buf, start, end)
    h = hash_span(buf, start, end)
    if not maybe_long_token(tables, h):
        return EMPTY
    return find_span(tables.token_slots, tables.token_bytes, tables.token_offsets, buf, start, end, h)


@leaf
def lookup_token(tables, buf):
    """Rank of the token whose bytes are ``buf``, or ``EMPTY``."""
    return find_token(tables, buf, 0, buf.shape[0])
