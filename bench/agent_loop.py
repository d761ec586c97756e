"""Agent-loop benchmark: a prompt of real text that grows turn by turn to ~1M tokens, re-encoded every turn.

Run from the repo root::

    python -m bench.agent_loop                     # 30 turns up to ~1M tokens
    python -m bench.agent_loop --quick             # 8 turns up to ~100k tokens
    python -m bench.agent_loop --turns 20 --target-tokens 500_000 --json bench/results/agent_loop.json
    python -m bench.agent_loop --text synthetic    # the old conversation of kimi_tok.samples text

Turn 0 is a rendered K3 agentic chat of real text from this machine (``bench/realtext.py``:
stdlib code, licenses and changelogs, JSON, id lists, gettext catalogs in many languages, literal
control strings). Every later turn appends fresh segments -- an assistant message that thinks
and calls a tool, the tool's output, and an observation message -- rendered with
``render_chat`` from text no earlier turn used. The prefix is the previous turn's segments,
re-rendered as equal but *distinct* ``str`` objects (outside the timed region), as a serving
stack that re-renders the prompt every turn would hand them over: the segment cache has to hash
and compare the text, not just find the same object.

Per turn we time:

* ``kimi_tok cached``: ``kimi_k3()`` with the segment cache, kept across turns.
* ``kimi_tok no cache``: ``kimi_k3(segment_cache_bytes=0)``, median of ``--repeats`` calls.
* ``tiktoken``: the reference path (``tests.reference.Reference().encode_segments``), once.
* ``basetenkenizer`` (when installed; ``bench.peers``).

Cached kimi_tok and basetenkenizer keep state across calls (the segment cache; basetenkenizer's
own caches), so a repeat within a turn would be faster than the call a server really makes.
Each of them runs as ``--repeats`` independent instances, every instance fed every turn once
with its own copy of the prompt; the median of those first calls is reported.

The ids of every encoder are checked equal at every turn. At the last turn we also time
``count_tokens`` (cache warm, new ``str`` objects; and without a cache). The plot goes to
``bench/results/agent_loop.png``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import kimi_tok  # noqa: E402
from bench.bench import (  # noqa: E402
    RESULTS_DIR,
    IdMismatch,
    check_same_ids,
    format_markdown_table,
    format_text_table,
    load_basetenkenizer,
    load_tiktoken,
    rerender,
    save_plot,
    rss_bytes,
)
from bench import realtext, settled  # noqa: E402
from kimi_tok.samples import render_chat, sample_prompt, sample_text  # noqa: E402

Segment = tuple[str, bool]
Segments = Sequence[Segment]

CACHED, NO_CACHE, TIKTOKEN, BASETEN = "kimi_tok cached", "kimi_tok no cache", "tiktoken", "basetenkenizer"
TOOLS = ("web_search", "run_python", "read_file")
# Shares of one turn's appended text.
SHARE = {"think": 0.06, "arguments": 0.04, "tool": 0.80, "observation": 0.10}
SEED_BASE = 7_000_000  # appended texts use seeds SEED_BASE + 16 * turn + k: distinct from turn 0's


# --------------------------------------------------------------------------------------------
# The conversation
# --------------------------------------------------------------------------------------------


def chars_per_token(encode_count: Callable[[Segments], int], text: str = "real") -> float:
    """Calibrate: chars per token of the conversation's text (real text is denser than English:
    scripts, hashes)."""
    if text == "real":
        segments = realtext.real_prompt(_pool().drawer(4_242_424), 400_000)
    else:
        segments = sample_prompt(400_000, seed=4_242_424)
    return sum(len(t) for t, _ in segments) / encode_count(segments)


def _pool() -> realtext.Pool:
    if not hasattr(_pool, "pool"):
        _pool.pool = realtext.Pool.load()
    return _pool.pool


def appended_segments(turn: int, n_chars: int) -> list[Segment]:
    """Synthetic turn ``turn``'s new segments: assistant think + tool call, tool output, an observation."""
    rng = random.Random(SEED_BASE + turn)
    text = {
        kind: sample_text(max(1, int(n_chars * share)), seed=SEED_BASE + 16 * turn + k)
        for k, (kind, share) in enumerate(SHARE.items())
    }
    call = {"name": rng.choice(TOOLS), "call_id": f"call_{rng.getrandbits(48):012x}"}
    messages = [
        {
            "role": "assistant",
            "think": text["think"],
            "content": "",
            "tool_calls": [{**call, "arguments": json.dumps({"input": text["arguments"]}, ensure_ascii=False)}],
        },
        {"role": "tool", **call, "content": text["tool"]},
        {"role": "user", "content": f"[observation after turn {turn}]\n" + text["observation"]},
    ]
    return render_chat(messages)


