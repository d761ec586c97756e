"""Character starts (pipeline/bpe/char_starts.py): a merge that starts a character from its own ids
gives tiktoken's ids.

The argument in the module's docstring is checked here three ways: each start is the character's
own encoding; random strings of starting and non-starting characters (and the straddle tokens'
bytes around them) encode like tiktoken; and a vocabulary whose ranks break the argument's premise
gets no starts at all.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import tiktoken

import kimi_tok
from kimi_tok.pipeline.bpe import build_bpe_tables
from kimi_tok.pipeline.bpe.char_starts import CHAR_START_CODE_POINTS, start_count, start_id
from kimi_tok.pipeline.bpe.tables import own_splits, _build_pair_table, _count_pairs
from kimi_tok.native.hashing import table_size_for

from tests.parity import describe_mismatch


@pytest.fixture(scope="module")
def starts(tok) -> np.ndarray:
    return tok.engine.stages.tables.char_starts


def _start_ids(value) -> list[int]:
    return [start_id(value, k) for k in range(start_count(value))]


def _merged_from(parts: list[bytes], ranks: dict[bytes, int]) -> list[bytes]:
    """BPE continued from ``parts`` (leftmost lowest rank first), as tiktoken merges."""
    parts = list(parts)
    while len(parts) > 1:
        found = [(ranks[a + b], i) for i, (a, b) in enumerate(zip(parts, parts[1:])) if a + b in ranks]
        if not found:
            break
        _, i = min(found)
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def test_every_start_is_a_stage_of_the_characters_own_encoding(tok, ref, starts):
    """A start is the character's own encoding, or the parts of a stage of that merge (Thai and
    Devanagari letters, among others): merging on from it gives the character's own encoding."""
    ranks = tok.mergeable_ranks()
    by_rank = {r: t for t, r in ranks.items()}
    cps = np.flatnonzero(starts).tolist()
    assert len(cps) > 10_000  # CJK, kana, accented Latin ...
    stages = 0
    for cp in cps:
        ids = _start_ids(starts[cp])
        own = ref.enc.encode(chr(cp))
        parts = [by_rank[i] for i in ids]
        assert b"".join(parts) == chr(cp).encode("utf-8"), hex(cp)
        assert [ranks[p] for p in _merged_from(parts, ranks)] == own, hex(cp)
        stages += ids != own
    thai = [cp for cp in range(0x0E01, 0x0E5C) if starts[cp]]
    assert stages > 0 and len(thai) > 80  # most Thai letters start as stages


def _straddle_texts(tok) -> list[str]:
    """Texts around the bytes of the straddle tokens: the places a character start could go wrong."""
    tables = tok.engine.stages.tables
    ranks = tok.mergeable_ranks()
    by_rank = {r: t for t, r in ranks.items()}
    all_splits = _build_pair_table(tables.token_bytes, tables.token_offsets, tables.token_slots,
                                   table_size_for(_count_pairs(tables.token_bytes, tables.token_offsets,
                                                               tables.token_slots)))
    left, right = own_splits(tables.token_bytes, tables.token_offsets, tables.byte_rank, all_splits)
    from kimi_tok.pipeline.bpe.char_starts import straddle_tokens

    texts = []
    for t in straddle_tokens(tables.token_bytes, tables.token_offsets, left, right).tolist():
        raw = by_rank[t]
        for lead in range(0xC2, 0xF0):  # complete the straddle's partial characters every way that decodes
            for trail in (b"\x80", b"\x8f", b"\xa4", b"\xbf", b"\x80\x80", b"\xbf\xbf"):
                text = (bytes([lead]) + raw + trail).decode("utf-8", "ignore")
                if text:
                    texts.append(text)
    return texts


