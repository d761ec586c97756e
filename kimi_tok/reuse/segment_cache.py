"""Exact reuse of segment ids across calls (agent loops re-send the same prefix every turn).

The reference encodes every segment on its own, so a segment's ids depend only on
``(text, allow_special, tiktoken_safe)``: reuse is exact, not approximate.

The segments one call had to encode are stored together as a ``Run``: their texts,
their ids in one array and where each segment's ids start. A later call that sends
the same segments again, in the same order, is served a whole slice of a run; that is
what an agent loop does (turn N+1 = turn N + appended segments), so a turn at a
million tokens assembles a few dozen slices instead of looking up and concatenating
~1,500 segments. Where a call leaves a run (an edited segment, the end of the previous
turn), the run remembers which run the call stored next, and the following call tries
that one first. Segments are also found one by one (edited, removed, reordered
prompts): an index maps the fingerprint (flags, length and three short samples of the
text) of each long cached segment, and of each run's first segment, to its run and
position. Short texts (chat-template tags, roles) repeat all over a prompt: the index is
asked about them only for a call's first segment; elsewhere they are taken from a run
beside their neighbours (also backwards from a long segment the index found).

A plan is made in three steps. ``speculate`` follows runs (unless no long segment of the call
is cached: then every segment is new and nothing more is planned): the rest of a run is compared
with the call's next segments as two lists (one C loop: ``==``, which is ``is`` first;
the part that reads all the text, done by a Tokenizer on another thread while the new
segments are encoded), and only where they differ are segments matched by flags and
lengths up to the first difference (and the index's fingerprints), so the segments no
run offers are known at once; ``verify`` then compares the texts matched that way;
``resolve`` turns a segment that differs after all into a missing one. Ids of a
different text are never used. The fingerprint spares hashing every long text, which
Python would redo for every new ``str`` object a serving stack builds per request. Two
texts that share a fingerprint only cost a miss: the newer one takes the index slot, the
older stays reachable inside its run.

Memory is bounded by a byte budget (texts + ids + a fixed overhead per segment) with
least-recently-used eviction of whole runs; a lock makes it safe for concurrent
callers (the encoding of misses happens outside the lock). A run's ids never change
once stored, so the slices a plan holds stay valid if another thread evicts the run;
callers always receive a copy.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Callable
from itertools import accumulate
from operator import add, itemgetter
from typing import NamedTuple

import numpy as np

from ..engine.policy import DEFAULT_SEGMENT_CACHE_BYTES

DEFAULT_BUDGET_BYTES = DEFAULT_SEGMENT_CACHE_BYTES
MIN_CACHED_CHARS = 256  # new segments totalling less are cheaper to encode again than to store
SEGMENT_OVERHEAD_BYTES = 200  # index slot, fingerprint tuple, list slot per cached segment
RUN_OVERHEAD_BYTES = 300  # run object, ids array header, bounds list
SAMPLE_CHARS = 16  # characters sampled at the start, middle and end of a long text for its fingerprint
# Shorter texts (chat-template tags, roles, tool names) repeat all over a prompt: past a call's
# first segment they are found next to their neighbours inside a run, not through the index.
MIN_INDEXED_CHARS = 64
# A call whose long segments hold at least this share of its characters, none of them cached, is
# planned no further: runs could offer only short ones, which cost little to encode again.
MIN_LONG_SHARE = 0.875
KEY_SIZE = 8  # bytes per segment key (int64)
RECENT_CALLS = 8  # calls remembered for guessing where the next one starts being new (interleaved conversations)
ENDING_KEYS = 4  # keys of a call's last segments that a call extending it must repeat (a turn ends in template
# segments of the same lengths every time; the ones before them are not)

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


def segment_keys(segments: list[Segment]) -> np.ndarray:
    """``2 * len(text) + allow_special`` per segment: equal segments have equal keys."""
    keys = np.fromiter(map(len, map(itemgetter(0), segments)), dtype=np.int64, count=len(segments))
    keys *= 2
    keys += np.fromiter(map(itemgetter(1), segments), dtype=np.bool_, count=len(segments))
    return keys


def _keys_of(segments, start: int, end: int) -> tuple | None:
    """The keys of ``segments[start:end]`` if they are ``(str, bool)`` pairs (tuples, or lists as
    JSON gives them), else None."""
    keys = []
    for segment in segments[start:end]:
        if not (type(segment) in (tuple, list) and len(segment) == 2 and type(segment[0]) is str
                and type(segment[1]) is bool):
            return None
        keys.append(2 * len(segment[0]) + segment[1])
    return tuple(keys)


def _n_same_keys(run: Run, at: int, keys: np.ndarray, key_bytes: bytes, i: int) -> int:
    """How many segments from call index ``i`` on have the keys of ``run``'s from position ``at`` on."""
    n = min(len(run.segments) - at, keys.shape[0] - i)
    if run.key_bytes[KEY_SIZE * at:KEY_SIZE * (at + n)] == key_bytes[KEY_SIZE * i:KEY_SIZE * (i + n)]:
        return n  # one memcmp: the common case (a run repeated to its end)
    return int(np.argmin(run.keys[at:at + n] == keys[i:i + n]))