def conversation(turns: int, total_chars: int, seed: int, text: str = "real") -> list[list[Segment]]:
    """The segments of every turn: turn 0 a rendered chat, then appends of equal size; ``text``
    is ``"real"`` (fresh text from the real-text pool, no block twice) or ``"synthetic"``."""
    first = max(4_000, total_chars // turns)
    per_turn = max(1_000, (total_chars - first) // max(1, turns - 1))
    if text == "real":
        drawer = _pool().drawer(seed)
        out = [realtext.real_prompt(drawer, first)]
        for turn in range(1, turns):
            out.append(out[-1] + render_chat(realtext.turn_messages(drawer, turn, per_turn, SHARE)))
        if drawer.wrapped:
            print(f"note: the real-text pool ran out of {', '.join(sorted(drawer.wrapped))}; later turns reuse "
                  "its blocks in a new order", file=sys.stderr)
        return out
    out = [sample_prompt(first, seed=seed)]
    for turn in range(1, turns):
        out.append(out[-1] + appended_segments(turn, per_turn))
    return out


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


@dataclass
class TurnResult:
    turn: int
    n_segments: int
    n_chars: int
    tokens: int
    appended_tokens: int
    seconds: dict[str, list[float]] = field(default_factory=dict)
    cache_hits: int = 0  # segment-cache hits / misses of the first cached tokenizer this turn
    cache_misses: int = 0

    def ms(self, name: str) -> float:
        return statistics.median(self.seconds[name]) * 1e3


def timed(fn: Callable[[], np.ndarray]) -> tuple[float, np.ndarray]:
    t0 = time.perf_counter()
    ids = fn()
    return time.perf_counter() - t0, ids


def make_cached_tokenizers(n: int, policy: kimi_tok.Policy | None = None) -> list[kimi_tok.Tokenizer]:
    """``kimi_k3()`` (the default 256 MiB cache) and n-1 more independent ones for the median
    (all with ``policy`` when given)."""
    first = kimi_tok.kimi_k3(policy=policy)
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    more = [kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, name="kimi_k3", policy=first.policy)
            for _ in range(n - 1)]
    return list(settled(first, *more))


def load_instances(args: argparse.Namespace, cached: list[kimi_tok.Tokenizer], plain: kimi_tok.Tokenizer):
    """name -> (encode functions, stateful). A stateful encoder keeps something across calls (the
    segment cache; basetenkenizer's own caches), so each of its ``--repeats`` instances is called
    once per turn, on its own copy of the prompt: every sample is a real first call at that turn.
    A stateless one is called ``--repeats`` times (tiktoken once: it is slow and stateless)."""
    encoders = {
        CACHED: ([lambda segs, tok=tok: tok.encode_segments(segs).into_numpy()["ids"] for tok in cached], True),
        NO_CACHE: ([lambda segs: plain.encode_segments(segs).into_numpy()["ids"]], False),
    }
    for name, loader, stateful in ((TIKTOKEN, load_tiktoken, False), (BASETEN, load_basetenkenizer, True)):
        if name not in args.encoder_names:
            continue
        try:
            encoders[name] = ([loader() for _ in range(args.repeats if stateful else 1)], stateful)
        except Exception as exc:  # basetenkenizer is optional
            print(f"WARNING: skipping {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return encoders


def run(args: argparse.Namespace) -> tuple[list[TurnResult], dict]:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    rss_start = rss_bytes()
    cached = make_cached_tokenizers(args.repeats)
    (plain,) = settled(kimi_tok.kimi_k3(segment_cache_bytes=0))
    encoders = load_instances(args, cached, plain)
    order = list(encoders)

    warmup = sample_prompt(4000, seed=999_999)
    for fns, _ in encoders.values():
        for encode in fns:
            encode(warmup)
    for tok in cached:
        tok.segment_cache.clear()

    ratio = chars_per_token(plain.count_tokens, args.text)
    total_chars = int(args.target_tokens * ratio)
    t0 = time.perf_counter()
    turns = conversation(args.turns, total_chars, args.seed, args.text)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.turns} turns to ~{args.target_tokens:,} "
        f"tokens ({args.text} text: {ratio:.2f} chars/token -> {total_chars:,} chars; built in "
        f"{time.perf_counter() - t0:.1f} s); repeats={args.repeats}; encoders: " + ", ".join(order)
    )

    results: list[TurnResult] = []
    prev_tokens = 0
    for turn, segments in enumerate(turns):
        plain_copy = rerender(segments)  # copies are made outside the timed region
        hits0, misses0 = cached[0].segment_cache.hits, cached[0].segment_cache.misses
        seconds: dict[str, list[float]] = {name: [] for name in order}
        ids: dict[str, np.ndarray] = {}
        gc.collect()
        rot = turn % len(order)
        for name in order[rot:] + order[:rot]:  # rotate who goes first
            fns, stateful = encoders[name]
            calls = fns if stateful else fns * (1 if name == TIKTOKEN else args.repeats)
            for k, encode in enumerate(calls):
                prompt = rerender(segments) if stateful else plain_copy
                sec, got = timed(lambda p=prompt: encode(p))
                seconds[name].append(sec)
                if k == 0:
                    ids[name] = got
                elif stateful:
                    check_same_ids({name: ids[name], f"{name} #{k}": got}, segments, f"turn {turn} {name} #{k}")
                del prompt
        check_same_ids(ids, segments, f"agent loop turn {turn}")
        tokens = len(ids[CACHED])
        res = TurnResult(
            turn, len(segments), sum(len(t) for t, _ in segments), tokens, tokens - prev_tokens, seconds,
            cached[0].segment_cache.hits - hits0, cached[0].segment_cache.misses - misses0,
        )
        results.append(res)
        prev_tokens = tokens
        if not args.quiet:
            times = ", ".join(f"{n} {res.ms(n):.1f} ms" for n in order)
            print(f"turn {turn:>3}: {tokens:>9,} tokens (+{res.appended_tokens:,}): {times}", flush=True)
        del plain_copy, ids

    extra = last_turn_extras(cached[0], plain, turns[-1], results[-1].tokens, args.repeats)
    extra["rss_start_mib"] = rss_start / 2**20
    extra["rss_end_mib"] = rss_bytes() / 2**20
    extra["chars_per_token"] = ratio
    extra["cache_used_bytes"] = cached[0].segment_cache.used_bytes
    extra["cache_budget_bytes"] = cached[0].segment_cache.budget_bytes
    extra["cache_entries"] = len(cached[0].segment_cache)
    extra["encoders"] = order
    return results, extra


