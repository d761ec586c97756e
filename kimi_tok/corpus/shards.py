"""Corpus scale: tokenize JSONL documents into memory-mappable shards, on local processes or Dask.

    >>> from kimi_tok.corpus import Corpus, encode_corpus
    >>> summary = encode_corpus(["train.jsonl"], "train.tok")      # doctest: +SKIP
    >>> corpus = Corpus("train.tok")                                # doctest: +SKIP
    >>> corpus[0], len(corpus), corpus.n_tokens                     # doctest: +SKIP
    (memmap([22931, 2695], dtype=uint32), 1000, 250000)

Input: JSONL files, one record per line, each a JSON object whose ``text_field``
("text") is a string (one segment, ``allow_special`` for all of them), or, with
``segments_field``, whose field is a rendered chat ``[[text, allow_special], ...]``.
Blank lines are not records: they are counted (``blank_lines``), nothing else.

Output directory (``out_dir``):

    manifest.json            format, vocabulary sha256, options, inputs, per-shard counts, totals
    shard-00000.ids.npy      uint32: the ids of the shard's documents, one after the other
    shard-00000.offsets.npy  int64, documents + 1: document j is ids[offsets[j]:offsets[j + 1]]
    shard-00000.lines.npy    int64: the 1-based input line of each document
    shard-00000.json         the shard's counts and skipped records; written last, so it marks
                             a complete shard
    errors.jsonl             the records skipped with on_error="skip": file, line, reason

Plan: one cheap sequential pass over the inputs (newline search and sha256) cuts each
file into shards of ``docs_per_shard`` lines, or fewer where ``max_shard_bytes`` of
input is reached first. A shard never spans two files. The plan depends only on the
input bytes and the options, and a shard's files only on its lines, so the output is
byte-identical whatever the number of workers or machines.

Workers get a task that holds a path, a byte range and the options (never the tokenizer):
each worker process loads the vocabulary once (``kimi_k3`` is cached per process), reads
its byte range, encodes and writes the shard's files itself, each through a temporary
name and ``os.replace``. On a Dask cluster of several machines, the inputs and
``out_dir`` must therefore be on a filesystem that all workers and the client see at
the same paths (writing on the workers keeps the ids off the scheduler and client).

Resume: rerunning with the same inputs (by size and sha256) and options skips every
complete shard and redoes the rest, so no document is lost or written twice; a
directory holding another run, or files that are not a corpus, is refused.

Bad records (invalid UTF-8 or JSON, not an object, a missing field, a text that is not
a string, malformed segments) raise ``CorpusError`` naming ``file:line`` with
``on_error="stop"`` (the default). With ``on_error="skip"`` they are left out of the
shards (documents are numbered without them; ``lines.npy`` maps each document back to
its line) and listed in ``errors.jsonl`` and the manifest's ``skipped`` counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..loaders import kimi_k3
from ..tokenizer import Tokenizer
from ..vocab import KIMI_K3_SHA256
from .records import json_type, segments_from_json

__all__ = ["Corpus", "CorpusError", "CorpusSummary", "encode_corpus"]

FORMAT = "kimi_tok.corpus/1"
MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
ARRAY_SUFFIXES = (".ids.npy", ".offsets.npy", ".lines.npy")
TMP_SUFFIX = ".tmp"
# A shard is 10,000 records or 16 MiB of input, whichever comes first: about 0.5 s of one core
# (~35 MB/s), so per-task costs (a few files, ~1 ms of Dask scheduling) stay below 1%, an
# interrupted run loses little, a task's memory stays bounded however long the records (agent
# traces), and a 1 GB corpus already gives 60 shards to balance over the workers.
DEFAULT_DOCS_PER_SHARD = 10_000
DEFAULT_MAX_SHARD_BYTES = 16 << 20
PLAN_BLOCK_BYTES = 16 << 20
NEWLINE = 0x0A
ON_ERROR = ("stop", "skip")


class CorpusError(ValueError):
    """A bad input record (``file:line: reason``) or an output directory that cannot be used."""


@dataclass(frozen=True)
class Options:
    """What the ids depend on; a resumed run must use the same (recorded in the manifest)."""

    text_field: str = "text"
    segments_field: str | None = None
    allow_special: bool = False
    tiktoken_safe: bool = True
    docs_per_shard: int = DEFAULT_DOCS_PER_SHARD
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES


@dataclass(frozen=True)
class ShardTask:
    """One unit of work: lines ``first_line..`` of ``path``, bytes ``[byte_start, byte_end)``."""

    index: int
    input: int
    path: str
    byte_start: int
    byte_end: int
    first_line: int
    lines: int

    @property
    def name(self) -> str:
        return shard_name(self.index)


@dataclass(frozen=True)
class CorpusSummary:
    """What ``encode_corpus`` did; ``str()`` is a one-line report."""

    out_dir: Path
    documents: int
    tokens: int
    skipped: int
    blank_lines: int
    shards: int
    resumed_shards: int
    encoded_documents: int  # documents encoded by this run (not in resumed shards)
    encoded_tokens: int
    seconds: float

    def __str__(self) -> str:
        rate = max(self.seconds, 1e-9)
        resumed = f" ({self.resumed_shards} already complete)" if self.resumed_shards else ""
        skipped = f", {self.skipped:,} skipped records (see {self.out_dir / ERRORS})" if self.skipped else ""
        return (f"{self.out_dir}: {self.shards} shards{resumed}, {self.documents:,} documents, "
                f"{self.tokens:,} tokens{skipped}; encoded {self.encoded_documents:,} documents in "
                f"{self.seconds:.1f} s ({self.encoded_documents / rate:,.0f} documents/s, "
                f"{self.encoded_tokens / rate:,.0f} tokens/s)")


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


# -- records ---------------------------------------------------------------------------


def record_segments(line: bytes, options: Options) -> list[tuple[str, bool]]:
    """The ``(text, allow_special)`` segments of one JSONL line; ``ValueError`` says what is wrong."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e}") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {json_type(record)}")
    field = options.segments_field or options.text_field
    if field not in record:
        raise ValueError(f"no {field!r} field")
    value = record[field]
    if options.segments_field is not None:
        try:
            return segments_from_json(value)
        except ValueError as e:
            raise ValueError(f"field {field!r}: {e}") from None
    if not isinstance(value, str):
        raise ValueError(f"field {field!r} must be a string, got {json_type(value)}")
    return [(value, options.allow_special)]


