"""Bad input, load and faults: never a crash, never silently wrong ids, nothing lost.

* every public entry point rejects bad arguments with a TypeError/ValueError that names the
  argument (and, for segments, the index);
* corrupt or hostile vocabulary files and configs raise a clear ValueError naming the file
  (test_load.py holds the common corruptions; these are the others);
* 8 threads sharing one Tokenizer (one thread per call, or two) give the sequential ids;
* Ctrl-C during a long multi-threaded call ends the process promptly, and a Tokenizer that
  was interrupted gives correct ids afterwards;
* a read-only install where numba can cache nothing still works (compiles every time);
* differential fuzzing against the tiktoken reference (hypothesis, time-bounded; the long
  run is ``python -m bench.stress --minutes 5``).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kimi_tok
from bench import stress
from kimi_tok.samples import sample_prompt
from tests.parity import assert_parity
from tests.reference import MAX_PIECE_CHARS, MAX_RUN_CHARS, Reference, load_pattern

REPO_ROOT = Path(__file__).resolve().parents[2]
GOOD = [("a", False), ("<|open|>", True), ("b", False)]  # the bad segment goes at index 3


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), **extra}


# =============================================================================================
# Arguments of every public entry point
# =============================================================================================

NOT_STR = [b"text", bytearray(b"text"), None, 5, 1.5, ["text"], ("text", False), np.array(["text"])]
NOT_BOOL = [1, 0, "yes", None, 1.0, np.int64(1), [True]]


def _name(value) -> str:
    return type(value).__name__ + ":" + repr(value)[:20]


@pytest.mark.parametrize("text", NOT_STR, ids=_name)
def test_encode_text_must_be_str(tok, text):
    with pytest.raises(TypeError, match="text must be a str"):
        tok.encode(text)


@pytest.mark.parametrize("flag", ["allow_special", "tiktoken_safe"])
@pytest.mark.parametrize("value", NOT_BOOL, ids=_name)
def test_encode_flags_must_be_bool(tok, flag, value):
    with pytest.raises(TypeError, match=flag):
        tok.encode("abc", **{flag: value})


def test_str_subclass_and_numpy_bool_are_accepted(tok, ref):
    """A str subclass (np.str_) is text and np.bool_ is a bool: same ids as str and bool."""
    assert tok.encode(np.str_("<|open|>x"), allow_special=np.bool_(True)).ids == ref.encode("<|open|>x", True)


def _generator():
    yield ("a", False)


BAD_CONTAINERS = ["text", b"text", None, 5, {"a": False}, {("a", False)}, _generator(), iter(GOOD),
                  np.array([["a", "b"]])]


@pytest.mark.parametrize("call", ["encode_segments", "count_tokens", "encode_to_numpy"])
@pytest.mark.parametrize("segments", BAD_CONTAINERS, ids=_name)
def test_segments_container(tok, call, segments):
    """segments must be a list or tuple; a generator or iterator is refused, not silently consumed."""
    if call == "count_tokens" and isinstance(segments, str):
        assert tok.count_tokens(segments) == len(tok.encode(segments))  # count_tokens takes one str
        return
    with pytest.raises(TypeError, match="segments"):
        getattr(tok, call)(segments)


BAD_SEGMENTS = [
    ([("a", False)], ["segment 3", "pair", "length 1"]),  # nested one level too deep
    ([("a", False), ("b", True)], ["segment 3", "text must be a str", "tuple"]),  # two pairs: text is a pair
    ((["a"], False), ["segment 3", "text must be a str", "list"]),
    ((("a", "b"), False), ["segment 3", "text must be a str", "tuple"]),
    ((b"a", False), ["segment 3", "text must be a str", "bytes"]),
    ((bytearray(b"a"), False), ["segment 3", "bytearray"]),
    ((None, True), ["segment 3", "NoneType"]),
    (("a", 1), ["segment 3", "allow_special", "int"]),
    (("a", None), ["segment 3", "allow_special", "NoneType"]),
    (("a", "False"), ["segment 3", "allow_special", "str"]),
    (("a", False, True), ["segment 3", "length 3"]),
    ("ab", ["segment 3", "pair", "str"]),  # a 2-character str is not a pair
    ({"a": False}, ["segment 3", "dict"]),
    (None, ["segment 3", "NoneType"]),
]


@pytest.mark.parametrize("call", ["encode_segments", "count_tokens", "encode_to_numpy"])
@pytest.mark.parametrize("bad, words", BAD_SEGMENTS, ids=lambda v: repr(v)[:30])
def test_bad_segment_names_its_index(call, bad, words):
    """A bad segment raises TypeError naming its index and what is wrong; nothing gets cached."""
    tok = kimi_tok.kimi_k3(policy=kimi_tok.Policy.from_env(min_cached_call_chars=0))  # short calls cached too
    cached = len(tok.segment_cache)
    long_ok = ("x" * 300, False)  # cacheable: a failed call must not store it
    with pytest.raises(TypeError) as info:
        getattr(tok, call)([long_ok, GOOD[1], GOOD[2], bad] + GOOD)
    message = str(info.value)
    for word in words:
        assert word in message, message
    assert len(tok.segment_cache) == cached


def test_bad_segment_index_in_a_long_list(tok):
    segments = [("x", False)] * 99_999 + [("x", "no")]
    with pytest.raises(TypeError, match="segment 99999: allow_special"):
        tok.encode_segments(segments)


@pytest.mark.parametrize("kwargs", [{"add_special_tokens": 1}, {"add_special_tokens": None},
                                    {"tiktoken_safe": "yes"}, {"tiktoken_safe": np.int8(1)}], ids=repr)
def test_encode_segments_flags(tok, kwargs):
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        tok.encode_segments(GOOD, **kwargs)


@pytest.mark.parametrize("call", ["count_tokens", "encode_to_numpy", "profile_segments"])
def test_tiktoken_safe_flag_of_other_calls(tok, call):
    with pytest.raises(TypeError, match="tiktoken_safe"):
        getattr(tok, call)(GOOD, tiktoken_safe=1)


@pytest.mark.parametrize("n_jobs", [0, -1, "2", 1.5, None, True])
def test_profile_segments_n_jobs(tok, n_jobs):
    if n_jobs is None:  # None: the default
        assert tok.profile_segments(GOOD, n_jobs=None)
        return
    with pytest.raises(ValueError, match="n_jobs"):
        tok.profile_segments(GOOD, n_jobs=n_jobs)


def test_failed_calls_leave_the_tokenizer_working(tok, ref):
    """After every kind of rejected call, the same Tokenizer still gives the reference's ids."""
    for bad in BAD_CONTAINERS[1:4] + [GOOD + [bad] for bad, _ in BAD_SEGMENTS]:
        with pytest.raises(TypeError):
            tok.encode_segments(bad)
    assert_parity(tok, ref, GOOD + [("x" * 300, False)])


