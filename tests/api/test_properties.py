"""Property tests (hypothesis, derandomized): random segment lists give the reference's ids.

The text strategy mixes scripts, every kind of whitespace (incl. ``\\r \\n \\t \\x0b \\x1c
\\xa0 \\u3000 \\u2028``), digits, apostrophes and contractions, punctuation, combining
marks, emoji (with ZWJ), Han (incl. Ext B/H/I), special-token text with random allow
flags, and arbitrary code points. On failure hypothesis shrinks to a minimal example.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kimi_tok
from kimi_tok import KIMI_PATTERN
from kimi_tok.pipeline.pretokenize import RegexPreTokenizer
from kimi_tok.pipeline.pretokenize.kimi_scanner import scan_runs
from kimi_tok.pipeline.pretokenize.unicode_classes import code_point_flags
from tests.parity import assert_parity

# module-level: hypothesis tests cannot take function-scoped fixtures; every call goes through the segment cache
TOK = kimi_tok.kimi_k3(policy=kimi_tok.Policy.from_env(min_cached_call_chars=0))
# no cache: short calls are read in place (native.cpython.read_text_pairs), not packed
IN_PLACE = kimi_tok.kimi_k3(segment_cache_bytes=0)

SPECIALS = [
    "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "[EOS]", "[BOS]", "[EOT]", "[PAD]",
    "<|media_pad|>", "<osagent_mode>", "<|reserved_token_163700|>", "[start_header_id]",
    "<|open|", "<|", "|>", "<|not_special|>", "<| |>", "[", "]",
]
CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'lL",
                "'d", "'D", "'", "''", "\u2019s", "ſ", "'ſ"]
WHITESPACE = [" ", "  ", "\r", "\n", "\r\n", "\t", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85",
              "\xa0", "\u1680", "\u2000", "\u2009", "\u200a", "\u202f", "\u205f", "\u3000", "\u2028",
              "\u2029", "\u200b", "\u180e", "\ufeff"]
DIGITS = list("0123456789") + ["١", "٣", "०", "①", "Ⅻ", "½", "²", "𝟏", "〇", "12", "123", "1234"]
PUNCT = list(".,;:!?-_()[]{}\"`/\\@#$%^&*+=<>|~") + ["...", "…", "。", "、", "「", "»", "—", "•", "€", "©"]
MARKS = ["\u0301", "\u0308", "\u0327", "\u20dd", "\u094d", "\u0e31", "\u05b7", "\u3099", "\ufe0f", "\u200d"]
EMOJI = ["😀", "🚀", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "🇯🇵", "1️⃣", "🫠", "❤️", "✅"]
HAN = ["中", "文", "字", "𠀀", "𠮷", "\U00031350", "\U0002ebf0", "\u3400", "々", "〻", "\U0002f800"]
LETTERS = ["a", "z", "A", "Z", "é", "É", "ǅ", "ß", "ẞ", "Ж", "ж", "α", "Ω", "ا", "ب", "क", "ि", "ก", "カ",
           "ｶ", "ひ", "ー", "한", "ㄱ", "ʰ", "ª", "ı", "İ", "K", "Å"]
WORDS = ["hello", "World", "HTTPServer", "iPhone", "I'LL", "don't", "WE'RE", "McDonald's", "Привет",
         "東京", "ラーメン", "def", "self", "__init__", "0x1F", "uuid", "NaN"]

ATOMS = SPECIALS + CONTRACTIONS + WHITESPACE + DIGITS + PUNCT + MARKS + EMOJI + HAN + LETTERS + WORDS

any_scalar = st.characters(exclude_categories=("Cs",))  # every code point but surrogates
atom = st.one_of(
    st.sampled_from(ATOMS),
    st.sampled_from(ATOMS),
    st.sampled_from(ATOMS),
    any_scalar,
)
texts = st.lists(atom, max_size=40).map("".join)
segments = st.lists(st.tuples(texts, st.booleans()), max_size=8)

SETTINGS = dict(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@settings(max_examples=300, **SETTINGS)
@given(segments)
def test_random_segments_match_reference(segs):
    """Random segment lists with random allow flags: ids equal the reference."""
    from tests.reference import Reference

    assert_parity(TOK, Reference(), segs)


@settings(max_examples=100, **SETTINGS)
@given(segments)
def test_random_segments_match_reference_unchunked(segs):
    """The same with tiktoken-safe chunking off."""
    from tests.reference import Reference

    assert_parity(TOK, Reference(), segs, tiktoken_safe=False)


@settings(max_examples=300, **SETTINGS)
@given(segments, st.booleans())
def test_random_segments_read_in_place_match_reference(segs, safe):
    """The same segment lists as short calls whose compiled call reads them where CPython keeps them: the
    reference's ids."""
    from tests.reference import Reference

    assert_parity(IN_PLACE, Reference(), segs, tiktoken_safe=safe)


