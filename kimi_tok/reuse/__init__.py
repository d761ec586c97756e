"""Reuse across calls: an agent loop re-sends its prefix every turn, and a segment's ids depend
only on ``(text, allow_special, tiktoken_safe)``, so they are reused exactly.

``SegmentReuse`` is what a Tokenizer with a segment cache hands its calls to: it plans each
call against the cache (``segment_cache``), has the engine encode only the segments the cache
does not hold, and stores them. A call that extends a recent one (an agent loop's next turn)
encodes its new segments while a helper thread plans it (``encode_ahead``; helpers wait in
compiled code on Linux: ``parking``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..engine.engine import Encoded, Engine
from ..engine.policy import Policy
from ..pipeline.segments import validate_segments
from .encode_ahead import EncodeAhead, HelperThreads, OutputMemory, assemble, merge_encodings
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

    def encode(self, segments: Sequence, tiktoken_safe: bool, want_ids: bool = True) -> Encoded:
        """The call's ids (or only their count), encoding only the segments the cache does not
        hold, then caching them."""
        ahead = EncodeAhead.start(self, segments, tiktoken_safe, want_ids)
        if ahead is not None:
            return ahead.run(self, segments, tiktoken_safe, want_ids)
        cache, engine = self.cache, self.engine
        segments = validate_segments(segments)
        speculation = cache.speculate(segments, tiktoken_safe)
        todo = segments if len(speculation.missing) == len(segments) else [segments[i] for i in speculation.missing]
        failed = cache.verify(speculation)
        new_ids, bounds = engine.encode_with_bounds(todo, tiktoken_safe, validated=True)
        plan = cache.resolve(speculation, failed)
        if len(plan.missing) > len(speculation.missing):  # offered texts that differ after all
            new_ids, bounds = self._add_late_misses(segments, tiktoken_safe, speculation.missing, new_ids, bounds,
                                                    plan.missing)
        if plan.missing:
            cache.store(segments, tiktoken_safe, plan, new_ids, bounds,
                        cache.draft_runs(segments, tiktoken_safe, plan, speculation.fingerprints))
        return assemble(plan, new_ids, bounds, len(segments), want_ids)

    def _add_late_misses(self, segments, tiktoken_safe: bool, first_missing: list[int], ids: np.ndarray,
                         bounds: np.ndarray, all_missing: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Encode the offered segments that ``verify`` rejected and merge all new ids in call order."""
        known = set(first_missing)
        late = [i for i in all_missing if i not in known]
        late_ids, late_bounds = self.engine.encode_with_bounds([segments[i] for i in late], tiktoken_safe,
                                                               validated=True)
        return merge_encodings(all_missing, [(first_missing, ids, bounds), (late, late_ids, late_bounds)])