# -- decoding ----------------------------------------------------------------------------------

BAD_IDS = [
    # (ids, exception, words the message must hold)
    ([5, -1], ValueError, ["ids[1]", "-1"]),
    ([163_840], ValueError, ["ids[0]", "163840"]),  # n_vocab
    ([1, 2**40], ValueError, ["ids[1]", str(2**40)]),
    ([1, 2**70], ValueError, ["ids[1]", str(2**70)]),  # beyond int64: an object array
    (np.array([3, 2**63 + 5], dtype=np.uint64), ValueError, ["ids[1]", str(2**63 + 5)]),  # no wrap-around
    (np.array([-1], dtype=np.int8), ValueError, ["ids[0]", "-1"]),
    ([1, 1.5], TypeError, ["ids[1]", "float"]),
    ([1.0], TypeError, ["ids[0]", "float"]),
    ([1, None], TypeError, ["ids[1]", "NoneType"]),
    ([1, "2"], TypeError, ["ids[1]", "str"]),
    ([True, False], TypeError, ["ids[0]", "bool"]),
    (np.array([1.0, 2.0]), TypeError, ["dtype float64"]),
    (np.array([1, 2], dtype=np.float32), TypeError, ["float32"]),
    (np.array([1, 2], dtype=object), TypeError, ["dtype object"]),
    (np.array([True]), TypeError, ["bool"]),
    (np.array([1], dtype="timedelta64[s]"), TypeError, ["timedelta64"]),
    (np.array([[1, 2]]), TypeError, ["1-D", "(1, 2)"]),
    ([[1, 2], [3, 4]], TypeError, ["1-D", "(2, 2)"]),
    ([[1, 2], [3]], TypeError, ["1-D", "nested"]),  # ragged
    ([[]], TypeError, ["1-D"]),
    (np.zeros((0, 3), dtype=np.int64), TypeError, ["1-D"]),
    (np.int64(5), TypeError, ["1-D"]),
    (5, TypeError, ["1-D"]),
    ((i for i in [1, 2]), TypeError, ["1-D"]),
    ({1, 2}, TypeError, ["1-D"]),
    ("12", TypeError, ["str"]),
    (b"\x01", TypeError, ["bytes"]),
    (bytearray(b"\x01"), TypeError, ["bytearray"]),
    (memoryview(b"\x01"), TypeError, ["memoryview"]),
    (None, TypeError, ["NoneType"]),
]


@pytest.mark.parametrize("call", ["decode", "decode_bytes"])
@pytest.mark.parametrize("ids, error, words", BAD_IDS, ids=lambda v: repr(v)[:40] if not isinstance(v, list) else None)
def test_decode_rejects_bad_ids(tok, call, ids, error, words):
    with pytest.raises(error) as info:
        getattr(tok, call)(ids)
    message = str(info.value)
    for word in words:
        assert word in message, message