@settings(max_examples=300, **SETTINGS)
@given(st.lists(atom, max_size=80).map("".join))
def test_random_text_scanner_equals_pcre2(text):
    """The compiled Kimi scanner cuts random text exactly where the PCRE2 JIT regex does."""
    raw = text.encode("utf-8")
    buf = np.frombuffer(raw, dtype=np.uint8)
    one = np.zeros(1, dtype=np.int64)
    _, piece_end = scan_runs(buf, one * 0, one + len(raw), one - 1, code_point_flags())
    got = [raw[a:b].decode("utf-8") for a, b in zip([0, *piece_end[:-1].tolist()], piece_end.tolist())]
    assert got == RegexPreTokenizer(KIMI_PATTERN).split(text)


RUN_UNITS = [" ", "a", "\xa0", "\x1c", "\n", "\r\n", "\t", "中", "😀", "é", "1", "!", "<|open|>", "ab ", " \u3000"]
run_counts = st.one_of(st.sampled_from([1, 2, 12_499, 12_500, 12_501, 24_998, 24_999, 25_000, 25_001, 25_002]),
                       st.integers(1, 30_000))
long_texts = st.lists(st.tuples(st.sampled_from(RUN_UNITS), run_counts), min_size=1, max_size=3).map(
    lambda parts: "".join(unit * n for unit, n in parts)
)


@settings(max_examples=80, **SETTINGS)
@given(st.lists(st.tuples(long_texts, st.booleans()), min_size=1, max_size=2))
def test_random_long_runs_match_reference(segs):
    """Random long runs around the 25,000-character cut (any kind of character): same ids."""
    from tests.reference import Reference

    assert_parity(TOK, Reference(), segs)


with_surrogates = st.lists(
    st.one_of(atom, st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.just("\ud83d\ude00")),
    max_size=30,
).map("".join)


@settings(max_examples=100, **SETTINGS)
@given(st.lists(st.tuples(with_surrogates, st.booleans()), max_size=4), st.booleans())
def test_random_text_with_lone_surrogates(segs, safe):
    """Text holding lone surrogates (and pairs written as two code points): same ids."""
    from tests.reference import Reference

    assert_parity(TOK, Reference(), segs, tiktoken_safe=safe)


@settings(max_examples=200, **SETTINGS)
@given(texts, st.booleans())
def test_random_round_trip(text, allow):
    """decode(encode(text)) == text for any text without surrogates."""
    assert TOK.decode(TOK.encode(text, allow_special=allow).ids) == text


WORD_ALPHABETS = ["ab", "abc", "aeiou", "thing", "xyz", "éa", "жЖа", "ア\u30fc", "\u0915\u093f\u094d", "a\u0301",
                  "!=-", "./", "😀😁", "كتب", "abcdefghijklmnopqrstuvwxyz", "ABab"]


@settings(max_examples=300, **SETTINGS)
@given(st.sampled_from(WORD_ALPHABETS).flatmap(lambda a: st.text(alphabet=a, min_size=1, max_size=400)),
       st.sampled_from(["", " ", "X", "'", "\n"]))
def test_random_long_words(word, prefix):
    """Long words over small alphabets (many repeated pairs, rank ties, pieces over 32 bytes): same ids."""
    from tests.reference import Reference

    assert_parity(TOK, Reference(), [(prefix + word, False)])
