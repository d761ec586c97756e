"""Short calls shared with a helper thread that waits in compiled code.

A short call (``Engine.short_call_ids``) is read in place and encoded by one compiled call. From
``Policy.min_shared_short_call_bytes`` of UTF-8 on, that call also cuts its text into parts (the
tiktoken-safe cuts, grouped by ``parts.group_into_parts``: large first, small last) and posts them
to a ``ShortCallHelper``: the caller and the helper take parts from one atomic counter
(``parts.encode_claimed_parts``), each with a piece cache of its own, and the caller gathers the ids
once the helper is done. Neither thread returns to Python in between: the helper waits on a Linux
futex inside ``serve_short_calls``, and the caller wakes it as soon as it has read the text, so that
the helper's wake-up (~0.1 ms here) overlaps the caller's cuts (docs/performance.md, "Short calls
shared with a parked helper"). A call the helper has not started on by the time the caller has taken
every part is taken back: nobody waits for a thread that is late.

The segment cache's fresh calls (``Engine.shared_in_place_ids``, up to ``Policy.max_shared_in_place_chars``)
go the same way (``encode_pairs_shared_with_bounds``), with each segment's bounds in the ids, and are declined
where the helper cannot take part: a long call on one thread would be slower than the packed fan-out.

A helper starts with the first call long enough to share (a thread and a piece cache from the
engine's pool, made after that call returns), so that a Tokenizer that only sees short calls has
none. One caller at a time shares: the others, and calls on an engine whose helper is busy, run
alone. After a fork the child starts a helper of its own. Only where ``Policy.parked_helpers``
(Linux futexes), ``n_jobs > 1`` and the threads backend.

The protocol: ``N_WORDS`` int32 words (``words``) and one int64 job array; C is a caller, H the helper.
STATE holds a job number and a phase (``number << PHASE_BITS | phase``)::

    word          written by                                      read by   meaning
    STATE         C: (n, IDLE) -> (n + 1, CLAIMED) -> (n + 1, POSTED)   C, H      a job is being written / posted;
                  C: (m, POSTED) -> (m, IDLE): takes back its job m               a later phase: H took it
                  H: (m, POSTED) -> (m, RUNNING) -> (m, IDLE)
                  close: (n, IDLE) -> (n, QUIT); (0, STOPPED): no thread
    SLEEPER       H: 1 while it may sleep on STATE                 C         wake H after claiming
    DONE          H: the number of the last job it finished        C         C waits until it reaches its own
    DONE_SLEEPER  C: 0 when posting, 1 while it may sleep          H         wake C after finishing

Every change of STATE from IDLE, POSTED or RUNNING is a compare-and-exchange of the whole word, so one
thread wins it, and a caller takes back only its own job (its number is in the word: a job another
caller posted since is not its to take). C writes the job only between CLAIMED and POSTED, and H reads it
only after its POSTED -> RUNNING. Jobs are numbered in order and one is out at a time, so C waits until
DONE has reached its number (a later caller's job may be done too by the time C looks), and frees the
arrays its job points into only then, or after taking the job back. Whether every part was encoded is in
the job's own counters (``PARTS_DONE``; a thread out of memory for a part stops taking parts). The
sleeper marks close the lost-wake-up race as in ``reuse.parking``.
"""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from ..native import atomics, futex, jit
from ..native.cpython import LAYOUT, PAIRS_READ, read_text_pairs
from ..native.futex import FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, SYS_FUTEX, WAKE_ALL
from ..native.jit import index, kernel, leaf
from ..pipeline.assembly import ID_DTYPE, cut_packed, encode_read_pairs
from ..pipeline.bpe import grown_piece_cache
from ..pipeline.bpe.piece_cache import growth_needed
from ..pipeline.pretokenize.kimi_scanner import split_at_safe_points
from ..pipeline.segments import bounds_by_segment
from .parts import NEXT_PART, PARTS_DONE, encode_claimed_parts, group_into_parts, ids_of_parts
from .policy import Policy