class Run:
    """Consecutive segments encoded by one call, with their ids (which never change once built).

    Made in two steps: the text side first (``Run(...)``: keys, fingerprints, size), which a
    Tokenizer does on its helper thread while the ids are still being encoded, then the ids
    (``hold``), before the run is added to a cache."""

    __slots__ = ("segments", "tiktoken_safe", "ids", "ids_address", "bounds", "key_bytes", "char_ends",
                 "fingerprints", "nbytes", "continuations", "__weakref__")

    def __init__(self, segments: list[Segment], tiktoken_safe: bool, texts: list[str], lengths: list[int],
                 known_fingerprints: dict[int, tuple] | None = None) -> None:
        """``texts`` and ``lengths``: the segments' texts and their lengths in characters;
        ``known_fingerprints``: position -> fingerprint of some of them, already computed. Built from
        lists, without NumPy: a call pays for each NumPy call its cache misses (docs/performance.md)."""
        self.segments = segments
        self.tiktoken_safe = tiktoken_safe  # the same for all segments of a run (part of their keys)
        self.ids: np.ndarray | None = None  # read-only; segment k is ids[bounds[k]:bounds[k + 1]]
        self.ids_address = 0  # where ids' memory starts (a helper thread copies from it without the GIL)
        self.bounds: list[int] = []
        # what speculate compares: 2 * length + flag, as segment_keys gives them for a call (int64 bytes)
        self.key_bytes = array("q", map(add, map(add, lengths, lengths), map(itemgetter(1), segments))).tobytes()
        self.char_ends = [0, *accumulate(lengths)]  # characters of positions < k: char_ends[k]
        indexed = [k for k, length in enumerate(lengths) if length >= MIN_INDEXED_CHARS]
        if not indexed or indexed[0] != 0:
            indexed.insert(0, 0)
        # position -> fingerprint, for the segments the index holds: the long ones and the first
        known = known_fingerprints or {}
        self.fingerprints = {k: known.get(k) or fingerprint((texts[k], segments[k][1], tiktoken_safe))
                             for k in indexed}
        self.nbytes = sum(map(sys.getsizeof, texts)) + len(segments) * SEGMENT_OVERHEAD_BYTES + RUN_OVERHEAD_BYTES
        # Hints, not data: position -> the run a call stored right after leaving this run there
        # (at its end: the next turn's appended segments; inside: an edited segment). A later
        # call leaving this run at that position tries it before the index. Weak references,
        # so an evicted run is freed.
        self.continuations: dict[int, weakref.ref[Run]] = {}

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def keys(self) -> np.ndarray:
        """The segments' keys (``segment_keys``), a view of ``key_bytes``."""
        return np.frombuffer(self.key_bytes, dtype=np.int64)

    def hold(self, ids: np.ndarray, bounds: list[int]) -> None:
        """Give the run its ids (read-only, its own): segment k is ``ids[bounds[k]:bounds[k + 1]]``."""
        self.ids = ids
        self.ids_address = ids.__array_interface__["data"][0]
        self.bounds = bounds
        self.nbytes += ids.nbytes


class CachePlan(NamedTuple):
    """How one call's ids are put together.

    ``parts`` in call order: a ``uint32`` array (ids served from a run) or a ``(j0, j1)``
    pair: the missing segments ``missing[j0:j1]``, consecutive in the call, to encode.
    """

    parts: list
    missing: list[int]
    after: list  # per stretch of missing segments: (run, position) where the call left a run right before it, or None
    sources: list  # per array of ``parts``, in order: (run, first, end), the run positions it holds the ids of
    call: "RecentCall | None" = None  # the call as remembered for later ones (its layout is set once stored)
    source_layout: "Layout | None" = None  # ``sources`` as a RecentCall remembers them (made while planning)


