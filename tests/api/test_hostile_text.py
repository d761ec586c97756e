"""Text that is hostile but valid: same ids as the reference, bounded memory, no quadratic time.

Small hostile texts (lone surrogates, U+0000, noncharacters, private use, controls, tags,
bidi and format characters) are compared with the reference directly. Texts too long for
the reference to encode in a test (50 million characters without whitespace, 10 million
newlines) are compared with what the reference implies: its tiktoken-safe chunking cuts
them into identical 25,000-character sub-strings (checked on one 400,000-character piece
with the reference's own cutter), so their ids are those sub-strings' reference ids
repeated. 100,000 tiny segments are compared with the reference directly.

Peak memory is measured in a fresh interpreter per case: the peak RSS is reset just before
the call (``/proc/self/clear_refs``) and read after it (``VmHWM`` in ``/proc/self/status``);
minus the RSS before the call, that is the call's peak growth, printed (``pytest -s``) next
to the size of the ids and bounded generously. (``resource.getrusage``'s ``ru_maxrss`` is no
use here: Linux starts a child's at the parent's peak RSS when it execs, so a child of a big
pytest process shows hundreds of MB it never used.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import kimi_tok
from tests.parity import assert_parity, describe_mismatch
from tests.reference import MAX_PIECE_CHARS, MAX_RUN_CHARS, safe_substrings

REPO_ROOT = Path(__file__).resolve().parents[2]
MB = 1 << 20


@pytest.fixture(scope="module")
def big_tok() -> kimi_tok.Tokenizer:
    """kimi_k3() without the segment cache: huge texts are not kept in this process."""
    return kimi_tok.kimi_k3(segment_cache_bytes=0)

# ---------------------------------------------------------------------------------------------
# Small hostile texts: compared with the reference directly
# ---------------------------------------------------------------------------------------------

NONCHARACTERS = "".join(chr(c) for c in range(0xFDD0, 0xFDF0)) + "".join(
    chr(plane << 16 | low) for plane in range(17) for low in (0xFFFE, 0xFFFF)
)
PRIVATE_USE = "\ue000\ue001\uf8fe\uf8ff\U000f0000\U000f8000\U000ffffd\U00100000\U0010fffd"
C0_C1 = "".join(chr(c) for c in range(0x20)) + "\x7f" + "".join(chr(c) for c in range(0x80, 0xA0))
FORMAT = "\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2066\u2067\u2068\u2069\ufeff\ufff9\ufffa\ufffb"
TAGS = "".join(chr(c) for c in range(0xE0000, 0xE0080, 7)) + "\U000e01ef"

HOSTILE = {
    "lone-high": "ab\ud800cd",
    "lone-low": "\udc00 start",
    "lone-at-end": "end \udbff",
    "lone-runs": "\ud800\ud800\udfff x \udc00\udc00",
    "pair-as-two-code-points": "emoji \ud83d\ude00 and reversed \ude00\ud83d",
    "surrogate-next-to-special": "<|open|>\ud800<|sep|>\udc00[EOS]",
    "surrogate-in-digits": "12\ud8003456\udc00789",
    "nul": "\x00",
    "nuls": "\x00" * 1000,
    "nul-between-words": "hello\x00world \x00\x00 x\x00'\x00s",
    "noncharacters": NONCHARACTERS,
    "noncharacters-in-words": "a\ufffeb \uffffc\U0010ffff'd",
    "private-use": PRIVATE_USE,
    "private-use-words": "x\ue000y \U000f0000z 1\U00100000 2",
    "controls": C0_C1,
    "controls-in-text": "a\x1cb\x1d c\x1e\x1fd\x85e\x7ff\x9fg",
    "format-and-bidi": FORMAT + "abc" + FORMAT,
    "tags-and-selectors": "🏴" + TAGS + "a\ufe0f\U000e0100",
    "combining-on-nothing": "\u0301\u0301\u0301 \u0308a",
    "specials-in-hostile": "<|open|>\x00<|close|>\ufffe<|sep|>\ue000",
    "max-code-point": "\U0010ffff" * 50,
    "everything": "\ud800\x00\ufdd0\ue000\u202e\U000e0001<|open|> \r\n\u2028\x85\xa0\u3000" * 20,
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_text_matches_reference(tok, ref, name):
    """Each hostile text, special tokens allowed or not, chunked or not: the reference's ids."""
    text = HOSTILE[name]
    for allow in (False, True):
        for safe in (True, False):
            assert_parity(tok, ref, [(text, allow)], tiktoken_safe=safe)
    assert_parity(tok, ref, [(text, False), ("<|open|>", True), (text, True)])


