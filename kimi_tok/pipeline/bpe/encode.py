"""BPE of the pieces of text runs into one preallocated ``uint32`` array (``encode_runs``).

Each piece is looked up whole first (tiktoken does the same: only a miss is merged): single
bytes and byte pairs in dense tables, pieces of up to ``SHORT_PIECE_BYTES`` by one probe of the
piece cache's short table (a copy of the vocabulary's, with the short pieces merged before);
longer pieces in the byte-span table (when a filter of the long tokens' hashes lets them), then
the piece cache's general table. A miss is merged and cached.
"""

from __future__ import annotations

import numpy as np

from ...native.hashing import EMPTY, find_span, hash_span
from ...native.jit import index, kernel, leaf
from .merge import merge_piece, new_merge_scratch
from .piece_cache import IN_GENERAL_TABLE, _cache_find, _cache_store, add_short_piece
from .tables import (NO_MERGE, SHORT_PIECE_BYTES, entry_count, entry_id, find_entry, maybe_long_token, short_hash,
                     short_key)


@leaf
def emit_entry(table, entry, out, n_out):
    """Write the ids of a short entry at ``out[n_out:]``; returns the new ``n_out``."""
    n_ids = entry_count(table, entry)
    for k in range(n_ids):
        out[index(n_out + k)] = entry_id(table, entry, k)
    return n_out + n_ids


@leaf
def encode_short_piece(tables, cache, buf, start, end, lo, hi, h, out, n_out, scratch):
    """Ids of a short piece (key ``(lo, hi)``, hash ``h``) from the piece cache's short table (which holds
    the vocabulary's tokens too, unless it is a route's), else merged and added there (or to the
    general table when its ids do not fit an entry)."""
    short_slots = cache.short_slots
    entry, found = find_entry(short_slots, lo, hi, h)
    if found:
        if entry_count(short_slots, entry) != IN_GENERAL_TABLE:
            return emit_entry(short_slots, entry, out, n_out)
        return encode_unknown_piece(tables, cache, buf, start, end, out, n_out, scratch, hash_span(buf, start, end))
    n_new = merge_piece(tables, buf, start, end, out, n_out, scratch)
    if not add_short_piece(tables, cache, lo, hi, h, entry, out, n_out, n_new):
        _, slot = _cache_find(cache, buf, start, end, hash_span(buf, start, end))
        _cache_store(cache, slot, buf, start, end, out, n_out, n_new)
    return n_new


@leaf
def encode_unknown_piece(tables, cache, buf, start, end, out, n_out, scratch, h):
    """Ids of a long piece (hash ``h``: ``hash_span``) that is not a token: from the piece cache,
    else merged and cached."""
    entry, slot = _cache_find(cache, buf, start, end, h)
    if entry != EMPTY:
        first = cache.ids_at[index(entry)]
        n_ids = cache.ids_len[index(entry)]
        for i in range(n_ids):
            out[index(n_out + i)] = cache.ids[index(first + i)]
        return n_out + n_ids
    n_new = merge_piece(tables, buf, start, end, out, n_out, scratch)
    _cache_store(cache, slot, buf, start, end, out, n_out, n_new)
    return n_new


@leaf
def _encode_all(tables, buf, run_start, run_special, first_piece, piece_end, out, run_out_end, cache, scratch):
    n_out = 0
    byte_rank = tables.byte_rank
    byte_pair_rank = tables.byte_pair_rank
    short_slots = cache.short_slots  # a copy of the vocabulary's, with the short pieces merged before
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
            elif length <= SHORT_PIECE_BYTES:
                # one probe answers tokens and the short pieces merged before
                lo, hi = short_key(buf, start, end)
                h = short_hash(lo, hi)
                entry, found = find_entry(short_slots, lo, hi, h)
                if found and entry_count(short_slots, entry) == 1:
                    out[index(n_out)] = entry_id(short_slots, entry, 0)
                    n_out += 1
                else:
                    n_out = encode_short_piece(tables, cache, buf, start, end, lo, hi, h, out, n_out, scratch)
            else:
                h = hash_span(buf, start, end)
                rank = EMPTY
                if maybe_long_token(tables, h):
                    rank = find_span(tables.token_slots, tables.token_bytes, tables.token_offsets, buf, start, end,
                                     h)
                if rank != EMPTY:
                    out[index(n_out)] = rank
                    n_out += 1
                else:
                    n_out = encode_unknown_piece(tables, cache, buf, start, end, out, n_out, scratch, h)
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
    scratch = new_merge_scratch(longest_piece(run_start, run_special, first_piece, piece_end), cache.pair_memo)
    return _encode_all(tables, buf, run_start, run_special, first_piece, piece_end, out, run_out_end,
                       cache, scratch)
