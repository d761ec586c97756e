"""Edge cases: kimi_tok's ids equal the tiktoken reference's, and the API behaves as documented.

Every expected id list comes from ``tests/reference.py`` (tiktoken + the official
tiktoken-safe chunking); nothing is hard-coded.
"""

from __future__ import annotations

import numpy as np
import pytest

import kimi_tok
from kimi_tok import KIMI_PATTERN
from kimi_tok.pipeline.pretokenize import RegexPreTokenizer
from kimi_tok.pipeline.pretokenize.kimi_scanner import scan_runs
from kimi_tok.pipeline.pretokenize.unicode_classes import code_point_flags
from tests.parity import assert_batched_parity, assert_parity
from tests.reference import MAX_PIECE_CHARS, MAX_RUN_CHARS, safe_substrings

# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------

SPECIAL_LOOKING = [
    "<|open|>",
    "<|close|>",
    "<|sep|>",
    "<|end_of_msg|>",
    "[BOS]",
    "[EOS]",
    "[EOT]",
    "[UNK]",
    "[PAD]",
    "<|media_pad|>",
    "<osagent_mode>",
    "<|reserved_token_163700|>",
    "[start_header_id]user[end_header_id]",
    "<|open|><|close|>",  # adjacent specials
    "<|open|><|open|><|open|>",
    "[EOS][BOS][EOS]",
    "<|open|>message<|sep|>",  # specials touching text
    "hi<|open|>there",
    "x<|sep|>",
    "<|sep|>x",
    " <|sep|> ",
    "\n<|open|>\n",
    "<<|open|>>",
    "<|<|open|>|>",
    "[[EOS]]",
    "'s<|open|>'s",
    "123<|open|>456",
    "中<|open|>中",
    "<|not_special|>",  # special-looking, not special
    "<| |>",
    "<||>",
    "<|open|",  # truncated special
    "<|open",
    "|open|>",
    "<|OPEN|>",
    "[eos]",
    "<|im_end|>",
    "<|endoftext|>",
    "<|reserved_token_99999999|>",
    "<|open|>" * 50,
]

CRLF = [
    "a\r\nb",
    "\r\n",
    "\r\n" * 5,
    "\r\r\n\n",
    "\n\r",
    "\r",
    "\r" * 30,
    "\n" * 30,
    " \r\n ",
    "x \r\n\t y",
    "line1\r\nline2\rline3\nline4\n\r\n",
    "a\r\n\r\n\r\nb",
    "  \n  \n",
    "\t\r\n\t",
    "!!\r\n\r\n",
    "...\n\n\nx",
    " \r",
    "\r\n \r\n  \r\n",
    "a\n\x0b\x0c\rb",
    "def f():\r\n    return 1\r\n",
]

COMBINING = [
    "e\u0301",
    "e\u0301te\u0301",
    " \u0301",
    "\u0301",
    "\u0301\u0301\u0301",
    "\u0301x",
    "a \u0301b",
    "\u0301's",
    "A\u0301'LL",
    "1\u0301",
    "中\u0301",
    "\u0915\u094d\u0937",
    "Z\u0351\u0327a\u0336\u0489l\u0352g\u0315o\u0360",
    "\n\u0301",
    "\u0301\n",
    "'\u0301",
    "\u20dd",  # enclosing mark
    "1\ufe0f\u20e3",
]

EMOJI = [
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "👩🏽‍💻 hi",
    "🧑‍🚀🐈‍⬛",
    "\u200d",
    "a\u200db",
    "1️⃣",
    "🇯🇵🇨🇳",
    "😀😀😀",
    " 😀",
    "😀 ",
    "❤️",
    "👍🏽",
    "🫠x",
]

HAN = [
    "中文字符",
    "我们今天讨论分词器",
    "𠀀𠮷𪚥",  # Ext B
    "\U00031350\U00031351\U000323af",  # Ext H
    "\U0002ebf0\U0002ebf1\U0002ee5d",  # Ext I
    "\U00030000\U0003134a",  # Ext G
    "\u3400\u4dbf",  # Ext A
    "\U0002f800\U0002fa1d",  # compatibility supplement
    "中a中",
    "中 中",
    "〇々〻",
    "、。",  # Common script (Han only by Script_Extensions)
    "⺀⼀",  # radicals
    "ｶﾀｶﾅ",
    "東京 ラーメン",
    "中1中",
    "中'中",
    "a中's",
]

