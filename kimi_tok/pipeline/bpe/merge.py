"""Merging a piece that is not a vocabulary token (the second step of BPE).

Pieces of up to ``SCAN_MERGE_BYTES`` merge by scanning for the lowest-ranked pair
(``merge_scan_piece``: one key per byte position, rank and position packed in an ``int32``, so
the leftmost lowest pair is a plain minimum that vectorizes, with no branch to mispredict; merged-away
positions keep a key that never wins, so nothing shifts); longer ones made of a few runs of equal bytes (whitespace runs) merge as blocks of
equal parts (``merge_repetitive_piece``); other long ones use a heap over a linked list of
parts (O(n log n), so a 25,000-letter run stays fast). Merging never allocates: the scratch
arrays are made once per call (``new_merge_scratch``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...native import atomics
from ...native.jit import index, kernel, leaf, leaf_inline
from ...native.utf8 import sequence_length, well_formed_code_point_at
from .char_starts import CHAR_START_CODE_POINTS, start_count, start_first_length, start_id
from .tables import FIBONACCI, ID_BITS, NO_MERGE, may_merge, pair_rank, prefetch_pair

SMALL_MERGE_BYTES = 32  # pieces up to this size merge over packed arrays of parts and ranks
SCAN_MERGE_BYTES = 128  # longer ones up to this size merge by a scan over their byte positions
POSITION_BITS = 7  # a scan key: rank << POSITION_BITS | position (ranks below 2**24 fit an int32)
POSITION_MASK = (1 << POSITION_BITS) - 1
NO_KEY = np.int32(0x7FFFFFFF)  # the key of a position with no pair to merge (merged away, last)
UTF8_MULTI_BYTE_LEAD = 0xC0  # bytes from here on start a character of two or more bytes
SCAN_WIDTH_STEP = 8  # scans cover a multiple of this many keys (the tail holds NO_KEY)
# The pair memo: a direct-mapped table of recent pair look-ups, small enough for the L2 cache (the pair table
# is not): (key + 1) << MEMO_RANK_BITS | rank, MEMO_NO_MERGE for a pair that does not merge, 0 for a free slot
MEMO_BITS = 14
MEMO_RANK_BITS = 24
MEMO_NO_MERGE = (1 << MEMO_RANK_BITS) - 1
# Long pieces made of few runs of equal bytes merge as blocks of equal parts (merge_repetitive_piece):
REPETITIVE_MIN_PIECE_BYTES = 256  # shorter ones are cheap enough for the heap
REPETITIVE_MAX_BLOCKS = 64  # more runs than this: not repetitive, the heap is as good
REPETITIVE_WORK_PER_BYTE = 4  # block visits allowed per byte before handing over to the heap
RANK_SHIFT = 32  # heap entry = rank << RANK_SHIFT | part index
LOW_32_BITS = (1 << 32) - 1


@leaf
def scan_key(rank, position):
    if rank == NO_MERGE:
        return NO_KEY
    return np.int32((np.int64(rank) << POSITION_BITS) | position)


@leaf_inline
def merge_scan_piece(tables, buf, start, end, out, n_out, scratch):
    """Merge ``buf[start:end]`` (at most ``SCAN_MERGE_BYTES``); writes its ids at ``out[n_out:]`` and
    returns the new ``n_out``. ``keys[i]`` packs the rank of merging the part at position ``i``
    with the next live part and ``i`` itself, so the minimum key is the leftmost lowest pair."""
    n = end - start
    keys = scratch.ranks
    parts = scratch.parts
    next_part = scratch.next_part
    prev_part = scratch.prev_part
    width = (n + SCAN_WIDTH_STEP - 1) // SCAN_WIDTH_STEP * SCAN_WIDTH_STEP
    for i in range(width):
        keys[index(i)] = NO_KEY
    place_start_parts(tables, buf, start, n, parts, next_part, prev_part)
    i = 0
    while i < n:
        after = next_part[index(i)]
        if after < n:
            if after == i + 1 and next_part[index(after)] == after + 1:  # two bytes: the dense table
                pair = np.int64(buf[index(start + i)]) * 256 + buf[index(start + after)]
                keys[index(i)] = scan_key(tables.byte_pair_rank[index(pair)], i)
            else:
                keys[index(i)] = scan_key(merge_rank(tables, scratch, parts[index(i)], parts[index(after)]), i)
        i = after
    while True:
        best = NO_KEY
        for i in range(width):
            best = min(best, keys[index(i)])
        if best == NO_KEY:
            break
        at = np.int64(best & POSITION_MASK)
        rank = np.int64(best >> POSITION_BITS)
        right = next_part[index(at)]
        after = next_part[index(right)]
        before = prev_part[index(at)]
        prefetch_neighbours(tables, scratch, parts, rank, before, after, n)
        parts[index(at)] = rank
        keys[index(right)] = NO_KEY
        next_part[index(at)] = after
        if after < n:
            prev_part[index(after)] = at
            keys[index(at)] = scan_key(merge_rank(tables, scratch, rank, parts[index(after)]), at)
        else:
            keys[index(at)] = NO_KEY
        if before >= 0:
            keys[index(before)] = scan_key(merge_rank(tables, scratch, parts[index(before)], rank), before)
    return emit_linked_parts(parts, next_part, n, out, n_out)


@leaf_inline
def merge_small_piece(tables, buf, start, end, out, n_out, scratch):
    """Merge ``buf[start:end]`` (at most ``SMALL_MERGE_BYTES``); writes its ids at ``out[n_out:]`` and
    returns the new ``n_out``. ``parts[k]`` is the k-th part and ``ranks[k]`` the rank of merging it
    with part ``k + 1``, kept packed: a merge shifts the parts after it down by one. Each step is
    a scan for the leftmost lowest rank and two look-ups, with nothing to follow but the arrays."""
    parts = scratch.parts
    ranks = scratch.ranks
    byte_rank = tables.byte_rank
    byte_pair_rank = tables.byte_pair_rank
    m = 0
    last_byte = -1  # the previous part when it is a single byte (the byte-pair table ranks the pair), else -1
    i = start
    while i < end:
        lead = np.int64(buf[index(i)])
        count = 0
        value = np.uint64(0)
        width = 1
        if lead >= UTF8_MULTI_BYTE_LEAD:
            width = sequence_length(lead)
            if i + width <= end:
                cp = well_formed_code_point_at(buf, i, width)  # bytes need not be UTF-8 (encode_bytes)
                if 0 <= cp < CHAR_START_CODE_POINTS:
                    value = tables.char_starts[index(cp)]
                    count = start_count(value)
            else:
                width = 1
        if count == 0:  # the character's bytes, each a part
            for k in range(width):
                byte = np.int64(buf[index(i + k)])
                parts[index(m)] = byte_rank[index(byte)]
                if m > 0:
                    if last_byte >= 0:
                        ranks[index(m - 1)] = byte_pair_rank[index(last_byte * 256 + byte)]
                    else:
                        ranks[index(m - 1)] = merge_rank(tables, scratch, parts[index(m - 1)], parts[index(m)])
                last_byte = byte
                m += 1
            i += width
            continue
        for k in range(count):  # the character's own ids (char_starts)
            parts[index(m)] = start_id(value, k)
            if m > 0:
                ranks[index(m - 1)] = merge_rank(tables, scratch, parts[index(m - 1)], parts[index(m)])
            m += 1
        last_byte = -1
        i += width
    while m > 1:
        best = ranks[0]
        at = 0
        for k in range(1, m - 1):
            if ranks[index(k)] < best:
                best = ranks[index(k)]
                at = k
        if best == NO_MERGE:
            break
        if at + 2 < m:  # the parts next to the merged one, before the shift moves the right one down
            prefetch_rank(tables, scratch, best, parts[index(at + 2)])
        if at > 0:
            prefetch_rank(tables, scratch, parts[index(at - 1)], best)
        parts[index(at)] = best
        for k in range(at + 1, m - 1):
            parts[index(k)] = parts[index(k + 1)]
        for k in range(at + 1, m - 2):
            ranks[index(k)] = ranks[index(k + 1)]
        m -= 1
        if at + 1 < m:
            ranks[index(at)] = merge_rank(tables, scratch, best, parts[index(at + 1)])
        if at > 0:
            ranks[index(at - 1)] = merge_rank(tables, scratch, parts[index(at - 1)], best)
    for k in range(m):
        out[index(n_out + k)] = parts[index(k)]
    return n_out + m


@leaf
def emit_linked_parts(parts, next_part, n, out, n_out):
    """The parts left after a merge, from position 0 along ``next_part`` up to ``n``, into ``out`` from
    ``n_out``; returns the new end."""
    i = 0
    while i < n:
        out[index(n_out)] = parts[index(i)]
        n_out += 1
        i = next_part[index(i)]
    return n_out


@leaf
def place_start_parts(tables, buf, start, n, parts, next_part, prev_part):
    """The parts a merge of ``buf[start:start + n]`` starts from, linked by position (a part sits at the
    position of its first byte): each character that may start whole (``char_starts``) as its ids, the
    rest as bytes."""
    last = -1
    i = 0
    while i < n:
        lead = buf[index(start + i)]
        width = 1
        count = 0
        value = np.uint64(0)
        if lead >= UTF8_MULTI_BYTE_LEAD:
            width = sequence_length(lead)
            if i + width <= n:
                cp = well_formed_code_point_at(buf, start + i, width)  # bytes need not be UTF-8 (encode_bytes)
                if 0 <= cp < CHAR_START_CODE_POINTS:
                    value = tables.char_starts[index(cp)]
                    count = start_count(value)
        if count == 0:  # bytes
            for k in range(width if i + width <= n else 1):
                parts[index(i + k)] = tables.byte_rank[index(buf[index(start + i + k)])]
                prev_part[index(i + k)] = last
                if last >= 0:
                    next_part[index(last)] = i + k
                last = i + k
            i += width if i + width <= n else 1
            continue
        parts[index(i)] = start_id(value, 0)
        prev_part[index(i)] = last
        if last >= 0:
            next_part[index(last)] = i
        last = i
        if count == 2:
            second = i + start_first_length(value)
            parts[index(second)] = start_id(value, 1)
            prev_part[index(second)] = last
            next_part[index(last)] = second
            last = second
        i += width
    if last >= 0:
        next_part[index(last)] = n


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
    pair_memo: np.ndarray  # uint64[2**MEMO_BITS], kept by the thread's piece cache across calls


@kernel
def new_merge_scratch(longest_piece, pair_memo):
    n = max(longest_piece, SCAN_MERGE_BYTES)
    return MergeScratch(
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=np.int32),
        np.empty(n, dtype=np.int64),
        np.empty(n, dtype=np.int64),
        np.empty(2 * n, dtype=np.int64),
        pair_memo,
    )


@leaf
def merge_rank(tables, scratch, left, right):
    """``pair_rank`` through the pair filter (most pairs do not merge) and the thread's pair memo."""
    key = (np.uint64(left) << np.uint64(ID_BITS)) | np.uint64(right)
    if not may_merge(tables, key):
        return NO_MERGE
    memo = scratch.pair_memo
    slot = (key * FIBONACCI) >> np.uint64(64 - MEMO_BITS)
    stored = memo[index(slot)]
    tag = (key + np.uint64(1)) << np.uint64(MEMO_RANK_BITS)
    if (stored >> np.uint64(MEMO_RANK_BITS)) == key + np.uint64(1):
        rank = np.int64(stored & np.uint64(MEMO_NO_MERGE))
        return NO_MERGE if rank == MEMO_NO_MERGE else np.int32(rank)
    rank = pair_rank(tables, left, right)
    memo[index(slot)] = tag | np.uint64(MEMO_NO_MERGE if rank == NO_MERGE else rank)
    return rank


