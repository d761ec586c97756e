"""One Tokenizer shared by 4 threads gives exactly the sequential ids (the compiled stages drop the GIL)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kimi_tok
from kimi_tok import KIMI_PATTERN
from kimi_tok.samples import sample_prompt
from tests.parity import assert_parity
from tests.reference import data_dir

N_THREADS = 4


@pytest.fixture(scope="module")
def prompts():
    sizes = [300_000, 5_000, 120_000, 0, 60_000, 250_000, 1_000, 90_000, 30_000, 200_000, 10, 150_000]
    return [sample_prompt(n, seed=100 + k) for k, n in enumerate(sizes)]


def test_threads_match_sequential(tok, ref, prompts):
    """4 threads encoding 12 prompts (3 rounds, shuffled order) == the sequential ids == the reference."""
    sequential = [tok.encode_segments(p).ids for p in prompts]
    assert_parity(tok, ref, prompts[0])
    rng = np.random.default_rng(0)
    with ThreadPoolExecutor(max_workers=N_THREADS) as pool:
        for _ in range(3):
            order = rng.permutation(len(prompts)).tolist()
            results = list(pool.map(lambda k: (k, tok.encode_segments(prompts[k]).ids), order))
            for k, ids in results:
                assert ids == sequential[k], f"prompt {k} differs when encoded in threads"


def test_threads_into_numpy_and_decode(tok, prompts):
    """into_numpy arrays and decode round trips are the same in threads as sequentially."""
    sequential = [tok.encode_segments(p).into_numpy()["ids"] for p in prompts]
    texts = ["".join(t for t, _ in p) for p in prompts]

    def work(k):
        ids = tok.encode_segments(prompts[k]).into_numpy()["ids"]
        return k, ids, tok.decode(ids)

    with ThreadPoolExecutor(max_workers=N_THREADS) as pool:
        for k, ids, text in pool.map(work, list(range(len(prompts))) * 2):
            assert np.array_equal(ids, sequential[k])
            assert ids.dtype == np.uint32
            assert text == texts[k]


def test_threads_generic_pcre2_path(prompts):
    """A Tokenizer on the PCRE2 JIT path (a non-Kimi pattern text) is also safe to share."""
    generic = kimi_tok.load(
        data_dir() / "tiktoken.model",
        pattern="(?:" + KIMI_PATTERN + ")",
        special_tokens=data_dir() / "special_tokens.json",
    )
    small = [p for p in prompts if sum(len(t) for t, _ in p) <= 120_000]
    sequential = [generic.encode_segments(p).ids for p in small]
    with ThreadPoolExecutor(max_workers=N_THREADS) as pool:
        for k, ids in pool.map(lambda k: (k, generic.encode_segments(small[k]).ids), list(range(len(small))) * 2):
            assert ids == sequential[k]
    assert sequential == [kimi_tok.kimi_k3().encode_segments(p).ids for p in small]


@pytest.fixture(scope="module")
def big_prompt():
    """~2.5M characters: enough bytes for up to 8 fan-out jobs of >= 256 KB each."""
    return sample_prompt(2_500_000, seed=300)


@pytest.mark.parametrize("n_jobs", [1, 2, 3, 4, 8])
def test_n_jobs_fan_out_gives_the_same_ids(ref, big_prompt, n_jobs):
    """One long call split over n_jobs threads == the reference, for any n_jobs."""
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    tokenizer = kimi_tok.Tokenizer(vocabulary, specials, KIMI_PATTERN, n_jobs=n_jobs)
    assert tokenizer.n_jobs == n_jobs
    expected = _reference_ids(ref, big_prompt)
    assert tokenizer.encode_segments(big_prompt).ids == expected
    one_segment = [("".join(text for text, _ in big_prompt), True)]
    assert tokenizer.encode_segments(one_segment).ids == ref.encode_segments(one_segment)


_REFERENCE_CACHE: dict[int, list[int]] = {}


def _reference_ids(ref, segments) -> list[int]:
    key = id(segments)
    if key not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[key] = ref.encode_segments(segments)
    return _REFERENCE_CACHE[key]


def test_fan_out_calls_from_several_threads(ref, big_prompt):
    """4 user threads, each making fan-out calls (n_jobs=4) on one shared Tokenizer."""
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    tokenizer = kimi_tok.Tokenizer(vocabulary, specials, KIMI_PATTERN, n_jobs=4)
    expected = _reference_ids(ref, big_prompt)
    with ThreadPoolExecutor(max_workers=N_THREADS) as pool:
        results = list(pool.map(lambda _: tokenizer.encode_segments(big_prompt).ids, range(6)))
    assert all(ids == expected for ids in results)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_n_jobs(bad):
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    with pytest.raises(ValueError, match="n_jobs"):
        kimi_tok.Tokenizer(vocabulary, specials, KIMI_PATTERN, n_jobs=bad)


@pytest.mark.parametrize("value, ok", [("3", True), ("0", False), ("many", False)])
def test_n_jobs_environment_variable(monkeypatch, value, ok):
    """KIMI_TOK_N_JOBS sets the default n_jobs; a bad value raises ValueError naming it."""
    monkeypatch.setenv("KIMI_TOK_N_JOBS", value)
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    if ok:
        assert kimi_tok.Tokenizer(vocabulary, specials, KIMI_PATTERN).n_jobs == int(value)
    else:
        with pytest.raises(ValueError, match="KIMI_TOK_N_JOBS"):
            kimi_tok.Tokenizer(vocabulary, specials, KIMI_PATTERN)