def encode_documents(
    tok: Tokenizer, documents: Sequence[list[tuple[str, bool]]], tiktoken_safe: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, offsets)`` of many documents (checked segment lists) in one tokenizer call.

    Document j is ``ids[offsets[j]:offsets[j + 1]]``, the same as
    ``tok.encode_to_numpy(documents[j], tiktoken_safe)``. One call for the shard spares the
    per-call cost (docs/corpus.md); it uses the tokenizer's per-segment bounds
    (``Tokenizer.encode_with_bounds``), which ``encode_segments`` does not return.
    """
    segments = [segment for document in documents for segment in document]
    ids, bounds = tok.encode_with_bounds(segments, tiktoken_safe, n_jobs=1)
    first_segment = np.zeros(len(documents) + 1, dtype=np.int64)
    np.cumsum([len(document) for document in documents], out=first_segment[1:])
    return ids.astype(np.uint32, copy=False), bounds[first_segment]


# -- one shard (runs on a worker) ---------------------------------------------------------


def _write_atomic(path: Path, write: Callable[[Any], Any]) -> None:
    """``write(file)`` to a temporary name in the same directory, then rename it to ``path``."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}{TMP_SUFFIX}")
    with open(tmp, "wb") as f:
        write(f)
    os.replace(tmp, path)


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def encode_shard(task: ShardTask, options: Options, out_dir: str, on_error: str) -> dict[str, Any]:
    """Encode one shard and write its files (the ``.json`` metadata last); returns the metadata.

    Runs in a worker: the tokenizer is the worker process's cached ``kimi_k3``.
    """
    with open(task.path, "rb") as f:
        f.seek(task.byte_start)
        data = f.read(task.byte_end - task.byte_start)
    lines = data.split(b"\n")
    if lines[-1] == b"":  # the range ends with a newline (not: a last line without one)
        lines.pop()
    documents, line_numbers, skipped, blank = [], [], [], 0
    for number, line in enumerate(lines, task.first_line):
        if not line.strip():
            blank += 1
            continue
        try:
            documents.append(record_segments(line, options))
        except ValueError as e:
            if on_error == "stop":
                raise CorpusError(f"{task.path}:{number}: {e}") from None
            skipped.append({"line": number, "reason": str(e)})
            continue
        line_numbers.append(number)
    tok = kimi_k3(n_jobs=1, segment_cache_bytes=0)  # processes are the parallelism; documents do not repeat
    ids, offsets = encode_documents(tok, documents, options.tiktoken_safe)
    out = Path(out_dir)
    for suffix, array in zip(ARRAY_SUFFIXES, (ids, offsets, np.array(line_numbers, dtype=np.int64))):
        _write_atomic(out / f"{task.name}{suffix}", lambda f, a=array: np.save(f, a, allow_pickle=False))
    meta = {
        "shard": task.index, "input": task.input, "byte_start": task.byte_start, "byte_end": task.byte_end,
        "first_line": task.first_line, "lines": task.lines, "documents": len(documents), "tokens": int(ids.shape[0]),
        "blank_lines": blank, "skipped": skipped,
    }
    _write_atomic(out / f"{task.name}.json", lambda f: f.write(_json_bytes(meta)))
    return meta


