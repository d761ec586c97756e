"""Splitting long sub-strings after a newline before an ASCII letter (``split_at_safe_points``)
changes no id: forced tiny units on 4 threads give the reference's ids."""

from __future__ import annotations

import numpy as np
import pytest

import kimi_tok
from kimi_tok import Policy
from kimi_tok.pipeline.pretokenize.kimi_scanner import split_at_safe_points
from kimi_tok.samples import render_chat, sample_prompt, sample_text

from tests.conftest import k3_tokenizer
from tests.parity import assert_parity

NEWLINE_HEAVY = [
    "line one\nline two\r\nthree\n\nfour  \n five\n\tsix\n7seven\n",
    "x = 1\nif x:\n    y = 2\nelse:\n    z = 3\n" * 50,
    "}\n{\n]\nabc\n'\nd's\n\"q\"\nZ\n" * 40,
    "\u00e9t\u00e9\nAB\n\u4e2d\u6587\nab\u0301\n" * 30,
    " \n \n\n  a\n  b\n\r\nc\r\n" * 40,
]


@pytest.fixture(scope="module")
def tiny_units():
    return k3_tokenizer(Policy.from_env(n_jobs=4, segment_cache_bytes=0).replace(
        unit_bytes=16, fan_out_part_bytes=16, min_bytes_per_job=1, min_bytes_per_shared_job=1, max_joined_call_bytes=1))


@pytest.mark.parametrize("text", NEWLINE_HEAVY)
@pytest.mark.parametrize("allow_special", [False, True])
def test_newline_heavy_text_split_into_tiny_units(tiny_units, ref, text, allow_special):
    assert_parity(tiny_units, ref, [(text + "<|open|>\nabc" + text, allow_special)])


@pytest.mark.parametrize("seed", range(4))
def test_rendered_prompts_split_into_tiny_units(tiny_units, ref, seed):
    segments = sample_prompt(30_000, seed=seed) + render_chat(
        [{"role": "user", "content": sample_text(20_000, seed=seed + 50)}]
    )
    assert_parity(tiny_units, ref, segments)


def test_units_end_only_after_a_newline_before_an_ascii_letter():
    raw = ("ab\ncd\n\nEf \ngh\n1\n\u00e9\nZ" * 20).encode()
    buf = np.frombuffer(raw, dtype=np.uint8)
    starts, ends, _ = split_at_safe_points(buf, np.array([0]), np.array([len(raw)]), np.array([True]), 4)
    assert starts[0] == 0 and ends[-1] == len(raw) and np.array_equal(starts[1:], ends[:-1])
    assert len(starts) > 10
    for cut in ends[:-1]:
        assert raw[cut - 1] == ord("\n") and chr(raw[cut]).isascii() and chr(raw[cut]).isalpha()


def test_no_split_when_a_special_token_holds_a_newline():
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    tok = kimi_tok.Tokenizer(vocabulary, {**specials, "<|x|>\nab": 163840}, n_jobs=2)
    assert not tok.engine.splits_after_newline
    assert kimi_tok.kimi_k3().engine.splits_after_newline