NUMBERS = [
    "1",
    "12",
    "123",
    "1234",
    "12345",
    "1234567",
    "12345678901234567890",
    "3.14159",
    "-42",
    "1,000,000",
    "x2y3",
    "²³",
    "١٢٣٤٥",  # Arabic-Indic
    "०१२३४",  # Devanagari
    "①②③④",
    "Ⅻ",
    "½¾",
    "𝟏𝟐𝟑𝟒",
    "٣abc",
    "0x1F",
    " 1234 5678",
    "1e-10",
    "๑๒๓",
    "〇一二三",
]

CONTRACTIONS = [
    "I'LL",
    "we'Re",
    "it's",
    "'s",
    "don'T",
    "'S",
    "'ll",
    "'LL",
    "'lL",
    "y'all",
    "I'm",
    "X'VE",
    "they've",
    "she'd",
    "'D",
    "rock'n'roll",
    "o'clock",
    "''s",
    "'",
    "a'",
    "'re's",
    "it'ſ",  # U+017F LATIN SMALL LETTER LONG S folds to 's' under (?i)
    "IT'ſ",
    "'ſ",
    "it'\u212a",  # KELVIN SIGN (folds to k): not a contraction
    "don\u2019t",  # right single quotation mark: not an apostrophe
    " 's",
    "\n's",
    "1's",
    "中's",
    "É'S",
]

CONTROL_AND_ODD = [
    "\x00",
    "a\x00b",
    "\x00" * 10,
    "\x01\x02\x1b[0m",
    "\x7f",
    "\ufffe",
    "\uffff",
    "\U0001fffe",
    "\U0010ffff",
    "\U0010fffe",
    "\ue000",
    "\uf8ff",
    "\U000f0000\U000ffffd",
    "\ufeff",
    "\ufffd",
    "\u00ad",
    "\u200b\u200c",
    "\u2028\u2029",
    "\x85",
    "\u180e",
    "\u3000 \u3000",
    "a\xa0b",
    "\x1c\x1d\x1e\x1f",
    "a\x1cb",
    " \x1c ",
    "\t\t x",
    "\x0b\x0c",
    "   x",
    "x   ",
    "   ",
]

MIXED_SCRIPTS = [
    "Привет мир",
    "ВНИМАНИЕ Ошибка",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Γειά σου κόσμε ΑΛΦΑ",
    "สวัสดีครับ",
    "Tiếng Việt",
    "שלום עולם",
    "안녕하세요",
    "Straße ÜBER",
    "ǅungla ǈ",  # title case letters
    "McDonald's iPhone eBay macOS",
    "HTTPServer JSONDecodeError",
    "snake_case kebab-case camelCase",
]

# Where the scanner's ASCII fast path (``pretokenize._ascii_piece_end``) must hand over to the
# general matcher: a non-ASCII letter, mark or digit right where the ASCII run stops.
ASCII_FAST_PATH_EDGES = [
    "café", "CAFÉ", "Ab\u0301c", "ABC\u0301", "naïve", " naïve", "\tword\u00e9", "(Ωmega", "(ωmega", "ABCσ",
    "ABC\u01c5x", "word\u02b0", "abc\u3005", "12\u0663", "1\u00b2", "123\u0663", "7\u2167", "9\uff19",
    "it'ſ", "IT'S", "it's\u0301", "we'RE", "x'll'd", "'s", "a'", "Hello World", "helloWorld", "HTTPServer",
    "ABC", " ABC", "\u00a0word", "\u3000word", "-ABC's", "\rword", "\nword", "\r\nWord", "_snake_case",
    "x1", "1x", "12345678", "a\u200db", "e\u0301\u0301", "Z\u0308ebra",
]

TEXT_CASES = (
    [("", False), ("", True)]
    + [(s, False) for s in ASCII_FAST_PATH_EDGES]
    + [(s, allow) for s in SPECIAL_LOOKING for allow in (False, True)]
    + [(s, False) for s in CRLF + COMBINING + EMOJI + HAN + NUMBERS + CONTRACTIONS + CONTROL_AND_ODD + MIXED_SCRIPTS]
    + [(s, True) for s in CRLF[:5] + CONTRACTIONS[:5] + HAN[:3]]
)


