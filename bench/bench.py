"""The benchmark on real text: kimi_tok beside every peer, ids checked equal every round.

Run from the repo root::

    python -m bench.bench                        # all three parts, a few minutes on 2 cores
    python -m bench.bench --quick                # small and fast, for a smoke check
    python -m bench.bench --kinds code,ja --peers gigatoken,basetenkenizer --rounds 3 --sizes 1k,100k
    python -m bench.bench --profile              # also where kimi_tok's time goes, per kind

Three parts, each printed as a markdown table:

1. **Per kind, one thread** (MB/s of UTF-8): each kind of real text from this machine
   (``bench/realtext.py``: code, prose, JSON, ids/hashes, Japanese, Chinese, Korean, Thai, Hindi,
   Arabic, German, literal control strings) encoded as one plain text, special-token strings as
   text, no tiktoken-safe chunking (``tiktoken.Encoding.encode(text, disallowed_special=())``
   is the reference). It runs in a subprocess with ``RAYON_NUM_THREADS=1`` and
   ``FASTOKENS_BPE_THREADS=1`` set before any peer is imported; kimi_tok runs with ``n_jobs=1``
   and ``segment_cache_bytes=0``. Piece caches (kimi_tok's and the peers') persist across rounds,
   but every round is text no earlier round had; each encoder gets its own copy of the round's str
   (``fresh_str``), so none finds the UTF-8 another one left cached in it. A slow peer (HF tokenizers
   runs at under 1 MB/s) stops being timed in a row once it has spent ``--max-peer-s`` seconds there.
2. **Serving path** (ms, default threads: 2 cores here): K3 chat prompts of real text rendered
   with ``render_chat`` (control tokens ``allow_special=True``, all text ``False``), about 1k,
   10k, 100k and 1M tokens, a fresh prompt every round (4x the rounds under 100,000 characters,
   2x under 1M: small prompts are cheap and the noisiest). kimi_tok is the default ``kimi_k3()``
   (segment cache on) with the cache-off figure beside it. Other work runs between calls: the
   encoders take turns (the order rotates every round) and 64 MB of memory is written before each
   call, so CPU caches are cold as in a serving process. Peers without a segments API run the
   tiktoken-safe chunking and one call per sub-string in a Python loop (``bench/peers.py``).
3. **Synthetic** (labelled so): the same serving path on ``kimi_tok.samples.sample_prompt``,
   the project's old headline workload (a size label of ``1k`` is 4,000 characters there).

Every round every encoder's ids are compared with the reference (``tests/reference.py``); a peer
that disagrees is reported (where, first difference) and left out of "fastest peer" for that row.
A missing peer is skipped with a note. Plots and JSON go to ``bench/results/`` (ignored by git);
``--readme-plot`` also rewrites the README's image ``bench/speedup.png``. The real-text pool is
cached in ``~/.cache/kimi_tok_bench/`` (see ``bench/realtext.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import settled  # noqa: E402
from bench.realtext import KINDS, MB, TABLE_KINDS, Pool, real_prompt  # noqa: E402

RESULTS_DIR = REPO_ROOT / "bench" / "results"
README_PLOT = REPO_ROOT / "bench" / "speedup.png"
COLD_MB = 64  # MB written before each serving-path call: other work, so CPU caches are cold
CACHE_DIR = Path.home() / ".cache" / "kimi_tok_bench"
SYNTHETIC_CHARS_PER_SIZE = 4  # the old headline's size labels: "1k" is a 4,000-character prompt
KIMI, KIMI_NO_CACHE = "kimi_tok", "kimi_tok no cache"
Segments = Sequence[tuple[str, bool]]


# --------------------------------------------------------------------------------------------
# Helpers other bench scripts import
# --------------------------------------------------------------------------------------------


class IdMismatch(AssertionError):
    pass


def check_same_ids(ids: dict[str, np.ndarray], segments: Segments, where: str) -> None:
    """Assert every encoder produced the same ids; on mismatch save the prompt and explain."""
    names = list(ids)
    ref_name = "tiktoken" if "tiktoken" in ids else names[0]
    ref = np.asarray(ids[ref_name], dtype=np.uint32)
    for name in names:
        got = np.asarray(ids[name], dtype=np.uint32)
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


def load_tiktoken() -> Callable[[Segments], np.ndarray]:
    """The reference path (tiktoken, the readable chunking): segments -> uint32 ids."""
    from tests.reference import Reference

    ref = Reference()
    return lambda segments: np.asarray(ref.encode_segments(segments), dtype=np.uint32)


def load_basetenkenizer() -> Callable[[Segments], np.ndarray]:
    """basetenkenizer's ``encode_segments(tiktoken_safe=True)``: segments -> uint32 ids."""
    from bench.peers import load_basetenkenizer as load

    return load().encode_segments


