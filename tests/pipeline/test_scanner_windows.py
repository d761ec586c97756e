"""The Kimi scanner's 64-byte windows (``kimi_scanner._window_starts``) cut exactly where the PCRE2 JIT
regex does.

Windows run only inside text runs longer than 67 bytes, so these texts are long: every tricky ASCII sequence
(contractions, digit runs, whitespace runs with and without newlines, symbol runs, prefixes, case changes)
placed at every offset of a window, plus hypothesis-generated ASCII texts, with non-ASCII bytes sprinkled in
so windows and the byte-wise path hand over in every state. Windows also take the two-byte letters
U+00C0-U+00FF and symbols among U+00A1-U+00BF, the symbols U+2010-U+2027, the letters of one case among Latin
Extended-A and -B, Greek, Cyrillic and Latin Extended Additional, the Hangul syllables, the kana, the Hebrew
and Arabic letters and symbols, CJK and full-width symbols, the no-break space and the Han ideographs: each of
those letters and symbols (every code point of U+0100-U+06FF, U+1E00-U+1EFF, U+3000-U+30FF and U+FF00-U+FFEF
in every context), the syllables and ideographs at the ends of their ranges, and the code points around them
that windows leave to the byte-wise path, in every context at the window's edges.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_tok
from kimi_tok import KIMI_PATTERN
from kimi_tok.pipeline.pretokenize import RegexPreTokenizer
from kimi_tok.pipeline.pretokenize.kimi_scanner import scan_runs
from kimi_tok.native.simd import (CYRILLIC_LETTERS, EVEN, EXTENDED_ADDITIONAL_LEAD, EXTENDED_ADDITIONAL_LETTERS,
                                  GREEK_LETTERS, KANA, LATIN1_SYMBOL_TAILS, LATIN_EXTENDED_LETTERS, LOWER, ODD,
                                  PUNCTUATION_THIRD, RTL_LETTERS, RTL_SYMBOLS, UPPER, WIDE_SYMBOLS)
from kimi_tok.pipeline.pretokenize.unicode_classes import (HAN as HAN_FLAG, LETTER, LOWERISH, NUMBER, UPPERISH,
                                                            WHITESPACE, code_point_flags)
from tests.api.test_properties import SETTINGS
from tests.parity import assert_parity

PCRE2 = RegexPreTokenizer(KIMI_PATTERN)
FLAGS = code_point_flags()

TRICKY = [
    "don't", "it's", "I'LL", "we're", "you've", "I'm", "he'd", "x'Sa", "x's's", "'s", "a's", "''s", "x'", "'",
    "ABc", "aBc", "HTTPServer", "fooBar", "A", "a", "Zz", "zZ",
    "1", "12", "123", "1234", "12345678901", "a1b2", "1a", "x123456",
    " ", "  ", "   ", "\t", " \t", "\t ", "\n", "\n\n", "\r\n", " \n", "\n ", "  \n  ", "\n  \n  ", "\x0b", "\x0c",
    " \x0b\n", "\n\t\t", "\r", "\r\r\n", " \n \n", "\n \n", "\n \n x", " \n\n  x", "\t\n\t\n", " \r\n ", "\n\x0c\n",
    ";\n \n", ";\n\n \nx", ". \n\n", "x \n \n y", "(\n  \n)",
    "(", "((", "(x", "((x", " (x", "  (x", "\t(x", ".\n", ".\n\n", ";\n  x", ")\n \nx", "'x", "x'y", "\"'s",
    "==", "->", "#", "_", "__init__", "@x", "$1", "\x00", "\x1c", "\x7f", "\x1fx",
]
FILLER = "lorem ipsum dolor, sit amet (42) consectetur\n"


def _pieces(text: str) -> list[str]:
    raw = text.encode("utf-8")
    buf = np.frombuffer(raw, dtype=np.uint8)
    one = np.zeros(1, dtype=np.int64)
    _, piece_end = scan_runs(buf, one, one + len(raw), one - 1, FLAGS)
    return [raw[a:b].decode("utf-8") for a, b in zip([0, *piece_end[:-1].tolist()], piece_end.tolist())]


def _check(text: str) -> None:
    got, want = _pieces(text), PCRE2.split(text)
    i = next((i for i in range(min(len(got), len(want))) if got[i] != want[i]), min(len(got), len(want)))
    assert got == want, f"text {text!r}\npiece {i}: got {got[max(0, i - 3):i + 4]}\nwant {want[max(0, i - 3):i + 4]}"


@pytest.mark.parametrize("tricky", TRICKY)
def test_every_tricky_sequence_at_every_window_offset(tricky):
    for offset in range(0, 72):
        for before in (" ", "x", "1", "(", "\n", "  "):
            text = (FILLER * 3)[:offset] + before + tricky + FILLER * 3
            _check(text)
            _check(text + tricky)  # near the end of the run too


def test_long_runs_crossing_windows():
    for unit in (" ", "\n", " \n", "\n ", "1", "a", "A", "(", "\t", "aA", "'s"):
        for n in (60, 63, 64, 65, 66, 67, 70, 127, 128, 129, 200):
            _check("x" * 10 + unit * n + "y z")
            _check("x" * 10 + unit * n)
            _check(unit * n + "x" * 80)


@pytest.mark.parametrize("alphabet", [" \n;a", " \t\n\rx", " \nA'1(", " \n\u308b;", " \n\u4e2d\u00e9"])
def test_every_short_mix_of_blanks_and_newlines(alphabet):
    """Every string of six characters of ``alphabet`` (so every shorter one too: blanks before newlines,
    newlines after symbols, blank runs a newline ends), one after another in one long text: each lands at
    many window offsets."""
    _check("x = 1\n" * 12 + "".join("".join(chars) + "z." for chars in itertools.product(alphabet, repeat=6)))


ascii_atoms = st.one_of(st.sampled_from(TRICKY), st.characters(min_codepoint=0, max_codepoint=127))
mixed_atoms = st.one_of(ascii_atoms, ascii_atoms, ascii_atoms, st.sampled_from(["é", "中", "😀", "\u00a0", "\u2028"]))


@settings(max_examples=400, **SETTINGS)
@given(st.lists(ascii_atoms, min_size=20, max_size=400).map("".join))
def test_random_ascii_text(text):
    _check(text)


@settings(max_examples=200, **SETTINGS)
@given(st.lists(mixed_atoms, min_size=20, max_size=400).map("".join))
def test_random_text_with_some_non_ascii(text):
    _check(text)


# U+0080-U+00FF (windows take the letters U+00C0-U+00FF but U+00D7 and U+00F7, and the symbols among U+00A1-U+00BF,
# the guillemets among them; not the C1 controls, U+00A0, the letters and the numbers below U+00C0), Hangul
# syllables (windows take U+AC00-U+D77F) and neighbours they do not take
LATIN1 = [chr(c) for c in range(0x80, 0x100)] + ["\u0100", "\u017f", "\u00bb%s\u00ab", "\u00ab\u00a0x\u00a0\u00bb"]
HANGUL = ["\uac00", "\uafff", "\ub000", "\ucfff", "\ud000", "\ud77f", "\ud780", "\ud7a3", "\ud7a4", "\uabff",
          "\u3131", "\u1100", "\ud55c\uad6d\uc5b4", "\uac00\u00e9"]
# Han ideographs (windows take U+3400-U+4DBF and U+4E00-U+9FFF) and neighbours they do not take: the Yijing
# hexagrams U+4DC0-U+4DFF, kana and CJK punctuation (E3 lead bytes), Yi, the compatibility ideographs
HAN = ["\u3400", "\u3fff", "\u4000", "\u4dbf", "\u4dc0", "\u4dff", "\u4e00", "\u4e2d", "\u9fff", "\ua000", "\u33ff",
       "\u3005", "\u3007", "\u3042", "\u30fc", "\u3002", "\uff0c", "\uf900", "\u2f00", "\U00020000",
       "\u4e2d\u6587", "\u4e2d\u3042", "\u4e2d\u3002", "\u4e2d\uac00", "\u4e2d\u00e9", "\u4e2d\u0301"]
# U+2010-U+2027 (windows take them as symbols) and the general punctuation around them that they do not take
PUNCTUATION = [chr(c) for c in range(0x2000, 0x2030)] + ["\u205f", "\u2070", "\u2071", "\u2116", "\u2160",
                                                          "\u20ac", "\u201e\u201c", "\u2019s", "\u2014\u2014",
                                                          "\u00bb\u2026"]
# Latin Extended-A/-B, Greek, Cyrillic, Latin Extended Additional: the ends of the ranges windows take (of one case
# each), the exceptions to the alternating case inside them, and neighbours they do not take (long s, marks, Greek
# punctuation and accents, Cyrillic marks and signs)
EXTENDED = [chr(c) for c in (0x100, 0x130, 0x131, 0x137, 0x138, 0x139, 0x13F, 0x140, 0x148, 0x149, 0x14A, 0x177,
                             0x178, 0x179, 0x17E, 0x17F, 0x180, 0x19F, 0x1A0, 0x1A1, 0x1A2, 0x1AF, 0x1B0, 0x1B1, 0x217,
                             0x218, 0x21B, 0x21C, 0x259, 0x2B0, 0x300, 0x345, 0x37E, 0x384, 0x385, 0x386, 0x387, 0x388,
                             0x38B, 0x38C, 0x38F, 0x390, 0x391, 0x3A1, 0x3A2, 0x3A3, 0x3AB, 0x3AC, 0x3C2, 0x3CE, 0x3CF,
                             0x3D0, 0x3F5, 0x3FF, 0x400, 0x42F, 0x430, 0x44F, 0x450, 0x45F, 0x460, 0x47F, 0x480, 0x481,
                             0x482, 0x483, 0x489, 0x48A, 0x491, 0x4BF, 0x4C0, 0x4C1, 0x4CE, 0x4CF, 0x4D0, 0x4FF, 0x500,
                             0x1DFF, 0x1E00, 0x1E95, 0x1E96, 0x1E9D, 0x1E9E, 0x1E9F, 0x1EA0, 0x1EF9, 0x1EFF, 0x1F00)]
EXTENDED_WORDS = ["\u0141\u00f3d\u017a", "\u0130stanbul", "\u017f's", "x\u017f't",
                  "\u041c\u043e\u0441\u043a\u0432\u0430", "\u0410\u0411\u0412\u0433",
                  "\u0391\u0398\u0397\u039d\u0391 \u03ac\u03bb\u03c6\u03b1", "Ti\u1ebfng Vi\u1ec7t",
                  "\u01a0\u01b0\u1ee3c", "\u0218i \u021b", "\u0406\u0457\u0491'\u0454", "\u0434\u0438\u0301\u043c"]
# kana (letters of both cases, as Hangul syllables), CJK and full-width symbols: the ends of the ranges windows take
# and the characters around them they do not (the ideographic space, iteration marks, full-width digits and letters,
# halfwidth katakana)
WIDE = [chr(c) for c in (0x3000, 0x3001, 0x3004, 0x3005, 0x3007, 0x3008, 0x3011, 0x3020, 0x3021, 0x3030, 0x3040,
                         0x3041, 0x3096, 0x3097, 0x3099, 0x309A, 0x309B, 0x309C, 0x309D, 0x309F, 0x30A0, 0x30A1,
                         0x30FA, 0x30FB, 0x30FC, 0x30FF, 0x3100, 0xFF00, 0xFF01, 0xFF0F, 0xFF10, 0xFF1A, 0xFF20,
                         0xFF21, 0xFF3B, 0xFF40, 0xFF41, 0xFF5B, 0xFF65, 0xFF66)]
WIDE_WORDS = ["\u3053\u308c\u306fOK", "\u30ab\u30bfB", "\u30ab\u30bfBc", "\u3010\u6ce8\u3011", "\u300c%s\u300d",
              "\u306e's", "\uff08\u4f8b\uff09", "\u3002\n", "\u3001 x", "\u30fc\u30eb", "\uff01\uff01"]
# Hebrew and Arabic: the ends of the letter and symbol ranges windows take, marks, digits and formats they do not
RTL = [chr(c) for c in (0x590, 0x591, 0x5BD, 0x5BE, 0x5BF, 0x5C0, 0x5C3, 0x5C6, 0x5C7, 0x5CF, 0x5D0, 0x5EA, 0x5EB,
                        0x5EF, 0x5F2, 0x5F3, 0x5F4, 0x5F5, 0x600, 0x60C, 0x60F, 0x610, 0x61B, 0x61C, 0x61F, 0x620,
                        0x63F, 0x640, 0x64A, 0x64B, 0x65F, 0x660, 0x669, 0x66A, 0x66D, 0x66E, 0x670, 0x671, 0x67E,
                        0x6AF, 0x6CC, 0x6D3, 0x6D4, 0x6D5, 0x6D6, 0x6DD, 0x6E5, 0x6E9, 0x6F0, 0x6FA, 0x6FF, 0x700)]
RTL_WORDS = ["\u05e9\u05dc\u05d5\u05dd", "\u05e2\u05b4\u05d1", "\u05d0B", "\u05d0Bc", "\u0645\u0631\u062d\u0628\u0627",
             "\u0643\u062a\u0628\u064e", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629\u061f",
             "\u00ab%s\u00bb \u0628\u0640", "\u0661\u0662\u0663", "\u060c \u0648"]
# the no-break space (windows take one with no whitespace right before or after it) beside everything it meets in
# French and around other whitespace
NO_BREAK = ["mot\u00a0:", "\u00a0\u00a0", "x\u00a0\u00a0y", " \u00a0x", "\u00a0 x", "\u00a0  x", "\t\u00a0x",
            "\u00a0\n", "\n\u00a0", "\u00a0\n\u00a0x", "\u00a0's", "x\u00a0'S", "1\u00a0000", "\u00a0\u3000",
            "\u00a0\u2009:", "\u202f\u00a0x", "\u00a0\u00c9t\u00e9", "\u00a0Ab", "\u00a0AB", "\u00a0\uac00B",
            "\u00a0\u4e2d", "\u00a0\u00bb", "\u00a0\u2014", ":\u00a0", "(\u00a0)", "\u00a0%s", "\u00a0\u0301"]
# characters that end what a window decides: whitespace, a mark, a number, Thai, an emoji
OTHER = ["\u3000", "\u2028", "\u0085", "\u0301", "\u00b2", "\u0e01", "\U0001f600", "\u00e9\u0301"]
WINDOW_LETTER_CONTEXTS = ["x{}y", "X{}Y", "{}{}", " {}'s", "{}'S", "a{}B", "A{}b", "1{}2", "({})", "{}\n",
                          "\u00c4{}\u00df", "{} {}", "{}  {}", "'{}", "{}B", "{}Bc", "{}BC.", "{}\u00c4b", "{}\u00c4 ",
                          "AB{}c", "{}\uac00B", "{}Wort", ".{}x", "{}.x", "x{}{}y", " {}{}", "  {}", "{}\u00bbx",
                          "x  {}y", "{}  \n", "{}\n  \nx", "{}\n \n  y", "{} \n \n", "\n  {}\nx", "x\n {}\n "]


@pytest.mark.parametrize("letter", LATIN1 + PUNCTUATION + HANGUL + HAN + EXTENDED + EXTENDED_WORDS + WIDE
                         + WIDE_WORDS + RTL + RTL_WORDS + NO_BREAK + OTHER)
def test_every_window_letter_in_every_context_at_the_window_edges(letter):
    for context in WINDOW_LETTER_CONTEXTS:
        piece = context.replace("{}", letter)
        for offset in (0, 1, 2, 3, 4, 5, 30, 57, 58, 59, 60, 61, 62, 63, 64):
            _check((FILLER * 3)[:offset] + piece + FILLER * 2)
            _check((FILLER * 3)[:offset] + piece * 40 + FILLER)


@pytest.mark.parametrize("context", WINDOW_LETTER_CONTEXTS)
def test_every_code_point_of_the_extended_letter_blocks_in_every_context(context):
    """Every code point of U+0100-U+06FF, U+1E00-U+1EFF, U+3000-U+30FF and U+FF00-U+FFEF in each context, one after
    another in one long text (each lands at many window offsets)."""
    code_points = [*range(0x100, 0x700), *range(0x1E00, 0x1F00), *range(0x3000, 0x3100), *range(0xFF00, 0xFFF0)]
    _check("".join((FILLER * 2)[:k % 67] + context.replace("{}", chr(c)) for k, c in enumerate(code_points)))


def test_the_extended_letters_windows_class_are_of_one_case():
    """``native.simd``'s letter tables against the flag table the byte-wise path reads: every letter windows take
    as uppercase is one of the pattern's uppercase-only letters, likewise lowercase."""
    cases = {}
    for lead, first, count, case in LATIN_EXTENDED_LETTERS + GREEK_LETTERS + CYRILLIC_LETTERS:
        for tail in range(first, first + count):
            cases[(lead & 0x1F) << 6 | tail & 0x3F] = case, tail
    for second, first, count, case in EXTENDED_ADDITIONAL_LETTERS:
        for tail in range(first, first + count):
            cases[(EXTENDED_ADDITIONAL_LEAD & 0xF) << 12 | (second & 0x3F) << 6 | tail & 0x3F] = case, tail
    ranges = LATIN_EXTENDED_LETTERS + GREEK_LETTERS + CYRILLIC_LETTERS + EXTENDED_ADDITIONAL_LETTERS
    assert len(cases) == sum(count for _, _, count, _ in ranges)  # no range overlaps another
    for cp, (case, tail) in cases.items():
        if case in (EVEN, ODD):
            case = UPPER if (tail % 2 == 0) == (case == EVEN) else LOWER
        flags = FLAGS[cp] & (LETTER | UPPERISH | LOWERISH | NUMBER | WHITESPACE | HAN_FLAG)
        assert flags == LETTER | (UPPERISH if case == UPPER else LOWERISH), hex(cp)


