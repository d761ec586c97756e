"""The public facade: ``Tokenizer``.

A Tokenizer hands each call to its engine (``engine.Engine``: how one call runs over the
pipeline's stages) or, with a segment cache, to the reuse layer in front of it
(``reuse.SegmentReuse``), and decodes with ``pipeline.decode.Decoder``. The call path and the
layers: docs/architecture.md.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import warnings
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from .encoding import Encoding
from .engine import Engine, Policy
from .engine.batch import encode_items, validate_items
from .engine.interpreted import InterpretedEngine
from .native import jit
from .native.hugepages import in_huge_pages
from .pipeline.bpe import BpeTables, cached_bpe_tables
from .pipeline.decode import Decoder, DecodeStream
from .pipeline.offsets import token_spans
from .pipeline.segments import count_chars, validate_segments
from .reuse import SegmentReuse
from .reuse.warmup import KernelBuild, build_kernels_first, kernels_cached, start_background, starts_cold, warm_up
from .vocab import KIMI_PATTERN, Vocabulary, check_special_tokens

Segments = Sequence[tuple[str, bool]]


class Tokenizer:
    """An exact tiktoken-compatible BPE tokenizer (Kimi K3 by default).

    ``policy`` (``kimi_tok.Policy``) decides how calls run: ``n_jobs`` threads (or processes) share
    one long call, the segment cache's budget, the fan-out thresholds. ``n_jobs``,
    ``segment_cache_bytes``, ``backend`` and ``hash_routing`` build one with
    ``Policy.from_env`` when no policy is given. The ids are the same whatever the policy.

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
        segment_cache_bytes: int | None = Policy.segment_cache_bytes,
        backend: str | None = None,
        hash_routing: bool = False,
        *,
        policy: Policy | None = None,
    ) -> None:
        if policy is None:
            policy = Policy.from_env(n_jobs, segment_cache_bytes, backend, hash_routing)
        elif not isinstance(policy, Policy):
            raise TypeError(f"policy must be a kimi_tok.Policy, not {type(policy).__name__}")
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, not {type(pattern).__name__}")
        self.policy = policy
        self.name = name
        self.pattern = pattern
        self.vocabulary = vocabulary
        self._special_tokens = check_special_tokens(special_tokens, vocabulary.token_offsets.shape[0] - 1)
        self._decoder = Decoder(vocabulary, self._special_tokens, None)
        self.n_vocab: int = self._decoder.n_vocab
        self.chat_template: str | dict[str, str] | None = None  # a model directory's (``loaders.load``)
        self._origin: tuple | None = None  # (rebuild, args): how ``loaders`` made it, for pickling
        self._parts: tuple[Engine, SegmentReuse | None] | None = None  # the compiled path, once made
        self._short_call: tuple[Engine, int, int] | None = None  # (engine, max chars, max bytes) of short calls
        self._special_mask = self._decoder.is_special.__getitem__
        self._interpreted: InterpretedEngine | None = None  # answers calls until then (a cold start)
        self._made = threading.Event()
        self._failed: BaseException | None = None
        self._loading = False  # a warm start: a thread loads the cached kernels (numba's first use)
        kind = (policy, pattern == KIMI_PATTERN, bool(policy.segment_cache_bytes))
        if starts_cold(*kind):  # kernels not compiled yet: processes compile them, calls go on meanwhile
            self._interpreted = InterpretedEngine(self.mergeable_ranks(), self._special_tokens, pattern)
            jit.announce_compile(policy.compile_jobs, background=True)
            build = KernelBuild.started(policy.compile_jobs)
            threading.Thread(target=self._make_parts, args=(build, kind), name="kimi_tok-cold-start",
                             daemon=True).start()
        elif policy.cold_start == "background" and not jit.materialized():
            # cached, but numba is not loaded in this process (~0.6 s): short calls go on meanwhile
            self._interpreted = InterpretedEngine(self.mergeable_ranks(), self._special_tokens, pattern)
            self._loading = True
            start_background(self._make_parts, (None, kind, True), "kimi_tok-load")  # a fork waits for it
        else:
            build_kernels_first(*kind)
            self._make_parts()

    def _make_parts(self, build: KernelBuild | None = None, kind: tuple = (), background: bool = False) -> None:
        """The compiled path: tables, engine, reuse layer, kernels loaded (``warm_up``). After a
        ``build`` it loads what the worker processes compiled (or, if they failed, compiles here).
        ``background``: on a thread of its own (a failure is kept for the calls that need it)."""
        try:
            if build is not None and not build.wait_until(lambda: kernels_cached(*kind)) and build.failed():
                warnings.warn(f"kimi_tok: the processes compiling kernels failed ({build.failure()}); "
                              f"compiling in this process instead", RuntimeWarning, stacklevel=1)
            policy = self.policy
            tables = cached_bpe_tables(self.vocabulary.token_bytes, self.vocabulary.token_offsets, policy.cache_dir)
            tables = BpeTables(*in_huge_pages(tables))  # probed at random: see native/hugepages.py
            engine = Engine(tables, self._special_tokens, self.pattern, policy)
            reuse = SegmentReuse(engine, policy) if policy.segment_cache_bytes else None
            self._decoder.tables = tables
            warm_up(engine, reuse, self._decoder)  # no later call compiles: reuse/warmup.py
            self._short_call = (engine, *(engine if reuse is None else reuse).short_call_limits())
            self._parts = (engine, reuse)
            self._interpreted = None
        except BaseException as e:  # kept for the calls that need the compiled path
            self._failed = e
            if build is None and not background:
                raise
        finally:
            self._loading = False
            self._made.set()

    def _compiled(self) -> tuple[Engine, SegmentReuse | None]:
        """``(engine, reuse)``, waiting for them while a cold start compiles."""
        parts = self._parts
        if parts is None:
            self._made.wait()
            if self._parts is None:
                raise RuntimeError("kimi_tok: the compiled path could not be made") from self._failed
            parts = self._parts
        return parts

    @property
    def _engine(self) -> Engine:
        return self._compiled()[0]

    @property
    def _reuse(self) -> SegmentReuse | None:
        return self._compiled()[1]

    @property
    def compiled(self) -> bool:
        """Whether calls run on the compiled kernels (False during a cold start's first seconds, while
        worker processes compile them; the ids are the same)."""
        return self._parts is not None

    def wait_until_compiled(self, timeout: float | None = None) -> bool:
        """Wait for the compiled kernels of a cold start (at most ``timeout`` seconds); returns ``compiled``."""
        self._made.wait(timeout)
        return self.compiled

    # -- settings ---------------------------------------------------------------

    @property
    def n_jobs(self) -> int:
        return self.policy.n_jobs

    @property
    def backend(self) -> str:
        return self.policy.backend

    @property
    def hash_routing(self) -> bool:
        return self.policy.hash_routing

    @property
    def segment_cache(self):
        """The exact segment cache (``reuse.SegmentCache``), or None when it is off."""
        return self._reuse.cache if self._reuse is not None else None

    @property
    def engine(self) -> Engine:
        """How calls run over the stages: what the reuse layer, interop and corpora build on."""
        return self._engine

    # -- encoding -----------------------------------------------------------------

    def encode(self, text: str, allow_special: bool = False, tiktoken_safe: bool = True, *,
               return_offsets: bool = False) -> Encoding:
        """Encode one text; ``allow_special`` makes special-token text control tokens.

        >>> kimi_tok.kimi_k3().encode("<|open|>", allow_special=True).ids
        [163587]
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        _check_flag("allow_special", allow_special)
        return self.encode_segments([(text, allow_special)], tiktoken_safe=tiktoken_safe, return_offsets=return_offsets)

    def encode_segments(self, segments: Segments, add_special_tokens: bool = False,
                        tiktoken_safe: bool = True, *, return_offsets: bool = False) -> Encoding:
        """Encode ``(text, allow_special)`` segments, each on its own, as the reference does.

        ``tiktoken_safe=True`` reproduces the official tokenizer's 400k/25k chunking (exact parity);
        ``add_special_tokens`` is accepted for serving code and changes nothing (K3 adds no BOS/EOS).
        Segments seen before are served from the segment cache (exact: ``reuse.segment_cache``).

        >>> tok.encode_segments([("<|open|>", True), ("hi", False)]).ids
        [163587, 9663]
        """
        short, joins = self._short_call, True
        if short is not None and return_offsets is False and type(tiktoken_safe) is bool \
                and type(add_special_tokens) is bool:
            # a short call goes straight to its one compiled call: after other work each Python layer between
            # costs microseconds (docs/performance.md, "Short calls without the layers between")
            ids = short[0].short_call_ids(segments, tiktoken_safe, short[1], short[2])
            if ids is not None:
                return Encoding(ids, self._special_mask)
            joins = False  # declined: the path below would decline it again
        _check_flag("add_special_tokens", add_special_tokens)
        _check_flag("tiktoken_safe", tiktoken_safe)
        _check_flag("return_offsets", return_offsets)
        ids = self._run(segments, bool(tiktoken_safe), want_ids=True, joins=joins).ids
        spans = token_spans(self._decoder.offset_tables, ids, validate_segments(segments), bool(tiktoken_safe),
                            self._engine.flags) if return_offsets else None  # compiled: waits for a cold start
        return Encoding(ids, self._special_mask, spans)

    def encode_batch(self, items: Sequence[str | Segments], *, allow_special: bool = False,
                     tiktoken_safe: bool = True) -> list[Encoding]:
        """``encode_segments`` of each item (a ``str``: one segment with ``allow_special``) on ``n_jobs``
        threads; a bad item raises before any is encoded. ``tok.encode_batch(["hi"])[0].ids == [9663]``."""
        _check_flag("tiktoken_safe", tiktoken_safe)
        items = validate_items(items, allow_special)
        if self._parts is None and self._interpreted is not None:  # kernels still compiling
            ids = [self._run(item, bool(tiktoken_safe), True).ids for item in items]
        else:
            engine, reuse = self._compiled()
            ids = encode_items(self._run, items, bool(tiktoken_safe), engine, reuse is not None)
        return [Encoding(array, self._special_mask) for array in ids]

    def encode_to_numpy(self, segments: Segments, tiktoken_safe: bool = True) -> np.ndarray:
        """``encode_segments(...).into_numpy()["ids"]`` in one call."""
        return self.encode_segments(segments, tiktoken_safe=tiktoken_safe).into_numpy()["ids"]

    def count_tokens(self, segments: Segments | str, tiktoken_safe: bool = True) -> int:
        """The number of ids ``encode_segments`` would return (a ``str`` counts as ordinary text).

        >>> kimi_tok.kimi_k3().count_tokens("hello world")
        2
        """
        _check_flag("tiktoken_safe", tiktoken_safe)
        if isinstance(segments, str):
            segments = [(segments, False)]
        return self._run(segments, bool(tiktoken_safe), want_ids=False).n_ids

    def encode_with_bounds(self, segments: Segments, tiktoken_safe: bool = True,
                           n_jobs: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, bounds)`` of ``segments`` without the segment cache: segment ``i``'s ids are
        ``ids[bounds[i]:bounds[i + 1]]`` (corpora encode each document once).

        >>> ids, bounds = tok.encode_with_bounds([("hello", False), (" world", False)])
        >>> bounds.tolist()
        [0, 1, 2]
        """
        _check_flag("tiktoken_safe", tiktoken_safe)
        return self._engine.encode_with_bounds(segments, bool(tiktoken_safe), n_jobs)

    def profile_segments(self, segments: Segments, tiktoken_safe: bool = True,
                         n_jobs: int | None = 1) -> dict[str, float]:
        """Seconds spent per pipeline stage for one call (one thread by default, None: the policy's
        ``n_jobs``; no segment cache)."""
        _check_flag("tiktoken_safe", tiktoken_safe)
        if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1):
            raise ValueError(f"n_jobs must be a positive int or None, not {n_jobs!r}")
        return self._engine.profile(segments, bool(tiktoken_safe), n_jobs or self.policy.n_jobs)

    def _run(self, segments: Segments, tiktoken_safe: bool, want_ids: bool, joins: bool = True):
        """``joins`` False: ``Engine.short_call_ids`` declined the call already."""
        parts, interpreted = self._parts, self._interpreted
        if parts is None and interpreted is not None and not (self._loading and self._waits_for_kernels(segments)):
            return interpreted.encode(segments, tiktoken_safe, want_ids)  # kernels still compiling or loading
        engine, reuse = parts or self._compiled()
        return (reuse if reuse is not None else engine).encode(segments, tiktoken_safe, want_ids, joins=joins)

    def _waits_for_kernels(self, segments: Segments) -> bool:
        """Whether a call made while a warm start loads the kernels waits for them: its text is
        longer than ``Policy.interpreted_chars_while_loading`` (interpreting it would take longer)."""
        chars = count_chars(segments)  # None: not (text, flag) pairs, and the interpreted path names the problem
        return chars is not None and chars > self.policy.interpreted_chars_while_loading

    # -- decoding and vocabulary ---------------------------------------------------

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of ``ids`` concatenated; ``ValueError`` for an id outside the vocabulary."""
        if self._parts is None and self._interpreted is not None:  # kernels still compiling
            return self._decoder.decode_bytes_interpreted(ids)
        return self._decoder.decode_bytes(ids)

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """The text of ``ids``; invalid UTF-8 (a token cut mid-character) becomes U+FFFD.

        >>> tok.decode(tok.encode("héllo").ids)
        'héllo'
        """
        return self.decode_bytes(ids).decode("utf-8", errors=errors)

    def decode_stream(self, skip_special_tokens: bool = False, ids: Iterable[int] | None = None) -> DecodeStream:
        """Decode generated ids one at a time as ``tokenizers.decoders.DecodeStream`` does (an example:
        ``pipeline.decode.DecodeStream``); ``ids``: the context before them, already shown."""
        return DecodeStream(self._decoder, skip_special_tokens, ids)

    def token_bytes(self, id: int) -> bytes:
        """The bytes of one token id."""
        return self.decode_bytes([id])

    def token_to_id(self, token: str) -> int | None:
        """Id of a special token's text, or of a token in the byte-level form ``id_to_token`` gives."""
        self._compiled()  # the look-up is compiled: waits for a cold start
        return self._decoder.token_to_id(token)

    def id_to_token(self, id: int) -> str | None:
        """A special token's text, or a token's bytes in GPT-2's byte-level alphabet (as HF shows them)."""
        return self._decoder.id_to_token(id)

    def is_token(self, id: int) -> bool:
        """Whether ``id`` is a mergeable or special token of this vocabulary."""
        return self._decoder.is_token(id)

    @property
    def special_tokens(self) -> dict[str, int]:
        """``{text: id}`` of the special tokens (a copy)."""
        return dict(self._special_tokens)

    def mergeable_ranks(self) -> dict[bytes, int]:
        """tiktoken's ``{token bytes: rank}`` of the mergeable (non-special) tokens.

        >>> kimi_tok.kimi_k3().mergeable_ranks()[b"hello"]
        22931
        """
        data = self.vocabulary.token_bytes.tobytes()
        offsets = self.vocabulary.token_offsets.tolist()
        return {data[offsets[r]:offsets[r + 1]]: r for r in range(len(offsets) - 1)}

    def __repr__(self) -> str:
        kind = "KimiScanner" if self.pattern == KIMI_PATTERN else "RegexPreTokenizer"
        return (f"Tokenizer(name={self.name!r}, n_vocab={self.n_vocab}, specials={len(self._special_tokens)}, "
                f"pretokenizer={kind})")

    def __reduce__(self):
        """Pickled as the way to make it again (the embedded vocabulary by sha256, a file by path and
        sha256, others by ranks; ``policy_state``): tables, caches, helpers are new on the other side."""
        rebuild, args = self._origin or (tokenizer_from_ranks, ranks_state(self))
        return rebuild, (*args, policy_state(self.policy))

    # -- interop ----------------------------------------------------------------------

    def apply_chat_template(self, messages: Sequence[dict], chat_template: str | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True, **template_vars: Any) -> Any:
        """A Hugging Face chat template rendered with trust boundaries (``interop.chat``; needs ``jinja2``):
        an ``Encoding``, or with ``tokenize=False`` its ``(text, allow_special)`` segments."""
        from .interop.chat import apply_chat_template

        return apply_chat_template(self, messages, chat_template, add_generation_prompt, tokenize, template_vars)

    def as_tiktoken(self) -> Any:
        """A ``tiktoken.Encoding`` drop-in (``interop.tiktoken_compat.TiktokenEncoding``).

        >>> kimi_tok.kimi_k3().as_tiktoken().encode("<|sep|>", allowed_special="all")
        [163589]
        """
        from .interop.tiktoken_compat import TiktokenEncoding

        return TiktokenEncoding(self)

    def to_tokenizer_json(self, path: str | None = None) -> dict[str, Any]:
        """A Hugging Face ``tokenizer.json`` as a dict, also written to ``path`` if given (``interop.hf``).

        >>> kimi_tok.kimi_k3().to_tokenizer_json("tokenizer.json")  # doctest: +SKIP
        """
        from .interop.hf import tokenizer_json

        return tokenizer_json(self, path)


