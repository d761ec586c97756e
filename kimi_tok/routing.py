"""Hash routing of the pieces of one call over workers (the multi-threaded BPE path).

The sequential kernel (``bpe.encode_runs``) looks up and merges the pieces of its
runs in one pass. When a call is split over ``n`` workers, each worker meeting the
same unknown word would merge it again and warm a different piece cache. Routing
instead runs three phases, each in parallel:

1. ``classify_pieces`` (per group of runs): every piece that is a vocabulary token
   (or a short piece its route merged before) gets its ids; the others ("misses",
   ~8% of pieces in fresh prose) are listed with their route ``hash(piece) mod n``.
2. ``merge_misses`` (per route): worker ``w`` merges the misses routed to ``w``, so
   identical pieces meet in one worker and are merged once per call, then served
   from that worker's piece cache. Each miss writes into its own slot of a shared
   arena (a piece of ``b`` bytes has at most ``b`` ids), so workers never collide.
   Long misses (``LONG_MISS_BYTES``) are tasks of their own (identical ones merged
   once), scheduled first, longest first, so that they even out rather than pile up.
3. ``assemble_ids`` (per group): ranks and merged ids go, in input order, straight
   into the call's one output array at the group's offset (known after phase 2).

The ids are those of the sequential kernel: a piece's ids depend only on its bytes.
"""

from __future__ import annotations

import numpy as np

from typing import NamedTuple

from .bpe import (
    NO_MERGE,
    PACKED_COUNT_SHIFT,
    PACKED_ID_BITS,
    SHORT_TOKEN_BYTES,
    encode_unknown_piece,
    find_short_piece,
    new_merge_scratch,
    new_piece_cache,
    packed_count,
    packed_id,
    short_key,
)
from .hashing import EMPTY, find_span, hash_span, mix64
from .jit import kernel, leaf

ROUTE_SHIFT = np.uint64(32)  # route by the high bits: the low bits pick hash-table slots
MISS = np.uint64(0)  # piece_value of a piece phase 1 could not resolve
# a miss this long (~150 ns a byte to merge: 0.15 ms and more) is merged as a task of its own
# rather than by its route: a few 20 KB runs would otherwise load one route with ~10 ms of work
LONG_MISS_BYTES = 1024
LONG_MISS = -1  # the "route" of a long miss


@leaf
def route_for_hash(h, n_routes):
    return np.int64((h >> ROUTE_SHIFT) % np.uint64(n_routes))


@leaf
def route_of(buf, start, end, n_routes):
    """The worker that merges the piece ``buf[start:end]`` (and whose short table knows it);
    the hash is the one the tables use for the piece (``classify_pieces``)."""
    if end - start <= SHORT_TOKEN_BYTES:
        return route_for_hash(mix64(short_key(buf, start, end)), n_routes)
    return route_for_hash(hash_span(buf, start, end), n_routes)


@leaf
def one_id(rank):
    """A piece value holding one id (the short-table format: count, then 20-bit ids)."""
    return (np.uint64(1) << np.uint64(PACKED_COUNT_SHIFT)) | np.uint64(rank)


@leaf
def two_ids(first, second):
    """A piece value holding two ids."""
    count = np.uint64(2) << np.uint64(PACKED_COUNT_SHIFT)
    return count | np.uint64(first) | (np.uint64(second) << np.uint64(PACKED_ID_BITS))