STATE, SLEEPER, DONE, DONE_SLEEPER = range(4)
N_WORDS = 4
STOPPED, IDLE, CLAIMED, POSTED, RUNNING, QUIT = range(6)  # the phase, in STATE's low bits
PHASE_BITS = 3
PHASE_MASK = (1 << PHASE_BITS) - 1
NUMBER_MASK = (1 << 28) - 1  # job numbers go round modulo 2**28 (DONE starts at 0, the first job is 1)
# the job, int64: address and length of each array the caller made for it, then counts only the helper writes
(BUF, N_BUF, SUB_START, SUB_END, SUB_ALLOW, N_SUBS, PART_FIRST, N_PART_FIRST, COUNTERS, OUT, PART_N_IDS, SUB_N_IDS,
 HELPER_JOBS, HELPER_PARTS) = range(14)
JOB_WORDS = 16
NOT_SHARED = -1  # the status of a call whose parts could not all be encoded (a MemoryError): declined
HELPER_SPIN_READS = 1 << 14  # a helper between jobs reads STATE this often (~20 us) before it sleeps
NO_BUDGET = 1 << 62  # a short call is short: its parts are encoded without going back to Python


@leaf
def _state(number, phase):
    return np.int32(((number & NUMBER_MASK) << PHASE_BITS) | phase)


@leaf
def _wait_for_job(words, syscall_number):
    """Until a job is posted (its STATE word) or the helper is told to quit (-1): spins a while, then sleeps
    while STATE is IDLE (a claimed job is being written: it spins)."""
    spins = 0
    while True:
        state = atomics.load(words, STATE)
        phase = state & PHASE_MASK
        if phase == POSTED:
            return state
        if phase == QUIT:
            return -1
        if spins < HELPER_SPIN_READS:
            spins += 1
            continue
        atomics.store(words, SLEEPER, 1)
        if atomics.load(words, STATE) == state and phase == IDLE:
            atomics.futex(words, STATE, FUTEX_WAIT_PRIVATE, state, syscall_number)  # returns at once if changed
        atomics.store(words, SLEEPER, 0)


@leaf
def _reached(done, number):
    """Whether job ``number`` is done once DONE holds ``done`` (numbers go round: within half a turn)."""
    return ((done - number) & NUMBER_MASK) < (NUMBER_MASK + 1) // 2


@leaf
def _wait_for_done(words, number, syscall_number, job_arrays):
    """Until DONE has reached job ``number``: spins, then sleeps on DONE (the helper wakes it). ``job_arrays``:
    every array the job points into, passed so that they live until the helper is done with them (numba frees
    an array right after its last use in a function, which may be the caller's own parts)."""
    for _ in range(futex.SPIN_READS):
        if _reached(atomics.load(words, DONE), number):
            return
    atomics.store(words, DONE_SLEEPER, 1)
    while True:
        seen = atomics.load(words, DONE)
        if _reached(seen, number):
            return
        atomics.futex(words, DONE, FUTEX_WAIT_PRIVATE, seen, syscall_number)  # returns at once if changed


@kernel
def serve_short_calls(words, job, tables, specials, scan_table, cache, syscall_number):
    """The helper: parts of the jobs posted on ``words``/``job``, with its own piece ``cache``. Returns 1
    when that cache should grow (the thread grows it and calls again), 0 once told to quit."""
    while True:
        posted = _wait_for_job(words, syscall_number)
        if posted < 0:
            return 0
        number = posted >> PHASE_BITS
        if not atomics.compare_exchange(words, STATE, posted, _state(number, RUNNING)):
            continue  # the caller took it back
        n_buf = job[N_BUF]
        n_subs = job[N_SUBS]
        n_parts = job[N_PART_FIRST] - 1
        counters = atomics.array_at(job[COUNTERS], 2, np.int64)  # PARTS_DONE says whether every part was encoded
        try:
            job[HELPER_PARTS] += encode_claimed_parts(
                tables, specials, scan_table, atomics.array_at(job[BUF], n_buf, np.uint8),
                atomics.array_at(job[SUB_START], n_subs, np.int64), atomics.array_at(job[SUB_END], n_subs, np.int64),
                atomics.array_at(job[SUB_ALLOW], n_subs, np.uint8).view(np.bool_),
                atomics.array_at(job[PART_FIRST], n_parts + 1, np.int64), counters,
                atomics.array_at(job[OUT], n_buf, ID_DTYPE), atomics.array_at(job[PART_N_IDS], n_parts, np.int64),
                atomics.array_at(job[SUB_N_IDS], n_subs, np.int64), cache, futex.NO_SIGNAL, syscall_number,
                NO_BUDGET)
        except Exception:  # no memory for a part's arrays: no more parts, and the caller declines the call
            counters[NEXT_PART] = n_parts
        job[HELPER_JOBS] += 1
        futex.set_and_wake(words, DONE, number, DONE_SLEEPER, syscall_number)
        atomics.store(words, STATE, _state(number, IDLE))  # (number, RUNNING) is the helper's own
        grow_short, grow_general = growth_needed(cache)
        if grow_short or grow_general:
            return 1


