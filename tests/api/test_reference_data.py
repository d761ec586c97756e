"""The package's copy of the Kimi K3 data is the published one.

The suite's reference is built from the package's own copy (tests/reference.py), so that any
clone can run it. Where the published files lie beside the clone (``../shared/kimi-k3`` or
``$KIMI_K3_DIR``), these tests check the copy against them byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources

import pytest

import kimi_tok
from kimi_tok.vocab.kimi_k3 import KIMI_K3_SHA256, KIMI_PATTERN, kimi_k3_model_bytes, kimi_k3_special_tokens
from tests.reference import shared_data_dir

SHARED = shared_data_dir()
needs_shared = pytest.mark.skipif(not (SHARED / "tiktoken.model").is_file(),
                                  reason=f"no published K3 files at {SHARED}")


def test_embedded_vocabulary_has_the_published_sha256():
    assert hashlib.sha256(kimi_k3_model_bytes()).hexdigest() == KIMI_K3_SHA256


def test_embedded_specials_are_the_256_k3_specials():
    specials = kimi_k3_special_tokens()
    assert sorted(specials.values()) == list(range(163_584, 163_840))
    assert {"[BOS]", "[EOS]", "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"} <= set(specials)
    assert kimi_tok.kimi_k3().special_tokens == specials


@needs_shared
def test_embedded_vocabulary_is_the_published_file():
    assert kimi_k3_model_bytes() == (SHARED / "tiktoken.model").read_bytes()


@needs_shared
def test_pattern_is_the_published_pattern():
    assert KIMI_PATTERN == (SHARED / "pattern.txt").read_text("utf-8").strip("\r\n")


@needs_shared
def test_specials_are_the_published_specials():
    published = json.loads((SHARED / "special_tokens.json").read_text("utf-8"))
    assert kimi_k3_special_tokens() == {name: int(i) for name, i in published.items()}


@needs_shared
def test_license_is_the_published_license():
    shipped = resources.files("kimi_tok.data").joinpath("LICENSE-KIMI-K3").read_bytes()
    assert shipped == (SHARED / "LICENSE").read_bytes()
