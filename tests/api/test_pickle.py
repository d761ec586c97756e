"""Pickling: Tokenizers, their tiktoken drop-ins and Encodings go to other processes small, come
back with the same ids, keep their settings, and start with caches and helpers of their own.

Multiprocessing pools (spawn, forkserver), ``ProcessPoolExecutor`` and a Dask ``LocalCluster``
all pickle what they send; each is run for real here with two workers. Expected ids come from
the tiktoken reference (``ref``).
"""

from __future__ import annotations

import copy
import functools
import json
import multiprocessing
import os
import pickle
import shutil
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import kimi_tok
from kimi_tok.engine import Policy
from kimi_tok.loaders import rebuild_kimi_k3
from kimi_tok.samples import sample_prompt
from kimi_tok.tokenizer import policy_state
from kimi_tok.vocab import vocabulary_from_ranks
from tests.reference import data_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [sample_prompt(3000, seed) for seed in range(4)]
SMALL_PICKLE = 4096  # bytes: a Tokenizer of the embedded vocabulary travels by name and sha256


def encode_ids(tok, segments) -> list[int]:
    """What a worker does with the tokenizer it was sent (module level: workers import it)."""
    return tok.encode_segments(segments).ids


def encode_with_dropin(enc, text: str) -> list[int]:
    return enc.encode(text, allowed_special="all")


def encoding_of(tok, segments):
    """An Encoding, pickled back to the caller."""
    return tok.encode_segments(segments)


def settings_of(tok) -> dict:
    return {"n_jobs": tok.n_jobs, "backend": tok.backend, "hash_routing": tok.hash_routing,
            "segment_cache_bytes": tok.policy.segment_cache_bytes, "min_bytes_per_job": tok.policy.min_bytes_per_job}


