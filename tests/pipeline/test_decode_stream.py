"""``Tokenizer.decode_stream``: step for step what ``tokenizers.decoders.DecodeStream`` returns.

Hugging Face ``tokenizers`` steps the ``tokenizer.json`` that ``to_tokenizer_json`` writes, on
id sequences that split characters (single bytes, continuation bytes), hold special tokens,
or are not UTF-8 at all; the pieces joined are ``decode(ids)`` up to its last whole character.
"""

from __future__ import annotations

import copy
import random
import time

import pytest

from kimi_tok.samples import sample_text

tokenizers = pytest.importorskip("tokenizers")
from tokenizers.decoders import DecodeStream as HFDecodeStream  # noqa: E402


@pytest.fixture(scope="module")
def hf(tok, tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.to_tokenizer_json(path)
    return tokenizers.Tokenizer.from_file(str(path))


@pytest.fixture(scope="module")
def pools(tok):
    """Ids by kind: one-byte tokens, tokens that start inside a character, specials, any."""
    singles = [i for i in range(tok.n_vocab) if tok.is_token(i) and len(tok.token_bytes(i)) == 1]
    inside = [i for i in range(0, 163_584, 7) if 0x80 <= tok.token_bytes(i)[0] < 0xC0][:3000]
    specials = sorted(tok.special_tokens.values())
    every = list(range(163_584)) + specials
    return {"singles": singles, "inside": inside, "specials": specials, "every": every}


def both(tok, hf, ids, skip_special_tokens=False):
    ours, theirs = tok.decode_stream(skip_special_tokens), HFDecodeStream(skip_special_tokens=skip_special_tokens)
    return [ours.step(i) for i in ids], [theirs.step(hf, i) for i in ids]


def check_joined(tok, ids, pieces, skip_special_tokens=False):
    specials = set(tok.special_tokens.values())
    full = tok.decode([i for i in ids if not (skip_special_tokens and i in specials)])
    joined = "".join(piece for piece in pieces if piece is not None)
    if full.endswith("\ufffd"):
        assert full.startswith(joined)  # what waits for more ids is the tail only
    else:
        assert joined == full


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_random_ids_step_like_tokenizers(tok, hf, pools, skip_special_tokens):
    rng = random.Random(7 + skip_special_tokens)
    kinds = [pools["singles"], pools["inside"], pools["every"], pools["specials"] + pools["singles"]]
    for _ in range(1500):
        pool = rng.choice(kinds)
        ids = [rng.choice(pool) if rng.random() < 0.85 else rng.choice(pools["every"])
               for _ in range(rng.randint(1, 24))]
        ours, theirs = both(tok, hf, ids, skip_special_tokens)
        assert ours == theirs, ids
        check_joined(tok, ids, ours, skip_special_tokens)


def test_encoded_text_streams_back_whole(tok, hf):
    text = sample_text(20_000, seed=4) + "😀🇯🇵👨‍👩‍👧 <|open|> é\u0301"
    ids = tok.encode_segments([(text, False), ("<|open|>[EOS]", True)]).ids
    ours, theirs = both(tok, hf, ids)
    assert ours == theirs
    assert "".join(piece for piece in ours if piece is not None) == tok.decode(ids)
    assert None in ours  # some characters were split over ids


def test_invalid_bytes_come_out_as_replacement_characters(tok, hf, pools):
    lone = [i for i in pools["singles"] if tok.token_bytes(i)[0] >= 0x80]
    ids = [lone[0], lone[1], *tok.encode("ok").ids, lone[2], *tok.encode(" end").ids]
    ours, theirs = both(tok, hf, ids)
    assert ours == theirs
    assert "\ufffd" in "".join(piece for piece in ours if piece)
    check_joined(tok, ids, ours)


def test_specials_and_skip_special_tokens(tok, hf):
    ids = tok.encode_segments([("<|open|>", True), ("hi", False), ("[EOS]", True)]).ids
    assert both(tok, hf, ids) == ([ "<|open|>", "hi", "[EOS]"],) * 2
    ours, theirs = both(tok, hf, ids, skip_special_tokens=True)
    assert ours == theirs == [None, "hi", None]


def test_lists_of_ids_and_context_ids(tok, hf, pools):
    rng = random.Random(3)
    for _ in range(400):
        ids = [rng.choice(pools["singles"] + pools["inside"][:40] + pools["every"][:3000])
               for _ in range(rng.randint(0, 14))]
        context = ids[:rng.randint(0, len(ids))]
        ours, theirs = tok.decode_stream(ids=context), HFDecodeStream(ids=context)
        rest, at = ids[len(context):], 0
        while at < len(rest):
            chunk, at = rest[at:at + rng.randint(1, 3)], at + 3
            assert ours.step(chunk) == theirs.step(hf, chunk), (context, rest)


def test_copies_continue_on_their_own(tok, hf):
    ids = tok.encode("😀 and 中文").ids
    stream = tok.decode_stream()
    stream.step(ids[0])
    twin = copy.copy(stream)
    deep = copy.deepcopy(stream)
    assert [stream.step(i) for i in ids[1:]] == [twin.step(i) for i in ids[1:]] == [deep.step(i) for i in ids[1:]]


def test_bad_ids_raise_and_leave_the_stream_as_it_was(tok):
    ids = tok.encode("héllo").ids
    stream = tok.decode_stream()
    out = [stream.step(ids[0])]
    for bad, error in ((tok.n_vocab, ValueError), (-1, ValueError), (163_584 + 300, ValueError),
                       ("a", TypeError), (1.0, TypeError), (True, TypeError), ([1, 10**9], ValueError)):
        with pytest.raises(error):
            stream.step(bad)
    out += [stream.step(i) for i in ids[1:]]
    assert "".join(piece for piece in out if piece) == "héllo"
    with pytest.raises(TypeError, match="skip_special_tokens must be a bool"):
        tok.decode_stream(skip_special_tokens="yes")
    with pytest.raises(ValueError):
        tok.decode_stream(ids=[tok.n_vocab])


def test_steps_cost_the_same_late_in_a_long_stream(tok):
    """O(1) per step: no step decodes the stream so far (a long stream is as fast per id as a short one)."""
    ids = tok.encode(sample_text(400_000, seed=5)).ids
    stream = tok.decode_stream()

    def per_step(chunk):
        start = time.perf_counter()
        for i in chunk:
            stream.step(i)
        return (time.perf_counter() - start) / len(chunk)

    early = per_step(ids[:5_000])
    for i in ids[5_000:-5_000]:
        stream.step(i)
    late = per_step(ids[-5_000:])
    assert late < 5 * early + 20e-6, (early, late)