def test_the_hebrew_and_arabic_letters_and_symbols_windows_class():
    """The letters are of both cases, the symbols symbols."""
    letters = [(lead & 0x1F) << 6 | second & 0x3F for lead, first, count in RTL_LETTERS
               for second in range(first, first + count)]
    symbols = [(lead & 0x1F) << 6 | second & 0x3F for lead, first, count in RTL_SYMBOLS
               for second in range(first, first + count)]
    assert len(set(letters + symbols)) == len(letters) + len(symbols)
    for cp in letters:
        flags = FLAGS[cp] & (LETTER | UPPERISH | LOWERISH | NUMBER | WHITESPACE | HAN_FLAG)
        assert flags == LETTER | UPPERISH | LOWERISH, hex(cp)
    for cp in symbols:
        assert FLAGS[cp] & (LETTER | UPPERISH | LOWERISH | NUMBER | WHITESPACE | HAN_FLAG) == 0, hex(cp)


def _three_byte_code_points(ranges) -> list[int]:
    return [(lead & 0xF) << 12 | (second & 0x3F) << 6 | third & 0x3F
            for lead, second, first, count in ranges for third in range(first, first + count)]


def test_the_kana_and_wide_symbols_windows_class():
    """Kana are letters of both cases, neither numbers nor Han; the wide symbols are symbols."""
    kana, symbols = _three_byte_code_points(KANA), _three_byte_code_points(WIDE_SYMBOLS)
    assert len(set(kana)) == len(kana) and len(set(symbols)) == len(symbols) and not set(kana) & set(symbols)
    for cp in kana:
        flags = FLAGS[cp] & (LETTER | UPPERISH | LOWERISH | NUMBER | WHITESPACE | HAN_FLAG)
        assert flags == LETTER | UPPERISH | LOWERISH, hex(cp)
    not_symbol = LETTER | UPPERISH | LOWERISH | NUMBER | WHITESPACE | HAN_FLAG
    for cp in symbols:
        assert FLAGS[cp] & not_symbol == 0, hex(cp)


