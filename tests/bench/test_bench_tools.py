"""The bench tools that are not run by CI otherwise still run (smoke tests, no timings asserted)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from kimi_tok.reuse import parking

REPO = Path(__file__).resolve().parents[2]


def test_turn_timeline_shows_both_threads_of_an_encoded_ahead_turn():
    """Its wrappers patch kimi_tok's stages for good, so it runs in a process of its own."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.turn_timeline", "--instances", "2", "--turns", "3", "--target-tokens", "150_000"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "KIMI_TOK_N_JOBS": "2"},  # encoding ahead needs two jobs, whatever the cores
    )
    assert result.returncode == 0, result.stderr
    timed = [line for line in result.stdout.splitlines() if " ms: " in line]
    assert len(timed) == 1, result.stdout
    # new text in shared parts; the cached ids copied ahead by a parked helper (Linux) or by the plan
    copied = "post<@Main" if parking.PARKING else "copy<@"
    for mark in ("pack>@Main", "parts<@Main", "verify>@", copied, "store<@Main"):
        assert mark in timed[0], (mark, timed[0])
    assert "untimed inside: last turn median" in result.stdout


def test_helpers_ab_compares_both_kinds_of_helpers():
    result = subprocess.run(
        [sys.executable, "-m", "bench.helpers_ab", "--instances", "1", "--turns", "3", "--timed-from", "1",
         "--target-tokens", "120_000"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "KIMI_TOK_N_JOBS": "2"},
    )
    assert result.returncode == 0, result.stderr
    if parking.PARKING:
        for kind in ("parked", "executor"):
            assert f"{kind} helpers: median" in result.stdout, result.stdout


# -- the benchmark on real text (bench/bench.py, bench/peers.py, bench/realtext.py) -----------------------


def _mo_file(entries: dict[str, str], charset: str, order: str) -> bytes:
    """A GNU gettext catalog: header, then (length, offset) tables of originals and translations."""
    import struct

    items = sorted({"": f"Content-Type: text/plain; charset={charset}\n", **entries}.items())
    ids = [k.encode(charset) for k, _ in items]
    strs = [v.encode(charset) for _, v in items]
    n, head = len(items), 28
    data_at = head + 16 * n
    table, blob = [], b""
    for b in ids + strs:
        table.append((len(b), data_at + len(blob)))
        blob += b + b"\0"
    magic = 0x950412DE
    out = struct.pack(order + "7I", magic, 0, n, head, head + 8 * n, 0, 0)
    out += b"".join(struct.pack(order + "2I", *pair) for pair in table)
    return out + blob


def test_read_mo_takes_the_translations_in_either_byte_order():
    from bench.realtext import read_mo

    entries = {"Open": "開く", "%d file\x00%d files": "%d 個のファイル\x00%d 個のファイル（複数）"}
    for order in "<>":
        for charset in ("utf-8", "euc-jp"):
            got = read_mo(_mo_file(entries, charset, order))
            assert sorted(got) == sorted(["開く", "%d 個のファイル", "%d 個のファイル（複数）"]), (order, charset)
    assert read_mo(b"not a catalog at all, just some bytes") == []


def test_fast_safe_substrings_equal_the_readable_spec():
    import random

    from bench.peers import safe_substrings
    from kimi_tok._educational import safe_substrings as spec

    rng = random.Random(7)
    units = (" ", "\n", "a", "\u3000", "x\x1c", " \t", "ab ", "漢字", "\u2028")
    texts = ["", "a", "a" * 25_000, "a" * 25_001, " " * 50_001, "a" * 399_999 + " " * 30_000]
    for _ in range(60):
        texts.append("".join(rng.choice(units) * rng.choice((1, 12_500, 24_999, 25_000, 25_001, 50_000,
                                                              rng.randint(1, 70_000)))
                             for _ in range(rng.randint(1, 6))))
    for text in texts:
        assert safe_substrings(text) == spec(text), [len(t) for t in spec(text)]


def test_pool_rounds_never_share_a_block_and_small_kinds_say_so():
    from bench.realtext import Pool

    blocks = [f"block {i:03d} " + "x" * 89 + "\n" for i in range(200)]  # 100 bytes each
    pool = Pool({"kinds": {"code": {"blocks": blocks, "bytes": [100] * 200, "info": {}}}})
    texts, note = pool.texts("code", rounds=4, mb_per_round=0.001, seed=3)  # 1,000 bytes each
    assert note == "" and len(texts) == 4
    seen = [set(t.splitlines()) for t in texts]
    assert all(len(s) == 10 for s in seen) and len(set().union(*seen)) == 40
    assert texts != pool.texts("code", rounds=4, mb_per_round=0.001, seed=4)[0]  # another seed, other text
    texts, note = pool.texts("code", rounds=4, mb_per_round=1.0, seed=3)
    assert "only 0.02 MB here" in note and len(set().union(*(set(t.splitlines()) for t in texts))) == 200
    drawer = pool.drawer(1)
    drawn = [drawer.take("code", 100) for _ in range(200)]
    assert len(set(drawn)) == 200 and not drawer.wrapped
    drawer.take("code", 100)
    assert drawer.wrapped == {"code"}


