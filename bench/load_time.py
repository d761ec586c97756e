"""What a user meets first: the first use after an install, a warm start, the first long prompt,
an agent loop's first turn, and what the default segment cache costs on prompts it never saw.

    python -m bench.load_time                 # every row, 3 cold and 5 warm repetitions (~5 min on 2 cores)
    python -m bench.load_time --quick         # 1 cold and 3 warm repetitions
    python -m bench.load_time --only cache    # one row: cold, fan-out, warm, first-long, agent, cache, install
    python -m bench.load_time --json out.json

Every row runs in fresh interpreters (``python -c``), medians over the repetitions:

* cold: ``import kimi_tok; kimi_k3().encode_segments(<a 57-segment prompt>)`` with empty numba and
  table caches (``NUMBA_CACHE_DIR``, ``KIMI_TOK_CACHE_DIR`` pointing at empty folders), and whether
  the compile notice was printed; then how long until calls run compiled (worker processes build
  the kernels meanwhile), the first prompt long enough to fan out, and the kernels the process
  compiled itself (the target: none);
* warm: the same three steps with both caches filled (the first prompt runs on the interpreted engine
  while a thread loads the kernels), when the kernels are loaded, and what each step costs;
* first long prompt: in a warm process, the first 400k-character prompt vs the next one (fresh text),
  once the kernels are loaded, and right after ``kimi_k3()`` (it then waits for the kernel load);
* agent loop: the first turn of ``bench.agent_loop`` (its real text, 176k characters) in a new
  process, kimi_tok's default ``kimi_k3()`` vs basetenkenizer (when installed), each after its
  load and one small call;
* cache: default ``kimi_k3()`` (segment cache on) vs ``kimi_k3(segment_cache_bytes=0)`` on fresh
  prompts (``sample_prompt(n, seed)``, a new seed every call), touching 64 MB of other memory
  between calls as a serving process does other work between tokenizations;
* install (``--only install``): ``pip install . --target`` a temporary folder, then two processes
  from there: the second must load every kernel the first compiled (a non-editable install keeps
  a valid cache).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTICE = "kimi_tok: compiling"

# One process: import, load, first short prompt, then (``long``) the first long one; timings on stdout as JSON.
FIRST_USE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import kimi_tok
t1 = time.perf_counter()
tok = kimi_tok.kimi_k3()
t2 = time.perf_counter()
from kimi_tok.native import jit
from kimi_tok.samples import sample_prompt
segments = sample_prompt(4000, seed=1)
t3 = time.perf_counter()
tok.encode_segments(segments)
t4 = time.perf_counter()
compiled_at_load = len(jit.COMPILED)
out = {"import_s": t1 - t0, "load_s": t2 - t1, "first_s": t4 - t3, "total_s": t4 - t0 - (t3 - t2),
       "segments": len(segments), "compiled": compiled_at_load, "compiled_at_first": tok.compiled}
if {long}:
    from kimi_tok.reuse.warmup import KernelBuild, wait_for_background
    tok.wait_until_compiled()
    out["until_compiled_s"] = time.perf_counter() - t1  # from kimi_k3(): a cold start's background build
    wait_for_background()
    big = sample_prompt(400_000, seed=2)
    t5 = time.perf_counter()
    tok.encode_segments(big)
    out["first_long_s"] = time.perf_counter() - t5
    out["compiled_after_load"] = len(jit.COMPILED) - compiled_at_load
    if KernelBuild._current is not None:  # the rest of the build: other Tokenizers' paths
        KernelBuild._current.process.wait()
        out["build_s"] = time.perf_counter() - t1
usage = resource.getrusage(resource.RUSAGE_SELF)
out["cpu_s"] = usage.ru_utime + usage.ru_stime
print(json.dumps(out))
"""

