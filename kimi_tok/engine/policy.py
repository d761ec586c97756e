"""``Policy``: every setting that decides how calls run, in one frozen object read once.

A Tokenizer reads its policy when it is made (``Policy.from_env``: the arguments given, else
the ``KIMI_TOK_*`` environment variables, else the defaults) and never looks at the
environment again. No setting changes an id: they decide how many threads a call uses,
from what size it fans out, whether the segment cache and encoding ahead are used. Tests
pass a policy (``Policy.from_env(...).replace(min_bytes_per_job=1)``) instead of patching
constants. The thresholds were measured on 2 and 16 cores: docs/performance.md.

>>> Policy.from_env(n_jobs=2).replace(segment_cache_bytes=0).n_jobs
2
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..native.futex import HAS_FUTEX

N_JOBS_ENV = "KIMI_TOK_N_JOBS"
BACKEND_ENV = "KIMI_TOK_BACKEND"
PARKED_HELPERS_ENV = "KIMI_TOK_PARKED_HELPERS"
CACHE_DIR_ENV = "KIMI_TOK_CACHE_DIR"
COLD_START_ENV = "KIMI_TOK_COLD_START"
BACKENDS = ("threads", "processes")
COLD_STARTS = ("background", "wait")
MAX_COMPILE_JOBS = 4
MAX_DEFAULT_JOBS = 8
DEFAULT_SEGMENT_CACHE_BYTES = 256 << 20


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def min_bytes_per_job_for(cores: int) -> int:
    """From how many bytes per job a call fans out in groups (hash routing, PCRE2 patterns) on ``cores``."""
    return 1 << 18 if cores <= 2 else 1 << 16


def short_call_chars_for(cores: int) -> int:
    """Up to how many characters a call is read in place on one thread (and skips the segment cache) on
    ``cores``: on two, one thread was faster than planning, packing and fanning out up to ~128k characters
    (docs/performance.md, "Short calls up to 128k characters"); more cores share a fan-out in smaller shares."""
    return 1 << 17 if cores <= 2 else 1 << 16


def short_call_bytes_for(cores: int) -> int:
    """How much UTF-8 a call read in place may have on ``cores`` (``short_call_chars_for``)."""
    return 3 << 16 if cores <= 2 else 1 << 17


def shared_in_place_chars_for(cores: int) -> int:
    """Up to how many characters a call the segment cache encodes afresh is read in place and shared with the
    short-call helper on ``cores``: on two, that beat packing and fanning out at every size measured, up to 3.1M
    characters, and longer calls pack on two threads (docs/performance.md, "Fresh cached calls read in place"); on
    more, a fan-out has more threads than two."""
    return 1 << 22 if cores <= 2 else 0


def _positive_int_env(name: str) -> int | None:
    value = os.environ.get(name)
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{name}={value!r}: expected a positive integer")
    return n


def _default_cache_dir() -> Path:
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "kimi_tok")


@dataclass(frozen=True)
class Policy:
    """How a Tokenizer's calls run; the ids are the same whatever these are.

    ``n_jobs``: threads (or processes) one long call may use; ``backend``: ``"threads"`` or
    ``"processes"``; ``hash_routing``: route unknown pieces by hash over the threads so each
    distinct one is merged once per call; ``segment_cache_bytes``: budget of the exact segment
    cache (0: off); ``parked_helpers``: helpers wait on a futex in compiled code (Linux): the agent
    loop's (else in an executor) and the one that shares long short calls (else there is none);
    ``helpers``: how many agent-loop calls at once get a helper;
    ``cold_start`` and ``compile_jobs``: what a Tokenizer does where the kernels are not compiled
    yet, and how many processes compile them. The rest are the thresholds of the fan-outs and of
    encoding ahead.
    """

    n_jobs: int = field(default_factory=lambda: max(1, min(MAX_DEFAULT_JOBS, usable_cores())))
    backend: str = "threads"
    hash_routing: bool = False
    segment_cache_bytes: int = DEFAULT_SEGMENT_CACHE_BYTES
    # shorter calls skip the segment cache: read in place on one thread, a fresh one costs less than planned
    min_cached_call_chars: int = field(default_factory=lambda: short_call_chars_for(usable_cores()))
    # calls up to this long are read in place, not packed (native.cpython) ...
    max_joined_call_chars: int = field(default_factory=lambda: short_call_chars_for(usable_cores()))
    # ... if they have less UTF-8 than this, or than a packed call fans out from
    max_joined_call_bytes: int = field(default_factory=lambda: short_call_bytes_for(usable_cores()))
    # such calls with this much UTF-8 or more share their parts with a helper thread parked in compiled code
    # (parked_helpers, n_jobs > 1, threads: engine.short_calls) ...
    min_shared_short_call_bytes: int = 24 << 10
    short_call_part_bytes: int = 1 << 12  # ... in parts of at least this size ...
    short_call_part_shrink: int = 8  # ... and 1/short_call_part_shrink of the text left
    # the segment cache's new segments, up to this many characters, are read in place and shared that way too
    max_shared_in_place_chars: int = field(default_factory=lambda: shared_in_place_chars_for(usable_cores()))
    parked_helpers: bool = HAS_FUTEX
    helpers: int = field(default_factory=lambda: max(1, usable_cores() // 2))
    cache_dir: Path = field(default_factory=_default_cache_dir)  # the BPE tables built per vocabulary
    # where kimi_tok's kernels are not compiled yet (the first use after an install): "background" answers
    # calls on the interpreted engine while worker processes compile them, "wait" waits for those processes;
    # where they are cached but this process has not loaded numba yet, "background" answers calls of up to
    # interpreted_chars_while_loading characters that way while a thread loads them (longer ones wait)
    cold_start: str = "background"
    interpreted_chars_while_loading: int = 1 << 17
    compile_jobs: int = field(default_factory=lambda: max(1, min(MAX_COMPILE_JOBS, usable_cores() - 1)))
    # fan-outs of one call over threads
    min_bytes_per_shared_job: int = 1 << 15  # shared parts (the Kimi scanner): fans out from this per job
    fan_out_part_bytes: int = 1 << 15  # a part holds at least this much text ...
    shrink_per_job: int = 4  # ... and 1/(shrink_per_job * n_jobs) of the text left (guided) ...
    max_part_bytes: int = 1 << 20  # ... up to this much: a caller in compiled code sees Ctrl-C soon
    min_bytes_per_job: int = field(default_factory=lambda: min_bytes_per_job_for(usable_cores()))  # groups
    groups_per_job: int = 4  # smaller groups even out text that costs more per byte (CJK, long runs)
    min_bytes_per_process_job: int = 1 << 20  # processes pay for the text file and pickled ids
    unit_bytes: int = 1 << 18  # long sub-strings are split (where provably safe) into units this long
    # calls this long transcode their texts on n_jobs threads; None: by the CPU (Engine.min_parallel_pack_chars)
    min_parallel_pack_chars: int | None = None
    merge_slice_bytes: int = 1 << 20  # hash routing merges this much at a time, so Ctrl-C stops it soon
    # encoding an agent loop's new turn ahead while a helper plans the call (reuse.encode_ahead)
    min_ahead_plan_chars: int = 1 << 18  # characters of the recent call the new one extends
    min_ahead_chars: int = 1 << 12  # characters of new text (up to 2 * min_bytes_per_job)
    min_shared_bytes: int = 1 << 15  # from this much new text the caller and helper share parts ...
    shared_part_bytes: int = 1 << 11  # ... of at least this size ...
    shared_part_shrink: int = 4  # ... and 1/shared_part_shrink of the text left
    new_ids_per_byte: float = 0.5  # the share of the output a helper faults in ahead, per byte of new text
    min_reused_ids: int = 1 << 18  # outputs shorter than this are not reused between calls
    output_headroom: float = 1.25  # a reused output's block is this much longer than the output

    def __post_init__(self) -> None:
        for name in ("n_jobs", "helpers", "compile_jobs", "interpreted_chars_while_loading", "max_joined_call_bytes",
                     "min_bytes_per_shared_job", "fan_out_part_bytes", "shrink_per_job", "min_bytes_per_job",
                     "groups_per_job", "min_bytes_per_process_job", "unit_bytes", "merge_slice_bytes",
                     "min_ahead_plan_chars", "min_ahead_chars", "min_shared_bytes", "shared_part_bytes",
                     "shared_part_shrink", "min_reused_ids", "min_shared_short_call_bytes", "short_call_part_bytes",
                     "short_call_part_shrink"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: expected one of {', '.join(map(repr, BACKENDS))}")
        if self.cold_start not in COLD_STARTS:
            raise ValueError(f"cold_start={self.cold_start!r}: expected one of {', '.join(map(repr, COLD_STARTS))}")
        for name in ("hash_routing", "parked_helpers"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, not {type(getattr(self, name)).__name__}")
        value = self.segment_cache_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"segment_cache_bytes must be a non-negative int or None, not {value!r}")
        value = self.min_parallel_pack_chars
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"min_parallel_pack_chars must be a positive int or None, not {value!r}")
        for name in ("min_cached_call_chars", "max_joined_call_chars", "max_shared_in_place_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, not {value!r}")
        if self.parked_helpers and not HAS_FUTEX:
            object.__setattr__(self, "parked_helpers", False)  # no futexes here: executor helpers
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))

    @classmethod
    def from_env(cls, n_jobs: int | None = None, segment_cache_bytes: int | None = DEFAULT_SEGMENT_CACHE_BYTES,
                 backend: str | None = None, hash_routing: bool = False, **settings) -> "Policy":
        """A policy from these arguments, else ``KIMI_TOK_N_JOBS``, ``KIMI_TOK_BACKEND``,
        ``KIMI_TOK_PARKED_HELPERS`` (``0``: executor helpers), ``KIMI_TOK_COLD_START`` and
        ``KIMI_TOK_CACHE_DIR``, else the defaults. ``segment_cache_bytes=None`` is 0 (no cache)."""
        if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1):
            raise ValueError(f"n_jobs must be a positive int or None, not {n_jobs!r}")
        if n_jobs is None:
            n_jobs = _positive_int_env(N_JOBS_ENV)
        if n_jobs is not None:
            settings["n_jobs"] = n_jobs
        if backend is None:
            env_backend = os.environ.get(BACKEND_ENV)
            if env_backend and env_backend not in BACKENDS:
                raise ValueError(f"{BACKEND_ENV}={env_backend!r}: expected one of {', '.join(map(repr, BACKENDS))}")
            backend = env_backend or "threads"
        if "parked_helpers" not in settings and os.environ.get(PARKED_HELPERS_ENV, "1") == "0":
            settings["parked_helpers"] = False
        if "cold_start" not in settings and os.environ.get(COLD_START_ENV):
            settings["cold_start"] = os.environ[COLD_START_ENV]
            if settings["cold_start"] not in COLD_STARTS:
                raise ValueError(f"{COLD_START_ENV}={settings['cold_start']!r}: expected one of "
                                 f"{', '.join(map(repr, COLD_STARTS))}")
        if segment_cache_bytes is None:
            segment_cache_bytes = 0
        return cls(backend=backend, hash_routing=hash_routing, segment_cache_bytes=segment_cache_bytes, **settings)

    def replace(self, **changes) -> "Policy":
        """A copy with ``changes`` (checked like a new policy)."""
        return dataclasses.replace(self, **changes)
