"""Fan-out of one long call over workers: threads (default) or processes.

After the tiktoken-safe cuts, sub-strings are independent for every later stage,
and long ones can be cut further where the Kimi pattern always cuts
(``pretokenize.split_at_safe_points``). A long prompt's units are split into
contiguous groups of about equal bytes (``split_spans``).

- ``threads``: the compiled stages release the GIL, so threads share the
  Tokenizer; each group runs every stage with a piece cache of its own
  (``encode_groups_on_threads``). With ``hash_routing``, groups are pre-tokenized
  in parallel, pieces that are not vocabulary tokens are hash-routed so identical
  ones are merged once, by one worker and its piece cache (``routing.py``), and
  each group writes its ids into the call's one output array
  (``encode_on_threads``); measured slower on 2 cores, so it is not the default.
- ``processes``: joblib's loky process pool (``workers.py``), kept warm between
  calls; workers map the BPE tables from disk and read the text from a shared
  memory-mapped file, so neither is pickled per call.

Both give the sequential ids for every input and any number of workers.

``SharedParts`` shares one call between threads that join at different times (an agent
loop's caller and, once it has planned the call, its helper): they take parts from an
atomic counter inside compiled code, so none waits for a share decided in advance.

Why not ``joblib.Parallel`` for one call: it costs ~10 ms per call here whatever
the work (its result loop polls every 10 ms), about the time of a whole
million-token encode on 16 cores; a warm ``ThreadPoolExecutor`` costs ~0.1 ms and
loky's reusable executor ~1 ms. ``joblib.Parallel`` is used where calls are long:
corpora (``corpus.py``, also on Dask).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .encoder import ID_DTYPE, NEXT_PART, PARTS_DONE, Misses, cut_into_parts, encode_claimed_parts, gather_parts
from .parking import NO_HELPER, SYS_FUTEX
from .segments import PackedSegments

N_JOBS_ENV = "KIMI_TOK_N_JOBS"
BACKEND_ENV = "KIMI_TOK_BACKEND"
BACKENDS = ("threads", "processes")
DEFAULT_BACKEND = "threads"  # measured: see README "Many cores"
# Thresholds of the group fan-outs (hash routing, patterns other than Kimi's; the default shares parts, below).
# Measured on 2 cores, fresh prompts, empty piece caches, n_jobs 2 vs 1 (with units split after newlines):
# 0.3M chars 1.01x, 0.6M 1.18x, 1.0M 1.51x, 1.6M 1.35x, 2.4M 1.55x, 4M 1.60x; with 128 KB per job 0.3M and
# 0.6M got slower (0.89x, 0.96x), so on two cores a call fans out from 256 KB per job.
MIN_BYTES_PER_JOB_TWO_CORES = 1 << 18
# On the 16-core device (8 jobs), the headline's 400k-char prompt: 256 KB per job (no fan-out) 13.96 ms, 128 KB
# 10.31, 64 KB 10.08, 32 KB 8.98 (basetenkenizer 9.5-10.2 ms); 4k, 40k and 4M chars unchanged.
MIN_BYTES_PER_JOB_MORE_CORES = 1 << 16
# The default fan-out on threads shares parts (SharedParts, the Kimi scanner): at least FAN_OUT_PART_BYTES each,
# and 1/(SHRINK_PER_JOB * n_jobs) of the bytes left (guided: large first, small last). On 2 cores, 4M chars: 32 /
# 64 / 128 KB parts 20.8 / 21.4 / 20.9 ms against 27.1 ms for 4 equal groups per job; 1M chars 6.0-6.3 against
# 11.3 ms. It pays from less text than groups did: 0.2M / 0.4M chars 2.47 / 4.73 ms on one thread, 1.69 / 3.16 ms
# shared from 64 KB per job (32 KB: 1.61 / 2.94, but 0.1M chars 1.35 against 1.25 ms on one thread).
FAN_OUT_PART_BYTES = 1 << 16
SHRINK_PER_JOB = 2
MIN_BYTES_PER_SHARED_JOB = 1 << 16
# Processes pay for the text file, pickled ids and worker wake-up: 2 workers vs 1 thread measured 0.72x at
# 0.3M chars, 0.94x at 0.6M, 1.01x at 1.0M (threads: 0.86x, 1.02x, 1.41x with 64 KB per job), so they fan out
# from 1 MB per job.
MIN_BYTES_PER_PROCESS_JOB = 1 << 20
UNIT_BYTES = 1 << 18  # long sub-strings are split (where provably safe) into units of about this size
GROUPS_PER_JOB = 4  # smaller groups even out text that costs more per byte (CJK, long runs)


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def min_bytes_per_job_for(cores: int) -> int:
    """From how many bytes per job a call fans out in groups over threads on ``cores`` cores (measured on 2 and
    16, when groups were the default; the shared parts use ``MIN_BYTES_PER_SHARED_JOB``)."""
    return MIN_BYTES_PER_JOB_TWO_CORES if cores <= 2 else MIN_BYTES_PER_JOB_MORE_CORES


MIN_BYTES_PER_JOB = min_bytes_per_job_for(usable_cores())  # the cores at import decide

_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def default_n_jobs() -> int:
    """``KIMI_TOK_N_JOBS`` if set, else the usable cores (at most 8)."""
    value = os.environ.get(N_JOBS_ENV)
    if value:
        try:
            n = int(value)
        except ValueError:
            raise ValueError(f"{N_JOBS_ENV}={value!r}: expected a positive integer") from None
        if n < 1:
            raise ValueError(f"{N_JOBS_ENV}={value!r}: expected a positive integer")
        return n
    return max(1, min(8, usable_cores()))


def check_n_jobs(n_jobs) -> int:
    if n_jobs is None:
        return default_n_jobs()
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1:
        raise ValueError(f"n_jobs must be a positive int or None, not {n_jobs!r}")
    return n_jobs


def check_backend(backend) -> str:
    """``backend``, or ``KIMI_TOK_BACKEND``, or the default, checked."""
    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND
        where = f"{BACKEND_ENV}={backend!r}"
    else:
        where = f"backend={backend!r}"
    if backend not in BACKENDS:
        raise ValueError(f"{where}: expected one of {', '.join(map(repr, BACKENDS))}")
    return backend


def check_hash_routing(hash_routing) -> bool:
    if not isinstance(hash_routing, bool):
        raise TypeError(f"hash_routing must be a bool, not {type(hash_routing).__name__}")
    return hash_routing


def thread_pool(n_workers: int) -> ThreadPoolExecutor:
    """A process-wide pool, grown on demand and kept warm between calls."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool_pid != os.getpid():  # a forked child has none of its parent's threads
            _pool = None
        if _pool is None or _pool._max_workers < n_workers:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="kimi_tok")
            _pool_pid = os.getpid()
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def split_spans(run_start: np.ndarray, run_end: np.ndarray, n_jobs: int,
                min_bytes_per_job: int = MIN_BYTES_PER_JOB) -> list[tuple[int, int]]:
    """Contiguous run ranges ``[(r0, r1), ...]`` of about equal total bytes, none under
    ``min_bytes_per_job`` (one range if ``n_jobs == 1`` or the input is short)."""
    n_runs = run_start.shape[0]
    total = int(run_end[-1] - run_start[0]) if n_runs else 0
    jobs = 1 if n_jobs == 1 else min(n_jobs * GROUPS_PER_JOB, max(1, total // min_bytes_per_job), n_runs)
    if jobs <= 1:
        return [(0, n_runs)]
    targets = run_start[0] + (np.arange(1, jobs) * total) // jobs
    cuts = np.searchsorted(run_end, targets, side="left") + 1
    edges = np.unique(np.concatenate(([0], np.minimum(cuts, n_runs), [n_runs])))
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def encode_on_threads(encoder, buf, sub_start, sub_end, sub_allow, groups, n_jobs):
    """The hash-routed path: ``(ids, run_start, run_out_end)`` as the sequential kernel gives them."""
    pool = thread_pool(n_jobs)
    stop = threading.Event()
    try:
        with encoder.borrow_route_caches(n_jobs) as route_caches:
            pieces = list(pool.map(
                lambda g: encoder.find_pieces(buf, sub_start[g[0]:g[1]], sub_end[g[0]:g[1]],
                                              sub_allow[g[0]:g[1]], route_caches),
                groups,
            ))
            misses = Misses.of(pieces)
            if misses.start.shape[0]:
                long_misses = misses.long_misses(buf)
                list(pool.map(
                    lambda task: (encoder.merge_long_miss(buf, misses, task, stop) if isinstance(task, list)
                                  else encoder.merge_misses(buf, misses, task, route_caches, stop)),
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
        lambda k: encoder.assemble(pieces[k], misses, int(first_miss[k]), out, int(out_at[k])), range(len(pieces))
    ))
    return out, np.concatenate([p.run_start for p in pieces]), np.concatenate(run_out_end)


def encode_groups_on_threads(encoder, buf, sub_start, sub_end, sub_allow, groups, n_jobs):
    """Without routing: each group runs all stages fused, with a piece cache of its own."""
    parts = list(thread_pool(n_jobs).map(
        lambda g: encoder.encode(buf, sub_start[g[0]:g[1]], sub_end[g[0]:g[1]], sub_allow[g[0]:g[1]]), groups
    ))
    return concatenate_groups(parts)


def encode_parts_on_threads(encoder, packed: PackedSegments, flags: np.ndarray, n_jobs: int,
                            splits_after_newline: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, segment_bounds)`` of ``packed``, encoded by this thread and ``n_jobs - 1`` pool threads
    taking parts from one ``SharedParts`` (each with a piece cache of its own). A pool thread that
    starts late (the pool busy with another call) finds fewer parts left, or none, and one that
    has not started when this thread has taken the last part is cancelled: nobody waits for a
    share decided in advance, nor for another call's work."""
    shared = SharedParts(encoder, packed, flags, FAN_OUT_PART_BYTES, splits_after_newline, SHRINK_PER_JOB * n_jobs)

    def work() -> int:
        if shared.parts_left() == 0:
            return 0  # no piece cache to borrow (or make) for nothing
        with encoder.piece_caches.borrow() as cache:
            return shared.work(cache)

    pool = thread_pool(n_jobs)
    helpers = [pool.submit(work) for _ in range(min(n_jobs, shared.n_parts) - 1)]
    try:
        work()
    finally:
        for helper in helpers:
            if not helper.cancel():
                helper.result()  # it took parts: every part is done once it has returned
    return shared.ids_and_bounds()


def concatenate_groups(parts):
    """Join per-group ``(ids, run_start, run_out_end)`` in order (``run_out_end`` shifted)."""
    shifts = np.cumsum([0] + [len(p[0]) for p in parts[:-1]])
    return (
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] + shift for p, shift in zip(parts, shifts)]),
    )


