"""Multi-core scaling: kimi_tok with 1, 2, 4, ... workers (threads and processes) beside the
tiktoken reference path and basetenkenizer, on the same fresh prompts in one run.

    python -m bench.scaling                                  # this machine's cores, 100k and 1M tokens
    python -m bench.scaling --workers 1,2,4,8,16 --rounds 7 --json bench/results/scaling.json --plot bench/results/scaling.png
    python -m bench.scaling --sizes 50k,100k,200k,400k --workers 1,2 --backends threads   # the threshold

Sizes are tokens (a prompt of ``size * CHARS_PER_TOKEN`` characters; the table gives the
measured token count). Every round renders a new prompt; every encoder encodes it and the
ids must be identical. Medians over rounds; kimi_tok runs with its segment cache off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence


REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.bench import (  # noqa: E402
    check_same_ids,
    format_markdown_table,
    format_text_table,
    load_basetenkenizer,
    load_tiktoken,
    parse_size,
    save_plot,
)
from kimi_tok.samples import sample_prompt  # noqa: E402

CHARS_PER_TOKEN = 2.4  # measured on sample_prompt: 4M chars -> 1.65M tokens
WARMUP_CHARS = 1_000_000  # starts process workers and warms piece caches before timing


def kimi_tok_encoder(backend: str, n_jobs: int, hash_routing: bool = False) -> Callable:
    import kimi_tok

    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    tok = kimi_tok.Tokenizer(vocabulary, specials, n_jobs=n_jobs, backend=backend, segment_cache_bytes=0,
                             hash_routing=hash_routing)
    return lambda segments: tok.encode_segments(segments).into_numpy()["ids"]


def load_all(backends: Sequence[str], workers: Sequence[int], baselines: Sequence[str]) -> dict[str, Callable]:
    """``backends``: threads (the default), routed (threads with hash_routing=True), processes."""
    encoders = {}
    for backend in backends:
        for n in workers:
            if backend != "threads" and n == 1:
                continue  # one worker never fans out: the same as threads/1
            if backend == "routed":
                encoders[f"kimi_tok routed/{n}"] = kimi_tok_encoder("threads", n, hash_routing=True)
            else:
                encoders[f"kimi_tok {backend}/{n}"] = kimi_tok_encoder(backend, n)
    loaders = {"tiktoken": load_tiktoken, "basetenkenizer": load_basetenkenizer}
    for name in baselines:
        try:
            encoders[name] = loaders[name]()
        except Exception as exc:  # basetenkenizer is optional
            print(f"WARNING: skipping {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    warmup = sample_prompt(WARMUP_CHARS, seed=424_242)
    for name, encode in encoders.items():
        t0 = time.perf_counter()
        encode(warmup)
        print(f"warmed {name} in {time.perf_counter() - t0:.2f} s", flush=True)
    return encoders


def run(encoders: dict[str, Callable], sizes: Sequence[str], rounds: int) -> list[dict]:
    results = []
    names = list(encoders)
    for k, label in enumerate(sizes):
        n_chars = int(parse_size(label) * CHARS_PER_TOKEN)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        tokens = []
        for r in range(rounds):
            segments = sample_prompt(n_chars, seed=7_000 + 100 * k + r)
            ids = {}
            for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order
                t0 = time.perf_counter()
                ids[name] = encoders[name](segments)
                seconds[name].append(time.perf_counter() - t0)
            check_same_ids(ids, segments, f"scaling size {label} round {r}")
            tokens.append(len(next(iter(ids.values()))))
        medians = {name: statistics.median(s) for name, s in seconds.items()}
        results.append({"size": label, "chars": n_chars, "tokens": int(statistics.median(tokens)),
                        "median_s": medians, "seconds": seconds})
        print(f"size {label}: " + ", ".join(f"{n} {m * 1e3:.2f} ms" for n, m in medians.items()), flush=True)
    return results


def table(results: list[dict]) -> tuple[list[str], list[list[str]]]:
    header = ["size", "tokens", "encoder", "median ms", "x 1 worker", "x tiktoken", "x basetenkenizer"]
    rows = []
    for res in results:
        med = res["median_s"]
        one = med.get("kimi_tok threads/1")
        for name, m in med.items():
            ratio = lambda base: f"{med[base] / m:.1f}x" if base in med and base != name else ""  # noqa: E731
            rows.append([
                res["size"], f"{res['tokens']:,}", name, f"{m * 1e3:.2f}",
                f"{one / m:.2f}x" if one and name.startswith("kimi_tok") else "",
                ratio("tiktoken"), ratio("basetenkenizer"),
            ])
    return header, rows


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for res in results:
        med = res["median_s"]
        for backend in ("threads", "routed", "processes"):
            points = sorted(
                (int(name.rsplit("/", 1)[1]), m) for name, m in med.items()
                if name.startswith(f"kimi_tok {backend}/") or (name == "kimi_tok threads/1")
            )
            if len(points) > 1 and any(name.startswith(f"kimi_tok {backend}/") for name in med):
                ax.plot([p[0] for p in points], [p[1] * 1e3 for p in points], marker="o",
                        label=f"kimi_tok {backend}, {res['tokens']:,} tokens")
        if "basetenkenizer" in med:
            ax.axhline(med["basetenkenizer"] * 1e3, ls="--", lw=0.8, color="grey")
            ax.annotate(f"basetenkenizer, {res['tokens']:,} tokens", (1, med["basetenkenizer"] * 1e3),
                        fontsize=7, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers (n_jobs)")
    ax.set_ylabel("median ms per prompt")
    ax.set_title(f"kimi_tok scaling ({os.cpu_count()} cores)")
    save_plot(fig, ax, path)


def main(argv: Sequence[str] | None = None) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    default_workers = ",".join(str(n) for n in (1, 2, 4, 8, 16, 32) if n <= cores)
    p = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="100k,1M", help="token sizes, e.g. 100k,1M")
    p.add_argument("--workers", default=default_workers, help=f"n_jobs values (default {default_workers})")
    p.add_argument("--backends", default="threads,routed,processes",
                   help="threads (the default), routed (threads with hash_routing=True), processes")
    p.add_argument("--baselines", default="tiktoken,basetenkenizer")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", help="write all timings here")
    p.add_argument("--plot", help="write a plot of ms per prompt against workers here")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = p.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    if 1 not in workers:
        workers.insert(0, 1)
    encoders = load_all(args.backends.split(","), workers, [b for b in args.baselines.split(",") if b])
    results = run(encoders, args.sizes.split(","), args.rounds)
    header, rows = table(results)
    print()
    print(f"{cores} cores, medians of {args.rounds} rounds, fresh prompt per round, ids equal every round")
    print(format_markdown_table(header, rows) if args.markdown else format_text_table(header, rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"cores": cores, "rounds": args.rounds, "results": results}, indent=1))
    if args.plot:
        plot(results, Path(args.plot))
    return 0


if __name__ == "__main__":
    sys.exit(main())