def test_bench_quick_runs_checks_ids_and_leaves_tracked_files_alone(tmp_path):
    """The whole bench on tiny sizes: both tables, a deliberately wrong peer caught and left out of
    "best", kimi_tok and the correct peers equal to the reference, nothing tracked written."""
    import importlib.util
    import json

    def bench_status() -> list[str]:  # what git sees under bench/ besides source files others may edit
        out = subprocess.run(["git", "status", "--porcelain", "--", "bench", "README.md"], cwd=REPO,
                             capture_output=True, text=True, timeout=60).stdout.splitlines()
        return [line for line in out if not line.endswith(".py")]

    peers = [p for p, module in (("tiktoken", "tiktoken"), ("gigatoken", "gigatoken"), ("splintr", "splintr"))
             if importlib.util.find_spec(module)]
    before = bench_status()
    result = subprocess.run(
        [sys.executable, "-m", "bench.bench", "--quick", "--kinds", "code,specials", "--kind-mb", "0.02",
         "--sizes", "1k", "--rounds", "2", "--cold-mb", "8", "--peers", ",".join(peers + ["_broken"]),
         "--results-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    if (REPO / ".git").exists():  # an exported tree (git archive) has no git to ask
        assert bench_status() == before
        ignored = subprocess.run(["git", "check-ignore", "-q", "bench/results/bench-x.json"], cwd=REPO, timeout=60)
        assert ignored.returncode == 0, "bench/results/ must be ignored by git"
    for heading in ("### Per kind, one thread", "### Serving path, real text", "### Serving path, SYNTHETIC"):
        assert heading in result.stdout
    (saved,) = tmp_path.glob("bench-*.json")
    out = json.loads(saved.read_text())
    assert {p.name for p in tmp_path.glob("*.png")} == {"per_kind.png", "serving.png"}
    rows = list(out["per_kind"]["summary"].values())
    rows += out["serving_real"]["summary"] + out["serving_synthetic"]["summary"]
    assert len(rows) == 4
    for row in rows:
        assert "_broken" in row["mismatch"] and "first difference at id" in row["mismatch"]["_broken"]
        assert set(row["mismatch"]) == {"_broken"}, row["mismatch"]  # kimi_tok and the real peers agree
        assert (row.get("best_peer") or row.get("fastest_peer")) in peers


def test_serving_rounds_make_their_prompts_and_reference_ids_before_the_timed_calls(monkeypatch, tmp_path):
    """The reference's work (~0.35 s on one core at 1M tokens) never sits between two timed calls: a size's
    prompts and reference ids are all made before its first timed call, then every encoder encodes every
    round's prompt, in rotating order, and the ids are compared with that round's reference."""
    import types

    import numpy as np

    import tests.reference as reference_module
    from bench import bench

    events = []

    class Recording:
        def encode_segments(self, segments):
            events.append(("reference", segments[0][0]))
            return [len(segments[0][0])]

    monkeypatch.setattr(reference_module, "Reference", Recording)
    monkeypatch.setattr(reference_module, "make_reference_encoding", lambda: types.SimpleNamespace(decode=str))

    def make_prompt(n_chars, seed):
        events.append(("prompt", seed))
        return [("x" * (n_chars + seed % 1000), False)]

    def encoder(name):
        def encode(segments):
            events.append((name, segments[0][0]))
            return np.array([len(segments[0][0]) if name == "a" else 0], np.uint32)
        return encode

    results = bench.run_serving({"a": encoder("a"), "b": encoder("b")}, make_prompt, [("s", 10), ("m", 20)], 1,
                                bench.ColdCaches(0), 60.0, "test", tmp_path)
    rounds = bench.rounds_for(1, 10)
    assert rounds == bench.rounds_for(1, 20) > 1
    for k, (n_chars, result) in enumerate(zip((10, 20), results)):
        texts = ["x" * (n_chars + r) for r in range(rounds)]
        size_events = events[k * 4 * rounds:(k + 1) * 4 * rounds]
        assert size_events[:2 * rounds] == ([("prompt", k * 1000 + r) for r in range(rounds)]
                                            + [("reference", text) for text in texts])
        calls = size_events[2 * rounds:]
        assert all(name in ("a", "b") for name, _ in calls)
        assert [text for _, text in calls] == [text for text in texts for _ in range(2)]
        assert [name for name, _ in calls[:4]] == ["a", "b", "b", "a"]  # the order rotates
        assert {name: len(s) for name, s in result["seconds"].items()} == {"a": rounds, "b": rounds}
        assert set(result["mismatch"]) == {"b"}  # the ids were compared with each round's reference
    assert len(events) == 8 * rounds


def test_batch_bench_compares_encode_batch_with_a_loop():
    result = subprocess.run(
        [sys.executable, "-m", "bench.batch", "--prompts", "6", "--chars", "3000", "--rounds", "2"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "KIMI_TOK_N_JOBS": "2"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    for line in ("6 prompts of 3,000 characters", "n_jobs=2", "loop of encode_segments: median",
                 "encode_batch:            median", "ratio: "):
        assert line in result.stdout, result.stdout


def test_kernel_profile_maps_samples_onto_the_fused_kernel(tmp_path):
    """``record`` without perf, then ``report`` on made-up samples: two inside the kernel's code, one outside."""
    out = tmp_path / "profile"
    result = subprocess.run(
        [sys.executable, "-m", "bench.kernel_profile", "record", "--kind", "code", "--seconds", "0.5", "--rounds", "2",
         "--mb", "0.05", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((out / "kernel.json").read_text())
    assert summary["code_bytes"] == (out / "kernel.bin").stat().st_size > 0
    assert summary["calls"] >= 2 and summary["kernel"] in summary["kernel_starts"]
    start = summary["start"]
    (out / "ips.txt").write_text(f"{start + 16:x}\n{start + 16:x}\n{start + 600:x}\n{start - 1:x}\n")
    result = subprocess.run([sys.executable, "-m", "bench.kernel_profile", "report", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "4 samples, 75.0% in the fused kernel" in result.stdout, result.stdout
    regions = re.findall(r"^\s+(0x[0-9a-f]+)\s+([\d.]+)%", result.stdout, re.M)
    assert regions == [("0x0", "66.7"), ("0x200", "33.3")], result.stdout
    if shutil.which("objdump"):
        assert "at 0x10: 66.7%" in result.stdout, result.stdout


def test_bpe_ab_compares_two_versions_of_the_bpe_loop_on_the_same_tables():
    """The tree's encode.py against HEAD's (equal in a clean clone): both load as modules of their own, compile
    against this tree's tables, give equal ids (the tool exits otherwise) and a ratio per kind."""
    from bench import bpe_ab

    source = (REPO / bpe_ab.ENCODE_PATH).read_text()
    assert "from ." in source and "from ." not in bpe_ab.absolute_imports(source)
    result = subprocess.run([sys.executable, "-m", "bench.bpe_ab", "HEAD", "--kinds", "ids", "--texts", "1",
                             "--rounds", "3"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"ids: base +[\d.]+ +tree +[\d.]+ ms/MB +base/tree paired [\d.]+", result.stdout), result.stdout


def test_bpe_ab_times_fresh_prompts_with_cold_caches_against_a_variant_file(tmp_path):
    """``--prompts``: a variant file as the base (here HEAD's encode.py copied out of the tree), fresh real prompts
    timed with 64 MB written before each call, first call and again; equal ids every round, a paired ratio."""
    from bench import bpe_ab

    variant = tmp_path / "encode_variant.py"
    variant.write_text((REPO / bpe_ab.ENCODE_PATH).read_text())
    result = subprocess.run([sys.executable, "-m", "bench.bpe_ab", str(variant), "--prompts", "3000", "--rounds",
                             "2"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"base {variant}'s encode.py" in result.stdout and "64 MB written" in result.stdout, result.stdout
    assert re.search(r"first call: base +[\d.]+ +tree +[\d.]+ us +base/tree paired [\d.]+; the same prompt again: "
                     r"base +[\d.]+ +tree +[\d.]+ us", result.stdout), result.stdout
    bad = subprocess.run([sys.executable, "-m", "bench.bpe_ab", "HEAD", "--prompts", "0"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--prompts must be a positive number" in bad.stderr, bad.stderr


def test_bpe_ab_compares_two_versions_of_merging_on_fresh_pieces():
    """``--file merge --fresh``: HEAD's merge.py and the tree's, each under the tree's encode.py (its merge import
    pointed at that version), the piece caches emptied before every text; equal ids and a ratio per kind."""
    from bench import bpe_ab

    source = (REPO / bpe_ab.ENCODE_PATH).read_text()
    rewritten = bpe_ab.absolute_imports(source, merge_module="bpe_ab_base_merge")
    assert "from bpe_ab_base_merge import" in rewritten and "kimi_tok.pipeline.bpe.merge import" not in rewritten
    result = subprocess.run([sys.executable, "-m", "bench.bpe_ab", "HEAD", "--file", "merge", "--fresh", "--kinds",
                             "de", "--texts", "1", "--rounds", "3"], cwd=REPO, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "merge.py" in result.stdout and "every piece fresh" in result.stdout, result.stdout
    assert re.search(r"de: base +[\d.]+ +tree +[\d.]+ ms/MB +base/tree paired [\d.]+", result.stdout), result.stdout