def parse_size(label: str) -> int:
    """'1k' -> 1000 tokens, '1M' -> 1,000,000 tokens."""
    mult = {"k": 1_000, "m": 1_000_000}.get(label[-1].lower(), 1)
    return int(float(label[:-1] if mult > 1 else label) * mult)


def rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def format_text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def save_plot(fig, ax, path: Path) -> None:
    """Grid, legend, tight layout; write ``path`` (creating its folder) and close the figure."""
    import matplotlib.pyplot as plt

    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot saved to {path}")


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


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _rotated(names: list[str], r: int) -> list[str]:
    k = r % len(names)
    return names[k:] + names[:k]


def _difference(ref: np.ndarray, got: np.ndarray, at: int, decode: Callable[[list[int]], str]) -> str:
    lo = max(0, at - 3)
    return (f"first difference at id {at} (lengths {len(ref)} vs {len(got)}): reference "
            f"{ref[lo:at + 4].tolist()} {decode(ref[lo:at + 4].tolist())!r}, got {got[lo:at + 4].tolist()}")


# --------------------------------------------------------------------------------------------
# 1. Per kind, one thread (runs in a subprocess with one-thread settings)
# --------------------------------------------------------------------------------------------


def per_kind_worker(args: argparse.Namespace) -> int:
    """Time every encoder on each kind's fresh texts; write the raw figures to ``args.per_kind_worker``."""
    from bench.peers import as_ids, first_difference, load_peers
    import kimi_tok
    from kimi_tok.samples import sample_text
    from tests.reference import make_reference_encoding

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    pool = Pool.load(quiet=True)
    peers, skipped = load_peers(args.peer_names)
    tok = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    enc = make_reference_encoding()
    encoders: dict[str, Callable[[str], object]] = {
        KIMI: lambda text: tok.encode(text, tiktoken_safe=False).into_numpy()["ids"],
        **{name: peer.encode for name, peer in peers.items()},
    }
    warm = sample_text(20_000, seed=999_999)  # synthetic: shares no text with the pool
    for fn in encoders.values():
        fn(warm)
    settled(tok)
    names = list(encoders)
    out: dict = {"encoders": names, "versions": {n: p.version for n, p in peers.items()},
                 "kimi_tok_version": getattr(kimi_tok, "__version__", "?"), "skipped": skipped,
                 "rounds": args.rounds, "kind_mb": args.kind_mb, "kinds": {}}
    out["missing"] = [k for k in args.kind_names if not pool.sizes.get(k)]
    for kind in (k for k in args.kind_names if k not in out["missing"]):
        texts, note = pool.texts(kind, args.rounds, args.kind_mb, seed=args.seed)
        res = {"label": KINDS[kind].label, "note": note, "bytes": [], "seconds": {n: [] for n in names},
               "cpu": {n: [] for n in names}, "mismatch": {}}
        for r, text in enumerate(texts):
            ids, ref = {}, None
            for name in _rotated(names, r):
                if name not in (KIMI, "tiktoken") and sum(res["seconds"][name]) > args.max_peer_s:
                    continue  # a slow peer has had its share of this row

                own = fresh_str(text)  # outside the timed region
                c0, t0 = time.process_time(), time.perf_counter()
                got = encoders[name](own)
                sec = time.perf_counter() - t0
                res["seconds"][name].append(sec)
                res["cpu"][name].append((time.process_time() - c0) / sec if sec > 0 else 0.0)
                ids[name] = got
            ref = as_ids(ids["tiktoken"]) if "tiktoken" in ids else as_ids(enc.encode(text, disallowed_special=()))
            for name, got in ids.items():
                got = as_ids(got)
                at = first_difference(ref, got)
                if at is not None and name not in res["mismatch"]:
                    res["mismatch"][name] = f"round {r}: " + _difference(ref, got, at, enc.decode)
            res["bytes"].append(len(text.encode("utf-8")))
        out["kinds"][kind] = res
        mbs = {n: _median([b / s / MB for b, s in zip(res["bytes"], res["seconds"][n])]) for n in names}
        print(f"  {kind:>9}: " + ", ".join(f"{n} {v:.1f}" for n, v in mbs.items()) + " MB/s"
              + (f"  [{note}]" if note else ""), file=sys.stderr, flush=True)
    if args.profile:
        out["profile"] = {}
        tok.profile_segments([(warm, False)], tiktoken_safe=False, n_jobs=1)  # its first call loads kernels
        for kind in out["kinds"]:
            text = pool.texts(kind, args.rounds + 1, args.kind_mb, seed=args.seed)[0][-1]
            stages = tok.profile_segments([(text, False)], tiktoken_safe=False, n_jobs=1)
            out["profile"][kind] = {"bytes": len(text.encode("utf-8")), "stages": stages}
    Path(args.per_kind_worker).write_text(json.dumps(out))
    return 0


