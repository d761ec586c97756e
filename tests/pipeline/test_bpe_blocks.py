"""BPE of a block of pieces: one piece at a time, or in passes where most pieces have one or two bytes
(encode._block_in_passes), with the same ids either way."""

from __future__ import annotations

import random
import string

import numpy as np
import pytest

import kimi_tok
from kimi_tok.engine import parts
from kimi_tok.pipeline.bpe import encode, tables
from tests.parity import assert_parity


@pytest.fixture(scope="module")
def tok() -> kimi_tok.Tokenizer:
    return kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)


def _pairs_that_are_not_tokens(tok: kimi_tok.Tokenizer) -> list[str]:
    ranks = tok.mergeable_ranks()
    pairs = [a + b for a in string.punctuation for b in string.punctuation if (a + b).encode() not in ranks]
    assert pairs, "every pair of ASCII punctuation is a token: pick other pairs"
    return pairs


def _tiny_piece_text(rng: random.Random, tok: kimi_tok.Tokenizer, n_lines: int) -> str:
    """Mostly pieces of one or two bytes (hex digests, digit groups), with pairs that are not tokens,
    pieces longer than the short table's keys and short pieces that merge into several ids among them."""
    odd_pairs = _pairs_that_are_not_tokens(tok)
    lines = []
    for _ in range(n_lines):
        parts = [f"{rng.getrandbits(128):032x}", str(rng.randrange(10 ** 9)), rng.choice(odd_pairs)]
        if rng.random() < 0.3:
            parts.append(rng.choice(["internationalization", " " * rng.randrange(16, 40), "qzxvbk", "ẞẞẞ"]))
        rng.shuffle(parts)
        lines.append(" ".join(parts))
    return "\n".join(lines)


def test_blocks_of_tiny_pieces_give_reference_ids(tok, ref):
    rng = random.Random(20261202)
    for n_lines in (1, 3, 40, 2_000):
        assert_parity(tok, ref, [(_tiny_piece_text(rng, tok, n_lines), False)], tiktoken_safe=False)


