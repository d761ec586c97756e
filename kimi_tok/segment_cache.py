"""Exact reuse of segment ids across calls (agent loops re-send the same prefix every turn).

The reference encodes every segment on its own, so a segment's ids depend only on
``(text, allow_special, tiktoken_safe)``: reuse is exact, not approximate.

The segments one call had to encode are stored together as a ``Run``: their texts,
their ids in one array and where each segment's ids start. A later call that sends
the same segments again, in the same order, is served a whole slice of a run with
one text comparison per segment and no lookup; that is what an agent loop does
(turn N+1 = turn N + appended segments), so a turn at a million tokens assembles a
few dozen slices instead of looking up and concatenating ~1,500 segments. Where a call
leaves a run (an edited segment, the end of the previous turn), the run remembers which
run the call stored next, and the following call tries that one first. Segments are
also found one by one (edited, removed, reordered prompts): an index maps the
fingerprint (flags, length and three short samples of the text) of each long cached
segment, and of each run's first segment, to its run and position. Short texts
(chat-template tags, roles) repeat all over a prompt: the index is asked about them
only for a call's first segment; elsewhere they are taken from a run beside their
neighbours (also backwards from a long segment the index found).

A hit always compares the whole text (``==``, which is ``is`` first): it can never
return the ids of a different text. The fingerprint spares hashing every long text,
which Python would redo for every new ``str`` object a serving stack builds per
request. Two texts that share a fingerprint only cost a miss: the newer one takes the
index slot, the older stays reachable inside its run.

Memory is bounded by a byte budget (texts + ids + a fixed overhead per segment) with
least-recently-used eviction of whole runs; a lock makes it safe for concurrent
callers (the encoding of misses happens outside the lock). A run's ids never change
once stored, so the slices a plan holds stay valid if another thread evicts the run;
callers always receive a copy.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections import OrderedDict
from operator import itemgetter
from typing import NamedTuple

import numpy as np

DEFAULT_BUDGET_BYTES = 256 << 20
MIN_CACHED_CHARS = 256  # new segments totalling less are cheaper to encode again than to store
SEGMENT_OVERHEAD_BYTES = 200  # index slot, fingerprint tuple, list slot per cached segment
RUN_OVERHEAD_BYTES = 300  # run object, ids array header, bounds list
SAMPLE_CHARS = 16  # characters sampled at the start, middle and end of a long text for its fingerprint
# Shorter texts (chat-template tags, roles, tool names) repeat all over a prompt: past a call's
# first segment they are found next to their neighbours inside a run, not through the index.
MIN_INDEXED_CHARS = 64

Key = tuple[str, bool, bool]
Segment = tuple[str, bool]


def fingerprint(key: Key) -> tuple:
    """A cheap stand-in for hashing the whole text; equal texts always share it."""
    text, allow_special, tiktoken_safe = key
    if len(text) <= 3 * SAMPLE_CHARS:
        return (text, allow_special, tiktoken_safe)
    middle = len(text) // 2
    return (len(text), allow_special, tiktoken_safe, text[:SAMPLE_CHARS],
            text[middle:middle + SAMPLE_CHARS], text[-SAMPLE_CHARS:])


def check_segment_cache_bytes(value) -> None:
    """``segment_cache_bytes`` is None or a non-negative int (0 and None: no cache)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"segment_cache_bytes must be a non-negative int or None, not {value!r}")


