"""Two versions of the BPE loop (``kimi_tok/pipeline/bpe/encode.py``) on the same tables, in one process.

    python -m bench.bpe_ab HEAD~1                 # that commit's encode.py against the working tree's
    python -m bench.bpe_ab 9fbe311 --kinds ids,json --rounds 31
    python -m bench.bpe_ab HEAD --file merge --fresh --kinds de,zh,code   # merge.py, every piece fresh
    python -m bench.bpe_ab /tmp/encode_variant.py --prompts 28000      # a variant file, 10k-token prompts, cold

Whole calls compared across processes or across the two cores of the dev machine moved by a third between
runs, and two builds of the package in one process do not compare (docs/performance.md). Here only the
BPE kernel differs: each version's ``encode.py`` is loaded as a module of its own (its relative imports
made absolute, so it compiles against this tree's tables, merge and piece cache), the pieces of a few
fresh texts per kind are scanned once, and the two versions encode them turn about, each into its own
piece cache (the second round on, every piece is cached), ids checked equal. Prints per kind the median
ms/MB of each and the median of the paired ratios (the noise between two copies of one version read
0.98-1.05). Versions whose ``encode_runs`` signature differs, or which need tables this tree lacks, do
not compare this way.

``--file merge`` compares two versions of ``merge.py`` instead (the merging of pieces that are not tokens),
each under the working tree's ``encode.py``; ``--fresh`` empties each piece cache before every text, so
every piece is looked up and merged as in a text's first call (the time that keeps German and Chinese
behind: docs/design-notes.md, "Faster merging of fresh pieces").

``--prompts CHARS`` times the serving path's BPE instead: a fresh real prompt of about ``CHARS`` characters
each round (``bench.realtext.real_prompt``, its texts joined), 64 MB written before each call so that the
tables are cold as after other work, each version with a piece cache kept across rounds; the prompt's first
call and the same prompt again (cold) are timed. A change can win there and lose on warm text, or the other
way round (docs/performance.md, "A 10k-token call's fresh pieces").

``base`` may also be the path of a variant of the file, kept outside the tree: an edit to a kernel module in
the tree makes every kernel of the package compile again (the kernel cache is dropped whole).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ENCODE_PATH = "kimi_tok/pipeline/bpe/encode.py"
FILES = {"encode": ENCODE_PATH, "merge": "kimi_tok/pipeline/bpe/merge.py"}


def absolute_imports(source: str, merge_module: str | None = None) -> str:
    """A ``pipeline/bpe`` module's relative imports written against the installed package (``merge_module``:
    the name of the module that ``from .merge import`` reads instead)."""
    source = (source.replace("from ...native", "from kimi_tok.native")
              .replace("from .", "from kimi_tok.pipeline.bpe."))
    if merge_module is not None:
        source = source.replace("from kimi_tok.pipeline.bpe.merge import", f"from {merge_module} import")
    return source


def load_version(source: str, name: str, folder: Path, merge_module: str | None = None):
    path = folder / f"{name}.py"
    path.write_text(absolute_imports(source, merge_module))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # an encode.py loaded after it imports it by this name
    spec.loader.exec_module(module)
    return module


def load_versions(base_source: str, folder: Path, file: str) -> dict:
    """``{"base": module, "tree": module}``, each with an ``encode_runs``: the two versions of ``file``."""
    tree_source = (ROOT / FILES[file]).read_text()
    if file == "encode":
        return {"base": load_version(base_source, "bpe_ab_base", folder),
                "tree": load_version(tree_source, "bpe_ab_tree", folder)}
    encode_source = (ROOT / ENCODE_PATH).read_text()
    versions = {}
    for name, source in (("base", base_source), ("tree", tree_source)):
        load_version(source, f"bpe_ab_{name}_merge", folder)
        versions[name] = load_version(encode_source, f"bpe_ab_{name}", folder, merge_module=f"bpe_ab_{name}_merge")
    return versions


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("base", help="a git revision whose file (--file) is compared with the working tree's, or the "
                                "path of a variant of that file")
    p.add_argument("--file", choices=sorted(FILES), default="encode", help="which file of pipeline/bpe differs")
    p.add_argument("--fresh", action="store_true", help="empty the piece caches before every text")
    p.add_argument("--kinds", default="ids,json,code,prose,de", help="kinds of bench.realtext")
    p.add_argument("--texts", type=int, default=4, help="fresh texts of up to 1 MB per kind")
    p.add_argument("--rounds", type=int, default=21, help="rounds per kind, the versions in turn (the first not timed)")
    p.add_argument("--prompts", type=int, metavar="CHARS",
                   help="time fresh real prompts of this many characters with cold caches instead of kinds")
    p.add_argument("--seed", type=int, default=5, help="the prompts' seed (--prompts)")
    args = p.parse_args(argv)
    if args.prompts is not None and args.prompts < 1:
        p.error("--prompts must be a positive number of characters")

    if Path(args.base).is_file():  # a variant kept outside the tree
        base_source = Path(args.base).read_text()
    else:
        base_source = subprocess.run(["git", "show", f"{args.base}:{FILES[args.file]}"], cwd=ROOT,
                                     capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="kimi_tok_bpe_ab_") as folder:  # the modules and their kernels
        versions = load_versions(base_source, Path(folder), args.file)
        (compare_prompts if args.prompts is not None else compare)(versions, args)
    return 0


WARM_UP_ROUNDS = 4  # --prompts rounds not timed


def compare_prompts(versions: dict, args: argparse.Namespace) -> None:
    """``--prompts``: each round a fresh real prompt, both versions in turn, each call after 64 MB written; the
    prompt's first call and the same prompt again, median microseconds and the paired ratio of first calls."""
    import kimi_tok
    from bench import settled
    from bench.bench import COLD_MB, ColdCaches
    from bench.realtext import Drawer, Pool, real_prompt
    from kimi_tok.pipeline.pretokenize.kimi_scanner import scan_runs

    tok, = settled(kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0))
    stages = tok.engine.stages
    caches = {name: stages.piece_caches.take()[0] for name in versions}
    drawer = Drawer(Pool.load(quiet=True), args.seed)
    cold = ColdCaches(COLD_MB)
    first: dict[str, list[float]] = {name: [] for name in versions}
    again: dict[str, list[float]] = {name: [] for name in versions}
    print(f"base {args.base}'s {args.file}.py against the working tree's; us of BPE alone on fresh prompts of "
          f"~{args.prompts:,} characters, {COLD_MB} MB written before each call")
    for r in range(WARM_UP_ROUNDS + args.rounds):
        text = "".join(t for t, _ in real_prompt(drawer, args.prompts))
        buf = np.frombuffer(text.encode("utf-8", "surrogatepass"), np.uint8)
        runs = (np.zeros(1, np.int64), np.array([len(buf)], np.int64), np.full(1, -1, np.int64))
        first_piece, piece_end = scan_runs(buf, *runs, stages.pretokenizer.scan_table)
        ids = {}
        for name in (("base", "tree") if r % 2 else ("tree", "base")):
            for timings in (first[name], again[name]):
                out = np.empty(len(buf) + 1, np.uint32)
                run_out_end = np.empty(1, np.int64)
                cold()
                t0 = time.perf_counter()
                n = versions[name].encode_runs(stages.tables, buf, *runs, first_piece, piece_end, out, run_out_end,
                                               caches[name])
                if r >= WARM_UP_ROUNDS:
                    timings.append(time.perf_counter() - t0)
                if name in ids and not np.array_equal(ids[name], out[:n]):
                    raise SystemExit(f"round {r}: {name} gave other ids for the same prompt again")
                ids[name] = out[:n]
        if not np.array_equal(ids["base"], ids["tree"]):
            raise SystemExit(f"round {r}: the two versions' ids differ")
    ratio = statistics.median(b / t for b, t in zip(first["base"], first["tree"]))
    us = {name: (statistics.median(first[name]) * 1e6, statistics.median(again[name]) * 1e6) for name in versions}
    print(f"first call: base {us['base'][0]:7.1f}  tree {us['tree'][0]:7.1f} us  base/tree paired {ratio:.3f}; "
          f"the same prompt again: base {us['base'][1]:7.1f}  tree {us['tree'][1]:7.1f} us", flush=True)


