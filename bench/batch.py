"""``Tokenizer.encode_batch`` against a Python loop of ``encode_segments``, on the same tokenizer.

Run from the repo root::

    python -m bench.batch                      # 64 prompts of 40,000 characters, 9 rounds
    python -m bench.batch --prompts 16 --chars 4000 --rounds 3

Every round makes fresh prompts (``kimi_tok.samples.sample_prompt``, new seeds), one set for the
loop and one for the batch, so no call is served from the segment cache by an earlier one; the
order of the two alternates every round. The first round also checks that both give the same
ids on one set. It prints the median time of each and their ratio. ``--no-cache`` turns the
segment cache off (``segment_cache_bytes=0``); ``--n-jobs`` sets the threads (default: the
policy's, the cores up to 8).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import kimi_tok  # noqa: E402
from bench import settled  # noqa: E402
from kimi_tok.samples import sample_prompt  # noqa: E402


def prompts(n: int, chars: int, first_seed: int) -> list:
    return [sample_prompt(chars, seed=first_seed + k) for k in range(n)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--chars", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--n-jobs", type=int, default=None)
    parser.add_argument("--no-cache", action="store_true", help="segment_cache_bytes=0")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.chars < 1 or args.rounds < 1:
        parser.error("--prompts, --chars and --rounds must be positive")
    (tok,) = settled(kimi_tok.kimi_k3(n_jobs=args.n_jobs, segment_cache_bytes=0 if args.no_cache else 256 << 20))

    warm = prompts(args.prompts, args.chars, 10**9)  # compiles, warms the pools and piece caches
    looped = [tok.encode_segments(p).ids for p in warm]
    batched = [enc.ids for enc in tok.encode_batch(warm)]
    if looped != batched:
        print("encode_batch and encode_segments disagree", file=sys.stderr)
        return 1

    loop_s, batch_s = [], []
    for r in range(args.rounds):
        for_loop = prompts(args.prompts, args.chars, 2 * r * args.prompts)
        for_batch = prompts(args.prompts, args.chars, (2 * r + 1) * args.prompts)
        timed = [("loop", for_loop), ("batch", for_batch)]
        for name, items in timed if r % 2 == 0 else timed[::-1]:
            start = time.perf_counter()
            if name == "loop":
                for item in items:
                    tok.encode_segments(item)
                loop_s.append(time.perf_counter() - start)
            else:
                tok.encode_batch(items)
                batch_s.append(time.perf_counter() - start)
    n_ids = sum(len(ids) for ids in looped)
    loop, batch = statistics.median(loop_s), statistics.median(batch_s)
    print(f"{args.prompts} prompts of {args.chars:,} characters (~{n_ids // args.prompts:,} tokens each), "
          f"n_jobs={tok.n_jobs}, segment cache {'off' if args.no_cache else 'on'}, {args.rounds} rounds")
    print(f"loop of encode_segments: median {loop * 1e3:.1f} ms")
    print(f"encode_batch:            median {batch * 1e3:.1f} ms")
    print(f"ratio: {loop / batch:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
