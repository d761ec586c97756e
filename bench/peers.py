"""The other tokenizers, each built for the Kimi K3 vocabulary, behind one interface.

Every loader returns a :class:`Peer` with two functions:

* ``encode(text)``: one plain text, special-token strings as text, no tiktoken-safe chunking
  (what ``tiktoken.Encoding.encode(text, disallowed_special=())`` computes): the per-kind table;
* ``encode_segments(segments)``: ``(text, allow_special)`` segments, each with the official
  tiktoken-safe chunking (400,000-character chunks, cuts in 25,000-character runs of one kind):
  the serving path. A peer with a native segments API gets one call (basetenkenizer
  ``encode_segments(tiktoken_safe=True)``; fastokens ``encode_segments`` on the sub-strings,
  since it does not chunk); the others run the chunking and one call per sub-string in a Python
  loop, as their users must.

The chunking for those loops is :func:`safe_substrings`, equal to the readable spec
``kimi_tok._educational.safe_substrings`` (tested in tests/bench/test_bench_tools.py) but fast:
a text of at most 25,000 characters is its own sub-string, and a longer one is probed every
25,000 characters (a longer run must cover a probe), so the loop costs the peers almost nothing
beyond the slicing. That keeps the comparison about the tokenizers.

All are built from the package's embedded, sha256-checked K3 files
(``kimi_tok.vocab.kimi_k3.kimi_k3_model_bytes()``, ``kimi_k3_special_tokens()``,
``KIMI_PATTERN``); files the peers need on disk go to ``~/.cache/kimi_tok_bench/``.

Threads: set ``RAYON_NUM_THREADS=1`` and ``FASTOKENS_BPE_THREADS=1`` (see :data:`ONE_THREAD_ENV`)
before this module imports a peer to keep every peer on one thread.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.realtext import CACHE_DIR  # noqa: E402
from kimi_tok.pipeline.chunking import MAX_CHUNK_CHARS, MAX_RUN_CHARS  # noqa: E402
from kimi_tok.vocab.kimi_k3 import KIMI_PATTERN, kimi_k3_model_bytes, kimi_k3_special_tokens  # noqa: E402

Segments = Sequence[tuple[str, bool]]
Ids = Sequence[int] | np.ndarray

PEERS = ("gigatoken", "fastokens", "splintr", "hf_tokenizers", "basetenkenizer", "tiktoken")
DISTRIBUTIONS = {"gigatoken": "gigatoken", "fastokens": "fastokens", "splintr": "splintr-rs",
                 "hf_tokenizers": "tokenizers", "basetenkenizer": "basetenkenizer", "tiktoken": "tiktoken"}
# The versions the bench extra pins and the tables in docs/performance.md were measured with.
PINNED = {"gigatoken": "0.10.0", "fastokens": "0.3.5", "splintr": "0.22.0", "hf_tokenizers": "0.23.3",
          "basetenkenizer": "0.2.8", "tiktoken": "0.14.0"}
# Every peer on one thread: rayon's pool and fastokens' own BPE workers.
ONE_THREAD_ENV = {"RAYON_NUM_THREADS": "1", "RAYON_RS_NUM_CPUS": "1", "FASTOKENS_BPE_THREADS": "1",
                  "TOKENIZERS_PARALLELISM": "false", "KIMI_TOK_N_JOBS": "1"}


@dataclass
class Peer:
    name: str
    version: str
    encode: Callable[[str], Ids]
    encode_segments: Callable[[Segments], Ids]
    how: str  # how the serving path calls it, for the tables' notes

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


# --------------------------------------------------------------------------------------------
# tiktoken-safe chunking, fast and exact
# --------------------------------------------------------------------------------------------

_RUN_TO_END = {True: re.compile(r"\s*"), False: re.compile(r"\S*")}
_LAST_OTHER = {True: re.compile(r".*\S", re.S), False: re.compile(r".*\s", re.S)}


def safe_substrings(text: str) -> list[str]:
    """The tiktoken-safe sub-strings of ``text``, equal to ``kimi_tok._educational.safe_substrings``.

    A run of one kind (``str.isspace``; Python's ``re`` ``\\s`` is the same set) longer than 25,000
    characters covers a multiple of 25,000, so only those positions are looked at.

    >>> [len(s) for s in safe_substrings("a" * 60_000)]
    [25000, 25000, 10000]
    """
    if len(text) <= MAX_RUN_CHARS:
        return [text] if text else []
    out: list[str] = []
    for chunk_start in range(0, len(text), MAX_CHUNK_CHARS):
        chunk = text[chunk_start:chunk_start + MAX_CHUNK_CHARS]
        n, start, probe = len(chunk), 0, 0
        while n > MAX_RUN_CHARS and probe < n:
            space = chunk[probe].isspace()
            end = _RUN_TO_END[space].match(chunk, probe).end()
            before = _LAST_OTHER[space].match(chunk, 0, probe)
            run_start = before.end() if before else 0
            if end - run_start > MAX_RUN_CHARS:
                for cut in range(run_start + MAX_RUN_CHARS, end, MAX_RUN_CHARS):
                    out.append(chunk[start:cut])
                    start = cut
                probe = -(-end // MAX_RUN_CHARS) * MAX_RUN_CHARS  # the next probe after this run
            else:
                probe += MAX_RUN_CHARS
        out.append(chunk[start:])
    return out


def loop_segments(encode_plain: Callable[[str], Ids], encode_special: Callable[[str], Ids],
                  as_array: bool) -> Callable[[Segments], Ids]:
    """A serving-path function for a peer without a segments API: the chunking, then one call per
    sub-string (``encode_special`` where the segment allows special tokens)."""
    if as_array:
        def encode_segments(segments: Segments) -> np.ndarray:
            parts = [(encode_special if allow else encode_plain)(sub)
                     for text, allow in segments for sub in safe_substrings(text)]
            return np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    else:
        def encode_segments(segments: Segments) -> list[int]:
            ids: list[int] = []
            for text, allow in segments:
                fn = encode_special if allow else encode_plain
                for sub in safe_substrings(text):
                    ids += fn(sub)
            return ids
    return encode_segments


# --------------------------------------------------------------------------------------------
# Files the peers load
# --------------------------------------------------------------------------------------------


def _cached_file(name: str, data: bytes) -> Path:
    path = CACHE_DIR / name
    if not path.exists() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def model_path() -> Path:
    """The K3 ``tiktoken.model`` (the package's copy) on disk, for loaders that want a path."""
    return _cached_file("kimi_k3.tiktoken", kimi_k3_model_bytes())


def tokenizer_json_path() -> Path:
    """``kimi_k3().to_tokenizer_json()``: the Hugging Face form of the K3 tokenizer."""
    import kimi_tok

    key = hashlib.sha256(kimi_k3_model_bytes() + KIMI_PATTERN.encode()).hexdigest()[:16]
    path = CACHE_DIR / f"kimi_k3_tokenizer_{key}.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        kimi_tok.kimi_k3().to_tokenizer_json(str(tmp))
        tmp.replace(path)
    return path


def basetenkenizer_json() -> str:
    """The tokenizer.json basetenkenizer builds from tiktoken.model (slow, so cached on disk)."""
    import basetenkenizer.tiktoken

    special = kimi_k3_special_tokens()
    key = hashlib.sha256(
        kimi_k3_model_bytes() + KIMI_PATTERN.encode() + json.dumps(special, sort_keys=True).encode()
    ).hexdigest()
    cached, key_file = CACHE_DIR / "basetenkenizer.json", CACHE_DIR / "basetenkenizer.key"
    if cached.exists() and key_file.exists() and key_file.read_text() == key:
        return cached.read_text(encoding="utf-8")
    js = basetenkenizer.tiktoken.tiktoken_model_to_tokenizer_json(
        str(model_path()), pattern=KIMI_PATTERN, special_tokens=special
    )
    if js is None:
        raise RuntimeError("tiktoken_model_to_tokenizer_json returned None")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cached.write_text(js, encoding="utf-8")
    key_file.write_text(key)
    return js


# --------------------------------------------------------------------------------------------
# The peers
# --------------------------------------------------------------------------------------------


def load_gigatoken() -> Peer:
    import gigatoken

    # gigatoken takes a named pre-tokenizer, not a regex: "kimi" is its K3 scheme (the ids are checked)
    plain = gigatoken.Tokenizer.from_tiktoken(str(model_path()), pretokenizer="kimi")
    special = gigatoken.Tokenizer.from_tiktoken(str(model_path()), pretokenizer="kimi",
                                                special_tokens=kimi_k3_special_tokens())
    return Peer("gigatoken", _version("gigatoken"), plain.encode,
                loop_segments(plain.encode, special.encode, as_array=True),
                "Python loop over sub-strings, Tokenizer.encode each")


def load_fastokens() -> Peer:
    import fastokens

    tk = fastokens.Tokenizer.from_tiktoken(str(model_path()), pattern=KIMI_PATTERN,
                                           special_tokens=kimi_k3_special_tokens())

    def encode_segments(segments: Segments) -> list[int]:
        # encode_segments does not chunk: hand it the tiktoken-safe sub-strings
        return tk.encode_segments([(sub, allow) for text, allow in segments for sub in safe_substrings(text)]).ids

    return Peer("fastokens", _version("fastokens"), lambda text: tk.encode(text, split_special_tokens=True).ids,
                encode_segments, "encode_segments on the sub-strings (one call)")


def load_splintr() -> Peer:
    import splintr

    tk = splintr.Tokenizer.from_bytes(kimi_k3_model_bytes(), KIMI_PATTERN, kimi_k3_special_tokens())

    def plain(text: str) -> np.ndarray:  # encode matches no special token on a Tokenizer built like this
        return np.frombuffer(tk.encode_flat(text), dtype=np.uint32)

    def special(text: str) -> np.ndarray:
        return np.asarray(tk.encode_with_special(text), dtype=np.uint32)

    return Peer("splintr", _version("splintr"), plain, loop_segments(plain, special, as_array=True),
                "Python loop over sub-strings, encode_flat / encode_with_special each")


def load_hf_tokenizers() -> Peer:
    import tokenizers

    path = str(tokenizer_json_path())
    plain, special = tokenizers.Tokenizer.from_file(path), tokenizers.Tokenizer.from_file(path)
    plain.encode_special_tokens = True  # special-token strings stay text

    def enc_plain(text: str) -> list[int]:
        return plain.encode(text, add_special_tokens=False).ids

    def enc_special(text: str) -> list[int]:
        return special.encode(text, add_special_tokens=False).ids

    return Peer("hf_tokenizers", _version("hf_tokenizers"), enc_plain,
                loop_segments(enc_plain, enc_special, as_array=False),
                "Python loop over sub-strings, Tokenizer.encode each")


def load_basetenkenizer() -> Peer:
    import basetenkenizer

    tk = basetenkenizer.Tokenizer.from_json_str(basetenkenizer_json())

    def encode(text: str) -> np.ndarray:
        return tk.encode_segments([(text, False)], tiktoken_safe=False).into_numpy()["ids"]

    def encode_segments(segments: Segments) -> np.ndarray:
        return tk.encode_segments(list(segments), tiktoken_safe=True).into_numpy()["ids"]

    return Peer("basetenkenizer", _version("basetenkenizer"), encode, encode_segments,
                "encode_segments(tiktoken_safe=True) (one call)")


def load_tiktoken() -> Peer:
    from tests.reference import make_reference_encoding

    enc = make_reference_encoding()

    def plain(text: str) -> list[int]:
        return enc.encode(text, disallowed_special=())

    def special(text: str) -> list[int]:
        return enc.encode(text, allowed_special="all")

    return Peer("tiktoken", _version("tiktoken"), plain, loop_segments(plain, special, as_array=False),
                "Python loop over sub-strings, Encoding.encode each (the reference's own calls)")


def load_broken() -> Peer:
    """A deliberately wrong peer (tiktoken with its last id of every call changed), for the smoke
    test: the bench must report it and leave it out of "best"."""
    right = load_tiktoken()

    def wrong(ids: list[int]) -> list[int]:
        return ids[:-1] + [(ids[-1] + 1) % 163_584] if ids else ids

    return Peer("_broken", "test", lambda text: wrong(right.encode(text)),
                lambda segments: wrong(list(right.encode_segments(segments))), "tiktoken, last id changed")


LOADERS: dict[str, Callable[[], Peer]] = {
    "gigatoken": load_gigatoken, "fastokens": load_fastokens, "splintr": load_splintr,
    "hf_tokenizers": load_hf_tokenizers, "basetenkenizer": load_basetenkenizer, "tiktoken": load_tiktoken,
    "_broken": load_broken,
}


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(DISTRIBUTIONS[name])
    except importlib.metadata.PackageNotFoundError:
        return "?"


def load_peers(names: Sequence[str], warmup: str = "hello world <|open|> 你好") -> tuple[dict[str, Peer], dict[str, str]]:
    """The peers that load (and survive one small call of each function), and why others did not."""
    peers, skipped = {}, {}
    for name in names:
        try:
            peer = LOADERS[name]()
            peer.encode(warmup)
            peer.encode_segments([(warmup, True), (warmup, False)])
        except Exception as exc:  # a missing or broken peer must not stop the bench
            skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            continue
        peers[name] = peer
        if peer.version != PINNED.get(name, peer.version):
            skipped.setdefault(f"{name} version", f"{peer.version} installed; the docs' tables used {PINNED[name]}")
    return peers, skipped


def as_ids(ids: Ids) -> np.ndarray:
    """Any peer's result as a uint32 array (outside the timed region)."""
    return ids if isinstance(ids, np.ndarray) and ids.dtype == np.uint32 else np.asarray(ids, dtype=np.uint32)


def first_difference(expected: np.ndarray, got: np.ndarray) -> int | None:
    """The first index where two id arrays differ, or None when they are equal."""
    n = min(len(expected), len(got))
    diff = np.flatnonzero(expected[:n] != got[:n])
    if len(diff):
        return int(diff[0])
    return None if len(expected) == len(got) else n