@kernel
def stop_helper(words, syscall_number):
    """Tell the helper to quit once no job is claimed, posted or running, and wake it; False where there
    is no thread (STOPPED) or it was told already."""
    while True:
        state = atomics.load(words, STATE)
        phase = state & PHASE_MASK
        if phase == STOPPED or phase == QUIT:
            return False
        if phase == IDLE and atomics.compare_exchange(words, STATE, state, (state & ~PHASE_MASK) | QUIT):
            atomics.futex(words, STATE, FUTEX_WAKE_PRIVATE, WAKE_ALL, syscall_number)
            return True


@kernel
def _encode_alone(bundle, buf, seg_start, seg_end, allow_special, tiktoken_safe, with_bounds):
    """A call's segments read by ``read_text_pairs``, encoded on this thread alone: ``(ids, bounds, kept)`` as
    ``_encode_pairs_shared`` gives them (``bounds`` empty unless ``with_bounds``)."""
    n_pairs = seg_start.shape[0]
    out, n, run_start, run_out_end = encode_read_pairs(bundle.tables, bundle.specials, bundle.scan_table, bundle.flags,
                                                       buf, seg_start, seg_end, allow_special, tiktoken_safe,
                                                       bundle.cache)
    bounds = bounds_by_segment(seg_end, np.arange(n_pairs), n_pairs, run_start, run_out_end) if with_bounds \
        else np.empty(0, dtype=np.int64)
    part_n_ids = np.full(1, n, dtype=np.int64)
    return out[:n].copy(), bounds, (np.zeros(1, dtype=np.int64), np.arange(2), out, part_n_ids)


@kernel
def _nothing_kept():
    return (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0, dtype=ID_DTYPE),
            np.empty(0, dtype=np.int64))