def _id(case) -> str:
    text, allow = case
    r = repr(text)
    return (r if len(r) <= 40 else r[:37] + "...") + ("-allow" if allow else "")


@pytest.mark.parametrize("case", TEXT_CASES, ids=[_id(c) for c in TEXT_CASES])
def test_single_segment_matches_reference(tok, ref, case):
    """One segment, both special modes where relevant: ids equal the reference."""
    text, allow = case
    assert_parity(tok, ref, [(text, allow)])


@pytest.mark.parametrize("case", TEXT_CASES[::3], ids=[_id(c) for c in TEXT_CASES[::3]])
def test_single_segment_matches_reference_unchunked(tok, ref, case):
    """The same, with tiktoken-safe chunking off (one tiktoken call per segment)."""
    text, allow = case
    assert_parity(tok, ref, [(text, allow)], tiktoken_safe=False)


@pytest.mark.parametrize("case", TEXT_CASES[:60], ids=[_id(c) for c in TEXT_CASES[:60]])
def test_encode_equals_single_segment(tok, ref, case):
    """``encode(text, allow_special)`` is ``encode_segments([(text, allow_special)])``."""
    text, allow = case
    assert tok.encode(text, allow_special=allow).ids == ref.encode(text, allow)


def test_empty_inputs(tok, ref):
    """Empty text, an empty segment list and empty segment strings give no ids (as the reference)."""
    assert tok.encode("").ids == ref.encode("") == []
    assert tok.encode("", allow_special=True).ids == []
    assert tok.encode("", tiktoken_safe=False).ids == []
    assert tok.encode_segments([]).ids == ref.encode_segments([]) == []
    assert tok.encode_segments(()).ids == []
    assert tok.encode_segments([("", False), ("", True)]).ids == []
    segs = [("", False), ("a", False), ("", True), ("<|open|>", True), ("", False), ("b", False), ("", True)]
    assert_parity(tok, ref, segs)
    assert_parity(tok, ref, segs, tiktoken_safe=False)


def test_specials_in_both_modes_and_mixed_segments(tok, ref):
    """A rendered-chat-like list: specials allowed in their own segments, literal in text segments."""
    segs = [
        ("<|open|>", True),
        ("message", False),
        (' role="user"', False),
        ("<|sep|>", True),
        ("Please print <|open|>message<|sep|>[EOS] literally", False),
        ("<|close|>", True),
        ("message", False),
        ("<|sep|>", True),
        ("<|end_of_msg|>", True),
        ("<|open|>think<|sep|>mixed <|close|> allowed[EOS]", True),
    ]
    assert_parity(tok, ref, segs)
    assert_parity(tok, ref, segs, tiktoken_safe=False)


def test_every_special_token_allowed_and_literal(tok, ref):
    """Each of the 256 special tokens, alone and touching text, allowed (one id) and literal."""
    specials = tok.special_tokens
    assert specials == ref.enc._special_tokens
    for text, id_ in specials.items():
        assert tok.encode(text, allow_special=True).ids == [id_]
    segs = [(f"a{t}b", allow) for t in specials for allow in (True, False)]
    assert_parity(tok, ref, segs)
    assert_parity(tok, ref, [("".join(specials), True), ("".join(specials), False)])


# ---------------------------------------------------------------------------------------------
# Long runs: the 25,000-character cut of tiktoken-safe chunking
# ---------------------------------------------------------------------------------------------

RUN_CHARS = [" ", "a", "\xa0", "\x1c", "\n", "\t", "\u3000", "é", "😀", "中", "1", "!"]
RUN_LENGTHS = [24_999, 25_000, 25_001, 50_001]


@pytest.mark.parametrize("n", RUN_LENGTHS)
@pytest.mark.parametrize("ch", RUN_CHARS, ids=[repr(c) for c in RUN_CHARS])
def test_long_runs(tok, ref, ch, n):
    """Runs around the 25,000-character cut (of whitespace or not, 1 to 4 UTF-8 bytes per char)."""
    assert_parity(tok, ref, [(ch * n, False)])
    assert_parity(tok, ref, [("x" + ch * n + "y", False)])
    assert_parity(tok, ref, [(" " + ch * n + "\n", False)])