class Run:
    """Consecutive segments encoded by one call, with their ids (which never change once built)."""

    __slots__ = ("segments", "tiktoken_safe", "ids", "bounds", "fingerprints", "nbytes", "continuations",
                 "__weakref__")

    def __init__(self, segments: list[Segment], tiktoken_safe: bool, ids: np.ndarray, bounds: list[int],
                 texts: list[str], lengths: np.ndarray) -> None:
        """``texts`` and ``lengths``: the segments' texts and their lengths in characters."""
        self.segments = segments
        self.tiktoken_safe = tiktoken_safe  # the same for all segments of a run (part of their keys)
        self.ids = ids  # read-only; segment k is ids[bounds[k]:bounds[k + 1]]
        self.bounds = bounds
        indexed = np.flatnonzero(lengths >= MIN_INDEXED_CHARS).tolist()
        if not indexed or indexed[0] != 0:
            indexed.insert(0, 0)
        # position -> fingerprint, for the segments the index holds: the long ones and the first
        self.fingerprints = {k: fingerprint((texts[k], segments[k][1], tiktoken_safe)) for k in indexed}
        self.nbytes = (sum(map(sys.getsizeof, texts)) + ids.nbytes
                       + len(segments) * SEGMENT_OVERHEAD_BYTES + RUN_OVERHEAD_BYTES)
        # Hints, not data: position -> the run a call stored right after leaving this run there
        # (at its end: the next turn's appended segments; inside: an edited segment). A later
        # call leaving this run at that position tries it before the index. Weak references,
        # so an evicted run is freed.
        self.continuations: dict[int, weakref.ref[Run]] = {}

    def __len__(self) -> int:
        return len(self.segments)


class CachePlan(NamedTuple):
    """How one call's ids are put together.

    ``parts`` in call order: a ``uint32`` array (ids served from a run) or a ``(j0, j1)``
    pair: the missing segments ``missing[j0:j1]``, consecutive in the call, to encode.
    """

    parts: list
    missing: list[int]
    after: list  # per stretch of missing segments: (run, position) where the call left a run right before it, or None


