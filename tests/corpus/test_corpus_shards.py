"""``kimi_tok.corpus`` / ``kimi-tok corpus``: JSONL documents -> memory-mapped shards.

Every expected id comes from the tiktoken reference (``ref``). Shards must be byte-identical
whatever runs them: one process, a loky pool, or a real ``dask.distributed.LocalCluster``.
A run killed with SIGKILL resumes without losing or repeating a document.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

import kimi_tok.corpus.shards as corpus_module
from kimi_tok.corpus import Corpus, CorpusError, encode_corpus
from kimi_tok.corpus.shards import Options
from kimi_tok.vocab.kimi_k3 import KIMI_K3_SHA256, KIMI_K3_VOCAB
from kimi_tok.samples import sample_prompt, sample_text

REPO_ROOT = Path(__file__).resolve().parents[2]
N_TEXT_DOCS = 240
N_CHAT_DOCS = 60
SPECIAL_TEXTS = ["<|open|>", "<|sep|>", "[EOS]", "hi <|close|> there"]


def _text(rng: random.Random, k: int) -> str:
    """Mixed text of varied length; a few empty, special-token, whitespace-run or long-run texts."""
    kind = k % 12
    if kind == 0:
        return ""
    if kind == 1:
        return rng.choice(SPECIAL_TEXTS) + sample_text(rng.randrange(1, 200), seed=k)
    if kind == 2:
        return "x" + " " * rng.randrange(1, 400) + "\n\n\t y 🤖👩‍💻 中文字符"
    if k == 5:  # one run past the 25,000-character tiktoken-safe cut
        return "a" + " " * 26_000 + "b"
    return sample_text(rng.randrange(1, 1500), seed=1000 + k)


def _documents() -> tuple[list[str], list[list[tuple[str, bool]]]]:
    rng = random.Random(1234)
    texts = [_text(rng, k) for k in range(N_TEXT_DOCS)]
    chats = [sample_prompt(rng.randrange(200, 3000), seed=k, n_segments_hint=rng.randrange(4, 20)) for k in range(N_CHAT_DOCS)]
    chats[3] = []  # a chat of no segments is an empty document
    return texts, chats


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> dict:
    """Text documents in two files (with a blank line and extra fields), chats in a third."""
    root = tmp_path_factory.mktemp("corpus_in")
    texts, chats = _documents()
    half = N_TEXT_DOCS // 2
    a = _write_jsonl(root / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(texts[:half])])
    b = root / "b.jsonl"  # CRLF line ends, a blank line, no newline at the end
    lines = [json.dumps({"text": t, "meta": {"n": i}}, ensure_ascii=False) for i, t in enumerate(texts[half:])]
    b.write_bytes(("\r\n".join(lines[:7] + [""] + lines[7:])).encode("utf-8"))
    chat = _write_jsonl(root / "chat.jsonl", [{"segments": [list(s) for s in c]} for c in chats])
    return {"root": root, "texts": [a, b], "chat": chat, "text_docs": texts, "chat_docs": chats}


@pytest.fixture(scope="module")
def local_run(corpus_files, tmp_path_factory) -> Path:
    """The text corpus encoded in this process (n_jobs=1), small shards."""
    out = tmp_path_factory.mktemp("run") / "n1"
    encode_corpus(corpus_files["texts"], out, docs_per_shard=37, n_jobs=1)
    return out


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def _assert_identical(a: Path, b: Path) -> None:
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], name


# -- ids and layout -----------------------------------------------------------------------


def test_text_documents_match_the_reference(local_run, corpus_files, ref):
    docs = corpus_files["text_docs"]
    corpus = Corpus(local_run)
    assert len(corpus) == len(docs)
    for i, text in enumerate(docs):
        got = corpus[i]
        assert got.dtype == np.uint32
        assert got.tolist() == ref.encode_segments([(text, False)]), i
    assert corpus.n_tokens == sum(len(ids) for ids in corpus)


def test_chat_documents_match_the_reference(corpus_files, tmp_path, ref):
    summary = encode_corpus(corpus_files["chat"], tmp_path / "chat", segments_field="segments", docs_per_shard=16, n_jobs=1)
    corpus = Corpus(tmp_path / "chat")
    assert summary.documents == len(corpus) == N_CHAT_DOCS
    for i, segments in enumerate(corpus_files["chat_docs"]):
        assert corpus[i].tolist() == ref.encode_segments(segments), i


def test_allow_special_and_tiktoken_safe_options(corpus_files, tmp_path, ref):
    path = _write_jsonl(tmp_path / "s.jsonl", [{"t": "a <|open|> b"}, {"t": "a" + " " * 26_000 + "b"}])
    encode_corpus(path, tmp_path / "on", text_field="t", allow_special=True, tiktoken_safe=False, n_jobs=1)
    corpus = Corpus(tmp_path / "on")
    assert corpus[0].tolist() == ref.encode("a <|open|> b", allow_special=True)
    assert corpus[1].tolist() == ref.encode("a" + " " * 26_000 + "b", tiktoken_safe=False)
    assert corpus.manifest["options"]["allow_special"] is True
    assert corpus.manifest["options"]["tiktoken_safe"] is False


def test_shard_files_and_sources(local_run, corpus_files):
    manifest = json.loads((local_run / "manifest.json").read_text())
    first = manifest["shards"][0]["name"]
    ids = np.load(local_run / f"{first}.ids.npy")
    offsets = np.load(local_run / f"{first}.offsets.npy")
    assert ids.dtype == np.uint32 and offsets.dtype == np.int64
    assert offsets[0] == 0 and offsets[-1] == len(ids) and len(offsets) == 37 + 1
    corpus = Corpus(local_run)
    half = N_TEXT_DOCS // 2
    a, b = (str(p) for p in corpus_files["texts"])
    assert corpus.source(0) == (a, 1)
    assert corpus.source(half - 1) == (a, half)
    assert corpus.source(half + 6) == (b, 7)
    assert corpus.source(half + 7) == (b, 9)  # line 8 is blank: not a document


def test_manifest(local_run, corpus_files):
    manifest = json.loads((local_run / "manifest.json").read_text())
    raw = gzip.decompress(resources.files("kimi_tok.data").joinpath(KIMI_K3_VOCAB).read_bytes())
    assert manifest["vocabulary_sha256"] == hashlib.sha256(raw).hexdigest() == KIMI_K3_SHA256
    assert manifest["complete"] is True
    assert manifest["options"] == {"text_field": "text", "segments_field": None, "allow_special": False,
                                   "tiktoken_safe": True, "docs_per_shard": 37,
                                   "max_shard_bytes": corpus_module.DEFAULT_MAX_SHARD_BYTES}
    assert [i["path"] for i in manifest["inputs"]] == [str(p) for p in corpus_files["texts"]]
    for info, path in zip(manifest["inputs"], corpus_files["texts"]):
        data = path.read_bytes()
        assert info["bytes"] == len(data) and info["sha256"] == hashlib.sha256(data).hexdigest()
    assert manifest["documents"] == N_TEXT_DOCS and manifest["blank_lines"] == 1 and manifest["skipped"] == 0
    assert manifest["tokens"] == sum(s["tokens"] for s in manifest["shards"]) == Corpus(local_run).n_tokens
    assert sum(s["documents"] for s in manifest["shards"]) == N_TEXT_DOCS
    assert (local_run / "errors.jsonl").read_bytes() == b""


def test_plan_does_not_depend_on_the_read_block(corpus_files, monkeypatch):
    options = Options(docs_per_shard=5, max_shard_bytes=3000)
    plan = corpus_module._plan([str(p) for p in corpus_files["texts"]], options)
    monkeypatch.setattr(corpus_module, "PLAN_BLOCK_BYTES", 97)
    assert corpus_module._plan([str(p) for p in corpus_files["texts"]], options) == plan
    inputs, tasks = plan
    assert any(t.lines < 5 for t in tasks[:-1])  # max_shard_bytes ended some shards early
    assert all(t.lines <= 5 for t in tasks)
    assert sum(t.lines for t in tasks) == N_TEXT_DOCS + 1  # + the blank line


# -- the reader ---------------------------------------------------------------------------


def test_reader_memory_maps_and_indexes(local_run):
    corpus = Corpus(local_run)
    n = len(corpus)
    assert isinstance(corpus[1], np.memmap) and not corpus[1].flags.writeable and len(corpus[1]) > 0
    assert corpus[-1].tolist() == corpus[n - 1].tolist()
    assert corpus[np.int64(3)].tolist() == corpus[3].tolist()
    for bad in (n, -n - 1, 10**9):
        with pytest.raises(IndexError, match="out of range"):
            corpus[bad]
    for bad in ("1", 1.0, True, None):
        with pytest.raises(TypeError, match="must be an int"):
            corpus[bad]
    assert [ids.tolist() for ids in corpus][:5] == [corpus[i].tolist() for i in range(5)]


def test_reader_refuses_missing_or_unfinished_runs(tmp_path, local_run):
    with pytest.raises(FileNotFoundError, match="not a kimi_tok corpus"):
        Corpus(tmp_path)
    manifest = json.loads((local_run / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "complete": False}))
    with pytest.raises(ValueError, match="did not finish"):
        Corpus(tmp_path)


# -- determinism: local pool and Dask -----------------------------------------------------------


def test_loky_pool_writes_identical_shards(local_run, corpus_files, tmp_path):
    encode_corpus(corpus_files["texts"], tmp_path / "n2", docs_per_shard=37, n_jobs=2, backend="loky")
    _assert_identical(local_run, tmp_path / "n2")


@pytest.fixture(scope="module")
def dask_client():
    """A real LocalCluster: two worker processes that import this checkout's kimi_tok."""
    import distributed

    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), saved]))  # read at worker start
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                      timeout="60s") as cluster, distributed.Client(cluster, timeout="60s") as client:
            yield client
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


