"""The reference Kimi K3 tokenizer: tiktoken plus the official "tiktoken-safe" chunking.

Built from the package's own sha256-checked copy of the vocabulary, its 256 special tokens and
its pattern, so that the suite passes in any clone; ``tests/api/test_reference_data.py`` checks
that copy against ``../shared/kimi-k3/`` (or ``$KIMI_K3_DIR``) where it exists. The vocabulary
is parsed here the way tiktoken's own loader does (base64, rank), independently of kimi_tok's
compiled parser, and the encoding is ``kimi_tok.interop.tiktoken_compat.reference_ids`` (the
function ``kimi-tok verify`` uses): each sub-string of the readable chunking spec
(``kimi_tok._educational.safe_substrings``) one tiktoken call. Slow on purpose: it is the
ground truth that kimi_tok must match id for id.

    >>> Reference().encode_segments([("<|open|>", True), ("hi <|open|>", False)])  # doctest: +SKIP
    [163587, ...]
"""

from __future__ import annotations

import atexit
import base64
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import tiktoken

from kimi_tok import KIMI_PATTERN
from kimi_tok._educational import safe_substrings
from kimi_tok.interop.tiktoken_compat import reference_ids
from kimi_tok.pipeline.chunking import MAX_CHUNK_CHARS as MAX_PIECE_CHARS, MAX_RUN_CHARS
from kimi_tok.vocab.kimi_k3 import kimi_k3_model_bytes, kimi_k3_special_tokens

__all__ = ["MAX_PIECE_CHARS", "MAX_RUN_CHARS", "Reference", "data_dir", "load_pattern", "load_special_tokens",
           "make_reference_encoding", "mergeable_ranks", "safe_substrings", "shared_data_dir"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """Where the published K3 files may lie beside this clone: ``$KIMI_K3_DIR``, else ``../shared/kimi-k3``."""
    return Path(os.environ.get("KIMI_K3_DIR", REPO_ROOT.parent / "shared" / "kimi-k3"))


@functools.lru_cache(maxsize=None)
def data_dir() -> Path:
    """A folder laid out like ``../shared/kimi-k3`` (``tiktoken.model``, ``special_tokens.json``,
    ``pattern.txt``), written once per test process from the package's copy, for tests of loading."""
    folder = Path(tempfile.mkdtemp(prefix="kimi_tok_k3_data_"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "tiktoken.model").write_bytes(kimi_k3_model_bytes())
    (folder / "special_tokens.json").write_text(json.dumps(kimi_k3_special_tokens(), indent=1), "utf-8")
    (folder / "pattern.txt").write_text(KIMI_PATTERN + "\n", "utf-8")
    return folder


def load_pattern() -> str:
    """The pre-tokenization regex (Rust regex syntax, as tiktoken wants it)."""
    return KIMI_PATTERN


def load_special_tokens() -> dict[str, int]:
    """The 256 special tokens, name -> id (163584..163839)."""
    return kimi_k3_special_tokens()


def parse_ranks(model: bytes) -> dict[bytes, int]:
    """``{token bytes: rank}`` of a ``tiktoken.model`` file, as ``tiktoken.load.load_tiktoken_bpe`` reads it."""
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in model.splitlines() if line)}


@functools.lru_cache(maxsize=None)
def mergeable_ranks() -> dict[bytes, int]:
    """The embedded K3 vocabulary (checked against its sha256 when read)."""
    return parse_ranks(kimi_k3_model_bytes())


@functools.lru_cache(maxsize=None)
def make_reference_encoding() -> tiktoken.Encoding:
    """The tiktoken Encoding the model's own Python tokenizer wraps (built once, cached)."""
    return tiktoken.Encoding(name="kimi_k3", pat_str=KIMI_PATTERN, mergeable_ranks=mergeable_ranks(),
                             special_tokens=kimi_k3_special_tokens())


class Reference:
    """Encode text or rendered-chat segments exactly like the official K3 tokenizer."""

    def __init__(self) -> None:
        self.enc = make_reference_encoding()

    def encode(self, text: str, allow_special: bool = False, tiktoken_safe: bool = True) -> list[int]:
        """Ids of one segment; with ``tiktoken_safe=False`` the whole text is one tiktoken call."""
        return reference_ids(self.enc, [(text, allow_special)], tiktoken_safe)

    def encode_segments(self, segments: Sequence[tuple[str, bool]], tiktoken_safe: bool = True) -> list[int]:
        """Ids of a rendered chat: each ``(text, allow_special)`` segment encoded alone, concatenated."""
        return reference_ids(self.enc, segments, tiktoken_safe)