def test_decode_accepts_every_integer_form(tok):
    """Lists, tuples, ranges, every integer dtype, mixed NumPy integer items, empty input of any kind."""
    ids = tok.encode("hello <|open|> world", allow_special=True).ids
    text = "hello <|open|> world"
    forms = [ids, tuple(ids), [np.uint64(i) for i in ids], [np.uint64(ids[0])] + [np.int64(i) for i in ids[1:]]]
    forms += [np.array(ids, dtype=dt) for dt in (np.int32, np.int64, np.uint32, np.uint64, np.intp)]
    for form in forms:
        assert tok.decode(form) == text
    assert tok.decode(range(32, 40)) == tok.decode(list(range(32, 40)))
    for empty in ([], (), np.array([]), np.zeros(0, dtype=np.uint32), range(0)):
        assert tok.decode(empty) == "" and tok.decode_bytes(empty) == b""


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (163_840, ValueError), (1.0, TypeError),
                                        ("1", TypeError), (None, TypeError)])
def test_token_bytes_rejects_bad_id(tok, bad, error):
    with pytest.raises(error):
        tok.token_bytes(bad)


@pytest.mark.parametrize("token", [None, 5, b"ab", ["a"], ("a",), 1.5])
def test_token_to_id_needs_a_str(tok, token):
    with pytest.raises(TypeError, match="token must be a str"):
        tok.token_to_id(token)


@pytest.mark.parametrize("id_", [None, "1", 1.0, [1], np.float64(1)])
def test_id_to_token_needs_an_int(tok, id_):
    with pytest.raises(TypeError, match="id must be an int"):
        tok.id_to_token(id_)


def test_lookups_of_unknowns_give_none(tok, ref):
    """Strings that are no token, and ints that are no id (negative, too big, a gap), give None."""
    for token in ("", "<|nope|>", "\U0001f600", "\x00", "Ġ" * 300):
        assert tok.token_to_id(token) is None, token
    for id_ in (-1, tok.n_vocab, 2**70, np.uint64(2**63), np.int64(-5)):
        assert tok.id_to_token(id_) is None, id_
    hello = ref.enc.encode_single_token("hello")
    assert tok.id_to_token(np.int32(hello)) == tok.id_to_token(hello) == "hello"


# -- loading -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [None, b"/tmp/tiktoken.model", 5, ["tiktoken.model"], object()], ids=_name)
def test_load_path_type(path):
    with pytest.raises(TypeError, match="path must be a str or Path"):
        kimi_tok.load(path)


def test_load_missing_paths(tmp_path):
    """Missing file, a dir without tiktoken.model, a tiktoken.model that is a dir: FileNotFoundError
    naming the path; a missing special_tokens file too."""
    for path in (tmp_path / "nope.tiktoken", str(tmp_path / "nope" / "deeper"), tmp_path):
        with pytest.raises(FileNotFoundError, match="tiktoken"):
            kimi_tok.load(path)
    (tmp_path / "tiktoken.model").mkdir()
    with pytest.raises(FileNotFoundError, match="tiktoken.model"):
        kimi_tok.load(tmp_path)
    model = tmp_path / "m.tiktoken"
    model.write_text(_model_text(BYTE_TOKENS), "ascii")
    with pytest.raises(FileNotFoundError, match="no_specials.json"):
        kimi_tok.load(model, special_tokens=tmp_path / "no_specials.json")


@pytest.mark.parametrize("kwargs, error, word", [
    ({"pattern": 5}, TypeError, "pattern"),
    ({"pattern": b"\\s+"}, TypeError, "pattern"),
    ({"special_tokens": ["<|a|>"]}, TypeError, "special_tokens"),
    ({"special_tokens": 5}, TypeError, "special_tokens"),
    ({"special_tokens": {5: 300}}, ValueError, "must be a str"),
    ({"special_tokens": {"<|a|>": True}}, ValueError, "non-negative int"),
    ({"special_tokens": {"<|a|>": 300.0}}, ValueError, "non-negative int"),
    ({"special_tokens": {"<|a|>": np.int64(300)}}, ValueError, "non-negative int"),
    ({"special_tokens": {"<|a|>": 2**24}}, ValueError, "too large"),  # dense decoder tables stay small
    ({"special_tokens": {"<|a|>": 2**32}}, ValueError, "too large"),
    ({"special_tokens": {"<|a|>": 2**70}}, ValueError, "too large"),
    ({"special_tokens": {"<|a|>": 255}}, ValueError, "collides"),
], ids=lambda v: repr(v)[:40])
def test_load_argument_errors(tmp_path, kwargs, error, word):
    model = tmp_path / "m.tiktoken"
    model.write_text(_model_text(BYTE_TOKENS), "ascii")
    with pytest.raises(error, match=word):
        kimi_tok.load(model, **kwargs)


def test_load_path_errors(tmp_path):
    with pytest.raises(TypeError, match="path must be a str or Path"):
        kimi_tok.load(123)
    with pytest.raises(FileNotFoundError):
        kimi_tok.load(tmp_path / "missing.tiktoken")
    with pytest.raises(FileNotFoundError):
        kimi_tok.load(tmp_path)  # a dir without tiktoken.model


class _HalfEncoding:
    _mergeable_ranks = {b"a": 0}  # no _special_tokens, no _pat_str


