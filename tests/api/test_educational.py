"""kimi_tok._educational, the readable pure-Python spec, agrees with the tiktoken reference."""

from __future__ import annotations

import pytest

from kimi_tok.samples import sample_prompt
from tests.reference import safe_substrings as reference_safe_substrings

edu_module = pytest.importorskip("kimi_tok._educational")


@pytest.fixture(scope="module")
def edu():
    return edu_module.EducationalTokenizer.from_kimi_k3()


SHORT_TEXTS = [
    "", "hello world", "I'LL we'Re it's 's don'T it'ſ", "  a  b  ", "a\r\nb\r\rc\n\n\n", "1 12 123 1234 12345",
    "١٢٣٤ ①②", "中文字符 𠀀𠮷 \U00031350 \U0002ebf0", "e\u0301 \u0301 \u0301\u0301", "👨\u200d👩\u200d👧 🇯🇵 1️⃣",
    "\x00\x1c\x1d\xa0\u3000\u2028\x85", "<|open|> <|not_special|> [EOS]<|sep|>", "<|open|><|close|>x<|sep|",
    "Привет, мир! ΑΛΦΑ Straße ǅ", "\ud800 lone \ude00 surrogates \ud83d\ude00",
]


@pytest.mark.parametrize("text", SHORT_TEXTS, ids=repr)
@pytest.mark.parametrize("allow", [False, True])
def test_educational_matches_reference(edu, ref, text, allow):
    """The pure-Python tokenizer gives the reference's ids (both chunking modes)."""
    assert edu.encode_segments([(text, allow)]) == ref.encode_segments([(text, allow)])
    assert edu.encode_segments([(text, allow)], tiktoken_safe=False) == ref.encode_segments(
        [(text, allow)], tiktoken_safe=False
    )


def test_educational_matches_reference_on_a_prompt(edu, ref, tok):
    """A 30k-character rendered chat: educational == reference == kimi_tok."""
    segments = sample_prompt(30_000, seed=77)
    expected = ref.encode_segments(segments)
    assert edu.encode_segments(segments) == expected
    assert tok.encode_segments(segments).ids == expected


@pytest.mark.parametrize(
    "text",
    ["", "a", "a" * 25_001, "\x1c" * 25_001, "x" + "a" * 20_000 + "\x1c" * 3 + "a" * 10_000 + "y",
     ("abc " * 120_000)[:400_001], " " * 50_001 + "b" * 50_001],
    ids=lambda t: f"len{len(t)}",
)
def test_educational_chunking_is_the_reference_chunking(text):
    """_educational.safe_substrings cuts exactly like tests/reference.py."""
    assert edu_module.safe_substrings(text) == reference_safe_substrings(text)


def test_bpe_merge_whole_token_and_leftmost_ties(edu, ref):
    """bpe_merge: a token is itself; otherwise tiktoken's lowest-rank, leftmost-first merges."""
    ranks = edu.ranks
    for word in [b"hello", b" world", b"aaaaaaa", b"abababab", b"tokenizer", "東京".encode()]:
        assert edu_module.bpe_merge(word, ranks) == ref.enc._encode_single_piece(word)  # tiktoken BPE of one piece