@leaf
def classify_pieces(tables, short_tables, buf, run_start, run_special, first_piece, piece_end, piece_value,
                    miss_start, miss_end, miss_route):
    """One pass over a group's pieces: ``piece_value[p]`` gets the packed ids of piece ``p`` when
    a table knows them, else ``MISS``, and each miss's bytes and route are listed (in order).

    A short piece is looked up in the short table of its route, which also holds the short
    pieces that route merged before. Returns ``(misses, ids known)``; the ids known count the
    special tokens too.
    """
    n_routes = short_tables.shape[0]
    n_misses = 0
    n_known = 0
    for r in range(run_start.shape[0]):
        if run_special[r] >= 0:
            n_known += 1
            continue
        start = run_start[r]
        for p in range(first_piece[r], first_piece[r + 1]):
            end = piece_end[p]
            length = end - start
            value = MISS
            if length == 1:
                value = one_id(tables.byte_rank[buf[start]])
            elif length == 2:  # as in bpe._encode_all: the byte-pair table, or the two bytes
                rank = tables.byte_pair_rank[np.int64(buf[start]) * 256 + buf[start + 1]]
                if rank != NO_MERGE:
                    value = one_id(rank)
                else:
                    value = two_ids(tables.byte_rank[buf[start]], tables.byte_rank[buf[start + 1]])
            elif length <= SHORT_TOKEN_BYTES:
                key = short_key(buf, start, end)
                h = mix64(key)
                value, _ = find_short_piece(short_tables[route_for_hash(h, n_routes)], key)
            else:
                h = hash_span(buf, start, end)
                rank = find_span(tables.token_slots, tables.token_bytes, tables.token_offsets, buf, start, end, h)
                if rank != EMPTY:
                    value = one_id(rank)
            piece_value[p] = value
            if value == MISS:
                miss_start[n_misses] = start
                miss_end[n_misses] = end
                miss_route[n_misses] = route_for_hash(h, n_routes)
                n_misses += 1
            else:
                n_known += packed_count(value)
            start = end
    return n_misses, n_known


@leaf
def _longest_miss(miss_start, miss_end, miss_route, route, first, last):
    longest = 0
    for m in range(first, last):
        if miss_route[m] == route:
            longest = max(longest, miss_end[m] - miss_start[m])
    return longest


@leaf
def _merge_route(tables, buf, miss_start, miss_end, miss_route, route, first, last, miss_at, miss_ids, miss_count,
                 cache, scratch):
    short_slots = cache.short_slots
    for m in range(first, last):
        if miss_route[m] != route:
            continue
        start = miss_start[m]
        end = miss_end[m]
        at = miss_at[m]
        short_slot = -1
        if end - start <= SHORT_TOKEN_BYTES:
            # merged earlier in this phase (a repeat within the call): one probe
            packed, short_slot = find_short_piece(short_slots, short_key(buf, start, end))
            if packed != 0:
                for k in range(packed_count(packed)):
                    miss_ids[at + k] = packed_id(packed, k)
                miss_count[m] = packed_count(packed)
                continue
        miss_count[m] = encode_unknown_piece(tables, cache, buf, start, end, miss_ids, at, scratch,
                                             short_slot) - at


@kernel
def merge_misses(tables, buf, miss_start, miss_end, miss_route, route, first, last, miss_at, miss_ids, miss_count,
                 cache):
    """Merge misses ``first..last-1`` routed to ``route``: ids of miss ``m`` go to
    ``miss_ids[miss_at[m]:]``, their number to ``miss_count[m]``. ``cache`` is the route's."""
    scratch = new_merge_scratch(_longest_miss(miss_start, miss_end, miss_route, route, first, last))
    _merge_route(tables, buf, miss_start, miss_end, miss_route, route, first, last, miss_at, miss_ids, miss_count,
                 cache, scratch)


@leaf
def assemble_ids(run_special, first_piece, piece_value, miss_at, miss_ids, miss_count, first_miss, out, out_at,
                 run_out_end):
    """Ids of a group's runs into ``out`` from ``out_at``; ``run_out_end[r]`` gets each run's end."""
    n = out_at
    m = first_miss
    for r in range(run_special.shape[0]):
        if run_special[r] >= 0:
            out[n] = run_special[r]
            n += 1
        else:
            for p in range(first_piece[r], first_piece[r + 1]):
                value = piece_value[p]
                if value != MISS:
                    for k in range(packed_count(value)):
                        out[n] = packed_id(value, k)
                        n += 1
                else:
                    for k in range(miss_count[m]):
                        out[n] = miss_ids[miss_at[m] + k]
                        n += 1
                    m += 1
        run_out_end[r] = n
    return n


class RouteCaches(NamedTuple):
    """One piece cache per route, lent together to one call; their short tables are rows of
    ``short_tables``, so phase 1 can read the table of any route."""

    short_tables: np.ndarray  # uint64[n_routes, 2 * short slots]
    caches: list


def new_route_caches(tables, n_routes: int) -> RouteCaches:
    """A full-size piece cache per route (as many caches as the threads used to keep, but each
    holds only its route's pieces, so together they remember ``n_routes`` times more)."""
    short_tables = np.tile(tables.short_slots, (n_routes, 1))
    return RouteCaches(short_tables, [new_piece_cache(tables, short_slots=short_tables[route])
                                      for route in range(n_routes)])