@pytest.mark.parametrize("obj", [None, "cl100k_base", {}, object(), _HalfEncoding(), tiktoken], ids=_name)
def test_from_tiktoken_needs_an_encoding(obj):
    with pytest.raises(TypeError, match="tiktoken.Encoding"):
        kimi_tok.from_tiktoken(obj)


# -- kimi_k3, n_jobs, segment_cache_bytes, KIMI_TOK_N_JOBS ----------------------------------------


@pytest.mark.parametrize("n_jobs", [0, -1, "2", 1.5, 2.0, True, False, [1], {"n": 1}, np.int64(2)], ids=_name)
def test_kimi_k3_n_jobs(n_jobs):
    """Bad n_jobs -> ValueError naming it, also for unhashable values (checked before lru_cache)
    and for values equal to a cached good one (True == 1, 2.0 == 2)."""
    kimi_tok.kimi_k3(n_jobs=1), kimi_tok.kimi_k3(n_jobs=2)  # cached first: equal keys must not hit them
    with pytest.raises(ValueError, match="n_jobs"):
        kimi_tok.kimi_k3(n_jobs=n_jobs)
    with pytest.raises(ValueError, match="n_jobs"):
        kimi_tok.kimi_k3(n_jobs)


@pytest.mark.parametrize("budget", [-1, 1.5, 0.0, "1MiB", True, False, [1], np.int64(5)], ids=_name)
def test_segment_cache_bytes(budget):
    kimi_tok.kimi_k3(segment_cache_bytes=0), kimi_tok.kimi_k3(segment_cache_bytes=1)
    with pytest.raises(ValueError, match="segment_cache_bytes"):
        kimi_tok.kimi_k3(segment_cache_bytes=budget)
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    with pytest.raises(ValueError, match="segment_cache_bytes"):
        kimi_tok.Tokenizer(vocabulary, specials, segment_cache_bytes=budget)


def test_kimi_k3_good_arguments_share_one_tokenizer():
    assert kimi_tok.kimi_k3(2) is kimi_tok.kimi_k3(n_jobs=2)
    assert kimi_tok.kimi_k3(segment_cache_bytes=None).segment_cache is None
    assert kimi_tok.kimi_k3(1, 0).n_jobs == 1
    with pytest.raises(TypeError):
        kimi_tok.kimi_k3(1, 0, 5)


@pytest.mark.parametrize("value", ["abc", "0", "-2", "2.5", " ", "1e3"])
def test_kimi_tok_n_jobs_environment(monkeypatch, value):
    """KIMI_TOK_N_JOBS that is not a positive integer: ValueError naming the variable (the first
    kimi_k3() call with the default n_jobs, and every new Tokenizer); the CLI prints one line."""
    monkeypatch.setenv("KIMI_TOK_N_JOBS", value)
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    with pytest.raises(ValueError, match="KIMI_TOK_N_JOBS"):
        kimi_tok.Tokenizer(vocabulary, specials)
    with pytest.raises(ValueError, match="KIMI_TOK_N_JOBS"):
        kimi_tok.kimi_k3(segment_cache_bytes=12_345)  # arguments never used before: not cached
    assert kimi_tok.kimi_k3(n_jobs=1).encode("hi").ids == Reference().encode("hi")  # explicit n_jobs: unaffected


