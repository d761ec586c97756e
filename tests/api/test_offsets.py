"""``encode(..., return_offsets=True)``: code-point spans of each id, and tiktoken's ``decode_with_offsets``.

The expected spans come from a plain-Python model written here: the text the encoder saw
(each tiktoken-safe sub-string fixed up on its own when it holds lone surrogates), a map from
each of its bytes to the caller's code points, and each token's bytes located by its length.
They are also checked against Hugging Face ``tokenizers`` on the exported ``tokenizer.json``
(where tiktoken-safe chunking is off) and, for whole characters, against the text itself.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import kimi_tok
from kimi_tok._educational import safe_substrings
from kimi_tok.samples import sample_prompt, sample_text
from tests.reference import MAX_RUN_CHARS, make_reference_encoding


def expected_spans(tok, ids, segments, tiktoken_safe=True) -> list[tuple[int, int]]:
    """The spans as defined: a token spans every caller's code point with a byte in it."""
    starts, ends = [], []  # per byte the encoder saw: the caller's code points it came from
    base = 0
    for text, _ in segments:
        for sub in safe_substrings(text) if tiktoken_safe else [text]:
            try:
                points = np.frombuffer(sub.encode("utf-32-le"), dtype=np.uint32)
            except UnicodeEncodeError:  # lone surrogates: the encoder fixes this sub-string up
                _surrogate_owners(sub, base, starts, ends)
            else:
                sizes = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
                at = np.repeat(np.arange(base, base + len(sub)), sizes)
                starts.append(at)
                ends.append(at + 1)
            base += len(sub)
    start, end = (np.concatenate(a) if a else np.zeros(0, dtype=np.int64) for a in (starts, ends))
    token_ends = np.cumsum([len(tok.token_bytes(id_)) for id_ in ids], dtype=np.int64)
    assert (token_ends[-1] if len(ids) else 0) == len(start)
    token_starts = token_ends - np.diff(token_ends, prepend=0)
    return list(zip(start[token_starts].tolist(), end[token_ends - 1].tolist()))


def _surrogate_owners(sub: str, base: int, starts: list, ends: list) -> None:
    i = 0
    while i < len(sub):
        c = sub[i]
        width = 2 if "\ud800" <= c <= "\udbff" and i + 1 < len(sub) and "\udc00" <= sub[i + 1] <= "\udfff" else 1
        fixed = sub[i:i + width].encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        n = len(fixed.encode("utf-8"))
        starts.append(np.full(n, base + i))
        ends.append(np.full(n, base + i + width))
        i += width


def check(tok, segments, tiktoken_safe=True):
    enc = tok.encode_segments(segments, tiktoken_safe=tiktoken_safe, return_offsets=True)
    offsets = enc.offsets
    assert offsets.dtype == np.int64 and offsets.shape == (len(enc), 2)
    assert [tuple(span) for span in offsets.tolist()] == expected_spans(tok, enc.ids, segments, tiktoken_safe)
    return enc


@pytest.mark.parametrize("seed", range(4))
def test_chat_prompts_match_the_definition_and_the_text(tok, seed):
    segments = sample_prompt(20_000 + 7_000 * seed, seed=seed)
    enc = check(tok, segments)
    joined = "".join(text for text, _ in segments)
    whole = 0
    for (start, end), id_ in zip(enc.offsets.tolist(), enc.ids):
        raw = tok.token_bytes(id_)
        try:
            token_text = raw.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: its span holds that whole character
            assert raw in joined[start:end].encode("utf-8")
            continue
        assert joined[start:end] == token_text
        whole += 1
    assert whole > 0.9 * len(enc)
    assert enc.offsets[-1, 1] == len(joined)


def test_special_tokens_span_their_text(tok):
    segments = [("<|open|>", True), ("message", False), ("<|sep|>", True), ("x <|sep|> y", False),
                ("[EOS]é<|close|>", True)]
    enc = check(tok, segments)
    joined = "".join(text for text, _ in segments)
    specials = tok.special_tokens.values()
    spans = [joined[s:e] for (s, e), id_ in zip(enc.offsets.tolist(), enc.ids) if id_ in specials]
    assert spans == ["<|open|>", "<|sep|>", "[EOS]", "<|close|>"]


def test_tokens_inside_characters_get_the_character(tok):
    text = "😀🇯🇵👨‍👩‍👧 𠀀𠮷 é\u0301 ｶﾀｶﾅ"
    enc = check(tok, [(text, False)])
    split = [(s, e) for (s, e), id_ in zip(enc.offsets.tolist(), enc.ids) if not _whole(tok.token_bytes(id_))]
    assert split, "the test text should have tokens that split characters"
    for start, end in split:
        assert end - start >= 1