def _complete_shard(out: Path, task: ShardTask) -> dict[str, Any] | None:
    """The metadata of ``task``'s shard if an earlier run completed it, else None."""
    try:
        meta = json.loads((out / f"{task.name}.json").read_bytes())
    except FileNotFoundError:
        return None
    planned = (task.index, task.input, task.byte_start, task.byte_end)
    if (meta.get("shard"), meta.get("input"), meta.get("byte_start"), meta.get("byte_end")) != planned:
        return None
    if not all((out / f"{task.name}{suffix}").is_file() for suffix in ARRAY_SUFFIXES):
        return None
    return meta


# -- the plan -----------------------------------------------------------------------------


def _plan_file(path: str, input_index: int, first_shard: int, options: Options) -> tuple[dict, list[ShardTask]]:
    """Size, sha256 and shard tasks of one input, in one sequential read."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    digest = hashlib.sha256()
    tasks: list[ShardTask] = []
    shard_start, first_line, lines_in_shard, pos, last_byte = 0, 1, 0, 0, NEWLINE

    def close(end: int, n_lines: int) -> None:
        nonlocal shard_start, first_line, lines_in_shard
        tasks.append(ShardTask(first_shard + len(tasks), input_index, path, shard_start, end, first_line, n_lines))
        shard_start, first_line, lines_in_shard = end, first_line + n_lines, 0

    with f:
        while block := f.read(PLAN_BLOCK_BYTES):
            digest.update(block)
            ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == NEWLINE) + (pos + 1)  # line ends
            i = 0
            while i < len(ends):
                # the shard ends at the line that completes docs_per_shard lines or reaches max_shard_bytes
                by_count = i + options.docs_per_shard - lines_in_shard - 1
                by_bytes = int(np.searchsorted(ends, shard_start + options.max_shard_bytes, side="left"))
                k = min(by_count, by_bytes)
                if k >= len(ends):
                    lines_in_shard += len(ends) - i
                    break
                close(int(ends[k]), lines_in_shard + k - i + 1)
                i = k + 1
            pos += len(block)
            last_byte = block[-1]
    if pos > shard_start:  # the last lines; the very last one may lack its newline
        close(pos, lines_in_shard + (last_byte != NEWLINE))
    return {"path": path, "bytes": pos, "sha256": digest.hexdigest()}, tasks


def _plan(paths: list[str], options: Options) -> tuple[list[dict], list[ShardTask]]:
    inputs, tasks = [], []
    for index, path in enumerate(paths):
        info, file_tasks = _plan_file(path, index, len(tasks), options)
        inputs.append(info)
        tasks += file_tasks
    return inputs, tasks


# -- the manifest ---------------------------------------------------------------------------


def _identity(manifest: dict) -> dict:
    """What a resumed run must share with the run that started the directory."""
    return {
        "format": manifest.get("format"),
        "vocabulary_sha256": manifest.get("vocabulary_sha256"),
        "options": manifest.get("options"),
        "inputs": [(i.get("bytes"), i.get("sha256")) for i in manifest.get("inputs") or []],
    }


def _differences(old: dict, new: dict) -> str:
    if old["format"] != new["format"] or old["vocabulary_sha256"] != new["vocabulary_sha256"]:
        return "another format or vocabulary"
    if old["inputs"] != new["inputs"]:
        return "other inputs (by size and sha256)"
    changed = [f"{key} {old['options'].get(key)!r} there, {value!r} here"
               for key, value in new["options"].items() if (old["options"] or {}).get(key) != value]
    return "other options: " + "; ".join(changed)


def _start(out: Path, manifest: dict) -> None:
    """Check that ``out`` is new, empty or a run of the same identity; write the plan's manifest."""
    if (out / MANIFEST).is_file():
        try:
            old = json.loads((out / MANIFEST).read_bytes())
        except ValueError:
            raise CorpusError(f"{out / MANIFEST}: not a kimi_tok corpus manifest (invalid JSON)") from None
        old_id, new_id = _identity(old), _identity(manifest)
        if old_id != new_id:
            raise CorpusError(f"{out}: holds a corpus run with {_differences(old_id, new_id)}; "
                              "use a new directory, or the same inputs and options to resume")
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CorpusError(f"{out}: exists and is not a kimi_tok corpus directory (no {MANIFEST}); "
                          "use a new or empty directory")
    out.mkdir(parents=True, exist_ok=True)
    for leftover in out.glob(f".*{TMP_SUFFIX}"):  # from an interrupted run
        leftover.unlink()
    _write_atomic(out / MANIFEST, lambda f: f.write(_json_bytes(manifest)))