def test_kimi_tok_n_jobs_environment_cli():
    proc = subprocess.run([sys.executable, "-m", "kimi_tok", "count", "-"], input="hello", capture_output=True,
                          text=True, cwd=REPO_ROOT, env=child_env(KIMI_TOK_N_JOBS="abc"), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "kimi-tok: error: KIMI_TOK_N_JOBS='abc': expected a positive integer"


# =============================================================================================
# Corrupt or hostile vocabulary files (the common corruptions are in test_load.py)
# =============================================================================================

BYTE_TOKENS = [bytes([b]) for b in range(256)]


def _model_text(tokens: list[bytes], ranks: list[int] | None = None) -> str:
    ranks = list(range(len(tokens))) if ranks is None else ranks
    return "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in zip(tokens, ranks))


GOOD_MODEL = _model_text(BYTE_TOKENS).encode()

HOSTILE_MODELS = {
    # name: (file bytes, words the ValueError must hold besides the file name)
    "only-blank-lines": (b"\n" * 10_000, ["no tokens"]),
    "only-crlf-lines": (b"\r\n" * 100, ["no tokens"]),
    "only-spaces": (b"   \n \n", ["line 1"]),
    "nul-bytes": (b"\x00" * 4096, ["line 1"]),
    "gzip-compressed": (gzip.compress(GOOD_MODEL), ["line 1"]),
    "utf-16": (GOOD_MODEL.decode().encode("utf-16"), ["line 1"]),
    "tab-separated": (GOOD_MODEL.replace(b" ", b"\t"), ["line 1", "two fields"]),
    "two-spaces": (GOOD_MODEL.replace(b" ", b"  "), ["line 1", "rank"]),
    "trailing-space": (GOOD_MODEL.replace(b"\n", b" \n"), ["line 1", "rank"]),
    "cr-only-line-ends": (GOOD_MODEL.replace(b"\n", b"\r"), ["line 1"]),
    "rank-with-30-digits": (GOOD_MODEL + b"QUI= " + b"9" * 30 + b"\n", ["line 257", "rank"]),
    "rank-2**40": (GOOD_MODEL + b"QUI= 1099511627776\n", ["line 257", "out of range"]),
    "rank-gap-at-the-end": (GOOD_MODEL.replace(b" 255\n", b" 256\n"), ["line 256", "missing"]),
    "ranks-from-1": (_model_text(BYTE_TOKENS, list(range(1, 257))).encode(), ["out of range"]),
    "token-over-64KB": (GOOD_MODEL + base64.b64encode(b"x" * 65_538) + b" 256\n", ["line 257", "long"]),
    "bad-padding": (GOOD_MODEL + b"Q=== 256\n", ["line 257", "base64"]),
    "all-padding": (GOOD_MODEL + b"==== 256\n", ["line 257", "base64"]),
    "padding-mid-token": (GOOD_MODEL + b"QQ==QQ== 256\n", ["line 257", "base64"]),
    "line-break-inside-base64": (GOOD_MODEL + b"QU\nI= 256\n", ["line 257"]),
    "single-token": (b"QQ== 0\n", ["single-byte"]),
    "duplicate-long-token": (_model_text(BYTE_TOKENS + [b"hello world", b"hello world"]).encode(),
                             ["repeats"]),
}


@pytest.mark.parametrize("name", list(HOSTILE_MODELS))
def test_hostile_model_file(tmp_path, name):
    """Each raises ValueError naming the file (or what is missing), never a crash in compiled code."""
    data, words = HOSTILE_MODELS[name]
    path = tmp_path / f"{name}.tiktoken"
    path.write_bytes(data)
    with pytest.raises(ValueError) as info:
        kimi_tok.load(path)
    message = str(info.value)
    if "single-byte" not in words and "repeats" not in words:  # those come from the tables, after parsing
        assert path.name in message, message
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("shape", ["no-separator", "huge-token", "huge-rank", "huge-whitespace"])
def test_gigantic_single_line(tmp_path, shape):
    """A 100 MB line (written in one go): ValueError naming line 1 (or 257) in well under a second or two."""
    path = tmp_path / "giant.tiktoken"
    n = 100_000_000
    with open(path, "wb") as f:
        if shape == "no-separator":
            f.write(b"A" * n)
        elif shape == "huge-token":
            f.write(b"A" * n + b" 0\n")
        elif shape == "huge-rank":
            f.write(GOOD_MODEL + b"QQ== " + b"1" * n + b"\n")
        else:
            f.write(GOOD_MODEL + b" " * n + b"\n")
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"giant\.tiktoken: line (1|257):"):
        kimi_tok.load(path)
    assert time.perf_counter() - start < 10


def test_vocabulary_with_unusual_rank_order_matches_tiktoken(tmp_path):
    """Hostile but valid: merges ranked before the single bytes, bytes in reverse order. tiktoken
    accepts it, and so must kimi_tok, with the same ids."""
    merges = [b"ab", b"abc", b"  ", b"\xe4\xb8", b"ll", b"hello"]
    tokens = merges + BYTE_TOKENS[::-1]
    path = tmp_path / "odd.tiktoken"
    path.write_text(_model_text(tokens), "ascii")
    enc = tiktoken.Encoding(name="odd", pat_str=load_pattern(), special_tokens={"<|x|>": len(tokens) + 3},
                            mergeable_ranks={t: r for r, t in enumerate(tokens)})
    loaded = kimi_tok.load(path, special_tokens={"<|x|>": len(tokens) + 3})

    class OddReference(Reference):
        def __init__(self) -> None:
            self.enc = enc

    segs = [("abcabc abc  hello   中文 \x00 <|x|>", True), ("<|x|>abab", False), ("a" * 25_001, False)]
    assert_parity(loaded, OddReference(), segs)
    assert loaded.decode(loaded.encode("hello abc").ids) == "hello abc"


def test_vocabulary_too_large_for_packed_ids_is_refused():
    """More than 2**20 mergeable tokens: a clear ValueError, never ids cut to 20 bits."""
    from itertools import islice, product

    from kimi_tok.pipeline import bpe

    n = bpe.tables.MAX_VOCABULARY_TOKENS + 1
    tokens = [bytes([b]) for b in range(256)]
    tokens += [bytes(t) for t in islice(product(range(256), repeat=3), n - len(tokens))]
    vocabulary = kimi_tok.vocab.vocabulary_from_ranks({t: r for r, t in enumerate(tokens)})
    with pytest.raises(ValueError, match="1,048,577 tokens"):
        kimi_tok.Tokenizer(vocabulary, {}, segment_cache_bytes=0)


def _model_dir(tmp_path: Path, config: bytes) -> Path:
    (tmp_path / "tiktoken.model").write_bytes(GOOD_MODEL)
    (tmp_path / "tokenizer_config.json").write_bytes(config)
    return tmp_path


