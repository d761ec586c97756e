"""BPE of the pieces of text runs into one preallocated ``uint32`` array (``encode_runs``).

Each piece is looked up whole first (tiktoken does the same: only a miss is merged): single
bytes and byte pairs in dense tables, pieces of up to ``SHORT_PIECE_BYTES`` by one probe of the
piece cache's short table (a copy of the vocabulary's, with the short pieces merged before);
longer pieces in the byte-span table (when a filter of the long tokens' hashes lets them), then
the piece cache's general table. A miss is merged (a long one in sections between its seams: ``seams``) and
cached.

Pieces go in blocks of ``PROBE_BLOCK``, one piece at a time with a branch on its length
(``_block_by_length``), or, where at least ``TINY_SHARE`` of a block's pieces have one or two
bytes (digests, ids, numbers) and at most ``MAX_LONG_IN_PASSES`` are long, in passes
(``_block_in_passes``): there the length of the next piece is not predictable and a mispredicted
branch per piece cost more than the lookups. Bytes and byte
pairs are then answered by one load each (``tables.byte_piece_index``), the longer pieces probed in a pass
of their own, and only misses branch (docs/performance.md, "Pieces of one or two bytes", "Which blocks go in
passes", "Blocks in passes without a chosen store address"). In either way the pieces the tables answer
go in an inner loop of their own, the others to ``_encode_unanswered``.

Everything a piece needs, its merge included, is compiled into the loop over the pieces
(``encode_piece`` is inlined): a call between compiled functions passes each array as a struct
of seven words, so a call that hands over the tables, the cache and the merge scratch cost more
than a lookup (docs/performance.md, "BPE of fresh pieces").
"""

from __future__ import annotations

import numpy as np

from ...native import atomics
from ...native.hashing import EMPTY, find_span, hash_span
from ...native.jit import index, kernel, leaf, leaf_inline
from ...native.utf8 import code_point_at, sequence_length, well_formed_code_point_at
from .seams import crosses, seam_table_at, solo_count, solo_id
from .merge import SMALL_MERGE_BYTES, UTF8_MULTI_BYTE_LEAD, merge_any_piece, new_merge_scratch
from .piece_cache import (
    IN_GENERAL_TABLE,
    SHORT_ADDED,
    SHORT_BASE,
    SHORT_FULL_EIGHTHS,
    cache_find,
    cache_store,
    start_short_table_over,
)
from .tables import (
    COUNT_SHIFT,
    ENTRY_WORDS,
    MAX_INLINE_IDS,
    NO_MERGE,
    SHORT_PIECE_BYTES,
    byte_piece_index,
    entry_count,
    entry_id,
    find_entry,
    maybe_long_token,
    put_entry,
    short_hash,
    short_key,
)

# pieces at least this long that miss the caches are merged in sections between their seams (seams.py); shorter
# ones merged whole as fast or faster in fresh Arabic, Cyrillic and Latin text (docs/performance.md)
SEAM_MIN_PIECE_BYTES = SMALL_MERGE_BYTES + 1
PROBE_BLOCK = 256  # pieces whose short-table slots are fetched before any of them is looked up
# a block with at least this share of pieces of one or two bytes, and at most this many pieces longer than
# SHORT_PIECE_BYTES (each one is hashed, probed and branched on in pass 4), is encoded in passes
TINY_SHARE = (2, 8)
MAX_LONG_IN_PASSES = 2
LONG_LIST = 3 * PROBE_BLOCK  # where a block in passes lists its long pieces (at most MAX_LONG_IN_PASSES)


@leaf_inline
def emit_entry(table, entry, out, n_out):
    """Write the ids of a short entry at ``out[n_out:]``; returns the new ``n_out``."""
    n_ids = entry_count(table, entry)
    for k in range(n_ids):
        out[index(n_out + k)] = entry_id(table, entry, k)
    return n_out + n_ids


@leaf_inline
def _copy_cached_ids(cache, entry, out, n_out):
    first = cache.ids_at[index(entry)]
    n_ids = cache.ids_len[index(entry)]
    for i in range(n_ids):
        out[index(n_out + i)] = cache.ids[index(first + i)]
    return n_out + n_ids