# -- running -----------------------------------------------------------------------------------


@contextmanager
def _dask_client(scheduler: str | None) -> Iterator[Any]:
    try:
        from distributed import Client, get_client
    except ImportError:
        raise ImportError("backend='dask' needs dask.distributed: pip install 'kimi_tok[dask]'") from None
    if scheduler is None:
        try:
            client = get_client()
        except ValueError:
            raise ValueError("backend='dask' needs a running distributed.Client, or scheduler='tcp://HOST:PORT'") from None
        yield client
        return
    with Client(scheduler) as client:
        yield client


def _results(tasks: list[ShardTask], options: Options, out: Path, on_error: str,
             n_jobs: int | None, backend: str, scheduler: str | None) -> Iterator[dict]:
    """Shard metadata as shards finish (in any order)."""
    from joblib import Parallel, delayed, parallel_config

    calls = (delayed(encode_shard)(task, options, str(out), on_error) for task in tasks)
    if backend != "dask":
        yield from Parallel(n_jobs=n_jobs or -1, backend=backend, return_as="generator_unordered")(calls)
        return
    with _dask_client(scheduler) as client, parallel_config(backend="dask", client=client):
        yield from Parallel(n_jobs=n_jobs or -1, return_as="generator_unordered")(calls)


@contextmanager
def _progress(total: int, done: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    """``advance(n_lines)``: a tqdm bar on stderr if tqdm is installed, else a plain counter."""
    if not enabled:
        yield lambda n: None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        count = [done]

        def advance(n: int) -> None:
            count[0] += n
            print(f"\rkimi-tok corpus: {count[0]:,}/{total:,} lines", end="", file=sys.stderr, flush=True)

        yield advance
        print(file=sys.stderr)
        return
    with tqdm(total=total, initial=done, unit="line", file=sys.stderr) as bar:
        yield bar.update


def _check_arguments(inputs, n_jobs, backend, scheduler, on_error) -> tuple[list[str], str]:
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    paths = list(inputs)
    if not paths or not all(isinstance(p, (str, os.PathLike)) for p in paths):
        raise TypeError("inputs must be a path or a non-empty list of paths (str or Path)")
    if n_jobs is not None and (isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1):
        raise ValueError(f"n_jobs must be a positive int or None (all cores / all Dask workers), not {n_jobs!r}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'stop' or 'skip', not {on_error!r}")
    backend = backend or ("dask" if scheduler is not None else "loky")
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a joblib backend name such as 'loky' or 'dask', not {type(backend).__name__}")
    if scheduler is not None and backend != "dask":
        raise ValueError(f"scheduler={scheduler!r} is a Dask scheduler address, but backend={backend!r}")
    return [os.fspath(p) for p in paths], backend


def _check_options(options: Options) -> None:
    for name in ("text_field", "segments_field"):
        value = getattr(options, name)
        if not (isinstance(value, str) or (value is None and name == "segments_field")):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    for name in ("allow_special", "tiktoken_safe"):
        if not isinstance(getattr(options, name), bool):
            raise TypeError(f"{name} must be a bool, not {type(getattr(options, name)).__name__}")
    for name in ("docs_per_shard", "max_shard_bytes"):
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, not {value!r}")


def encode_corpus(
    inputs: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    text_field: str = "text",
    segments_field: str | None = None,
    allow_special: bool = False,
    tiktoken_safe: bool = True,
    docs_per_shard: int = DEFAULT_DOCS_PER_SHARD,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    n_jobs: int | None = None,
    backend: str | None = None,
    scheduler: str | None = None,
    on_error: str = "stop",
    progress: bool = False,
) -> CorpusSummary:
    """Tokenize JSONL ``inputs`` into shards in ``out_dir`` (see the module docstring); resumable.

    ``backend``: a joblib backend, "loky" (local processes, the default) or "dask" (the
    current ``distributed.Client``, or a new one for ``scheduler="tcp://HOST:PORT"``; giving
    ``scheduler`` implies "dask"). ``n_jobs``: workers (default: all cores / all Dask workers).
    ``on_error``: "stop" raises ``CorpusError`` at a bad record; "skip" leaves it out and
    lists it in ``errors.jsonl``. ``progress``: a progress bar on stderr.

    >>> encode_corpus(["chats.jsonl"], "chats.tok", segments_field="segments", n_jobs=8)  # doctest: +SKIP
    CorpusSummary(out_dir=PosixPath('chats.tok'), documents=120000, tokens=98000000, ...)
    """
    start_time = time.perf_counter()
    paths, backend = _check_arguments(inputs, n_jobs, backend, scheduler, on_error)
    options = Options(text_field, segments_field, allow_special, tiktoken_safe, docs_per_shard, max_shard_bytes)
    _check_options(options)
    out = Path(out_dir)
    input_info, tasks = _plan(paths, options)
    manifest: dict[str, Any] = {
        "format": FORMAT, "complete": False, "tokenizer": "kimi_k3", "vocabulary_sha256": KIMI_K3_SHA256,
        "ids_dtype": "uint32", "offsets_dtype": "int64", "options": asdict(options), "on_error": on_error,
        "inputs": input_info,
        "shards": [{"name": t.name, "input": t.input, "byte_start": t.byte_start, "byte_end": t.byte_end,
                    "first_line": t.first_line, "lines": t.lines} for t in tasks],
    }
    _start(out, manifest)
    done = {t.index: meta for t in tasks if (meta := _complete_shard(out, t)) is not None}
    resumed = len(done)
    if on_error == "stop":  # a shard completed by an earlier run with on_error="skip"
        for task in tasks:
            if task.index in done and done[task.index]["skipped"]:
                first = done[task.index]["skipped"][0]
                raise CorpusError(f"{task.path}:{first['line']}: {first['reason']}")
    todo = [t for t in tasks if t.index not in done]
    with _progress(sum(t.lines for t in tasks), sum(t.lines for t in tasks if t.index in done), progress) as advance:
        for meta in _results(todo, options, out, on_error, n_jobs, backend, scheduler):
            done[meta["shard"]] = meta
            advance(meta["lines"])
    metas = [done[t.index] for t in tasks]
    errors = [{"file": paths[m["input"]], "line": s["line"], "reason": s["reason"]} for m in metas for s in m["skipped"]]
    _write_atomic(out / ERRORS, lambda f: f.writelines(
        (json.dumps(e, ensure_ascii=False) + "\n").encode("utf-8") for e in errors))
    totals = {key: sum(m[key] for m in metas) for key in ("documents", "tokens", "blank_lines")}
    for entry, meta in zip(manifest["shards"], metas):
        entry.update(documents=meta["documents"], tokens=meta["tokens"], blank_lines=meta["blank_lines"],
                     skipped=len(meta["skipped"]))
    manifest.update(complete=True, **totals, skipped=len(errors))
    _write_atomic(out / MANIFEST, lambda f: f.write(_json_bytes(manifest)))
    encoded = [done[t.index] for t in todo]
    return CorpusSummary(
        out, totals["documents"], totals["tokens"], len(errors), totals["blank_lines"], len(tasks), resumed,
        sum(m["documents"] for m in encoded), sum(m["tokens"] for m in encoded), time.perf_counter() - start_time,
    )


# -- reading --------------------------------------------------------------------------------


class Corpus:
    """The documents of a finished ``encode_corpus`` run, as memory-mapped ``uint32`` ids.

    >>> corpus = Corpus("train.tok")           # doctest: +SKIP
    >>> len(corpus), corpus.n_tokens           # doctest: +SKIP
    (1000, 250000)
    >>> corpus[0]                              # doctest: +SKIP
    memmap([22931, 2695], dtype=uint32)
    >>> corpus.source(0)                       # doctest: +SKIP
    ('train.jsonl', 1)
    """

    def __init__(self, out_dir: str | os.PathLike) -> None:
        out = Path(out_dir)
        try:
            manifest = json.loads((out / MANIFEST).read_bytes())
        except FileNotFoundError:
            raise FileNotFoundError(f"{out}: no {MANIFEST}; not a kimi_tok corpus directory") from None
        if manifest.get("format") != FORMAT:
            raise ValueError(f"{out / MANIFEST}: format {manifest.get('format')!r}, expected {FORMAT!r}")
        if not manifest.get("complete"):
            raise ValueError(f"{out}: the run did not finish; run encode_corpus / kimi-tok corpus again to resume it")
        self.out_dir = out
        self.manifest = manifest
        names = [s["name"] for s in manifest["shards"]]
        self._ids = [np.load(out / f"{n}.ids.npy", mmap_mode="r") for n in names]
        self._offsets = [np.load(out / f"{n}.offsets.npy", mmap_mode="r") for n in names]
        self._lines = [np.load(out / f"{n}.lines.npy", mmap_mode="r") for n in names]
        self._first_document = np.zeros(len(names) + 1, dtype=np.int64)
        np.cumsum([s["documents"] for s in manifest["shards"]], out=self._first_document[1:])

    def __len__(self) -> int:
        return int(self._first_document[-1])

    @property
    def n_tokens(self) -> int:
        """Tokens in all documents."""
        return int(self.manifest["tokens"])

    def _locate(self, index: int) -> tuple[int, int]:
        """``(shard, document within it)`` of a document number (negative counts from the end)."""
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"document index must be an int, not {type(index).__name__}")
        n = len(self)
        k = int(index) + n if index < 0 else int(index)
        if not 0 <= k < n:
            raise IndexError(f"document {index} is out of range for a corpus of {n:,} documents")
        shard = int(np.searchsorted(self._first_document, k, side="right")) - 1
        return shard, k - int(self._first_document[shard])

    def __getitem__(self, index: int) -> np.ndarray:
        """The ids of document ``index`` (a read-only view of the memory-mapped shard)."""
        shard, j = self._locate(index)
        offsets = self._offsets[shard]
        return self._ids[shard][int(offsets[j]):int(offsets[j + 1])]

    def __iter__(self) -> Iterator[np.ndarray]:
        for ids, offsets in zip(self._ids, self._offsets):
            for j in range(len(offsets) - 1):
                yield ids[int(offsets[j]):int(offsets[j + 1])]

    def source(self, index: int) -> tuple[str, int]:
        """``(input path, 1-based line)`` that document ``index`` came from."""
        shard, j = self._locate(index)
        entry = self.manifest["shards"][shard]
        return self.manifest["inputs"][entry["input"]]["path"], int(self._lines[shard][j])