def test_dask_cluster_writes_identical_shards(local_run, corpus_files, tmp_path, dask_client):
    out = tmp_path / "dask"
    summary = encode_corpus(corpus_files["texts"], out, docs_per_shard=37, backend="dask")
    assert summary.documents == N_TEXT_DOCS
    _assert_identical(local_run, out)
    workers = dask_client.run(lambda: sys.modules["kimi_tok"].__file__)
    assert len(workers) == 2 and all(Path(f).resolve().parent.parent == REPO_ROOT for f in workers.values())
    # the vocabulary was loaded at most once per worker process, not per task (8 shards)
    loads = dask_client.run(lambda: sys.modules["kimi_tok.loaders"]._kimi_k3.cache_info().misses)
    assert 1 <= sum(loads.values()) <= 2 and max(loads.values()) == 1


def test_dask_by_scheduler_address_stops_at_a_bad_record(corpus_files, tmp_path, dask_client):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(corpus_files["texts"][0].read_bytes() + b'{"text": 7}\n')
    with pytest.raises(CorpusError, match=f"bad.jsonl:{N_TEXT_DOCS // 2 + 1}: field 'text' must be a string"):
        encode_corpus(path, tmp_path / "out", docs_per_shard=37, scheduler=dask_client.scheduler.address)


