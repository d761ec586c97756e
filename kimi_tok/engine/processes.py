"""The process backend: joblib's loky pool encodes groups of sub-strings in worker processes.

Nothing large is pickled per call:

- the BPE tables are saved once per vocabulary as ``.npy`` files and memory-mapped
  by every worker (``bpe.save_mappable_tables`` / ``bpe.map_tables``): the pages
  are shared through the OS page cache, and a worker builds its ``SubstringEncoder``
  once and keeps it (with its warm piece caches) for later calls;
- the call's UTF-8 text is written once to a file in shared memory (``/dev/shm``
  where there is one) that the workers map; only the group bounds travel.

The pool is a loky executor of kimi_tok's own, kept warm between calls (idle workers exit
after ``IDLE_SECONDS``). Each worker returns its group's ids, which the caller
concatenates in order.
"""

from __future__ import annotations

import os
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..pipeline import bpe
from ..pipeline.assembly import SubstringEncoder
from .threads import concatenate_groups

IDLE_SECONDS = 300  # a warm pool's workers exit after this long without work
SHARED_MEMORY_DIR = Path("/dev/shm")

_pool_lock = threading.Lock()
_pool_workers = 0
_pool = None  # the warm loky executor (process_pool)
_encoders: dict["EncoderSpec", SubstringEncoder] = {}  # in a worker: one per vocabulary, built once


class EncoderSpec(NamedTuple):
    """What a worker needs to build a ``SubstringEncoder`` (small, hashable, picklable)."""

    tables_dir: str
    special_tokens: tuple[tuple[str, int], ...]
    pattern: str

    @classmethod
    def of(cls, tables: bpe.BpeTables, special_tokens: dict[str, int], pattern: str, cache_dir: Path) -> "EncoderSpec":
        return cls(str(bpe.save_mappable_tables(tables, cache_dir)), tuple(sorted(special_tokens.items())), pattern)


def worker_encoder(spec: EncoderSpec) -> SubstringEncoder:
    """This process's encoder for ``spec`` (built on first use from the mapped tables)."""
    encoder = _encoders.get(spec)
    if encoder is None:
        encoder = SubstringEncoder(bpe.map_tables(Path(spec.tables_dir)), dict(spec.special_tokens), spec.pattern)
        _encoders[spec] = encoder
    return encoder


def _map_text(path: str) -> np.ndarray:
    # copy-on-write keeps the writable array type the compiled kernels were built for
    return np.asarray(np.memmap(path, dtype=np.uint8, mode="c"))


def encode_group(spec: EncoderSpec, text_path: str, sub_start, sub_end, sub_allow):
    """Run in a worker: ``(ids, run_start, run_out_end)`` of one group."""
    return worker_encoder(spec).encode(_map_text(text_path), sub_start, sub_end, sub_allow)


@contextmanager
def shared_text(buf: np.ndarray):
    """The path of a file holding ``buf`` (in shared memory when the OS has it), removed after."""
    folder = SHARED_MEMORY_DIR if SHARED_MEMORY_DIR.is_dir() and os.access(SHARED_MEMORY_DIR, os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix="kimi_tok_text_", suffix=".u8", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(memoryview(buf))
        yield path
    finally:
        os.unlink(path)


def process_pool(n_workers: int):
    """kimi_tok's own loky executor with at least ``n_workers`` workers (never shrunk by a smaller call;
    replaced when broken, e.g. after a worker was killed). Not loky's reusable singleton, which joblib
    reuses and expects to have made itself."""
    global _pool, _pool_workers
    with _pool_lock:
        # imported under the lock: joblib imported by two threads at once (a call and the warm-up's
        # thread) can see a partly initialized module
        from joblib.externals.loky import ProcessPoolExecutor

        if _pool is None or n_workers > _pool_workers or _pool._flags.broken is not None or _pool._flags.shutdown:
            old, _pool_workers = _pool, max(_pool_workers, n_workers)
            _pool = ProcessPoolExecutor(max_workers=_pool_workers, timeout=IDLE_SECONDS)
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def encode_on_processes(spec: EncoderSpec, buf, sub_start, sub_end, sub_allow, groups, n_jobs):
    """Each group on a worker process: ``(ids, run_start, run_out_end)`` in input order."""
    pool = process_pool(n_jobs)
    with shared_text(buf) as path:
        futures = [pool.submit(encode_group, spec, path, sub_start[a:b], sub_end[a:b], sub_allow[a:b])
                   for a, b in groups]
        try:
            parts = [f.result() for f in futures]
        finally:
            for f in futures:  # after an error or Ctrl-C: drop what has not started
                f.cancel()
    return concatenate_groups(parts)
