"""Packing long texts: a long str of 2- or 4-byte characters is UTF-8 encoded by a compiled loop reading the str's
own storage (segments.utf8_of, native.utf8.utf8_of_code_points), a long ASCII str's storage is handed over as it is
(native.cpython.ascii_bytes); the bytes are always str.encode's."""

from __future__ import annotations

import ctypes
import gc
import random
import sys

import numpy as np
import pytest

import kimi_tok
from kimi_tok.native.utf8 import utf8_of_code_points
from kimi_tok.native.cpython import ASCII_HEADER, ascii_bytes, str_characters
from kimi_tok.pipeline.segments import TRANSCODED_MIN_CHARS, pack_segments, utf8_of
from tests.parity import assert_parity

LONG = TRANSCODED_MIN_CHARS
HEAD = 4096  # an ASCII head longer than many blocks


def _transcoded(text: str) -> bool:
    """Whether ``utf8_of`` returned an array (the compiled loop's output, or a long ASCII str's own storage), after
    checking its bytes."""
    got = utf8_of(text)
    assert bytes(got) == text.encode("utf-8")
    return isinstance(got, np.ndarray)


def test_every_non_surrogate_code_point_of_the_bmp_among_ascii():
    chars = [chr(cp) for cp in range(0x80, 0x10000) if not 0xD800 <= cp < 0xE000]
    text = "x" * HEAD + "".join(c + "abcdefg" for c in chars)
    assert _transcoded(text)


def test_every_code_point_above_ascii_in_a_str_of_4_byte_characters():
    chars = [chr(cp) for cp in range(0x80, 0x110000) if not 0xD800 <= cp < 0xE000]
    assert _transcoded("x" * HEAD + "".join(c + "abc" for c in chars))


@pytest.mark.parametrize("char", ["\x80", "\xe9", "\u07ff", "\u0800", "\u0436", "\u4e2d", "\ud7ff", "\ue000", "\uffff",
                                  "\U00010000", "\U0001f600", "\U0010ffff"])
def test_a_character_at_every_offset_around_the_blocks(char):
    wide = "\U0001f600" if char > "\uffff" else "\u0436"  # a str of 4-byte characters has 16 units a block
    for offset in range(100):
        text = "y" * offset + char + wide + "z" * (LONG + offset)
        assert _transcoded(text)
        assert _transcoded("z" * LONG + wide + "y" * offset + char)  # and in the tail after the last block


@pytest.mark.parametrize("wide, tail", [("\u0436", "\u4e2d"), ("\U0001f600", "\U0001f600"), ("\U0001f600", "\u4e2d")])
def test_an_ascii_head_then_only_the_longest_characters(wide, tail):
    # the output must have room for the tail's 3 or 4 bytes a character
    assert _transcoded("x" * HEAD + wide + tail * (4 * LONG))


def test_random_mostly_ascii_texts():
    rng = random.Random(5)
    others = ["\xe9", "\u0436", "\u4e2d", "\u0800", "\uffff", "\n", " ", "\x7f", "\U0001f600", "\U00010000"]
    for _ in range(40):
        share = rng.choice([0.001, 0.02, 0.1])
        n = LONG + rng.randrange(200)
        text = "".join(rng.choice(others) if rng.random() < share else chr(rng.randrange(32, 127)) for _ in range(n))
        assert _transcoded(text + "\u0436")  # at least 2-byte characters, whatever the draw


@pytest.mark.parametrize("dtype_char", ["\u0436", "\U0001f600"])
def test_runs_of_other_characters_of_every_length_at_every_offset(dtype_char):
    # one by one after a character that is not ASCII, back to blocks at the next ASCII one: runs of every
    # length, ending at every offset of a block and in the tail after the last block
    rng = random.Random(3)
    alphabet = ["\xe9", "\u0436", "\u07ff", "\u0800", "\u4e2d", "\uffff", "\U00010000", "\U0010ffff"]
    if dtype_char < "\uffff":
        alphabet = alphabet[:6]
    for offset in range(40):
        pieces = [dtype_char]
        while sum(map(len, pieces)) < LONG + offset:
            pieces.append("a" * rng.choice([0, 1, 2, 15, 16, 31, 32, 33, 70]))
            pieces.append("".join(rng.choice(alphabet) for _ in range(rng.choice([1, 2, 3, 16, 40, 200]))))
        text = "".join(pieces)
        assert _transcoded(text)
        assert _transcoded(text + "b" * offset)
        assert _transcoded("c" * offset + text[::-1])