def _whole(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("text", [
    "a\ud83d\ude00b",  # a surrogate pair: one character for the encoder, two code points in the str
    "\ud83d\ude00" * 3 + "x\ud800y\udfff",
    "ab\ude00\ud83d c\ud83d",  # reversed and lone surrogates: U+FFFD each
    "x" * (MAX_RUN_CHARS - 1) + "\ud83d\ude00tail",  # the run cut falls between the two halves
    "y" * 10 + "\ud83d\ude00" + " " * (MAX_RUN_CHARS + 3) + "\ud83d\ude00z",
])
def test_lone_surrogates_and_pairs_are_spans_of_the_callers_str(tok, text):
    segments = [("p\ud83d\ude00", False), (text, False), ("<|open|>", True), ("é", False)]
    enc = check(tok, segments)
    assert enc.offsets[-1, 1] == sum(len(t) for t, _ in segments)
    check(tok, segments, tiktoken_safe=False)


def test_run_cut_between_surrogate_halves_gives_two_replacements(tok):
    text = "x" * (MAX_RUN_CHARS - 1) + "\ud83d\ude00"
    assert len(safe_substrings(text)) == 2  # so each half is fixed up alone
    enc = check(tok, [(text, False)])
    assert tok.decode(enc.ids).endswith("\ufffd\ufffd")


def test_plain_encode_and_empty_input(tok):
    enc = tok.encode("hello world", return_offsets=True)
    assert enc.offsets.tolist() == [[0, 5], [5, 11]]
    assert tok.encode("", return_offsets=True).offsets.shape == (0, 2)
    assert tok.encode_segments([], return_offsets=True).offsets.shape == (0, 2)
    check(tok, [("", False), ("abc", False), ("", True)])


def test_offsets_are_only_made_when_asked(tok):
    enc = tok.encode("hello")
    with pytest.raises(ValueError, match="return_offsets=True"):
        enc.offsets
    with pytest.raises(TypeError, match="return_offsets must be a bool"):
        tok.encode("hello", return_offsets=1)
    enc = tok.encode("hello", return_offsets=True)
    enc.into_numpy()
    assert enc.offsets.tolist() == [[0, 5]]  # the offsets outlive the drained ids


def test_offsets_are_the_same_with_and_without_the_segment_cache():
    cached = kimi_tok.kimi_k3(policy=kimi_tok.Policy.from_env(segment_cache_bytes=1 << 24, min_cached_call_chars=0))
    uncached = kimi_tok.kimi_k3(segment_cache_bytes=0)
    segments = sample_prompt(30_000, seed=11)
    first = cached.encode_segments(segments, return_offsets=True).offsets
    again = cached.encode_segments(segments, return_offsets=True).offsets  # from the cache
    plain = uncached.encode_segments(segments, return_offsets=True).offsets
    assert np.array_equal(first, again) and np.array_equal(first, plain)


def test_long_text_spans(tok):
    """Past the 400k-character chunks and 25k-character runs, with multi-byte text throughout."""
    text = sample_text(500_000, seed=3) + " " * (MAX_RUN_CHARS + 10) + "end"
    enc = check(tok, [(text, False)])
    assert enc.offsets[-1, 1] == len(text)


# -- against Hugging Face tokenizers ---------------------------------------------------------

@pytest.fixture(scope="module")
def hf(tok, tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.to_tokenizer_json(path)
    return tokenizers.Tokenizer.from_file(str(path))


@pytest.mark.parametrize("seed", range(3))
def test_offsets_match_hugging_face_tokenizers(tok, hf, seed):
    """Per segment: HF's offsets (chunking off there too) shifted by the segment's start."""
    segments = sample_prompt(12_000, seed=100 + seed) + [(sample_text(4_000, seed=seed), True)]
    enc = tok.encode_segments(segments, tiktoken_safe=False, return_offsets=True)
    expected, base = [], 0
    for text, allow_special in segments:
        hf.encode_special_tokens = not allow_special
        hf_enc = hf.encode(text, add_special_tokens=False)
        expected += [(start + base, end + base) for start, end in hf_enc.offsets]
        base += len(text)
    assert [tuple(span) for span in enc.offsets.tolist()] == expected


# -- tiktoken's decode_with_offsets on the drop-in ----------------------------------------------


@pytest.fixture(scope="module")
def encodings(tok):
    return tok.as_tiktoken(), make_reference_encoding()


def test_decode_with_offsets_matches_tiktoken(tok, encodings):
    ours, theirs = encodings
    rng = random.Random(5)
    texts = ["hello world", "héllo 😀 wörld", "<|open|>x", "", sample_text(3_000, seed=9)]
    for text in texts:
        ids = theirs.encode(text, allowed_special="all")
        assert ours.decode_with_offsets(ids) == theirs.decode_with_offsets(ids)
    # random ids: tokens cut inside characters, special tokens; valid UTF-8 or not
    singles = list(range(256))
    pool = singles + list(range(256, 163_584, 97)) + sorted(tok.special_tokens.values())[:20]
    for _ in range(300):
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
        try:
            expected = theirs.decode_with_offsets(ids)
        except UnicodeDecodeError:
            with pytest.raises(UnicodeDecodeError):
                ours.decode_with_offsets(ids)
            continue
        assert ours.decode_with_offsets(ids) == expected, ids


def test_decode_with_offsets_raises_as_tiktoken(encodings):
    ours, theirs = encodings
    for bad, error in (([1, 163_584_000], KeyError), ([1, -1], OverflowError), ([1, "a"], TypeError)):
        with pytest.raises(error):
            theirs.decode_with_offsets(bad)
        with pytest.raises(error):
            ours.decode_with_offsets(bad)
