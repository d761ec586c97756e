"""Helper threads that wait in compiled code, so that a call can wake one before it packs its text.

A helper thread that waits in Python (a lock, an executor's queue) needs the GIL the moment it
wakes, and an agent loop's caller holds the GIL while it validates and packs the new segments:
such a helper starts only once the caller has entered compiled code, and ~0.1 ms later (waking a
sleeping thread costs that here, measured). A ``ParkedHelper`` waits inside a GIL-free kernel on
a Linux futex instead. A call wakes it first thing (``post``); without the GIL it copies the ids
the call most likely starts with (those of the recent call it extends: ``CopyJob``) into the
output and faults in the pages the new ids will take, then waits, still in compiled code, until
the caller has entered its own compiled call (``GO``, a ``native.futex.signal`` it sets there). Only then does
it return to Python and run the call's plan: the GIL is free at that moment, and the helper never
takes it from under the caller between two of the caller's compiled calls (the caller would then
wait for the whole plan). When the caller is done with its own share it waits for the helper in
compiled code too (``wait_done``), until the helper is parked again: neither thread ever sleeps
on the GIL or a lock in the middle of a call (each such wake-up costs ~0.1-0.3 ms here).

Waits spin a while first (``futex.SPIN_READS``: the other thread is usually microseconds away), then
sleep on the futex; a helper between calls sleeps at once. Only on Linux (x86-64, AArch64);
elsewhere ``PARKING`` is False and ``reuse.HelperThreads`` uses an executor.

The protocol. Five int32 words per helper (``words``) and one int64 job array; C is the caller
(one at a time: a helper is lent to one call until ``Posted.result``), H the helper::

    word          written by                   read by        meaning
    STATE         C: POSTED (wake)             H (park)       a job is posted
                  H: IDLE (back in Python)
    GO            C: 0 (wake), 1 (signal)      H (park)       C is in compiled code: H may take the GIL
    GO_SLEEPER    C: 0 (wake); H: 1            C (signal)     H sleeps on GO: wake it
    DONE          H: job number (park)         C (wait_done)  the job with this number is finished
    DONE_SLEEPER  C: 0 (wake), 1 (wait_done)   H (park)       C sleeps on DONE: wake it

    H: park ── STATE == POSTED ──> copy ── GO == 1 ──> (Python) STATE = IDLE, run fn
         ^                                                          │
         └──────────────── DONE = number, wake C if it sleeps ──────┘
    C: wake (job, GO = 0, sleepers = 0, STATE = POSTED, futex wake) ... signal GO ... wait_done

Why the ordering is safe: every access to the words is a sequentially consistent atomic
(``atomics.load``/``store``), and ``wake`` writes the job array before its atomic store of
STATE, so H, which reads STATE atomically before reading the job, sees the whole job (the
store/load pair orders the plain writes before it). The sleeper marks close the lost-wake-up
race: a waiter stores its mark, then re-reads the word before each ``FUTEX_WAIT`` (which returns
at once if the word changed); a setter stores the word, then reads the mark and wakes. With
sequentially consistent operations one of the two sees the other's store, so a waiter never
sleeps on a word that was set unseen. H writes DONE only after ``fn`` returned and the result was
stored on the ``Posted``, so C reads a complete result; and C hands the helper to another caller
only after DONE shows its own job number, so a later post cannot reset words C still waits on.
"""

from __future__ import annotations

import threading
from typing import Callable, NamedTuple

import numpy as np

from ..native import atomics, futex
from ..native.futex import FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE, HAS_FUTEX, SYS_FUTEX
from ..native.jit import index, kernel, leaf

PARKING = HAS_FUTEX
# int32 words shared by a helper and its caller: the job's state, GO (a ``futex.signal``: the flag and
# its sleeper mark), the last job done, and whether a thread sleeps waiting for DONE to change
STATE, GO, GO_SLEEPER, DONE, DONE_SLEEPER = 0, 1, 2, 3, 4
N_WORDS = 5
IDLE, POSTED = 0, 1
# the job, int64: where the ids go, which of them to fault in, then (address, count) per copied array
DESTINATION, FAULT_FROM, FAULT_TO, N_COPIES, FIRST_COPY = 0, 1, 2, 3, 4
MAX_COPIES = 4096  # arrays per job; a longer layout is not copied ahead (the plan copies it)
ID_BYTES = 4
IDS_PER_PAGE = 4096 // ID_BYTES


