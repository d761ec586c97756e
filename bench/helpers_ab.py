"""Agent-loop turns with helpers parked in compiled code against executor helpers, in one process.

    python -m bench.helpers_ab                    # 3 tokenizers of each kind, turns 15-29 timed
    python -m bench.helpers_ab --instances 2 --target-tokens 300_000

The machine this project is measured on is shared and noisy (another encoder's time for the same
call varies by a third between runs), so two versions are compared call by call: cached
tokenizers of both kinds take the bench's conversation turn after turn, in an order that rotates
each turn, with basetenkenizer (when installed) and a collection before each turn; half of the
tokenizers have ``parking.ParkedHelper`` threads, half the executor's (``Policy.parked_helpers``,
``KIMI_TOK_PARKED_HELPERS=0``). Prints the median, 25th and 75th
percentile per kind over the timed turns (docs/agent-loops.md).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Sequence

import kimi_tok
from bench import settled
from bench.agent_loop import chars_per_token, conversation, make_cached_tokenizers, rerender
from bench.turn_timeline import load_baseline
from kimi_tok.reuse import parking

KINDS = ("parked", "executor")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.helpers_ab", description=__doc__.split("\n")[0])
    p.add_argument("--instances", type=int, default=3, help="cached tokenizers of each kind")
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--timed-from", type=int, default=15, help="first turn timed")
    p.add_argument("--target-tokens", type=lambda s: int(s.replace("_", "")), default=1_000_000)
    p.add_argument("--seed", type=int, default=2024)
    args = p.parse_args(argv)
    if not parking.PARKING:
        print("no parked helpers on this platform (Linux futexes): nothing to compare")
        return 0
    if args.instances < 1 or not 0 <= args.timed_from < args.turns:
        p.error("--instances must be >= 1 and --timed-from within --turns")
    (plain,) = settled(kimi_tok.kimi_k3(segment_cache_bytes=0))
    turns = conversation(args.turns, int(args.target_tokens * chars_per_token(plain.count_tokens)), args.seed)
    policies = {kind: kimi_tok.Policy.from_env().replace(parked_helpers=kind == "parked", helpers=1) for kind in KINDS}
    tokenizers = [(kind, tok) for kind in KINDS for tok in make_cached_tokenizers(args.instances, policies[kind])]
    tokenizers = tokenizers[::2] + tokenizers[1::2]  # the kinds alternate
    baseline = load_baseline()
    ms: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for turn, segments in enumerate(turns):
        if baseline is not None:
            baseline(rerender(segments))  # as in bench.agent_loop: the other encoder runs between turns
        gc.collect()
        rot = turn % len(tokenizers)
        for kind, tok in tokenizers[rot:] + tokenizers[:rot]:
            prompt = rerender(segments)
            start = time.perf_counter()
            tok.encode_segments(prompt)
            if turn >= args.timed_from:
                ms[kind].append((time.perf_counter() - start) * 1e3)
    for kind in KINDS:
        values = ms[kind]
        quartiles = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        print(f"{kind:>8} helpers: median {statistics.median(values):.3f} ms, p25 {quartiles[0]:.3f}, "
              f"p75 {quartiles[2]:.3f} ({len(values)} calls of turns {args.timed_from}-{args.turns - 1})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