# A warm start taken apart: each piece timed where it happens (the functions it calls wrapped). The
# kernels load on a thread ("kimi_tok-load") while the first prompt runs on the interpreted engine.
WARM_PARTS = r"""
import json, resource, sys, time
clock = lambda: (time.perf_counter(), time.thread_time())
t0 = clock()
import kimi_tok
t1 = clock()
numba_at_import = "numba" in sys.modules
from kimi_tok import loaders, tokenizer as facade
from kimi_tok.native import jit
from kimi_tok.reuse import warmup
parts = {}
def timed(module, name, key):
    real = getattr(module, name)
    def wrapper(*args, **kwargs):
        start = clock()
        try:
            return real(*args, **kwargs)
        finally:
            end = clock()
            wall, cpu = parts.get(key, (0.0, 0.0))
            parts[key] = (wall + end[0] - start[0], cpu + end[1] - start[1])
    setattr(module, name, wrapper)
timed(loaders, "embedded_kimi_k3", "vocabulary: gzip, sha256, NumPy parse")
timed(facade.Tokenizer, "mergeable_ranks", "interpreted engine: the ranks dict")
timed(facade, "InterpretedEngine", "interpreted engine: the pattern through PCRE2 JIT")
timed(jit, "materialize", "thread: numba's import, every kernel declared to numba")
timed(facade, "cached_bpe_tables", "thread: BPE tables, the .npz file")
timed(facade, "in_huge_pages", "thread: tables copied into huge pages (first-touch faults)")
timed(facade, "warm_up", "thread: kernel loads (numba's first use included), probe")
tok = kimi_tok.kimi_k3()
t2 = clock()
from kimi_tok.samples import sample_prompt
segments = sample_prompt(4000, seed=1)
t3 = clock()
tok.encode_segments(segments)
t4 = clock()
compiled_at_first = tok.compiled
tok.wait_until_compiled()
t_loaded = clock()
warmup.wait_for_background()
t5 = clock()
usage = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"numba_at_import": numba_at_import, "import_s": t1[0] - t0[0], "load_s": t2[0] - t1[0],
                  "first_s": t4[0] - t3[0], "total_s": t4[0] - t0[0] - (t3[0] - t2[0]),
                  "total_cpu_s": t4[1] - t0[1] - (t3[1] - t2[1]), "compiled_at_first": compiled_at_first,
                  "loaded_s": t_loaded[0] - t1[0] - (t3[0] - t2[0]), "background_s": t5[0] - t_loaded[0],
                  "process_cpu_s": usage.ru_utime + usage.ru_stime, "parts": parts,
                  "compiled": len(jit.COMPILED)}))
"""

FIRST_LONG = r"""
import json, time
import kimi_tok
from kimi_tok.reuse.warmup import wait_for_background
from kimi_tok.samples import sample_prompt
tok = kimi_tok.kimi_k3()
prompts = [sample_prompt(400_000, seed=s) for s in (21, 22, 23)]
if {wait}:
    tok.wait_until_compiled()  # a warm start loads the kernels on a thread
    wait_for_background()
times = []
for p in prompts:
    t = time.perf_counter(); tok.encode_segments(p); times.append(time.perf_counter() - t)
print(json.dumps({"first_s": times[0], "next_s": times[1], "third_s": times[2]}))
"""

AGENT_FIRST_TURN = r"""
import json, sys, time
sys.path.insert(0, {root!r})
from bench import realtext
from kimi_tok.samples import sample_prompt
turn = realtext.real_prompt(realtext.Pool.load(quiet=True).drawer({seed}), 176_000)
small = sample_prompt(4000, seed=999_999)
if {which!r} == "kimi_tok":
    import kimi_tok
    from kimi_tok.reuse.warmup import wait_for_background
    tok = kimi_tok.kimi_k3()
    encode = lambda segs: tok.encode_segments(segs).into_numpy()["ids"]
    tok.wait_until_compiled()  # loaded, as basetenkenizer is
    wait_for_background()
else:
    from bench.peers import load_basetenkenizer
    encode = load_basetenkenizer().encode_segments
encode(small)
t = time.perf_counter(); ids = encode(turn); first = time.perf_counter() - t
print(json.dumps({{"first_turn_s": first, "chars": sum(len(s) for s, _ in turn), "tokens": len(ids)}}))
"""

CACHE_COST = r"""
import json, statistics, time
import numpy as np
import kimi_tok
from kimi_tok.reuse.warmup import wait_for_background
from kimi_tok.samples import sample_prompt
on, off = kimi_tok.kimi_k3(), kimi_tok.kimi_k3(segment_cache_bytes=0)
on.wait_until_compiled() and off.wait_until_compiled()
wait_for_background()
other = np.ones(64 << 20, dtype=np.uint8)
out = {{}}
seed = 10_000
for n in {sizes}:
    for tok in (on, off):
        tok.encode_segments(sample_prompt(n, seed=1))
    times = {{"on": [], "off": []}}
    reps = {reps} if n < 100_000 else max(5, {reps} // 4)
    for r in range(reps):
        for name, tok in ((("on", on), ("off", off)) if r % 2 else (("off", off), ("on", on))):
            seed += 1
            prompt = sample_prompt(n, seed=seed)
            other[::64] += 1  # 64 MB of other work: every cache line touched
            t = time.perf_counter(); tok.encode_segments(prompt); times[name].append(time.perf_counter() - t)
    a, b = statistics.median(times["on"]), statistics.median(times["off"])
    out[str(n)] = {{"on_ms": a * 1e3, "off_ms": b * 1e3, "ratio": a / b}}
print(json.dumps(out))
"""