@kernel
def _encode_pairs_shared(bundle, address, n_pairs, layout, max_chars, max_bytes, tiktoken_safe, words, job,
                         min_shared_bytes, part_bytes, part_shrink, split_units, syscall_number, with_bounds,
                         must_share):
    """``encode_pairs_shared``, and where each segment's ids start and end (``bounds``, if ``with_bounds``) and what
    ``ids_of_parts`` gathers the ids from again (``kept``): ``(ids, status, may_grow, start_helper, bounds,
    kept)``. ``must_share``: a call the helper cannot take (none, or busy) is declined (``NOT_SHARED``) before
    its text is read, rather than run on this thread alone, and so is one whose helper another caller claimed while
    this one read its text (only a call too short to share runs alone)."""
    if must_share:
        phase = atomics.load(words, STATE) & PHASE_MASK
        for _ in range(HELPER_SPIN_READS if phase == RUNNING else 0):  # it may be between DONE and IDLE
            phase = atomics.load(words, STATE) & PHASE_MASK
            if phase != RUNNING:
                break
        if phase != IDLE:
            return (np.empty(0, dtype=ID_DTYPE), NOT_SHARED, False, phase == STOPPED, np.empty(0, dtype=np.int64),
                    _nothing_kept())
    buf, seg_start, seg_end, allow_special, status = read_text_pairs(address, n_pairs, layout, max_chars, max_bytes)
    if status != PAIRS_READ:
        return np.empty(0, dtype=ID_DTYPE), status, False, False, np.empty(0, dtype=np.int64), _nothing_kept()
    cache = bundle.cache
    long_enough = buf.shape[0] >= min_shared_bytes
    state = atomics.load(words, STATE)
    number = (state >> PHASE_BITS) + 1
    if not (long_enough and (state & PHASE_MASK) == IDLE
            and atomics.compare_exchange(words, STATE, state, _state(number, CLAIMED))):
        if must_share and long_enough:
            return (np.empty(0, dtype=ID_DTYPE), NOT_SHARED, False, (state & PHASE_MASK) == STOPPED,
                    np.empty(0, dtype=np.int64), _nothing_kept())
        ids, bounds, kept = _encode_alone(bundle, buf, seg_start, seg_end, allow_special, tiktoken_safe, with_bounds)
        grow_short, grow_general = growth_needed(cache)
        return (ids, status, grow_short or grow_general, long_enough and (state & PHASE_MASK) == STOPPED, bounds,
                kept)
    number &= NUMBER_MASK
    if atomics.load(words, SLEEPER) != 0:  # its wake-up overlaps the cuts below
        atomics.futex(words, STATE, FUTEX_WAKE_PRIVATE, 1, syscall_number)
    try:
        needs_cuts = np.full(n_pairs, tiktoken_safe, dtype=np.bool_)
        sub_start, sub_end, sub_allow = cut_packed(buf, seg_start, seg_end, needs_cuts, allow_special, bundle.flags)
        if split_units:
            sub_start, sub_end, sub_allow = split_at_safe_points(buf, sub_start, sub_end, sub_allow, part_bytes)
        part_first = np.empty(sub_start.shape[0] + 1, dtype=np.int64)
        n_parts = group_into_parts(sub_start, sub_end, part_bytes, NO_BUDGET, part_shrink, part_first)
        counters = np.zeros(2, dtype=np.int64)
        out = np.empty(buf.shape[0], dtype=ID_DTYPE)
        part_n_ids = np.zeros(n_parts, dtype=np.int64)
        sub_n_ids = np.zeros(sub_start.shape[0], dtype=np.int64)
    except Exception:
        atomics.store(words, STATE, _state(number, IDLE))
        return np.empty(0, dtype=ID_DTYPE), NOT_SHARED, False, False, np.empty(0, dtype=np.int64), _nothing_kept()
    posted = n_parts > 1
    if posted:
        job[BUF] = buf.ctypes.data
        job[N_BUF] = buf.shape[0]
        job[SUB_START] = sub_start.ctypes.data
        job[SUB_END] = sub_end.ctypes.data
        job[SUB_ALLOW] = sub_allow.ctypes.data
        job[N_SUBS] = sub_start.shape[0]
        job[PART_FIRST] = part_first.ctypes.data
        job[N_PART_FIRST] = n_parts + 1
        job[COUNTERS] = counters.ctypes.data
        job[OUT] = out.ctypes.data
        job[PART_N_IDS] = part_n_ids.ctypes.data
        job[SUB_N_IDS] = sub_n_ids.ctypes.data
        words[DONE_SLEEPER] = 0
        atomics.store(words, STATE, _state(number, POSTED))
    else:  # nothing to share: DONE reaches the number as if the helper had done it
        futex.set_and_wake(words, DONE, number, DONE_SLEEPER, syscall_number)
        atomics.store(words, STATE, _state(number, IDLE))
    try:
        encode_claimed_parts(bundle.tables, bundle.specials, bundle.scan_table, buf, sub_start, sub_end, sub_allow,
                             part_first[:n_parts + 1], counters, out, part_n_ids, sub_n_ids, cache, futex.NO_SIGNAL,
                             syscall_number, NO_BUDGET)
    except Exception:  # no memory for a part's arrays: no more parts for anyone, then declined
        counters[NEXT_PART] = n_parts
    if posted and not atomics.compare_exchange(words, STATE, _state(number, POSTED), _state(number, IDLE)):
        _wait_for_done(words, number, syscall_number,  # the helper took it: until it is done
                       (buf, sub_start, sub_end, sub_allow, part_first, counters, out, part_n_ids, sub_n_ids))
    grow_short, grow_general = growth_needed(cache)
    if counters[PARTS_DONE] != n_parts:
        return (np.empty(0, dtype=ID_DTYPE), NOT_SHARED, grow_short or grow_general, False,
                np.empty(0, dtype=np.int64), _nothing_kept())
    kept = (sub_start, part_first[:n_parts + 1], out, part_n_ids)
    bounds = bounds_by_segment(seg_end, np.arange(n_pairs), n_pairs, sub_start, np.cumsum(sub_n_ids)) \
        if with_bounds else np.empty(0, dtype=np.int64)
    return ids_of_parts(*kept), status, grow_short or grow_general, False, bounds, kept


