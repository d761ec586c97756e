"""Where a one-thread call spends its time, instruction by instruction: perf samples mapped onto the
compiled call's machine code.

numba registers no symbols with perf, so ``perf report`` shows bare addresses inside the fused kernel
(every stage of a call is inlined into it). ``record`` encodes one kind of real text on one thread, a
fresh text each call (``--rounds`` of them, then again from the first, by then cached), saves the
kernel's code and where it was loaded, and, run under ``perf record --control``, lets perf sample
only the calls. ``report`` groups the samples by region of the kernel and prints the hottest
instructions (``objdump`` disassembles the saved code). Linux only; the profiles in
docs/performance.md ("Profiles of the compiled call") were taken this way::

    mkfifo /tmp/kt_ctl
    perf record -e cpu-clock -F 5000 -D -1 --control fifo:/tmp/kt_ctl -o /tmp/kt.data \\
        python -m bench.kernel_profile record --kind code --seconds 8 --control /tmp/kt_ctl --out /tmp/kt
    perf script -i /tmp/kt.data -F ip > /tmp/kt/ips.txt
    python -m bench.kernel_profile report /tmp/kt
"""

from __future__ import annotations

import argparse
import bisect
import collections
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FUSED_KERNEL = "kimi_tok.pipeline.assembly.encode_packed_fused"
REGION_BYTES = 512  # samples are grouped into regions of the kernel's code this large


def kernel_code(name: str = FUSED_KERNEL) -> tuple[int, bytes]:
    """``(address, code)``: where the compiled kernel ``name`` starts, and the executable mapping
    holding it (from that address on) as this process loaded it."""
    from kimi_tok.native import jit

    dispatcher = jit.KERNELS[name]
    overload = next(iter(dispatcher.overloads.values()))
    start = overload.library.get_pointer_to_function(overload.fndesc.llvm_func_name)
    for line in Path("/proc/self/maps").read_text().splitlines():
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if low <= start < high:
            return start, ctypes.string_at(start, high - start)
    raise RuntimeError(f"{name} is not in any mapping of this process")


def kernel_starts() -> dict[str, int]:
    """Where each compiled kernel of this process starts (samples outside the fused kernel are
    credited to the nearest start below them)."""
    from kimi_tok.native import jit

    starts = {}
    for name, dispatcher in jit.KERNELS.items():
        for overload in dispatcher.overloads.values():
            try:
                starts[name] = overload.library.get_pointer_to_function(overload.fndesc.llvm_func_name)
            except Exception:  # not loaded in this process
                continue
    return starts


def record(args: argparse.Namespace) -> int:
    import kimi_tok
    from bench import settled
    from bench.realtext import MB, Pool

    texts, note = Pool.load().texts(args.kind, args.rounds, args.mb, seed=args.seed)
    if note:
        print(note, file=sys.stderr)
    tok, = settled(kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0))  # no kernel load left in the background
    tok.encode("warm up " * 1000, tiktoken_safe=False)
    start, code = kernel_code()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel.bin").write_bytes(code)
    control = os.open(args.control, os.O_WRONLY) if args.control else None
    ms_per_mb: list[float] = []
    deadline = time.perf_counter() + args.seconds
    calls = 0
    text_mb = [len(text.encode("utf-8")) / MB for text in texts]  # not between the calls: perf stops late
    while time.perf_counter() < deadline:
        text = texts[calls % len(texts)]
        own = (text + " ")[:-1]  # a new str each call, as a caller hands over
        if control is not None:
            os.write(control, b"enable\n")
        t0 = time.perf_counter()
        tok.encode(own, tiktoken_safe=False)
        seconds = time.perf_counter() - t0
        if control is not None:
            os.write(control, b"disable\n")
        ms_per_mb.append(seconds * 1e3 / text_mb[calls % len(texts)])
        calls += 1
    fresh = ms_per_mb[:len(texts)]
    starts = kernel_starts()
    summary = {"kind": args.kind, "kernel": FUSED_KERNEL, "start": start, "code_bytes": len(code), "calls": calls,
               "fresh_ms_per_mb": statistics.median(fresh), "ms_per_mb": statistics.median(ms_per_mb),
               "kernel_starts": starts}
    (out / "kernel.json").write_text(json.dumps(summary, indent=1))
    print(f"{args.kind}: {calls} calls; ms/MB median {summary['ms_per_mb']:.2f} "
          f"(first pass over {len(fresh)} fresh texts {summary['fresh_ms_per_mb']:.2f}); kernel code saved in {out}")
    return 0