def run_per_kind(args: argparse.Namespace) -> dict | None:
    """Run :func:`per_kind_worker` in a child process with every peer on one thread."""
    from bench.peers import ONE_THREAD_ENV

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "per_kind.json"
        cmd = [sys.executable, "-m", "bench.bench", "--per-kind-worker", str(path),
               "--kinds", ",".join(args.kind_names), "--peers", ",".join(args.peer_names) or "none",
               "--rounds", str(args.rounds), "--kind-mb", str(args.kind_mb), "--seed", str(args.seed),
               "--max-peer-s", str(args.max_peer_s)]
        if args.profile:
            cmd.append("--profile")
        print(f"\nper-kind table: a child process with {' '.join(f'{k}={v}' for k, v in ONE_THREAD_ENV.items())}",
              flush=True)
        code = subprocess.call(cmd, cwd=REPO_ROOT, env={**os.environ, **ONE_THREAD_ENV})
        if code != 0 or not path.exists():
            print(f"the per-kind child process failed (exit status {code})", file=sys.stderr)
            return None
        return json.loads(path.read_text())


def per_kind_table(data: dict) -> tuple[list[str], list[list[str]], list[str], dict]:
    """Rows of MB/s per kind; notes (small pools, mismatches, threads seen); the summary."""
    names = data["encoders"]
    peers = [n for n in names if n != KIMI]
    label = {n: f"{n} {data['versions'][n]}" for n in peers}
    header = ["kind", "MB/round"] + [label[n] for n in peers] + ["kimi_tok (n_jobs=1)", "kimi_tok / best"]
    rows, notes, summary = [], [], {}
    for kind, res in data["kinds"].items():
        mbs = {n: _median([b / s / MB for b, s in zip(res["bytes"], res["seconds"][n])]) for n in names}
        good = [n for n in peers if n not in res["mismatch"]]
        best = max(good, key=lambda n: mbs[n]) if good else None
        ratio = mbs[KIMI] / mbs[best] if best else float("nan")
        mark = lambda n: " ✗" if n in res["mismatch"] else ""  # noqa: E731
        row = [res["label"], f"{_median(res['bytes']) / MB:.2f}"] + [f"{mbs[n]:.1f}{mark(n)}" for n in peers]
        row += [f"{mbs[KIMI]:.1f}{mark(KIMI)}", f"{ratio:.2f}x ({best})" if best else "n/a"]
        rows.append(row)
        summary[kind] = {"mb_per_s": mbs, "best_peer": best, "x_best": ratio,
                         "mismatch": res["mismatch"], "note": res["note"]}
        if res["note"]:
            notes.append(res["note"])
        for n, why in res["mismatch"].items():
            notes.append(f"ID MISMATCH ({res['label']}, {n}; left out of best): {why}")
    notes += [f"{KINDS[k].label}: no text of this kind on this machine (row left out)" for k in data["missing"]]
    fewer = {n: sorted({len(res["seconds"][n]) for res in data["kinds"].values()}) for n in names}
    fewer = {n: v for n, v in fewer.items() if v and v[0] < data["rounds"]}
    if fewer:
        notes.append("slow peers stop after --max-peer-s seconds in a row: " + ", ".join(
            f"{n} ran {v[0]}-{v[-1]} of {data['rounds']} rounds per kind" for n, v in fewer.items()))
    cpu = {n: _median([c for res in data["kinds"].values() for c in res["cpu"][n]]) for n in names}
    busy = [n for n, c in cpu.items() if c > 1.3]
    notes.append("CPU time / wall time per call, median: " + ", ".join(f"{n} {c:.2f}" for n, c in cpu.items())
                 + (f" (MORE THAN ONE THREAD: {', '.join(busy)})" if busy else " (one thread each)"))
    return header, rows, notes, summary


