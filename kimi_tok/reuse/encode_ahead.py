"""An agent loop's turn on two threads: encode the new segments while the call is planned.

At the end of a long agent loop one call costs two things of similar size:

* planning it with the segment cache: validating ~1,500 segments, offering cached ones
  (``SegmentCache.speculate``) and comparing their texts with the call's (``verify``:
  Python ``==`` on every cached text, ~0.7 ms for a 1M-token prompt of fresh ``str``
  objects), then copying ~4 MB of cached ids into the output. All of it but the copy holds
  the GIL.
* encoding the appended segments: compiled code without the GIL, ~1.8 ms for 33k
  tokens of text the CPU caches have not seen.

A turn is the previous prompt plus new segments, and a segment's ids depend only on its
text, so the segments after where a recent call ended can be encoded before the plan
says they are new (``EncodeAhead``): this thread encodes them while a helper thread plans
the call, and once planned the helper takes the parts of the new text this thread has
not reached (``engine.parts.SharedParts``). On Linux the helper waits in compiled code
(``parking``): woken before this thread packs, it copies the ids the recent call's
layout says the call starts with, without the GIL, and plans once this thread is in
compiled code. If the guess was wrong (they were cached after all, or others are
missing too, or the layout differs), the plan still decides, and nothing but some
encoding and copying is wasted. The ~4 MB output reuses the memory of the previous long
output once its caller has let go of it, grown in place when a turn outgrows it
(``OutputMemory``): fresh pages cost ~1 ms of faults (up to ~5 ms), and growing the last
output with ``realloc`` every turn 0.2 ms.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
from contextlib import nullcontext
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..engine.engine import MAX_UTF8_BYTES_PER_CHAR, Encoded
from ..engine.parts import SharedParts
from ..pipeline.assembly import ID_DTYPE
from ..pipeline.segments import validate_segments
from .parking import MAX_COPIES, PARKING, CopyJob, ParkedHelper, Posted
from .segment_cache import CachePlan, RecentCall


def _sched_getcpu():
    """libc's ``sched_getcpu`` (the core the calling thread runs on), or None where there is none."""
    try:
        getcpu = ctypes.CDLL(None).sched_getcpu
    except (AttributeError, OSError, TypeError):
        return None
    getcpu.restype = ctypes.c_int
    getcpu.argtypes = []
    return getcpu if hasattr(os, "sched_setaffinity") and getcpu() >= 0 else None


SCHED_GETCPU = _sched_getcpu()


