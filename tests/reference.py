"""The reference Kimi K3 tokenizer: tiktoken plus the official "tiktoken-safe" chunking.

This is a plain, readable transcription of /work/shared/kimi-k3/README.md. It is slow on
purpose (the whitespace-run cut is a Python loop, exactly like the official tokenizer) and
is the ground truth that kimi_tok must match id for id.

    >>> ref = Reference()
    >>> ref.encode_segments([("<|open|>", True), ("hi <|open|>", False)])  # doctest: +SKIP
    [163587, ...]

The shared data directory is ``$KIMI_K3_DIR`` or, by default, ``<repo>/../shared/kimi-k3``.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import tiktoken
import tiktoken.load

__all__ = [
    "MAX_PIECE_CHARS",
    "MAX_RUN_CHARS",
    "Reference",
    "data_dir",
    "make_reference_encoding",
    "safe_substrings",
]

MAX_PIECE_CHARS = 400_000  # step 1: pieces of at most this many code points
MAX_RUN_CHARS = 25_000  # step 2: no more than this many same-kind characters in a row

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """Directory holding tiktoken.model, pattern.txt and special_tokens.json."""
    return Path(os.environ.get("KIMI_K3_DIR", REPO_ROOT.parent / "shared" / "kimi-k3"))


def load_pattern() -> str:
    """The pre-tokenization regex (Rust regex syntax, as tiktoken wants it)."""
    return (data_dir() / "pattern.txt").read_text(encoding="utf-8").strip("\r\n")


def load_special_tokens() -> dict[str, int]:
    """The 256 special tokens, name -> id (163584..163839)."""
    with open(data_dir() / "special_tokens.json", encoding="utf-8") as f:
        return {name: int(i) for name, i in json.load(f).items()}


@functools.lru_cache(maxsize=None)
def make_reference_encoding() -> tiktoken.Encoding:
    """The tiktoken Encoding the model's own Python tokenizer wraps (built once, cached)."""
    return tiktoken.Encoding(
        name="kimi_k3",
        pat_str=load_pattern(),
        mergeable_ranks=tiktoken.load.load_tiktoken_bpe(str(data_dir() / "tiktoken.model")),
        special_tokens=load_special_tokens(),
    )


def _split_long_runs(piece: str, max_run: int = MAX_RUN_CHARS) -> Iterable[str]:
    """Step 2: cut ``piece`` so no sub-string holds more than ``max_run`` same-kind chars in a row.

    "Kind" is ``str.isspace()``. A change of kind starts a new run of length 1; when a run
    reaches ``max_run + 1`` we cut just before that character, which then counts as a run of
    length 1 in the next sub-string. The last sub-string is always yielded, even when empty.
    """
    start = 0
    run_len = 0
    run_is_space = piece[0].isspace() if piece else False
    for i, ch in enumerate(piece):
        is_space = ch.isspace()
        if is_space != run_is_space:
            run_is_space = is_space
            run_len = 1
            continue
        run_len += 1
        if run_len > max_run:
            yield piece[start:i]
            start = i
            run_len = 1
    yield piece[start:]


def safe_substrings(text: str) -> list[str]:
    """Steps 1-2: the sub-strings that tiktoken-safe chunking encodes one by one.

    Step 1 cuts ``text`` into pieces of at most 400,000 code points (empty text gives no
    pieces, like ``range(0, 0, 400000)``); step 2 cuts each piece at long same-kind runs.
    """
    return [
        sub
        for start in range(0, len(text), MAX_PIECE_CHARS)
        for sub in _split_long_runs(text[start : start + MAX_PIECE_CHARS])
    ]


class Reference:
    """Encode text or rendered-chat segments exactly like the official K3 tokenizer."""

    def __init__(self) -> None:
        self.enc = make_reference_encoding()

    def _encode_one(self, sub: str, allow_special: bool) -> list[int]:
        """Step 3: one tiktoken call. Without allow_special, control-token text is plain text."""
        if allow_special:
            return self.enc.encode(sub, allowed_special="all")
        return self.enc.encode(sub, disallowed_special=())

    def encode(self, text: str, allow_special: bool = False, tiktoken_safe: bool = True) -> list[int]:
        """Ids of one segment; with ``tiktoken_safe=False`` the whole text is one tiktoken call."""
        subs = safe_substrings(text) if tiktoken_safe else [text]
        ids: list[int] = []
        for sub in subs:
            ids.extend(self._encode_one(sub, allow_special))
        return ids

    def encode_segments(
        self, segments: Sequence[tuple[str, bool]], tiktoken_safe: bool = True
    ) -> list[int]:
        """Ids of a rendered chat: each ``(text, allow_special)`` segment encoded alone, concatenated."""
        ids: list[int] = []
        for text, allow_special in segments:
            ids.extend(self.encode(text, allow_special, tiktoken_safe))
        return ids