def profile_table(profile: dict) -> tuple[list[str], list[list[str]]]:
    stages = list(next(iter(profile.values()))["stages"])
    header = ["kind", "MB"] + [f"{s} ms" for s in stages] + ["total ms", "MB/s"]
    rows = []
    for kind, p in profile.items():
        total = sum(p["stages"].values())
        rows.append([KINDS[kind].label, f"{p['bytes'] / MB:.2f}"] + [f"{p['stages'][s] * 1e3:.2f}" for s in stages]
                    + [f"{total * 1e3:.2f}", f"{p['bytes'] / total / MB:.1f}" if total else ""])
    return header, rows


# --------------------------------------------------------------------------------------------
# 2, 3. The serving path
# --------------------------------------------------------------------------------------------


class ColdCaches:
    """Other work between calls: write ``mb`` MB of memory, pushing the encoders' tables out of
    the CPU caches (as other requests, or another model's tokenizer, would)."""

    def __init__(self, mb: int) -> None:
        self.buf = np.zeros(mb << 20, dtype=np.uint8) if mb > 0 else None

    def __call__(self) -> None:
        if self.buf is not None:
            self.buf += 1


def fresh_str(text: str) -> str:
    """An equal but distinct str, as text just received or rendered is: no cached hash and no cached UTF-8
    (the Rust peers read text with ``PyUnicode_AsUTF8AndSize``, which keeps the UTF-8 in the str, so the
    encoders after the first would otherwise skip the encoding that the first paid for)."""
    return (text + " ")[:-1]


def rerender(segments: Segments) -> list[tuple[str, bool]]:
    """Equal but distinct str objects, as a fresh render of the prompt gives (``fresh_str``)."""
    return [(fresh_str(text), allow) for text, allow in segments]


def serving_encoders(peers: dict) -> dict[str, Callable[[Segments], object]]:
    import kimi_tok

    cached, plain = settled(kimi_tok.kimi_k3(), kimi_tok.kimi_k3(segment_cache_bytes=0))
    run_serving.tokenizers = (cached, plain)  # for --profile and the memory line
    # The call order rotates, so each encoder always follows the same one. The two kimi_tok
    # tokenizers share compiled code and tables: the cache-off one goes between peers, never right
    # after the default one, which left them warm for it despite the 64 MB written (10% at 1k-10k;
    # docs/performance.md).
    peer_calls = [(name, peer.encode_segments) for name, peer in peers.items()]
    middle = (len(peer_calls) + 1) // 2
    return dict([(KIMI, lambda segments: cached.encode_segments(segments).into_numpy()["ids"]), *peer_calls[:middle],
                 (KIMI_NO_CACHE, lambda segments: plain.encode_segments(segments).into_numpy()["ids"]),
                 *peer_calls[middle:]])


def rounds_for(rounds: int, n_chars: int) -> int:
    """Small prompts get more rounds: they cost little, and a few milliseconds are the noisiest."""
    return rounds * (4 if n_chars < 100_000 else 2 if n_chars < 1_000_000 else 1)