def test_strings_of_starting_and_byte_characters_match_tiktoken(tok, ref, starts):
    rng = random.Random(20261201)
    starting = [chr(cp) for cp in np.flatnonzero(starts).tolist()]
    byte_started = [chr(cp) for cp in range(0x80, 0x3000) if not starts[cp] and not 0xD800 <= cp < 0xE000]
    cjk = [chr(cp) for cp in range(0x4E00, 0x9FFF)]
    pools = [starting, byte_started, cjk, list("abc é中ア한ไท्"), starting + byte_started]
    texts = []
    for _ in range(4000):
        pool = rng.choice(pools)
        texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 60))))
    texts += _straddle_texts(tok)
    got = tok.encode_segments([(t, False) for t in texts], tiktoken_safe=False).ids
    want = [i for t in texts for i in ref.enc.encode(t, disallowed_special=())]
    if got != want:
        for t in texts:  # name the first text that differs
            one, expected = tok.encode(t, tiktoken_safe=False).ids, ref.enc.encode(t, disallowed_special=())
            assert one == expected, describe_mismatch(expected, one, repr(t))


def test_a_vocabulary_whose_tokens_rank_below_their_halves_gets_no_starts():
    """Ranks out of merge order break the argument (a merged token must rank above its halves): no
    character starts early, and the ids are still tiktoken's."""
    base = tiktoken.Encoding(name="k3", pat_str=kimi_tok.KIMI_PATTERN,
                             mergeable_ranks=kimi_tok.kimi_k3().mergeable_ranks(), special_tokens={})
    ranks = base._mergeable_ranks
    order = sorted(ranks, key=lambda t: (len(t) != 3 or not t.startswith(b"\xe4"), ranks[t]))  # 3-byte tokens first
    odd = tiktoken.Encoding(name="odd", pat_str=kimi_tok.KIMI_PATTERN,
                            mergeable_ranks={t: r for r, t in enumerate(order)}, special_tokens={})
    vocabulary = kimi_tok.from_tiktoken(odd).vocabulary
    tables = build_bpe_tables(vocabulary.token_bytes, vocabulary.token_offsets)
    assert tables.char_starts.shape == (CHAR_START_CODE_POINTS,) and not tables.char_starts.any()
    tok = kimi_tok.from_tiktoken(odd, policy=kimi_tok.Policy.from_env(n_jobs=1, segment_cache_bytes=0))
    text = "中文的语言模型 " * 20 + "ภาษาไทย"
    assert tok.encode(text, tiktoken_safe=False).ids == odd.encode(text, disallowed_special=())


def _malformed_variants(raw: bytes) -> list[bytes]:
    """Byte strings that look like the character ``raw`` to a decoder that checks nothing: a continuation
    byte replaced (by ASCII, a lead, another continuation's place), an overlong form, a bad lead."""
    out = []
    for k in range(1, len(raw)):
        for byte in (0x29, 0x41, 0xC3, 0xE4, 0xF0):
            out.append(raw[:k] + bytes([byte]) + raw[k + 1:])
    cp = ord(raw.decode("utf-8"))
    if len(raw) < 4:  # the same code point one byte longer
        longer = {2: 0xE0, 3: 0xF0}[len(raw)] | (cp >> (6 * len(raw)))
        out.append(bytes([longer]) + bytes([0x80 | ((cp >> (6 * j)) & 0x3F) for j in range(len(raw) - 1, -1, -1)]))
    out.append(bytes([0xF8 | (raw[0] & 0x07)]) + raw[1:] + b"\x80" * (4 - len(raw)))  # no UTF-8 lead
    return out


def test_bytes_that_are_not_utf8_start_as_bytes(tok, ref, starts):
    """``encode_bytes`` merges bytes that need not be UTF-8: a sequence that only looks like a starting
    character (a bad continuation, an overlong form, a lead from 0xF8) starts as bytes, like tiktoken."""
    rng = random.Random(7)
    dropin = tok.as_tiktoken()
    cps = np.flatnonzero(starts).tolist()
    for cp in rng.sample(cps, 400) + [0xE9, 0x4E2D, 0x4E9]:
        raw = chr(cp).encode("utf-8")
        for bad in _malformed_variants(raw):
            for piece in (bad, b"a" + bad, bad + b"b", chr(rng.choice(cps)).encode("utf-8") + bad):
                assert dropin._encode_single_piece(piece) == ref.enc._encode_single_piece(piece), piece
