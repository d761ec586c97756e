"""Headline benchmark: encode rendered Kimi K3 prompts with kimi_tok, tiktoken and basetenkenizer.

Run from the repo root::

    python -m bench.bench                          # sizes 1k,10k,100k,1M tokens, 5 rounds
    python -m bench.bench --quick
    python -m bench.bench --encoders tiktoken,basetenkenizer --sizes 1k,100k --rounds 3

A "size" is token-ish: ``1k`` means a prompt of about 4,000 characters. Every round renders a
NEW prompt (``sample_prompt(n_chars, seed=round + 1000 * size_index)``), every encoder encodes
that same prompt, and their ids must be identical. We report the median time over rounds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from kimi_tok.samples import sample_prompt  # noqa: E402
from tests.reference import Reference, data_dir, load_pattern, load_special_tokens  # noqa: E402

ALL_ENCODERS = ("kimi_tok", "tiktoken", "basetenkenizer")
BASELINES = ("tiktoken", "basetenkenizer")
CHARS_PER_TOKEN = 4
CACHE_DIR = Path.home() / ".cache" / "kimi_tok_bench"

Segments = Sequence[tuple[str, bool]]


# --------------------------------------------------------------------------------------------
# Encoders: each loader returns a function segments -> uint32 ids, or raises to be skipped
# --------------------------------------------------------------------------------------------


def load_kimi_tok() -> Callable[[Segments], np.ndarray]:
    import kimi_tok

    tok = kimi_tok.kimi_k3(segment_cache_bytes=0)  # cold caches: no segment is reused across rounds
    load_kimi_tok.tokenizer = tok  # kept for --profile and the memory check
    return lambda segments: tok.encode_segments(segments).into_numpy()["ids"]


def load_tiktoken() -> Callable[[Segments], np.ndarray]:
    ref = Reference()
    return lambda segments: np.asarray(ref.encode_segments(segments), dtype=np.uint32)


def basetenkenizer_json() -> str:
    """The tokenizer.json basetenkenizer builds from tiktoken.model (slow, so cached on disk)."""
    import basetenkenizer.tiktoken

    model = data_dir() / "tiktoken.model"
    pattern, special = load_pattern(), load_special_tokens()
    key = hashlib.sha256(
        model.read_bytes() + pattern.encode() + json.dumps(special, sort_keys=True).encode()
    ).hexdigest()
    cached, key_file = CACHE_DIR / "basetenkenizer.json", CACHE_DIR / "basetenkenizer.key"
    if cached.exists() and key_file.exists() and key_file.read_text() == key:
        return cached.read_text(encoding="utf-8")
    js = basetenkenizer.tiktoken.tiktoken_model_to_tokenizer_json(
        str(model), pattern=pattern, special_tokens=special
    )
    if js is None:
        raise RuntimeError("tiktoken_model_to_tokenizer_json returned None")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cached.write_text(js, encoding="utf-8")
    key_file.write_text(key)
    return js


def load_basetenkenizer() -> Callable[[Segments], np.ndarray]:
    import basetenkenizer

    tk = basetenkenizer.Tokenizer.from_json_str(basetenkenizer_json())
    return lambda segments: np.asarray(
        tk.encode_segments(list(segments), tiktoken_safe=True).into_numpy()["ids"], dtype=np.uint32
    )


LOADERS = {"kimi_tok": load_kimi_tok, "tiktoken": load_tiktoken, "basetenkenizer": load_basetenkenizer}


def load_encoders(names: Sequence[str]) -> tuple[dict[str, Callable[[Segments], np.ndarray]], dict[str, int]]:
    """Load and warm each encoder (one untimed small call); skip, with a warning, any that fail.

    kimi_tok is loaded first so the RSS measured after it (returned per encoder) is its own.
    """
    warmup = sample_prompt(4000, seed=999_999)
    encoders, rss_after = {}, {}
    for name in sorted(names, key=lambda n: n != "kimi_tok"):
        t0 = time.perf_counter()
        try:
            encode = LOADERS[name]()
            encode(warmup)
        except Exception as exc:  # an encoder under construction must not stop the bench
            print(f"WARNING: skipping {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"loaded {name} (+warm-up) in {time.perf_counter() - t0:.2f} s")
        encoders[name] = encode
        rss_after[name] = rss_bytes()
    return encoders, rss_after


# --------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------


@dataclass
class SizeResult:
    label: str
    n_chars: int
    n_segments: int = 0
    tokens: list[int] = field(default_factory=list)
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def median_s(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def median_tokens(self) -> int:
        return int(statistics.median(self.tokens))


class IdMismatch(AssertionError):
    pass


def check_same_ids(ids: dict[str, np.ndarray], segments: Segments, where: str) -> None:
    """Assert every encoder produced the same ids; on mismatch save the prompt and explain."""
    names = list(ids)
    ref_name = "tiktoken" if "tiktoken" in ids else names[0]
    ref = ids[ref_name]
    for name in names:
        got = ids[name]
        if len(got) == len(ref) and np.array_equal(got, ref):
            continue
        n = min(len(got), len(ref))
        diff = np.flatnonzero(got[:n] != ref[:n])
        first = int(diff[0]) if len(diff) else n
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        dump = CACHE_DIR / f"mismatch_{where.replace(' ', '_')}.json"
        dump.write_text(json.dumps({"segments": list(segments)}, ensure_ascii=False))
        lo = max(0, first - 3)
        raise IdMismatch(
            f"ID MISMATCH at {where}: {name} vs {ref_name}: lengths {len(got)} vs {len(ref)}, "
            f"first differing index {first}\n"
            f"  {ref_name}[{lo}:{first + 4}] = {ref[lo:first + 4].tolist()}\n"
            f"  {name}[{lo}:{first + 4}] = {got[lo:first + 4].tolist()}\n"
            f"  prompt saved to {dump}"
        )


def run_size(
    encoders: dict, label: str, n_chars: int, size_index: int, rounds: int
) -> SizeResult:
    """Encode ``rounds`` fresh prompts of ``n_chars`` chars with every encoder; check and time."""
    from tqdm import tqdm

    result = SizeResult(label, n_chars, seconds={name: [] for name in encoders})
    names = list(encoders)
    bar = tqdm(range(rounds), desc=f"{label:>5}", leave=False, disable=n_chars < 400_000)
    for r in bar:
        segments = sample_prompt(n_chars, seed=r + size_index * 1000)
        result.n_segments = len(segments)
        ids = {}
        for name in names[r % len(names):] + names[: r % len(names)]:  # rotate the order
            t0 = time.perf_counter()
            ids[name] = encoders[name](segments)
            result.seconds[name].append(time.perf_counter() - t0)
        check_same_ids(ids, segments, f"size {label} round {r}")
        result.tokens.append(len(next(iter(ids.values()))))
    return result


# --------------------------------------------------------------------------------------------
# Memory and profile
# --------------------------------------------------------------------------------------------


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def peak_rss_during(fn: Callable[[], object]) -> int:
    """Peak RSS while ``fn`` runs: kernel high-water mark if resettable, else a sampling thread."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
        fn()
        with open("/proc/self/status") as f:
            hwm = next(line for line in f if line.startswith("VmHWM:"))
        return int(hwm.split()[1]) * 1024
    except OSError:
        peak, done = rss_bytes(), threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_bytes())
                time.sleep(0.001)

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        fn()
        done.set()
        t.join()
        return max(peak, rss_bytes())