@leaf_inline
def piece_key(buf, start, end):
    """``(lo, hi, h)`` of the piece ``buf[start:end]`` (three bytes or more): its two-word key and short
    hash when it has at most ``SHORT_PIECE_BYTES``, else zeros and its span hash."""
    if end - start <= SHORT_PIECE_BYTES:
        lo, hi = short_key(buf, start, end)
        return lo, hi, short_hash(lo, hi)
    return np.uint64(0), np.uint64(0), hash_span(buf, start, end)


@leaf_inline
def encode_piece(tables, cache, buf, start, end, out, n_out, scratch, lo, hi, h):
    """Ids of the piece ``buf[start:end]`` (three bytes or more; ``lo, hi, h``: its ``piece_key``) at
    ``out[n_out:]``; returns the new ``n_out``. From the vocabulary or the piece cache, else merged and
    added to the cache (short pieces with at most ``MAX_INLINE_IDS`` ids to its short table, the others
    to its general one)."""
    length = end - start
    short_slots = cache.short_slots
    entry = np.int64(0)
    slot = np.int64(0)
    if length <= SHORT_PIECE_BYTES:
        # one probe answers tokens and the short pieces merged before
        entry, found = find_entry(short_slots, lo, hi, h)
        if found:
            if entry_count(short_slots, entry) != IN_GENERAL_TABLE:
                return emit_entry(short_slots, entry, out, n_out)
            # its ids are in the general table, unless that table started over since
            span_hash = hash_span(buf, start, end)
            cached, slot = cache_find(cache, buf, start, end, span_hash)
            if cached != EMPTY:
                return _copy_cached_ids(cache, cached, out, n_out)
            n_new = merge_any_piece(tables, buf, start, end, out, n_out, scratch)
            cache_store(cache, slot, span_hash, buf, start, end, out, n_out, n_new)
            return n_new
        if cache.used[index(SHORT_BASE)] == 0:  # a table without the vocabulary's entries (a route's)
            token_entry, is_token = find_entry(tables.short_slots, lo, hi, h)
            if is_token:
                return emit_entry(tables.short_slots, token_entry, out, n_out)
        span_hash = np.uint64(0)
    else:
        span_hash = h
        if maybe_long_token(tables, span_hash):
            rank = find_span(tables.token_slots, tables.token_bytes, tables.token_offsets, buf, start, end,
                             span_hash)
            if rank != EMPTY:
                out[index(n_out)] = rank
                return n_out + 1
        cached, slot = cache_find(cache, buf, start, end, span_hash)
        if cached != EMPTY:
            return _copy_cached_ids(cache, cached, out, n_out)
    n_new = -1
    if length >= SEAM_MIN_PIECE_BYTES and max(buf[index(start)], buf[index(start + 1)]) >= UTF8_MULTI_BYTE_LEAD:
        n_new = encode_by_sections(tables, cache, buf, start, end, out, n_out, scratch)
    if n_new < 0:
        n_new = merge_any_piece(tables, buf, start, end, out, n_out, scratch)
    n_ids = n_new - n_out
    if length <= SHORT_PIECE_BYTES:
        used = cache.used
        if (used[index(SHORT_BASE)] + used[index(SHORT_ADDED)]) * 8 >= (short_slots.shape[0] // ENTRY_WORDS
                                                                        * SHORT_FULL_EIGHTHS):
            start_short_table_over(tables, cache)  # no resizing during a call: memory stays bounded
            entry, _ = find_entry(short_slots, lo, hi, h)
        used[index(SHORT_ADDED)] += 1
        if n_ids <= MAX_INLINE_IDS:
            put_entry(short_slots, entry, lo, hi, out, n_out, n_ids)
            return n_new
        put_entry(short_slots, entry, lo, hi, out, n_out, 0)  # a marker: the ids are in the general table
        short_slots[index(entry * ENTRY_WORDS + 2)] = np.uint64(IN_GENERAL_TABLE) << np.uint64(COUNT_SHIFT)
        span_hash = hash_span(buf, start, end)
        _, slot = cache_find(cache, buf, start, end, span_hash)
    cache_store(cache, slot, span_hash, buf, start, end, out, n_out, n_new)
    return n_new


@leaf_inline
def may_have_seams(tables, buf, start, end):
    """Whether the piece ``buf[start:end]`` starts, after at most one ASCII byte, with a character whose block
    has a seam table (seams.py): the others are merged whole at once."""
    at = start + np.int64(buf[index(start)] < UTF8_MULTI_BYTE_LEAD)
    if at >= end or buf[index(at)] < UTF8_MULTI_BYTE_LEAD or at + sequence_length(buf[index(at)]) > end:
        return False
    cp = code_point_at(buf, at)
    return cp < 0x10000 and seam_table_at(tables.seam_blocks, cp) >= 0