def run_serving(encoders: dict, make_prompt: Callable[[int, int], list], sizes: list[tuple[str, int]],
                rounds: int, cold: ColdCaches, max_peer_s: float, title: str, dump_dir: Path) -> list[dict]:
    """Every round: a new prompt of each size, each encoder once (rotating order, cold caches before
    each call), ids compared with the reference. A size's prompts and their reference ids are made
    before its rounds: the reference's ~0.35 s on one core (1M tokens), made just before a round, had
    slowed the call after it, always the same encoder's in the rounds where it came first (in one
    process, kimi_tok's default call at 1M: 32.8 ms after it, 17.5 without; docs/performance.md). A
    peer whose previous size predicts more than ``max_peer_s`` seconds per call is skipped at the
    larger sizes (tiktoken never is)."""
    from bench.peers import as_ids, first_difference
    from tests.reference import Reference, make_reference_encoding

    reference, decode = Reference(), make_reference_encoding().decode
    names = list(encoders)
    results: list[dict] = []
    for k, (label, n_chars) in enumerate(sizes):
        active = list(names)
        if results:
            prev = results[-1]
            for n in names:
                if n.startswith(KIMI) or n == "tiktoken" or n not in prev["seconds"]:
                    continue
                predicted = _median(prev["seconds"][n]) * n_chars / prev["n_chars"]
                if predicted > max_peer_s:
                    active.remove(n)
                    print(f"  ({n} skipped at {label}: {predicted:.1f} s per call predicted from {prev['label']})",
                          flush=True)
        res = {"label": label, "n_chars": n_chars, "segments": [], "tokens": [], "seconds": {n: [] for n in active},
               "mismatch": {}, "skipped": [n for n in names if n not in active]}
        prompts = [make_prompt(n_chars, k * 1000 + r) for r in range(rounds_for(rounds, n_chars))]
        references = [np.asarray(reference.encode_segments(segments), dtype=np.uint32) for segments in prompts]
        for r, (segments, ref) in enumerate(zip(prompts, references)):
            for name in _rotated(active, r):
                prompt = rerender(segments)  # outside the timed region
                cold()
                t0 = time.perf_counter()
                got = encoders[name](prompt)
                res["seconds"][name].append(time.perf_counter() - t0)
                at = first_difference(ref, as_ids(got))
                if at is not None and name not in res["mismatch"]:
                    dump = dump_dir / f"mismatch_{title.split()[0]}_{label}_{r}_{name.replace(' ', '_')}.json"
                    dump.parent.mkdir(parents=True, exist_ok=True)
                    dump.write_text(json.dumps({"segments": segments}, ensure_ascii=False))
                    res["mismatch"][name] = f"round {r}: {_difference(ref, as_ids(got), at, decode)}; prompt in {dump}"
                del prompt, got
            res["segments"].append(len(segments))
            res["tokens"].append(len(ref))
        results.append(res)
        print(f"  {title} {label}: {int(_median(res['tokens'])):,} tokens: "
              + ", ".join(f"{n} {_median(s) * 1e3:.2f} ms" for n, s in res["seconds"].items()), flush=True)
    return results


def serving_table(results: list[dict], versions: dict[str, str]) -> tuple[list[str], list[list[str]], list[str], list[dict]]:
    names = list(results[0]["seconds"]) + [n for r in results for n in r["skipped"] if n not in results[0]["seconds"]]
    peers = [n for n in names if not n.startswith(KIMI)]
    header = ["size", "chars", "segs", "tokens", "kimi_tok ms", "no cache ms"]
    header += [f"{n} {versions.get(n, '')}".strip() + " ms" for n in peers]
    header += ["fastest peer", "x fastest", "x tiktoken"]
    rows, notes, summary = [], [], []
    for res in results:
        ms = {n: _median(s) * 1e3 for n, s in res["seconds"].items()}
        good = [n for n in peers if n in ms and n not in res["mismatch"]]
        fastest = min(good, key=lambda n: ms[n]) if good else None
        mark = lambda n: " ✗" if n in res["mismatch"] else ""  # noqa: E731
        cell = lambda n: f"{ms[n]:.2f}{mark(n)}" if n in ms else "skipped"  # noqa: E731
        row = [res["label"], f"{res['n_chars']:,}", str(int(_median(res["segments"]))),
               f"{int(_median(res['tokens'])):,}", cell(KIMI), cell(KIMI_NO_CACHE)] + [cell(n) for n in peers]
        x_fast = ms[fastest] / ms[KIMI] if fastest and KIMI in ms else float("nan")
        x_tik = ms["tiktoken"] / ms[KIMI] if "tiktoken" in ms and KIMI in ms else float("nan")
        row += [fastest or "n/a", f"{x_fast:.2f}x" if fastest else "", f"{x_tik:.1f}x" if "tiktoken" in ms else ""]
        rows.append(row)
        summary.append({"label": res["label"], "n_chars": res["n_chars"], "tokens": int(_median(res["tokens"])),
                        "median_ms": ms, "fastest_peer": fastest, "x_fastest": x_fast, "x_tiktoken": x_tik,
                        "mismatch": res["mismatch"], "skipped": res["skipped"]})
        for n, why in res["mismatch"].items():
            notes.append(f"ID MISMATCH (size {res['label']}, {n}; left out of fastest): {why}")
    return header, rows, notes, summary