LONG_HOSTILE = {
    # lone surrogates are non-space: runs of them are cut at 25,000 before the fix-up
    "lone-surrogate-run": "\ud800" * (MAX_RUN_CHARS + 1),
    "pair-split-by-the-cut": "a" * (MAX_RUN_CHARS - 1) + "\ud83d\ude00" + "b",
    "nul-run": "\x00" * (2 * MAX_RUN_CHARS + 3),
    "nonchar-run": "\uffff" * (MAX_RUN_CHARS + 2),
    "private-use-run": "\U000f0000" * (MAX_RUN_CHARS + 1) + " x",
    "pair-split-by-400k": "a b " * ((MAX_PIECE_CHARS - 1) // 4) + "abc\ud83d\ude00" + "z" * 10,
}


@pytest.mark.parametrize("name", list(LONG_HOSTILE))
def test_long_hostile_text_matches_reference(tok, ref, name):
    text = LONG_HOSTILE[name]
    assert_parity(tok, ref, [(text, False)])
    assert_parity(tok, ref, [(text, True)], tiktoken_safe=False)


def test_hostile_round_trip(tok):
    """Nothing lost: decode(encode(x)) == x for every hostile text without surrogates."""
    for name, text in HOSTILE.items():
        if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
            continue
        for allow in (False, True):
            assert tok.decode(tok.encode(text, allow_special=allow).ids) == text, name


# ---------------------------------------------------------------------------------------------
# Huge inputs, in a fresh interpreter each: ids, peak RSS growth, time
# ---------------------------------------------------------------------------------------------

CHILD = r"""
import gc, json, os, sys, time
import numpy as np
import kimi_tok

def rss_now():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def peak_rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

tok = kimi_tok.kimi_k3()
tok.encode_segments([("warm up <|open|>", True)])
namespace = {}
exec(sys.argv[2], namespace)
segments = namespace["build"]()
text_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t, _ in segments)
gc.collect()
try:  # reset the peak (Linux >= 4.0): loading had a peak of its own; if not, the figure is an upper bound
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
before = rss_now()
start = time.perf_counter()
ids = tok.encode_to_numpy(segments)
seconds = time.perf_counter() - start
peak = peak_rss()
np.save(sys.argv[1], ids)
print(json.dumps({"text_bytes": text_bytes, "ids": len(ids), "ids_bytes": ids.nbytes, "seconds": seconds,
                  "peak_growth": peak - before, "rss_before": before}))
"""


def run_child(tmp_path: Path, build_source: str) -> tuple[np.ndarray, dict]:
    """Encode ``build()`` (defined by ``build_source``) with kimi_k3() in a new interpreter."""
    out = tmp_path / "ids.npy"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), build_source],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    return np.load(out), stats


def check_memory(label: str, stats: dict) -> None:
    """Peak RSS growth of the call < 20x the text + 200 MB; the figures are printed."""
    growth, text_bytes = stats["peak_growth"], stats["text_bytes"]
    line = (f"{label}: {text_bytes / MB:.1f} MB of text -> {stats['ids']:,} ids ({stats['ids_bytes'] / MB:.1f} MB) "
            f"in {stats['seconds']:.2f} s; peak RSS growth {growth / MB:.1f} MB")
    print(line)
    assert growth < 20 * text_bytes + 200 * MB, line


def repeated_reference(ref, sub: str, times: int) -> np.ndarray:
    return np.tile(np.array(ref.encode(sub), dtype=np.uint32), times)


def assert_same_ids(expected: np.ndarray, got: np.ndarray, what: str) -> None:
    if got.shape != expected.shape or not np.array_equal(got, expected):
        n = min(len(got), len(expected))
        at = int(np.flatnonzero(got[:n] != expected[:n])[0]) if (got[:n] != expected[:n]).any() else n
        lo = max(0, at - 3)
        raise AssertionError(describe_mismatch(expected[lo:at + 10].tolist(), got[lo:at + 10].tolist(),
                                               f"{what}: ids differ at {at} ({len(got)} vs {len(expected)} ids)"))