@leaf
def _copy_job(job):
    """Copy the job's arrays back to back from ``job[DESTINATION]``, then write one id per page of
    ``[FAULT_FROM, FAULT_TO)`` there (the pages the caller's new ids will land on)."""
    destination = job[DESTINATION]
    at = 0
    for k in range(job[N_COPIES]):
        n = job[index(FIRST_COPY + 2 * k + 1)]
        atomics.copy_bytes(destination + ID_BYTES * at, job[index(FIRST_COPY + 2 * k)], ID_BYTES * n)
        at += n
    if job[FAULT_TO] > job[FAULT_FROM]:
        region = atomics.array_at(destination + ID_BYTES * job[FAULT_FROM], job[FAULT_TO] - job[FAULT_FROM], np.uint32)
        for i in range(0, region.shape[0], IDS_PER_PAGE):
            region[index(i)] = 0


@kernel
def park(words, job, finished, syscall_number):
    """Say job ``finished`` is done, sleep until another is posted, do its copy, then wait for GO."""
    futex.set_and_wake(words, DONE, finished, DONE_SLEEPER, syscall_number)
    while atomics.load(words, STATE) != POSTED:
        atomics.futex(words, STATE, FUTEX_WAIT_PRIVATE, IDLE, syscall_number)
    _copy_job(job)
    futex.wait_until(words, GO, 1, GO_SLEEPER, syscall_number)
    return 0


@kernel
def wake(words, job, copies, destination, fault_from, fault_to, syscall_number):
    """Write a job to a parked helper's arrays and wake it (one compiled call: each NumPy operation
    from Python costs microseconds when cold). ``copies``: address, count, address, ... of the
    arrays to copy back to back into ``destination``; then ``destination[fault_from:fault_to]`` is
    faulted in. Returns False, posting nothing, if they do not fit ``destination`` or ``job``."""
    n_copies = copies.shape[0] // 2
    n_ids = 0
    for k in range(n_copies):
        n_ids += copies[2 * k + 1]
    if FIRST_COPY + 2 * n_copies > job.shape[0] or n_ids > destination.shape[0]:
        return False
    job[DESTINATION] = destination.ctypes.data
    job[FAULT_FROM] = min(fault_from, destination.shape[0])
    job[FAULT_TO] = min(fault_to, destination.shape[0])
    job[N_COPIES] = n_copies
    job[FIRST_COPY:FIRST_COPY + 2 * n_copies] = copies
    words[GO] = 0
    words[GO_SLEEPER] = 0
    words[DONE_SLEEPER] = 0
    atomics.store(words, STATE, POSTED)
    atomics.futex(words, STATE, FUTEX_WAKE_PRIVATE, 1, syscall_number)
    return True


@kernel
def signal_go_from_python(go_words, syscall_number):
    """GO from Python (``go_words``: a helper's ``words[GO:GO_SLEEPER + 1]``), for a caller that will
    not reach its compiled call (which would signal it: ``engine.parts.encode_claimed_parts``)."""
    futex.signal(go_words, syscall_number)
    return 0


@kernel
def wait_done(words, job_number, syscall_number):
    """Until the helper has finished job ``job_number`` and parked again (the GIL is then free)."""
    futex.wait_until(words, DONE, job_number, DONE_SLEEPER, syscall_number)
    return 0


NO_COPIES = np.zeros(0, dtype=np.int64)  # a job with nothing to copy
NO_IDS = np.zeros(0, dtype=np.uint32)


class CopyJob(NamedTuple):
    """Ids a helper copies before planning: ``sources``, address and count of each array of uint32
    ids in memory that ``keep`` holds (an int64 array: address, count, address, ...), back to back
    into ``destination`` (a uint32 array); then ``destination[fault_from:fault_to]`` gets one id
    per page written (faulted in)."""

    keep: object
    sources: np.ndarray
    destination: np.ndarray
    fault_from: int
    fault_to: int


