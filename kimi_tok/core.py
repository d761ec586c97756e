"""The public facade: ``Tokenizer`` and ``Encoding``.

One ``encode_segments`` call runs the pipeline, each stage a module:

    segments.pack_segments      segments -> one UTF-8 buffer + offsets
    chunking.cut_chunks         tiktoken-safe 400k-character chunks (independent units of work)
    chunking.cut_substrings     tiktoken-safe 25k run cuts within a chunk
    specials.split_specials     special tokens vs text runs
    pretokenize (scanner)       text runs -> pieces (compiled Kimi scanner or PCRE2 JIT)
    bpe.encode_runs             pieces -> ids in one preallocated uint32 array

Every compiled stage runs without the GIL, so threads can share a Tokenizer. A call that
needs no fan-out runs chunking -> BPE as one compiled call (``encoder.encode_packed_fused``).
With the segment cache, only segments it does not hold are encoded (``segment_cache``), and
an agent loop's new turn is encoded while a helper thread plans the call (``reuse``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .jit import kernel
from . import bpe
from .chunking import cut_chunks, cut_substrings
from .encoder import ID_DTYPE, SubstringEncoder
from .hugepages import in_huge_pages
from .load import Vocabulary
from .parallel import (
    MIN_BYTES_PER_JOB, MIN_BYTES_PER_PROCESS_JOB, MIN_BYTES_PER_SHARED_JOB, UNIT_BYTES, check_backend,
    check_hash_routing, check_n_jobs, encode_groups_on_threads, encode_on_threads, encode_parts_on_threads,
    split_spans,
)
from .pretokenize import KIMI_PATTERN, split_at_safe_points
from .reuse import EncodeAhead, Encoded, OutputMemory, assemble, merge_encodings
from .segment_cache import DEFAULT_BUDGET_BYTES, SegmentCache, check_segment_cache_bytes
from .segments import PackedSegments, pack_segments, segment_bounds, validate_segments
from .unicode_classes import code_point_flags
from .workers import EncoderSpec, encode_on_processes

MAX_TOKEN_ID = 1 << 24  # far above any BPE vocabulary; keeps the dense decoder tables small


class Encoding:
    """The ids of one call, in a ``uint32`` NumPy array.

    >>> enc = kimi_tok.kimi_k3().encode("hello world")
    >>> len(enc), enc.ids
    (2, [22931, 2695])
    """

    __slots__ = ("_ids", "_special_mask")

    def __init__(self, ids: np.ndarray, special_mask=None) -> None:
        self._ids: np.ndarray | None = ids
        self._special_mask = special_mask

    def _array(self) -> np.ndarray:
        if self._ids is None:
            raise ValueError("this Encoding was drained by into_numpy()")
        return self._ids

    def __len__(self) -> int:
        return len(self._array())

    def __repr__(self) -> str:
        if self._ids is None:
            return "Encoding(drained)"
        return f"Encoding(n_ids={len(self._ids)})"

    @property
    def ids(self) -> list[int]:
        """The ids as a Python list (a copy; prefer ``into_numpy`` for long prompts)."""
        return self._array().tolist()

    def into_numpy(
        self,
        ids: bool = True,
        attention_mask: bool = False,
        type_ids: bool = False,
        special_tokens_mask: bool = False,
    ) -> dict[str, np.ndarray]:
        """Hand the ids to NumPy without copying; the Encoding is drained afterwards.

        Returns a dict with the requested ``uint32`` arrays: ``"ids"``,
        ``"attention_mask"`` (ones), ``"type_ids"`` (zeros) and
        ``"special_tokens_mask"`` (1 where the id is a special token).
        """
        array = self._array()
        result: dict[str, np.ndarray] = {}
        if ids:
            result["ids"] = array
        if attention_mask:
            result["attention_mask"] = np.ones(len(array), dtype=ID_DTYPE)
        if type_ids:
            result["type_ids"] = np.zeros(len(array), dtype=ID_DTYPE)
        if special_tokens_mask:
            if self._special_mask is None:
                raise ValueError("special_tokens_mask needs an Encoding made by a Tokenizer")
            result["special_tokens_mask"] = self._special_mask(array).astype(ID_DTYPE)
        self._ids = None
        return result


@kernel
def _gather_bytes(ids, all_bytes, all_offsets):
    total = 0
    for t in ids:
        total += all_offsets[t + 1] - all_offsets[t]
    out = np.empty(total, dtype=np.uint8)
    at = 0
    for t in ids:
        start = all_offsets[t]
        length = all_offsets[t + 1] - start
        out[at:at + length] = all_bytes[start:start + length]
        at += length
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable alphabet for bytes, used by ``id_to_token``/``token_to_id`` (as HF does)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


class Tokenizer:
    """An exact tiktoken-compatible BPE tokenizer (Kimi K3 by default).

    ``n_jobs`` workers of ``backend`` (``"threads"`` or ``"processes"``) share one long
    call. With threads, each group of text is encoded whole with a piece cache of its
    own, or, with ``hash_routing=True``, unknown pieces are routed by hash so that each
    distinct one is merged once per call by one worker (measured slower on 2 cores; see
    the README's "Many cores"). ``segment_cache_bytes`` bounds the exact segment cache
    (0: none). The ids are the same whatever these settings.

    >>> tok = kimi_tok.kimi_k3()
    >>> tok.encode_segments([("<|open|>", True), ("message", False)]).ids
    [163587, 2778]
    """

    def __init__(
        self,
        vocabulary: Vocabulary,
        special_tokens: dict[str, int] | None = None,
        pattern: str = KIMI_PATTERN,
        name: str = "kimi_k3",
        n_jobs: int | None = None,
        segment_cache_bytes: int | None = DEFAULT_BUDGET_BYTES,
        backend: str | None = None,
        hash_routing: bool = False,
    ) -> None:
        self.n_jobs = check_n_jobs(n_jobs)
        self.backend = check_backend(backend)
        self.hash_routing = check_hash_routing(hash_routing)
        check_segment_cache_bytes(segment_cache_bytes)
        self.segment_cache = SegmentCache(segment_cache_bytes) if segment_cache_bytes else None
        special_tokens = dict(special_tokens or {})
        n_ranks = vocabulary.token_offsets.shape[0] - 1
        for text, id_ in special_tokens.items():
            if not isinstance(text, str):
                raise ValueError(f"special token {text!r}: the text must be a str, not {type(text).__name__}")
            if isinstance(id_, bool) or not isinstance(id_, int) or id_ < 0:
                raise ValueError(f"special token {text!r}: id must be a non-negative int, got {id_!r}")
            if id_ >= MAX_TOKEN_ID:
                raise ValueError(
                    f"special token {text!r}: id {id_} is too large (ids must be below {MAX_TOKEN_ID:,}: "
                    "the decoder tables are dense)"
                )
            if id_ < n_ranks:
                raise ValueError(f"special token {text!r}: id {id_} collides with a mergeable rank")
        if len(set(special_tokens.values())) != len(special_tokens):
            raise ValueError("special tokens: two tokens share one id")
        self.name = name
        self.pattern = pattern
        self._vocabulary = vocabulary
        self._special_tokens = special_tokens
        self._flags = code_point_flags()
        tables = bpe.cached_bpe_tables(vocabulary.token_bytes, vocabulary.token_offsets)
        self._bpe = bpe.BpeTables(*in_huge_pages(tables))  # probed at random: see hugepages.py
        self._encoder = SubstringEncoder(self._bpe, special_tokens, pattern)
        self._pretokenizer = self._encoder.pretokenizer
        self._worker_spec: EncoderSpec | None = None  # built on the first call on processes
        self._output_memory = OutputMemory()  # a long agent-loop turn's output memory, reused when let go
        # long sub-strings may be split after newlines only where that provably changes no piece
        self._splits_after_newline = self._pretokenizer.splits_after_newline and not any(
            "\n" in text for text in special_tokens
        )
        self._build_decoder(n_ranks)

    def _build_decoder(self, n_ranks: int) -> None:
        self.n_vocab = max([n_ranks - 1, *self._special_tokens.values()]) + 1
        specials = sorted(self._special_tokens.items(), key=lambda kv: kv[1])
        lengths = np.zeros(self.n_vocab, dtype=np.int64)
        lengths[:n_ranks] = np.diff(self._vocabulary.token_offsets)
        self._is_special = np.zeros(self.n_vocab, dtype=np.bool_)
        self._is_valid = np.zeros(self.n_vocab, dtype=np.bool_)
        self._is_valid[:n_ranks] = True
        for text, id_ in specials:
            lengths[id_] = len(text.encode("utf-8"))
            self._is_special[id_] = True
            self._is_valid[id_] = True
        self._all_offsets = np.zeros(self.n_vocab + 1, dtype=np.int64)
        np.cumsum(lengths, out=self._all_offsets[1:])
        self._all_bytes = np.empty(self._all_offsets[-1], dtype=np.uint8)
        self._all_bytes[: self._vocabulary.token_bytes.shape[0]] = self._vocabulary.token_bytes
        for text, id_ in specials:
            self._all_bytes[self._all_offsets[id_] : self._all_offsets[id_ + 1]] = np.frombuffer(
                text.encode("utf-8"), dtype=np.uint8
            )

    # -- encoding -----------------------------------------------------------

    def encode(self, text: str, allow_special: bool = False, tiktoken_safe: bool = True) -> Encoding:
        """Encode one text; ``allow_special`` makes special-token text control tokens.

        >>> kimi_tok.kimi_k3().encode("<|open|>", allow_special=True).ids
        [163587]
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        if not isinstance(allow_special, (bool, np.bool_)):
            raise TypeError(f"allow_special must be a bool, not {type(allow_special).__name__}")
        return self.encode_segments([(text, allow_special)], tiktoken_safe=tiktoken_safe)

    def encode_segments(
        self,
        segments: Sequence[tuple[str, bool]],
        add_special_tokens: bool = False,
        tiktoken_safe: bool = True,
    ) -> Encoding:
        """Encode ``(text, allow_special)`` segments, each on its own, as the reference does.

        ``tiktoken_safe=True`` reproduces the official tokenizer's 400k/25k chunking
        (exact parity); ``False`` encodes each segment whole. ``add_special_tokens``
        is accepted for API compatibility: Kimi K3 adds no BOS/EOS, so it changes nothing.
        Segments seen before (same text, flag and chunking) are served from the
        segment cache (``segment_cache``; exact, see ``segment_cache.py``).
        """
        self._check_flags(add_special_tokens, tiktoken_safe)
        return Encoding(self._segment_ids(segments, bool(tiktoken_safe)), self._special_tokens_mask)

    def count_tokens(self, segments: Sequence[tuple[str, bool]] | str, tiktoken_safe: bool = True) -> int:
        """The number of ids ``encode_segments`` would return (a ``str`` counts as ordinary text).

        Cached segments count by their stored length; the ids never reach Python.

        >>> kimi_tok.kimi_k3().count_tokens("hello world")
        2
        """
        self._check_flags(False, tiktoken_safe)
        if isinstance(segments, str):
            segments = [(segments, False)]
        return self._encode_with_cache(segments, bool(tiktoken_safe), want_ids=False).n_ids

    def _segment_ids(self, segments, tiktoken_safe: bool) -> np.ndarray:
        """The ids of ``segments``, encoding only those the segment cache does not hold."""
        return self._encode_with_cache(segments, tiktoken_safe, want_ids=True).ids

    def _encode_with_cache(self, segments, tiktoken_safe: bool, want_ids: bool) -> Encoded:
        """The call's ids (or only their count), encoding only the segments the segment cache
        does not hold, then caching them.

        The cache offers segments by length first (``SegmentCache.speculate``) and then compares
        their texts (``verify``: it reads every character). With two or more jobs, a call that
        extends a recent one (an agent loop's new turn) encodes its new segments while a helper
        thread plans it (``reuse.EncodeAhead``).
        """
        cache = self.segment_cache
        ahead = EncodeAhead.start(self, cache, segments, tiktoken_safe, want_ids) if cache is not None else None
        if ahead is not None:
            return ahead.run(self, cache, segments, tiktoken_safe, want_ids)
        segments = validate_segments(segments)
        if cache is None:
            packed = pack_segments(segments, tiktoken_safe, self._flags, validated=True)
            ids = self._encode_packed(packed, self.n_jobs, with_bounds=False)[0]
            return Encoded(ids, len(ids))
        speculation = cache.speculate(segments, tiktoken_safe)
        todo = segments if len(speculation.missing) == len(segments) else [segments[i] for i in speculation.missing]
        failed = cache.verify(speculation)
        new_ids, bounds = (self._encode_packed(pack_segments(todo, tiktoken_safe, self._flags, validated=True),
                                               self.n_jobs)
                           if todo else (np.empty(0, dtype=ID_DTYPE), np.zeros(1, dtype=np.int64)))
        plan = cache.resolve(speculation, failed)
        if len(plan.missing) > len(speculation.missing):  # offered texts that differ after all
            new_ids, bounds = self._add_late_misses(segments, tiktoken_safe, speculation.missing, new_ids, bounds,
                                                    plan.missing)
        if plan.missing:
            cache.store(segments, tiktoken_safe, plan, new_ids, bounds,
                        cache.draft_runs(segments, tiktoken_safe, plan, speculation.fingerprints))
        return assemble(plan, new_ids, bounds, len(segments), want_ids)

    def _add_late_misses(self, segments, tiktoken_safe, first_missing, ids, bounds, all_missing):
        """Encode the offered segments that ``verify`` rejected and merge all new ids in call order."""
        known = set(first_missing)
        late = [i for i in all_missing if i not in known]
        late_ids, late_bounds = self._encode_packed(
            pack_segments([segments[i] for i in late], tiktoken_safe, self._flags, validated=True), self.n_jobs
        )
        return merge_encodings(all_missing, [(first_missing, ids, bounds), (late, late_ids, late_bounds)])

    def encode_to_numpy(self, segments: Sequence[tuple[str, bool]], tiktoken_safe: bool = True) -> np.ndarray:
        """``encode_segments(...).into_numpy()["ids"]`` in one call."""
        return self.encode_segments(segments, tiktoken_safe=tiktoken_safe).into_numpy()["ids"]

    @staticmethod
    def _check_flags(add_special_tokens, tiktoken_safe) -> None:
        for name, value in (("add_special_tokens", add_special_tokens), ("tiktoken_safe", tiktoken_safe)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, not {type(value).__name__}")

    def _encode_packed(self, packed: PackedSegments, n_jobs: int, timings: dict | None = None,
                       with_bounds: bool = True):
        """Run the compiled stages; returns ``(ids, segment_bounds)``.

        ``ids[segment_bounds[i]:segment_bounds[i + 1]]`` are the ids of the caller's segment ``i``
        (``segment_bounds`` is None unless ``with_bounds``). After the tiktoken-safe cuts the
        sub-strings are independent (and long ones split where the pattern always cuts), so
        long inputs are cut into parts that this thread and pool threads take one at a time
        (``encode_parts_on_threads``; with hash routing, another backend or a generic pattern:
        contiguous groups, one per task, and the ids concatenated).
        """
        clock = _StageClock(timings)
        buf = packed.buf
        shares_parts = timings is None and self._encoder.fuses and self.backend == "threads" and not self.hash_routing
        if self.backend != "threads":
            min_bytes = MIN_BYTES_PER_PROCESS_JOB
        else:
            min_bytes = MIN_BYTES_PER_SHARED_JOB if shares_parts else MIN_BYTES_PER_JOB
        if timings is None and self._encoder.fuses and (n_jobs == 1 or buf.shape[0] < 2 * min_bytes):
            return self._encode_fused(packed, with_bounds)
        if shares_parts:
            ids, bounds = encode_parts_on_threads(self._encoder, packed, self._flags, n_jobs,
                                                  self._splits_after_newline)
            return ids, (bounds if with_bounds else None)
        chunk_start, chunk_end, chunk_segment = cut_chunks(buf, packed.seg_start, packed.seg_end, packed.needs_cuts)
        clock.lap("chunking")
        sub_start, sub_end, sub_chunk = cut_substrings(
            buf, chunk_start, chunk_end, packed.needs_cuts[chunk_segment], self._flags
        )
        sub_allow = packed.allow_special[chunk_segment[sub_chunk]]
        clock.lap("run cuts")
        if n_jobs > 1 and self._splits_after_newline and buf.shape[0] >= 2 * min_bytes:
            sub_start, sub_end, sub_allow = split_at_safe_points(buf, sub_start, sub_end, sub_allow,
                                                                 min(UNIT_BYTES, min_bytes))
        groups = split_spans(sub_start, sub_end, n_jobs, min_bytes)
        if len(groups) == 1:
            ids, run_start, run_out_end = self._encoder.encode(buf, sub_start, sub_end, sub_allow, clock)
        elif self.backend == "threads":
            fan_out = encode_on_threads if self.hash_routing else encode_groups_on_threads
            ids, run_start, run_out_end = fan_out(self._encoder, buf, sub_start, sub_end, sub_allow, groups, n_jobs)
        else:
            ids, run_start, run_out_end = encode_on_processes(
                self._spec_for_workers(), buf, sub_start, sub_end, sub_allow, groups, n_jobs
            )
        if len(groups) > 1:
            clock.lap(f"specials+pretokenize+bpe ({self.backend})")
        return ids, (segment_bounds(packed, run_start, run_out_end) if with_bounds else None)

    def _encode_fused(self, packed: PackedSegments, with_bounds: bool = True):
        """``_encode_packed`` for a call that needs no fan-out, as one compiled call."""
        out = np.empty(packed.buf.shape[0], dtype=ID_DTYPE)  # an id covers >= 1 byte
        n, run_start, run_out_end = self._encoder.encode_packed(
            packed.buf, packed.seg_start, packed.seg_end, packed.needs_cuts, packed.allow_special, self._flags, out
        )
        out.resize((n,), refcheck=False)  # shrinks in place: no copy of the ids
        return out, (segment_bounds(packed, run_start, run_out_end) if with_bounds else None)

    def _spec_for_workers(self) -> EncoderSpec:
        if self._worker_spec is None:
            self._worker_spec = EncoderSpec.of(self._bpe, self._special_tokens, self.pattern)
        return self._worker_spec

    def profile_segments(self, segments, tiktoken_safe: bool = True, n_jobs: int = 1) -> dict[str, float]:
        """Seconds spent per pipeline stage for one ``encode_segments`` call (one thread by default)."""
        self._check_flags(False, tiktoken_safe)
        timings: dict[str, float] = {}
        start = time.perf_counter()
        packed = pack_segments(segments, tiktoken_safe, self._flags)
        timings["segments"] = time.perf_counter() - start
        self._encode_packed(packed, check_n_jobs(n_jobs), timings)  # the segment cache is not used here
        return timings

    # -- decoding and vocabulary ---------------------------------------------

    def _check_ids(self, ids) -> np.ndarray:
        if isinstance(ids, (str, bytes, bytearray, memoryview)) or ids is None:
            raise TypeError(f"ids must be a sequence of ints or an integer array, not {type(ids).__name__}")
        try:
            array = np.asarray(ids)
        except (TypeError, ValueError):  # e.g. a ragged nested list
            raise TypeError(f"ids must be a 1-D sequence of ints, not a nested {type(ids).__name__}") from None
        if array.ndim != 1:
            raise TypeError(f"ids must be a 1-D sequence of ints, got shape {array.shape}")
        if array.size == 0:
            return np.zeros(0, dtype=np.int64)
        if array.dtype.kind not in "iu":  # floats, bools, objects, strings, timedelta64 ...
            if isinstance(ids, np.ndarray):
                raise TypeError(f"ids must be ints, got an array of dtype {array.dtype}")
            for i, value in enumerate(ids):  # a Python sequence: name the first item that is wrong
                if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                    raise TypeError(f"ids[{i}] = {value!r} is a {type(value).__name__}, not an int")
                if not 0 <= value < self.n_vocab:
                    raise ValueError(f"ids[{i}] = {value} is not a token id of this vocabulary")
            array = np.array([int(value) for value in ids], dtype=np.int64)  # e.g. uint64 and int64 items
        bad = array >= self.n_vocab  # compared in the array's own dtype: no wrap-around of uint64
        if array.dtype.kind == "i":
            bad |= array < 0
        if not bad.any():
            array = array.astype(np.int64, copy=False)
            bad = ~self._is_valid[array]
        if bad.any():
            where = int(np.flatnonzero(bad)[0])
            raise ValueError(f"ids[{where}] = {array[where]} is not a token id of this vocabulary")
        return array

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of ``ids`` concatenated."""
        return _gather_bytes(self._check_ids(ids), self._all_bytes, self._all_offsets).tobytes()

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """The text of ``ids``; invalid UTF-8 (a token cut mid-character) becomes U+FFFD.

        >>> tok.decode(tok.encode("héllo").ids)
        'héllo'
        """
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def token_to_id(self, token: str) -> int | None:
        """Id of a special token's text, or of a token in the byte-level form ``id_to_token`` gives."""
        if not isinstance(token, str):
            raise TypeError(f"token must be a str, not {type(token).__name__}")
        if token in self._special_tokens:
            return self._special_tokens[token]
        try:
            raw = bytes(CHAR_TO_BYTE[c] for c in token)
        except (KeyError, TypeError):
            return None
        buf = np.frombuffer(raw, dtype=np.uint8)
        if buf.size == 0:
            return None
        rank = bpe.lookup_token(self._bpe, buf)
        return None if rank < 0 else int(rank)

    def id_to_token(self, id: int) -> str | None:
        """A special token's text, or a token's bytes in GPT-2's byte-level alphabet (as HF shows them)."""
        if not isinstance(id, (int, np.integer)):
            raise TypeError(f"id must be an int, not {type(id).__name__}")
        if isinstance(id, bool) or not 0 <= id < self.n_vocab:
            return None
        if not self._is_valid[id]:
            return None
        raw = self._all_bytes[self._all_offsets[id] : self._all_offsets[id + 1]].tobytes()
        if self._is_special[id]:
            return raw.decode("utf-8")
        return "".join(BYTE_TO_CHAR[b] for b in raw)

    def token_bytes(self, id: int) -> bytes:
        """The bytes of one token id."""
        return self.decode_bytes([id])

    @property
    def special_tokens(self) -> dict[str, int]:
        """``{text: id}`` of the special tokens (a copy)."""
        return dict(self._special_tokens)

    def _special_tokens_mask(self, ids: np.ndarray) -> np.ndarray:
        return self._is_special[ids]

    def __repr__(self) -> str:
        kind = type(self._pretokenizer).__name__
        return f"Tokenizer(name={self.name!r}, n_vocab={self.n_vocab}, specials={len(self._special_tokens)}, pretokenizer={kind})"

    # -- interop ---------------------------------------------------------------

    def as_tiktoken(self) -> Any:
        """A ``tiktoken.Encoding`` drop-in (a ``tiktoken_compat.TiktokenEncoding``) backed by this Tokenizer.

        >>> kimi_tok.kimi_k3().as_tiktoken().encode("<|sep|>", allowed_special="all")
        [163589]
        """
        from .tiktoken_compat import TiktokenEncoding

        return TiktokenEncoding(self)

    def to_tokenizer_json(self, path: str | None = None) -> dict[str, Any]:
        """A Hugging Face ``tokenizer.json`` as a dict, also written to ``path`` if given (see ``hf``).

        >>> kimi_tok.kimi_k3().to_tokenizer_json("tokenizer.json")  # doctest: +SKIP
        """
        from .hf import tokenizer_json

        return tokenizer_json(self, path)


class _StageClock:
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