def test_blocks_answered_in_full_and_blocks_with_one_piece_left_give_reference_ids(tok, ref):
    """A block whose pieces passes 1-3 all answered is copied out whole; one piece they leave (a pair that
    is not a token, a piece longer than the short keys) at any place in a block is answered on its own."""
    digests = "".join(f"{random.Random(k).getrandbits(128):032x}" for k in range(encode.PROBE_BLOCK // 4))
    for leftover in (_pairs_that_are_not_tokens(tok)[0], "7internationalization7"):  # digests: pieces of 1-3 bytes
        texts = [digests[:k] + leftover + digests[k:] for k in range(0, 3 * encode.PROBE_BLOCK, 3)]
        assert_parity(tok, ref, [(text, False) for text in texts], tiktoken_safe=False)
    assert_parity(tok, ref, [(digests * 40, False)], tiktoken_safe=False)


def _digests_with(rng: random.Random, pieces: list[str], n_inserted: int) -> str:
    """Hex digests (pieces of one to three bytes) over three blocks, ``n_inserted`` of ``pieces`` at random places."""
    digests = "".join(f"{random.Random(k).getrandbits(128):032x}" for k in range(encode.PROBE_BLOCK // 4))
    text, last = "", 0
    for k in sorted(rng.randrange(0, 3 * encode.PROBE_BLOCK) for _ in range(n_inserted)):
        text += digests[last:k] + rng.choice(pieces)
        last = k
    return text + digests[last:]


def test_blocks_with_few_or_many_unanswered_pieces_give_reference_ids(tok, ref):
    """Pass 4 copies the answered pieces of a block in passes in a tight loop and stops at each unanswered one
    (pairs that are not tokens, short pieces merged before into several ids, misses): from one to 60 of them
    per text, at random places, adjacent ones, first and last pieces of a block included."""
    odd = _pairs_that_are_not_tokens(tok)[:4] + ["qzxv", "7qzxvbkjw"]
    rng = random.Random(5)
    texts = [_digests_with(rng, odd, n_odd) for n_odd in (1, 2, 15, 16, 17, 32, 60) for _ in range(6)]
    for _ in range(2):  # fresh, then cached
        assert_parity(tok, ref, [(text, False) for text in texts], tiktoken_safe=False)


def test_blocks_of_tiny_pieces_with_a_few_long_ones_give_reference_ids(tok, ref):
    """A block of tiny pieces goes in passes with up to ``MAX_LONG_IN_PASSES`` long pieces, by length with
    more: the same ids either way, for long pieces that are tokens, cached or merged."""
    longs = ["7internationalization7", "7qzxvbkjwqzxvbkjw7", " " * 20]
    rng = random.Random(13)
    texts = [_digests_with(rng, longs, n_long) for n_long in range(encode.MAX_LONG_IN_PASSES + 3) for _ in range(20)]
    for _ in range(2):
        assert_parity(tok, ref, [(text, False) for text in texts], tiktoken_safe=False)


def test_text_that_switches_between_tiny_and_long_pieces_gives_reference_ids(tok, ref):
    """Blocks switch between the two ways as the share of one- and two-byte pieces changes."""
    rng = random.Random(7)
    prose = "Permission is hereby granted, free of charge, to any person obtaining a copy of this software. "
    text = "".join(_tiny_piece_text(rng, tok, rng.randrange(1, 30)) + prose * rng.randrange(1, 6) for _ in range(60))
    assert_parity(tok, ref, [(text, False)], tiktoken_safe=False)
    assert_parity(tok, ref, [(text[k:k + 997], k % 2 == 0) for k in range(0, len(text), 997)])


def test_one_load_answers_every_piece_of_one_or_two_bytes(tok):
    """Pass 1 of a block in passes reads a piece of one or two bytes from one place of ``byte_pair_rank``
    (``tables.byte_piece_index``): the byte's own id, or the pair's id, NO_MERGE where the pair is no token."""
    ranks = tok.mergeable_ranks()
    table = tok.engine.stages.tables.byte_pair_rank
    for a in range(256):
        for b in range(256):
            assert table[tables.byte_piece_index(1, a, b)] == ranks[bytes([a])]
            assert table[tables.byte_piece_index(2, a, b)] == ranks.get(bytes([a, b]), tables.NO_MERGE)
    assert table.shape == (2 * 256 * 256,)


def test_short_pieces_cached_as_several_ids_give_reference_ids(tok, ref):
    """Blocks of mostly longer pieces (one piece at a time) where short pieces that are not tokens come back:
    their ids are served from the piece cache's short entry (up to ``MAX_INLINE_IDS``) or, for more ids,
    from its general table, in the same call and in the next."""
    ranks = tok.mergeable_ranks()
    words = ["qzxvbk", "internationalizxation", "Übersetzungsfehler", "vbqzx", "ẞẞẞ"]
    many = [w for w in ("ᚠᚢᚦᚨᚱ", "ꙮꙮꙮꙮꙮ", "ⰀⰁⰂⰃⰄ", "ꓐꓑꓒꓓꓔ") if len(w.encode()) <= encode.SHORT_PIECE_BYTES
            and len(ref.encode(w)) > encode.MAX_INLINE_IDS]
    assert many, "no short letter run of more than MAX_INLINE_IDS ids among the candidates: pick others"
    assert not any(w.encode() in ranks for w in words + many)
    rng = random.Random(3)
    prose = "Permission is hereby granted, free of charge, to any person obtaining a copy".split()
    lines = [" ".join(rng.choice(prose + words) for _ in range(12)) + "\n" + rng.choice(many) for _ in range(400)]
    text = "\n".join(lines)
    for _ in range(2):
        assert_parity(tok, ref, [(text, False)], tiktoken_safe=False)


def _letter_runs_by_id_count(tok, ref, most: int) -> dict[int, str]:
    """Runs of ASCII letters (one piece each between digits) that are not tokens, by their number of ids
    (``most`` for that many or more)."""
    ranks = tok.mergeable_ranks()
    rng = random.Random(5)
    found: dict[int, str] = {}
    for _ in range(20_000):
        word = "".join(rng.choice("qzxvbkjw") for _ in range(rng.randrange(3, encode.SHORT_PIECE_BYTES + 1)))
        n_ids = len(ref.encode(f"7{word}7")) - 2
        if word.encode() not in ranks and n_ids >= 2:
            found.setdefault(min(n_ids, most), word)
    return found


def test_short_pieces_of_several_ids_in_blocks_of_tiny_pieces_give_reference_ids(tok, ref, monkeypatch):
    """In passes, a short piece the cache holds as up to ``MAX_INLINE_IDS`` ids is answered from its short
    entry, one of more ids through ``encode_piece`` (the general table); merged in one call, cached in the next.
    Such pieces mid-text, at a text's very end and at the ends of the parts two threads share."""
    words = _letter_runs_by_id_count(tok, ref, encode.MAX_INLINE_IDS + 1)
    assert set(words) == set(range(2, encode.MAX_INLINE_IDS + 2)), words
    digests = "".join(f"{random.Random(k).getrandbits(128):032x}" for k in range(encode.PROBE_BLOCK // 2))
    texts = []
    for word in words.values():
        piece = f"7{word}7"
        texts += [digests + piece, piece + digests, digests + piece[:-1], digests[:-1] + piece[:-1]]
        texts += [digests[:k] + piece + digests[k:] for k in range(0, 3 * encode.PROBE_BLOCK, 37)]
    for _ in range(2):  # merged, then from the piece cache
        assert_parity(tok, ref, [(text, False) for text in texts], tiktoken_safe=False)
        for text in texts[:8]:
            assert_parity(tok, ref, [(text, False)], tiktoken_safe=False)
    rng = random.Random(11)
    # lines that start with a letter: a long sub-string is cut there into units the threads share
    mixed = "".join(f"\nx{digests[rng.randrange(64):][:rng.randrange(40, 400)]}7{rng.choice(list(words.values()))}7"
                    for _ in range(600))
    shared = kimi_tok.kimi_k3(policy=kimi_tok.Policy.from_env(n_jobs=2, segment_cache_bytes=0).replace(
        min_bytes_per_job=4096, min_bytes_per_shared_job=4096, fan_out_part_bytes=2048, unit_bytes=2048,
        max_joined_call_bytes=1))
    n_parts = []
    cut = parts.cut_into_parts

    def spy(*args):
        cuts = cut(*args)
        n_parts.append(cuts[-1].shape[0] - 1)
        return cuts

    monkeypatch.setattr(parts, "cut_into_parts", spy)
    for _ in range(3):
        assert_parity(shared, ref, [(mixed, False)], tiktoken_safe=False)
        assert_parity(shared, ref, [(mixed, False)])
    assert n_parts and min(n_parts[-6:]) >= 8, n_parts  # every call really went in parts