@leaf_inline
def prefetch_rank(tables, scratch, left, right):
    """Start loading what ``merge_rank(tables, scratch, left, right)`` reads (filter word, memo slot,
    first pair-table slot): a merge step prefetches both of its new pairs before it shifts its parts,
    so their look-ups overlap (docs/performance.md, "Fresh pieces on the serving path")."""
    key = (np.uint64(left) << np.uint64(ID_BITS)) | np.uint64(right)
    prefetch_pair(tables, key)
    atomics.prefetch(scratch.pair_memo, (key * FIBONACCI) >> np.uint64(64 - MEMO_BITS))


@leaf_inline
def prefetch_neighbours(tables, scratch, parts, rank, before, after, end):
    """``prefetch_rank`` of the pairs a merge into ``rank`` makes with the parts at positions ``before`` and
    ``after`` (linked-list merges; -1 or ``end``: no such part)."""
    if after < end:
        prefetch_rank(tables, scratch, rank, parts[index(after)])
    if before >= 0:
        prefetch_rank(tables, scratch, parts[index(before)], rank)


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
    place_start_parts(tables, buf, start, count, parts, next_part, prev_part)
    i = 0
    while i < count:
        after = next_part[index(i)]
        ranks[index(i)] = NO_MERGE
        if after < count:
            if after == i + 1 and next_part[index(after)] == after + 1:  # two bytes: the dense table
                ranks[index(i)] = tables.byte_pair_rank[index(np.int64(buf[index(start + i)]) * 256
                                                              + buf[index(start + after)])]
            else:
                ranks[index(i)] = merge_rank(tables, scratch, parts[index(i)], parts[index(after)])
            if ranks[index(i)] != NO_MERGE:
                size = _heap_push(heap, size, (np.int64(ranks[index(i)]) << RANK_SHIFT) | i)
        i = after
    while size > 0:
        entry, size = _heap_pop(heap, size)
        rank = np.int32(entry >> RANK_SHIFT)
        at = entry & LOW_32_BITS
        if parts[index(at)] < 0:
            continue  # stale: the part was merged into its left neighbour
        if ranks[index(at)] != rank:
            continue  # stale: the part's right neighbour changed
        right = next_part[index(at)]
        after = next_part[index(right)]
        before = prev_part[index(at)]
        prefetch_neighbours(tables, scratch, parts, rank, before, after, count)
        parts[index(at)] = rank
        parts[index(right)] = -1
        next_part[index(at)] = after
        ranks[index(at)] = NO_MERGE
        if after < count:
            prev_part[index(after)] = at
            ranks[index(at)] = merge_rank(tables, scratch, rank, parts[index(after)])
            if ranks[index(at)] != NO_MERGE:
                size = _heap_push(heap, size, (np.int64(ranks[index(at)]) << RANK_SHIFT) | at)
        if before >= 0:
            ranks[index(before)] = merge_rank(tables, scratch, parts[index(before)], rank)
            if ranks[index(before)] != NO_MERGE:
                size = _heap_push(heap, size, (np.int64(ranks[index(before)]) << RANK_SHIFT) | before)
    return emit_linked_parts(parts, next_part, count, out, n_out)


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
def _best_block_pair(tables, scratch, tok, cnt, n_blocks):
    """``(rank, block, inside)`` of the leftmost lowest-rank pair: two parts inside block
    ``block`` (``inside``) or its last part with the next block's first; ``block`` -1 if none.
    Pairs inside a block come before the pair at its end, hence the order of the checks."""
    best = NO_MERGE
    at = -1
    inside = False
    for b in range(n_blocks):
        if cnt[b] >= 2:
            rank = merge_rank(tables, scratch, tok[b], tok[b])
            if rank < best:
                best, at, inside = rank, b, True
        if b + 1 < n_blocks:
            rank = merge_rank(tables, scratch, tok[b], tok[b + 1])
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
        best, at, inside = _best_block_pair(tables, scratch, tok, cnt, n_blocks)
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
            all_at_once = (k >= 4 and merge_rank(tables, scratch, best, part) > best
                           and merge_rank(tables, scratch, best, best) > best
                           and (at == 0 or merge_rank(tables, scratch, tok[at - 1], best) > best))
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