def test_reference_cuts_long_uniform_text_into_equal_substrings():
    """What the comparisons below rely on: one 400,000-character piece of a uniform text is cut by
    the reference into 16 sub-strings of 25,000 characters (so N characters give N / 25,000 of them)."""
    for unit in ("a", "\n", "\r\n", "abcdefg"):
        piece = (unit * (MAX_PIECE_CHARS // len(unit) + 1))[:MAX_PIECE_CHARS]
        subs = safe_substrings(piece)  # one 400k chunk: only the run cuts
        assert [len(s) for s in subs] == [MAX_RUN_CHARS] * 16, unit
    assert len(safe_substrings("a" * 1_000_000)) == 40


def test_50_million_characters_without_whitespace(tmp_path, ref, big_tok):
    """50M 'a' (one segment): 2,000 reference sub-strings of 25,000 'a' -> their ids 2,000 times."""
    ids, stats = run_child(tmp_path, "def build():\n    return [('a' * 50_000_000, False)]")
    assert_same_ids(repeated_reference(ref, "a" * MAX_RUN_CHARS, 2_000), ids, "50M 'a'")
    check_memory("50M characters, no whitespace", stats)
    assert big_tok.decode_bytes(ids) == b"a" * 50_000_000  # nothing lost


def test_50_million_characters_period_7(big_tok, ref):
    """50M of 'abcdefg' repeated: the 25,000-character sub-strings come in 7 phases; ids per phase
    from the reference, in order (in this process: no memory figure)."""
    n = 50_000_000
    text = ("abcdefg" * (n // 7 + 1))[:n]
    got = big_tok.encode_to_numpy([(text, False)])
    by_phase: dict[int, np.ndarray] = {}
    parts = []
    for k in range(n // MAX_RUN_CHARS):
        phase = k * MAX_RUN_CHARS % 7
        if phase not in by_phase:
            by_phase[phase] = np.array(ref.encode(text[k * MAX_RUN_CHARS:(k + 1) * MAX_RUN_CHARS]), dtype=np.uint32)
        parts.append(by_phase[phase])
    assert len(by_phase) == 7
    assert_same_ids(np.concatenate(parts), got, "50M 'abcdefg'*")


def test_10_million_newlines(tmp_path, ref, big_tok):
    """10M newlines: 400 sub-strings of 25,000 newlines; and 5M CRLF (400 of 12,500 CRLF)."""
    ids, stats = run_child(tmp_path, "def build():\n    return [('\\n' * 10_000_000, False)]")
    assert_same_ids(repeated_reference(ref, "\n" * MAX_RUN_CHARS, 400), ids, "10M newlines")
    check_memory("10M newlines", stats)
    crlf = big_tok.encode_to_numpy([("\r\n" * 5_000_000, True)])
    assert_same_ids(repeated_reference(ref, "\r\n" * (MAX_RUN_CHARS // 2), 400), crlf, "5M CRLF")


TINY_SEGMENTS = r"""
import random

def build():
    rng = random.Random(2024)
    atoms = ["", " ", "a", "hi", "<|open|>", "<|sep|>", "[EOS]", "\n", "\r\n", "\x00", "\ud800", "\udc00x",
             "\ufffe", "\ue000", "中", "😀", "e\u0301", "'s", "12345", "  ", "\u3000", "<|", "|>", "\xa0"]
    return [("".join(rng.choice(atoms) for _ in range(rng.randint(0, 3))), rng.random() < 0.5)
            for _ in range(100_000)]
"""


def test_100_thousand_tiny_segments(tmp_path, ref, tok):
    """100,000 segments of 0-3 hostile atoms (empty, specials, surrogates, NUL...): the reference's ids."""
    ids, stats = run_child(tmp_path, TINY_SEGMENTS)
    namespace: dict = {}
    exec(TINY_SEGMENTS, namespace)
    segments = namespace["build"]()
    expected = np.array(ref.encode_segments(segments), dtype=np.uint32)
    assert_same_ids(expected, ids, "100k tiny segments")
    check_memory("100,000 tiny segments", stats)
    assert tok.count_tokens(segments) == len(expected)
    clean = [(t, a) for t, a in segments if not any(0xD800 <= ord(c) <= 0xDFFF for c in t)]
    assert tok.decode(tok.encode_to_numpy(clean)) == "".join(t for t, _ in clean)  # nothing lost


def test_no_quadratic_time(big_tok):
    """Random letters without whitespace (pieces of 25,000 letters for the BPE heap): 4x the text
    costs well under 8x the time (best of two runs each)."""
    rng = np.random.default_rng(7)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", dtype=np.uint8)

    def best_time(n: int) -> float:
        text = letters[rng.integers(0, len(letters), n)].tobytes().decode("ascii")
        times = []
        for _ in range(2):
            start = time.perf_counter()
            big_tok.encode_to_numpy([(text, False)])
            times.append(time.perf_counter() - start)
        return min(times)

    t5, t20 = best_time(5_000_000), best_time(20_000_000)
    print(f"no-whitespace text: 5M chars {t5:.2f} s, 20M chars {t20:.2f} s (ratio {t20 / t5:.1f})")
    assert t20 < 8 * t5 + 0.5, (t5, t20)