def measure_memory(encode, n_chars: int, rss_before_load: int, rss_after_load: int) -> dict:
    segments = sample_prompt(n_chars, seed=424_242)
    before = rss_bytes()
    peak = peak_rss_during(lambda: encode(segments))
    return {
        "rss_before_load_mib": rss_before_load / 2**20,
        "rss_after_load_mib": rss_after_load / 2**20,
        "encode_n_chars": n_chars,
        "encode_peak_growth_mib": (peak - before) / 2**20,
        "rss_after_encode_mib": rss_bytes() / 2**20,
    }


def run_profile(n_chars: int) -> dict | None:
    tok = getattr(load_kimi_tok, "tokenizer", None)
    hook = getattr(tok, "profile_segments", None)
    if hook is None:
        print("(--profile: kimi_tok has no profile_segments hook; skipped)")
        return None
    stages = hook(sample_prompt(n_chars, seed=31_337))
    total = sum(stages.values()) or 1.0
    print(f"\nkimi_tok profile, prompt of {n_chars:,} chars:")
    for stage, sec in stages.items():
        print(f"  {stage:<24} {sec * 1e3:10.2f} ms  {100 * sec / total:5.1f}%")
    return {k: float(v) for k, v in stages.items()}


# --------------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------------


def table_rows(results: list[SizeResult], names: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    header = ["size", "chars", "segs", "tokens"]
    header += [f"{n} ms" for n in names] + [f"{n} Mtok/s" for n in names]
    speedups = [b for b in BASELINES if b in names and "kimi_tok" in names]
    header += [f"x vs {b}" for b in speedups]
    rows = []
    for res in results:
        tokens = res.median_tokens()
        row = [res.label, f"{res.n_chars:,}", str(res.n_segments), f"{tokens:,}"]
        row += [f"{res.median_s(n) * 1e3:.2f}" for n in names]
        row += [f"{tokens / res.median_s(n) / 1e6:.2f}" for n in names]
        row += [f"{res.median_s(b) / res.median_s('kimi_tok'):.1f}x" for b in speedups]
        rows.append(row)
    return header, rows


def progress_line(res: SizeResult, names: Sequence[str]) -> str:
    times = ", ".join(f"{n} {res.median_s(n) * 1e3:.2f} ms" for n in names)
    return f"size {res.label}: {res.n_chars:,} chars, {res.median_tokens():,} tokens: {times}"


def format_text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def plot_speedups(results: list[SizeResult], names: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = [res.median_tokens() for res in results]
    for base in BASELINES:
        if base in names:
            y = [res.median_s(base) / res.median_s("kimi_tok") for res in results]
            ax.plot(x, y, marker="o", label=f"vs {base}")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("kimi_tok speedup (x, median time ratio)")
    ax.set_title("kimi_tok speedup on rendered Kimi K3 prompts")
    save_plot(fig, ax, path)


def save_plot(fig, ax, path: Path) -> None:
    """Grid, legend, tight layout; write ``path`` (creating its folder) and close the figure."""
    import matplotlib.pyplot as plt

    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot saved to {path}")


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_size(label: str) -> int:
    """'1k' -> 1000 tokens, '1M' -> 1,000,000 tokens."""
    mult = {"k": 1_000, "m": 1_000_000}.get(label[-1].lower(), 1)
    return int(float(label[:-1] if mult > 1 else label) * mult)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.bench", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1k,10k,100k,1M", help="token-ish sizes (x4 chars)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--encoders", default=",".join(ALL_ENCODERS))
    p.add_argument("--plot", default=str(REPO_ROOT / "bench" / "speedup.png"))
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--profile", action="store_true", help="print kimi_tok's per-stage profile")
    p.add_argument("--json", metavar="PATH", help="save results as JSON")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table")
    p.add_argument("--quick", action="store_true", help="sizes 1k,10k,100k and 2 rounds")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.rounds = "1k,10k,100k", 2
    args.size_labels = [s.strip() for s in args.sizes.split(",") if s.strip()]
    args.encoder_names = [e.strip() for e in args.encoders.split(",") if e.strip()]
    unknown = set(args.encoder_names) - set(ALL_ENCODERS)
    if unknown:
        p.error(f"unknown encoders {sorted(unknown)}; choose from {ALL_ENCODERS}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    rss_start = rss_bytes()
    encoders, rss_after_load = load_encoders(args.encoder_names)
    if not encoders:
        print("no encoder could be loaded", file=sys.stderr)
        return 1
    names = list(encoders)
    memory = None

    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, rounds={args.rounds}")
    results = []
    try:
        for i, label in enumerate(args.size_labels):
            n_chars = parse_size(label) * CHARS_PER_TOKEN
            results.append(run_size(encoders, label, n_chars, i, args.rounds))
            print(progress_line(results[-1], names), flush=True)
    except IdMismatch as exc:
        print(exc, file=sys.stderr)
        return 2

    header, rows = table_rows(results, names)
    print(f"\nmedian over {args.rounds} rounds (each round a new prompt; ids checked equal):")
    print(format_text_table(header, rows))
    if args.markdown:
        print("\n" + format_markdown_table(header, rows))

    if "kimi_tok" in encoders:
        largest = max(parse_size(s) for s in args.size_labels) * CHARS_PER_TOKEN
        memory = measure_memory(encoders["kimi_tok"], largest, rss_start, rss_after_load["kimi_tok"])
        print(
            f"\nkimi_tok memory: RSS {memory['rss_before_load_mib']:.0f} MiB before load, "
            f"{memory['rss_after_load_mib']:.0f} MiB after load+warm-up; one encode of "
            f"{largest:,} chars grew peak RSS by {memory['encode_peak_growth_mib']:.1f} MiB"
        )
    profile = None
    if args.profile:
        if "kimi_tok" in encoders:
            profile = run_profile(max(parse_size(s) for s in args.size_labels) * CHARS_PER_TOKEN)
        else:
            print("(--profile: kimi_tok not loaded; skipped)")

    if "kimi_tok" in encoders and len(names) > 1 and not args.no_plot:
        plot_speedups(results, names, Path(args.plot))
    if args.json:
        save_json(Path(args.json), args, results, names, memory, profile)
    return 0


def save_json(path: Path, args, results, names, memory, profile) -> None:
    out = {
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "encoders": names,
        "sizes": [
            {
                "label": r.label,
                "n_chars": r.n_chars,
                "n_segments": r.n_segments,
                "tokens": r.tokens,
                "seconds": r.seconds,
                "median_seconds": {n: r.median_s(n) for n in names},
            }
            for r in results
        ],
        "memory": memory,
        "profile": profile,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"results saved to {path}")


if __name__ == "__main__":
    sys.exit(main())
