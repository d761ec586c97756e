"""Short calls joined rather than packed (segments.join_segments, assembly.encode_joined_fused): the
layout of the joined bytes, what falls back to packing, and the same ids as the packed path and the
reference on text that crosses segment boundaries."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kimi_tok
from kimi_tok.engine import Policy
from kimi_tok.pipeline.segments import SEPARATOR, join_segments
from tests.parity import assert_parity


class Text(str):
    """A str subclass whose own methods would give other bytes: packed (as its characters), never joined."""

    def encode(self, *args, **kwargs):
        return b"not these bytes"

    def __len__(self):
        return 0


@pytest.fixture(scope="module")
def tok() -> kimi_tok.Tokenizer:
    return kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)


@pytest.fixture(scope="module")
def packed_tok() -> kimi_tok.Tokenizer:
    """Every call packed: the joined path switched off by the policy."""
    return kimi_tok.kimi_k3(policy=Policy.from_env(n_jobs=1, segment_cache_bytes=0, max_joined_call_chars=0))


def test_joined_bytes_are_the_texts_utf8_between_separators():
    segments = [("<|open|>", True), ("", False), ("héllo 🙂", False), ("数字", True)]
    joined, allow = join_segments(segments, 100)
    assert joined.split(SEPARATOR) == [text.encode() for text, _ in segments]
    assert list(allow) == [1, 0, 0, 1]
    assert join_segments(tuple(segments), 100) == (joined, allow)
    every_character = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert SEPARATOR not in every_character.encode()


@pytest.mark.parametrize("segments", [
    [],
    [["text", False]],
    [("text", False, 1)],
    [("text", 1)],
    [("text", np.True_)],
    [(Text("text"), False)],
    [("a", False), (5, False)],
    [(b"text", False)],
    [("lone \ud800 surrogate", False)],
    [("x" * 11, False)],
    [("x" * 6, False), ("y" * 5, True)],
])
def test_what_is_not_joined(segments):
    """Other types, str subclasses, lone surrogates and calls over ``max_chars`` go to packing."""
    assert join_segments(segments, 10) is None


def test_a_call_at_the_limit_is_joined():
    assert join_segments([("x" * 6, False), ("y" * 4, True)], 10) == (b"xxxxxx\xffyyyy", b"\x00\x01")


def test_a_str_subclass_is_packed_as_its_characters(tok, ref):
    assert join_segments([(Text("héllo"), False), ("!", True)], 10) is None
    assert tok.encode_segments([(Text("héllo wörld"), False)]).ids == ref.encode_segments([("héllo wörld", False)])


def test_short_calls_take_the_joined_path(tok):
    engine = tok._compiled()[0]
    calls = []
    encode_joined = engine.stages.encode_joined
    engine.stages.encode_joined = lambda *args: calls.append(args) or encode_joined(*args)
    try:
        tok.encode_segments([("<|open|>", True), ("hello", False)])
        tok.encode_segments([["hello", False]])  # packed
    finally:
        del engine.stages.encode_joined
    assert len(calls) == 1


def _boundary_text(rng: random.Random) -> str:
    """Pieces that a segment boundary cuts: specials, spaces, newlines, contractions, digits, CJK, emoji."""
    parts = ["<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>", " ", "  ", "\n", "\r\n", "\n\n", "'s", "'ll",
             "12345", "3.14", "数字", "テスト", "한국어", "🙂", "\u00a0", "\t", "hello", " world", "Über", "x" * 40,
             "!!", "...", "<|", "|>", ""]
    return "".join(rng.choice(parts) for _ in range(rng.randrange(0, 12)))


@pytest.mark.parametrize("tiktoken_safe", [True, False])
def test_joined_calls_give_the_packed_and_reference_ids(tok, packed_tok, ref, tiktoken_safe):
    rng = random.Random(20261203)
    for _ in range(300):
        segments = [(_boundary_text(rng), rng.random() < 0.4) for _ in range(rng.randrange(1, 9))]
        ids = assert_parity(tok, ref, segments, tiktoken_safe=tiktoken_safe)
        assert packed_tok.encode_segments(segments, tiktoken_safe=tiktoken_safe).ids == ids


def test_joined_calls_count_and_encode_alike(tok, ref):
    segments = [("<|open|>", True), ("", False), ("hello\n\n  world", False), ("<|sep|>", False)]
    ids = assert_parity(tok, ref, segments)
    assert tok.count_tokens(segments) == len(ids)
    assert tok.encode_to_numpy(segments).dtype == np.uint32


def test_a_long_run_of_spaces_cut_by_the_25k_rule_is_joined_alike(tok, ref):
    """tiktoken-safe cuts inside a joined segment (a run of 30,000 spaces) and right before a separator."""
    assert_parity(tok, ref, [(" " * 30_000, False), ("x", False), ("a" + " " * 25_001, False)])


def test_policy_checks_max_joined_call_chars():
    with pytest.raises(ValueError, match="max_joined_call_chars"):
        Policy.from_env(max_joined_call_chars=-1)


@pytest.mark.parametrize("cache_bytes", [0, None])
def test_few_characters_with_too_much_utf8_to_run_fused_fan_out_alike(ref, cache_bytes):
    """40,000 characters but 140 KB of UTF-8 on two jobs: too much to run fused, so packed and fanned out
    (with and without the segment cache), not joined."""
    kwargs = {} if cache_bytes is None else {"segment_cache_bytes": cache_bytes}
    tok = kimi_tok.kimi_k3(n_jobs=2, **kwargs)
    engine = tok._compiled()[0]
    segments = [("🙂数" * 20_000, False), ("<|open|>", True)]
    assert not engine.runs_fused(sum(len(text.encode()) for text, _ in segments))
    calls = []
    encode_joined = engine.stages.encode_joined
    engine.stages.encode_joined = lambda *args: calls.append(args) or encode_joined(*args)
    try:
        assert_parity(tok, ref, segments)
    finally:
        del engine.stages.encode_joined
    assert calls == []
