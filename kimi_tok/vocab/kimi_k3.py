"""The Kimi K3 tokenizer's data as the package ships it: vocabulary, special tokens, pattern.

``data/kimi_k3.tiktoken.gz`` is Moonshot's ``tiktoken.model`` (163,584 ranks), gzipped and
checked against the published file's sha256 at every load; ``data/kimi_k3_special_tokens.json``
holds the 256 special tokens; ``KIMI_PATTERN`` is ``pattern.txt``. ``data/LICENSE-KIMI-K3`` is
the license every copy of the vocabulary carries.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from importlib import resources

from .files import Vocabulary, parse_well_formed_tiktoken_bpe

KIMI_K3_SHA256 = "b6c497a7469b33ced9c38afb1ad6e47f03f5e5dc05f15930799210ec050c5103"
KIMI_K3_VOCAB = "kimi_k3.tiktoken.gz"
KIMI_K3_SPECIALS = "kimi_k3_special_tokens.json"

KIMI_PATTERN = (
    r"[\p{Han}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


def kimi_k3_model_bytes() -> bytes:
    """The embedded ``tiktoken.model`` file, checked against its sha256."""
    raw = gzip.decompress(resources.files("kimi_tok.data").joinpath(KIMI_K3_VOCAB).read_bytes())
    digest = hashlib.sha256(raw).hexdigest()
    if digest != KIMI_K3_SHA256:
        raise ValueError(
            f"kimi_tok/data/{KIMI_K3_VOCAB}: sha256 {digest} does not match the Kimi K3 vocabulary "
            f"({KIMI_K3_SHA256}); the package is damaged, reinstall it"
        )
    return raw


def kimi_k3_special_tokens() -> dict[str, int]:
    """The 256 Kimi K3 special tokens, ``{text: id}`` (ids 163584..163839)."""
    return json.loads(resources.files("kimi_tok.data").joinpath(KIMI_K3_SPECIALS).read_text("utf-8"))


def embedded_kimi_k3() -> tuple[Vocabulary, dict[str, int]]:
    """The Kimi K3 vocabulary shipped in the package (sha256-checked, so well formed: parsed with
    NumPy, no kernel and so no numba before a first call) and its special tokens."""
    return parse_well_formed_tiktoken_bpe(kimi_k3_model_bytes()), kimi_k3_special_tokens()
