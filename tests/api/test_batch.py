"""``Tokenizer.encode_batch``: the ids of ``encode_segments`` item by item, whatever the threads.

Items are ``str`` (one segment with ``allow_special``) or segment lists; they spread over the
batch workers, and items long enough fan out on their own. The expected ids come from the
tiktoken reference (``ref``) and from ``encode_segments`` on a tokenizer without a cache.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kimi_tok
from kimi_tok import Policy
from kimi_tok.samples import sample_prompt, sample_text


def items_of_every_kind():
    return [
        "hello <|open|> world",
        [("<|open|>", True), ("message", False), ("<|sep|>", True), ("hi <|sep|>", False)],
        "",
        [],
        [("", True)],
        sample_prompt(40_000, seed=1),
        sample_text(3_000, seed=2),
        "a\ud83d\ude00b\ud800 lone surrogates",
        [("x" * 30_000 + "\ud83d\ude00", False), ("<|close|>", True)],
        sample_prompt(4_000, seed=3),
        (("<|end_of_msg|>", True),),
    ]


def reference_ids(ref, item, allow_special):
    return ref.encode(item, allow_special) if isinstance(item, str) else ref.encode_segments(list(item))


@pytest.mark.parametrize("allow_special", [False, True])
def test_ids_are_the_references_item_by_item(tok, ref, allow_special):
    items = items_of_every_kind()
    encodings = tok.encode_batch(items, allow_special=allow_special)
    assert len(encodings) == len(items)
    for item, enc in zip(items, encodings):
        assert enc.ids == reference_ids(ref, item, allow_special)
        assert isinstance(enc, kimi_tok.Encoding)


@pytest.mark.parametrize("settings", [
    dict(n_jobs=1),
    dict(n_jobs=2),
    dict(n_jobs=4, segment_cache_bytes=0),
    dict(n_jobs=3, hash_routing=True),
    # more items fan out (none is read in place on one thread)
    dict(n_jobs=2, min_bytes_per_shared_job=1 << 12, fan_out_part_bytes=1 << 12, max_joined_call_bytes=1),
])
def test_every_setting_gives_the_ids_of_encode_segments(settings):
    tok = kimi_tok.kimi_k3(policy=Policy.from_env(**settings))
    plain = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    items = items_of_every_kind() + [sample_prompt(20_000, seed=10 + k) for k in range(12)]
    for _ in range(2):  # the second time from the segment cache, where there is one
        for item, enc in zip(items, tok.encode_batch(items, tiktoken_safe=True)):
            expected = plain.encode(item) if isinstance(item, str) else plain.encode_segments(item)
            assert np.array_equal(enc.into_numpy()["ids"], expected.into_numpy()["ids"])


def test_without_tiktoken_safe_chunking(tok, ref):
    items = ["y" * 30_000, [(" " * 26_000 + "z", False)]]
    got = [enc.ids for enc in tok.encode_batch(items, tiktoken_safe=False)]
    assert got == [ref.encode(items[0], tiktoken_safe=False), ref.encode_segments(items[1], tiktoken_safe=False)]


def test_threads_calling_at_once(tok, ref):
    items = [sample_prompt(8_000, seed=50 + k) for k in range(6)]
    expected = [ref.encode_segments(item) for item in items]
    results, errors = [None] * 4, []

    def call(k):
        try:
            results[k] = [enc.ids for enc in tok.encode_batch(items[k:] + items[:k])]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for k in range(4):
        assert results[k] == expected[k:] + expected[:k]


@pytest.mark.parametrize("items, error, message", [  # each after a valid item: items[0]
    ("hello", TypeError, "items must be a list or tuple"),
    (None, TypeError, "items must be a list or tuple"),
    ([3], TypeError, r"items\[1\] must be a str or a list"),
    (["ok", b"bytes"], TypeError, r"items\[2\] must be a str or a list"),
    ([[("a", False), (b"b", False)]], TypeError, r"items\[1\]: segment 1: text must be a str, not bytes"),
    ([[("a", 1)]], TypeError, r"items\[1\]: segment 0: allow_special must be a bool"),
    ([[("a", False, 3)]], TypeError, r"items\[1\]: segment 0 must be a \(text, allow_special\) pair"),
    ([["a"]], TypeError, r"items\[1\]: segment 0 must be a \(text, allow_special\) pair"),
])
def test_a_bad_item_raises_naming_it_before_any_work(items, error, message):
    tok = kimi_tok.kimi_k3(policy=Policy.from_env(n_jobs=2, segment_cache_bytes=1 << 20, min_cached_call_chars=0))
    tok.segment_cache.clear()
    with pytest.raises(error, match=message):
        tok.encode_batch(items if items is None or isinstance(items, str) else [sample_text(2_000, seed=0), *items])
    assert len(tok.segment_cache) == 0  # nothing was encoded (the valid first item is not cached)
    tok.encode_batch([sample_text(2_000, seed=0)])
    assert len(tok.segment_cache) == 1  # (it is, once encoded)


def test_flags_are_checked(tok):
    with pytest.raises(TypeError, match="allow_special must be a bool"):
        tok.encode_batch(["a"], allow_special="yes")
    with pytest.raises(TypeError, match="tiktoken_safe must be a bool"):
        tok.encode_batch(["a"], tiktoken_safe=None)
    assert tok.encode_batch([]) == []
    assert tok.encode_batch(("hi",))[0].ids == tok.encode("hi").ids


def test_str_subclasses_are_their_characters(tok):
    class Shouting(str):
        def __len__(self):
            return 0

    assert tok.encode_batch([Shouting("hello")])[0].ids == tok.encode("hello").ids


def test_without_a_cache_items_are_grouped_into_engine_calls_and_cut_back():
    """More than ``GROUP_CHARS`` of text in all: several engine calls, each cut back into its items."""
    from kimi_tok.engine.batch import GROUP_CHARS

    tok = kimi_tok.kimi_k3(n_jobs=2, segment_cache_bytes=0)
    big = [sample_text(GROUP_CHARS // 3, seed=20 + k) for k in range(4)]
    items = [big[0], [], big[1], [("<|open|>", True)], big[2], [(big[3], False), ("", True)], "tail"]
    assert sum(len(t) for item in items for t in ([item] if isinstance(item, str) else [t for t, _ in item])) \
        > GROUP_CHARS
    plain = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    for item, enc in zip(items, tok.encode_batch(items)):
        expected = plain.encode(item) if isinstance(item, str) else plain.encode_segments(item)
        assert np.array_equal(enc.into_numpy()["ids"], expected.into_numpy()["ids"])


def test_with_a_cache_short_items_go_in_groups_and_long_ones_through_the_cache(ref):
    """Items under ``min_cached_call_chars`` skip the segment cache as calls do (encoded together, in
    groups over the threads); longer ones go through it; in item order, each with its own ids."""
    tok = kimi_tok.kimi_k3(policy=Policy.from_env(n_jobs=2, segment_cache_bytes=(1 << 24) + 3))
    tok.segment_cache.clear()
    limit = tok.policy.min_cached_call_chars
    items = [sample_prompt(2_000, seed=1), sample_text(limit + 500, seed=2), "<|open|> short", [],
             sample_prompt(limit // 2, seed=3), [("x" * (limit + 10), False), ("<|sep|>", True)]]
    got = tok.encode_batch(items, allow_special=True)
    for item, enc in zip(items, got):
        segments = [(item, True)] if isinstance(item, str) else item
        assert enc.ids == ref.encode_segments(segments)
    assert len(tok.segment_cache) == 3  # the long str (one segment) and the long list (two) only