def test_dask_backend_without_dask_or_client_says_what_to_do(corpus_files, tmp_path, monkeypatch):
    import distributed

    def no_client():
        raise ValueError("No clients found")

    monkeypatch.setattr(distributed, "get_client", no_client)
    with pytest.raises(ValueError, match="needs a running distributed.Client, or scheduler="):
        encode_corpus(corpus_files["texts"], tmp_path / "a", backend="dask")
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if dask were not installed
    with pytest.raises(ImportError, match=r"pip install 'kimi_tok\[dask\]'"):
        encode_corpus(corpus_files["texts"], tmp_path / "b", backend="dask")


# -- bad records ------------------------------------------------------------------------------------

BAD_RECORDS = {
    "invalid JSON": (b'{"text": "unterminated}', "invalid JSON"),
    "not an object": (b'["text", "a list"]', "expected a JSON object, got a list"),
    "missing field": (b'{"body": "hello"}', "no 'text' field"),
    "non-string text": (b'{"text": ["a"]}', "field 'text' must be a string, got a list"),
    "invalid UTF-8": (b'{"text": "caf\xe9"}', "not UTF-8"),
}


@pytest.mark.parametrize("kind", list(BAD_RECORDS))
def test_bad_record_stops_the_run_naming_file_and_line(kind, tmp_path):
    line, reason = BAD_RECORDS[kind]
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "also fine"}\n' + line + b"\n")
    with pytest.raises(CorpusError, match=f"in.jsonl:3: {reason}"):
        encode_corpus(path, tmp_path / "out", n_jobs=1)
    assert not list((tmp_path / "out").glob("shard-*"))


