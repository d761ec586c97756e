"""Seams (pipeline/bpe/seams.py): a piece merged as the sections between positions no token crosses gives
tiktoken's ids.

Checked four ways: the crossing tables equal an enumeration written independently in Python; at every
seam the tables find in random text no token of the vocabulary spans the position (the definition, by
brute force); each character's own ids in the tables are its encoding; and long pieces of the scripts
with tables (cold and warm caches, malformed bytes among them) encode like tiktoken. A vocabulary with a
token BPE never builds from its own bytes gets no tables.
"""

from __future__ import annotations

import collections
import random

import numpy as np
import pytest
import tiktoken

import kimi_tok
from kimi_tok.pipeline.bpe import build_bpe_tables
from kimi_tok.pipeline.bpe.seams import BLOCK_SHIFT, BLOCK_SIZE, CROSS_WORDS, ROW_WORDS, SOLO_COUNT_SHIFT
from kimi_tok.pipeline.bpe.encode import SEAM_MIN_PIECE_BYTES

from tests.conftest import new_k3_tokenizer
from tests.engine.test_parallel import SMALL_GROUPS, mode_policy
from tests.parity import assert_batched_parity

SCRIPTS = {  # letters and marks of scripts whose blocks have tables
    "Thai": [chr(cp) for cp in range(0x0E01, 0x0E5C) if chr(cp).isprintable()],
    "Devanagari": [chr(cp) for cp in range(0x0900, 0x0980) if chr(cp).isprintable()],
    "Arabic": [chr(cp) for cp in range(0x0620, 0x0660)],
    "kana": [chr(cp) for cp in range(0x3041, 0x30FB)],
    "Cyrillic": [chr(cp) for cp in range(0x0410, 0x0450)],
}


@pytest.fixture(scope="module")
def tables(tok):
    return tok.engine.stages.tables


@pytest.fixture(scope="module")
def vocabulary_tokens(tok) -> list[bytes]:
    return list(tok.mergeable_ranks())


