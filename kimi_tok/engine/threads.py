"""Fan-out of one long call over threads (the compiled stages release the GIL).

- shared parts (the default with the Kimi scanner): this thread and ``n_jobs - 1`` pool
  threads take parts of the call from one ``parts.SharedParts`` (``encode_parts_on_threads``);
- groups (PCRE2 patterns): contiguous groups of sub-strings of about equal bytes
  (``split_spans``), each encoded whole by one pool thread with a piece cache of its own
  (``encode_groups_on_threads``), the ids concatenated in order.

Why not ``joblib.Parallel`` for one call: its result loop polls every 10 ms, about the time
of a whole million-token encode on 16 cores; a warm ``ThreadPoolExecutor`` costs ~0.1 ms.
``joblib.Parallel`` is used where calls are long: corpora (``kimi_tok.corpus``).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..pipeline.segments import PackedSegments, utf8_of
from .parts import SharedParts
from .policy import Policy

class GrowingPool:
    """A process-wide thread pool made on first use, replaced by a larger one when a call needs more
    workers (the old one finishes its work) and made again in a forked child, which has none of its
    parent's threads."""

    def __init__(self, thread_name_prefix: str) -> None:
        self.prefix = thread_name_prefix
        self._pool: ThreadPoolExecutor | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def get(self, n_workers: int) -> ThreadPoolExecutor:
        with self._lock:
            if self._pid != os.getpid():
                self._pool = None
            if self._pool is None or self._pool._max_workers < n_workers:
                old = self._pool
                self._pool = ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix=self.prefix)
                self._pid = os.getpid()
                if old is not None:
                    old.shutdown(wait=False)
            return self._pool


_pool = GrowingPool("kimi_tok")


def thread_pool(n_workers: int) -> ThreadPoolExecutor:
    """The engine's pool of at least ``n_workers`` threads, kept warm between calls."""
    return _pool.get(n_workers)


def split_spans(sub_start: np.ndarray, sub_end: np.ndarray, n_jobs: int, min_bytes_per_job: int,
                groups_per_job: int) -> list[tuple[int, int]]:
    """Contiguous sub-string ranges ``[(s0, s1), ...]`` of about equal total bytes, up to ``groups_per_job``
    per job and none under ``min_bytes_per_job`` (one range if ``n_jobs == 1`` or the input is short)."""
    n_subs = sub_start.shape[0]
    total = int(sub_end[-1] - sub_start[0]) if n_subs else 0
    jobs = 1 if n_jobs == 1 else min(n_jobs * groups_per_job, max(1, total // min_bytes_per_job), n_subs)
    if jobs <= 1:
        return [(0, n_subs)]
    targets = sub_start[0] + (np.arange(1, jobs) * total) // jobs
    cuts = np.searchsorted(sub_end, targets, side="left") + 1
    edges = np.unique(np.concatenate(([0], np.minimum(cuts, n_subs), [n_subs])))
    return [(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def encode_groups_on_threads(encoder, buf, sub_start, sub_end, sub_allow, groups, n_jobs):
    """Without routing: each group runs all stages fused, with a piece cache of its own."""
    parts = list(thread_pool(n_jobs).map(
        lambda g: encoder.encode(buf, sub_start[g[0]:g[1]], sub_end[g[0]:g[1]], sub_allow[g[0]:g[1]]), groups
    ))
    return concatenate_groups(parts)


def encode_parts_on_threads(encoder, packed: PackedSegments, flags: np.ndarray, n_jobs: int,
                            splits_after_newline: bool, policy: Policy) -> SharedParts:
    """``packed`` encoded by this thread and ``n_jobs - 1`` pool threads taking parts from one
    ``SharedParts`` (each with a piece cache of its own), returned with every part done (its
    ``ids_and_bounds`` gathers the ids, as often as asked). A pool thread that
    starts late (the pool busy with another call) finds fewer parts left, or none, and one that
    has not started when this thread has taken the last part is cancelled: nobody waits for a
    share decided in advance, nor for another call's work."""
    shared = SharedParts(encoder, packed, flags, policy.fan_out_part_bytes, splits_after_newline,
                         policy.shrink_per_job * n_jobs, policy.max_part_bytes)

    def work() -> int:
        if shared.parts_left() == 0:
            return 0  # no piece cache to borrow (or make) for nothing
        with encoder.piece_caches.borrow() as cache:
            return shared.work(cache)

    pool = thread_pool(n_jobs)
    helpers = [pool.submit(work) for _ in range(min(n_jobs, shared.n_parts) - 1)]
    try:
        work()
    except BaseException:  # Ctrl-C or an error: the helpers stop after their part
        shared.stop()
        raise
    finally:
        for helper in helpers:
            if not helper.cancel():
                helper.result()  # it took parts: every part is done once it has returned
    return shared


def utf8_on_threads(texts: list[str], n_jobs: int, min_chars: int) -> list:
    """``utf8_of`` of each text, the long ones shared with ``n_jobs - 1`` pool threads, longest first,
    to whichever thread has the fewest characters so far. The long ones are transcoded without the GIL,
    so the threads overlap there (``segments.utf8_of``); the others are done on this thread."""
    out: list = [None] * len(texts)
    shares: list[list[int]] = [[] for _ in range(n_jobs)]
    loads = [0] * n_jobs
    for i in sorted((i for i, text in enumerate(texts) if len(text) >= min_chars), key=lambda i: -len(texts[i])):
        least = loads.index(min(loads))
        shares[least].append(i)
        loads[least] += len(texts[i])

    def convert(indices) -> None:
        for i in indices:
            out[i] = utf8_of(texts[i])

    pool = thread_pool(n_jobs)
    helpers = [(pool.submit(convert, share), share) for share in shares[1:] if share]
    try:
        convert(shares[0])
        convert(i for i, text in enumerate(texts) if len(text) < min_chars)
    except BaseException:
        for helper, _ in helpers:
            if not helper.cancel():
                helper.exception()  # wait: it writes into ``out`` and reads the texts
        raise
    for helper, share in helpers:
        if helper.cancel():
            convert(share)  # not started (the pool is busy with another call): done here
        else:
            helper.result()  # raises what it raised (UnicodeEncodeError: a lone surrogate)
    return out


def concatenate_groups(parts):
    """Join per-group ``(ids, run_start, run_out_end)`` in order (``run_out_end`` shifted)."""
    shifts = np.cumsum([0] + [len(p[0]) for p in parts[:-1]])
    return (
        np.concatenate([p[0] for p in parts]),
        np.concatenate([p[1] for p in parts]),
        np.concatenate([p[2] + shift for p, shift in zip(parts, shifts)]),
    )