@kernel
def encode_pairs_shared(bundle, address, n_pairs, layout, max_chars, max_bytes, tiktoken_safe, words, job,
                        min_shared_bytes, part_bytes, part_shrink, split_units, syscall_number):
    """``pipeline.assembly.encode_pairs_bundled``, its parts shared with the helper on ``words``/``job`` when
    the call has ``min_shared_bytes`` of UTF-8 or more and the helper is free: ``(ids, status, may_grow,
    start_helper)``; ``start_helper``: the call was long enough to share but there is no helper thread
    (STOPPED). No ids unless ``status`` is ``PAIRS_READ`` (``NOT_SHARED``: out of memory for a part).
    ``split_units``: long sub-strings are cut where the pattern always cuts (``split_at_safe_points``), so that
    parts can be small."""
    ids, status, may_grow, start_helper, _, _ = _encode_pairs_shared(
        bundle, address, n_pairs, layout, max_chars, max_bytes, tiktoken_safe, words, job, min_shared_bytes,
        part_bytes, part_shrink, split_units, syscall_number, False, False)
    return ids, status, may_grow, start_helper


@kernel
def encode_pairs_shared_with_bounds(bundle, address, n_pairs, layout, max_chars, max_bytes, tiktoken_safe, words,
                                    job, min_shared_bytes, part_bytes, part_shrink, split_units, syscall_number):
    """``encode_pairs_shared`` of a call that is declined (``NOT_SHARED``) unless the helper takes part, and
    each segment's bounds in the ids and what gathers them again: ``(ids, status, may_grow, start_helper, bounds,
    kept)``; ``ids_of_parts(*kept)`` is a copy of ``ids`` from memory only this call's result holds."""
    return _encode_pairs_shared(bundle, address, n_pairs, layout, max_chars, max_bytes, tiktoken_safe, words, job,
                                min_shared_bytes, part_bytes, part_shrink, split_units, syscall_number, True, True)


def shares_short_calls(policy: Policy, fuses: bool) -> bool:
    """Whether an engine with this policy shares its long short calls with a ``ShortCallHelper``."""
    return (fuses and policy.parked_helpers and policy.n_jobs > 1 and policy.backend == "threads"
            and not policy.hash_routing and LAYOUT is not None)