@leaf_inline
def merge_any_piece(tables, buf, start, end, out, n_out, scratch):
    """Merge a piece that is not a token; writes its ids at ``out[n_out:]`` and returns the new
    ``n_out``. Inlined where pieces are encoded (a short piece's merge is cheaper than a call that
    passes the tables and the scratch); long pieces take calls of their own."""
    if end - start <= SMALL_MERGE_BYTES:
        return merge_small_piece(tables, buf, start, end, out, n_out, scratch)
    if end - start <= SCAN_MERGE_BYTES:
        return merge_scan_piece(tables, buf, start, end, out, n_out, scratch)
    if end - start >= REPETITIVE_MIN_PIECE_BYTES:
        n_new = merge_repetitive_piece(tables, buf, start, end, out, n_out, scratch)
        if n_new >= 0:
            return n_new
    return merge_long_piece(tables, buf, start, end, out, n_out, scratch)


@leaf
def merge_piece(tables, buf, start, end, out, n_out, scratch):
    """``merge_any_piece`` as a call of its own (for merging single pieces from Python)."""
    return merge_any_piece(tables, buf, start, end, out, n_out, scratch)


def new_pair_memo() -> np.ndarray:
    """An empty pair memo, for merging outside a piece cache (``new_merge_scratch(n, new_pair_memo())``)."""
    return np.zeros(1 << MEMO_BITS, dtype=np.uint64)