def policy_state(policy: Policy) -> dict[str, Any]:
    """``policy``'s settings as they travel to another process: every one, except ``cache_dir``
    when it is this process's default (from ``KIMI_TOK_CACHE_DIR`` or the home directory): the
    other side then takes its own default (a worker on another machine has another home).

    >>> Policy(**policy_state(Policy(n_jobs=3))).n_jobs
    3
    """
    state = {f.name: getattr(policy, f.name) for f in dataclasses.fields(policy)}
    if policy.cache_dir == Policy().cache_dir:
        del state["cache_dir"]
    else:
        state["cache_dir"] = str(policy.cache_dir)
    return state


def ranks_state(tok: Tokenizer) -> tuple:
    """``(name, pattern, special tokens, token lengths' dtype, lengths and token bytes zlib-packed)``:
    a vocabulary that only its ranks describe (cl100k_base: ~0.4 MB, tiktoken pickles 1.3 MB)."""
    lengths = np.diff(tok.vocabulary.token_offsets)
    dtype = np.min_scalar_type(int(lengths.max(initial=0)))
    return (tok.name, tok.pattern, tok.special_tokens, dtype.str, zlib.compress(lengths.astype(dtype).tobytes()),
            zlib.compress(tok.vocabulary.token_bytes.tobytes()))


@functools.lru_cache(maxsize=8)
def _from_ranks(name, pattern, specials, dtype, lengths, token_bytes, policy: Policy) -> Tokenizer:
    lengths = np.frombuffer(zlib.decompress(lengths), dtype=dtype)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    token_bytes = np.frombuffer(zlib.decompress(token_bytes), dtype=np.uint8).copy()
    vocabulary = Vocabulary(token_bytes, offsets, np.zeros(len(lengths), dtype=np.int64))
    return Tokenizer(vocabulary, dict(specials), pattern, name, policy=policy)


def tokenizer_from_ranks(name, pattern, special_tokens, dtype, lengths, token_bytes, policy: dict) -> Tokenizer:
    """The Tokenizer ``ranks_state`` describes, one per process for each (a pool's tasks unpickle it often)."""
    return _from_ranks(name, pattern, tuple(special_tokens.items()), dtype, lengths, token_bytes, Policy(**policy))


def _check_flag(name: str, value) -> None:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
