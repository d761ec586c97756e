"""Load time and memory of kimi_tok vs tiktoken for the same vocabulary, first encode included.

Each measurement runs in a fresh interpreter so imports and caches start cold:

    python -m bench.load_time
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

KIMI = """
import time, resource, os, psutil
t0 = time.perf_counter(); rss0 = psutil.Process().memory_info().rss
import kimi_tok
t1 = time.perf_counter()
tok = kimi_tok.kimi_k3()
t2 = time.perf_counter(); rss2 = psutil.Process().memory_info().rss
tok.encode_segments([("<|open|>", True), ("hello world", False)])
t3 = time.perf_counter()
print({"import_s": t1 - t0, "load_s": t2 - t1, "first_encode_s": t3 - t2,
       "rss_after_load_mb": rss2 / 2**20, "rss_added_by_load_mb": (rss2 - rss0) / 2**20})
"""

TIKTOKEN = """
import time, psutil, json, sys
sys.path.insert(0, {root!r})
t0 = time.perf_counter(); rss0 = psutil.Process().memory_info().rss
import tiktoken, tiktoken.load
from tests.reference import data_dir, load_pattern, load_special_tokens
t1 = time.perf_counter()
enc = tiktoken.Encoding("k3", pat_str=load_pattern(), special_tokens=load_special_tokens(),
                        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(data_dir() / "tiktoken.model")))
t2 = time.perf_counter(); rss2 = psutil.Process().memory_info().rss
enc.encode("hello world")
t3 = time.perf_counter()
print({{"import_s": t1 - t0, "load_s": t2 - t1, "first_encode_s": t3 - t2,
       "rss_after_load_mb": rss2 / 2**20, "rss_added_by_load_mb": (rss2 - rss0) / 2**20}})
"""


ENCODE_MEMORY = """
import resource, psutil, kimi_tok
from kimi_tok.samples import sample_prompt
tok = kimi_tok.kimi_k3(segment_cache_bytes=0)
tok.encode_segments([("warm up", False)])
segments = sample_prompt(4_000_000, seed=1)
text_mb = sum(len(t) for t, _ in segments) / 2**20
rss_before = psutil.Process().memory_info().rss
peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ids = tok.encode_segments(segments).into_numpy()["ids"]
peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print({"tokens": len(ids), "ids_mb": ids.nbytes / 2**20, "rss_before_mb": rss_before / 2**20,
       "peak_growth_mb": (peak_after - max(peak_before, rss_before)) / 2**20, "prompt_chars_mb": text_mb})
"""


def run(code: str, env_extra: dict | None = None) -> dict:
    import os

    env = dict(os.environ, **(env_extra or {}))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT,
                         env=env, check=True)
    return eval(out.stdout.strip().splitlines()[-1])  # our own dict literal


def main() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as empty_cache:
        cold = run(KIMI, {"NUMBA_CACHE_DIR": empty_cache})
    run(KIMI)  # make sure the default cache is populated
    results = {"kimi_tok (warm numba cache)": run(KIMI),
               "kimi_tok (empty numba cache)": cold,
               "tiktoken": run(TIKTOKEN.format(root=str(REPO_ROOT)))}
    print(f"{'':30} {'import s':>9} {'load s':>8} {'1st enc s':>10} {'RSS MB':>8} {'+RSS MB':>8}")
    for name, r in results.items():
        print(f"{name:30} {r['import_s']:9.3f} {r['load_s']:8.3f} {r['first_encode_s']:10.3f} "
              f"{r['rss_after_load_mb']:8.0f} {r['rss_added_by_load_mb']:8.0f}")
    memory = run(ENCODE_MEMORY)
    print(f"one encode of {memory['tokens']:,} tokens ({memory['prompt_chars_mb']:.1f} M chars) in a fresh "
          f"process: peak RSS +{memory['peak_growth_mb']:.0f} MB (the ids themselves: {memory['ids_mb']:.1f} MB)")
    results["encode_memory"] = memory
    print(json.dumps(results))


if __name__ == "__main__":
    main()
