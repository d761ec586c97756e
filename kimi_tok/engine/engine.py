"""The engine: how one call runs, decided from its size and the ``Policy``.

``Engine.encode_packed`` picks one of:

* fused: no fan-out (one job, or too little text for two): chunking -> run cuts -> specials
  -> scanner -> BPE as one compiled call (``pipeline.assembly.encode_packed_fused``; a short call
  that needs no segment bounds is read in place rather than packed: ``encode_pairs_fused``; a long one
  shares its parts with a helper thread parked in compiled code: ``short_calls``);
* shared parts (threads, the Kimi scanner): this thread and pool threads take parts of the
  call from an atomic counter (``threads.encode_parts_on_threads``);
* groups (threads, a PCRE2 pattern), hash-routed groups (``hash_routing``) or worker
  processes (``backend="processes"``): the tiktoken-safe cuts first, long sub-strings cut
  after newlines where provably safe, then contiguous groups, one per task.

Every path gives the ids of the sequential kernel: after the tiktoken-safe cuts the
sub-strings are independent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import NamedTuple

import numpy as np

from ..native.simd import kernels_have_byte_compress
from ..pipeline.assembly import ID_DTYPE, SubstringEncoder
from ..pipeline.bpe import BpeTables
from ..pipeline.chunking import cut_chunks, cut_substrings
from ..pipeline.pretokenize.kimi_scanner import split_at_safe_points
from ..pipeline.pretokenize.unicode_classes import code_point_flags
from ..pipeline.segments import (TRANSCODED_MIN_CHARS, PackedSegments, pack_segments, segment_bounds,
                                 validate_segments)
from .parts import SharedParts
from .policy import Policy
from .processes import EncoderSpec, encode_on_processes
from .routing import HashRouter, encode_on_threads
from .short_calls import ShortCallHelper, shares_short_calls
from .threads import encode_groups_on_threads, encode_parts_on_threads, split_spans, utf8_on_threads


class Encoded(NamedTuple):
    """What a call produced: all its ids (``ids``), or, for a count, None and ``n_ids``."""

    ids: np.ndarray | None
    n_ids: int


NO_IDS = np.empty(0, dtype=ID_DTYPE)
NO_BOUNDS = np.zeros(1, dtype=np.int64)
MAX_UTF8_BYTES_PER_CHAR = 4  # so a text of n characters has at most 4n bytes, and 4n ids
NO_BYTE_LIMIT = np.iinfo(np.int64).max  # max_fused_bytes of one job: any call runs fused
# From how many characters a call's texts are transcoded on threads rather than in one compiled pass: where one
# pass is 16 characters a step (AVX-512 VBMI2) it was faster up to ~6M characters, elsewhere up to ~2.5M
# (docs/performance.md, "One pass up to a few million characters")
PARALLEL_PACK_CHARS = {True: 1 << 22, False: 1 << 21}


class Engine:
    """The stages of one vocabulary (``SubstringEncoder``) and the policy that decides how a call
    runs over them; shared by threads (the compiled stages release the GIL)."""

    def __init__(self, tables: BpeTables, special_tokens: dict[str, int], pattern: str, policy: Policy) -> None:
        self.policy = policy
        self.min_parallel_pack_chars = (policy.min_parallel_pack_chars
                                        or PARALLEL_PACK_CHARS[kernels_have_byte_compress()])
        self.flags = code_point_flags()
        self.stages = SubstringEncoder(tables, special_tokens, pattern)
        self.fuses = self.stages.fuses  # whether calls can run as one compiled call (the compiled Kimi scanner)
        self._special_tokens = special_tokens
        self._pattern = pattern
        self._router = HashRouter(self.stages, policy.merge_slice_bytes)
        self._worker_spec: EncoderSpec | None = None  # built on the first call on processes
        # long sub-strings may be split after newlines only where that provably changes no piece
        self.splits_after_newline = self.stages.pretokenizer.splits_after_newline and not any(
            "\n" in text for text in special_tokens
        )
        # long short calls shared with a thread parked in compiled code (its thread starts with the first one)
        self.short_call_helper = ShortCallHelper(self.stages, policy, self.splits_after_newline) \
            if shares_short_calls(policy, self.fuses) else None

    def pack(self, segments: Sequence, tiktoken_safe: bool, validated: bool = False) -> PackedSegments:
        """``segments`` validated (unless ``validated``) and packed into one UTF-8 buffer; a long call's
        texts are transcoded on ``n_jobs`` threads (``threads.utf8_on_threads``)."""
        if not validated:
            segments = validate_segments(segments)
        policy = self.policy
        utf8 = None
        if policy.n_jobs > 1 and policy.backend == "threads" and \
                sum(len(text) for text, _ in segments) >= self.min_parallel_pack_chars:
            utf8 = partial(utf8_on_threads, n_jobs=policy.n_jobs, min_chars=TRANSCODED_MIN_CHARS)
        return pack_segments(segments, tiktoken_safe, self.flags, validated=True, utf8=utf8)

    def encode(self, segments: Sequence, tiktoken_safe: bool, want_ids: bool = True, validated: bool = False,
               joins: bool = True) -> Encoded:
        """All ids of ``segments`` (validated here unless ``validated``), without any reuse across calls;
        ``joins``: try ``encode_short`` first (False: the caller already did)."""
        if joins:
            short = self.encode_short(segments, tiktoken_safe, want_ids, self.policy.max_joined_call_chars)
            if short is not None:
                return short
        ids = self.encode_packed(self.pack(segments if validated else validate_segments(segments), tiktoken_safe,
                                           validated=True), with_bounds=False)[0]
        return Encoded(ids if want_ids else None, len(ids))

    def encode_short(self, segments: Sequence, tiktoken_safe: bool, want_ids: bool, max_chars: int) -> Encoded | None:
        """``encode`` of a call of at most ``max_chars`` characters that runs as one compiled call
        (``short_call_ids``); None for any other call, which nothing was done for."""
        ids = self.short_call_ids(segments, tiktoken_safe, max_chars, self.max_short_call_bytes())
        if ids is None:
            return None
        return Encoded(ids if want_ids else None, len(ids))

    def short_call_ids(self, segments: Sequence, tiktoken_safe: bool, max_chars: int,
                       max_bytes: int) -> np.ndarray | None:
        """The ids of a call of at most ``max_chars`` characters and less than ``max_bytes`` of UTF-8 that runs as
        one compiled call, its segments read in place (``SubstringEncoder.encode_pairs``; a long one shared with
        ``short_call_helper``); None for any other call, which nothing was done for."""
        if not self.fuses or (type(segments) is not list and type(segments) is not tuple):
            return None
        return self.stages.encode_pairs(tuple(segments), max_chars, max_bytes, tiktoken_safe, self.short_call_helper)

    def shared_in_place_ids(self, segments: Sequence, tiktoken_safe: bool):
        """``encode_with_regather`` of validated ``segments`` of at most ``Policy.max_shared_in_place_chars``
        characters, read in place and shared with ``short_call_helper``: ``(ids, bounds, regather)``; None (nothing
        done) where there is no helper, or for a longer call or lone surrogates."""
        if self.short_call_helper is None or not segments:
            return None
        max_chars = self.policy.max_shared_in_place_chars
        return self.stages.encode_pairs_with_bounds(tuple(segments), max_chars, MAX_UTF8_BYTES_PER_CHAR * max_chars + 1,
                                                    tiktoken_safe, self.short_call_helper)

    def short_call_limits(self) -> tuple[int, int]:
        """``(max_chars, max_bytes)`` of the calls ``encode`` tries as short calls (``short_call_ids``)."""
        return self.policy.max_joined_call_chars, self.max_short_call_bytes()

    def max_short_call_bytes(self) -> int:
        """Short calls have less UTF-8 than this: than ``Policy.max_joined_call_bytes``, or than a packed call
        would fan out from (``max_fused_bytes``), whichever is more."""
        return max(self.policy.max_joined_call_bytes, self.max_fused_bytes())

    def encode_with_bounds(self, segments: Sequence, tiktoken_safe: bool, n_jobs: int | None = None,
                           validated: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, bounds)``: segment ``i``'s ids are ``ids[bounds[i]:bounds[i + 1]]``."""
        if not segments:
            return NO_IDS.copy(), NO_BOUNDS.copy()
        return self.encode_packed(self.pack(segments, tiktoken_safe, validated), n_jobs)

    def encode_with_regather(self, segments: Sequence, tiktoken_safe: bool,
                             validated: bool = False) -> tuple[np.ndarray, np.ndarray, Callable[[], np.ndarray] | None]:
        """``encode_with_bounds`` and, when the call shared parts among threads, a function that gathers
        its ids again into a new array from memory only the engine holds: a copy that writes to
        ``ids`` never reach, which another thread can make after the call has returned. None otherwise."""
        if not segments:
            return NO_IDS.copy(), NO_BOUNDS.copy(), None
        return self.encode_packed(self.pack(segments, tiktoken_safe, validated), regather=True)

    def encode_packed(self, packed: PackedSegments, n_jobs: int | None = None, timings: dict | None = None,
                      with_bounds: bool = True, regather: bool = False):
        """Run the compiled stages over packed segments; returns ``(ids, segment_bounds)``
        (``segment_bounds`` is None unless ``with_bounds``). ``timings``: seconds per stage are
        recorded there (the stages then run one by one). ``regather``: a third item, as
        ``encode_with_regather`` gives it."""
        policy = self.policy
        n_jobs = policy.n_jobs if n_jobs is None else n_jobs
        clock = StageClock(timings)
        buf = packed.buf
        threads = policy.backend == "threads"
        shares_parts = timings is None and self.fuses and threads and not policy.hash_routing
        if timings is None and self.runs_fused(buf.shape[0], n_jobs):
            return self.encode_fused(packed, with_bounds) + ((None,) if regather else ())
        min_bytes = self._min_bytes_per_job(shares_parts)
        if shares_parts:
            shared = encode_parts_on_threads(self.stages, packed, self.flags, n_jobs, self.splits_after_newline,
                                             policy)
            ids, bounds = shared.ids_and_bounds()
            if regather:
                return ids, (bounds if with_bounds else None), lambda: shared.ids_and_bounds()[0]
            return ids, (bounds if with_bounds else None)
        chunk_start, chunk_end, chunk_segment = cut_chunks(buf, packed.seg_start, packed.seg_end, packed.needs_cuts)
        clock.lap("chunking")
        sub_start, sub_end, sub_chunk = cut_substrings(buf, chunk_start, chunk_end,
                                                       packed.needs_cuts[chunk_segment], self.flags)
        sub_allow = packed.allow_special[chunk_segment[sub_chunk]]
        clock.lap("run cuts")
        if n_jobs > 1 and self.splits_after_newline and buf.shape[0] >= 2 * min_bytes:
            sub_start, sub_end, sub_allow = split_at_safe_points(buf, sub_start, sub_end, sub_allow,
                                                                 min(policy.unit_bytes, min_bytes))
        groups = split_spans(sub_start, sub_end, n_jobs, min_bytes, policy.groups_per_job)
        if len(groups) == 1:
            ids, run_start, run_out_end = self.stages.encode(buf, sub_start, sub_end, sub_allow, clock)
        elif threads:
            if policy.hash_routing:
                ids, run_start, run_out_end = encode_on_threads(self._router, buf, sub_start, sub_end, sub_allow,
                                                                groups, n_jobs)
            else:
                ids, run_start, run_out_end = encode_groups_on_threads(self.stages, buf, sub_start, sub_end,
                                                                       sub_allow, groups, n_jobs)
        else:
            ids, run_start, run_out_end = encode_on_processes(self.worker_spec(), buf, sub_start, sub_end, sub_allow,
                                                              groups, n_jobs)
        if len(groups) > 1:
            clock.lap(f"specials+pretokenize+bpe ({policy.backend})")
        return (ids, (segment_bounds(packed, run_start, run_out_end) if with_bounds else None)) + \
            ((None,) if regather else ())

    def runs_fused(self, n_bytes: int, n_jobs: int | None = None) -> bool:
        """Whether a call of ``n_bytes`` of text on ``n_jobs`` runs as one compiled call (no fan-out)."""
        return self.fuses and n_bytes < self.max_fused_bytes(n_jobs)

    def max_fused_bytes(self, n_jobs: int | None = None) -> int:
        """Calls of fewer bytes of text than this on ``n_jobs`` need no fan-out."""
        policy = self.policy
        if (policy.n_jobs if n_jobs is None else n_jobs) == 1:
            return NO_BYTE_LIMIT
        shares_parts = policy.backend == "threads" and not policy.hash_routing
        return 2 * self._min_bytes_per_job(shares_parts)

    def _min_bytes_per_job(self, shares_parts: bool) -> int:
        policy = self.policy
        if policy.backend != "threads":
            return policy.min_bytes_per_process_job
        return policy.min_bytes_per_shared_job if shares_parts else policy.min_bytes_per_job

    def encode_fused(self, packed: PackedSegments, with_bounds: bool = True):
        """``encode_packed`` for a call that needs no fan-out, as one compiled call."""
        out = np.empty(packed.buf.shape[0], dtype=ID_DTYPE)  # an id covers >= 1 byte
        n, run_start, run_out_end = self.stages.encode_packed(
            packed.buf, packed.seg_start, packed.seg_end, packed.needs_cuts, packed.allow_special, self.flags, out
        )
        out.resize((n,), refcheck=False)  # shrinks in place: no copy of the ids
        return out, (segment_bounds(packed, run_start, run_out_end) if with_bounds else None)

    def shared_parts(self, packed: PackedSegments, min_part_bytes: int, shrink: int = 0) -> SharedParts:
        """``packed`` cut into parts that threads take one at a time (``SharedParts.work``)."""
        return SharedParts(self.stages, packed, self.flags, min_part_bytes, self.splits_after_newline, shrink,
                           self.policy.max_part_bytes)

    def worker_spec(self) -> EncoderSpec:
        """What a worker process needs to build these stages (the tables saved to be memory-mapped)."""
        if self._worker_spec is None:
            self._worker_spec = EncoderSpec.of(self.stages.tables, self._special_tokens, self._pattern,
                                               self.policy.cache_dir)
        return self._worker_spec

    def profile(self, segments: Sequence, tiktoken_safe: bool, n_jobs: int) -> dict[str, float]:
        """Seconds spent per stage for one call (stages run one by one)."""
        timings: dict[str, float] = {}
        start = time.perf_counter()
        packed = self.pack(segments, tiktoken_safe)
        timings["segments"] = time.perf_counter() - start
        self.encode_packed(packed, n_jobs, timings)
        return timings


class StageClock:
    """Records seconds per stage into ``timings`` when profiling; free otherwise."""

    __slots__ = ("timings", "last")

    def __init__(self, timings: dict | None) -> None:
        self.timings = timings
        self.last = time.perf_counter() if timings is not None else 0.0

    def __bool__(self) -> bool:
        """Whether stages are timed (the encoder then runs them one by one)."""
        return self.timings is not None

    def lap(self, stage: str) -> None:
        if self.timings is not None:
            now = time.perf_counter()
            self.timings[stage] = now - self.last
            self.last = now