def test_bad_segments_stop_the_run(tmp_path):
    path = _write_jsonl(tmp_path / "chat.jsonl", [{"segments": [["a", False]]}, {"segments": [["a", "yes"]]}])
    with pytest.raises(CorpusError, match=r"chat.jsonl:2: field 'segments': segment 0 must be \[text, allow_special\]"):
        encode_corpus(path, tmp_path / "out", segments_field="segments", n_jobs=1)


def test_skip_lists_bad_records_and_keeps_the_rest(tmp_path, ref):
    good = ["first <|open|>", "", "third 中文"]
    lines = [json.dumps({"text": good[0]}).encode(), *(line for line, _ in BAD_RECORDS.values()),
             json.dumps({"text": good[1]}).encode(), b"", b'{"segments": [["x", 1]]}', json.dumps({"text": good[2]}).encode()]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    summary = encode_corpus(path, tmp_path / "out", on_error="skip", docs_per_shard=3, n_jobs=1)
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [(e["file"], e["line"]) for e in errors] == [(str(path), n) for n in (2, 3, 4, 5, 6, 9)]
    for error, (_, reason) in zip(errors, BAD_RECORDS.values()):
        assert reason in error["reason"]
    assert "no 'text' field" in errors[-1]["reason"]
    corpus = Corpus(tmp_path / "out")
    assert [ids.tolist() for ids in corpus] == [ref.encode(t) for t in good]
    assert [corpus.source(i)[1] for i in range(3)] == [1, 7, 10]
    assert summary.skipped == corpus.manifest["skipped"] == 6 and summary.blank_lines == 1