class HelperThreads:
    """Threads that plan calls while their callers encode: at most ``size`` at once, never queued.

    A call takes a helper only if one is idle right now; otherwise it plans and encodes on
    its own thread, as without encoding ahead. So concurrent callers never wait behind each
    other's plans (or behind a long call's fan-out, which has its own pool).

    On Linux the helpers wait in compiled code (``parking.ParkedHelper``, ``post``): a call wakes
    one before packing and it copies the ids the call likely starts with while the caller packs.
    Elsewhere (``parked=False``) they wait in an executor (``submit``, after packing).

    With one helper (two or three cores), it is woken on another core than its caller's
    (``_off_the_callers_core``). Measured on 2 cores (agent loop, 4 alternating runs): without
    that, 24% of turns took 2.8-4 ms instead of ~1.9 (the scheduler had queued the helper
    behind its caller's compiled call, so it planned only after the caller had encoded);
    with it, 2%.
    """

    def __init__(self, size: int, parked: bool = PARKING) -> None:
        self.size = size
        self.parked = parked
        self._start()

    def _start(self) -> None:
        self._pid = os.getpid()  # a forked child has none of its parent's threads: it starts its own
        self._idle = threading.BoundedSemaphore(self.size)
        self._pool = None if self.parked else ThreadPoolExecutor(max_workers=self.size,
                                                                 thread_name_prefix="kimi_tok-plan")
        self._parked: list[ParkedHelper] = []  # idle parked helpers (made when first needed)
        self._n_parked = 0
        self._lock = threading.Lock()
        self._helper_thread_id: int | None = None  # the native id of the one helper, once it has run

    def post(self, fn, copy: CopyJob | None) -> Posted | None:
        """An idle parked helper woken now: it does ``copy`` without the GIL, waits until the caller
        signals from compiled code (``SharedParts.work`` with its words) or ``release``s it, then runs
        ``fn``; ``result()`` waits for that and frees the helper. None when helpers are not parked
        here or all are busy."""
        if not self.parked:
            return None
        if self._pid != os.getpid():
            self._start()
        try:
            helper = self._parked.pop()  # atomic under the GIL
        except IndexError:
            with self._lock:
                if self._n_parked >= self.size:
                    return None
                self._n_parked += 1
            helper = ParkedHelper(f"kimi_tok-plan_{self._n_parked - 1}")
        if self.size == 1 and SCHED_GETCPU is not None and helper.native_id is not None:
            cpu = SCHED_GETCPU()
            if helper.kept_off != cpu:  # the affinity calls cost ~40 us when cold: only when the caller moved
                self._off_the_callers_core(helper.native_id)
                helper.kept_off = cpu
        return helper.post(fn, copy, self._parked.append)

    def start(self, fn) -> Posted | Future | None:
        """``fn`` started now on an idle helper, not waited for: call the handle's ``result()`` once, later
        (it raises what ``fn`` raised). None when no helper is idle."""
        posted = self.post(fn, None)
        if posted is None:
            return self.submit(fn)
        posted.release()
        return posted

    def run_later(self, fn) -> None:
        """``fn`` run on another thread, not waited for (with parked helpers, a thread of its own:
        nothing would free the helper)."""
        if self.parked:
            threading.Thread(target=fn, name="kimi_tok-spare", daemon=True).start()
        else:
            self.submit(fn)

    def submit(self, fn) -> Future | None:
        """``fn`` running on an idle helper of the executor, or None when all are busy (or the
        helpers are parked: see ``post``)."""
        if self.parked:
            return None
        if self._pid != os.getpid():
            self._start()
        if not self._idle.acquire(blocking=False):
            return None
        if self._helper_thread_id is not None:
            self._off_the_callers_core(self._helper_thread_id)

        def run():
            if self.size == 1 and SCHED_GETCPU is not None:
                self._helper_thread_id = threading.get_native_id()
            try:
                return fn()
            finally:
                self._idle.release()

        return self._pool.submit(run)

    def _off_the_callers_core(self, thread_id: int) -> None:
        """Let the helper run on every core the caller may use but the one it is on now, so the
        scheduler never queues it behind the caller (a few microseconds: two system calls)."""
        try:
            cores = os.sched_getaffinity(0)
            cores.discard(SCHED_GETCPU())
            if cores:
                os.sched_setaffinity(thread_id, cores)
        except OSError:  # a thread that is gone, a core set the helper may not take: stop trying
            self._helper_thread_id = None


def _refs_of_an_unshared_local() -> int:
    """What ``sys.getrefcount`` says of a local nothing else references (2 up to Python 3.13: the
    local and the argument; 3.14 may lend the local's reference to the call and say 1)."""
    unshared = object()
    return sys.getrefcount(unshared)


UNSHARED_REFS = _refs_of_an_unshared_local()


