"""The interpreted engine (the exact ids in Python and PCRE2, while kernels compile) and a Tokenizer
that starts cold: its calls answered by that engine until the compiled path is made, then by it.

Every expected id comes from the tiktoken reference (tests/reference.py). The Tokenizers here start
cold without compiling anything: the test stands in for the worker processes' build (``_Build``),
so the switch happens when the test says so. The whole cold start, with an empty numba cache and real
worker processes, is tests/native/test_cold_start.py.
"""

from __future__ import annotations

import random
import sys
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_tok
from kimi_tok import KIMI_PATTERN, _educational
from kimi_tok.engine.interpreted import InterpretedEngine, safe_substrings
from kimi_tok.reuse import warmup
from kimi_tok.samples import sample_prompt
from kimi_tok.vocab import embedded_kimi_k3
from kimi_tok.vocab.files import parse_tiktoken_bpe, parse_well_formed_tiktoken_bpe
from kimi_tok.vocab.kimi_k3 import kimi_k3_model_bytes, kimi_k3_special_tokens
from tests.api.test_properties import SETTINGS, segments, with_surrogates
from tests.reference import Reference, mergeable_ranks


@pytest.fixture(scope="module")
def engine() -> InterpretedEngine:
    return InterpretedEngine(mergeable_ranks(), kimi_k3_special_tokens(), KIMI_PATTERN)


def test_python_whitespace_class_is_str_isspace():
    """safe_substrings finds runs with ``\\s``: it must be ``str.isspace`` on every code point."""
    import re

    space = re.compile(r"\s")
    differs = [cp for cp in range(sys.maxunicode + 1) if (space.match(chr(cp)) is not None) != chr(cp).isspace()]
    assert differs == []


@pytest.mark.parametrize("text", [
    "", "a", " " * 25_000, " " * 25_001, "x" * 50_001, ("ab " * 10_000) + " " * 26_000, "\ud800abc",
    "a\u3000" * 30_000, "中" * 400_001, "\n" * 25_000 + "x" + "\n" * 25_001, " " * 399_999 + "x" * 30_000,
])
def test_safe_substrings_equals_the_readable_spec(text):
    assert safe_substrings(text) == _educational.safe_substrings(text)


def test_embedded_vocabulary_parsed_with_numpy_equals_the_kernel():
    data = kimi_k3_model_bytes()
    parsed, compiled = parse_well_formed_tiktoken_bpe(data), parse_tiktoken_bpe(data, "k3")
    for field in compiled._fields:
        assert np.array_equal(getattr(parsed, field), getattr(compiled, field)), field


def test_numpy_parse_of_shuffled_lines_crlf_and_blank_lines_equals_the_kernel():
    lines = [line for line in kimi_k3_model_bytes().split(b"\n") if line]
    random.Random(3).shuffle(lines)
    lines = lines[:5000]
    renumbered = {rank: new for new, rank in enumerate(sorted(int(line.split()[1]) for line in lines))}
    data = b"\r\n\r\n".join(line.split()[0] + b" " + str(renumbered[int(line.split()[1])]).encode() for line in lines)
    parsed, compiled = parse_well_formed_tiktoken_bpe(data), parse_tiktoken_bpe(data, "shuffled")
    for field in compiled._fields:
        assert np.array_equal(getattr(parsed, field), getattr(compiled, field)), field


@pytest.mark.parametrize("data, what", [
    (b"YQ== 0\nYg== 2\n", "ranks must be exactly 0..1"),
    (b"YQ== 0\nYg==  1\n", "one 'base64 rank' per line"),
    (b"YQ== 0\nY!== 1\n", "invalid base64"),
    (b"YQ= 0\n", "multiple of 4"),
    (b"YQ== x\n", "not a number"),
])
def test_numpy_parse_rejects_what_is_not_well_formed(data, what):
    with pytest.raises(ValueError, match=what):
        parse_well_formed_tiktoken_bpe(data)


@settings(max_examples=300, **SETTINGS)
@given(segments, st.booleans())
def test_random_segments_match_reference(engine, segs, safe):
    assert engine.encode(segs, safe).ids.tolist() == Reference().encode_segments(segs, tiktoken_safe=safe)


@settings(max_examples=60, **SETTINGS)
@given(st.lists(st.tuples(with_surrogates, st.booleans()), max_size=4), st.booleans())
def test_lone_surrogates_match_reference(engine, segs, safe):
    assert engine.encode(segs, safe).ids.tolist() == Reference().encode_segments(segs, tiktoken_safe=safe)


@pytest.mark.parametrize("text", [
    " " * 30_000, "a" * 5_000, "ab" * 3_000, "\n \n" * 900, "=-" * 700, "é" * 2_000, "中文" * 800,
    "x" * 33, "0123456789" * 40, "🙂" * 100,
])
def test_long_pieces_merge_with_the_heap(engine, text):
    """Pieces over SHORT_MERGE_BYTES take the heap merge; same ids as the reference."""
    for safe in (True, False):
        assert engine.encode([(text, False)], safe).ids.tolist() == Reference().encode_segments(
            [(text, False)], tiktoken_safe=safe)


def test_sample_prompts_and_counts(engine):
    ref = Reference()
    for seed in range(3):
        segs = sample_prompt(20_000, seed=seed)
        encoded = engine.encode(segs, True)
        assert encoded.ids.dtype == np.uint32 and encoded.ids.tolist() == ref.encode_segments(segs)
        assert engine.encode(segs, True, want_ids=False) == (None, len(encoded.ids))


