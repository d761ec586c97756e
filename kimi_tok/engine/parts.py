"""Shared parts: one call's text in parts that threads take one at a time, inside compiled code.

After the tiktoken-safe cuts the sub-strings are independent (and long ones can be cut further
where the Kimi pattern always cuts), so they are grouped into parts (``cut_into_parts``) that
threads take from an atomic counter (``encode_claimed_parts``): none waits for a share decided
in advance, and a thread that joins late takes what is left. ``gather_parts`` puts the parts'
ids back to back with each segment's bounds.
"""

from __future__ import annotations

import numpy as np

from ..native import futex
from ..native.atomics import fetch_add
from ..native.futex import NO_SIGNAL, SYS_FUTEX
from ..native.jit import kernel, leaf
from ..pipeline.assembly import ID_DTYPE, cut_packed, encode_substrings_fused
from ..pipeline.pretokenize.kimi_scanner import split_at_safe_points
from ..pipeline.segments import PackedSegments, bounds_by_segment

NEXT_PART, PARTS_DONE = 0, 1  # the counters of encode_claimed_parts


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
                         out, part_n_ids, sub_n_ids, cache, entered, syscall_number, budget_bytes):
    """Encode parts of sub-strings taken one at a time from counters shared with other threads.

    Part ``p`` is sub-strings ``part_first[p]:part_first[p + 1]``; whoever takes it (``fetch_add``
    on ``counters[NEXT_PART]``) writes its ids to ``out`` from the part's byte offset (relative to
    ``sub_start[0]``: every id covers a byte or more, so parts never overlap), its id count to
    ``part_n_ids[p]`` and each of its sub-strings' to ``sub_n_ids``, then counts it in
    ``counters[PARTS_DONE]``. Returns how many parts this call encoded, once no part is left to
    take (every part is taken, not necessarily finished by the other threads) or once the parts it
    encoded hold ``budget_bytes``, so that the caller is back in Python (and sees Ctrl-C) soon.

    ``entered``: a ``native.futex.signal`` set as soon as this runs, telling a waiting thread
    (a parked helper, ``reuse.parking``) that this one is in compiled code and the GIL free;
    ``futex.NO_SIGNAL`` when none waits.
    """
    futex.signal(entered, syscall_number)
    n_parts = part_first.shape[0] - 1
    base = sub_start[0] if sub_start.shape[0] else 0
    encoded = 0
    budget = budget_bytes
    while budget > 0:
        p = fetch_add(counters, NEXT_PART, 1)
        if p >= n_parts:
            return encoded
        first, end = part_first[p], part_first[p + 1]
        budget -= sub_end[end - 1] - sub_start[first]
        n, run_start, run_out_end = encode_substrings_fused(
            tables, specials, scan_table, buf, sub_start[first:end], sub_end[first:end], sub_allow[first:end],
            out[sub_start[first] - base:], cache,
        )
        part_n_ids[p] = n
        _ids_per_substring(sub_start[first:end], sub_end[first:end], run_start, run_out_end, sub_n_ids[first:end])
        fetch_add(counters, PARTS_DONE, 1)
        encoded += 1
    return encoded


@kernel
def ids_of_parts(sub_start, part_first, out, part_n_ids):
    """The ids of every part (``encode_claimed_parts``) back to back, in a new array."""
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
    return ids


@kernel
def gather_parts(sub_start, part_first, out, part_n_ids, sub_n_ids, seg_end, origin, n_segments):
    """The ids of every part (``ids_of_parts``), and where each of the caller's ``n_segments`` segments
    starts and ends in them (``segments.bounds_by_segment``): ``(ids, bounds)``. ``seg_end`` and
    ``origin``: the packed segments' ends and callers' indices."""
    return (ids_of_parts(sub_start, part_first, out, part_n_ids),
            bounds_by_segment(seg_end, origin, n_segments, sub_start, np.cumsum(sub_n_ids)))