class Layout(NamedTuple):
    """Where consecutive parts of a call's ids come from, as ``RecentCall`` keeps it: the runs (held
    weakly), the first and end positions in each, and (address, count) of each part's ids."""

    refs: tuple
    firsts: tuple
    ends: tuple
    copies: list[int]

    @classmethod
    def of(cls, sources: list[tuple["Run", int, int]]) -> "Layout":
        copies = []
        for run, first, end in sources:
            start = run.bounds[first]
            copies += (run.ids_address + run.ids.itemsize * start, run.bounds[end] - start)
        return cls(tuple(weakref.ref(run) for run, _, _ in sources), tuple(first for _, first, _ in sources),
                   tuple(end for _, _, end in sources), copies)

    def __add__(self, other: "Layout") -> "Layout":
        return Layout(self.refs + other.refs, self.firsts + other.firsts, self.ends + other.ends,
                      self.copies + other.copies)


class RecentCall:
    """What a later call needs to know of a recent one it may extend: its segment count, the keys
    of its last segments, its characters, and where its ids came from once it is planned and
    stored (``layout``: the runs, held weakly, and the first and end positions of each stretch, in
    call order; None if a stretch was not kept; ``copies``: (address, count) of each stretch's ids,
    an int64 array). A Tokenizer copies those ids into the next turn's output before the next plan
    confirms them (``reuse.EncodeAhead``)."""

    __slots__ = ("n_segments", "ending", "chars", "tiktoken_safe", "layout", "copies", "n_ids")

    def __init__(self, n_segments: int, ending: tuple, chars: int, tiktoken_safe: bool) -> None:
        self.n_segments = n_segments
        self.ending = ending
        self.chars = chars
        self.tiktoken_safe = tiktoken_safe
        self.layout: tuple[tuple[weakref.ref, ...], tuple[int, ...], tuple[int, ...]] | None = None
        self.copies: np.ndarray | None = None
        self.n_ids = 0  # the ids of the layout, all together

    def runs(self) -> list[Run] | None:
        """The layout's runs (strong references), or None if it is unknown or a run is gone."""
        if self.layout is None:
            return None
        runs = list(map(weakref.ReferenceType.__call__, self.layout[0]))  # one C loop over the weak references
        return None if None in runs else runs


class Span(NamedTuple):
    """Call segments ``at .. at + (end - first) - 1`` are run positions ``first .. end - 1``;
    ``verified``: their texts and flags were compared already (``verify`` skips them)."""

    run: Run
    first: int
    end: int
    at: int
    verified: bool = False


class Speculation(NamedTuple):
    """A plan whose texts are not compared yet: ``spans`` matched on flags and lengths only
    (or the index's fingerprint); ``missing`` are the call's segments no run offered."""

    spans: list[Span]
    missing: list[int]
    segments: list[Segment]
    tiktoken_safe: bool
    fingerprints: dict[int, tuple]  # call index -> fingerprint, of the missing segments looked up in the index
    call: RecentCall | None = None  # this call, as remembered for later ones


_STORING: weakref.WeakSet = weakref.WeakSet()  # caches a helper thread may be storing into (store_elsewhere)


def _settle_all() -> None:
    """Before a fork: wait for the stores helpers are making, so that a child inherits no lock or run half made."""
    for cache in list(_STORING):
        cache.settle()