class ShortCallHelper:
    """The helper thread that shares one engine's long short calls (see the module docstring).

    ``encode_pairs`` runs a short call (the arguments of ``encode_pairs_bundled``), shared when it is long
    enough; the thread starts after the first such call, or with ``start``. ``close`` stops it (so does
    dropping the helper), after which calls run alone.
    """

    def __init__(self, stages, policy: Policy, splits_after_newline: bool) -> None:
        self.stages = stages
        self.words = np.zeros(N_WORDS, dtype=np.int32)  # STOPPED
        self.job = np.zeros(JOB_WORDS, dtype=np.int64)
        self.settings = (policy.min_shared_short_call_bytes, policy.short_call_part_bytes,
                         policy.short_call_part_shrink, splits_after_newline, SYS_FUTEX)
        self._entries: dict = {}  # kernel -> its compiled entry point, once chosen
        # what a short call runs once the first has chosen it: ``short_entry(*args, *tail)`` gives ``(ids, status,
        # may_grow, start_helper)`` (``SubstringEncoder.encode_pairs`` calls it without the frames of ``encode_pairs``)
        self.short_entry = None
        self.tail = (self.words, self.job) + self.settings
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._starter: threading.Thread | None = None  # the thread that starts it after the first long call
        self._closed = False
        self._stop = weakref.finalize(self, _stop, self.words, None)  # replaced once a thread runs
        _helpers.add(self)

    @property
    def running(self) -> bool:
        """Whether a thread serves this helper's calls."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def parts_taken(self) -> int:
        """Parts of shared calls the helper thread has encoded so far."""
        return int(self.job[HELPER_PARTS])

    def encode_pairs(self, args: tuple):
        """``encode_pairs_bundled(*args)``, shared with the thread when long enough: ``(ids, status, may_grow)``."""
        return self._call(encode_pairs_shared, args)[:3]

    def encode_pairs_with_bounds(self, args: tuple):
        """``encode_pairs`` and where each segment's ids start and end, and a function that gathers the ids again
        into a new array from memory only it holds (as ``Engine.encode_with_regather``): ``(ids, status, may_grow,
        bounds, regather)``."""
        ids, status, may_grow, _, bounds, kept = self._call(encode_pairs_shared_with_bounds, args)
        return ids, status, may_grow, bounds, lambda: ids_of_parts(*kept)

    def _call(self, shared_kernel, args: tuple):
        """``shared_kernel`` on a short call's arguments (then ``tail``: ``words``, ``job`` and the settings);
        starts the thread after a call long enough to share found none."""
        args = args + self.tail
        entry = self._entries.get(shared_kernel)
        if entry is None:
            result = shared_kernel(*args)
            entry = self._entries[shared_kernel] = jit.compiled_entry(shared_kernel, args)
            if shared_kernel is encode_pairs_shared:
                self.short_entry = entry
        else:
            result = entry(*args)
        if result[3]:
            self.start_after_call()
        return result

    def start_after_call(self) -> None:
        """A call long enough to share found no thread: start it on a thread of its own (its piece cache and
        kernel are made there, after this call, not during it), once."""
        if self._starter is None:
            self._starter = threading.Thread(target=self._start_after_call, name="kimi_tok-short_calls-start",
                                             daemon=True)
            self._starter.start()

    def start(self) -> None:
        """Start the thread now (and load or compile its kernel here) unless it runs or the helper is closed."""
        with self._lock:
            if self._closed or self.running:
                return
            stages = self.stages
            cache = stages.piece_caches.new()
            probe = np.array([QUIT, 0, 0, 0], dtype=np.int32)  # returns at once: errors surface here
            serve_short_calls(probe, self.job, stages.tables, stages.specials, stages.pretokenizer.scan_table, cache,
                              SYS_FUTEX)
            words = self.words
            words[:] = 0
            words[STATE] = IDLE
            thread = threading.Thread(target=_serve, args=(words, self.job, stages, cache),
                                      name="kimi_tok-short_calls", daemon=True)
            self._stop.detach()
            self._stop = weakref.finalize(self, _stop, words, thread)
            self._thread = thread
            thread.start()

    def _start_after_call(self) -> None:
        """``start`` on the thread a long call left: once the main thread has ended (the interpreter shutting
        down) nothing is started, silently."""
        try:
            self.start()
        except Exception:
            if threading.main_thread().is_alive():
                raise

    def close(self) -> None:
        """Stop the thread (after the job it is on, if any); later calls run alone."""
        with self._lock:
            self._closed = True
            self._stop()

    def _forked(self) -> None:
        """In a forked child: no thread serves these words; the next long call starts one."""
        self._lock = threading.Lock()
        self._stop.detach()
        self.words = np.zeros(N_WORDS, dtype=np.int32)
        self.tail = (self.words, self.job) + self.settings
        self._stop = weakref.finalize(self, _stop, self.words, None)
        self._thread = self._starter = None


def _serve(words: np.ndarray, job: np.ndarray, stages, cache) -> None:
    """The helper thread: serve jobs, growing its piece cache when a job leaves it full; give it back at
    the end. Holds no reference to the ``ShortCallHelper``, which may be dropped (and then stops it)."""
    while serve_short_calls(words, job, stages.tables, stages.specials, stages.pretokenizer.scan_table, cache,
                            SYS_FUTEX):
        cache = grown_piece_cache(cache)
    stages.piece_caches.give_back(cache)


def _stop(words: np.ndarray, thread: threading.Thread | None) -> None:
    if stop_helper(words, SYS_FUTEX) and thread is not None and thread is not threading.current_thread():
        thread.join()


_helpers: weakref.WeakSet[ShortCallHelper] = weakref.WeakSet()


def _before_fork() -> None:
    """A fork waits for helpers being started: a child must not inherit numba's lock held by a thread it lacks."""
    for helper in list(_helpers):
        starter = helper._starter
        if starter is not None and starter is not threading.current_thread():
            starter.join()


def _after_fork_in_child() -> None:
    for helper in list(_helpers):
        helper._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
