"""BPE of the pieces of text runs into one preallocated ``uint32`` array (``encode_runs``).

Each piece is looked up whole first (tiktoken does the same: only a miss is merged): single
bytes and byte pairs in dense tables, pieces of up to 7 bytes with one probe of the short
table (which also holds the short pieces this cache merged before), longer ones in the
byte-span table, and misses in the piece cache before they are merged.
"""

from __future__ import annotations

import numpy as np

from ...native.hashing import EMPTY, find_span, hash_span
from ...native.jit import index, kernel, leaf
from .merge import merge_piece, new_merge_scratch
from .piece_cache import _add_short_piece, _cache_find, _cache_store
from .tables import NO_MERGE, SHORT_TOKEN_BYTES, find_short_piece, packed_count, packed_id, short_key


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