def _config(entries: dict[str, str]) -> bytes:
    return json.dumps({"added_tokens_decoder": {k: {"content": v, "special": True} for k, v in entries.items()}},
                      ensure_ascii=False).encode()


HOSTILE_CONFIGS = {
    "collides-with-a-rank": (_config({"100": "<|a|>"}), "collides"),
    "same-content-twice": (_config({"300": "<|a|>", "301": "<|a|>"}), "same content"),
    "superscript-digit-key": (_config({"²": "<|a|>"}), "tokenizer_config.json"),
    "fullwidth-digit-key": (_config({"３００": "<|a|>"}), "tokenizer_config.json"),
    "negative-key": (_config({"-300": "<|a|>"}), "tokenizer_config.json"),
    "id-beyond-uint32": (_config({str(2**32 + 300): "<|a|>"}), "too large"),
    "key-with-a-space": (_config({"300": "<|a|>", "301 ": "<|b|>"}), "tokenizer_config.json"),
    "empty-content": (_config({"300": ""}), "empty"),
    "utf-8-bom": (b"\xef\xbb\xbf" + _config({"300": "<|a|>"}), "tokenizer_config.json"),
    "utf-16": (_config({"300": "<|a|>"}).decode().encode("utf-16"), "tokenizer_config.json"),
    "latin-1": (_config({"300": "<|\xe9|>"}).decode().encode("latin-1"), "not valid UTF-8"),
    "truncated": (_config({"300": "<|a|>"})[:-5], "invalid JSON"),
    "empty-file": (b"", "tokenizer_config.json"),
}


@pytest.mark.parametrize("name", list(HOSTILE_CONFIGS))
def test_hostile_tokenizer_config(tmp_path, name):
    config, word = HOSTILE_CONFIGS[name]
    with pytest.raises(ValueError, match=word):
        kimi_tok.load(_model_dir(tmp_path, config))


# =============================================================================================
# Threads and interrupts
# =============================================================================================


def _thread_prompts() -> tuple[list[list[tuple[str, bool]]], list[int]]:
    """46 prompts, and the indices of those compared with the reference (one long, one short, the hostile)."""
    rng = random.Random(11)
    sizes = [0, 10, 1_000, 20_000, 100_000, 300_000, 700_000, 1_200_000] * 4
    rng.shuffle(sizes)
    prompts = [sample_prompt(n, seed=500 + k) for k, n in enumerate(sizes)]
    checked = [sizes.index(700_000), sizes.index(1_000)]
    specials = sorted(kimi_tok.kimi_k3().special_tokens)
    for k in range(12):  # hostile ones: surrogates, long runs, 400k cuts, many tiny segments
        prompts.append(stress.random_segments(rng, specials) + [(stress.long_run_text(rng, specials), k % 2 == 0)])
    prompts.append([(stress.boundary_text(rng, specials), True)])
    prompts.append([(rng.choice(["", "x", "\ud800", "<|open|>"]), rng.random() < 0.5) for _ in range(20_000)])
    return prompts, checked + list(range(len(sizes), len(prompts)))


@pytest.fixture(scope="module")
def thread_prompts():
    prompts, checked = _thread_prompts()
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    sequential = kimi_tok.Tokenizer(vocabulary, specials, n_jobs=1, segment_cache_bytes=0)
    return prompts, [sequential.encode_to_numpy(p) for p in prompts], checked


def test_thread_prompts_sequential_ids_are_the_reference(ref, thread_prompts):
    prompts, expected, checked = thread_prompts
    for k in checked:
        assert expected[k].tolist() == ref.encode_segments(prompts[k]), f"prompt {k}"


@pytest.mark.parametrize("n_jobs, cache", [(1, 0), (2, 0), (2, 64 << 20)])
def test_8_threads_share_one_tokenizer(thread_prompts, n_jobs, cache):
    """8 threads x 2 shuffled rounds over 46 prompts (0 to 1.2M characters, hostile ones too) on
    one Tokenizer: exactly the sequential ids; with n_jobs=2 long calls also fan out."""
    prompts, expected, _ = thread_prompts
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    shared = kimi_tok.Tokenizer(vocabulary, specials, n_jobs=n_jobs, segment_cache_bytes=cache)
    order = list(range(len(prompts))) * 2
    random.Random(n_jobs + cache).shuffle(order)

    def work(k: int):
        if k % 5 == 0:
            return k, shared.count_tokens(prompts[k])
        return k, shared.encode_to_numpy(prompts[k])

    with ThreadPoolExecutor(max_workers=8) as pool:
        for k, got in pool.map(work, order):
            if isinstance(got, int):
                assert got == len(expected[k]), f"prompt {k}: count_tokens"
            else:
                assert np.array_equal(got, expected[k]), f"prompt {k} differs in threads (n_jobs={n_jobs})"