window_letter_atoms = st.one_of(
    ascii_atoms, ascii_atoms,
    st.sampled_from(LATIN1 + PUNCTUATION + HANGUL + HAN + EXTENDED + EXTENDED_WORDS + WIDE + WIDE_WORDS + RTL
                    + RTL_WORDS + NO_BREAK + OTHER),
    st.sampled_from(["Stra\u00dfe", "\u00c4\u00d6\u00dc", " \u00bb%s\u00ab ", "\u00bbWort\u00ab", "\u00a7 3",
                     "\u201eWort\u201c", "l\u2019homme", "x \u2013 y", "\u2026\n", "\u00e9's", "x\u00d7y", "\u00f7",
                     "\ud55c\uad6dX", "\u5931\u6557: %s\n\n", "'%s' \u7684", "\u4e2d\u6587 abc"]),
    st.characters(min_codepoint=0x80, max_codepoint=0x24F), st.characters(min_codepoint=0xAC00, max_codepoint=0xD7FF),
    st.characters(min_codepoint=0x370, max_codepoint=0x52F), st.characters(min_codepoint=0x1DF0, max_codepoint=0x1F0F),
    st.characters(min_codepoint=0x580, max_codepoint=0x70F), st.characters(min_codepoint=0x3000, max_codepoint=0x30FF),
    st.characters(min_codepoint=0xFF00, max_codepoint=0xFFEF),
    st.characters(min_codepoint=0x3300, max_codepoint=0xA0FF))


