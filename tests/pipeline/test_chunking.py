"""The compiled tiktoken-safe cuts equal the readable spec (``_educational.safe_substrings``).

The compiled kernel crosses ordinary text in windows without walking every byte
(``chunking._skip_window``), so runs are placed around the window size and the
25,000-character limit on purpose.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from kimi_tok._educational import safe_substrings as spec_substrings
from kimi_tok.pipeline.chunking import SKIP_WINDOW_BYTES, SPACE_LEAD_BYTES, cut_safe_substrings
from kimi_tok.pipeline.pretokenize.unicode_classes import PY_SPACE, code_point_flags

ALPHABET = ["a", "b", " ", "\n", "\x1c", "\xa0", "中", "é", "\U0001F600", "\u3000", "1"]
RUN_LENGTHS = [1, 2, 3, 100, SKIP_WINDOW_BYTES - 1, SKIP_WINDOW_BYTES, SKIP_WINDOW_BYTES + 1,
               2 * SKIP_WINDOW_BYTES - 1, 24_998, 24_999, 25_000, 25_001, 25_002, 30_000]


def compiled_substrings(text: str) -> list[str]:
    raw = text.encode("utf-8")
    buf = np.frombuffer(raw, dtype=np.uint8)
    bounds = np.array([0, len(raw)], dtype=np.int64)
    starts, ends, _ = cut_safe_substrings(buf, bounds[:1], bounds[1:], np.ones(1, dtype=np.bool_), code_point_flags())
    return [raw[s:e].decode("utf-8") for s, e in zip(starts.tolist(), ends.tolist())]


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(1, 12)):
        parts.append(rng.choice(ALPHABET) * rng.choice(RUN_LENGTHS))
        if rng.random() < 0.3:
            parts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 50))))
    return "".join(parts)


@pytest.mark.parametrize("seed", range(6))
def test_compiled_cuts_equal_the_spec(seed):
    rng = random.Random(seed)
    for _ in range(50):
        text = random_text(rng)
        assert compiled_substrings(text) == spec_substrings(text)


def test_400k_chunks_with_multibyte_characters_equal_the_spec():
    text = "é" * 399_999 + "\U0001F600" + "ab " * 150_000 + "中" * 30_000
    assert compiled_substrings(text) == spec_substrings(text)


@pytest.mark.parametrize("text", [
    "ab " * 133_333 + "a",  # 400,000 characters and bytes: one chunk, decided from the byte count alone
    "ab " * 133_333 + "ab",  # 400,001: the last character starts a chunk
    "ab " * 133_333 + "é",  # 400,000 characters in 400,001 bytes: one chunk, counted
    "a" * 25_000,  # a 25,000-character run in 25,000 bytes: no cut, decided from the byte count alone
    "a" * 25_000 + " ",  # the same run in 25,001 bytes: walked, no cut
    "a" * 25_001,  # one character too many: cut
    "é" * 12_500 + "a",  # 12,501 characters in 25,001 bytes: walked, no cut
])
def test_cuts_at_the_byte_count_shortcuts_equal_the_spec(text):
    assert compiled_substrings(text) == spec_substrings(text)


def test_space_lead_bytes_are_those_of_every_non_ascii_space():
    flags = code_point_flags()
    spaces = [cp for cp in range(0x80, 0x110000) if flags[cp] & PY_SPACE]
    assert spaces == [cp for cp in range(0x80, 0x110000) if chr(cp).isspace()]
    assert sorted({chr(cp).encode("utf-8")[0] for cp in spaces}) == sorted(SPACE_LEAD_BYTES)


SPACE_NEIGHBOURS = ["a", "中", "ひ", "\u2027", "\u2028", "\u0085", "\xa0", "\u1680", "\u3000", "\u3001", "\xa1", " ",
                    "\U0001F600"]


@pytest.mark.parametrize("seed", range(4))
def test_windows_without_spaces_are_crossed_as_the_spec_cuts(seed):
    """Long stretches without whitespace (skipped a byte at a time) broken by characters whose
    UTF-8 shares a lead byte with a non-ASCII space, or is one."""
    rng = random.Random(seed)
    for _ in range(20):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(["中", "ひ", "a", "\u2027"]) * rng.choice(RUN_LENGTHS))
            parts.append("".join(rng.choice(SPACE_NEIGHBOURS) for _ in range(rng.randint(1, 5))))
        text = "".join(parts)
        assert compiled_substrings(text) == spec_substrings(text)