INTERRUPTED_CHILD = r"""
import json, os, sys, threading, time
import numpy as np
import kimi_tok
from kimi_tok.reuse.warmup import wait_for_background

tok = kimi_tok.kimi_k3(n_jobs=2, segment_cache_bytes=0, hash_routing=os.environ["TEST_MODE"] == "routed")
tok.encode_segments([("warm up " * 300_000, False)])  # > 2 x MIN_BYTES_PER_JOB: starts the pool's threads
wait_for_background()  # the warm-up thread has ended: a later count compares like with like
threads_before = threading.active_count()
rng = np.random.default_rng(1)
text = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)[rng.integers(0, 26, 40_000_000)]
text = text.tobytes().decode("ascii")  # 40M letters: several seconds on two threads
print("ready", flush=True)
start = time.perf_counter()
if sys.argv[1] == "uncaught":
    tok.encode_segments([(text, False)])
    print("finished before the interrupt", flush=True)
    sys.exit(3)
try:
    tok.encode_segments([(text, False)])
    print("finished before the interrupt", flush=True)
    sys.exit(3)
except KeyboardInterrupt:
    interrupted = time.perf_counter() - start
segments = json.loads(open(sys.argv[2], encoding="utf-8").read())
ids = tok.encode_to_numpy(segments)
np.save(sys.argv[3], ids)
print(json.dumps({"interrupted_after": interrupted, "threads_before": threads_before,
                  "threads_after": threading.active_count()}), flush=True)
"""


