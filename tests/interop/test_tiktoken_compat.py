"""``Tokenizer.as_tiktoken()`` against real tiktoken: the same calls, the same results or errors.

Every test runs one call on the reference ``tiktoken.Encoding`` (built from the K3 files
by ``tests.reference``) and on kimi_tok's drop-in, and compares the returned value, or
the raised exception's type and message.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kimi_tok.samples import sample_prompt, sample_text
from kimi_tok.interop.tiktoken_compat import TiktokenEncoding, real_tiktoken_encoding
from tests.reference import make_reference_encoding

SPECIALS = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "[EOS]", "[BOS]", "<|reserved_token_163700|>")

TEXTS = [
    "",
    "hello world",
    "<|open|>",
    "<|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>",
    "a \n<|sep|> b  <|sep|>\n\n  x",
    "  <|open|><|sep|>x<|close|>  ",
    "<|open|<|sep|>|>",  # a special inside broken special-looking text
    "[EOS] first, then <|open|>",
    "<|im_end|> [UNK] <|endoftext|> [EOT]",
    "It's ALLCAPS'LL 我们的分词器 Привет 123456 \t\r\n end",
    "x" + " " * 30_000 + "y",  # tiktoken's encode has no 25k-run chunking; neither has the drop-in
    "\ud83d\ude00 pair, lone \ud800 <|sep|> after",  # surrogates: tiktoken's utf-16 fix-up
]

SPECIAL_ARGUMENTS = [
    {},
    {"allowed_special": "all"},
    {"disallowed_special": ()},
    {"allowed_special": {"<|open|>", "<|sep|>"}},
    {"allowed_special": {"<|open|>", "<|sep|>"}, "disallowed_special": ()},
    {"allowed_special": frozenset({"<|sep|>"}), "disallowed_special": ()},
    {"allowed_special": {"<|sep|>", "hello", "not a special"}, "disallowed_special": ()},
    {"allowed_special": set(), "disallowed_special": {"<|sep|>"}},
    {"allowed_special": {"<|open|>"}, "disallowed_special": ["[EOS]"]},
    {"allowed_special": "all", "disallowed_special": "all"},
    {"allowed_special": ["<|sep|>"]},  # TypeError in tiktoken: set - list
    {"allowed_special": ["<|sep|>"], "disallowed_special": ()},  # TypeError: not a set
    {"allowed_special": "<|sep|>", "disallowed_special": ()},  # TypeError: not a set
    {"disallowed_special": "al"},  # tiktoken reads the str as the set {"a", "l"}
]


@pytest.fixture(scope="module")
def reference():
    return make_reference_encoding()


@pytest.fixture(scope="module")
def dropin(tok):
    return tok.as_tiktoken()


def outcome(call):
    """``("ok", value)`` or ``("raised", type, args)``, for comparing two implementations."""
    try:
        value = call()
    except Exception as e:  # noqa: BLE001 - every error must match
        return ("raised", type(e), e.args)
    if isinstance(value, np.ndarray):
        value = value.tolist()
    return ("ok", value)


def assert_same(reference, dropin, method: str, *args, **kwargs):
    want = outcome(lambda: getattr(reference, method)(*args, **kwargs))
    got = outcome(lambda: getattr(dropin, method)(*args, **kwargs))
    assert got == want, f"{method}{args!r:.120} {kwargs!r}"
    return got


def test_attributes(reference, dropin):
    assert isinstance(dropin, TiktokenEncoding)
    assert dropin.name == reference.name == "kimi_k3"
    assert repr(dropin) == repr(reference)
    assert dropin.n_vocab == reference.n_vocab
    assert dropin.max_token_value == reference.max_token_value
    assert dropin.special_tokens_set == reference.special_tokens_set
    assert dropin._special_tokens == reference._special_tokens
    assert dropin._pat_str == reference._pat_str
    assert dropin._mergeable_ranks == reference._mergeable_ranks


def test_eot_token_is_tiktokens_lookup(reference, dropin):
    """K3 has no <|endoftext|>: tiktoken's eot_token raises KeyError, and so does the drop-in."""
    want = outcome(lambda: reference.eot_token)
    assert want[:2] == ("raised", KeyError)
    assert outcome(lambda: dropin.eot_token) == want
    assert dropin.encode_single_token("[EOS]") == reference.encode_single_token("[EOS]") == 163585


@pytest.mark.parametrize("kwargs", SPECIAL_ARGUMENTS, ids=repr)
@pytest.mark.parametrize("text", TEXTS, ids=lambda t: repr(t[:30]))
def test_encode(reference, dropin, text, kwargs):
    got = assert_same(reference, dropin, "encode", text, **kwargs)
    want_numpy = outcome(lambda: reference.encode_to_numpy(text, **kwargs))
    if want_numpy[:2] == ("raised", UnicodeEncodeError):
        # tiktoken 0.14's encode_to_numpy skips encode's surrogate fix-up and raises
        # UnicodeEncodeError; the drop-in's behaves exactly like its encode (documented).
        assert has_surrogates(text)
        want_numpy = got
    assert outcome(lambda: dropin.encode_to_numpy(text, **kwargs)) == want_numpy