def test_skip_then_stop_reports_the_skipped_record(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": 1}\n')
    encode_corpus(path, tmp_path / "out", on_error="skip", n_jobs=1)
    with pytest.raises(CorpusError, match="in.jsonl:2: field 'text' must be a string"):
        encode_corpus(path, tmp_path / "out", on_error="stop", n_jobs=1)


# -- resuming ------------------------------------------------------------------------------------------


def test_rerun_redoes_incomplete_shards_only(local_run, corpus_files, tmp_path):
    out = tmp_path / "resume"
    encode_corpus(corpus_files["texts"], out, docs_per_shard=37, n_jobs=1)
    (out / "shard-00002.json").unlink()  # ids written, metadata not: incomplete
    (out / "shard-00004.ids.npy").write_bytes(b"garbage")
    (out / "shard-00004.json").unlink()
    (out / ".shard-00005.ids.npy.0123.tmp").write_bytes(b"half written")
    summary = encode_corpus(corpus_files["texts"], out, docs_per_shard=37, n_jobs=1)
    shards = json.loads((out / "manifest.json").read_text())["shards"]
    assert summary.resumed_shards == summary.shards - 2
    assert summary.encoded_documents == shards[2]["documents"] + shards[4]["documents"]
    _assert_identical(local_run, out)


def test_resume_with_other_options_or_inputs_fails_clearly(local_run, corpus_files, tmp_path):
    with pytest.raises(CorpusError, match="other options: allow_special False there, True here"):
        encode_corpus(corpus_files["texts"], local_run, docs_per_shard=37, allow_special=True, n_jobs=1)
    with pytest.raises(CorpusError, match="other options: docs_per_shard 37 there, 10 here"):
        encode_corpus(corpus_files["texts"], local_run, docs_per_shard=10, n_jobs=1)
    with pytest.raises(CorpusError, match="other inputs"):
        encode_corpus(corpus_files["texts"][:1], local_run, docs_per_shard=37, n_jobs=1)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(CorpusError, match="not a kimi_tok corpus directory"):
        encode_corpus(corpus_files["texts"], tmp_path, n_jobs=1)
    assert json.loads((local_run / "manifest.json").read_text())["options"]["allow_special"] is False


def test_bad_arguments(corpus_files, tmp_path):
    texts = corpus_files["texts"]
    with pytest.raises(ValueError, match="n_jobs must be a positive int"):
        encode_corpus(texts, tmp_path / "o", n_jobs=0)
    with pytest.raises(ValueError, match="on_error must be"):
        encode_corpus(texts, tmp_path / "o", on_error="ignore")
    with pytest.raises(ValueError, match="docs_per_shard must be a positive int"):
        encode_corpus(texts, tmp_path / "o", docs_per_shard=0)
    with pytest.raises(TypeError, match="allow_special must be a bool"):
        encode_corpus(texts, tmp_path / "o", allow_special="yes")
    with pytest.raises(TypeError, match="inputs must be"):
        encode_corpus([], tmp_path / "o")
    with pytest.raises(ValueError, match="Dask scheduler address"):
        encode_corpus(texts, tmp_path / "o", backend="loky", scheduler="tcp://127.0.0.1:1")
    with pytest.raises(FileNotFoundError, match="nope.jsonl: no such file"):
        encode_corpus(tmp_path / "nope.jsonl", tmp_path / "o")


# -- the command -----------------------------------------------------------------------------------------


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kimi_tok", "corpus", *args], cwd=REPO_ROOT,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_cli_killed_run_resumes_to_identical_shards(corpus_files, tmp_path):
    inputs = [str(p) for p in corpus_files["texts"]]
    args = ["--docs-per-shard", "1", "--n-jobs", "1", "--quiet"]
    full, killed = tmp_path / "full", tmp_path / "killed"
    run = _cli(*inputs, "--out", str(full), *args)
    assert run.wait(timeout=300) == 0, run.stderr.read().decode()

    run = _cli(*inputs, "--out", str(killed), *args)
    deadline = time.monotonic() + 300
    while not (killed / "shard-00001.json").exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    run.send_signal(signal.SIGKILL)
    run.wait(timeout=60)
    manifest = json.loads((killed / "manifest.json").read_text())
    n_shards = len(manifest["shards"])
    complete = len(list(killed.glob("shard-*.json")))
    assert not manifest["complete"] and 1 <= complete < n_shards, (complete, n_shards)

    rerun = _cli(*inputs, "--out", str(killed), *args)
    stdout, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr.decode()
    assert f"{n_shards} shards ({complete} already complete), {N_TEXT_DOCS} documents" in stdout.decode()
    _assert_identical(full, killed)
    corpus = Corpus(killed)
    sources = [corpus.source(i) for i in range(len(corpus))]
    assert len(sources) == len(set(sources)) == N_TEXT_DOCS


def test_cli_bad_record_and_options(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "ok"}\nnot json\n')
    run = _cli(str(path), "--out", str(tmp_path / "out"), "--n-jobs", "1")
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 2
    last_line = stderr.decode().splitlines()[-1]  # after the progress bar
    assert last_line.startswith(f"kimi-tok: error: {path}:2: invalid JSON") and "Traceback" not in stderr.decode()

    run = _cli(str(path), "--out", str(tmp_path / "out"), "--n-jobs", "1", "--on-error", "skip")
    stdout, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr.decode()
    assert "1 documents" in stdout.decode() and "1 skipped records" in stdout.decode()
    assert "2/2" in stderr.decode()  # the progress bar

    run = _cli(str(path), "--out", str(tmp_path / "out"), "--n-jobs", "1", "--allow-special")
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 2 and "other options: allow_special False there, True here" in stderr.decode()