@pytest.mark.parametrize("ch", [" ", "a", "\x1c", "\xa0"], ids=repr)
def test_long_runs_unchunked(tok, ref, ch):
    """Without chunking a long run is one tiktoken call."""
    assert_parity(tok, ref, [(ch * 50_001, False), ("x" + ch * 25_001, False)], tiktoken_safe=False)


LONG_MIXED = [
    "x" + "a" * 20_000 + "\x1c" * 3 + "a" * 10_000 + "y",  # \x1c is whitespace to str.isspace
    "x" + "a" * 20_000 + "\xa0" * 3 + "a" * 10_000 + "y",
    "a" * 25_000 + " " + "a" * 25_000,
    "a" * 25_000 + " " * 25_001 + "a" * 25_001,
    " " * 24_999 + "ab" + " " * 25_001,
    "ab " * 20_000,
    "\r\n" * 13_000,  # \r\n is all whitespace: one 26,000-char run
    "a" * 24_999 + "\ud83d\ude00" + "b",  # a surrogate pair cut by the 25k run cut
    "a" * 24_999 + "😀" + "b",
    " " * 24_999 + "\u2028" + "x",
    "<|open|>" * 4_000,  # 32,000 non-space chars: the cut splits a special token
]


@pytest.mark.parametrize("text", LONG_MIXED, ids=lambda t: f"len{len(t)}-{t[:3]!r}-{t[-3:]!r}")
@pytest.mark.parametrize("allow", [False, True])
def test_long_mixed_runs(tok, ref, text, allow):
    """Mixed long runs, incl. whitespace that only Python counts (\\x1c) and cut specials."""
    assert_parity(tok, ref, [(text, allow)])


SWEEP_UNITS = ["a", "ab", "abc", "aab", "abb", "th", "ing", "é", "ж", "Жж", "ー", "ア", "🙂", "=-", "/", "\u0301",
               "e\u0301", "ab\u0301", "한", "ก", "ि", "x\u200d", " ", "\n", "\t ", "ǅ", "ß", "İ", "ſ"]


def test_piece_length_sweep(tok, ref):
    """Repeated units 1..80 times (pieces of 1 to 320 bytes, across bpe.py's 32-byte short-piece
    size), bare, after a space and after a capital: the same ids as the reference."""
    samples = [prefix + unit * k for unit in SWEEP_UNITS for k in range(1, 81) for prefix in ("", " ", "X")]
    assert_batched_parity(tok, lambda s: ref.encode(s, False), samples, label="piece length sweep")


def test_reference_chunking_sanity():
    """The reference itself cuts where README says (guards the ground truth this suite relies on)."""
    assert safe_substrings("") == []
    assert safe_substrings("a" * MAX_RUN_CHARS) == ["a" * MAX_RUN_CHARS]
    assert safe_substrings("a" * (MAX_RUN_CHARS + 1)) == ["a" * MAX_RUN_CHARS, "a"]
    assert safe_substrings("\x1c" * (MAX_RUN_CHARS + 1)) == ["\x1c" * MAX_RUN_CHARS, "\x1c"]
    text = ("abcd " * 100_000)[: MAX_PIECE_CHARS + 10]
    assert [len(s) for s in safe_substrings(text)] == [MAX_PIECE_CHARS, 10]


# ---------------------------------------------------------------------------------------------
# The 400,000-character boundary (step 1 of the chunking)
# ---------------------------------------------------------------------------------------------


SURROGATE_PAIR = b"\xed\xa0\xbd\xed\xb8\x80".decode("utf-8", "surrogatepass")  # "\ud83d\ude00"