def test_strs_of_1_byte_characters_every_latin_1_character_at_every_offset():
    # a str whose characters all fit a byte but are not all ASCII is read as uint8 units: 64 a block
    assert str_characters("x" * LONG + "\xe9").dtype == np.uint8
    latin_1 = "".join(map(chr, range(0x80, 0x100)))
    for offset in range(70):
        assert _transcoded("y" * offset + latin_1 + "z" * (LONG + offset))
        assert _transcoded("z" * LONG + "y" * offset + latin_1[::-1])  # and in the tail after the last block
    rng = random.Random(7)
    for _ in range(40):
        share = rng.choice([0.001, 0.05, 0.5, 1.0])
        text = "".join(chr(rng.randrange(0x80, 0x100)) if rng.random() < share else chr(rng.randrange(0, 0x80))
                       for _ in range(LONG + rng.randrange(200)))
        assert _transcoded(text + "\xff")


def test_texts_that_are_mostly_not_ascii():
    for text in ("\u0436" * LONG, "\U0001f600" * LONG, ("\u4e2d\u6587 " * LONG)[:LONG], "\u0e01\u0e32\u0e23" * LONG,
                 "\u0436" + "\xe9" * LONG):
        assert _transcoded(text)


def test_texts_that_are_mostly_not_ascii_give_reference_ids(ref):
    tok = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    rng = random.Random(13)
    words = ["\u041f\u0440\u0438\u0432\u0435\u0442", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35", "\u4e2d\u6587\u5b57",
             "\u0645\u0631\u062d\u0628\u0627", "\u3053\u3093\u306b\u3061\u306f", "ok", "42", "\U0001f600"]
    texts = [" ".join(rng.choice(words[:5]) for _ in range(LONG // 5)),
             "".join(rng.choice(words) + rng.choice([" ", "", ", ", "\n"]) for _ in range(LONG // 4))]
    for text in texts:
        assert _transcoded(text)
        assert_parity(tok, ref, [(text, False)])
    # a lone surrogate inside a run of other characters: the reference's fix-up, not the loop's bytes
    broken = texts[0][:LONG // 2] + "\ud800" + texts[0][LONG // 2:]
    with pytest.raises(UnicodeEncodeError):
        utf8_of(broken)
    assert_parity(tok, ref, [("<|open|>", True), (broken, False), (texts[1], True)])


def test_other_texts_take_str_encode():
    assert not _transcoded("x" * (LONG - 2) + "\u0436")  # short
    assert _transcoded("x" * LONG)  # ASCII: the str's own storage (test_a_long_ascii_str_is_handed_over_in_place)
    assert _transcoded("x" * LONG + "\xe9")  # one byte per character, not all ASCII
    assert _transcoded("x" * LONG + "\u0436")
    assert _transcoded("x" * LONG + "\U0001f600")


def test_a_long_ascii_str_is_handed_over_in_place(ref):
    text = "".join(f"word{i} = {i * 7 % 1000}\n" for i in range(LONG // 8))  # made here: nothing else holds it
    got = utf8_of(text)
    assert got.__array_interface__["data"][0] == id(text) + ASCII_HEADER  # no copy
    assert not got.flags.writeable  # a str never changes
    want = text.encode("utf-8")
    del text
    gc.collect()
    assert bytes(got) == want  # the array keeps the str alive
    assert ascii_bytes("x" * LONG + "\xe9") is None and ascii_bytes("") is not None
    tok = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    ascii_text = want.decode()
    assert_parity(tok, ref, [(ascii_text, False)])  # one segment: the str's storage is the packed buffer
    assert_parity(tok, ref, [("<|open|>", True), (ascii_text, True), ("x" * LONG + "\u0436", False),
                             (ascii_text, False)])


def test_lone_surrogates_raise_as_str_encode_does():
    for text in ("x" * LONG + "\ud800" + "\u0436", "\u0436" + "\udc00" + "x" * LONG, "\u0436" + "x" * LONG + "\ud83d",
                 "\u0436" + "x" * LONG + "\ud83d\ude00",  # two lone surrogates, not a pair: a str has no pairs
                 "\U0001f600" + "x" * LONG + "\udfff", "\ud800" + "x" * LONG + "\U0001f600"):
        with pytest.raises(UnicodeEncodeError):
            utf8_of(text)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_the_loop_rejects_every_surrogate(dtype):
    def run(units):
        units = np.array(units + [0x41] * 40, dtype=dtype)
        out = np.empty(4 * units.shape[0] + 64, dtype=np.uint8)
        n = utf8_of_code_points(units, out)
        return n, bytes(out[:max(n, 0)])

    assert run([0x4E2D, 0xD7FF, 0xE000]) == (49, "\u4e2d\ud7ff\ue000".encode() + b"A" * 40)
    for units in ([0xD800], [0xDC00], [0xDFFF], [0xD83D, 0xDE00], [0x41] * 70 + [0xDBFF],
                  [0x4E2D] * 70 + [0xD800], [0x0436] * 3 + [0x41] + [0x0436] * 40 + [0xDFFF]):  # inside a run
        assert run(units)[0] == -1
    for lane in range(40):  # in a run of other characters, at every offset of a block of them and past it
        assert run([0x41] * 3 + [0x0436] * lane + [0xDC00] + [0x4E2D] * 40)[0] == -1
    if dtype == np.uint32:
        assert run([0x1F600, 0x10FFFF]) == (48, "\U0001f600\U0010ffff".encode() + b"A" * 40)


def test_packed_calls_with_transcoded_segments_give_reference_ids(ref):
    tok = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    rng = random.Random(9)
    words = ["caf\u00e9", "\u0436\u0443\u043a", "\u4e2d\u6587", "na\u00efve", "r\u00e9sum\u00e9"]
    text = " ".join(rng.choice(words) if rng.random() < 0.05 else f"word{rng.randrange(1000)}"
                    for _ in range(2 * LONG // 7))
    assert _transcoded(text)
    assert_parity(tok, ref, [(text, False)])  # one transcoded segment: packed without a copy
    assert_parity(tok, ref, [("<|open|>", True), (text, False), ("\u00e9t\u00e9 " * 10, False), (text, True)])


def test_transcoded_strs_of_4_byte_characters_and_wide_tails_give_reference_ids(ref):
    tok = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    rng = random.Random(11)
    words = ["\U0001f600", "x\U0001f680y", "\U00020000\u4e2d", "caf\u00e9", "<|open|>", "\u0436\u0443\u043a"]
    code = "\n".join(rng.choice(words) if rng.random() < 0.05 else f"    value_{rng.randrange(1000)} = {rng.random():.3f}"
                     for _ in range(LONG // 12))
    wide_tail = "x" * HEAD + "\u0436" + "\u4e2d\u6587 \uff0c" * LONG  # ASCII head, then all CJK
    emoji_tail = "y" * HEAD + "\U0001f600 " * LONG
    assert str_characters(code).dtype == str_characters(emoji_tail).dtype == np.uint32
    for text in (code, wide_tail, emoji_tail):
        assert _transcoded(text)
        assert_parity(tok, ref, [(text, False)])
    assert_parity(tok, ref, [("<|open|>", True), (code, True), (wide_tail, False), (emoji_tail, False)])


def _hold_utf8(text: str) -> None:
    """Make CPython keep the UTF-8 of ``text`` beside its characters, as the Rust tokenizers' C API calls do."""
    as_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
    as_utf8.restype = ctypes.c_void_p
    as_utf8.argtypes = [ctypes.py_object, ctypes.c_void_p]
    assert as_utf8(text, None)


def test_a_str_holding_its_utf8_too():
    text = "x" * LONG + "\u0436\U0001f600"
    _hold_utf8(text)
    assert _transcoded(text)


def test_a_str_of_2_byte_characters_with_the_size_of_a_4_byte_one():
    # n characters whose UTF-8 takes 2n + 1 bytes: held beside them, the str's size is that of n 4-byte
    # characters, so its size must not decide how its characters are read
    head = "x" * LONG
    text = head + "\u4e2d" * (LONG + 1)
    assert len(text.encode()) == 2 * len(text) + 1
    _hold_utf8(text)
    assert sys.getsizeof(text) == sys.getsizeof("\U0001f600" * len(text))
    assert str_characters(text).dtype == np.uint16
    assert bytes(utf8_of(text)) == text.encode("utf-8")
    assert bytes(utf8_of(head + "\u4e2d" + head)) == (head + "\u4e2d" + head).encode()


def _python_way(segments):
    return pack_segments(segments, True, None, utf8=lambda texts: [utf8_of(text) for text in texts])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_long_call_is_packed_in_one_compiled_pass_as_the_python_way_packs_it(seed):
    rng = random.Random(seed)
    texts = ["<|open|>", "", "\n", "x" * LONG, "caf\u00e9 " * LONG, "\u0436\u0443\u043a " * LONG,
             ("\u4e2d\u6587 \U0001f600 " * LONG)[:LONG], "short \u00e9", "\U0010ffff"]
    segments = [(rng.choice(texts), rng.random() < 0.3) for _ in range(40)]
    packed = pack_segments(segments, True, None)
    assert not packed.buf.flags.writeable  # as bytes and a str's storage are: the kernels compiled for those
    assert bytes(packed.buf) == b"".join(text.encode() for text, _ in segments)
    python_way = _python_way(segments)
    for field in ("seg_start", "seg_end", "allow_special", "needs_cuts", "origin"):
        assert np.array_equal(getattr(packed, field), getattr(python_way, field)), field
    assert packed.n_segments == python_way.n_segments == 40


def test_a_long_call_the_reader_declines_is_packed_the_python_way():
    class Text(str):
        pass

    surrogate = [("<|open|>", True), ("x" * LONG + "\ud800" + "y", False), ("z" * LONG, False)]
    packed = pack_segments(surrogate, True, kimi_tok.kimi_k3(n_jobs=1)._engine.flags)  # flags: cut, then fixed up
    assert list(packed.needs_cuts) == [True, False, True]  # the surrogate's segment: cut and fixed up here
    assert bytes(packed.buf) == ("<|open|>" + "x" * LONG + "\ufffd" + "y" + "z" * LONG).encode()  # tiktoken's fix-up
    subclass = [(Text("x" * LONG), False), ("\u0436" * LONG, True)]  # validated: read as the str it holds
    assert bytes(pack_segments(subclass, True, None).buf) == ("x" * LONG + "\u0436" * LONG).encode()


@pytest.mark.parametrize("settings", [{"n_jobs": 1, "segment_cache_bytes": 0}, {}])  # {}: the default kimi_k3()
def test_long_calls_of_many_segments_give_reference_ids(ref, settings):
    class Text(str):
        pass

    tok = kimi_tok.kimi_k3(**settings)
    rng = random.Random(17)
    words = ["caf\u00e9", "\u0436\u0443\u043a", "\u4e2d\u6587", "x\U0001f600", "<|open|>", "word", "\n\n", "  "]
    segments = [(" ".join(rng.choice(words) for _ in range(rng.randrange(1, 400))), rng.random() < 0.2)
                for _ in range(300)]
    assert sum(len(text) for text, _ in segments) > kimi_tok.Policy().max_joined_call_chars  # packed, not joined
    assert_parity(tok, ref, segments)
    # what the one-pass reader meets at the edges: empty texts, a text past the 25,000-character cut without
    # whitespace, a str subclass, and a lone surrogate (the reader declines the call: packed the Python way)
    edges = segments[:100] + [("", False), ("\u4e2d" * 30_000, False), ("", True), (Text("x\u00e9 " * 9_000), True)]
    assert_parity(tok, ref, edges)
    assert_parity(tok, ref, edges + [("y" * 10 + "\ud800" + "z", False)] + segments[100:150])