class SharedParts:
    """One call's text in parts that threads take one at a time, in compiled code (work sharing).

    The thread that makes it starts on the first part at once (``work``); another thread that
    becomes free later joins with ``work`` too and takes parts from where the others are, so
    neither waits for a share decided in advance. Used for an agent loop's turn, whose helper
    thread plans the call while the caller encodes the new text (``reuse.EncodeAhead``):
    once planned, the helper takes the parts the caller has not reached.

    Parts are groups of sub-strings (the tiktoken-safe cuts, long ones cut further where the
    pattern always cuts) of at least ``min_part_bytes`` and, with ``shrink``, 1/``shrink`` of the
    bytes left (large parts first, small ones last: ``encoder.group_into_parts``); each is
    encoded on its own as in any fan-out.
    """

    def __init__(self, encoder, packed: PackedSegments, flags: np.ndarray, min_part_bytes: int,
                 splits_after_newline: bool, shrink: int = 0) -> None:
        buf = packed.buf
        self.packed = packed
        self.encoder = encoder
        self.sub_start, self.sub_end, self.sub_allow, self.part_first = cut_into_parts(
            buf, packed.seg_start, packed.seg_end, packed.needs_cuts, packed.allow_special, flags, min_part_bytes,
            shrink, splits_after_newline)
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

    def work(self, cache, helper_words: np.ndarray = NO_HELPER) -> int:
        """Encode parts with this thread's piece ``cache`` until none is left to take (in one
        compiled call, without the GIL); returns how many this thread encoded. Parts taken by
        another thread may still be in progress when it returns: ``ids_and_bounds`` only after
        every worker has returned. ``helper_words``: a parked helper waiting for this thread to be
        in compiled code (``parking.ParkedHelper``)."""
        encoder = self.encoder
        return encode_claimed_parts(encoder.tables, encoder.specials, encoder.pretokenizer.table, self.packed.buf,
                                    self.sub_start, self.sub_end, self.sub_allow, self.part_first, self.counters,
                                    self.out, self.part_n_ids, self.sub_n_ids, cache, helper_words, SYS_FUTEX)

    def ids_and_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, segment_bounds)`` as ``Tokenizer._encode_fused`` gives them, once every thread's
        ``work`` has returned (wait for the others first: ``work`` returns when no part is left to
        take, while another thread may still be encoding its last one)."""
        if int(self.counters[PARTS_DONE]) != self.n_parts:
            raise RuntimeError("SharedParts.ids_and_bounds before every part was encoded")
        packed = self.packed
        return gather_parts(self.sub_start, self.part_first, self.out, self.part_n_ids, self.sub_n_ids,
                            packed.seg_end, packed.origin, packed.n_segments)