def _crosses(tables, a: int, b: int) -> bool | None:
    """The tables' answer for the adjacent characters ``a b``: True/False, or None when they hold none."""
    if a >> BLOCK_SHIFT != b >> BLOCK_SHIFT or not 0x80 <= a < 0x10000:
        return None
    at = int(tables.seam_blocks[a >> BLOCK_SHIFT])
    if at < 0:
        return None
    word = int(tables.seam_words[at + (a % BLOCK_SIZE) * ROW_WORDS + (b % BLOCK_SIZE) // 64])
    return bool(word >> (b % 64) & 1)


def _enumerated_crossings(tokens: list[bytes], blocks: set[int]) -> set[tuple[int, int]]:
    """Every pair of characters (both in one of ``blocks``) some token may cross between: the token holds
    all of the first or a proper suffix of it, then all of the second or a proper prefix of it."""
    suffixes, prefixes = collections.defaultdict(list), collections.defaultdict(list)
    for block in blocks:
        for cp in range(block << BLOCK_SHIFT, (block + 1) << BLOCK_SHIFT):
            if 0xD800 <= cp < 0xE000:
                continue
            raw = chr(cp).encode("utf-8")
            for k in range(1, len(raw)):
                suffixes[raw[k:]].append(cp)
                prefixes[raw[:k]].append(cp)
    pairs = set()
    for token in tokens:
        for j in range(1, len(token)):
            if 0x80 <= token[j] < 0xC0:
                continue
            left, right = token[:j], token[j:]
            lead = max((i for i, byte in enumerate(left) if not 0x80 <= byte < 0xC0), default=None)
            try:
                firsts = suffixes.get(left, []) if lead is None else [ord(left[lead:].decode("utf-8"))]
                width = 1 if right[0] < 0x80 else 2 if right[0] < 0xE0 else 3 if right[0] < 0xF0 else 4
                seconds = prefixes.get(right, []) if len(right) < width else [ord(right[:width].decode("utf-8"))]
            except UnicodeDecodeError:
                continue
            for a in firsts:
                for b in seconds:
                    if a >> BLOCK_SHIFT == b >> BLOCK_SHIFT and a >> BLOCK_SHIFT in blocks:
                        pairs.add((a, b))
    return pairs


def test_crossing_tables_equal_an_independent_enumeration(tables, vocabulary_tokens):
    blocks = {int(b) for b in np.flatnonzero(tables.seam_blocks >= 0)}
    assert {0x0E00 >> BLOCK_SHIFT, 0x0900 >> BLOCK_SHIFT, 0x0600 >> BLOCK_SHIFT, 0x3080 >> BLOCK_SHIFT} <= blocks
    want = _enumerated_crossings(vocabulary_tokens, blocks)
    got = set()
    for block in blocks:
        at = int(tables.seam_blocks[block])
        bits = np.unpackbits(tables.seam_words[at:at + CROSS_WORDS].view(np.uint8), bitorder="little")
        for k in np.flatnonzero(bits).tolist():
            got.add(((block << BLOCK_SHIFT) | k // BLOCK_SIZE, (block << BLOCK_SHIFT) | k % BLOCK_SIZE))
    assert got == want


def test_no_token_spans_a_seam(tables, vocabulary_tokens):
    """The definition, by brute force: at each seam of random text no token equals the bytes around it."""
    tokens = set(vocabulary_tokens)
    longest = max(map(len, tokens))
    rng = random.Random(20261203)
    seams = 0
    for _ in range(600):
        pool = rng.choice(list(SCRIPTS.values()))
        text = "".join(rng.choice(pool) for _ in range(rng.randint(2, 40)))
        raw = text.encode("utf-8")
        at = 0
        for a, b in zip(text, text[1:]):
            at += len(a.encode("utf-8"))
            if _crosses(tables, ord(a), ord(b)) is False:
                seams += 1
                spanning = [raw[x:y] for x in range(max(0, at - longest), at)
                            for y in range(at + 1, min(len(raw), x + longest) + 1) if raw[x:y] in tokens]
                assert not spanning, (text, at, spanning)
    assert seams > 1000


def test_each_characters_own_ids_are_its_encoding(tables, ref):
    for block in np.flatnonzero(tables.seam_blocks >= 0).tolist():
        at = int(tables.seam_blocks[block]) + CROSS_WORDS
        for low in range(BLOCK_SIZE):
            cp = (block << BLOCK_SHIFT) | low
            if 0xD800 <= cp < 0xE000:
                continue
            word = int(tables.seam_words[at + low])
            ids = [(word >> (20 * k)) & 0xFFFFF for k in range(word >> SOLO_COUNT_SHIFT)]
            assert ids == ref.enc.encode(chr(cp), disallowed_special=()), hex(cp)


def _long_texts(rng: random.Random, n: int) -> list[str]:
    texts = []
    for _ in range(n):
        name = rng.choice(list(SCRIPTS))
        pool = SCRIPTS[name] + rng.choice([[], list("aé ,1"), SCRIPTS["Thai"], ["中", "ー"]])
        body = "".join(rng.choice(pool) for _ in range(rng.randint(SEAM_MIN_PIECE_BYTES // 2, 120)))
        texts.append(rng.choice(["", " ", "x", "\n"]) + body)
    return texts


@pytest.mark.parametrize("mode", ["one thread", "threads", "routed"])
def test_long_pieces_of_scripts_with_tables_match_tiktoken(ref, mode):
    """Cold caches, then the same texts again (sections cached) and new ones with them; on one thread, on two
    sharing parts of the text, and with pieces routed by hash (caches without the vocabulary's entries)."""
    rng = random.Random(3)
    if mode == "one thread":
        tok = kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0)
    else:
        tok = new_k3_tokenizer(mode_policy(2, mode, **SMALL_GROUPS))
    first = _long_texts(rng, 1500)
    for texts in (first, first, _long_texts(rng, 1500)):
        assert_batched_parity(tok, lambda text: ref.enc.encode(text, disallowed_special=()), texts, mode)


def test_pieces_with_bytes_that_are_not_utf8_match_tiktoken(tok, ref):
    """``encode_bytes`` pieces: a malformed sequence inside a long Thai or Devanagari run is never next to a
    seam and leaves the seams around it exact."""
    rng = random.Random(11)
    dropin = tok.as_tiktoken()
    bad = [b"\xe0\xb8", b"\xb8\x81", b"\xe0\x80\x81", b"\xff", b"\xf0\x9f\x98", b"\xc3", b"\x80\x80"]
    for _ in range(1500):
        pool = rng.choice([SCRIPTS["Thai"], SCRIPTS["Devanagari"], SCRIPTS["kana"]])
        raw = b"".join(rng.choice(pool).encode("utf-8") if rng.random() < 0.9 else rng.choice(bad)
                       for _ in range(rng.randint(12, 60)))
        assert dropin._encode_single_piece(raw) == ref.enc._encode_single_piece(raw), raw


def test_a_vocabulary_with_a_token_bpe_never_builds_gets_no_seam_tables():
    """A section that is a token is that token only if BPE builds every token from its bytes: with a
    token it never builds, no block has a table, and the ids are still tiktoken's."""
    ranks = kimi_tok.kimi_k3().mergeable_ranks()
    # a two-letter Thai token that longer tokens are merged from: replaced, they are never built
    def thai_pair(token: bytes) -> bool:
        text = token.decode("utf-8", "ignore")
        return len(token) == 6 and len(text) == 2 and all("\u0e00" <= c <= "\u0e7f" for c in text)

    removed = next(t for t in ranks if thai_pair(t) and any(u.startswith(t) and len(u) > 6 for u in ranks))
    odd_ranks = dict(ranks)
    odd_ranks[b"\xff\xfe\xfd" + removed] = odd_ranks.pop(removed)
    odd = tiktoken.Encoding(name="odd", pat_str=kimi_tok.KIMI_PATTERN, mergeable_ranks=odd_ranks, special_tokens={})
    vocabulary = kimi_tok.from_tiktoken(odd).vocabulary
    tables = build_bpe_tables(vocabulary.token_bytes, vocabulary.token_offsets)
    assert (tables.seam_blocks == -1).all() and tables.seam_words.size == 0
    tok = kimi_tok.from_tiktoken(odd, policy=kimi_tok.Policy.from_env(n_jobs=1, segment_cache_bytes=0))
    text = "ภาษาไทยเป็นภาษาที่มีระดับเสียงของคำแน่นอนหรือวรรณยุกต์เช่นเดียวกับภาษาจีน " * 3
    assert tok.encode(text, tiktoken_safe=False).ids == odd.encode(text, disallowed_special=())
