"""Reuse across calls: an agent loop re-sends its prefix every turn, and a segment's ids depend
only on ``(text, allow_special, tiktoken_safe)``, so they are reused exactly.

``SegmentReuse`` is what a Tokenizer with a segment cache hands its calls to: it plans each
call against the cache (``segment_cache``), has the engine encode only the segments the cache
does not hold, and has a helper thread store them once the call has returned. A call that
extends a recent one (an agent loop's next turn) encodes its new segments while a helper
thread plans it (``encode_ahead``; helpers wait in compiled code on Linux: ``parking``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..engine.engine import Encoded, Engine
from ..engine.policy import Policy
from ..pipeline.segments import count_chars, validate_segments
from .encode_ahead import EncodeAhead, HelperThreads, OutputMemory, assemble
from .segment_cache import SegmentCache

__all__ = ["SegmentReuse", "SegmentCache"]


class SegmentReuse:
    """An engine behind a segment cache: ``encode`` gives the same ids as ``Engine.encode``.

    The cache offers segments by length first (``SegmentCache.speculate``) and then compares
    their texts (``verify``: it reads every character). With two or more jobs, a call that
    extends a recent one encodes its new segments while a helper thread plans it
    (``EncodeAhead``). Helper threads start when first needed.
    """

    def __init__(self, engine: Engine, policy: Policy) -> None:
        self.engine = engine
        self.policy = policy
        self.cache = SegmentCache(policy.segment_cache_bytes)
        self.helpers = HelperThreads(policy.helpers, parked=policy.parked_helpers)
        # a long agent-loop turn's output memory, reused once its caller lets go of it
        self.output_memory = OutputMemory(policy.min_reused_ids, policy.output_headroom)

    def short_call_limits(self) -> tuple[int, int]:
        """``Engine.short_call_limits`` for calls shorter than the segment cache's (``min_cached_call_chars``)."""
        max_chars, max_bytes = self.engine.short_call_limits()
        return min(max_chars, self.policy.min_cached_call_chars - 1), max_bytes

    def encode(self, segments: Sequence, tiktoken_safe: bool, want_ids: bool = True, joins: bool = True) -> Encoded:
        """The call's ids (or only their count), encoding only the segments the cache does not
        hold, then caching them (calls under ``Policy.min_cached_call_chars`` go straight to the engine).
        ``joins`` False: the caller tried ``Engine.short_call_ids`` with ``short_call_limits`` already."""
        # shorter calls skip the segment cache and encoding ahead: the engine validates them, and they cost
        # what they cost without a cache (docs/performance.md, "Where kimi_tok's time goes")
        policy = self.policy
        short = self.engine.encode_short(segments, tiktoken_safe, want_ids, self.short_call_limits()[0]) if joins \
            else None
        if short is not None:
            return short
        chars = count_chars(segments)
        if chars is not None and chars < policy.min_cached_call_chars:
            # encode_short declined it (other types, lone surrogates, too much UTF-8 to run fused): packed
            return self.engine.encode(segments, tiktoken_safe, want_ids, joins=False)
        ahead = EncodeAhead.start(self, segments, tiktoken_safe, want_ids)  # before validation: see its docstring
        if ahead is not None:
            return ahead.run(self, segments, tiktoken_safe, want_ids)
        cache, engine = self.cache, self.engine
        segments = validate_segments(segments)
        chars = count_chars(segments)  # (text, flag) tuples now
        if chars < policy.min_cached_call_chars:
            return engine.encode(segments, tiktoken_safe, want_ids, validated=True)  # neither looked up nor stored
        speculation = cache.speculate(segments, tiktoken_safe)
        plan = cache.resolve(speculation, cache.verify(speculation))  # offered texts that differ are misses too
        missing = plan.missing
        todo = segments if len(missing) == len(segments) else [segments[i] for i in missing]
        new = None
        if (chars if todo is segments else count_chars(todo)) <= policy.max_shared_in_place_chars:
            new = engine.shared_in_place_ids(todo, tiktoken_safe)  # None where there is no short-call helper
        new_ids, bounds, regather = new or engine.encode_with_regather(todo, tiktoken_safe, validated=True)
        encoded = assemble(plan, new_ids, bounds, len(segments), want_ids)
        if missing:
            # stored by a helper once this call has returned; the caller may write to what it got, so the
            # store takes a copy: gathered again from the engine's memory there when it can be (its fresh
            # pages fault in off the call's path), else made here
            if encoded.ids is not new_ids:
                kept = _given(new_ids)
            else:
                kept = regather if regather is not None else _given(new_ids.copy())
            cache.store_elsewhere(self.helpers.start, segments, tiktoken_safe, plan, kept, bounds,
                                  speculation.fingerprints)
        return encoded


def _given(ids: np.ndarray) -> Callable[[], np.ndarray]:
    """``ids``, as a ``SegmentCache.store_elsewhere`` that gathers no copy of its own takes them."""
    return lambda: ids