@leaf_inline
def _encode_section(tables, cache, buf, start, end, out, n_out, scratch, table, cp, one_char):
    """Ids of a section of a piece at ``out[n_out:]``; returns the new ``n_out``. One character of a block
    with a table (``one_char``; ``cp`` at ``table``): its own ids from the table. Others from the piece cache's
    short table, else merged (and added there while it has room: a section never makes it start over)."""
    if one_char:
        count = solo_count(tables.seam_words, table, cp)
        if count > 0:
            for k in range(count):
                out[index(n_out + k)] = solo_id(tables.seam_words, table, cp, k)
            return n_out + count
    short_slots = cache.short_slots
    short = end - start <= SHORT_PIECE_BYTES
    found = False
    entry = np.int64(0)
    lo = hi = np.uint64(0)
    if short:
        lo, hi = short_key(buf, start, end)
        entry, found = find_entry(short_slots, lo, hi, short_hash(lo, hi))
        if found and entry_count(short_slots, entry) != IN_GENERAL_TABLE:
            return emit_entry(short_slots, entry, out, n_out)
    n_new = merge_any_piece(tables, buf, start, end, out, n_out, scratch)
    used = cache.used
    room = (used[index(SHORT_BASE)] + used[index(SHORT_ADDED)] + 1) * 8 < (short_slots.shape[0] // ENTRY_WORDS
                                                                          * SHORT_FULL_EIGHTHS)
    if short and not found and room and n_new - n_out <= MAX_INLINE_IDS:
        put_entry(short_slots, entry, lo, hi, out, n_out, n_new - n_out)
        used[index(SHORT_ADDED)] += 1
    return n_new


@leaf
def encode_by_sections(tables, cache, buf, start, end, out, n_out, scratch):
    """Ids of the piece ``buf[start:end]`` at ``out[n_out:]``, merged as the sections between its seams, the
    positions no token can cross (seams.py); returns the new ``n_out``, or -1 (nothing written) when it has none."""
    if not may_have_seams(tables, buf, start, end):
        return np.int64(-1)
    seam_blocks = tables.seam_blocks
    seam_words = tables.seam_words
    section_start = start
    section_units = 0  # characters (or stray bytes) in the section so far
    prev_cp = np.int64(-1)
    prev_table = np.int64(-1)
    i = start
    while True:
        width = np.int64(1)
        table = np.int64(-1)
        cp = np.int64(-1)
        if i < end and buf[index(i)] >= UTF8_MULTI_BYTE_LEAD:
            width = sequence_length(buf[index(i)])
            if i + width > end:
                width = 1
            elif width <= 3:
                cp = well_formed_code_point_at(buf, i, width)  # bytes need not be UTF-8 (encode_bytes)
                if cp >= 0:
                    table = seam_table_at(seam_blocks, cp)
        if i == end or (table >= 0 and table == prev_table and not crosses(seam_words, table, prev_cp, cp)):
            if i == end and section_start == start:
                return np.int64(-1)
            n_out = _encode_section(tables, cache, buf, section_start, i, out, n_out, scratch, prev_table, prev_cp,
                                    section_units == 1 and prev_table >= 0)
            if i == end:
                return n_out
            section_start = i
            section_units = 0
        prev_table = table
        prev_cp = cp
        section_units += 1
        i += width


