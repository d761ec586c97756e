"""Where an agent loop's last turn spends its time, thread by thread.

    python -m bench.turn_timeline                  # 12 cached tokenizers, ~1M-token conversation
    python -m bench.turn_timeline --instances 6 --target-tokens 300_000

Builds the ``bench.agent_loop`` conversation, brings each cached tokenizer to the turn before
the last, then encodes the last turn with each: half of them untimed inside (the plain
median, against basetenkenizer's call right before each when it is installed), the other half
with the stages wrapped to print when each began and ended, in milliseconds from the call's
start, on the thread that ran it (``Main``: the caller; ``plan_0``...: helper threads). The
wrappers cost a few microseconds each. Used to find what is on the critical path (docs/agent-loops.md,
"Agent loops").
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import threading
import time
from collections.abc import Sequence

import kimi_tok
import kimi_tok.engine.engine as engine_module
import kimi_tok.reuse.encode_ahead as reuse
import kimi_tok.reuse.parking as parking
from kimi_tok.engine.parts import SharedParts
from bench import settled
from bench.agent_loop import chars_per_token, conversation, make_cached_tokenizers, rerender
from kimi_tok.reuse.segment_cache import SegmentCache

# (owner, attribute, label, is a staticmethod)
STAGES = [
    (reuse, "validate_segments", "valid", False),
    (engine_module, "pack_segments", "pack", False),
    (engine_module.Engine, "encode_fused", "enc", False),
    (SharedParts, "__init__", "cut", False),
    (SharedParts, "work", "parts", False),
    (SharedParts, "ids_and_bounds", "gather", False),
    (SegmentCache, "speculate", "spec", False),
    (SegmentCache, "verify", "verify", True),
    (SegmentCache, "resolve", "resolve", False),
    (reuse.OutputMemory, "take", "take", False),
    (reuse.HelperThreads, "post", "post", False),  # wakes a parked helper, which copies the cached ids ahead
    (parking.Posted, "result", "wait", False),  # until the parked helper is done
    (reuse, "copy_parts", "copy", False),  # the cached ids copied by the plan (no parked helper, or a wrong guess)
    (SegmentCache, "store", "store", False),
    (SegmentCache, "draft_runs", "draft", False),
]


class Timeline:
    """Wraps the stages; ``marks`` holds ``(label, thread, ms since start)``."""

    def __init__(self) -> None:
        self.start = 0.0
        self.marks: list[tuple[str, str, float]] = []

    def wrap_all(self) -> None:
        for owner, attr, label, static in STAGES:
            self._wrap(owner, attr, label, static)

    def _wrap(self, owner, attr, label: str, static: bool) -> None:
        inner = getattr(owner, attr)

        def timed(*args, **kwargs):
            self._mark(label + ">")
            try:
                return inner(*args, **kwargs)
            finally:
                self._mark(label + "<")

        setattr(owner, attr, staticmethod(timed) if static else timed)

    def _mark(self, label: str) -> None:
        name = threading.current_thread().name
        self.marks.append((label, "Main" if name == "MainThread" else name.rsplit("-", 1)[-1],
                           (time.perf_counter() - self.start) * 1e3))

    def line(self) -> str:
        return " ".join(f"{label}@{thread}:{ms:.2f}" for label, thread, ms in self.marks)


def load_baseline():
    try:
        from bench.bench import load_basetenkenizer

        return load_basetenkenizer()
    except Exception as exc:  # not installed: the timeline still runs
        print(f"(basetenkenizer not used: {type(exc).__name__}: {exc})", file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.turn_timeline", description=__doc__.split("\n")[0])
    p.add_argument("--instances", type=int, default=12, help="cached tokenizers (half timed inside)")
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--target-tokens", type=lambda s: int(s.replace("_", "")), default=1_000_000)
    p.add_argument("--seed", type=int, default=2024)
    args = p.parse_args(argv)
    if args.instances < 2 or args.turns < 2:
        p.error("--instances and --turns must be at least 2")
    (plain,) = settled(kimi_tok.kimi_k3(segment_cache_bytes=0))
    turns = conversation(args.turns, int(args.target_tokens * chars_per_token(plain.count_tokens)), args.seed)
    tokenizers = make_cached_tokenizers(args.instances)
    baseline = load_baseline()
    for tok in tokenizers:
        for segments in turns[:-1]:
            tok.encode_segments(rerender(segments))
    last = turns[-1]
    print(f"last turn: {len(last)} segments, {len(last) - len(turns[-2])} new; helpers {tokenizers[0].policy.helpers}, "
          f"n_jobs {tokenizers[0].n_jobs}")

    def before_call():
        if baseline is not None:
            baseline(rerender(last))  # as in bench.agent_loop: the other encoder runs between calls
        gc.collect()

    half = args.instances // 2
    ours, theirs = [], []
    for tok in tokenizers[:half]:
        if baseline is not None:
            segments = rerender(last)
            start = time.perf_counter()
            baseline(segments)
            theirs.append(time.perf_counter() - start)
        segments = rerender(last)
        gc.collect()
        start = time.perf_counter()
        tok.encode_segments(segments)
        ours.append(time.perf_counter() - start)
    summary = f"untimed inside: last turn median {statistics.median(ours) * 1e3:.2f} ms"
    if theirs:
        summary += (f"; basetenkenizer {statistics.median(theirs) * 1e3:.1f} ms "
                    f"-> {statistics.median(theirs) / statistics.median(ours):.1f}x")
    print(summary)
    timeline = Timeline()
    timeline.wrap_all()
    for tok in tokenizers[half:]:
        before_call()
        segments = rerender(last)
        timeline.marks.clear()
        timeline.start = time.perf_counter()
        tok.encode_segments(segments)
        total = (time.perf_counter() - timeline.start) * 1e3
        print(f"{total:.2f} ms: {timeline.line()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
