"""Packing long texts: a long str of 2-byte characters that is mostly ASCII is UTF-8 encoded through UTF-16
and a compiled loop (segments.utf8_of, native.utf8.utf8_of_utf16); the bytes are always str.encode's."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kimi_tok
from kimi_tok.native.utf8 import utf8_of_utf16
from kimi_tok.pipeline.segments import SAMPLE_CHARS, TRANSCODED_MIN_CHARS, utf8_of
from tests.parity import assert_parity

LONG = TRANSCODED_MIN_CHARS


def _transcoded(text: str) -> bool:
    """Whether ``utf8_of`` took the compiled loop (it returns an array then), after checking its bytes."""
    got = utf8_of(text)
    assert bytes(got) == text.encode("utf-8")
    return isinstance(got, np.ndarray)


def test_every_non_surrogate_code_point_of_the_bmp_among_ascii():
    chars = [chr(cp) for cp in range(0x80, 0x10000) if not 0xD800 <= cp < 0xE000]
    text = "x" * SAMPLE_CHARS + "".join(c + "abcdefg" for c in chars)
    assert _transcoded(text)


@pytest.mark.parametrize("char", ["\x80", "\xe9", "\u07ff", "\u0800", "\u0436", "\u4e2d", "\ud7ff", "\ue000", "\uffff"])
def test_a_character_at_every_offset_around_the_32_unit_blocks(char):
    for offset in range(100):
        text = "y" * offset + char + "\u0436" + "z" * (LONG + offset)
        assert _transcoded(text)
        assert _transcoded("z" * LONG + "\u0436" + "y" * offset + char)  # and in the tail after the last block


def test_random_mostly_ascii_texts():
    rng = random.Random(5)
    others = ["\xe9", "\u0436", "\u4e2d", "\u0800", "\uffff", "\n", " ", "\x7f"]
    for _ in range(40):
        share = rng.choice([0.001, 0.02, 0.1])
        n = LONG + rng.randrange(200)
        text = "".join(rng.choice(others) if rng.random() < share else chr(rng.randrange(32, 127)) for _ in range(n))
        assert _transcoded(text + "\u0436")  # one 2-byte character makes it a str of 2-byte characters


def test_other_texts_take_str_encode():
    assert not _transcoded("\u0436" * LONG)  # mostly not ASCII
    assert not _transcoded("x" * (LONG - 2) + "\u0436")  # short
    assert not _transcoded("x" * LONG)  # ASCII: str.encode copies it
    assert not _transcoded("x" * LONG + "\xe9")  # one byte per character
    assert not _transcoded("x" * LONG + "\U0001f600")  # four bytes per character
    assert _transcoded("x" * LONG + "\u0436")


def test_lone_surrogates_raise_as_str_encode_does():
    for text in ("x" * LONG + "\ud800" + "\u0436", "\u0436" + "\udc00" + "x" * LONG, "\u0436" + "x" * LONG + "\ud83d"):
        with pytest.raises(UnicodeEncodeError):
            utf8_of(text)


def test_the_loop_rejects_a_surrogate_that_is_not_half_of_a_pair():
    def run(units):
        units = np.array(units + [0x41] * 40, dtype=np.uint16)
        out = np.empty(3 * units.shape[0] + 64, dtype=np.uint8)
        n = utf8_of_utf16(units, out)
        return n, bytes(out[:max(n, 0)])

    assert run([0xD83D, 0xDE00]) == (44, "\U0001f600".encode() + b"A" * 40)
    for units in ([0xD800], [0xDC00], [0xD800, 0x41], [0xDBFF, 0xD800, 0xDC00]):
        assert run(units)[0] == -1


def test_packed_calls_with_transcoded_segments_give_reference_ids(ref):
    tok = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    rng = random.Random(9)
    words = ["caf\u00e9", "\u0436\u0443\u043a", "\u4e2d\u6587", "na\u00efve", "r\u00e9sum\u00e9"]
    text = " ".join(rng.choice(words) if rng.random() < 0.05 else f"word{rng.randrange(1000)}"
                    for _ in range(2 * LONG // 7))
    assert _transcoded(text)
    assert_parity(tok, ref, [(text, False)])  # one transcoded segment: packed without a copy
    assert_parity(tok, ref, [("<|open|>", True), (text, False), ("\u00e9t\u00e9 " * 10, False), (text, True)])