def _settle_at_exit() -> None:
    """At exit: wait for the stores helpers are making, so that none runs (compiled code among it) while the
    interpreter tears down; a store's error is of no use to anyone by then, and the other caches are still
    waited for."""
    for cache in list(_STORING):
        try:
            cache.settle()
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_settle_all)
atexit.register(_settle_at_exit)


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
        # the latest calls, newest last: where a call that extends one of them is likely to start being new
        # (``recent_call_ending``), and where its ids came from
        self._recent_calls: list[RecentCall] = []
        self._pending: list[tuple[int, object]] = []  # (process id, handle) of stores a helper thread makes

    @property
    def used_bytes(self) -> int:
        self.settle()
        return self._used

    def __len__(self) -> int:
        """The number of cached segments."""
        self.settle()
        return self._n_segments

    def settle(self) -> None:
        """Wait for the stores handed to helper threads (``store_elsewhere``); their errors are raised here.
        Every reader of what the cache holds calls it first, so a call sees what the calls before it stored."""
        pid = os.getpid()
        while self._pending:
            try:
                owner, pending = self._pending.pop()  # atomic: each handle is waited for once
            except IndexError:  # another thread took the last one
                break
            if owner == pid:  # a child forked past the hook below has none of its parent's threads to wait for
                pending.result()

    def plan(self, segments: list[Segment], tiktoken_safe: bool) -> CachePlan:
        """Find the cached ones among validated ``segments``; see ``CachePlan``.

        ``speculate``, ``verify`` and ``resolve`` in a row (a Tokenizer runs ``verify`` on
        another thread while it encodes the segments ``speculate`` could not offer).
        """
        speculation = self.speculate(segments, tiktoken_safe)
        return self.resolve(speculation, self.verify(speculation))

    def speculate(self, segments: list[Segment], tiktoken_safe: bool) -> Speculation:
        """Offer cached segments for validated ``segments``, comparing texts where that is one
        C loop, flags and lengths elsewhere.

        While the call repeats a run, the rest of the run is compared with the call's next
        segments as two lists (texts and flags: ``==``, ``is`` first), a verified span when
        equal. Where they differ, segments are matched by their keys (length and flag) up to
        the first difference (``verify`` compares those texts later). The index is consulted
        only where a run's chain breaks, and only for texts long enough to be indexed (a match
        there: equal fingerprints, then equal texts). A hit in the middle of a run also takes
        the segments just before it that equal the run's, backwards (a call opening with short
        chat-template segments). A segment that differs after all is looked up on its own or
        encoded (``resolve``). The comparisons hold no lock: runs never change.

        First of all the long segments are looked up in the index (``_chars_if_long_ones_are_new``): if
        none is there and they hold ``MIN_LONG_SHARE`` of the characters, every segment is missing and no
        run is followed (the short ones a run could offer cost less to encode than to find).
        """
        self.settle()
        spans: list[Span] = []
        missing: list[int] = []
        fingerprints: dict[int, tuple] = {}
        index = self._index
        n = len(segments)
        chars = self._chars_if_long_ones_are_new(segments, tiktoken_safe, fingerprints)
        if chars is not None:
            return self._speculation(segments, tiktoken_safe, spans, list(range(n)), fingerprints, chars)
        keys = key_bytes = None  # the call's keys, computed only if a run and the call differ
        run: Run | None = None
        span_start = at = 0  # the current span: run positions span_start..at-1
        span_at = 0  # call index of the current span's first segment
        verified = True  # the current span's texts are compared
        i = 0
        while i < n:
            if run is not None:
                rest = min(len(run) - at, n - i)
                if run.segments[at:at + rest] == segments[i:i + rest]:
                    same = rest
                else:
                    if keys is None:
                        keys = segment_keys(segments)
                        key_bytes = keys.tobytes()
                    same = _n_same_keys(run, at, keys, key_bytes, i)
                    verified = verified and run.segments[at:at + same] == segments[i:i + same]
                at += same
                i += same
                if i == n:
                    break
                spans.append(Span(run, span_start, at, span_at, verified))
                with self._lock:
                    hint = run.continuations.get(at)
                    following = hint() if hint is not None else None
                    # an evicted run may live on (a concurrent call still holds it): never offer it
                    if following is not None and (following not in self._runs
                                                  or following.tiktoken_safe != tiktoken_safe):
                        following = None
                run = None
                if following is not None and following.segments[0] == segments[i]:
                    with self._lock:
                        if following in self._runs:
                            self._runs.move_to_end(following)
                    run, span_start, at, span_at, verified = following, 0, 1, i, True
                    i += 1
                    continue
            text, allow = segments[i]
            found = None
            if len(text) >= MIN_INDEXED_CHARS or i == 0:
                if i not in fingerprints:
                    fingerprints[i] = fingerprint((text, allow, tiktoken_safe))
                with self._lock:
                    found = index.get(fingerprints[i])
                    if found is not None:
                        self._runs.move_to_end(found[0])
            if found is None or found[0].segments[found[1]] != segments[i]:
                missing.append(i)
                i += 1
                continue
            run, at = found
            span_start, span_at, verified = at, i, True
            at += 1
            i += 1
            # take the missing segments just before it that equal the run's, backwards
            while (span_start > 0 and missing and missing[-1] == span_at - 1
                   and run.segments[span_start - 1] == segments[span_at - 1]):
                missing.pop()
                span_start -= 1
                span_at -= 1
        if run is not None:
            spans.append(Span(run, span_start, at, span_at, verified))
        chars = (sum(span.run.char_ends[span.end] - span.run.char_ends[span.first] for span in spans)
                 + sum(len(segments[j][0]) for j in missing))
        return self._speculation(segments, tiktoken_safe, spans, missing, fingerprints, chars)

    def _speculation(self, segments: list[Segment], tiktoken_safe: bool, spans: list[Span], missing: list[int],
                     fingerprints: dict[int, tuple], chars: int) -> Speculation:
        """The speculation of ``spans`` and ``missing``, the call (of ``chars`` characters) remembered."""
        ending = tuple(2 * len(text) + allow for text, allow in segments[max(0, len(segments) - ENDING_KEYS):])
        call = RecentCall(len(segments), ending, chars, tiktoken_safe)
        with self._lock:
            self._remember_call(call)
        return Speculation(spans, missing, segments, tiktoken_safe, fingerprints, call)

    def _chars_if_long_ones_are_new(self, segments: list[Segment], tiktoken_safe: bool,
                                    fingerprints: dict[int, tuple]) -> int | None:
        """The characters of ``segments`` if the index holds none of the long ones and they hold at least
        ``MIN_LONG_SHARE`` of the characters, else None (at the first one it holds). The fingerprints computed
        are kept in ``fingerprints``."""
        index = self._index
        chars = long_chars = 0
        with self._lock:
            for i, (text, allow) in enumerate(segments):
                n = len(text)
                chars += n
                if n >= MIN_INDEXED_CHARS:
                    long_chars += n
                    fingerprints[i] = found = fingerprint((text, allow, tiktoken_safe))
                    if found in index:
                        return None
        return chars if long_chars >= MIN_LONG_SHARE * chars else None

    def _remember_call(self, call: RecentCall) -> None:
        calls = self._recent_calls
        calls[:] = [c for c in calls if (c.n_segments, c.ending) != (call.n_segments, call.ending)]
        calls.append(call)
        del calls[:-RECENT_CALLS]

    def recent_call_ending(self, segments, tiktoken_safe: bool) -> RecentCall | None:
        """A recent call that ``segments`` (not yet validated) may extend: the longest with at most
        len(segments) segments whose last ``ENDING_KEYS`` segments have the keys of
        ``segments[n - ENDING_KEYS:n]`` (n: its segment count). None if there is none, or if it is
        as long as ``segments`` (a call sent again: nothing new to encode ahead). A guess, checked
        later like any offer."""
        self.settle()
        with self._lock:
            calls = sorted(self._recent_calls, key=lambda c: c.n_segments, reverse=True)
        for call in calls:
            n = call.n_segments
            if (call.tiktoken_safe == tiktoken_safe and 0 < n <= len(segments)
                    and _keys_of(segments, n - len(call.ending), n) == call.ending):
                return call if n < len(segments) else None
        return None

    @staticmethod
    def verify(speculation: Speculation, spans: list[Span] | None = None) -> list[int]:
        """The call indices, in order, of the offered segments whose text differs after all
        (of ``spans``, a part of ``speculation.spans``, if given).

        Runs never change once stored, so this needs no lock (and may run on another thread
        while the missing segments are encoded). A span is compared as a whole first: a
        C loop over the segments, ``is`` before ``==`` for each text.
        """
        segments = speculation.segments
        failed: list[int] = []
        for run, first, end, at, verified in speculation.spans if spans is None else spans:
            if verified:
                continue
            offered = run.segments[first:end]
            if offered == segments[at:at + end - first]:
                continue
            for k, (cached, call) in enumerate(zip(offered, segments[at:at + end - first])):
                if not (cached[1] is call[1] and cached[0] == call[0]):
                    failed.append(at + k)
        return failed

    def resolve(self, speculation: Speculation, failed: list[int]) -> CachePlan:
        """The plan once ``verify`` found ``failed``: the spans they were offered in are cut
        around them, and each is looked up on its own (index, compared in full) or missing."""
        parts: list = []
        sources: list = []
        missing: list[int] = []
        after: list = []
        left = None  # (run, position) where the latest span part ended
        stretch = -1  # while segments are missing: where their stretch starts in ``missing``
        spec_missing = speculation.missing
        if not speculation.spans:  # nothing offered: one stretch of missing segments
            return self._plan_of(speculation, [(0, len(spec_missing))] if spec_missing else [], list(spec_missing),
                                 [None] if spec_missing else [], sources)
        m = f = 0

        def add_missing(i: int) -> None:
            nonlocal stretch
            if stretch < 0:
                stretch = len(missing)
                after.append(left if parts else None)
            missing.append(i)

        def add_span(run: Run, first: int, end: int) -> None:
            nonlocal stretch, left
            if stretch >= 0:
                parts.append((stretch, len(missing)))
                stretch = -1
            parts.append(run.ids[run.bounds[first]:run.bounds[end]])
            sources.append((run, first, end))
            left = (run, end)

        for run, first, end, at, _ in speculation.spans:
            while m < len(spec_missing) and spec_missing[m] < at:
                add_missing(spec_missing[m])
                m += 1
            stop = at + end - first
            while f < len(failed) and failed[f] < stop:
                bad = failed[f]
                f += 1
                if bad > at:
                    add_span(run, first, first + bad - at)
                found = self._find(speculation.segments[bad], speculation.tiktoken_safe)
                if found is None:
                    add_missing(bad)
                else:
                    add_span(found[0], found[1], found[1] + 1)
                first += bad + 1 - at
                at = bad + 1
            if at < stop:
                add_span(run, first, end)
        while m < len(spec_missing):
            add_missing(spec_missing[m])
            m += 1
        if stretch >= 0:
            parts.append((stretch, len(missing)))
        return self._plan_of(speculation, parts, missing, after, sources)

    def _plan_of(self, speculation: Speculation, parts: list, missing: list[int], after: list,
                 sources: list) -> CachePlan:
        """The plan of ``parts`` (counted as hits and misses), with its layout made."""
        with self._lock:
            self.hits += len(speculation.segments) - len(missing)
            self.misses += len(missing)
        # made here (a Tokenizer plans on its helper thread), so that the store at the end of the call
        # only appends its new runs
        layout = Layout.of(sources) if speculation.call is not None else None
        plan = CachePlan(parts, missing, after, sources, speculation.call, layout)
        if not missing:
            self._set_layout(plan, [])
        return plan

    @staticmethod
    def _set_layout(plan: CachePlan, stored: list[Run | None]) -> None:
        """Remember where the planned call's ids came from: its sources and the runs ``stored`` for
        its stretches of missing segments, in call order (see ``RecentCall``)."""
        if plan.call is None or plan.source_layout is None or None in stored:
            return  # a stretch not kept: the next call encodes it again, so no layout to copy
        new = Layout.of([(run, 0, len(run)) for run in stored]) if stored else None
        n_cached = len(plan.sources)
        if new is None:
            layout = plan.source_layout  # every segment was cached
        elif all(isinstance(part, tuple) for part in plan.parts[n_cached:]):
            layout = plan.source_layout + new  # the common case: the new segments come last
        else:  # stretches between cached parts: interleave them in call order
            at = {"cached": 0, "new": 0}
            refs, firsts, ends, copies = [], [], [], []
            for part in plan.parts:
                kind = "new" if isinstance(part, tuple) else "cached"
                source, k = (new if kind == "new" else plan.source_layout), at[kind]
                at[kind] += 1
                refs.append(source.refs[k])
                firsts.append(source.firsts[k])
                ends.append(source.ends[k])
                copies += source.copies[2 * k:2 * k + 2]
            layout = Layout(tuple(refs), tuple(firsts), tuple(ends), copies)
        plan.call.copies = np.array(layout.copies, dtype=np.int64)
        plan.call.n_ids = sum(layout.copies[1::2])
        plan.call.layout = layout[:3]

    def _find(self, segment: Segment, tiktoken_safe: bool) -> tuple[Run, int] | None:
        """``(run, position)`` of a text the index holds, compared in full, or None."""
        text, allow = segment
        with self._lock:
            found = self._index.get(fingerprint((text, allow, tiktoken_safe)))
        if found is None or found[0].segments[found[1]] != segment:
            return None
        return found

    def draft_runs(self, segments: list[Segment], tiktoken_safe: bool, plan: CachePlan,
                   fingerprints: dict[int, tuple] | None = None) -> list[Run | None]:
        """The runs ``store`` will add for ``plan``'s stretches of missing segments, without their
        ids (None for a stretch too short to keep): the text side of a store, which needs no ids.
        ``fingerprints``: call index -> fingerprint already computed (``Speculation.fingerprints``)."""
        drafts: list[Run | None] = []
        for part in plan.parts:
            if isinstance(part, np.ndarray):
                continue
            first, end = plan.missing[part[0]], plan.missing[part[1] - 1] + 1
            known = {i - first: fp for i, fp in fingerprints.items() if first <= i < end} if fingerprints else None
            drafts.append(self._draft_run(segments[first:end], tiktoken_safe, known))
        return drafts

    @staticmethod
    def _draft_run(segments: list[Segment], tiktoken_safe: bool, known_fingerprints=None) -> Run | None:
        texts = list(map(itemgetter(0), segments))
        lengths = list(map(len, texts))
        if sum(lengths) < MIN_CACHED_CHARS:
            return None
        return Run(segments, tiktoken_safe, texts, lengths, known_fingerprints)

    def store(self, segments: list[Segment], tiktoken_safe: bool, plan: CachePlan,
              ids: np.ndarray, bounds: np.ndarray, drafts: list[Run | None] | None = None, owned: bool = False) -> None:
        """Store the segments a call encoded: ``segments[plan.missing[j]]`` has ids
        ``ids[bounds[j]:bounds[j + 1]]``; each stretch of consecutive ones becomes a run
        (``drafts``: those runs from ``draft_runs``, made earlier). ``owned``: nobody else holds ``ids``,
        so a run of all of them keeps the array instead of a copy."""
        if drafts is None:
            drafts = self.draft_runs(segments, tiktoken_safe, plan)
        stretches = (part for part in plan.parts if not isinstance(part, np.ndarray))
        for (j0, j1), after, run in zip(stretches, plan.after, drafts):
            if run is not None:
                self._add_run(run, ids, bounds[j0:j1 + 1], after, owned)
        self._set_layout(plan, drafts)

    def store_elsewhere(self, start: Callable, segments: list[Segment], tiktoken_safe: bool, plan: CachePlan,
                        ids: Callable[[], np.ndarray], bounds: np.ndarray, fingerprints: dict[int, tuple]) -> None:
        """``draft_runs`` and ``store`` on the helper thread ``start`` hands them to (``HelperThreads.start``),
        so that the call returns first, or on this thread when it returns None. ``ids()``: the call's new ids,
        in an array nobody else holds or writes to (made there). Readers of the cache wait for it (``settle``)."""
        def store() -> None:
            self.store(segments, tiktoken_safe, plan, ids(), bounds,
                       self.draft_runs(segments, tiktoken_safe, plan, fingerprints), owned=True)

        pending = start(store)
        if pending is None:
            store()
        else:
            self._pending.append((os.getpid(), pending))
            _STORING.add(self)

    def _add_run(self, run: Run, ids: np.ndarray, bounds: np.ndarray, after: tuple[Run, int] | None = None,
                 owned: bool = False) -> None:
        """Add a drafted ``run`` with its ids ``ids[bounds[0]:bounds[-1]]`` (copied, unless ``owned`` and they
        are all of an array that owns its memory: then kept, and never written again)."""
        first, end = int(bounds[0]), int(bounds[-1])
        if owned and first == 0 and end == ids.shape[0] and ids.base is None and ids.dtype == np.uint32:
            stored = ids  # its memory is the run's size: the byte budget counts it right
        else:
            stored = np.array(ids[first:end], dtype=np.uint32, copy=True)  # callers may write to what they got
        stored.setflags(write=False)
        run.hold(stored, (bounds - first).tolist())
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
        run = self._draft_run([(text, allow)], tiktoken_safe)
        if run is not None:
            self._add_run(run, ids, np.array([0, len(ids)], dtype=np.int64))

    def clear(self) -> None:
        self.settle()
        with self._lock:
            self._recent_calls.clear()
            self._runs.clear()
            self._index.clear()
            self._used = 0
            self._n_segments = 0