def _interrupt(args: list[str], mode: str) -> tuple[subprocess.Popen, str, str, float]:
    """Start the child, send SIGINT 0.3 s into its long call; returns it, its output and the exit delay."""
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_CHILD, *args], cwd=REPO_ROOT,
                            env={**child_env(), "TEST_MODE": mode,
                                 "KIMI_TOK_BACKEND": "processes" if mode == "processes" else "threads"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.strip() == "ready", line + proc.stderr.read()
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        sent = time.perf_counter()
        out, err = proc.communicate(timeout=60)
        return proc, out, err, time.perf_counter() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("backend", ["threads", "routed", "processes"])
def test_ctrl_c_during_a_parallel_call_exits_promptly(backend):
    """SIGINT during a 40M-character call on two workers: KeyboardInterrupt, and the process is gone
    within a few seconds (queued work is cancelled; running chunks finish)."""
    proc, out, err, delay = _interrupt(["uncaught"], backend)
    assert "finished" not in out, "the call ended before the interrupt: make the text longer"
    assert "KeyboardInterrupt" in err, err[-2000:]
    assert proc.returncode != 0
    assert delay < 5, f"exit took {delay:.1f} s after SIGINT"


@pytest.mark.parametrize("backend", ["threads", "routed", "processes"])
def test_tokenizer_after_a_caught_ctrl_c_is_correct(tmp_path, ref, backend):
    """Catch the KeyboardInterrupt, then encode with the same Tokenizer (parallel and not): the
    reference's ids, and no thread was added."""
    segments = sample_prompt(700_000, seed=77) + [("<|open|>x\ud800" + " " * 30_000, True)]
    out_path, in_path = tmp_path / "ids.npy", tmp_path / "segments.json"
    in_path.write_text(json.dumps(segments), "utf-8")
    proc, out, err, delay = _interrupt(["caught", str(in_path), str(out_path)], backend)
    assert proc.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["interrupted_after"] < 3
    assert report["threads_after"] == report["threads_before"], report
    assert np.load(out_path).tolist() == ref.encode_segments(segments)
    assert delay < 20


# =============================================================================================
# A read-only install: numba can cache nothing, KIMI_TOK_CACHE_DIR cannot be written
# =============================================================================================

READ_ONLY_CHILD = r"""
import json, sys
import kimi_tok
from kimi_tok.reuse.warmup import wait_for_background
assert kimi_tok.__file__.startswith(sys.argv[1]), kimi_tok.__file__
tok = kimi_tok.kimi_k3()
texts = json.loads(sys.argv[2])
print(json.dumps([tok.encode(t, allow_special=True).ids for t in texts]))
"""


@pytest.mark.slow
def test_read_only_install_without_any_numba_cache(tmp_path, ref):
    """SLOW (~20-30 s: every kernel is compiled, nothing can be cached). The package copied to a
    read-only dir whose __pycache__ cannot be created (a file is in the way; chmod alone does not stop
    root), NUMBA_CACHE_DIR, XDG_CACHE_HOME and KIMI_TOK_CACHE_DIR under a regular file: it imports,
    warns once, and encodes like the reference."""
    site = tmp_path / "site"
    package = site / "kimi_tok"
    shutil.copytree(REPO_ROOT / "kimi_tok", package, ignore=shutil.ignore_patterns("__pycache__"))
    directories = sorted((path for path in package.rglob("*") if path.is_dir()), reverse=True) + [package]
    for directory in directories:
        (directory / "__pycache__").write_bytes(b"")  # no in-tree cache dir can be made
    blocker = tmp_path / "a_file"
    blocker.write_bytes(b"")
    for path in directories + [site]:
        for child in path.iterdir():
            if not child.is_dir():
                child.chmod(child.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    env = {k: v for k, v in child_env().items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1", NUMBA_CACHE_DIR=str(blocker / "numba"),
               XDG_CACHE_HOME=str(blocker / "xdg"), KIMI_TOK_CACHE_DIR=str(blocker / "kimi_tok"))
    texts = ["hello world", "<|open|>user<|sep|>Hi! 中文 \ud800 " + "a" * 25_001, "\x00\ufffe\ue000"]
    try:
        proc = subprocess.run([sys.executable, "-c", READ_ONLY_CHILD, str(package), json.dumps(texts)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    finally:
        for path in [site, *directories]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no writable cache directory" in proc.stderr, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == [ref.encode(t, allow_special=True) for t in texts]
    assert (package / "__pycache__").is_file()  # nothing was cached in the package


# =============================================================================================
# Differential fuzzing against the reference (the long run: python -m bench.stress)
# =============================================================================================

SETTINGS = dict(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SPECIALS = sorted(kimi_tok.kimi_k3().special_tokens)
ATOMS = (stress.WORDS + stress.CONTRACTIONS + stress.DIGITS + stress.PUNCT + stress.MARKS + stress.EMOJI
         + stress.HAN + stress.SPACES + stress.NOT_SPACES + stress.NAMED_SPECIALS + stress.NEAR_SPECIALS
         + stress.NONCHARACTERS + stress.PRIVATE_USE + ["\ud800", "\udfff", "\ud83d\ude00", "\ude00\ud83d"])
atom = st.one_of(st.sampled_from(ATOMS), st.sampled_from(ATOMS), st.sampled_from(SPECIALS),
                 st.characters(), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))
short_texts = st.lists(atom, max_size=25).map("".join)
run_lengths = st.one_of(st.sampled_from([MAX_RUN_CHARS + d for d in range(-2, 3)] + [MAX_RUN_CHARS // 2, 1]),
                        st.integers(1, 2 * MAX_RUN_CHARS + 5))
runs = st.tuples(st.sampled_from(stress.RUN_UNITS), run_lengths).map(lambda p: p[0] * max(1, p[1] // len(p[0])))
long_texts = st.lists(st.one_of(short_texts, runs), min_size=1, max_size=3).map("".join)
segment_lists = st.lists(st.tuples(st.one_of(short_texts, short_texts, short_texts, long_texts), st.booleans()),
                         max_size=6)


@settings(max_examples=800, **SETTINGS)
@given(segment_lists, st.booleans())
def test_fuzz_hostile_segments(segs, safe):
    """Hostile atoms (surrogates, NUL, noncharacters, private use, every whitespace, specials and near
    misses) and long runs near 25,000: the reference's ids, chunked or not; count_tokens agrees."""
    tok = kimi_tok.kimi_k3()
    expected = assert_parity(tok, Reference(), segs, tiktoken_safe=safe)
    assert tok.count_tokens(segs, tiktoken_safe=safe) == len(expected)


@settings(max_examples=40, **SETTINGS)
@given(st.sampled_from(["x", "a b", "中", "  ", "\n", "😀", "ab'", "1"]), st.sampled_from(stress.BOUNDARY_CHARS),
       st.integers(-3, 1), st.booleans())
def test_fuzz_400k_cut(filler, tricky, shift, allow):
    """A tricky character (CRLF, surrogate pair as two code points, ZWJ emoji, special, digits)
    straddling the 400,000-character cut."""
    at = MAX_PIECE_CHARS + shift
    text = (filler * (at // len(filler) + 1))[:at] + tricky + filler * 3
    assert_parity(kimi_tok.kimi_k3(), Reference(), [(text, allow)])


def test_stress_smoke():
    """bench.stress itself: a few seconds with a fixed seed find no mismatch."""
    run = stress.Stress(out=None)
    run.run(seconds=4, seed=123, progress_every=0)
    assert run.inputs > 10 and not run.mismatches, run.mismatches


class _LyingStr(str):
    """A str subclass whose methods lie about its text."""

    def __eq__(self, other):
        return True

    __hash__ = str.__hash__

    def __len__(self):
        return 1_000

    def encode(self, *args, **kwargs):
        return b"something else"


def test_str_subclass_gets_the_ids_of_its_characters(ref):
    """Neither the segment cache (which compares texts) nor packing (which encodes them) may
    trust a subclass's own __eq__/__len__/encode: the ids are those of its characters."""
    tok = kimi_tok.kimi_k3(n_jobs=2, segment_cache_bytes=64 << 20)
    tok.segment_cache.clear()
    cached_text = "the cached text " * 100
    tok.encode_segments([(cached_text, False)])
    other = "a different text, the same length as the cached one "
    other = (other * 40)[:len(cached_text)]
    for lying in (_LyingStr(other), _LyingStr(cached_text)):
        plain = str.__str__(lying)
        assert tok.encode_segments([(lying, False)]).ids == ref.encode(plain, False)
        assert tok.encode(lying).ids == ref.encode(plain, False)
        assert tok.count_tokens([(lying, False)]) == len(ref.encode(plain, False))