@leaf
def group_into_parts(sub_start, sub_end, min_part_bytes, max_part_bytes, shrink, part_first):
    """Consecutive sub-strings grouped into parts: a part ends once it holds ``min_part_bytes``
    and, if ``shrink``, 1/``shrink`` of the bytes left at its start (guided self-scheduling:
    large parts first, small ones last, so that threads sharing them finish close together), or
    ``max_part_bytes`` if less (a thread finishes its part before it sees a Ctrl-C).
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
            target = max(min_part_bytes, min(max_part_bytes, left // shrink if shrink > 0 else 0))
        size += sub_end[s] - sub_start[s]
        left -= sub_end[s] - sub_start[s]
        if size >= target:
            size = 0
    part_first[n_parts] = sub_start.shape[0]
    return n_parts


@kernel
def cut_into_parts(buf, seg_start, seg_end, needs_cuts, allow_special, flags, min_part_bytes, max_part_bytes, shrink,
                   split_units):
    """The sub-strings of packed segments (tiktoken-safe cuts; with ``split_units``, long ones cut
    further where the pattern always cuts, ``split_at_safe_points``) and their grouping into parts
    (``group_into_parts``): ``(sub_start, sub_end, sub_allow, part_first)``."""
    sub_start, sub_end, sub_allow = cut_packed(buf, seg_start, seg_end, needs_cuts, allow_special, flags)
    if split_units:
        sub_start, sub_end, sub_allow = split_at_safe_points(buf, sub_start, sub_end, sub_allow, min_part_bytes)
    part_first = np.empty(sub_start.shape[0] + 1, dtype=np.int64)
    n_parts = group_into_parts(sub_start, sub_end, min_part_bytes, max_part_bytes, shrink, part_first)
    return sub_start, sub_end, sub_allow, part_first[:n_parts + 1]



class SharedParts:
    """One call's text in parts that threads take one at a time, in compiled code (work sharing).

    The thread that makes it starts on the first part at once (``work``); another thread that
    becomes free later joins with ``work`` too and takes parts from where the others are, so
    neither waits for a share decided in advance. Used for an agent loop's turn, whose helper
    thread plans the call while the caller encodes the new text (``reuse.EncodeAhead``):
    once planned, the helper takes the parts the caller has not reached.

    Parts are groups of sub-strings (the tiktoken-safe cuts, long ones cut further where the
    pattern always cuts) of at least ``min_part_bytes`` and, with ``shrink``, 1/``shrink`` of the
    bytes left (large parts first, small ones last: ``group_into_parts``); each is
    encoded on its own as in any fan-out.
    """

    def __init__(self, encoder, packed: PackedSegments, flags: np.ndarray, min_part_bytes: int,
                 splits_after_newline: bool, shrink: int = 0, max_part_bytes: int = 1 << 20) -> None:
        buf = packed.buf
        self.packed = packed
        self.encoder = encoder
        self.sub_start, self.sub_end, self.sub_allow, self.part_first = cut_into_parts(
            buf, packed.seg_start, packed.seg_end, packed.needs_cuts, packed.allow_special, flags, min_part_bytes,
            max_part_bytes, shrink, splits_after_newline)
        self.max_part_bytes = max_part_bytes
        self.counters = np.zeros(2, dtype=np.int64)  # the next part to take, the parts done
        self.out = np.empty(buf.shape[0], dtype=ID_DTYPE)  # an id covers >= 1 byte
        self.part_n_ids = np.zeros(self.part_first.shape[0] - 1, dtype=np.int64)
        self.sub_n_ids = np.zeros(self.sub_start.shape[0], dtype=np.int64)

    @property
    def n_parts(self) -> int:
        return self.part_n_ids.shape[0]

    def parts_left(self) -> int:
        """Parts no thread has taken yet (a snapshot: others may be taking them)."""
        return max(0, self.n_parts - int(self.counters[NEXT_PART]))

    def work(self, cache, entered: np.ndarray = NO_SIGNAL) -> int:
        """Encode parts with this thread's piece ``cache`` until none is left to take (without the
        GIL, back in Python every ``max_part_bytes`` or so, where a Ctrl-C is raised); returns how
        many this thread encoded. Parts taken by another thread may still be in progress when it
        returns: ``ids_and_bounds`` only after every worker has returned. ``entered``: a signal set
        once this thread is in compiled code (a parked helper waits for it: ``reuse.parking``)."""
        encoder = self.encoder
        encoded = 0
        while self.parts_left():
            encoded += encode_claimed_parts(
                encoder.tables, encoder.specials, encoder.pretokenizer.scan_table, self.packed.buf, self.sub_start,
                self.sub_end, self.sub_allow, self.part_first, self.counters, self.out, self.part_n_ids,
                self.sub_n_ids, cache, entered, SYS_FUTEX, self.max_part_bytes)
            entered = NO_SIGNAL
        return encoded

    def stop(self) -> None:
        """Leave no part to take (the call failed or was interrupted): the other threads return
        after the part they are encoding. (A plain store: a thread's atomic ``fetch_add`` either
        comes first and keeps its part, or comes after and finds none.)"""
        self.counters[NEXT_PART] = self.n_parts

    def ids_and_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, segment_bounds)`` as ``Engine.encode_fused`` gives them, once every thread's
        ``work`` has returned (wait for the others first: ``work`` returns when no part is left to
        take, while another thread may still be encoding its last one)."""
        if int(self.counters[PARTS_DONE]) != self.n_parts:
            raise RuntimeError("SharedParts.ids_and_bounds before every part was encoded")
        packed = self.packed
        return gather_parts(self.sub_start, self.part_first, self.out, self.part_n_ids, self.sub_n_ids,
                            packed.seg_end, packed.origin, packed.n_segments)