@leaf_inline
def _block_tables(tables, cache):
    """What a block of pieces reads: the byte and byte-pair ranks, the short table (a copy of the
    vocabulary's, with the short pieces merged before) and the general table, with their slot masks."""
    short_slots = cache.short_slots
    general_slots = cache.slots
    return (tables.byte_rank, tables.byte_pair_rank, short_slots, np.uint64(short_slots.shape[0] // ENTRY_WORDS - 1),
            general_slots, np.uint64(general_slots.shape[0] - 1))


@leaf_inline
def _block_in_passes(tables, cache, buf, piece_end, p, block_end, start, out, n_out, scratch, keys, block):
    """The pieces ``p:block_end`` (the first starting at ``start``) as ids at ``out[n_out:]``, in passes
    that each branch on what is predictable; returns the new ``n_out``."""
    byte_rank, byte_pair_rank, short_slots, entry_mask, general_slots, general_mask = _block_tables(tables, cache)
    # 1. Single bytes and byte pairs answered by loads and conditional moves (the length of the
    #    next piece is not predictable, so a branch on it would often be mispredicted); longer
    #    pieces listed
    n_short = 0
    n_long = 0
    piece_start = start
    for q in range(p, block_end):
        piece_stop = piece_end[index(q)]
        j = q - p
        block[index(j)] = byte_pair_rank[index(byte_piece_index(piece_stop - piece_start, buf[index(piece_start)],
                                                                buf[index(piece_stop - 1)]))]
        block[index(PROBE_BLOCK + j)] = piece_start
        # short pieces (3 bytes or more) and long ones listed: each list's next place written every time, by a
        # plain store (a store to a chosen address made every later load of the loop wait: 7-19% of BPE)
        length = piece_stop - piece_start
        block[index(2 * PROBE_BLOCK + n_short)] = j
        block[index(LONG_LIST + n_long)] = j
        n_short += np.int64(length >= 3) & np.int64(length <= SHORT_PIECE_BYTES)
        n_long += np.int64(length > SHORT_PIECE_BYTES)
        piece_start = piece_stop
    # 2. the listed pieces' keys, the table slots they probe fetched meanwhile
    for k in range(n_short):
        j = block[index(2 * PROBE_BLOCK + k)]
        lo, hi = short_key(buf, block[index(PROBE_BLOCK + j)], piece_end[index(p + j)])
        h = short_hash(lo, hi)
        keys[index(3 * j)] = lo
        keys[index(3 * j + 1)] = hi
        keys[index(3 * j + 2)] = h
        atomics.prefetch(short_slots, (h & entry_mask) * np.uint64(ENTRY_WORDS))
    for k in range(n_long):
        j = block[index(LONG_LIST + k)]
        block[index(j)] = NO_MERGE
        h = hash_span(buf, block[index(PROBE_BLOCK + j)], piece_end[index(p + j)])
        keys[index(3 * j)] = 0
        keys[index(3 * j + 1)] = 0
        keys[index(3 * j + 2)] = h
        atomics.prefetch(general_slots, h & general_mask)
    # 3. most short pieces are tokens: one probe each (the others are looked up or merged below)
    for k in range(n_short):
        j = block[index(2 * PROBE_BLOCK + k)]
        entry, found = find_entry(short_slots, keys[index(3 * j)], keys[index(3 * j + 1)],
                                  keys[index(3 * j + 2)])
        block[index(j)] = entry_id(short_slots, entry, 0) if found and entry_count(short_slots, entry) == 1 \
            else NO_MERGE
    # 4. the ids in order: the answered pieces by a tight loop, the others (pairs that are not tokens, pieces
    #    merged before, misses) one by one
    n_pieces = block_end - p
    j = 0
    while j < n_pieces:
        while j < n_pieces and block[index(j)] != NO_MERGE:
            out[index(n_out)] = block[index(j)]
            n_out += 1
            j += 1
        if j < n_pieces:
            n_out = _encode_unanswered(tables, cache, buf, block[index(PROBE_BLOCK + j)], piece_end[index(p + j)],
                                       out, n_out, scratch, keys, j)
            j += 1
    return n_out


@leaf_inline
def _encode_unanswered(tables, cache, buf, start, end, out, n_out, scratch, keys, j):
    """The ids of a piece the dense tables and one short-table probe did not answer (the ``j``-th of its block,
    its key in ``keys``: passes 1-3 of ``_block_in_passes``, or ``_block_by_length``'s inner loop) at
    ``out[n_out:]``; returns the new ``n_out``."""
    if end - start == 2:  # not a token, so no merge applies: its two bytes
        out[index(n_out)] = tables.byte_rank[index(buf[index(start)])]
        out[index(n_out + 1)] = tables.byte_rank[index(buf[index(start + 1)])]
        return n_out + 2
    lo, hi, h = keys[index(3 * j)], keys[index(3 * j + 1)], keys[index(3 * j + 2)]
    if end - start <= SHORT_PIECE_BYTES:  # merged before into a few ids: they are in its short entry
        short_slots = cache.short_slots
        entry, found = find_entry(short_slots, lo, hi, h)
        if found and entry_count(short_slots, entry) != IN_GENERAL_TABLE:
            return emit_entry(short_slots, entry, out, n_out)
    return encode_piece(tables, cache, buf, start, end, out, n_out, scratch, lo, hi, h)


@leaf_inline
def _block_by_length(tables, cache, buf, piece_end, p, block_end, start, out, n_out, scratch, keys):
    """``_block_in_passes`` one piece at a time, branching on each piece's length: faster where most
    pieces have three bytes or more (the branch is then predictable)."""
    byte_rank, byte_pair_rank, short_slots, entry_mask, general_slots, general_mask = _block_tables(tables, cache)
    # the keys of a block's pieces first, the table slots they probe fetched meanwhile
    piece_start = start
    for q in range(p, block_end):
        piece_stop = piece_end[index(q)]
        if piece_stop - piece_start >= 3:
            lo, hi, h = piece_key(buf, piece_start, piece_stop)
            j = 3 * (q - p)
            keys[index(j)] = lo
            keys[index(j + 1)] = hi
            keys[index(j + 2)] = h
            if piece_stop - piece_start <= SHORT_PIECE_BYTES:
                atomics.prefetch(short_slots, (h & entry_mask) * np.uint64(ENTRY_WORDS))
            else:
                atomics.prefetch(general_slots, h & general_mask)
        piece_start = piece_stop
    q = p
    while q < block_end:
        # the pieces the tables answer, in a loop of their own (with the merge inlined in its body, every
        # variable of one loop lived on the stack)
        while q < block_end:
            end = piece_end[index(q)]
            length = end - start
            if length == 1:
                out[index(n_out)] = byte_rank[index(buf[index(start)])]
                n_out += 1
            elif length == 2:  # a fifth of all pieces: the byte-pair table answers
                rank = byte_pair_rank[index(np.int64(buf[index(start)]) * 256 + buf[index(start + 1)])]
                if rank == NO_MERGE:
                    break
                out[index(n_out)] = rank
                n_out += 1
            elif length <= SHORT_PIECE_BYTES:  # most pieces are tokens or merged before: one probe
                j = 3 * (q - p)
                entry, found = find_entry(short_slots, keys[index(j)], keys[index(j + 1)], keys[index(j + 2)])
                if not found or entry_count(short_slots, entry) == IN_GENERAL_TABLE:
                    break
                n_out = emit_entry(short_slots, entry, out, n_out)
            else:
                break
            start = end
            q += 1
        if q == block_end:
            break
        n_out = _encode_unanswered(tables, cache, buf, start, end, out, n_out, scratch, keys, q - p)
        start = end
        q += 1
    return n_out


@leaf
def _encode_all(tables, buf, run_start, run_special, first_piece, piece_end, out, run_out_end, cache, scratch, keys,
                block):
    n_out = 0
    for r in range(run_start.shape[0]):
        if run_special[index(r)] >= 0:
            out[index(n_out)] = run_special[index(r)]
            n_out += 1
            run_out_end[index(r)] = n_out
            continue
        start = run_start[index(r)]
        p = first_piece[index(r)]
        last = first_piece[index(r + 1)]
        while p < last:
            block_end = min(p + PROBE_BLOCK, last)
            n_tiny = np.int64(piece_end[index(p)] - start <= 2)  # pieces of one or two bytes
            n_long = np.int64(piece_end[index(p)] - start > SHORT_PIECE_BYTES)
            for q in range(p + 1, block_end):
                length = piece_end[index(q)] - piece_end[index(q - 1)]
                n_tiny += np.int64(length <= 2)
                n_long += np.int64(length > SHORT_PIECE_BYTES)
            if n_tiny * TINY_SHARE[1] >= (block_end - p) * TINY_SHARE[0] and n_long <= MAX_LONG_IN_PASSES:
                n_out = _block_in_passes(tables, cache, buf, piece_end, p, block_end, start, out, n_out, scratch, keys,
                                         block)
            else:
                n_out = _block_by_length(tables, cache, buf, piece_end, p, block_end, start, out, n_out, scratch, keys)
            start = piece_end[index(block_end - 1)]
            p = block_end
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
    scratch = new_merge_scratch(longest_piece(run_start, run_special, first_piece, piece_end), cache.pair_memo)
    keys = np.empty(3 * PROBE_BLOCK, dtype=np.uint64)
    block = np.empty(LONG_LIST + MAX_LONG_IN_PASSES + 1, dtype=np.int64)  # per piece: id or NO_MERGE, start; lists
    return _encode_all(tables, buf, run_start, run_special, first_piece, piece_end, out, run_out_end,
                       cache, scratch, keys, block)
