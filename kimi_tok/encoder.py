"""The stages after the tiktoken-safe cuts: special split -> pre-tokenization -> BPE.

``SubstringEncoder`` is the part of a Tokenizer that does the work on sub-strings
of a packed buffer; it is all a worker needs (a thread shares the Tokenizer's,
a worker process builds its own from memory-mapped tables, see ``workers.py``).

``encode`` runs the stages for one worker (each group of the default thread
fan-out). ``encode_packed`` runs everything from the packed segments on, the
tiktoken-safe cuts included, in ONE compiled call (``encode_packed_fused``) for
calls that need no fan-out: no Python between the stages, so the GIL stays free
for another thread the whole time (a helper plans the call meanwhile, ``reuse.py``).
``encode_claimed_parts`` runs them over parts of a call that several threads take one
at a time from an atomic counter (``parallel.SharedParts``: an agent loop's new text,
shared by the caller and its planning helper). ``find_pieces``, ``merge_misses`` and
``assemble`` are the three phases of the optional hash-routed path (``routing.py``);
``parallel.py`` runs them.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

import numpy as np

from . import bpe, routing
from .atomics import fetch_add
from .chunking import cut_chunks, cut_substrings
from .jit import kernel, leaf
from .parking import signal_go
from .pretokenize import KimiScanner, pretokenizer_for, scan_runs, split_at_safe_points
from .segments import bounds_by_segment
from .specials import build_special_table, split_specials

ID_DTYPE = np.uint32
MIN_KEPT_PIECE_CACHES = 4  # piece caches kept between calls: at least this many, else one per core
# merging ~100-150 ns/byte: a slice is ~0.1-0.15 s of work at most, so Ctrl-C stops a route promptly
MERGE_SLICE_BYTES = 1 << 20
NEXT_PART, PARTS_DONE = 0, 1  # the counters of encode_claimed_parts
MAX_KEPT_ROUTE_CACHE_SETS = 2  # route cache sets kept per number of routes (concurrent long calls)


@kernel
def cut_packed(buf, seg_start, seg_end, needs_cuts, allow_special, flags):
    """The tiktoken-safe cuts of packed segments: ``(sub_start, sub_end, sub_allow)``."""
    chunk_start, chunk_end, chunk_segment = cut_chunks(buf, seg_start, seg_end, needs_cuts)
    sub_start, sub_end, sub_chunk = cut_substrings(buf, chunk_start, chunk_end, needs_cuts[chunk_segment], flags)
    return sub_start, sub_end, allow_special[chunk_segment[sub_chunk]]


@kernel
def encode_substrings_fused(tables, specials, scan_table, buf, sub_start, sub_end, sub_allow, out, cache):
    """Specials -> Kimi scanner -> BPE over sub-strings, in one call.

    Writes the ids to ``out`` (at least as long as the sub-strings' bytes: every id covers a
    byte or more); returns ``(n_ids, run_start, run_out_end)``.
    """
    run_start, run_end, run_special = split_specials(buf, sub_start, sub_end, sub_allow, specials)
    first_piece, piece_end = scan_runs(buf, run_start, run_end, run_special, scan_table)
    run_out_end = np.empty(run_start.shape[0], dtype=np.int64)
    n = bpe.encode_runs(tables, buf, run_start, run_end, run_special, first_piece, piece_end, out, run_out_end,
                        cache)
    return n, run_start, run_out_end


@kernel
def encode_packed_fused(tables, specials, scan_table, flags, buf, seg_start, seg_end, needs_cuts, allow_special,
                        out, cache):
    """Chunking -> run cuts -> specials -> Kimi scanner -> BPE over packed segments, in one call
    (``out`` at least ``buf.shape[0]`` long); returns ``(n_ids, run_start, run_out_end)``."""
    sub_start, sub_end, sub_allow = cut_packed(buf, seg_start, seg_end, needs_cuts, allow_special, flags)
    return encode_substrings_fused(tables, specials, scan_table, buf, sub_start, sub_end, sub_allow, out, cache)


@leaf
def _ids_per_substring(sub_start, sub_end, run_start, run_out_end, sub_n_ids):
    """``sub_n_ids[s]``: the ids of sub-string ``s``, from the end of each run's ids (runs lie
    inside sub-strings, in order)."""
    for s in range(sub_start.shape[0]):
        sub_n_ids[s] = 0
    s = 0
    done = 0
    for r in range(run_start.shape[0]):
        while s < sub_start.shape[0] - 1 and run_start[r] >= sub_end[s]:
            s += 1
        sub_n_ids[s] += run_out_end[r] - done
        done = run_out_end[r]


@kernel
def encode_claimed_parts(tables, specials, scan_table, buf, sub_start, sub_end, sub_allow, part_first, counters,
                         out, part_n_ids, sub_n_ids, cache, helper_words, syscall_number):
    """Encode parts of sub-strings taken one at a time from counters shared with other threads.

    Part ``p`` is sub-strings ``part_first[p]:part_first[p + 1]``; whoever takes it (``fetch_add``
    on ``counters[NEXT_PART]``) writes its ids to ``out`` from the part's byte offset (relative to
    ``sub_start[0]``: every id covers a byte or more, so parts never overlap), its id count to
    ``part_n_ids[p]`` and each of its sub-strings' to ``sub_n_ids``, then counts it in
    ``counters[PARTS_DONE]``. Returns how many parts this thread encoded; once it returns every
    part is taken, not necessarily finished by the other threads.

    ``helper_words``: a parked helper's (``parking.signal_go``), told here that this thread is in
    compiled code and the GIL free; ``parking.NO_HELPER`` when none waits.
    """
    signal_go(helper_words, syscall_number)
    n_parts = part_first.shape[0] - 1
    base = sub_start[0] if sub_start.shape[0] else 0
    encoded = 0
    while True:
        p = fetch_add(counters, NEXT_PART, 1)
        if p >= n_parts:
            return encoded
        first, end = part_first[p], part_first[p + 1]
        n, run_start, run_out_end = encode_substrings_fused(
            tables, specials, scan_table, buf, sub_start[first:end], sub_end[first:end], sub_allow[first:end],
            out[sub_start[first] - base:], cache,
        )
        part_n_ids[p] = n
        _ids_per_substring(sub_start[first:end], sub_end[first:end], run_start, run_out_end, sub_n_ids[first:end])
        fetch_add(counters, PARTS_DONE, 1)
        encoded += 1


@kernel
def gather_parts(sub_start, part_first, out, part_n_ids, sub_n_ids, seg_end, origin, n_segments):
    """The ids of every part (``encode_claimed_parts``) back to back, and where each of the
    caller's ``n_segments`` segments starts and ends in them (``segments.bounds_by_segment``):
    ``(ids, bounds)``. ``seg_end`` and ``origin``: the packed segments' ends and callers' indices."""
    base = sub_start[0] if sub_start.shape[0] else 0
    n_ids = 0
    for p in range(part_n_ids.shape[0]):
        n_ids += part_n_ids[p]
    ids = np.empty(n_ids, dtype=out.dtype)
    n = 0
    for p in range(part_n_ids.shape[0]):
        at = sub_start[part_first[p]] - base
        count = part_n_ids[p]
        ids[n:n + count] = out[at:at + count]  # a slice copy vectorizes; an indexed loop does not (2x)
        n += count
    return ids, bounds_by_segment(seg_end, origin, n_segments, sub_start, np.cumsum(sub_n_ids))


@leaf
def group_into_parts(sub_start, sub_end, min_part_bytes, shrink, part_first):
    """Consecutive sub-strings grouped into parts: a part ends once it holds ``min_part_bytes``
    and, if ``shrink``, 1/``shrink`` of the bytes left at its start (guided self-scheduling:
    large parts first, small ones last, so that threads sharing them finish close together).
    Fills ``part_first`` (room for one entry per sub-string, plus one); returns the part count."""
    left = 0
    for s in range(sub_start.shape[0]):
        left += sub_end[s] - sub_start[s]
    n_parts = 0
    size = 0
    target = 0
    for s in range(sub_start.shape[0]):
        if size == 0:
            part_first[n_parts] = s
            n_parts += 1
            target = max(min_part_bytes, left // shrink if shrink > 0 else 0)
        size += sub_end[s] - sub_start[s]
        left -= sub_end[s] - sub_start[s]
        if size >= target:
            size = 0
    part_first[n_parts] = sub_start.shape[0]
    return n_parts


@kernel
def cut_into_parts(buf, seg_start, seg_end, needs_cuts, allow_special, flags, min_part_bytes, shrink, split_units):
    """The sub-strings of packed segments (tiktoken-safe cuts; with ``split_units``, long ones cut
    further where the pattern always cuts, ``split_at_safe_points``) and their grouping into parts
    (``group_into_parts``): ``(sub_start, sub_end, sub_allow, part_first)``."""
    sub_start, sub_end, sub_allow = cut_packed(buf, seg_start, seg_end, needs_cuts, allow_special, flags)
    if split_units:
        sub_start, sub_end, sub_allow = split_at_safe_points(buf, sub_start, sub_end, sub_allow, min_part_bytes)
    part_first = np.empty(sub_start.shape[0] + 1, dtype=np.int64)
    n_parts = group_into_parts(sub_start, sub_end, min_part_bytes, shrink, part_first)
    return sub_start, sub_end, sub_allow, part_first[:n_parts + 1]


class GroupPieces(NamedTuple):
    """Phase 1 of the routed path for one group of sub-strings."""

    run_start: np.ndarray
    run_special: np.ndarray
    first_piece: np.ndarray
    piece_value: np.ndarray  # uint64 packed ids per piece, routing.MISS if not known yet
    miss_start: np.ndarray
    miss_end: np.ndarray
    miss_route: np.ndarray
    n_known_ids: int  # ids known before merging: resolved pieces and special tokens


class SubstringEncoder:
    """Special tokens, pre-tokenizer and BPE tables of one vocabulary, plus its piece caches."""

    def __init__(self, tables: bpe.BpeTables, special_tokens: dict[str, int], pattern: str) -> None:
        self.tables = tables
        self.specials = build_special_table(special_tokens)
        self.pretokenizer = pretokenizer_for(pattern)
        self.piece_caches = bpe.PieceCachePool(
            lambda: bpe.new_piece_cache(self.tables), keep=max(MIN_KEPT_PIECE_CACHES, os.cpu_count() or 1)
        )
        self._route_caches: dict[int, bpe.PieceCachePool] = {}  # per number of routes
        self._route_caches_lock = threading.Lock()

    def runs_and_pieces(self, buf, sub_start, sub_end, sub_allow, clock=None):
        """``(run_start, run_end, run_special, first_piece, piece_end)`` of some sub-strings."""
        run_start, run_end, run_special = split_specials(buf, sub_start, sub_end, sub_allow, self.specials)
        if clock:
            clock.lap("specials")
        first_piece, piece_end = self.pretokenizer.scan(buf, run_start, run_end, run_special)
        if clock:
            clock.lap("pretokenize")
        return run_start, run_end, run_special, first_piece, piece_end

    def encode(self, buf, sub_start, sub_end, sub_allow, clock=None):
        """All stages fused on one worker: ``(ids, run_start, run_out_end)``.

        With the Kimi scanner and no stages timed, one compiled call (``encode_substrings_fused``):
        a thread of the fan-out then takes the GIL only to start and to end."""
        if not clock and self.fuses:
            n_subs = sub_start.shape[0]
            out = np.empty(int(sub_end[-1] - sub_start[0]) if n_subs else 0, dtype=ID_DTYPE)  # an id covers >= 1 byte
            with self.piece_caches.borrow() as cache:
                n, run_start, run_out_end = encode_substrings_fused(
                    self.tables, self.specials, self.pretokenizer.table, buf, sub_start, sub_end, sub_allow, out, cache
                )
            out.resize((n,), refcheck=False)  # shrinks in place: no copy of the ids
            return out, run_start, run_out_end
        run_start, run_end, run_special, first_piece, piece_end = self.runs_and_pieces(
            buf, sub_start, sub_end, sub_allow, clock
        )
        n_runs = run_start.shape[0]
        span = int(run_end[-1] - run_start[0]) if n_runs else 0
        out = np.empty(bpe.max_ids(span, n_runs), dtype=ID_DTYPE)
        run_out_end = np.empty(n_runs, dtype=np.int64)
        with self.piece_caches.borrow() as cache:
            n = bpe.encode_runs(self.tables, buf, run_start, run_end, run_special, first_piece, piece_end, out,
                                run_out_end, cache)
        if clock:
            clock.lap("bpe")
        out.resize((n,), refcheck=False)  # shrinks in place: no copy of the ids
        return out, run_start, run_out_end

    @property
    def fuses(self) -> bool:
        """Whether ``encode_packed`` can run (the compiled Kimi scanner; PCRE2 needs Python per match)."""
        return isinstance(self.pretokenizer, KimiScanner)

    def encode_packed(self, buf, seg_start, seg_end, needs_cuts, allow_special, flags, out):
        """Every stage from the packed segments on (their tiktoken-safe cuts included), in one
        compiled call without the GIL; ids into ``out`` (at least ``buf.shape[0]`` long).
        Returns ``(n_ids, run_start, run_out_end)``."""
        with self.piece_caches.borrow() as cache:
            return encode_packed_fused(self.tables, self.specials, self.pretokenizer.table, flags, buf, seg_start,
                                       seg_end, needs_cuts, allow_special, out, cache)

    # -- the hash-routed path: three phases, each run by several workers --------------------

    def find_pieces(self, buf, sub_start, sub_end, sub_allow, route_caches: routing.RouteCaches) -> GroupPieces:
        """Phase 1: pieces, the ids of those the tables know, and the misses with their routes."""
        run_start, _, run_special, first_piece, piece_end = self.runs_and_pieces(buf, sub_start, sub_end, sub_allow)
        n_pieces = piece_end.shape[0]
        piece_value = np.empty(n_pieces, dtype=np.uint64)
        # sized for the worst case; only the pages of actual misses are ever touched
        miss_start = np.empty(n_pieces, dtype=np.int64)
        miss_end = np.empty(n_pieces, dtype=np.int64)
        miss_route = np.empty(n_pieces, dtype=np.int64)
        n_misses, n_known = routing.classify_pieces(
            self.tables, route_caches.short_tables, buf, run_start, run_special, first_piece, piece_end, piece_value,
            miss_start, miss_end, miss_route,
        )
        return GroupPieces(run_start, run_special, first_piece, piece_value, miss_start[:n_misses],
                           miss_end[:n_misses], miss_route[:n_misses], n_known)

    def borrow_route_caches(self, n_routes: int):
        """A set of ``n_routes`` piece caches lent to one call (route ``w`` always gets cache ``w``
        of the set, so what a route merged stays where its pieces are routed)."""
        with self._route_caches_lock:
            pool = self._route_caches.get(n_routes)
            if pool is None:
                pool = bpe.PieceCachePool(lambda: routing.new_route_caches(self.tables, n_routes),
                                          keep=MAX_KEPT_ROUTE_CACHE_SETS)
                self._route_caches[n_routes] = pool
        return pool.borrow()

    def merge_misses(self, buf, misses: "Misses", route: int, route_caches: routing.RouteCaches,
                     stop: threading.Event) -> None:
        """Phase 2: merge the misses routed to ``route`` into ``misses.ids``, a slice of about
        ``MERGE_SLICE_BYTES`` at a time; returns early once ``stop`` is set (the call failed
        or was interrupted, and nobody will read the result)."""
        bounds = misses.slices()
        for first, last in zip(bounds[:-1], bounds[1:]):
            if stop.is_set():
                return
            routing.merge_misses(self.tables, buf, misses.start, misses.end, misses.route, route, first, last,
                                 misses.at, misses.ids, misses.count, route_caches.caches[route])

    def merge_long_miss(self, buf, misses: "Misses", same: list[int], stop: threading.Event) -> None:
        """Phase 2, a long miss (a task of its own, so that a few long pieces do not load one
        route): merged once with a piece cache from the pool, then copied to its repeats."""
        if stop.is_set():
            return
        first = same[0]
        with self.piece_caches.borrow() as cache:
            routing.merge_misses(self.tables, buf, misses.start, misses.end, misses.route, routing.LONG_MISS,
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
        routing.assemble_ids(group.run_special, group.first_piece, group.piece_value, misses.at, misses.ids,
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

    def slices(self) -> list[int]:
        """Miss indices cutting the misses into slices of about ``MERGE_SLICE_BYTES``."""
        n_bytes = int(self.at[-1] + self.end[-1] - self.start[-1]) if self.start.shape[0] else 0
        cuts = np.searchsorted(self.at, np.arange(MERGE_SLICE_BYTES, n_bytes, MERGE_SLICE_BYTES))
        return [0, *np.unique(cuts).tolist(), self.start.shape[0]]

    def long_misses(self, buf) -> list[list[int]]:
        """The long misses (``routing.LONG_MISS``), identical ones together, longest first."""
        same: dict[bytes, list[int]] = {}
        for m in np.flatnonzero(self.route == routing.LONG_MISS).tolist():
            same.setdefault(buf[self.start[m]:self.end[m]].tobytes(), []).append(m)
        return sorted(same.values(), key=lambda ms: int(self.start[ms[0]] - self.end[ms[0]]))

    @classmethod
    def of(cls, groups: list[GroupPieces]) -> "Misses":
        start = np.concatenate([g.miss_start for g in groups])
        end = np.concatenate([g.miss_end for g in groups])
        route = np.concatenate([g.miss_route for g in groups])
        route[end - start >= routing.LONG_MISS_BYTES] = routing.LONG_MISS
        at = np.zeros(start.shape[0] + 1, dtype=np.int64)
        np.cumsum(end - start, out=at[1:])
        return cls(start, end, route, at[:-1], np.empty(int(at[-1]), dtype=ID_DTYPE),
                   np.zeros(start.shape[0], dtype=np.int64))