def last_turn_extras(tok, plain, segments: Segments, tokens: int, repeats: int) -> dict:
    """count_tokens at the last turn, and a re-send of the same prompt (all long segments hit)."""
    out: dict[str, list[float]] = {"count_tokens_cached": [], "count_tokens_no_cache": [], "resend_cached": []}
    for _ in range(max(3, repeats)):
        copy = rerender(segments)
        sec, n = timed(lambda: tok.count_tokens(copy))
        assert n == tokens, f"count_tokens {n} != {tokens}"
        out["count_tokens_cached"].append(sec)
        copy = rerender(segments)
        sec, ids = timed(lambda: tok.encode_segments(copy).into_numpy()["ids"])
        assert len(ids) == tokens
        out["resend_cached"].append(sec)
        sec, n = timed(lambda: plain.count_tokens(segments))
        assert n == tokens, f"count_tokens (no cache) {n} != {tokens}"
        out["count_tokens_no_cache"].append(sec)
    return {"last_turn_seconds": out, "last_turn_median_ms": {k: statistics.median(v) * 1e3 for k, v in out.items()}}


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def table(results: list[TurnResult], names: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    short = {CACHED: "cached", NO_CACHE: "no cache", TIKTOKEN: "tiktoken", BASETEN: "baseten"}
    header = ["turn", "segs", "tokens", "appended", "hit/miss"]
    header += [f"{short[n]} ms" for n in names]
    ratios = [n for n in (BASETEN, NO_CACHE, TIKTOKEN) if n in names]
    header += [f"x vs {short[n]}" for n in ratios]
    rows = []
    for r in results:
        row = [str(r.turn), str(r.n_segments), f"{r.tokens:,}", f"{r.appended_tokens:,}",
               f"{r.cache_hits}/{r.cache_misses}"]
        row += [f"{r.ms(n):.1f}" for n in names]
        row += [f"{r.ms(n) / r.ms(CACHED):.1f}x" for n in ratios]
        rows.append(row)
    return header, rows


def summary(results: list[TurnResult], names: Sequence[str], extra: dict, target_x: float) -> dict:
    last = results[-1]
    tail = results[-max(1, len(results) // 3):]
    out = {"last_turn_tokens": last.tokens, "last_turn_ms": {n: last.ms(n) for n in names}}
    for base in (BASETEN, NO_CACHE, TIKTOKEN):
        if base in names:
            out[f"x_vs_{base}_last"] = last.ms(base) / last.ms(CACHED)
            out[f"x_vs_{base}_tail_median"] = statistics.median(r.ms(base) / r.ms(CACHED) for r in tail)
    out["tail_turns"] = [r.turn for r in tail]
    if BASETEN in names:
        out["target_x_vs_basetenkenizer"] = target_x
        out["target_met_last_turn"] = out[f"x_vs_{BASETEN}_last"] >= target_x
    return out


def print_summary(s: dict, extra: dict, names: Sequence[str]) -> None:
    ms = extra["last_turn_median_ms"]
    tail = s["tail_turns"]
    print(f"\nlast turn: {s['last_turn_tokens']:,} tokens (checked equal across {', '.join(names)})")
    for base in (BASETEN, NO_CACHE, TIKTOKEN):
        if f"x_vs_{base}_last" in s:
            print(f"  cached kimi_tok vs {base}: {s[f'x_vs_{base}_last']:.1f}x at the last turn, "
                  f"median {s[f'x_vs_{base}_tail_median']:.1f}x over turns {tail[0]}-{tail[-1]}")
    if "target_met_last_turn" in s:
        verdict = "met" if s["target_met_last_turn"] else "NOT met"
        print(f"  target >= {s['target_x_vs_basetenkenizer']:.0f}x vs basetenkenizer at the last turn: {verdict}")
    print(f"  count_tokens (cache warm, new str objects): {ms['count_tokens_cached']:.2f} ms; "
          f"without cache: {ms['count_tokens_no_cache']:.1f} ms; re-send of the same prompt "
          f"(encode_segments, all long segments hit): {ms['resend_cached']:.2f} ms")
    print(f"  segment cache: {extra['cache_entries']} entries, {extra['cache_used_bytes'] / 2**20:.1f} MiB "
          f"of {extra['cache_budget_bytes'] / 2**20:.0f} MiB; RSS {extra['rss_end_mib']:.0f} MiB at the end")


def plot(results: list[TurnResult], names: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.8))
    x = [r.turn for r in results]
    for name, style in zip(names, ("o-", "s-", "^-", "d-")):
        ax.plot(x, [r.ms(name) for r in results], style, ms=3.5, label=name)
    ax.set_yscale("log")
    ax.set_xlabel(f"turn (prompt grows to {results[-1].tokens:,} tokens)")
    ax.set_ylabel("encode latency per turn (ms, log)")
    ax.set_title("Agent loop: re-encoding the whole prompt every turn")
    save_plot(fig, ax, path)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.agent_loop", description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=30)
    p.add_argument("--target-tokens", type=lambda s: int(s.replace("_", "")), default=1_000_000,
                   help="tokens of the last turn's prompt (approximately)")
    p.add_argument("--repeats", type=int, default=3,
                   help="independent cached tokenizers / calls per turn (median); tiktoken runs once")
    p.add_argument("--encoders", default=f"{TIKTOKEN},{BASETEN}", help="baselines to run besides kimi_tok")
    p.add_argument("--seed", type=int, default=2024)
    p.add_argument("--target-x", type=float, default=20.0, help="speedup vs basetenkenizer to reach")
    p.add_argument("--text", choices=("real", "synthetic"), default="real",
                   help="real text from this machine (bench/realtext.py) or kimi_tok.samples text")
    p.add_argument("--plot", default=str(RESULTS_DIR / "agent_loop.png"))
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--json", metavar="PATH", help="save results as JSON")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table")
    p.add_argument("--quiet", action="store_true", help="no per-turn progress lines")
    p.add_argument("--quick", action="store_true", help="8 turns to ~100k tokens, 1 repeat")
    args = p.parse_args(argv)
    if args.quick:
        args.turns, args.target_tokens, args.repeats = 8, 100_000, 1
    if args.turns < 1 or args.repeats < 1 or args.target_tokens < 1:
        p.error("--turns, --repeats and --target-tokens must be positive")
    args.encoder_names = [e.strip() for e in args.encoders.split(",") if e.strip()]
    unknown = set(args.encoder_names) - {TIKTOKEN, BASETEN}
    if unknown:
        p.error(f"unknown encoders {sorted(unknown)}; choose from {TIKTOKEN}, {BASETEN}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        results, extra = run(args)
    except IdMismatch as exc:
        print(exc, file=sys.stderr)
        return 2
    names = extra["encoders"]
    header, rows = table(results, names)
    print(f"\nper turn, ms (cached kimi_tok and basetenkenizer: median over {args.repeats} independent instances "
          f"of their first call at that turn; kimi_tok no cache: median of {args.repeats} calls; tiktoken: 1 call):")
    print(format_text_table(header, rows))
    if args.markdown:
        print("\n" + format_markdown_table(header, rows))
    s = summary(results, names, extra, args.target_x)
    print_summary(s, extra, names)
    if not args.no_plot:
        plot(results, names, Path(args.plot))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(
            {"args": {k: v for k, v in vars(args).items()}, "summary": s, "extra": extra,
             "turns": [asdict(r) for r in results]}, indent=2, default=str))
        print(f"results saved to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