class Posted:
    """One job posted to a ``ParkedHelper``: ``result()`` waits for it (in compiled code), then
    hands the helper to ``give_back``; every post must be followed by a ``result()`` (later calls
    of ``result`` and ``release`` touch the helper no more: it may be serving another caller)."""

    __slots__ = ("helper", "number", "fn", "copy", "give_back", "done", "value", "error")

    def __init__(self, helper: ParkedHelper, number: int, fn: Callable, copy: CopyJob | None,
                 give_back: Callable[[ParkedHelper], None] | None) -> None:
        self.helper = helper
        self.number = number
        self.fn = fn
        self.copy = copy  # keeps the memory the job's addresses point into alive until it is done
        self.give_back = give_back
        self.done = False
        self.value = self.error = None

    def release(self) -> None:
        """Let the helper run ``fn`` without waiting for the caller's compiled call (the caller
        never got there: it raised, or needs the GIL before it does)."""
        if not self.done:
            signal_go_from_python(self.helper.go_words, SYS_FUTEX)

    def result(self):
        """``fn``'s return value (or its exception, raised here) once the helper is parked again."""
        if not self.done:
            wait_done(self.helper.words, self.number, SYS_FUTEX)
            self.done = True
        if self.give_back is not None:
            # only now may another caller post to it: a post resets the words this caller waited on
            self.give_back, give_back = None, self.give_back
            give_back(self.helper)
        if self.error is not None:
            raise self.error
        return self.value


class ParkedHelper:
    """One helper thread parked in ``park``; ``post`` hands it a job and a function to run once the
    caller has signalled GO. One caller at a time: the next post only after ``Posted.result()``."""

    def __init__(self, name: str = "kimi_tok-plan_0") -> None:
        self.words = np.zeros(N_WORDS, dtype=np.int32)
        self.go_words = self.words[GO:GO_SLEEPER + 1]  # the GO signal the caller's compiled call sets
        self._job = np.zeros(FIRST_COPY + 2 * MAX_COPIES, dtype=np.int64)
        self._posted: Posted | None = None
        self._jobs = 0
        self.kept_off: int | None = None  # the core it was last kept off (its caller's)
        # compiled (or loaded) here, so that an error surfaces in the caller, not in a thread it waits for
        ready = np.array([POSTED, 1, 0, 0, 0], dtype=np.int32)  # a job posted and GO: returns at once
        park(ready, np.zeros(FIRST_COPY, dtype=np.int64), 0, SYS_FUTEX)
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def native_id(self) -> int | None:
        return self._thread.native_id

    def post(self, fn: Callable, copy: CopyJob | None,
             give_back: Callable[[ParkedHelper], None] | None = None) -> Posted:
        """Wake the helper: it does ``copy`` without the GIL, waits for GO (``futex.signal`` from the
        caller's compiled code, or ``Posted.release``), then runs ``fn``."""
        self._jobs = (self._jobs + 1) & 0x3FFFFFFF
        posted = self._posted = Posted(self, self._jobs, fn, copy, give_back)
        if copy is None:
            posted_it = wake(self.words, self._job, NO_COPIES, NO_IDS, 0, 0, SYS_FUTEX)
        else:
            posted_it = wake(self.words, self._job, copy.sources, copy.destination, copy.fault_from, copy.fault_to,
                             SYS_FUTEX)
        if not posted_it:
            self._posted = None
            raise ValueError("copy job: more sources than MAX_COPIES, or more ids than the destination holds")
        return posted

    def _serve(self) -> None:
        finished = 0
        while True:
            park(self.words, self._job, finished, SYS_FUTEX)  # compiled in __init__: nothing to raise here
            posted, self._posted = self._posted, None
            self.words[STATE] = IDLE  # parks again once this job is done
            try:
                posted.value = posted.fn()
            except BaseException as exc:  # the caller raises it
                posted.error = exc
            finished = posted.number
            # nothing of the job stays referenced from here while parked (the output's memory is reused
            # only once nothing references it)
            posted.fn = posted.copy = posted = None