INSTALLED = r"""
import json, sys, time
sys.path.insert(0, {target!r})
t = time.perf_counter()
import kimi_tok
assert kimi_tok.__file__.startswith({target!r}), kimi_tok.__file__
tok = kimi_tok.kimi_k3()
tok.encode_segments([("<|open|>", True), ("hello world", False)])
from kimi_tok.native import jit
print(json.dumps({{"compiled": len(jit.COMPILED), "seconds": time.perf_counter() - t}}))
"""


def child(code: str, env_extra: dict | None = None, timeout: int = 1800) -> tuple[dict, str]:
    """Run ``code`` in a fresh interpreter from the repository root; (its JSON line, its stderr)."""
    env = dict(os.environ, **(env_extra or {}))
    env.pop("KIMI_TOK_COMPILE_WORKER", None)
    if os.environ.get("KIMI_TOK_COLD_START") == "wait" and "KIMI_TOK_COLD_START" not in (env_extra or {}):
        env.pop("KIMI_TOK_COLD_START")  # set by bench/__init__.py: the cold rows measure the default
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, env=env,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def median_of(runs: list[dict], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def row_cold(reps: int) -> dict:
    runs, notices = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as numba_cache, tempfile.TemporaryDirectory() as tables:
            result, stderr = child(FIRST_USE.replace("{long}", "True"),
                                   {"NUMBA_CACHE_DIR": numba_cache, "KIMI_TOK_CACHE_DIR": tables})
        runs.append(result)
        notices.append(sum(line.startswith(NOTICE) for line in stderr.splitlines()))
    return {"runs": runs, "notices": notices, **{k: median_of(runs, k) for k in
            ("import_s", "load_s", "first_s", "total_s", "cpu_s", "first_long_s", "compiled_after_load",
             "until_compiled_s", "build_s") if all(k in run for run in runs)}}


def row_warm(reps: int) -> dict:
    child(FIRST_USE.replace("{long}", "False"))  # fills the default caches
    runs, notices = [], []
    for _ in range(reps):
        result, stderr = child(WARM_PARTS)
        runs.append(result)
        notices.append(sum(line.startswith(NOTICE) for line in stderr.splitlines()))
    parts = {key: [statistics.median(run["parts"].get(key, (0.0, 0.0))[i] for run in runs) for i in (0, 1)]
             for key in runs[0]["parts"]}
    return {"runs": runs, "notices": notices, "parts": parts, **{k: median_of(runs, k) for k in
            ("import_s", "load_s", "first_s", "total_s", "total_cpu_s", "loaded_s", "background_s")},
            "numba_at_import": any(run["numba_at_import"] for run in runs),
            "compiled_at_first": all(run["compiled_at_first"] for run in runs),
            "compiled": max(run["compiled"] for run in runs)}


def row_first_long(reps: int) -> dict:
    runs = [child(FIRST_LONG.replace("{wait}", "True"))[0] for _ in range(reps)]
    at_once = [child(FIRST_LONG.replace("{wait}", "False"))[0] for _ in range(reps)]
    first, nxt = median_of(runs, "first_s"), median_of(runs, "next_s")
    return {"runs": runs, "first_s": first, "next_s": nxt, "ratio": first / nxt,
            "right_after_load_first_s": median_of(at_once, "first_s")}


def row_agent(reps: int) -> dict:
    out = {}
    for which in ("kimi_tok", "basetenkenizer"):
        try:
            runs = [child(AGENT_FIRST_TURN.format(root=str(REPO_ROOT), seed=7 + k, which=which))[0]
                    for k in range(reps)]
        except RuntimeError as exc:
            if which == "kimi_tok":
                raise
            print(f"note: basetenkenizer skipped: {str(exc).splitlines()[-1]}", file=sys.stderr)
            continue
        out[which] = {"runs": runs, "first_turn_s": median_of(runs, "first_turn_s"), "chars": runs[0]["chars"]}
    return out


def row_cache(reps: int, sizes=(4_000, 40_000, 400_000)) -> dict:
    return child(CACHE_COST.format(sizes=tuple(sizes), reps=max(10, 10 * reps)))[0]


def row_install() -> dict:
    with tempfile.TemporaryDirectory() as target:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--target", target, str(REPO_ROOT)], check=True, cwd=tempfile.gettempdir())
        env = {"NUMBA_CACHE_DIR": "", "PYTHONPATH": ""}
        first, _ = child(INSTALLED.format(target=target), env)
        second, _ = child(INSTALLED.format(target=target), env)
    return {"first": first, "second": second}


ROWS = ("cold", "warm", "first-long", "agent", "cache")


def report(results: dict) -> None:
    print("\n| moment | measured | target |\n| --- | --- | --- |")
    if "cold" in results:
        c = results["cold"]
        path = "compiled" if all(run["compiled_at_first"] for run in c["runs"]) else "interpreted"
        print(f"| first use, empty caches: import + `kimi_k3()` + first {c['runs'][0]['segments']}-segment prompt | "
              f"{c['total_s']:.1f} s (import {c['import_s']:.2f}, load {c['load_s']:.1f}, first prompt "
              f"{c['first_s']:.2f} on the {path} path); notice printed {c['notices']} | <= 10 s, with a message |")
        if "until_compiled_s" in c:
            build = f"; the whole build {c['build_s']:.0f} s" if "build_s" in c else ""
            print(f"| calls on the compiled kernels, from `kimi_k3()` | after {c['until_compiled_s']:.0f} s{build} "
                  f"(worker processes) | |")
        print(f"| later, the first prompt long enough to fan out | {c['compiled_after_load']:.0f} kernels compiled "
              f"in the process, {c['first_long_s'] * 1e3:.0f} ms | nothing compiled after load |")
    if "warm" in results:
        w = results["warm"]
        path = "compiled" if w["compiled_at_first"] else "interpreted"
        print(f"| warm caches: import + `kimi_k3()` + first prompt | {w['total_s']:.2f} s, {w['total_cpu_s']:.2f} CPU-s "
              f"(import {w['import_s']:.2f}{' with numba' if w['numba_at_import'] else ', no numba'}, load "
              f"{w['load_s']:.2f}, first prompt {w['first_s'] * 1e3:.0f} ms on the {path} path; kernels loaded "
              f"{w['loaded_s']:.2f} s after import, {w['compiled']} compiled); notices {w['notices']} | <= 0.5 s |")
    if "first-long" in results:
        f = results["first-long"]
        print(f"| warm process: first 400k-char prompt vs the next | {f['first_s'] * 1e3:.0f} ms vs "
              f"{f['next_s'] * 1e3:.0f} ms ({f['ratio']:.2f}x; right after load: "
              f"{f['right_after_load_first_s'] * 1e3:.0f} ms) | <= 2x |")
    if "agent" in results:
        a = results["agent"]
        peer = f"; basetenkenizer {a['basetenkenizer']['first_turn_s'] * 1e3:.0f} ms" if "basetenkenizer" in a else ""
        print(f"| agent loop's first turn ({a['kimi_tok']['chars'] / 1000:.0f}k chars) | "
              f"{a['kimi_tok']['first_turn_s'] * 1e3:.0f} ms{peer} | <= basetenkenizer |")
    if "cache" in results:
        ratios = ", ".join(f"{v['ratio']:.2f}x at {int(k) // 1000}k" for k, v in results["cache"].items())
        print(f"| default `kimi_k3()` vs `segment_cache_bytes=0`, fresh prompts, 64 MB between calls | {ratios} | "
              f"<= 1.10x |")
    if "warm" in results:
        print("\nwarm start, where the time goes (medians; 'thread:' steps run beside the first prompt):")
        for key, (wall, cpu) in results["warm"]["parts"].items():
            print(f"  {key:66} {wall * 1e3:7.1f} ms, {cpu * 1e3:7.1f} CPU-ms")
    if "install" in results:
        i = results["install"]
        print(f"\nnon-editable install: first process compiled {i['first']['compiled']} kernels "
              f"({i['first']['seconds']:.1f} s), the second {i['second']['compiled']} ({i['second']['seconds']:.2f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load_time", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 cold and 3 warm repetitions")
    parser.add_argument("--reps", type=int, help="repetitions of the warm rows (cold: a third, at least 1)")
    parser.add_argument("--only", action="append", choices=(*ROWS, "fan-out", "install"),
                        help="only this row (repeatable); default: all but install")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 5)
    cold_reps = max(1, reps // 3) if args.reps else (1 if args.quick else 3)
    rows = args.only or list(ROWS)
    results: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    if "cold" in rows or "fan-out" in rows:
        results["cold"] = row_cold(cold_reps)
    if "warm" in rows:
        results["warm"] = row_warm(reps)
    if "first-long" in rows:
        results["first-long"] = row_first_long(reps)
    if "agent" in rows:
        results["agent"] = row_agent(reps)
    if "cache" in rows:
        results["cache"] = row_cache(reps)
    if "install" in rows:
        results["install"] = row_install()
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
