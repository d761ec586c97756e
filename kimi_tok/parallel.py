"""Fan-out of one call over threads: the compiled stages release the GIL.

After the tiktoken-safe cuts, sub-strings are independent for every later stage,
and long ones can be cut further where the Kimi pattern always cuts
(``pretokenize.split_at_safe_points``). A long prompt's units are split into
contiguous groups of about equal bytes, each group is encoded by one thread, and
the groups' ids are concatenated in order: the result is the sequential one.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

N_JOBS_ENV = "KIMI_TOK_N_JOBS"
# Measured on 2 cores, fresh prompts, empty piece caches, n_jobs 2 vs 1 (with units split after newlines):
# 0.3M chars 1.01x, 0.6M 1.18x, 1.0M 1.51x, 1.6M 1.35x, 2.4M 1.55x, 4M 1.60x; with 128 KB per job 0.3M and
# 0.6M got slower (0.89x, 0.96x), so a call fans out from 256 KB per job.
MIN_BYTES_PER_JOB = 1 << 18
UNIT_BYTES = 1 << 18  # long sub-strings are split (where provably safe) into units of about this size
GROUPS_PER_JOB = 4  # smaller groups even out text that costs more per byte (CJK, long runs)

_pool: ThreadPoolExecutor | None = None
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
    return max(1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))



def check_n_jobs(n_jobs) -> int:
    if n_jobs is None:
        return default_n_jobs()
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1:
        raise ValueError(f"n_jobs must be a positive int or None, not {n_jobs!r}")
    return n_jobs


def thread_pool(n_workers: int) -> ThreadPoolExecutor:
    """A process-wide pool, grown on demand and kept warm between calls."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < n_workers:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="kimi_tok")
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def split_spans(run_start: np.ndarray, run_end: np.ndarray, n_jobs: int) -> list[tuple[int, int]]:
    """Contiguous run ranges ``[(r0, r1), ...]`` of about equal total bytes (one if ``n_jobs == 1``)."""
    n_runs = run_start.shape[0]
    total = int(run_end[-1] - run_start[0]) if n_runs else 0
    jobs = 1 if n_jobs == 1 else min(n_jobs * GROUPS_PER_JOB, max(1, total // MIN_BYTES_PER_JOB), n_runs)
    if jobs <= 1:
        return [(0, n_runs)]
    targets = run_start[0] + (np.arange(1, jobs) * total) // jobs
    cuts = np.searchsorted(run_end, targets, side="left") + 1
    edges = np.unique(np.concatenate(([0], np.minimum(cuts, n_runs), [n_runs])))
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]