class SegmentCache:
    """``(text, allow_special, tiktoken_safe) -> uint32 ids``, stored in runs, LRU within ``budget_bytes``.

    >>> cache = SegmentCache(budget_bytes=1 << 20)
    >>> cache.put(("x" * 300, False, True), np.arange(3, dtype=np.uint32))
    >>> cache.get(("x" * 300, False, True))
    array([0, 1, 2], dtype=uint32)
    """

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be a non-negative int, not {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self._runs: OrderedDict[Run, None] = OrderedDict()  # least recently used first
        self._index: dict[tuple, tuple[Run, int]] = {}  # fingerprint -> (run, position)
        self._used = 0
        self._n_segments = 0
        self._lock = threading.Lock()
        self.hits = 0  # segments served from the cache
        self.misses = 0  # segments that had to be encoded

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        """The number of cached segments."""
        return self._n_segments

    def plan(self, segments: list[Segment], tiktoken_safe: bool) -> CachePlan:
        """Find the cached ones among validated ``segments``; see ``CachePlan``.

        While the call repeats a run segment after segment, each segment costs one text
        comparison; the index is consulted only where that chain breaks, and only for
        texts long enough to be indexed. A hit in the middle of a run also takes the
        segments just before it that match the run backwards (a call opening with short
        chat-template segments).
        """
        parts: list = []
        missing: list[int] = []
        after: list = []  # per stretch of missing segments: (run, position) where the call left a run just before
        used: list[Run] = []
        left: tuple[Run, int] | None = None  # where the span closed last left its run
        index = self._index
        run: Run | None = None
        span_start = at = 0  # the current span: run positions span_start..at-1
        stretch = -1  # while segments are missing: where their stretch starts in ``missing``
        with self._lock:
            for i, (text, allow) in enumerate(segments):
                if run is not None:
                    if at < len(run.segments):
                        cached_text, cached_allow = run.segments[at]
                        if cached_allow is allow and cached_text == text:
                            at += 1
                            continue
                    parts.append(run.ids[run.bounds[span_start]:run.bounds[at]])
                    left = (run, at)
                    hint = run.continuations.get(at)
                    following = hint() if hint is not None else None
                    run = None
                    if following is not None and following.tiktoken_safe == tiktoken_safe:
                        cached_text, cached_allow = following.segments[0]
                        if cached_allow is allow and cached_text == text:
                            run, span_start, at = following, 0, 1
                            used.append(run)
                            continue
                found = (index.get(fingerprint((text, allow, tiktoken_safe)))
                         if len(text) >= MIN_INDEXED_CHARS or i == 0 else None)
                if found is not None and found[0].segments[found[1]][0] == text:
                    run, at = found
                    span_start = at
                    at += 1
                    used.append(run)
                    while span_start > 0 and len(missing) > stretch >= 0 and missing[-1] == i - (at - span_start):
                        cached_text, cached_allow = run.segments[span_start - 1]
                        text_before, allow_before = segments[missing[-1]]
                        if not (cached_allow is allow_before and cached_text == text_before):
                            break
                        missing.pop()  # served by this run after all
                        span_start -= 1
                    if stretch >= 0:
                        if len(missing) > stretch:
                            parts.append((stretch, len(missing)))
                        else:
                            after.pop()  # the whole stretch was served by the run
                        stretch = -1
                    continue
                if stretch < 0:
                    stretch = len(missing)
                    after.append(left if parts else None)
                missing.append(i)
            if stretch >= 0:
                parts.append((stretch, len(missing)))
            if run is not None:
                parts.append(run.ids[run.bounds[span_start]:run.bounds[at]])
            for run in used:
                self._runs.move_to_end(run)
            self.hits += len(segments) - len(missing)
            self.misses += len(missing)
        return CachePlan(parts, missing, after)

    def store(self, segments: list[Segment], tiktoken_safe: bool, plan: CachePlan,
              ids: np.ndarray, bounds: np.ndarray) -> None:
        """Store the segments a call encoded: ``segments[plan.missing[j]]`` has ids
        ``ids[bounds[j]:bounds[j + 1]]``; each stretch of consecutive ones becomes a run."""
        stretches = (part for part in plan.parts if not isinstance(part, np.ndarray))
        for (j0, j1), after in zip(stretches, plan.after):
            first, end = plan.missing[j0], plan.missing[j1 - 1] + 1
            self._add_run(segments[first:end], tiktoken_safe, ids, bounds[j0:j1 + 1], after)

    def _add_run(self, segments: list[Segment], tiktoken_safe: bool, ids: np.ndarray, bounds: np.ndarray,
                 after: tuple[Run, int] | None = None) -> None:
        texts = list(map(itemgetter(0), segments))
        lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        if lengths.sum() < MIN_CACHED_CHARS:
            return
        first, end = int(bounds[0]), int(bounds[-1])
        stored = np.array(ids[first:end], dtype=np.uint32, copy=True)  # callers may write to what they got
        stored.setflags(write=False)
        run = Run(segments, tiktoken_safe, stored, (bounds - first).tolist(), texts, lengths)
        if run.nbytes > self.budget_bytes:
            return
        with self._lock:
            self._runs[run] = None
            self._used += run.nbytes
            self._n_segments += len(run)
            for position, key in run.fingerprints.items():
                found = self._index.get(key)
                # an equal text keeps its older slot (where a conversation starts); a different text
                # sharing the fingerprint takes it
                if found is None or found[0].segments[found[1]][0] != run.segments[position][0]:
                    self._index[key] = (run, position)
            if after is not None:
                after_run, position = after
                after_run.continuations[position] = weakref.ref(run)
            while self._used > self.budget_bytes:
                self._evict_oldest()

    def _evict_oldest(self) -> None:
        run, _ = self._runs.popitem(last=False)
        self._used -= run.nbytes
        self._n_segments -= len(run)
        for position, key in run.fingerprints.items():
            found = self._index.get(key)
            if found is not None and found[0] is run and found[1] == position:
                del self._index[key]

    def get(self, key: Key) -> np.ndarray | None:
        """The ids of one segment, or None."""
        text, allow, tiktoken_safe = key
        parts = self.plan([(text, allow)], tiktoken_safe).parts
        return parts[0] if parts and isinstance(parts[0], np.ndarray) else None

    def put(self, key: Key, ids: np.ndarray) -> None:
        """Store one segment's ids (a private read-only copy); entries larger than the budget are not kept."""
        text, allow, tiktoken_safe = key
        self._add_run([(text, allow)], tiktoken_safe, ids, np.array([0, len(ids)], dtype=np.int64))

    def clear(self) -> None:
        with self._lock:
            self._runs.clear()
            self._index.clear()
            self._used = 0
            self._n_segments = 0