def plot_serving(summaries: dict[str, list[dict]], path: Path, title: str) -> None:
    """kimi_tok's speedup over each peer against prompt length: one panel per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(summaries), figsize=(6.5 * len(summaries), 4.6), sharey=True, squeeze=False)
    peers = sorted({n for summary in summaries.values() for s in summary for n in s["median_ms"]
                    if not n.startswith(KIMI)})
    style = {peer: (f"C{i}", "os^dvPX*"[i % 8]) for i, peer in enumerate(peers)}
    for ax, (workload, summary) in zip(axes[0], summaries.items()):
        for peer in peers:
            pts = [(s["tokens"], s["median_ms"][peer] / s["median_ms"][KIMI]) for s in summary
                   if peer in s["median_ms"] and peer not in s["mismatch"]]
            if pts:
                ax.plot(*zip(*pts), marker=style[peer][1], color=style[peer][0], ms=4, label=f"vs {peer}")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("prompt length (tokens)")
        ax.set_title(workload, fontsize=10)
        if ax is axes[0][-1]:
            fig.suptitle(title, fontsize=10)
            axes[0][0].set_ylabel("kimi_tok speedup (median time ratio, log)")
            save_plot(fig, ax, path)
        else:
            ax.grid(True, which="both", alpha=0.3)


def plot_per_kind(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(summary)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.bar([KINDS[k].label for k in kinds], [summary[k]["x_best"] for k in kinds], color="tab:blue")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--", label="the best single-thread peer")
    ax.set_ylabel("kimi_tok MB/s / best peer's")
    ax.set_title("One thread, one plain text per kind of real text")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    save_plot(fig, ax, path)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def _names(value: str, allowed: Sequence[str], what: str, p: argparse.ArgumentParser,
           hidden: Sequence[str] = ()) -> list[str]:
    if value.strip().lower() in ("", "none"):
        return []
    if value.strip().lower() == "all":
        return list(allowed)
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in allowed and n not in hidden]
    if unknown:
        p.error(f"unknown {what} {unknown}; choose from {', '.join(allowed)} (or all, none)")
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from bench.peers import PEERS

    p = argparse.ArgumentParser(prog="python -m bench.bench", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="kinds: " + ", ".join(KINDS) + "\npeers: " + ", ".join(PEERS))
    p.add_argument("--quick", action="store_true",
                   help="2 rounds, 0.1 MB per kind, sizes 1k,10k (a smoke check, not a measurement)")
    p.add_argument("--kinds", default=",".join(TABLE_KINDS), help="per-kind table rows (all, none, or a list)")
    p.add_argument("--peers", default=",".join(PEERS), help="peers beside kimi_tok (all, none, or a list)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per row, each on fresh text (default 5)")
    p.add_argument("--kind-mb", type=float, default=None, help="MB of text per kind and round (default 1)")
    p.add_argument("--sizes", default=None, help="serving-path sizes in tokens, or none (default 1k,10k,40k,100k,1M)")
    p.add_argument("--synthetic-sizes", default=None, help="sizes of the synthetic workload (default: --sizes)")
    p.add_argument("--max-peer-s", type=float, default=3.0,
                   help="a slow peer's time budget: per-kind rows stop timing it after this many seconds in a "
                        "row; serving sizes skip it when its previous size predicts longer per call (default 3 s;"
                        " tiktoken, the reference, always runs)")
    p.add_argument("--cold-mb", type=int, default=COLD_MB, help="MB written before each serving-path call (0: none)")
    p.add_argument("--seed", type=int, default=0, help="which fresh text the rounds get")
    p.add_argument("--profile", action="store_true", help="kimi_tok's per-stage profile per kind and serving size")
    p.add_argument("--results-dir", default=str(RESULTS_DIR), help="where JSON and plots go (default bench/results)")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--readme-plot", action="store_true", help=f"also rewrite the README's {README_PLOT.name}")
    p.add_argument("--per-kind-worker", metavar="PATH", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    quick = {"rounds": 2, "kind_mb": 0.1, "sizes": "1k,10k"}
    full = {"rounds": 5, "kind_mb": 1.0, "sizes": "1k,10k,40k,100k,1M"}
    for key, value in (quick if args.quick else full).items():  # --quick changes only what is not given
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.rounds < 1 or args.kind_mb <= 0:
        p.error("--rounds and --kind-mb must be positive")
    args.kind_names = _names(args.kinds, list(KINDS), "kinds", p)
    args.peer_names = _names(args.peers, PEERS, "peers", p, hidden=("_broken",))  # the smoke test's wrong peer
    synth = args.sizes if args.synthetic_sizes is None else args.synthetic_sizes
    args.size_labels, args.synthetic_labels = (
        [] if v.strip().lower() in ("", "none") else [s.strip() for s in v.split(",") if s.strip()]
        for v in (args.sizes, synth))
    try:
        [parse_size(s) for s in args.size_labels + args.synthetic_labels]
    except ValueError:
        p.error(f"sizes look like 1k, 100k or 1M, not {args.sizes!r} / {synth!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.per_kind_worker:
        return per_kind_worker(args)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from bench.peers import load_peers

    results_dir = Path(args.results_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    commit = _git_commit()
    out: dict = {"commit": commit, "python": sys.version.split()[0], "cpus": os.cpu_count(),
                 "args": {k: v for k, v in vars(args).items() if k != "per_kind_worker"}}
    t_start = time.perf_counter()
    pool = Pool.load()
    out["load_average_start"], out["machine_speed_start"] = os.getloadavg(), machine_speed()
    print(f"python {out['python']}, {os.cpu_count()} CPUs, commit {commit}, rounds={args.rounds}; machine now: load "
          f"average {out['load_average_start'][0]:.1f}, {out['machine_speed_start']:.0f}M Python loop steps/s "
          f"(a busy machine slows everything; compare ratios within a run); real-text pool {pool.path}:")
    print("\n".join(pool.summary(dict.fromkeys(args.kind_names + ["code", "prose", "json", "ids", "specials"]))))
    status = 0

    # 1. per kind, one thread
    if args.kind_names:
        data = run_per_kind(args)
        if data is None:
            status = 1
        else:
            header, rows, notes, summary = per_kind_table(data)
            print(f"\n### Per kind, one thread: MB/s (median of {args.rounds} rounds, each fresh text of up to "
                  f"{args.kind_mb:g} MB; ids checked against tiktoken every round; ✗ = ids differ)\n")
            print(format_markdown_table(header, rows))
            print("\n" + "\n".join(f"- {n}" for n in notes))
            for name, why in data["skipped"].items():
                print(f"- {name} not run: {why}")
            out["per_kind"] = {"raw": data, "summary": summary}
            if any(KIMI in s["mismatch"] for s in summary.values()):
                status = 2
            if data.get("profile"):
                header, rows = profile_table(data["profile"])
                print("\n### kimi_tok per-stage profile, one thread, one fresh text per kind (ms)\n")
                print(format_markdown_table(header, rows))
            if not args.no_plot:
                plot_per_kind(summary, results_dir / "per_kind.png")

    # 2, 3. serving path: real text, then the synthetic samples
    if args.size_labels or args.synthetic_labels:
        peers, skipped = load_peers(args.peer_names)
        for name, why in skipped.items():
            print(f"note: {name}: {why}")
        encoders = serving_encoders(peers)
        versions = {n: p.version for n, p in peers.items()}
        cold = ColdCaches(args.cold_mb)
        drawer = pool.drawer(args.seed + 1)
        warm = real_prompt(drawer, 20_000)  # from the same drawer: the timed prompts never repeat it
        for fn in encoders.values():
            fn(rerender(warm))
        summaries, tables = {}, {}
        if args.size_labels:
            calib = real_prompt(drawer, 400_000)
            from tests.reference import Reference

            cpt = sum(len(t) for t, _ in calib) / len(Reference().encode_segments(calib))
            sizes = [(s, int(parse_size(s) * cpt)) for s in args.size_labels]
            print(f"\nserving path, real text ({cpt:.2f} chars per token here), default threads "
                  f"({os.cpu_count()} CPUs), {args.cold_mb} MB written before each call:", flush=True)
            res = run_serving(encoders, lambda n, _seed: real_prompt(drawer, n), sizes, args.rounds, cold,
                              args.max_peer_s, "real", results_dir)
            tables["real"] = serving_table(res, versions)
            summaries["real text"] = tables["real"][3]
            out["serving_real"] = {"chars_per_token": cpt, "raw": res, "summary": tables["real"][3],
                                   "drawer_wrapped": sorted(drawer.wrapped)}
        if args.synthetic_labels:
            from kimi_tok.samples import sample_prompt

            sizes = [(s, parse_size(s) * SYNTHETIC_CHARS_PER_SIZE) for s in args.synthetic_labels]
            print("\nserving path, synthetic prompts (kimi_tok.samples.sample_prompt):", flush=True)
            res = run_serving(encoders, lambda n, seed: sample_prompt(n, seed=seed + 10_000 * (args.seed + 1)),
                              sizes, args.rounds, cold, args.max_peer_s, "synthetic", results_dir)
            tables["synthetic"] = serving_table(res, versions)
            summaries["synthetic (kimi_tok.samples)"] = tables["synthetic"][3]
            out["serving_synthetic"] = {"raw": res, "summary": tables["synthetic"][3]}
        how = "; ".join(f"{n}: {p.how}" for n, p in peers.items())
        for key, heading in (("real", "Serving path, real text"), ("synthetic", "Serving path, SYNTHETIC prompts "
                                                                               "(kimi_tok.samples)")):
            if key not in tables:
                continue
            header, rows, notes, _ = tables[key]
            print(f"\n### {heading}: ms per prompt (median of {4 * args.rounds} rounds under 100k characters, "
                  f"{2 * args.rounds} under 1M, {args.rounds} above, a fresh prompt each round; "
                  f"kimi_tok = default kimi_k3(), segment cache on; ✗ = ids differ)\n")
            print(format_markdown_table(header, rows))
            print("\n" + "\n".join(f"- {n}" for n in notes + [f"how the peers are called: {how}"]))
        if KIMI in encoders and any(KIMI in s["mismatch"] or KIMI_NO_CACHE in s["mismatch"]
                                    for summary in summaries.values() for s in summary):
            status = 2
        if "real" in tables and out["serving_real"]["drawer_wrapped"]:
            print(f"- the pool ran out of {', '.join(out['serving_real']['drawer_wrapped'])}: later prompts "
                  f"reuse its blocks in a new order")
        cached, _plain = run_serving.tokenizers
        if args.size_labels:
            largest = real_prompt(drawer, max(int(parse_size(s) * cpt) for s in args.size_labels))
            before = rss_bytes()
            peak = peak_rss_during(lambda: _plain.encode_segments(largest))
            out["memory"] = {"rss_mib": before / 2**20, "encode_peak_growth_mib": (peak - before) / 2**20,
                             "n_chars": sum(len(t) for t, _ in largest)}
            print(f"- kimi_tok memory: RSS {before / 2**20:.0f} MiB; one encode of "
                  f"{out['memory']['n_chars']:,} chars (cache off) grew peak RSS by "
                  f"{out['memory']['encode_peak_growth_mib']:.1f} MiB")
            if args.profile:
                stages = cached.profile_segments(largest, n_jobs=None)
                total = sum(stages.values()) or 1.0
                out["profile_serving"] = stages
                print(f"\n### kimi_tok per-stage profile, the largest real prompt ({out['memory']['n_chars']:,} chars, "
                      f"default threads)\n")
                print(format_markdown_table(["stage", "ms", "share"],
                                            [[s, f"{v * 1e3:.2f}", f"{100 * v / total:.0f}%"] for s, v in stages.items()]))
        if not args.no_plot and summaries:
            title = f"kimi_tok speedup on rendered K3 prompts ({os.cpu_count()} cores, commit {commit})"
            plot_serving(summaries, results_dir / "serving.png", title)
            if args.readme_plot and "real text" in summaries:
                plot_serving({"real text": summaries["real text"]}, README_PLOT, title)
    out["wall_s"] = time.perf_counter() - t_start
    out["load_average_end"], out["machine_speed_end"] = os.getloadavg(), machine_speed()
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"bench-{stamp}.json"
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"\nresults saved to {path} ({out['wall_s']:.0f} s in all; at the end: load average "
          f"{out['load_average_end'][0]:.1f}, {out['machine_speed_end']:.0f}M Python loop steps/s)")
    if status == 2:
        print("ID MISMATCH in kimi_tok: see the notes above", file=sys.stderr)
    return status


def machine_speed() -> float:
    """Millions of pure-Python loop steps per second on one core, right now: a yardstick for comparing
    runs of this bench made at different times (a busy or throttled machine shows it)."""
    best = 0.0
    for _ in range(3):
        t0, total = time.perf_counter(), 0
        for i in range(1_000_000):
            total += i
        best = max(best, 1.0 / (time.perf_counter() - t0))
    return best


def _git_commit() -> str:
    """The commit measured, with ``+changes`` when kimi_tok/ differs from it in the working tree
    (``$KIMI_TOK_BENCH_COMMIT`` names it for a tree exported with ``git archive``)."""
    if os.environ.get("KIMI_TOK_BENCH_COMMIT"):
        return os.environ["KIMI_TOK_BENCH_COMMIT"]
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=REPO_ROOT, capture_output=True, text=True,  # noqa: E731
                                        timeout=10).stdout.strip()
        commit = run("rev-parse", "--short", "HEAD") or "?"
        return commit + ("+changes" if run("status", "--porcelain", "--", "kimi_tok") else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


if __name__ == "__main__":
    sys.exit(main())