def compare(versions: dict, args: argparse.Namespace) -> None:
    import kimi_tok
    from bench import settled
    from bench.realtext import MB, Pool
    from kimi_tok.pipeline.bpe.piece_cache import empty_piece_cache
    from kimi_tok.pipeline.pretokenize.kimi_scanner import scan_runs

    tok, = settled(kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0))
    stages = tok.engine.stages
    caches = {name: stages.piece_caches.take()[0] for name in versions}
    pool = Pool.load(quiet=True)
    state = "every piece fresh (caches emptied before each text)" if args.fresh else \
        "every piece cached after the first round"
    print(f"base {args.base}'s {args.file}.py against the working tree's; ms/MB of BPE alone, {state}")
    for kind in args.kinds.split(","):
        texts, _ = pool.texts(kind, args.texts, 1.0, seed=0)
        inputs = []
        for text in texts:
            buf = np.frombuffer(text.encode(), np.uint8)
            runs = (np.zeros(1, np.int64), np.array([len(buf)], np.int64), np.full(1, -1, np.int64))
            inputs.append((buf, runs) + scan_runs(buf, *runs, stages.pretokenizer.scan_table))
        n_bytes = sum(len(buf) for buf, *_ in inputs)
        times: dict[str, list[float]] = {name: [] for name in versions}
        for r in range(args.rounds):
            ids = {}
            for name in (("base", "tree") if r % 2 else ("tree", "base")):
                seconds, ids[name] = 0.0, []
                for buf, runs, first_piece, piece_end in inputs:
                    out = np.empty(len(buf) + 1, np.uint32)
                    run_out_end = np.empty(1, np.int64)
                    if args.fresh:
                        empty_piece_cache(stages.tables, caches[name])
                    t0 = time.perf_counter()
                    n = versions[name].encode_runs(stages.tables, buf, *runs, first_piece, piece_end, out, run_out_end,
                                                   caches[name])
                    seconds += time.perf_counter() - t0
                    ids[name].append(out[:n])
                if r > 0:
                    times[name].append(seconds * 1e3 / (n_bytes / MB))
            if not all(np.array_equal(a, b) for a, b in zip(ids["base"], ids["tree"])):
                raise SystemExit(f"{kind}: the two versions' ids differ")
        ratio = statistics.median(b / t for b, t in zip(times["base"], times["tree"]))
        print(f"{kind:>6}: base {statistics.median(times['base']):6.2f}  tree {statistics.median(times['tree']):6.2f}"
              f" ms/MB  base/tree paired {ratio:.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