def disassembly(folder: Path, start: int) -> list[tuple[int, str]]:
    """``(offset, instruction)`` of the saved kernel code (empty without objdump)."""
    try:
        listing = subprocess.run(["objdump", "-D", "-b", "binary", "-m", "i386:x86-64", f"--adjust-vma={start:#x}",
                                  str(folder / "kernel.bin")], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    rows = []
    for line in listing.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(?:[0-9a-f]{2} )+\s*(\S.*)", line)
        if m:
            rows.append((int(m.group(1), 16) - start, m.group(2)))
    return rows


def report(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    summary = json.loads((folder / "kernel.json").read_text())
    start, size = summary["start"], summary["code_bytes"]
    ips = [int(x, 16) for x in (folder / "ips.txt").read_text().split()]
    if not ips:
        print("no samples in ips.txt")
        return 1
    at = collections.Counter(ip - start for ip in ips if 0 <= ip - start < size)
    inside = sum(at.values())
    print(f"{summary['kind']}: {len(ips)} samples, {100 * inside / len(ips):.1f}% in the fused kernel "
          f"(the rest: packing, allocation, the interpreter)")
    others = sorted((address, name) for name, address in summary["kernel_starts"].items() if name != FUSED_KERNEL)
    elsewhere = collections.Counter()
    for ip in ips:
        if not 0 <= ip - start < size:
            below = [name for address, name in others if 0 <= ip - address < size]
            elsewhere[below[-1] if below else "outside the kernels"] += 1
    print("samples outside the fused kernel: " + ", ".join(f"{name} {100 * n / len(ips):.1f}%"
                                                            for name, n in elsewhere.most_common(6)))
    regions = collections.Counter()
    for offset, n in at.items():
        regions[offset // REGION_BYTES] += n
    print(f"\nregions of {REGION_BYTES} bytes, share of the kernel's samples:")
    total = 0
    for region, n in regions.most_common(args.regions):
        total += n
        print(f"  {region * REGION_BYTES:#8x}  {100 * n / inside:5.1f}%  (cumulative {100 * total / inside:5.1f}%)")
    rows = disassembly(folder, start)
    if not rows:
        print("\n(objdump not found: no instructions shown)")
        return 0
    offsets = [offset for offset, _ in rows]
    print("\nhottest instructions (a sample lands on the instruction after the one that waited):")
    shown: list[int] = []
    for offset, n in at.most_common(args.hot):
        i = bisect.bisect_right(offsets, offset) - 1  # the instruction holding the sampled address
        if i < 0 or any(abs(i - j) <= args.context for j in shown):
            continue
        shown.append(i)
        print(f"\n  at {offset:#x}: {100 * n / inside:.1f}%")
        for o, text in rows[max(0, i - args.context):i + 3]:
            share = 100 * at.get(o, 0) / inside
            print(f"    {share:5.1f}  {o:#8x}  {text[:90]}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernel_profile", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="encode one kind in a loop; save the kernel's code")
    r.add_argument("--kind", default="code", help="a kind of bench.realtext (code, prose, json, ids, de, zh, ...)")
    r.add_argument("--seconds", type=float, default=8.0)
    r.add_argument("--rounds", type=int, default=6, help="distinct texts (each fresh on its first call)")
    r.add_argument("--mb", type=float, default=1.0, help="MB per text")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--control", help="perf's --control fifo: sampling is enabled only during the calls")
    r.add_argument("--out", default="kernel_profile", help="folder for the kernel's code and the summary")
    r.set_defaults(run=record)
    q = sub.add_parser("report", help="samples (ips.txt from perf script -F ip) onto the saved code")
    q.add_argument("folder")
    q.add_argument("--regions", type=int, default=12)
    q.add_argument("--hot", type=int, default=40, help="hottest addresses looked at")
    q.add_argument("--context", type=int, default=12, help="instructions shown before each hot one")
    q.set_defaults(run=report)
    args = p.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
