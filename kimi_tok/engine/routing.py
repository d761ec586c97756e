"""Hash routing of the pieces of one call over workers (the multi-threaded BPE path).

The sequential kernel (``pipeline.bpe.encode_runs``) looks up and merges the pieces of its
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

import threading
from typing import NamedTuple

import numpy as np

from ..native.hashing import EMPTY, find_span, hash_span
from ..native.jit import kernel, leaf
from ..pipeline import bpe
from ..pipeline.assembly import ID_DTYPE, SubstringEncoder
from ..pipeline.bpe.encode import encode_piece, piece_key
from ..pipeline.bpe.merge import new_merge_scratch
from ..pipeline.bpe.piece_cache import SHORT_CACHE_ENTRIES, new_piece_cache
from ..pipeline.bpe.tables import (COUNT_SHIFT, ENTRY_WORDS, ID_BITS, ID_MASK, IDS_PER_WORD, NO_MERGE,
                                   SHORT_PIECE_BYTES, entry_count, find_entry, maybe_long_token, short_hash,
                                   short_key)
from .threads import thread_pool

ROUTE_SHIFT = np.uint64(32)  # route by the high bits: the low bits pick hash-table slots
MISS = np.uint64(0)  # piece_value of a piece phase 1 could not resolve
# a miss this long (~150 ns a byte to merge: 0.15 ms and more) is merged as a task of its own
# rather than by its route: a few 20 KB runs would otherwise load one route with ~10 ms of work
LONG_MISS_BYTES = 1024
LONG_MISS = -1  # the "route" of a long miss
MAX_KEPT_ROUTE_CACHE_SETS = 2  # route cache sets kept per number of routes (concurrent long calls)


@leaf
def route_for_hash(h, n_routes):
    return np.int64((h >> ROUTE_SHIFT) % np.uint64(n_routes))


@leaf
def route_of(buf, start, end, n_routes):
    """The worker that merges the piece ``buf[start:end]`` (and whose short table knows it);
    the hash is the one the tables use for the piece (``classify_pieces``)."""
    if end - start <= SHORT_PIECE_BYTES:
        lo, hi = short_key(buf, start, end)
        return route_for_hash(short_hash(lo, hi), n_routes)
    return route_for_hash(hash_span(buf, start, end), n_routes)


@leaf
def one_id(rank):
    """A piece value holding one id (a short entry's first ids word: count, then 20-bit ids)."""
    return (np.uint64(1) << np.uint64(COUNT_SHIFT)) | np.uint64(rank)


@leaf
def two_ids(first, second):
    """A piece value holding two ids."""
    count = np.uint64(2) << np.uint64(COUNT_SHIFT)
    return count | np.uint64(first) | (np.uint64(second) << np.uint64(ID_BITS))


@leaf
def value_count(value):
    return np.int64(value >> np.uint64(COUNT_SHIFT))


@leaf
def value_id(value, k):
    return np.int64((value >> np.uint64(ID_BITS * k)) & np.uint64(ID_MASK))


@leaf
def classify_pieces(tables, short_tables, buf, run_start, run_special, first_piece, piece_end, piece_value,
                    miss_start, miss_end, miss_route):
    """One pass over a group's pieces: ``piece_value[p]`` gets the packed ids of piece ``p`` when
    a table knows them, else ``MISS``, and each miss's bytes and route are listed (in order).

    A short piece that is not a token is looked up in its route's table of merged short pieces. Returns ``(misses, ids known)``; the ids known count the
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
            elif length <= SHORT_PIECE_BYTES:
                lo, hi = short_key(buf, start, end)
                h = short_hash(lo, hi)
                entry, found = find_entry(tables.short_slots, lo, hi, h)
                if found:
                    value = tables.short_slots[entry * ENTRY_WORDS + 2]  # a token: count 1, its id
                else:  # merged before by its route? (a value holds up to 3 ids: more are merged again)
                    route_table = short_tables[route_for_hash(h, n_routes)]
                    entry, found = find_entry(route_table, lo, hi, h)
                    if found and entry_count(route_table, entry) <= IDS_PER_WORD:
                        value = route_table[entry * ENTRY_WORDS + 2]
            else:
                h = hash_span(buf, start, end)
                if maybe_long_token(tables, h):
                    rank = find_span(tables.token_slots, tables.token_bytes, tables.token_offsets, buf, start, end,
                                     h)
                    if rank != EMPTY:
                        value = one_id(rank)
            piece_value[p] = value
            if value == MISS:
                miss_start[n_misses] = start
                miss_end[n_misses] = end
                miss_route[n_misses] = route_for_hash(h, n_routes)
                n_misses += 1
            else:
                n_known += value_count(value)
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
    for m in range(first, last):
        if miss_route[m] != route:
            continue
        start = miss_start[m]
        end = miss_end[m]
        at = miss_at[m]
        # merged earlier in this phase (a repeat within the call), or merged now and added
        lo, hi, h = piece_key(buf, start, end)
        miss_count[m] = encode_piece(tables, cache, buf, start, end, miss_ids, at, scratch, lo, hi, h) - at


@kernel
def merge_misses(tables, buf, miss_start, miss_end, miss_route, route, first, last, miss_at, miss_ids, miss_count,
                 cache):
    """Merge misses ``first..last-1`` routed to ``route``: ids of miss ``m`` go to
    ``miss_ids[miss_at[m]:]``, their number to ``miss_count[m]``. ``cache`` is the route's."""
    scratch = new_merge_scratch(_longest_miss(miss_start, miss_end, miss_route, route, first, last), cache.pair_memo)
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
                    for k in range(value_count(value)):
                        out[n] = value_id(value, k)
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

    short_tables: np.ndarray  # uint64[n_routes, short entries]: each route's merged short pieces
    caches: list


def new_route_caches(tables, n_routes: int) -> RouteCaches:
    """A full-size piece cache per route (as many caches as the threads used to keep, but each
    holds only its route's pieces, so together they remember ``n_routes`` times more)."""
    short_tables = np.zeros((n_routes, ENTRY_WORDS * SHORT_CACHE_ENTRIES), dtype=np.uint64)
    return RouteCaches(short_tables, [new_piece_cache(short_slots=short_tables[route])
                                      for route in range(n_routes)])


class GroupPieces(NamedTuple):
    """Phase 1 of the routed path for one group of sub-strings."""

    run_start: np.ndarray
    run_special: np.ndarray
    first_piece: np.ndarray
    piece_value: np.ndarray  # uint64 packed ids per piece, MISS if not known yet
    miss_start: np.ndarray
    miss_end: np.ndarray
    miss_route: np.ndarray
    n_known_ids: int  # ids known before merging: resolved pieces and special tokens


class HashRouter:
    """The three phases of the routed path for one vocabulary's ``SubstringEncoder``, with a set of
    piece caches per number of routes (route ``w`` always gets cache ``w`` of the set lent to a
    call, so what a route merged stays where its pieces are routed)."""

    def __init__(self, encoder: SubstringEncoder, merge_slice_bytes: int) -> None:
        self.encoder = encoder
        self.merge_slice_bytes = merge_slice_bytes
        self._route_caches: dict[int, bpe.PieceCachePool] = {}  # per number of routes
        self._route_caches_lock = threading.Lock()

    def find_pieces(self, buf, sub_start, sub_end, sub_allow, route_caches: RouteCaches) -> GroupPieces:
        """Phase 1: pieces, the ids of those the tables know, and the misses with their routes."""
        run_start, _, run_special, first_piece, piece_end = self.encoder.runs_and_pieces(buf, sub_start, sub_end,
                                                                                         sub_allow)
        n_pieces = piece_end.shape[0]
        piece_value = np.empty(n_pieces, dtype=np.uint64)
        # sized for the worst case; only the pages of actual misses are ever touched
        miss_start = np.empty(n_pieces, dtype=np.int64)
        miss_end = np.empty(n_pieces, dtype=np.int64)
        miss_route = np.empty(n_pieces, dtype=np.int64)
        n_misses, n_known = classify_pieces(
            self.encoder.tables, route_caches.short_tables, buf, run_start, run_special, first_piece, piece_end,
            piece_value, miss_start, miss_end, miss_route,
        )
        return GroupPieces(run_start, run_special, first_piece, piece_value, miss_start[:n_misses],
                           miss_end[:n_misses], miss_route[:n_misses], n_known)

    def borrow_route_caches(self, n_routes: int):
        """A set of ``n_routes`` piece caches lent to one call (route ``w`` always gets cache ``w``
        of the set, so what a route merged stays where its pieces are routed)."""
        with self._route_caches_lock:
            pool = self._route_caches.get(n_routes)
            if pool is None:
                pool = bpe.PieceCachePool(lambda: new_route_caches(self.encoder.tables, n_routes),
                                          keep=MAX_KEPT_ROUTE_CACHE_SETS)
                self._route_caches[n_routes] = pool
        return pool.borrow()

    def merge_misses(self, buf, misses: "Misses", route: int, route_caches: RouteCaches,
                     stop: threading.Event) -> None:
        """Phase 2: merge the misses routed to ``route`` into ``misses.ids``, a slice of about
        ``merge_slice_bytes`` at a time; returns early once ``stop`` is set (the call failed
        or was interrupted, and nobody will read the result)."""
        bounds = misses.slices(self.merge_slice_bytes)
        for first, last in zip(bounds[:-1], bounds[1:]):
            if stop.is_set():
                return
            merge_misses(self.encoder.tables, buf, misses.start, misses.end, misses.route, route, first, last,
                                 misses.at, misses.ids, misses.count, route_caches.caches[route])

    def merge_long_miss(self, buf, misses: "Misses", same: list[int], stop: threading.Event) -> None:
        """Phase 2, a long miss (a task of its own, so that a few long pieces do not load one
        route): merged once with a piece cache from the pool, then copied to its repeats."""
        if stop.is_set():
            return
        first = same[0]
        with self.encoder.piece_caches.borrow() as cache:
            merge_misses(self.encoder.tables, buf, misses.start, misses.end, misses.route, LONG_MISS,
                                 first, first + 1, misses.at, misses.ids, misses.count, cache)
        n = misses.count[first]
        ids = misses.ids[misses.at[first]:misses.at[first] + n]
        for m in same[1:]:
            misses.ids[misses.at[m]:misses.at[m] + n] = ids
            misses.count[m] = n

    @staticmethod
    def assemble(group: GroupPieces, misses: "Misses", first_miss: int, out, out_at: int) -> np.ndarray:
        """Phase 3: the group's ids into ``out[out_at:]``; returns its ``run_out_end``."""
        run_out_end = np.empty(group.run_start.shape[0], dtype=np.int64)
        assemble_ids(group.run_special, group.first_piece, group.piece_value, misses.at, misses.ids,
                             misses.count, first_miss, out, out_at, run_out_end)
        return run_out_end


class Misses(NamedTuple):
    """The misses of every group of one call, in input order, and where their ids go."""

    start: np.ndarray
    end: np.ndarray
    route: np.ndarray
    at: np.ndarray  # int64 offset of each miss's ids in ``ids`` (room for one id per byte)
    ids: np.ndarray  # uint32 arena
    count: np.ndarray  # int64 ids per miss, filled by phase 2

    def slices(self, slice_bytes: int) -> list[int]:
        """Miss indices cutting the misses into slices of about ``slice_bytes``."""
        n_bytes = int(self.at[-1] + self.end[-1] - self.start[-1]) if self.start.shape[0] else 0
        cuts = np.searchsorted(self.at, np.arange(slice_bytes, n_bytes, slice_bytes))
        return [0, *np.unique(cuts).tolist(), self.start.shape[0]]

    def long_misses(self, buf) -> list[list[int]]:
        """The long misses (``LONG_MISS``), identical ones together, longest first."""
        same: dict[bytes, list[int]] = {}
        for m in np.flatnonzero(self.route == LONG_MISS).tolist():
            same.setdefault(buf[self.start[m]:self.end[m]].tobytes(), []).append(m)
        return sorted(same.values(), key=lambda ms: int(self.start[ms[0]] - self.end[ms[0]]))

    @classmethod
    def of(cls, groups: list[GroupPieces]) -> "Misses":
        start = np.concatenate([g.miss_start for g in groups])
        end = np.concatenate([g.miss_end for g in groups])
        route = np.concatenate([g.miss_route for g in groups])
        route[end - start >= LONG_MISS_BYTES] = LONG_MISS
        at = np.zeros(start.shape[0] + 1, dtype=np.int64)
        np.cumsum(end - start, out=at[1:])
        return cls(start, end, route, at[:-1], np.empty(int(at[-1]), dtype=ID_DTYPE),
                   np.zeros(start.shape[0], dtype=np.int64))


def encode_on_threads(router: HashRouter, buf, sub_start, sub_end, sub_allow, groups, n_jobs):
    """The hash-routed path: ``(ids, run_start, run_out_end)`` as the sequential kernel gives them."""
    pool = thread_pool(n_jobs)
    stop = threading.Event()
    try:
        with router.borrow_route_caches(n_jobs) as route_caches:
            pieces = list(pool.map(
                lambda g: router.find_pieces(buf, sub_start[g[0]:g[1]], sub_end[g[0]:g[1]],
                                              sub_allow[g[0]:g[1]], route_caches),
                groups,
            ))
            misses = Misses.of(pieces)
            if misses.start.shape[0]:
                long_misses = misses.long_misses(buf)
                list(pool.map(
                    lambda task: (router.merge_long_miss(buf, misses, task, stop) if isinstance(task, list)
                                  else router.merge_misses(buf, misses, task, route_caches, stop)),
                    [*long_misses, *range(n_jobs)],
                ))
    except BaseException:  # Ctrl-C or an error: routes still merging stop after their slice
        stop.set()
        raise
    first_miss = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([p.miss_start.shape[0] for p in pieces], out=first_miss[1:])
    out_at = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([p.n_known_ids + int(misses.count[first_miss[k]:first_miss[k + 1]].sum())
               for k, p in enumerate(pieces)], out=out_at[1:])
    out = np.empty(int(out_at[-1]), dtype=ID_DTYPE)
    run_out_end = list(pool.map(
        lambda k: router.assemble(pieces[k], misses, int(first_miss[k]), out, int(out_at[k])), range(len(pieces))
    ))
    return out, np.concatenate([p.run_start for p in pieces]), np.concatenate(run_out_end)
