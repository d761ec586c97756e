"""Short calls read where CPython keeps them (native.cpython.read_text_pairs, assembly.encode_pairs_fused):
each text's UTF-8 and flag, what is declined (then packed), and the same ids as the packed path and the
reference on text that crosses segment boundaries."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kimi_tok
from kimi_tok.engine import Policy
from kimi_tok.native.cpython import LAYOUT, LONE_SURROGATE, NOT_PAIRS, PAIRS_READ, TOO_LONG, read_text_pairs
from tests.parity import assert_parity

NO_LIMIT = 1 << 62


class Text(str):
    """A str subclass whose own methods would give other bytes: packed (as its characters), never read in place."""

    def encode(self, *args, **kwargs):
        return b"not these bytes"

    def __len__(self):
        return 0


class Pair(tuple):
    """A tuple subclass: not read in place."""


@pytest.fixture(scope="module")
def tok() -> kimi_tok.Tokenizer:
    return kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)


@pytest.fixture(scope="module")
def packed_tok() -> kimi_tok.Tokenizer:
    """Every call packed: the in-place path switched off by the policy."""
    return kimi_tok.kimi_k3(policy=Policy.from_env(n_jobs=1, segment_cache_bytes=0, max_joined_call_chars=0))


def read(segments, max_chars: int = NO_LIMIT, max_bytes: int = NO_LIMIT):
    """``(texts' UTF-8 as read, flags, status)`` of a list or tuple of pairs."""
    pairs = tuple(segments)
    buf, seg_start, seg_end, allow, status = read_text_pairs(id(pairs), len(pairs), LAYOUT, max_chars, max_bytes)
    return [bytes(buf[s:e]) for s, e in zip(seg_start, seg_end)], list(allow), status


def test_this_python_lays_out_tuples_and_strs_as_probed():
    assert LAYOUT is not None


def test_each_text_is_read_as_its_utf8_with_its_flag():
    segments = [("<|open|>", True), ("", False), ("héllo 🙂", False), ("数字", True), ("\xe9\xff", False),
                ("\u0436" * 40 + "x" * 100, False), ("\U0001f600" * 3, True), ("a", False)]
    for given in (segments, tuple(segments)):
        texts, flags, status = read(given)
        assert status == PAIRS_READ
        assert texts == [text.encode() for text, _ in segments]
        assert flags == [flag for _, flag in segments]


@pytest.mark.parametrize("first, last", [(0x80, 0x100), (0x100, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000)])
def test_every_code_point_is_read_as_its_utf8(first, last):
    text = "".join(map(chr, range(first, last)))
    segments = [(text, False), ("x" + text[: len(text) // 3], True), (text[::-7], False)]
    texts, _, status = read(segments)
    assert status == PAIRS_READ
    assert texts == [t.encode() for t, _ in segments]


@pytest.mark.parametrize("segments, status", [
    ([["text", False]], NOT_PAIRS),
    ([("text", False, 1)], NOT_PAIRS),
    ([("text",)], NOT_PAIRS),
    ([("text", 1)], NOT_PAIRS),
    ([("text", None)], NOT_PAIRS),
    ([("text", np.True_)], NOT_PAIRS),
    ([(Text("text"), False)], NOT_PAIRS),
    ([Pair(("text", False))], NOT_PAIRS),
    ([("a", False), (5, False)], NOT_PAIRS),
    ([(b"text", False)], NOT_PAIRS),
    ([("a", False), "ab"], NOT_PAIRS),
    ([("a \ud800 b", False)], LONE_SURROGATE),
    ([("ok", True), ("\U0001f600\udfff", False)], LONE_SURROGATE),
    ([("x" * 11, False)], TOO_LONG),
    ([("x" * 6, False), ("y" * 5, True)], TOO_LONG),
    ([("x" * 11, False), (5, False)], TOO_LONG),  # declined at the limit, before the rest is read
])
def test_what_is_not_read(tok, segments, status):
    """Other types, str and tuple subclasses, lone surrogates and calls over ``max_chars`` are declined: packed."""
    assert read(segments, max_chars=10)[2] == status
    engine = tok._compiled()[0]
    assert engine.encode_short(segments, True, True, 10) is None


def test_what_is_not_a_list_or_tuple_is_not_read(tok):
    engine = tok._compiled()[0]
    assert engine.encode_short([], True, True, 10) is None
    assert engine.encode_short(iter([("a", False)]), True, True, 10) is None
    assert engine.encode_short(type("Segments", (list,), {})([("a", False)]), True, True, 10) is None


def test_a_call_at_the_limits_is_read():
    texts, flags, status = read([("x" * 6, False), ("é" * 4, True)], max_chars=10, max_bytes=15)
    assert (texts, flags, status) == ([b"x" * 6, "é".encode() * 4], [False, True], PAIRS_READ)
    assert read([("x" * 6, False), ("é" * 4, True)], max_chars=10, max_bytes=14)[2] == TOO_LONG


def test_a_long_call_is_declined_without_making_a_piece_cache(ref):
    """With no piece cache free, a new one (~6 ms) is made only for a call that is not too long."""
    stages = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)._compiled()[0].stages
    while stages.piece_caches.take(make=False)[0] is not None:
        pass
    made = []
    make = stages.piece_caches._make
    stages.piece_caches._make = lambda: made.append(1) or make()
    assert stages.encode_pairs((("x" * 11, False),), 10, NO_LIMIT, True) is None
    assert made == []
    ids = stages.encode_pairs((("x" * 10, False),), 10, NO_LIMIT, True)
    assert list(ids) == ref.encode_segments([("x" * 10, False)])
    assert made == [1]


def test_a_cache_keeps_the_compiled_call_of_its_short_calls(ref):
    """The first short call on a piece cache goes through numba's dispatcher; the cache is given back with its
    bundle and the compiled entry point for it, which later calls on that cache run (the same ids); a cache that
    grows drops both (test_piece_cache: test_a_short_call_keeps_its_caches_bundle_until_the_cache_grows)."""
    from kimi_tok.pipeline.assembly import encode_pairs_bundled

    stages = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)._compiled()[0].stages
    pool = stages.piece_caches
    while pool.take(make=False)[0] is not None:
        pass
    segments = [("<|open|>", True), ("héllo wörld 数字 🙂", False)]
    want = ref.encode_segments(segments)
    assert list(stages.encode_pairs(tuple(segments), NO_LIMIT, NO_LIMIT, True)) == want
    (cache, (bundle, encode)), = pool._free
    assert encode is not encode_pairs_bundled and encode.__name__ == "encode_pairs_bundled"
    for _ in range(3):
        assert list(stages.encode_pairs(tuple(segments), NO_LIMIT, NO_LIMIT, True)) == want
        (kept, short_call), = pool._free
        assert kept is cache and short_call == (bundle, encode)


def test_without_the_probed_layout_short_calls_are_packed_alike(monkeypatch, ref):
    """Where the import-time probe failed (``LAYOUT`` None: another implementation or object layout), short calls
    decline the in-place path and long strs of wide characters take ``str.encode``: the same ids."""
    from kimi_tok.native import cpython
    from kimi_tok.pipeline import assembly

    monkeypatch.setattr(cpython, "LAYOUT", None)
    monkeypatch.setattr(assembly, "LAYOUT", None)
    assert cpython.str_characters("\u0436" * 20) is None
    tok = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    segments = [("<|open|>", True), ("héllo wörld 数字 🙂", False), ("\u0436x" * 20_000, False)]
    assert tok._compiled()[0].encode_short(segments, True, True, 1 << 16) is None
    assert_parity(tok, ref, segments)


def test_a_str_subclass_is_packed_as_its_characters(tok, ref):
    assert tok.encode_segments([(Text("héllo wörld"), False)]).ids == ref.encode_segments([("héllo wörld", False)])


def test_short_calls_take_the_in_place_path(tok):
    engine = tok._compiled()[0]
    results = []
    encode_pairs = engine.stages.encode_pairs
    engine.stages.encode_pairs = lambda *args: results.append(encode_pairs(*args)) or results[-1]
    try:
        tok.encode_segments([("<|open|>", True), ("hello", False)])
        tok.encode_segments([["hello", False]])  # declined, then packed
    finally:
        del engine.stages.encode_pairs
    assert [ids is not None for ids in results] == [True, False]


@pytest.mark.parametrize("cache_bytes", [0, None])
def test_a_short_call_goes_from_the_facade_to_its_compiled_call(cache_bytes, ref):
    """``encode_segments`` hands a short call with plain bool flags straight to ``Engine.short_call_ids`` with the
    limits its path would use (with the segment cache on: below ``min_cached_call_chars``); other flag types,
    offsets and longer calls take the full path. The ids are the reference's either way."""
    kwargs = {} if cache_bytes is None else {"segment_cache_bytes": cache_bytes}
    tok = kimi_tok.kimi_k3(n_jobs=1, **kwargs)
    engine, reuse = tok._compiled()
    limits = (engine if reuse is None else reuse).short_call_limits()
    assert limits[0] == (tok.policy.max_joined_call_chars if reuse is None else
                         min(tok.policy.max_joined_call_chars, tok.policy.min_cached_call_chars - 1))
    taken, run = [], tok._run
    short_call_ids = engine.short_call_ids
    engine.short_call_ids = lambda *args: taken.append(("short", args[2:])) or short_call_ids(*args)
    tok._run = lambda *args, **kw: taken.append(("run",)) or run(*args, **kw)
    try:
        segments = [("<|open|>", True), ("héllo wörld 数字", False)]
        want = ref.encode_segments(segments)
        assert tok.encode_segments(segments).ids == want
        assert tok.encode_segments(tuple(segments), tiktoken_safe=False).ids == want
        assert taken == [("short", limits)] * 2
        taken.clear()
        assert tok.encode_segments(segments, tiktoken_safe=np.True_).ids == want
        assert tok.encode_segments(segments, add_special_tokens=np.False_).ids == want
        assert tok.encode_segments(segments, return_offsets=True).ids == want
        assert [step[0] for step in taken] == ["run", "short", "run", "short", "run", "short"]
        taken.clear()
        long_segments = [("x" * (limits[0] // 2 + 1), False)] * 2  # over the limit: declined, then the full path
        assert tok.encode_segments(long_segments).ids == ref.encode_segments(long_segments)
        assert taken[0] == ("short", limits) and ("run",) in taken
        with pytest.raises(TypeError, match="tiktoken_safe"):
            tok.encode_segments(segments, tiktoken_safe=1)
    finally:
        del engine.short_call_ids
        del tok._run


def _boundary_text(rng: random.Random) -> str:
    """Pieces that a segment boundary cuts: specials, spaces, newlines, contractions, digits, CJK, emoji."""
    parts = ["<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", " ", "  ", "\n", "\r\n", "\n\n", "'s", "'ll",
             "12345", "3.14", "数字", "テスト", "한국어", "🙂", "\u00a0", "\t", "hello", " world", "Über", "x" * 40,
             "!!", "...", "<|", "|>", ""]
    return "".join(rng.choice(parts) for _ in range(rng.randrange(0, 12)))


@pytest.mark.parametrize("tiktoken_safe", [True, False])
def test_calls_read_in_place_give_the_packed_and_reference_ids(tok, packed_tok, ref, tiktoken_safe):
    rng = random.Random(20261203)
    for _ in range(300):
        segments = [(_boundary_text(rng), rng.random() < 0.4) for _ in range(rng.randrange(1, 9))]
        ids = assert_parity(tok, ref, segments, tiktoken_safe=tiktoken_safe)
        assert packed_tok.encode_segments(segments, tiktoken_safe=tiktoken_safe).ids == ids


def test_calls_read_in_place_count_and_encode_alike(tok, ref):
    segments = [("<|open|>", True), ("", False), ("hello\n\n  world", False), ("<|sep|>", False)]
    ids = assert_parity(tok, ref, segments)
    assert tok.count_tokens(segments) == len(ids)
    assert tok.encode_to_numpy(segments).dtype == np.uint32


def test_a_long_run_of_spaces_cut_by_the_25k_rule_is_read_alike(tok, ref):
    """tiktoken-safe cuts inside a segment read in place (a run of 30,000 spaces) and right at its end."""
    assert_parity(tok, ref, [(" " * 30_000, False), ("x", False), ("a" + " " * 25_001, False)])


@pytest.mark.parametrize("cache_bytes", [0, 1 << 28])
def test_calls_up_to_the_two_core_limits_are_read_in_place_with_the_reference_ids(ref, cache_bytes):
    """The two-core defaults (``policy.short_call_chars_for(2)``, ``short_call_bytes_for(2)``) with two jobs: calls
    of fewer than 131,072 characters and under 192 KB of UTF-8 are read in place, 25k cuts and long runs inside
    them included; longer ones, or one byte more, are packed and fanned out. The ids are the reference's either way."""
    from kimi_tok.engine.policy import short_call_bytes_for, short_call_chars_for
    from kimi_tok.samples import sample_prompt

    max_chars, max_bytes = short_call_chars_for(2), short_call_bytes_for(2)
    tok = kimi_tok.kimi_k3(policy=Policy.from_env(
        n_jobs=2, segment_cache_bytes=cache_bytes, min_cached_call_chars=max_chars, max_joined_call_chars=max_chars,
        max_joined_call_bytes=max_bytes))
    engine = tok._compiled()[0]
    read_in_place = []
    short_call_ids = engine.short_call_ids

    def spy(*args):
        ids = short_call_ids(*args)
        read_in_place.append(ids is not None)
        return ids

    engine.short_call_ids = spy
    prompt = sample_prompt(100_000, seed=7)
    han = "数字テスト" * (max_bytes // 15)  # 3 bytes a character: just under the byte limit
    calls = [
        ([("a" * 50_001 + " " * 25_001 + "b" * 40_000, False), ("<|close|>", True)], True),
        (prompt, sum(len(t) for t, _ in prompt) <= max_chars and sum(len(t.encode()) for t, _ in prompt) < max_bytes),
        ([(han[:-1], False), ("", True)], True),
        ([(han + "数", False)], False),  # max_bytes bytes: one byte too many
        # one character under the limit (with a cache, a call of the limit's length goes through it), one over
        ([("x" * (max_chars - 10), False), ("<|sep|>", True), (" 1", False)], True),
        ([("x" * (max_chars - 8), False), ("<|sep|>", True), (" 1", False)], False),
    ]
    try:
        for segments, in_place in calls:
            read_in_place.clear()
            assert_parity(tok, ref, segments)
            assert read_in_place[:1] == [in_place], [(len(t), len(t.encode())) for t, _ in segments]
    finally:
        del engine.short_call_ids


def test_policy_checks_max_joined_call_chars():
    with pytest.raises(ValueError, match="max_joined_call_chars"):
        Policy.from_env(max_joined_call_chars=-1)


@pytest.mark.parametrize("cache_bytes", [0, None])
def test_few_characters_with_too_much_utf8_to_run_fused_fan_out_alike(ref, cache_bytes):
    """60,000 characters but 210 KB of UTF-8 on two jobs: more than a call read in place may have
    (``Engine.max_short_call_bytes``), so declined by the in-place reader, then packed and fanned out (with and
    without the segment cache)."""
    kwargs = {} if cache_bytes is None else {"segment_cache_bytes": cache_bytes}
    tok = kimi_tok.kimi_k3(n_jobs=2, **kwargs)
    engine = tok._compiled()[0]
    segments = [("🙂数" * 30_000, False), ("<|open|>", True)]
    n_bytes = sum(len(text.encode()) for text, _ in segments)
    assert n_bytes >= engine.max_short_call_bytes() and not engine.runs_fused(n_bytes)
    results = []
    encode_pairs = engine.stages.encode_pairs
    engine.stages.encode_pairs = lambda *args: results.append(encode_pairs(*args)) or results[-1]
    try:
        assert_parity(tok, ref, segments)
    finally:
        del engine.stages.encode_pairs
    assert results == [None]