def test_bad_segments_raise_as_the_compiled_engine_does(engine):
    with pytest.raises(TypeError, match="segment 0: text must be a str"):
        engine.encode([(b"bytes", False)], True)
    with pytest.raises(TypeError, match="allow_special must be a bool"):
        engine.encode([("text", 1)], True)


# -- a Tokenizer starting cold -------------------------------------------------------------------------


class _Build:
    """Stands in for the worker processes: ``wait_until`` returns once the test calls ``finish``."""

    def __init__(self) -> None:
        self.finished = threading.Event()

    def wait_until(self, cached, poll_seconds: float = 0.25) -> bool:
        self.finished.wait()
        return True

    def finish(self) -> None:
        self.finished.set()


@pytest.fixture
def cold_start(monkeypatch):
    """Tokenizers made under this fixture start cold; returns the stand-in build."""
    from kimi_tok import tokenizer

    build = _Build()
    monkeypatch.setattr(tokenizer, "starts_cold", lambda policy, fuses, with_reuse: True)
    monkeypatch.setattr(tokenizer.KernelBuild, "started", classmethod(lambda cls, jobs: build))
    yield build
    build.finish()


def test_a_cold_tokenizer_answers_on_the_interpreted_engine_then_switches(cold_start, capfd):
    from kimi_tok.native import jit

    ref = Reference()
    compiled_before = len(jit.COMPILED)
    tok = kimi_tok.Tokenizer(*embedded_kimi_k3(), KIMI_PATTERN)
    assert not tok.compiled and tok._interpreted is not None
    segs = sample_prompt(8_000, seed=5)
    expected = ref.encode_segments(segs)
    assert tok.encode_segments(segs).ids == expected
    assert tok.count_tokens(segs) == len(expected)
    assert tok.encode("hello world").ids == ref.encode_segments([("hello world", False)])
    assert [e.ids for e in tok.encode_batch(["hi there", segs])] == [ref.encode_segments([("hi there", False)]),
                                                                     expected]
    assert tok.decode(expected) == "".join(text for text, _ in segs)
    with pytest.raises(ValueError, match=r"ids\[1\] = 999999999 is not a token id"):
        tok.decode([1, 999_999_999])
    assert repr(tok).startswith("Tokenizer(name='kimi_k3'") and "KimiScanner" in repr(tok)
    assert not tok.compiled  # nothing so far needed the compiled path
    cold_start.finish()
    assert tok.wait_until_compiled(timeout=120)
    assert tok._interpreted is None
    assert tok.encode_segments(segs).ids == expected
    assert tok.encode_segments(segs, return_offsets=True).offsets is not None
    assert len(jit.COMPILED) == compiled_before  # the kernels were cached: the switch only loaded them


def test_calls_that_need_the_compiled_path_wait_for_it(cold_start):
    tok = kimi_tok.Tokenizer(*embedded_kimi_k3(), KIMI_PATTERN)
    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(id=tok.token_to_id("hello")))
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and not got  # token_to_id's look-up is compiled: it waits
    cold_start.finish()
    thread.join(120)
    assert got == {"id": Reference().encode_segments([("hello", False)])[0]}
    assert tok.engine is tok._compiled()[0]


def test_a_cold_start_whose_build_failed_compiles_in_the_process(monkeypatch):
    """If the worker processes do not cache the kernels, the Tokenizer compiles them itself (a warning)."""
    from kimi_tok import tokenizer

    class FailedBuild:
        def wait_until(self, cached, poll_seconds=0.25):
            return False

        def failed(self):
            return True

        def failure(self):
            return "exit code 1"

    monkeypatch.setattr(tokenizer, "starts_cold", lambda policy, fuses, with_reuse: True)
    monkeypatch.setattr(tokenizer.KernelBuild, "started", classmethod(lambda cls, jobs: FailedBuild()))
    with pytest.warns(RuntimeWarning, match="failed .exit code 1.; compiling in this process"):
        tok = kimi_tok.Tokenizer(*embedded_kimi_k3(), KIMI_PATTERN)
        assert tok.wait_until_compiled(timeout=300)
    assert tok.encode("hello world").ids == Reference().encode_segments([("hello world", False)])


def test_cold_start_settings():
    assert kimi_tok.Policy().cold_start == "background"
    assert kimi_tok.Policy(cold_start="wait").cold_start == "wait"
    with pytest.raises(ValueError, match="cold_start='later': expected one of 'background', 'wait'"):
        kimi_tok.Policy(cold_start="later")
    with pytest.raises(ValueError, match="compile_jobs must be a positive int"):
        kimi_tok.Policy(compile_jobs=0)


def test_kernels_cached_follows_the_record_of_cached_paths(monkeypatch):
    from kimi_tok.native import jit

    policy = kimi_tok.Policy(n_jobs=2, parked_helpers=False)
    names = warmup.paths_for(policy, True, True)
    assert names == ["short call", "shared parts", "agent loop", "groups and stages"]
    keys = {warmup.path_key(name, True, False) for name in names}
    monkeypatch.setattr(jit, "cached_paths", lambda: keys)
    assert warmup.kernels_cached(policy, True, True)
    assert not warmup.kernels_cached(policy.replace(hash_routing=True), True, True)  # its routes' path is not
    assert not warmup.kernels_cached(policy, False, True)  # nor a PCRE2 pattern's
    monkeypatch.setattr(jit, "cached_paths", lambda: keys - {"kimi:agent loop"})
    assert not warmup.kernels_cached(policy, True, True)
    assert warmup.kernels_cached(policy, True, False)  # without a segment cache there is no agent loop