@pytest.fixture
def children_import_this_checkout(monkeypatch):
    """Worker processes started from now on import this checkout's kimi_tok and tests."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])))


@pytest.fixture(scope="module")
def custom_tok() -> kimi_tok.Tokenizer:
    """K3 with settings that differ from every default."""
    return kimi_tok.kimi_k3(policy=Policy.from_env(n_jobs=3, segment_cache_bytes=1 << 20, backend="processes",
                                                   hash_routing=True).replace(min_bytes_per_job=12345))


def run_child(code: str, data: bytes, **env: str) -> str:
    """Run ``code`` in a new Python process with ``data`` on stdin; its stdout."""
    result = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env})
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


# -- in this process ---------------------------------------------------------------------------


def test_kimi_k3_pickles_small_and_round_trips(ref):
    tok = kimi_tok.kimi_k3()  # the session's, unless other tests' policies pushed it out of kimi_k3's few
    data = pickle.dumps(tok)
    assert len(data) < SMALL_PICKLE
    back = pickle.loads(data)
    assert back is tok  # the same embedded vocabulary and policy: kimi_k3()'s cached Tokenizer
    assert back.encode_segments(PROMPTS[0]).ids == ref.encode_segments(PROMPTS[0])
    assert copy.deepcopy(tok) is tok and copy.copy(tok) is tok


def test_settings_travel(custom_tok):
    back = pickle.loads(pickle.dumps(custom_tok))
    assert back.policy == custom_tok.policy and settings_of(back) == settings_of(custom_tok)


def test_cache_dir_travels_only_when_set_explicitly(tok, tmp_path):
    derived = policy_state(tok.policy)
    assert "cache_dir" not in derived and Policy(**derived) == tok.policy
    explicit = policy_state(tok.policy.replace(cache_dir=tmp_path))
    assert explicit["cache_dir"] == str(tmp_path) and Policy(**explicit).cache_dir == tmp_path


def test_a_different_k3_vocabulary_is_refused():
    with pytest.raises(ValueError, match="sha256 0000.*same kimi_tok version"):
        rebuild_kimi_k3("0" * 64, policy_state(Policy.from_env()))


def test_the_dropin_pickles_as_its_tokenizer(tok, ref):
    enc = tok.as_tiktoken()
    data = pickle.dumps(enc)
    assert len(data) < SMALL_PICKLE
    back = pickle.loads(data)
    assert type(back) is type(enc) and back.tokenizer is tok
    text = "".join(t for t, _ in PROMPTS[1])
    assert back.encode(text, allowed_special="all") == ref.enc.encode(text, allowed_special="all")


def test_a_loaded_file_pickles_as_path_and_sha256(tmp_path, ref):
    for name in ("tiktoken.model", "special_tokens.json"):
        shutil.copy(data_dir() / name, tmp_path / name)
    loaded = kimi_tok.load(tmp_path / "tiktoken.model", special_tokens=tmp_path / "special_tokens.json")
    data = pickle.dumps(loaded)
    assert len(data) < SMALL_PICKLE and str(tmp_path / "tiktoken.model").encode() in data
    back = pickle.loads(data)
    assert back is not loaded and back.name == loaded.name and back.special_tokens == loaded.special_tokens
    assert back.encode_segments(PROMPTS[2]).ids == ref.encode_segments(PROMPTS[2])
    assert pickle.loads(pickle.dumps(back)) is back  # one Tokenizer per file and settings in a process


def test_a_changed_file_is_refused_by_name(tmp_path):
    shutil.copy(data_dir() / "tiktoken.model", tmp_path / "tiktoken.model")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {
        "163584": {"content": "[BOS]"}, "163585": {"content": "[EOS]"}}}))
    loaded = kimi_tok.load(tmp_path)  # a model directory: its config's two special tokens
    assert loaded.special_tokens == {"[BOS]": 163584, "[EOS]": 163585}
    data = pickle.dumps(loaded)
    assert b"[EOS]" in data  # not K3's 256: they travel
    model = tmp_path / "tiktoken.model"
    model.write_bytes(model.read_bytes().rsplit(b"\n", 2)[0] + b"\n")  # the last token dropped
    with pytest.raises(ValueError, match=f"{tmp_path}.*changed since the Tokenizer was pickled"):
        pickle.loads(data)
    model.unlink()
    with pytest.raises(FileNotFoundError, match="tiktoken.model"):
        pickle.loads(data)


def test_other_vocabularies_pickle_their_ranks(cl100k):
    tok = kimi_tok.from_tiktoken(cl100k)
    data = pickle.dumps(tok)
    assert len(data) < 600_000  # the ranks, packed: tiktoken's own pickle of them is about 1.3 MB
    back = pickle.loads(data)
    assert (back.name, back.pattern, back.special_tokens, back.n_vocab) == (tok.name, tok.pattern,
                                                                           tok.special_tokens, tok.n_vocab)
    assert np.array_equal(back.vocabulary.token_bytes, tok.vocabulary.token_bytes)
    assert np.array_equal(back.vocabulary.token_offsets, tok.vocabulary.token_offsets)
    text = "".join(t for t, _ in PROMPTS[3])
    assert back.encode(text).ids == cl100k.encode(text, disallowed_special=())
    assert back.segment_cache is not tok.segment_cache  # caches of its own


def test_a_tokenizer_made_from_arrays_pickles_its_ranks():
    ranks = {bytes([b]): b for b in range(256)} | {b"ab": 256, b"abab": 257, b" x": 258}
    tok = kimi_tok.Tokenizer(vocabulary_from_ranks(ranks), {"<|end|>": 259}, r"\s?\w+|\s+", name="tiny",
                             policy=Policy.from_env(n_jobs=1, segment_cache_bytes=0))
    back = pickle.loads(pickle.dumps(tok))
    assert back is not tok and back.policy == tok.policy and back.special_tokens == {"<|end|>": 259}
    assert back.encode("abab x<|end|>", allow_special=True).ids == tok.encode("abab x<|end|>", True).ids == [
        257, 258, 259]


def test_encodings_pickle_their_ids_and_special_positions(tok, ref):
    enc = tok.encode_segments(PROMPTS[0])
    data = pickle.dumps(enc)
    assert len(data) < 4 * len(enc) + 2048  # the uint32 ids and a few positions, not the vocabulary's mask
    back = pickle.loads(data)
    with_offsets = tok.encode_segments(PROMPTS[0], return_offsets=True)
    assert pickle.loads(pickle.dumps(with_offsets)).offsets.tolist() == with_offsets.offsets.tolist()
    with pytest.raises(ValueError, match="no offsets"):
        back.offsets
    want = enc.into_numpy(special_tokens_mask=True)
    got = pickle.loads(pickle.dumps(back)).into_numpy(special_tokens_mask=True)
    assert got["ids"].tolist() == want["ids"].tolist() == ref.encode_segments(PROMPTS[0])
    assert got["special_tokens_mask"].tolist() == want["special_tokens_mask"].tolist()
    assert want["special_tokens_mask"].any()
    assert repr(pickle.loads(pickle.dumps(enc))) == "Encoding(drained)"  # enc was drained by into_numpy


# -- in other processes ----------------------------------------------------------------------


def test_a_new_process_gets_fresh_caches_and_its_own_cache_dir(tok, tmp_path):
    """The default cache_dir is the other side's (here: its KIMI_TOK_CACHE_DIR); one set explicitly
    travels. The segment cache starts empty there."""
    tok.encode_segments(sample_prompt(tok.policy.min_cached_call_chars + 1000, 0))  # long enough to be cached
    assert len(tok.segment_cache) > 0
    explicit = kimi_tok.kimi_k3(policy=tok.policy.replace(cache_dir=tmp_path / "explicit"))
    code = ("import json, pickle, sys\n"
            "toks = pickle.load(sys.stdin.buffer)\n"
            "print(json.dumps([[str(t.policy.cache_dir), len(t.segment_cache)] for t in toks]))")
    out = run_child(code, pickle.dumps([tok, explicit]), KIMI_TOK_CACHE_DIR=str(tmp_path / "theirs"))
    assert json.loads(out) == [[str(tmp_path / "theirs"), 0], [str(tmp_path / "explicit"), 0]]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_multiprocessing_pools(method, tok, ref, custom_tok, children_import_this_checkout):
    with multiprocessing.get_context(method).Pool(2) as pool:
        ids = pool.map(functools.partial(encode_ids, tok), PROMPTS)  # the tokenizer goes with every task
        settings = pool.apply(settings_of, (custom_tok,))
        encodings = pool.starmap(encoding_of, [(custom_tok, prompt) for prompt in PROMPTS[:2]])
        texts = ["".join(t for t, _ in prompt) for prompt in PROMPTS]
        dropin_ids = pool.starmap(encode_with_dropin, [(tok.as_tiktoken(), text) for text in texts])
    assert ids == [ref.encode_segments(prompt) for prompt in PROMPTS]
    assert settings == settings_of(custom_tok)
    assert [e.ids for e in encodings] == ids[:2]
    assert dropin_ids == [ref.enc.encode(text, allowed_special="all") for text in texts]


def test_process_pool_executor(tok, ref, children_import_this_checkout):
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver")) as pool:
        ids = list(pool.map(encode_ids, [tok] * len(PROMPTS), PROMPTS))
    assert ids == [ref.encode_segments(prompt) for prompt in PROMPTS]


def test_dask_local_cluster(tok, ref, custom_tok, children_import_this_checkout):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  timeout="60s") as cluster, distributed.Client(cluster, timeout="60s") as client:
        futures = client.map(encode_ids, [tok] * len(PROMPTS), PROMPTS, pure=False)
        texts = ["".join(t for t, _ in prompt) for prompt in PROMPTS]
        dropin = client.map(encode_with_dropin, [tok.as_tiktoken()] * len(texts), texts, pure=False)
        settings = client.submit(settings_of, custom_tok, pure=False)
        done, pending = distributed.wait([*futures, *dropin, settings], timeout=180)
        assert not pending
        assert client.gather(futures) == [ref.encode_segments(prompt) for prompt in PROMPTS]
        assert client.gather(dropin) == [ref.enc.encode(text, allowed_special="all") for text in texts]
        assert settings.result() == settings_of(custom_tok)