def new_memory(n_bytes: int) -> mmap.mmap | None:
    """A private anonymous mapping of ``n_bytes`` (its pages fault in when first written), or None
    where ``mmap`` has no such flags (Windows)."""
    if not hasattr(mmap, "MAP_PRIVATE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return None
    return mmap.mmap(-1, n_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class OutputMemory:
    """The memory of a Tokenizer's previous long output, reused once its caller has let go of it.

    Each agent-loop turn's output is longer than the last, so the allocator hands out fresh
    pages, and faulting in 4 MB costs ~0.8-1.4 ms here (up to ~5 ms when the kernel compacts
    memory; the helper's copy of the cached ids pays it, and becomes the longer thread). So
    outputs are views of a block with headroom (``Policy.output_headroom``), and if nothing references
    the block but this object (no output, view or buffer of it is alive), the next output is
    written into it: no allocation, no fresh page. A turn that outgrows the block grows its
    memory in place (an anonymous mapping resized with ``mremap``: the pages written so far move
    along without a copy or a fault; only the new ones fault in as they are written).
    """

    def __init__(self, min_reused_ids: int, headroom: float) -> None:
        self.min_reused_ids = min_reused_ids
        self.headroom = headroom
        self._lock = threading.Lock()
        self._block: np.ndarray | None = None

    def take(self, capacity: int) -> np.ndarray:
        """An uninitialized ``uint32`` array of ``capacity`` ids: from ``min_reused_ids`` on a view of
        a block of memory (for ``keep``), the previous one if it is free."""
        if capacity < self.min_reused_ids:
            return np.empty(capacity, dtype=ID_DTYPE)  # not worth a block (the kept one stays kept)
        with self._lock:
            block, self._block = self._block, None
        # only ``block`` (this local) references it: every output and view of it is gone
        if block is None or sys.getrefcount(block) != UNSHARED_REFS:
            return self._new_block(capacity)[:capacity]
        if block.shape[0] < capacity:
            memory = block.base.obj if isinstance(block.base, memoryview) else None
            del block  # releases the buffer the array holds on ``memory``, so that it can be resized
            return self._grown(memory, capacity)[:capacity]
        return block[:capacity]

    def _new_block(self, capacity: int) -> np.ndarray:
        n_ids = int(capacity * self.headroom)
        memory = new_memory(n_ids * np.dtype(ID_DTYPE).itemsize)
        return np.empty(n_ids, dtype=ID_DTYPE) if memory is None else np.frombuffer(memory, dtype=ID_DTYPE)

    def _grown(self, memory, capacity: int) -> np.ndarray:
        """The block of ``memory`` (a mapping nothing else uses) grown for ``capacity`` ids, or a new one."""
        if not isinstance(memory, mmap.mmap):
            return self._new_block(capacity)
        n_ids = int(capacity * self.headroom)
        try:
            memory.resize(n_ids * np.dtype(ID_DTYPE).itemsize)
        except (BufferError, OSError, SystemError, ValueError):  # a buffer of it is alive, or no mremap
            return self._new_block(capacity)
        return np.frombuffer(memory, dtype=ID_DTYPE)

    def keep(self, out: np.ndarray) -> None:
        """Remember the block of ``out`` (a ``take`` view, returned to a caller) for a later ``take``."""
        block = out.base
        if isinstance(block, np.ndarray) and block.shape[0] >= self.min_reused_ids and (
                block.base is None or isinstance(block.base, memoryview)):
            with self._lock:
                self._block = block


def fault_in(ids: np.ndarray) -> None:
    """Write to every page of ``ids`` (contiguous), so that the ones not yet in memory fault in now."""
    ids[::max(1, mmap.PAGESIZE // ids.itemsize)] = 0


def copy_parts(parts: list[np.ndarray], out: np.ndarray) -> None:
    """``out[:total] = concatenate(parts)`` without building the concatenation."""
    at = 0
    for part in parts:
        out[at:at + part.shape[0]] = part
        at += part.shape[0]


class EncodeAhead:
    """The segments after where a recent call ended, the likely new part of an agent loop's turn
    (the previous prompt plus new segments). A segment's ids depend only on its text, so
    encoding them before the plan is never wrong (at worst wasted, if the plan finds them
    cached after all).

    ``run`` encodes them on this thread in GIL-free compiled code while a helper thread
    (``SegmentReuse.helpers``) validates, plans and verifies the whole call and copies its cached ids into
    the output (all of which but the copy needs the GIL). This way round no thread waits for
    another to start: the helper takes the GIL as soon as this one enters compiled code. The
    new text is cut into parts (``SharedParts``) that this thread takes one by one; once the
    helper has planned, it takes those this thread has not reached. A parked helper (Linux) is
    woken as soon as the guess is made (``start``), and copies the recent call's ids (its
    ``RecentCall.layout``) into the output while this thread validates and packs; the plan then
    only checks that the call starts with the same ids.
    """

    def __init__(self, first: int, tail: list, recent: RecentCall | None = None) -> None:
        self.first = first  # call index of the first segment encoded ahead
        self.tail = tail  # the call's segments from ``first`` on (validated by ``start``)
        self.recent = recent  # the recent call this one extends (segments ``:first``)
        self.chars = sum(len(text) for text, _ in tail)  # sizes the output (a bad segment raises later)
        self.posted: Posted | None = None  # a parked helper woken for this call (``wake_helper``)
        self.woken = False
        self.copy: CopyJob | None = None
        self.runs: list | None = None  # the layout's runs, held while the helper copies from them
        self.packed = self.shared = None  # the new text, once packed (and cut into parts)
        self.lacked_a_cache = False

    @classmethod
    def start(cls, reuse, segments, tiktoken_safe: bool, want_ids: bool = True) -> "EncodeAhead | None":
        """The likely new segments of ``segments`` (a parked helper already woken for the call), or
        None when there is no good guess or they are not worth a thread: see
        ``SegmentCache.recent_call_ending``."""
        policy = reuse.policy
        if policy.n_jobs < 2 or not reuse.engine.fuses or not isinstance(segments, list):
            return None
        recent = reuse.cache.recent_call_ending(segments, tiktoken_safe)
        if recent is None or recent.chars < policy.min_ahead_plan_chars:
            return None
        tail = segments[recent.n_segments:]
        try:
            ahead = cls(recent.n_segments, tail, recent)
        except (TypeError, ValueError):  # not (text, flag) pairs: the whole call's validation names it
            return None
        if not policy.min_ahead_chars <= ahead.chars < 2 * policy.min_bytes_per_job:
            return None
        ahead.wake_helper(reuse, segments, tiktoken_safe, want_ids)  # it copies while this thread validates
        try:
            ahead.tail = validate_segments(tail)
        except TypeError:
            ahead.let_the_helper_go()  # its plan raises the same error: the caller's path names the segment
            return None
        except BaseException:
            ahead.let_the_helper_go()
            raise
        return ahead

    def wake_helper(self, reuse, segments, tiktoken_safe: bool, want_ids: bool) -> None:
        """Post the call's plan to a parked helper, with the recent call's ids to copy first (none
        when not ``want_ids``), if one is idle (``self.posted``)."""
        self.woken = True
        helpers = reuse.helpers
        layout = self.recent.layout if want_ids and self.recent is not None and helpers.parked else None
        self.runs = self.recent.runs() if layout is not None else None
        if self.runs is not None and len(self.runs) <= MAX_COPIES:
            n_ids = self.recent.n_ids
            out = reuse.output_memory.take(n_ids + MAX_UTF8_BYTES_PER_CHAR * self.chars)  # an id covers >= 1 byte
            self.copy = CopyJob(self.runs, self.recent.copies, out, n_ids,
                                n_ids + int(self.chars * reuse.policy.new_ids_per_byte))
        self.posted = helpers.post(lambda: self._plan(reuse, segments, tiktoken_safe, want_ids), self.copy)
        if self.posted is None:
            self.copy = None  # planned here or by an executor's helper: nothing was copied ahead

    def let_the_helper_go(self) -> None:
        """Release a woken helper that this thread will not signal from compiled code, and wait for
        it: it may still be copying into memory this call holds (its plan's error is dropped)."""
        if self.posted is not None:
            self.posted.release()
            try:
                self.posted.result()
            except BaseException:
                pass

    def _plan(self, reuse, segments, tiktoken_safe: bool, want_ids: bool, join_parts: bool = True):
        """Validate and plan the call, put its cached ids in the output (if the copy ahead is not
        them), draft the runs to store, then take parts of the new text this thread has not reached
        (``join_parts``): ``(valid, plan, out, n_cached, drafts)``."""
        cache = reuse.cache
        valid = validate_segments(segments)
        speculation = cache.speculate(valid, tiktoken_safe)
        plan = cache.resolve(speculation, cache.verify(speculation))
        out, n_cached = None, 0
        if want_ids and plan.missing and plan.missing[0] == self.first and len(plan.missing) == len(self.tail):
            cached = plan.parts[:-1]  # the guess was right: all cached parts come first
            n_cached = sum(part.shape[0] for part in cached)
            copy = self.copy
            if copy is not None and _same_sources(plan.sources, self.recent.layout, self.runs):
                out = copy.destination  # copied ahead, the new ids' pages faulted in
            else:
                capacity = n_cached + self.packed.buf.shape[0]  # an id covers >= 1 byte
                fits = copy is not None and copy.destination.shape[0] >= capacity
                out = copy.destination if fits else reuse.output_memory.take(capacity)
                copy_parts(cached, out)
                # where the caller will write the new ids: most of it never written yet (an output grows every
                # turn), so its pages fault in here rather than at the end of the caller's path (~2 us a page)
                fault_in(out[n_cached:n_cached + int(self.packed.buf.shape[0] * reuse.policy.new_ids_per_byte)])
        # the text side of the store, so that the caller only adds the ids at the end
        drafts = cache.draft_runs(valid, tiktoken_safe, plan, speculation.fingerprints)
        if self.shared is not None and join_parts:
            # the parts the caller has not reached yet, with a free piece cache: making one would
            # cost more than this share (~6 ms of page faults on a helper thread)
            with reuse.engine.stages.piece_caches.borrow(make=False) as piece_cache:
                if piece_cache is None:
                    self.lacked_a_cache = True
                else:
                    self.shared.work(piece_cache)
        return valid, plan, out, n_cached, drafts

    def run(self, reuse, segments, tiktoken_safe: bool, want_ids: bool) -> Encoded:
        """The whole call: the plan on a helper thread (or here first, if none is idle), the
        segments from ``first`` on here (and on the helper once it has planned)."""
        if not self.woken:
            self.wake_helper(reuse, segments, tiktoken_safe, want_ids)
        posted = self.posted
        engine, policy, cache = reuse.engine, reuse.policy, reuse.cache
        piece_caches = engine.stages.piece_caches
        try:
            packed = self.packed = engine.pack(self.tail, tiktoken_safe, validated=True)
            if posted is not None or packed.buf.shape[0] >= policy.min_shared_bytes:
                self.shared = engine.shared_parts(packed, policy.shared_part_bytes, policy.shared_part_shrink)
            shared = self.shared
            # this thread's piece cache is taken before the helper starts: the warm one stays the caller's
            with piece_caches.borrow() if shared is not None else nullcontext() as piece_cache:
                if posted is not None:
                    # the helper plans once this thread is in compiled code (the GIL free), then takes parts too
                    shared.work(piece_cache, posted.helper.go_words)
                    encoded = None
                    valid, plan, out, n_cached, drafts = posted.result()
                else:
                    encoded, planned = self._encode_and_plan(
                        reuse, packed, shared, piece_cache,
                        lambda join_parts=True: self._plan(reuse, segments, tiktoken_safe, want_ids, join_parts))
                    valid, plan, out, n_cached, drafts = planned
        except BaseException:
            self.let_the_helper_go()
            raise
        ids, bounds = encoded if encoded is not None else shared.ids_and_bounds()  # every part is done now
        if self.lacked_a_cache:
            reuse.helpers.run_later(piece_caches.add_spare)  # for the next turn's helper; not waited for
        ids, bounds = self._ids_of(plan.missing, ids, bounds, lambda indices: engine.encode_with_bounds(
            [valid[i] for i in indices], tiktoken_safe, validated=True))
        if plan.missing:
            cache.store(valid, tiktoken_safe, plan, ids, bounds, drafts)
        if out is None:
            if self.copy is not None:
                reuse.output_memory.keep(self.copy.destination)  # taken for a copy the plan did not use
            return assemble(plan, ids, bounds, len(valid), want_ids)
        n_ids = n_cached + ids.shape[0]
        out[n_cached:n_ids] = ids
        if out.base is None:
            out.resize((n_ids,), refcheck=False)  # a short output: shrinks in place, no copy
        else:
            out = out[:n_ids]
            reuse.output_memory.keep(out)
        return Encoded(out, n_ids)

    @staticmethod
    def _encode_and_plan(reuse, packed, shared: SharedParts | None, piece_cache, plan_call):
        """Without a parked helper: ``(encoded, planned)``, the new segments encoded here while an
        executor's helper plans (``plan_call``) or, if none is idle, planned here first. ``encoded``
        is ``(ids, bounds)``, or None when they are shared (every part is done on return)."""

        def encode_ahead():
            if shared is None:
                return reuse.engine.encode_fused(packed)
            shared.work(piece_cache)
            return None

        planned = reuse.helpers.submit(plan_call)
        if planned is None:  # every helper is busy: plan here, then encode (no thread to wait for)
            result = plan_call(join_parts=False)
            return encode_ahead(), result
        try:
            encoded = encode_ahead()
        finally:
            result = planned.result()  # raises what validation raised
        return encoded, result

    def _ids_of(self, missing: list[int], ids: np.ndarray, bounds: np.ndarray, encode_others):
        """``(ids, bounds)`` of the call's ``missing`` segments, in order: those encoded ahead from
        ``ids``/``bounds``, the others through ``encode_others(indices) -> (ids, bounds)``."""
        ahead = range(self.first, self.first + len(self.tail))
        if len(missing) == len(ahead) and missing[0] == self.first:
            return ids, bounds
        others = [i for i in missing if i < self.first]
        sources = [(ahead, ids, bounds)] + ([(others, *encode_others(others))] if others else [])
        return merge_encodings(missing, sources)


def _same_sources(sources: list, layout: tuple, runs: list) -> bool:
    """Whether a plan's cached parts are the ids of a ``RecentCall.layout`` whose runs are ``runs``
    (the same runs and positions, in order)."""
    _, firsts, ends = layout
    return len(sources) == len(runs) and all(
        run is other and first == other_first and end == other_end
        for (run, first, end), other, other_first, other_end in zip(sources, runs, firsts, ends))


def merge_encodings(missing: list[int], sources: list) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, bounds)`` of the call's ``missing`` segments, in order, from ``sources``: each is
    ``(indices, ids, bounds)``, its k-th call index having ``ids[bounds[k]:bounds[k + 1]]``."""
    where = {i: (ids, bounds, k) for indices, ids, bounds in sources for k, i in enumerate(indices)}
    pieces = []
    for i in missing:
        ids, bounds, k = where[i]
        pieces.append(ids[bounds[k]:bounds[k + 1]])
    merged_bounds = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([piece.shape[0] for piece in pieces], out=merged_bounds[1:])
    return (np.concatenate(pieces) if pieces else np.empty(0, dtype=ID_DTYPE)).astype(ID_DTYPE, copy=False), merged_bounds


def assemble(plan: CachePlan, new_ids: np.ndarray, bounds: np.ndarray, n_segments: int, want_ids: bool) -> Encoded:
    """The call's ids from the plan's cached parts and the new ids (or only their count)."""
    if len(plan.missing) == n_segments:
        return Encoded(new_ids, len(new_ids))
    parts = [part if isinstance(part, np.ndarray) else new_ids[bounds[part[0]]:bounds[part[1]]] for part in plan.parts]
    n_ids = sum(len(part) for part in parts)
    if not want_ids:
        return Encoded(None, n_ids)
    if len(parts) == 1:
        return Encoded(parts[0].copy(), n_ids)  # a cached slice is read-only and shared: the caller gets its own
    return Encoded(np.concatenate(parts) if parts else np.empty(0, dtype=ID_DTYPE), n_ids)