@settings(max_examples=300, **SETTINGS)
@given(st.lists(window_letter_atoms, min_size=20, max_size=400).map("".join))
def test_random_text_with_the_letters_windows_class(text):
    _check(text)


WHITESPACE_MIXES = [" \n", "\n \n", "\n  \n  ", " \n\n ", "\t\n\t", "\r\n \r\n", "  ", "\n"]


@pytest.mark.parametrize("seed", range(8))
def test_long_random_texts_of_every_window_class(seed):
    """Long texts of random atoms (tricky ASCII, every letter windows take, their neighbours, whitespace with
    newlines): windows start after every kind of character, in every state."""
    rng = random.Random(seed)
    atoms = (TRICKY + LATIN1 + PUNCTUATION + HANGUL + HAN + EXTENDED + EXTENDED_WORDS + WIDE + WIDE_WORDS + RTL
             + RTL_WORDS + NO_BREAK + OTHER + WHITESPACE_MIXES * 4
             + ["word", "Word", " the", "123"] * 8)
    _check("".join(rng.choice(atoms) for _ in range(20_000)))


def test_the_symbols_windows_class_are_neither_letters_numbers_nor_whitespace():
    """The byte ranges of ``native.simd`` against the flag table the byte-wise path reads: every character windows
    take as a symbol is one for the pattern, and among U+00A1-U+00BF they take every symbol."""
    not_symbol = LETTER | UPPERISH | LOWERISH | NUMBER | WHITESPACE | HAN_FLAG
    tails = {first + k for first, count in LATIN1_SYMBOL_TAILS for k in range(count)}
    for cp in range(0x80, 0xC0):  # C2 xx
        assert (FLAGS[cp] & not_symbol == 0 and cp >= 0xA1) == (0x80 | (cp & 0x3F) in tails), hex(cp)
    first, count = PUNCTUATION_THIRD
    for cp in range(0x2000, 0x2040):  # E2 80 xx
        if first <= 0x80 | (cp & 0x3F) < first + count:
            assert FLAGS[cp] & not_symbol == 0, hex(cp)


@pytest.fixture(scope="module")
def one_thread() -> kimi_tok.Tokenizer:
    return kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)


@settings(max_examples=60, **SETTINGS)
@given(st.lists(window_letter_atoms, min_size=20, max_size=400).map("".join))
def test_text_in_windows_beyond_ascii_gives_reference_ids(one_thread, ref, text):
    """The same texts through a Tokenizer (windows, then BPE) against the tiktoken reference."""
    assert_parity(one_thread, ref, [(text, False)], tiktoken_safe=False)
