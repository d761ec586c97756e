"""``Tokenizer.to_tokenizer_json`` loaded by Hugging Face ``tokenizers``: the same ids as kimi_tok.

The exported file cannot express tiktoken-safe chunking, so every comparison here is
against ``tiktoken_safe=False`` (one tiktoken call per segment). One segment
``(text, allow_special)`` is ``hf.encode(text, add_special_tokens=False)`` with
``hf.encode_special_tokens = not allow_special``.

Exclusions, each explained where it is made: lone surrogates (``tokenizers`` only
takes valid Unicode strings) and texts that tiktoken-safe chunking cuts.
"""

from __future__ import annotations

import json

import pytest

tokenizers = pytest.importorskip("tokenizers")

from kimi_tok.interop.hf import bpe_split, byte_level, merges_by_rank  # noqa: E402
from kimi_tok import KIMI_PATTERN
from kimi_tok.pipeline.pretokenize import RegexPreTokenizer  # noqa: E402
from kimi_tok.samples import sample_prompt, sample_text  # noqa: E402
from tests.parity import describe_mismatch  # noqa: E402

# Each code point (surrogates aside) in each context, all glued into one long text per
# context. Together they tell apart every class of the pattern: Han, upper-ish and
# lower-ish letters and numbers ("a{c}B"), whitespace and punctuation (" {c} "), and
# case-folding in the contractions ("x'{c}'ll"). HF takes ~6 s per context here.
CONTEXTS = ["a{c}B", " {c} ", "x'{c}'ll"]
SCALAR_VALUES = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


@pytest.fixture(scope="module")
def exported(tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    data = tok.to_tokenizer_json(path)
    return path, data


@pytest.fixture(scope="module")
def hf(exported):
    return tokenizers.Tokenizer.from_file(str(exported[0]))


def hf_encode(hf, text: str, allow_special: bool) -> list[int]:
    hf.encode_special_tokens = not allow_special
    return hf.encode(text, add_special_tokens=False).ids


def hf_encode_segments(hf, segments) -> list[int]:
    ids: list[int] = []
    for text, allow_special in segments:
        ids += hf_encode(hf, text, allow_special)
    return ids


def test_file_shape(exported, tok):
    path, data = exported
    assert json.loads(path.read_text("utf-8")) == data
    model = data["model"]
    assert model["type"] == "BPE" and model["ignore_merges"] is True
    assert len(model["vocab"]) == 163_584
    assert data["pre_tokenizer"]["pretokenizers"][0]["pattern"] == {"Regex": KIMI_PATTERN}
    assert {t["content"]: t["id"] for t in data["added_tokens"]} == tok.special_tokens
    assert all(t["special"] and not t["normalized"] for t in data["added_tokens"])


def test_vocabulary_and_specials(hf, tok):
    assert hf.get_vocab_size(with_added_tokens=True) == tok.n_vocab
    for token_id in (0, 255, 22931, 163583, 163584, 163587, 163839):
        assert hf.id_to_token(token_id) == tok.id_to_token(token_id)


def test_merges_are_the_splits_bpe_makes(tok):
    """Every multi-byte K3 token is reachable by BPE; its merge is the pair BPE joins last.

    The split with the lowest max(rank(a), rank(b)) is a different pair for 7,746 K3
    tokens, e.g. ``quest``: BPE joins ``que+st``, not ``qu+est`` (ranks 913, 270 vs
    574, 601). A file built from those splits gives ``zquestz`` as 4 tokens, not 3.
    """
    ranks = tok.mergeable_ranks()
    assert bpe_split(b"quest", ranks) == (b"que", b"st")
    assert bpe_split(b"   ", ranks) == (b"  ", b" ")
    assert len(merges_by_rank(ranks)) == sum(1 for t in ranks if len(t) > 1)


@pytest.mark.parametrize("text", ["zquestz", " requestzz", "hello world", "   x", "ALLCAPS'LL don't", "1234567"])
def test_short_texts(hf, tok, text):
    assert hf_encode(hf, text, False) == tok.encode(text, tiktoken_safe=False).ids


def test_pattern_syntax_reads_the_same(hf):
    """Oniguruma reads ``\\p{Han}`` as the Han script and ``[A&&[^B]]`` as an intersection:
    its pieces are PCRE2's (in the byte-level alphabet the ByteLevel pre-tokenizer adds)."""
    pcre2_split = RegexPreTokenizer(KIMI_PATTERN).split
    for text in ["ABC中文abc", "Éé中x、y", "It's 我们的 ABCdef  \n\n x", "x\x1c\x1c y\u3000\u180e z"]:
        pieces = [piece for piece, _ in hf.pre_tokenizer.pre_tokenize_str(text)]
        assert pieces == [byte_level(piece.encode("utf-8")) for piece in pcre2_split(text)], text
    assert [p for p, _ in hf.pre_tokenizer.pre_tokenize_str("ABC中文")] == ["ABC", byte_level("中文".encode())]


@pytest.mark.parametrize("context", CONTEXTS)
def test_every_code_point(hf, tok, context):
    """All 1,112,064 scalar values in ``context``: one text, the same ids.

    (Also checked sample by sample, each code point encoded on its own, in 12 contexts
    while writing the exporter: no difference anywhere with tokenizers 0.23.3.)
    """
    text = "".join(context.format(c=chr(c)) for c in SCALAR_VALUES)
    got, want = hf_encode(hf, text, False), tok.encode(text, tiktoken_safe=False).ids
    assert got == want, describe_mismatch(want, got, "hf (got) vs kimi_tok (expected)")


@pytest.mark.parametrize("seed", range(4))
def test_rendered_chats(hf, tok, seed):
    """Generated agentic prompts (prose, code, JSON, many scripts, literal control strings, long runs)."""
    segments = sample_prompt(300_000 if seed else 2_000_000, seed=seed)
    got, want = hf_encode_segments(hf, segments), tok.encode_segments(segments, tiktoken_safe=False).ids
    assert got == want, describe_mismatch(want, got, "hf (got) vs kimi_tok (expected)")


@pytest.mark.parametrize("allow_special", [False, True])
def test_text_with_control_strings(hf, tok, allow_special):
    text = sample_text(200_000, seed=11) + "<|open|>x<|sep|>[EOS]<|reserved_token_163700|>"
    got, want = hf_encode(hf, text, allow_special), tok.encode(text, allow_special, tiktoken_safe=False).ids
    assert got == want, describe_mismatch(want, got, "hf (got) vs kimi_tok (expected)")


def test_decode(hf, tok):
    segments = sample_prompt(20_000, seed=5)
    ids = tok.encode_segments(segments).ids
    assert hf.decode(ids, skip_special_tokens=False) == tok.decode(ids) == "".join(t for t, _ in segments)


def test_tiktoken_safe_chunking_is_not_expressible(hf, tok):
    """Exclusion 1: a run of more than 25,000 same-kind characters is cut by the official
    chunking; tokenizer.json has no such cut, so HF matches ``tiktoken_safe=False`` only."""
    text = "x" + " " * 30_000 + "y"
    assert hf_encode(hf, text, False) == tok.encode(text, tiktoken_safe=False).ids
    assert hf_encode(hf, text, False) != tok.encode(text).ids


def test_lone_surrogates_are_rejected(hf):
    """Exclusion 2: ``tokenizers`` takes only valid Unicode; tiktoken (and kimi_tok) replace a
    lone surrogate with U+FFFD first, so callers must do that fix-up themselves."""
    with pytest.raises(TypeError):
        hf.encode("a\ud800b", add_special_tokens=False)
