"""Hugging Face interop: a ``tokenizer.json`` for a kimi_tok vocabulary (``Tokenizer.to_tokenizer_json``).

    >>> tok = kimi_tok.kimi_k3()
    >>> tok.to_tokenizer_json("tokenizer.json")  # doctest: +SKIP
    >>> hf = tokenizers.Tokenizer.from_file("tokenizer.json")  # doctest: +SKIP
    >>> hf.encode("hello world", add_special_tokens=False).ids  # doctest: +SKIP
    [22931, 2695]

What the file holds:

* a byte-level ``BPE`` model: the vocabulary in GPT-2's byte alphabet, one merge per
  token (see ``bpe_split``), ``ignore_merges=True`` so a piece that is a whole token is
  that token, as in tiktoken;
* pre-tokenizers: the pattern as a ``Split`` regex (``behavior: isolated``), then
  ``ByteLevel`` (no prefix space, no regex of its own); a ``ByteLevel`` decoder;
* the special tokens as added tokens with ``special: true``.

Loaded with the ``tokenizers`` package it gives kimi_tok's ids with
``tiktoken_safe=False``: one segment ``(text, allow_special)`` is
``hf.encode(text, add_special_tokens=False)``, with ``hf.encode_special_tokens =
not allow_special``. tokenizer.json cannot express the tiktoken-safe chunking (the
400,000-character chunks and 25,000-character run cuts), so texts that chunking cuts
(a run of more than 25,000 same-kind characters, or more than 400,000 characters)
may get different ids than the official K3 tokenizer.

The ``tokenizers`` wheels run the ``Split`` regex with Oniguruma, which reads the
pattern as written: ``\\p{Han}`` is the Han script and ``[A&&[^B]]`` a class
intersection, as in tiktoken's Rust regex. With ``tokenizers`` 0.23.3 the ids were
identical to kimi_tok's on every Unicode scalar value, each encoded on its own in 12
contexts (alone, between letters, after a space or an apostrophe, before ``'ll``, ...),
so no Unicode-table difference shows; ``tests/test_hf_export.py`` re-checks that (and
generated chats) for the installed version. Known differences, both by construction:

* tiktoken-safe chunking (above);
* lone surrogates: ``tokenizers`` accepts only valid Unicode (``TypeError``), while
  tiktoken first replaces them, ``text.encode("utf-16", "surrogatepass").decode("utf-16",
  "replace")``; do that before calling ``tokenizers``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..pipeline.decode import byte_level

if TYPE_CHECKING:  # pragma: no cover
    from ..tokenizer import Tokenizer


def bpe_split(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The two tokens whose merge makes ``token`` when tiktoken's BPE runs on its bytes.

    tiktoken merges the adjacent pair whose concatenation has the lowest rank
    (leftmost on ties). Run on ``token``'s own bytes, the last merge joins the
    pair returned here; whenever BPE builds ``token`` inside a longer piece, it
    joins this same pair. ``None`` when BPE never reaches ``token`` (it can then
    only be a whole piece). "The split with the lowest max(rank(a), rank(b))" is
    not the same: for ``b"quest"`` that is ``qu+est``, BPE joins ``que+st``.

    >>> bpe_split(b"quest", ranks)
    (b'que', b'st')
    """
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_at = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_at = rank, i
        if best_rank is None:
            return None
        parts[best_at : best_at + 2] = [parts[best_at] + parts[best_at + 1]]
    return (parts[0], parts[1]) if len(parts) == 2 else None


def merges_by_rank(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per reachable multi-byte token, in rank order (a merge's priority is its token's rank)."""
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda item: item[1]):
        split = bpe_split(token, ranks) if len(token) > 1 else None
        if split is not None:
            merges.append(split)
    return merges


def _added_token(text: str, id_: int) -> dict[str, Any]:
    return {
        "id": id_,
        "content": text,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def _bpe_model(ranks: dict[bytes, int]) -> dict[str, Any]:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": True,
        "vocab": {byte_level(token): rank for token, rank in ranks.items()},
        "merges": [[byte_level(a), byte_level(b)] for a, b in merges_by_rank(ranks)],
    }


def _pre_tokenizer(pattern: str) -> dict[str, Any]:
    return {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ],
    }


def tokenizer_json(tok: Tokenizer, path: str | Path | None = None) -> dict[str, Any]:
    """The ``tokenizer.json`` of ``tok`` as a dict; written (UTF-8 JSON) to ``path`` when given.

    >>> data = tokenizer_json(kimi_tok.kimi_k3())
    >>> data["model"]["type"], len(data["added_tokens"])
    ('BPE', 256)
    """
    specials = sorted(tok.special_tokens.items(), key=lambda item: item[1])
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(text, id_) for text, id_ in specials],
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(tok.pattern),
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": _bpe_model(tok.mergeable_ranks()),
    }
    if path is not None:
        Path(path).write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return data