def _filler(n: int) -> str:
    """``n`` characters of short words (no 25k runs), so only the 400k cut matters."""
    unit = "lorem ipsum dolor sit amet, consectetur 123 中文 "
    return (unit * (n // len(unit) + 1))[:n]


def _around(at: int, inner: str, total: int = MAX_PIECE_CHARS + 5_000) -> str:
    """Filler with ``inner`` written starting at index ``at``."""
    base = _filler(total)
    return base[:at] + inner + base[at + len(inner):]


BOUNDARY_TEXTS = {
    "mid-word": _around(MAX_PIECE_CHARS - 4, "abcdefgh"),
    "word-ends-at-cut": _around(MAX_PIECE_CHARS - 4, "abcd efgh"),
    "mid-number": _around(MAX_PIECE_CHARS - 2, "12345"),
    "mid-han": _around(MAX_PIECE_CHARS - 2, "中文字符"),
    "mid-crlf": _around(MAX_PIECE_CHARS - 1, "\r\n"),
    "mid-contraction": _around(MAX_PIECE_CHARS - 3, "don't"),
    "mid-emoji-zwj": _around(MAX_PIECE_CHARS - 2, "👨\u200d👩\u200d👧"),
    "mid-combining": _around(MAX_PIECE_CHARS - 1, "e\u0301\u0301"),
    "mid-special": _around(MAX_PIECE_CHARS - 4, "<|open|>"),
    "special-at-cut": _around(MAX_PIECE_CHARS, "<|open|>"),
    # A valid pair as two code points (built with surrogatepass) at indices 399,999 and 400,000.
    "mid-surrogate-pair": _around(MAX_PIECE_CHARS - 1, SURROGATE_PAIR),
    "pair-before-cut": _around(MAX_PIECE_CHARS - 2, "\ud83d\ude00"),
    "lone-high-at-cut": _around(MAX_PIECE_CHARS, "\ud83d"),
    "lone-low-before-cut": _around(MAX_PIECE_CHARS - 1, "\ude00"),
    "two-cuts": _filler(2 * MAX_PIECE_CHARS + 7),
    "astral-filler": ("😀 中 " * 100_001)[: MAX_PIECE_CHARS + 9],  # 4-byte chars: bytes != code points
    "exactly-400k": _filler(MAX_PIECE_CHARS),
    "400k-plus-1": _filler(MAX_PIECE_CHARS + 1),
}


@pytest.mark.parametrize("name", list(BOUNDARY_TEXTS))
def test_400k_boundary(tok, ref, name):
    """Text crossing the 400,000-character cut mid-word, mid-special, mid-surrogate-pair, ..."""
    text = BOUNDARY_TEXTS[name]
    assert_parity(tok, ref, [(text, False)])
    if "special" in name or "surrogate" in name:
        assert_parity(tok, ref, [(text, True)])


@pytest.mark.parametrize("name", ["mid-word", "mid-surrogate-pair", "mid-special"])
def test_400k_boundary_unchunked(tok, ref, name):
    """With chunking off the 400k cut does not happen."""
    assert_parity(tok, ref, [(BOUNDARY_TEXTS[name], True)], tiktoken_safe=False)


def test_surrogate_pair_string_is_two_code_points():
    """The straddling pair really is two code points at 399,999 and 400,000 (test setup check)."""
    text = BOUNDARY_TEXTS["mid-surrogate-pair"]
    assert text[MAX_PIECE_CHARS - 1] == "\ud83d" and text[MAX_PIECE_CHARS] == "\ude00"
    assert SURROGATE_PAIR == "\ud83d\ude00" and len(SURROGATE_PAIR) == 2
    assert SURROGATE_PAIR.encode("utf-16", "surrogatepass").decode("utf-16") == "😀"  # tiktoken's fix-up joins it


SURROGATE_TEXTS = [
    "\ud800",
    "\udfff",
    "\ud83d",
    "\ude00",
    "\ude00\ud83d",  # reversed: two lone surrogates
    "\ud83d\ude00",  # a pair written as two code points
    "ab\ud83d\ude00cd",
    "a\ud800b",
    "x \ud800 y",
    "\ud800\ud800\udc00",
    "<|open|>\ud800<|close|>",
    "it'\ud800s",
    "\ud800" * 30_000,
    " " * 25_000 + "\ud800",
    "a" * 25_000 + "\ud800",
]


@pytest.mark.parametrize("text", SURROGATE_TEXTS, ids=lambda t: repr(t[:12]) + f"-len{len(t)}")
@pytest.mark.parametrize("allow", [False, True])
@pytest.mark.parametrize("safe", [True, False])
def test_lone_surrogates(tok, ref, text, allow, safe):
    """Lone surrogates are replaced (and pairs joined) per tiktoken sub-string, as tiktoken does."""
    assert_parity(tok, ref, [("pre", False), (text, allow), ("post", False)], tiktoken_safe=safe)


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------

VALID_TEXTS = [s for s, _ in TEXT_CASES] + ["a" * 25_001 + " " * 25_001, BOUNDARY_TEXTS["mid-word"]]


def test_decode_round_trip(tok):
    """decode(encode(x)) == x for valid text (with and without specials allowed)."""
    for text in VALID_TEXTS:
        for allow in (False, True):
            ids = tok.encode(text, allow_special=allow).ids
            assert tok.decode(ids) == text
            assert tok.decode_bytes(ids) == text.encode("utf-8")


def test_decode_matches_tiktoken(tok, ref):
    """decode_bytes agrees with tiktoken's decode_bytes, also for ids that split a character."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, tok.n_vocab, size=5_000).tolist()
    assert tok.decode_bytes(ids) == ref.enc.decode_bytes(ids)
    assert tok.decode(ids) == ref.enc.decode(ids, errors="replace")
    for id_ in (0, 1, 255, 256, 163_583, 163_584, 163_839):
        assert tok.decode_bytes([id_]) == ref.enc.decode_single_token_bytes(id_)


def test_lists_of_ids_decode_from_the_bytes_seen_alike(tok, ref, monkeypatch):
    """A list or tuple of plain ints is decoded without a compiled call, from a dict of the bytes of ids met
    before (new ids are checked, then added): the same bytes as tiktoken and the compiled path; a bad id
    raises as before and adds nothing."""
    from kimi_tok.pipeline import decode

    decoder = tok._decoder
    rng = np.random.default_rng(7)
    cases = [rng.integers(0, tok.n_vocab, size=n).tolist() for n in (1, 2, 9, 100, 20_000)]
    compiled = [tok.decode_bytes(np.asarray(ids)) for ids in cases]
    with monkeypatch.context() as patch:
        patch.setattr(decode, "gather_bytes", lambda *args: pytest.fail("a list took the compiled path"))
        for ids, expected in zip(cases, compiled):
            assert expected == ref.enc.decode_bytes(ids)
            assert tok.decode_bytes(ids) == expected  # some ids met for the first time
            assert tok.decode_bytes(tuple(ids)) == expected  # every id seen now
            assert tok.decode(ids) == ref.enc.decode(ids, errors="replace")
    seen = dict(decoder.bytes_seen)
    for bad, error in (([5, -1], ValueError), ([5, tok.n_vocab], ValueError), ([5, True], TypeError),
                       ((5, False), TypeError), ([5, 2**70], ValueError)):
        with pytest.raises(error):
            tok.decode_bytes(bad)
    assert decoder.bytes_seen == seen


def test_decode_accepts_numpy_and_empty(tok):
    """decode takes lists, tuples and integer arrays of any integer dtype, and empty input."""
    ids = tok.encode("hello world <|open|>", allow_special=True).ids
    for form in (ids, tuple(ids), np.array(ids, dtype=np.uint32), np.array(ids, dtype=np.int64),
                 np.array(ids, dtype=np.int32)):
        assert tok.decode(form) == "hello world <|open|>"
    assert tok.decode([]) == ""
    assert tok.decode(np.zeros(0, dtype=np.uint32)) == ""
    assert tok.decode_bytes([]) == b""


def test_decode_n_vocab_is_exclusive(tok, ref):
    """n_vocab - 1 is the last id; n_vocab itself is rejected with a message naming it."""
    assert tok.n_vocab == ref.enc.n_vocab
    tok.decode([tok.n_vocab - 1])
    with pytest.raises(ValueError, match=str(tok.n_vocab)):
        tok.decode([5, tok.n_vocab])


# ---------------------------------------------------------------------------------------------
# Vocabulary lookups
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("id_", [0, 1, 32, 255, 256, 1000, 22931, 100_000, 163_583, 163_584, 163_587, 163_839])
def test_token_id_round_trip(tok, ref, id_):
    """id_to_token then token_to_id gives the id back; specials show as their text."""
    token = tok.id_to_token(id_)
    assert token is not None
    assert tok.token_to_id(token) == id_
    if id_ >= 163_584:
        assert token.encode("utf-8") == ref.enc.decode_single_token_bytes(id_)
        assert tok.special_tokens[token] == id_


def test_token_lookups_of_unknowns(tok):
    """Unknown ids and tokens give None rather than raising."""
    assert tok.id_to_token(-1) is None
    assert tok.id_to_token(tok.n_vocab) is None
    assert tok.id_to_token(True) is None
    assert tok.token_to_id("") is None
    assert tok.token_to_id("<|definitely_not_a_token|>") is None
    assert tok.token_to_id("\U0001f600" * 3) is None  # not in the byte-level alphabet


def test_special_tokens_property(tok, ref):
    """special_tokens is a copy of the 256 specials of special_tokens.json."""
    specials = tok.special_tokens
    assert specials == ref.enc._special_tokens
    assert len(specials) == 256
    specials["<|open|>"] = 0
    assert tok.special_tokens["<|open|>"] == ref.enc._special_tokens["<|open|>"]


# ---------------------------------------------------------------------------------------------
# Encoding objects
# ---------------------------------------------------------------------------------------------


def test_into_numpy_dtype_no_copy_and_drain(tok, ref):
    """into_numpy hands over the uint32 ids without copying, then the Encoding is drained."""
    segs = [("<|open|>", True), ("hello world", False), ("<|sep|>", True)]
    enc = tok.encode_segments(segs)
    assert len(enc) == len(ref.encode_segments(segs))
    internal = enc._array()  # the Encoding's own array (private: checks the no-copy promise)
    out = enc.into_numpy()
    assert set(out) == {"ids"}
    ids = out["ids"]
    assert ids.dtype == np.uint32 and ids.ndim == 1
    assert ids is internal or np.shares_memory(ids, internal)
    assert ids.tolist() == ref.encode_segments(segs)
    with pytest.raises(ValueError):
        len(enc)
    with pytest.raises(ValueError):
        enc.ids
    with pytest.raises(ValueError):
        enc.into_numpy()
    assert "drained" in repr(enc)


def test_into_numpy_masks(tok, ref):
    """attention_mask is all ones, type_ids all zeros, special_tokens_mask 1 exactly at specials."""
    segs = [("<|open|>", True), ("message <|open|>", False), ("<|sep|>[EOS]x", True), ("", False)]
    expected = ref.encode_segments(segs)
    out = tok.encode_segments(segs).into_numpy(
        ids=True, attention_mask=True, type_ids=True, special_tokens_mask=True
    )
    assert set(out) == {"ids", "attention_mask", "type_ids", "special_tokens_mask"}
    for name, array in out.items():
        assert array.dtype == np.uint32, name
        assert array.shape == (len(expected),), name
    assert out["ids"].tolist() == expected
    assert out["attention_mask"].tolist() == [1] * len(expected)
    assert out["type_ids"].tolist() == [0] * len(expected)
    special_ids = set(ref.enc._special_tokens.values())
    assert out["special_tokens_mask"].tolist() == [int(i in special_ids) for i in expected]
    assert sum(out["special_tokens_mask"].tolist()) == 3


def test_into_numpy_without_ids(tok):
    """Only the requested arrays come back; asking for masks only still drains."""
    enc = tok.encode("a b c")
    out = enc.into_numpy(ids=False, attention_mask=True)
    assert set(out) == {"attention_mask"}
    assert out["attention_mask"].tolist() == [1] * 3
    with pytest.raises(ValueError):
        len(enc)


def test_into_numpy_empty(tok):
    """An empty Encoding gives empty uint32 arrays."""
    out = tok.encode_segments([]).into_numpy(attention_mask=True, special_tokens_mask=True)
    for array in out.values():
        assert array.dtype == np.uint32 and array.shape == (0,)


def test_encode_to_numpy_and_add_special_tokens(tok, ref):
    """encode_to_numpy == encode_segments(...).into_numpy()['ids']; add_special_tokens changes nothing."""
    segs = [("<|open|>", True), ("hi there", False)]
    expected = ref.encode_segments(segs)
    assert tok.encode_to_numpy(segs).tolist() == expected
    assert tok.encode_segments(segs, add_special_tokens=True).ids == expected


def test_profile_segments(tok):
    """profile_segments reports a non-negative time for each pipeline stage."""
    timings = tok.profile_segments([("<|open|>", True), ("hello " * 100, False)])
    assert {"segments", "chunking", "specials", "pretokenize", "bpe"} <= set(timings)
    assert all(t >= 0 for t in timings.values())


# ---------------------------------------------------------------------------------------------
# Argument checking
# ---------------------------------------------------------------------------------------------

GOOD = [("a", False), ("<|open|>", True), ("b", False)]  # indices 0-2; the bad segment is 3


@pytest.mark.parametrize(
    "bad, words",
    [
        ("just a str", ["segment 3", "pair", "str"]),
        (("a", False, True), ["segment 3", "pair", "length 3"]),
        (("a",), ["segment 3", "pair", "length 1"]),
        ((b"bytes", False), ["segment 3", "text", "bytes"]),
        ((None, False), ["segment 3", "text", "NoneType"]),
        (("a", 1), ["segment 3", "allow_special", "int"]),
        (("a", "yes"), ["segment 3", "allow_special", "str"]),
        (("a", None), ["segment 3", "allow_special", "NoneType"]),
        (None, ["segment 3"]),
        (42, ["segment 3"]),
    ],
    ids=repr,
)
def test_bad_segment_type_error_names_index(tok, bad, words):
    """A bad segment raises TypeError whose message names its index and what is wrong."""
    with pytest.raises(TypeError) as info:
        tok.encode_segments(GOOD + [bad] + GOOD)
    message = str(info.value)
    for word in words:
        assert word in message, message


def test_segment_as_list_and_numpy_bool(tok, ref):
    """A [text, flag] list and a NumPy bool flag are accepted like a tuple and a bool."""
    expected = ref.encode_segments([("<|open|>hi", True)])
    assert tok.encode_segments([["<|open|>hi", True]]).ids == expected
    assert tok.encode_segments([("<|open|>hi", np.bool_(True))]).ids == expected


@pytest.mark.parametrize("segments", ["text", b"text", None, 5, {"a": False}])
def test_segments_not_a_sequence(tok, segments):
    """segments must be a list/tuple of pairs: a str, bytes, None, ... raise TypeError."""
    with pytest.raises(TypeError, match="segments"):
        tok.encode_segments(segments)


def test_generator_of_segments(tok, ref):
    """The API takes a Sequence; a generator raises a clear TypeError (it is not consumed silently)."""
    gen = ((t, a) for t, a in GOOD)
    with pytest.raises(TypeError, match="generator"):
        tok.encode_segments(gen)
    assert tok.encode_segments(list((t, a) for t, a in GOOD)).ids == ref.encode_segments(GOOD)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"allow_special": 1},
        {"allow_special": "yes"},
        {"allow_special": None},
        {"tiktoken_safe": 0},
        {"tiktoken_safe": "no"},
    ],
    ids=repr,
)
def test_encode_flag_types(tok, kwargs):
    """encode's flags must be bools."""
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        tok.encode("abc", **kwargs)


@pytest.mark.parametrize("kwargs", [{"add_special_tokens": 1}, {"tiktoken_safe": None}], ids=repr)
def test_encode_segments_flag_types(tok, kwargs):
    """encode_segments's flags must be bools."""
    with pytest.raises(TypeError, match=next(iter(kwargs))):
        tok.encode_segments(GOOD, **kwargs)


@pytest.mark.parametrize("text", [b"abc", None, 1, ["a"]], ids=repr)
def test_encode_text_type(tok, text):
    """encode's text must be a str."""
    with pytest.raises(TypeError, match="str"):
        tok.encode(text)


def test_kimi_k3_is_cached():
    """kimi_k3() returns one shared Tokenizer."""
    assert kimi_tok.kimi_k3() is kimi_tok.kimi_k3()


def test_scanner_pieces_at_ascii_fast_path_edges():
    """Ids alone can hide a wrong cut (BPE of "caf" + "é" equals that of "café"): the scanner's
    pieces must equal the PCRE2 regex's where its ASCII fast path hands over."""
    split = RegexPreTokenizer(KIMI_PATTERN).split
    flags = code_point_flags()
    samples = [pre + s + post for s in ASCII_FAST_PATH_EDGES for pre in ("", " ", "x", "7") for post in ("", "!", " y")]
    for sample in samples:
        buf = np.frombuffer(sample.encode("utf-8"), dtype=np.uint8)
        bounds = np.array([0, buf.shape[0]], dtype=np.int64)
        _, piece_end = scan_runs(buf, bounds[:1], bounds[1:], np.full(1, -1, dtype=np.int64), flags)
        got = [buf[a:b].tobytes().decode("utf-8") for a, b in zip([0, *piece_end[:-1].tolist()], piece_end.tolist())]
        assert got == split(sample), f"{sample!r}: scanner {got!r}, PCRE2 {split(sample)!r}"
