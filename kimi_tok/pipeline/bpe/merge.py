"""Merging a piece that is not a vocabulary token (the second step of BPE).

Pieces of up to ``SMALL_PIECE_BYTES`` merge in a fixed scratch buffer with a linear min-rank
scan; longer ones made of a few runs of equal bytes (whitespace runs) merge as blocks of
equal parts (``merge_repetitive_piece``); other long ones use a heap over a linked list of
parts (O(n log n), so a 25,000-letter run stays fast). Merging never allocates: the scratch
arrays are made once per call (``new_merge_scratch``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ...native.jit import index, kernel, leaf
from .tables import NO_MERGE, pair_rank

SMALL_PIECE_BYTES = 32  # pieces up to this size merge in the scratch buffer
# Long pieces made of few runs of equal bytes merge as blocks of equal parts (merge_repetitive_piece):
REPETITIVE_MIN_PIECE_BYTES = 256  # shorter ones are cheap enough for the heap
REPETITIVE_MAX_BLOCKS = 64  # more runs than this: not repetitive, the heap is as good
REPETITIVE_WORK_PER_BYTE = 4  # block visits allowed per byte before handing over to the heap
RANK_SHIFT = 32  # heap entry = rank << RANK_SHIFT | part index
LOW_32_BITS = (1 << 32) - 1


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
