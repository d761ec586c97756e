"""Throughput of ``kimi_tok.corpus`` (documents/s, tokens/s) with 1 and N local worker processes.

Generates a deterministic JSONL corpus (``{"text": ...}`` per line, texts from
``kimi_tok.samples.sample_text`` of 100-20,000 characters, log-uniform), then times
``encode_corpus`` end to end (plan pass, encoding, writing shards, manifest) into a fresh
directory. One warm-up run per worker count starts the worker processes and loads the
vocabulary in them; the figure is the median of the timed runs after it.

    python -m bench.corpus                 # ~32 MB, 1 and all-core workers, 3 runs each, 1000 per shard
    python -m bench.corpus --mb 8 --jobs 1 4 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from kimi_tok.corpus import encode_corpus
from kimi_tok.samples import sample_text

MIN_CHARS, MAX_CHARS = 100, 20_000


def write_corpus(path: Path, target_bytes: int, seed: int = 0) -> tuple[int, int]:
    """Text documents until ``target_bytes`` of JSONL; returns ``(documents, bytes)``."""
    rng = random.Random(seed)
    n_docs = n_bytes = 0
    with open(path, "wb") as f:
        while n_bytes < target_bytes:
            n_chars = int(math.exp(rng.uniform(math.log(MIN_CHARS), math.log(MAX_CHARS))))
            line = (json.dumps({"text": sample_text(n_chars, seed=n_docs)}, ensure_ascii=False) + "\n").encode("utf-8")
            f.write(line)
            n_docs += 1
            n_bytes += len(line)
    return n_docs, n_bytes


def time_runs(path: Path, work: Path, n_jobs: int, repeats: int, docs_per_shard: int) -> tuple[float, int, int]:
    """Median seconds of ``repeats`` runs (after one warm-up), and the documents and tokens."""
    seconds = []
    for run in range(repeats + 1):
        out = work / f"out-{n_jobs}-{run}"
        start = time.perf_counter()
        summary = encode_corpus([path], out, n_jobs=n_jobs, backend="loky", docs_per_shard=docs_per_shard)
        if run:
            seconds.append(time.perf_counter() - start)
        shutil.rmtree(out)
    return statistics.median(seconds), summary.documents, summary.tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=32, help="corpus size in MB of JSONL (default 32)")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, len(os.sched_getaffinity(0))],
                        help="worker counts to time (default: 1 and the usable cores)")
    parser.add_argument("--docs-per-shard", type=int, default=1000,
                        help="records per shard (default 1000: enough shards to balance a small corpus)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per worker count (default 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kimi_tok_corpus_bench_") as tmp:
        work = Path(tmp)
        path = work / "corpus.jsonl"
        n_docs, n_bytes = write_corpus(path, int(args.mb * 1e6))
        print(f"corpus: {n_docs:,} documents, {n_bytes / 1e6:.1f} MB of JSONL, {args.docs_per_shard} per shard; "
              f"{os.cpu_count()} cores; median of {args.repeats} runs after a warm-up\n")
        print("| workers | seconds | documents/s | tokens/s | speedup |")
        print("|---:|---:|---:|---:|---:|")
        base = None
        for n_jobs in args.jobs:
            seconds, docs, tokens = time_runs(path, work, n_jobs, args.repeats, args.docs_per_shard)
            base = base or seconds
            print(f"| {n_jobs} | {seconds:.2f} | {docs / seconds:,.0f} | {tokens / seconds:,.0f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