def has_surrogates(text) -> bool:
    return isinstance(text, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def test_disallowed_special_error_message(reference, dropin):
    """The leftmost disallowed special is named, in tiktoken's exact words."""
    got = assert_same(reference, dropin, "encode", "text, then [EOS] and <|open|>")
    assert got[:2] == ("raised", ValueError)
    assert "disallowed special token '[EOS]'" in got[2][0]


@pytest.mark.parametrize("text", TEXTS, ids=lambda t: repr(t[:30]))
def test_encode_ordinary(reference, dropin, text):
    assert_same(reference, dropin, "encode_ordinary", text)


@pytest.mark.parametrize("bad", [None, b"bytes", 5])
def test_wrong_text_types(reference, dropin, bad):
    assert_same(reference, dropin, "encode_ordinary", bad)
    assert_same(reference, dropin, "encode", bad, disallowed_special=())
    assert outcome(lambda: dropin.encode(bad))[:2] == outcome(lambda: reference.encode(bad))[:2]


@pytest.mark.parametrize("kwargs", [{}, {"allowed_special": "all"}, {"allowed_special": {"<|sep|>"}, "disallowed_special": ()}], ids=repr)
def test_batches(reference, dropin, kwargs):
    texts = [t for t in TEXTS if "\ud800" not in t] + [sample_text(5000, seed) for seed in range(4)]
    assert_same(reference, dropin, "encode_ordinary_batch", texts, num_threads=3)
    assert_same(reference, dropin, "encode_batch", texts, num_threads=3, **{"disallowed_special": (), **kwargs})
    assert_same(reference, dropin, "encode_batch", texts, **kwargs)  # raises for the texts with specials


def test_chat_text_with_some_specials_allowed(reference, dropin):
    """A whole rendered chat as one text, with only the structural specials allowed."""
    text = "".join(t for t, _ in sample_prompt(200_000, seed=3))
    allowed = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"}
    got = assert_same(reference, dropin, "encode", text, allowed_special=allowed, disallowed_special=())
    assert len(got[1]) > 40_000
    assert_same(reference, dropin, "encode", text, allowed_special="all")
    assert_same(reference, dropin, "encode_ordinary", text)


fragments = st.sampled_from([*SPECIALS, " ", "  ", "\n", "\r\n", "\t", "a", "Ab", "word", "'s", "中文", "123", "!?", "\xa0", "é"])


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(fragments, max_size=12), allowed=st.sets(st.sampled_from(SPECIALS)), check=st.booleans())
def test_encode_random_mixes(reference, dropin, parts, allowed, check):
    """Texts glued from specials, spaces and words, with random allowed subsets."""
    kwargs = {"allowed_special": allowed} if check else {"allowed_special": allowed, "disallowed_special": ()}
    assert_same(reference, dropin, "encode", "".join(parts), **kwargs)


IDS_CASES = [
    [],
    [22931, 2695],
    [163587, 2778, 163589, 163839],
    [134750, 222],  # an emoji cut into two tokens
    [10**6],
    [1, 10**6, -1],  # conversion errors come before unknown ids
    [-1],
    [2**32],
    [True, 1],
    [1.5],
    ["a"],
    "ab",
    None,
    5,
    {1, 2},
    b"ab",
    np.array([22931, 2695], dtype=np.uint32),
    np.array([22931, 2**33], dtype=np.int64),
    np.array([1.0, 2.0]),
]


@pytest.mark.parametrize("ids", IDS_CASES, ids=repr)
def test_decode(reference, dropin, ids):
    assert_same(reference, dropin, "decode_bytes", ids)
    assert_same(reference, dropin, "decode", ids)
    assert_same(reference, dropin, "decode", ids, errors="strict")


@pytest.mark.parametrize("token", [0, 22931, 163587, 163839, 163840, 10**6, -1, 2**32, True, "a", 1.0])
def test_decode_single_token(reference, dropin, token):
    assert_same(reference, dropin, "decode_single_token_bytes", token)
    assert_same(reference, dropin, "decode_tokens_bytes", [22931, token])


def test_decode_batches(reference, dropin):
    batch = [[22931, 2695], [163587], [134750], []]
    assert_same(reference, dropin, "decode_batch", batch)
    assert_same(reference, dropin, "decode_bytes_batch", batch, num_threads=2)
    assert_same(reference, dropin, "decode_batch", [[1], [10**6]])


@pytest.mark.parametrize("value", ["hello", " world", "[EOS]", "<|open|>", b"\xe4\xb8", b"hellozzzz", "zzzzqq",
                                   b"[EOS]", 5, None, bytearray(b"hello")])
def test_encode_single_token(reference, dropin, value):
    assert_same(reference, dropin, "encode_single_token", value)


@pytest.mark.parametrize("token", [0, 163583, 163584, 163839, 163840])
def test_is_special_token(reference, dropin, token):
    assert_same(reference, dropin, "is_special_token", token)


def test_real_tiktoken_encoding_from_embedded_vocabulary(tok, reference):
    """The genuine tiktoken Encoding built from the package's own vocabulary is the reference."""
    built = real_tiktoken_encoding(tok)
    assert built._mergeable_ranks == reference._mergeable_ranks == tok.mergeable_ranks()
    assert built._special_tokens == reference._special_tokens
    assert built._pat_str == reference._pat_str
