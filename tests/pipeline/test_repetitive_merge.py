"""Long pieces made of a few runs of equal bytes merge as blocks (``bpe.merge.merge_repetitive_piece``).

Whitespace runs of thousands of bytes are common in prompts (padded code, tables, logs); merged
part by part they cost about a fifth of single-thread time on the bench prompts (the block merge
took BPE from 27.9 to 19.9 ms of ~41 ms at 2.4M characters). The block
merge must give exactly tiktoken's ids: checked on the Kimi vocabulary with random runs, on
vocabularies whose ranks break the shortcut's conditions (longer runs ranked before shorter
ones), and directly against the heap merge it stands in for.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import tiktoken

import kimi_tok
from kimi_tok.pipeline import bpe
from tests.parity import describe_mismatch

RUN_CHARS = (" ", "\n", "\t", "a", "0", "-", "=", "中", "\u3000", "é", "😀", "\r\n", " \n", "ab", "  \n")


def repetitive_text(rng: random.Random, max_run: int = 3_000) -> str:
    runs = "".join(rng.choice(RUN_CHARS) * rng.randint(1, max_run) for _ in range(rng.randint(1, 4)))
    return rng.choice(("", "x", "hello ", "\n", "<|open|>")) + runs + rng.choice(("", "y", " end", "\n"))


@pytest.fixture(scope="module")
def tok() -> kimi_tok.Tokenizer:
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    return kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, n_jobs=1, segment_cache_bytes=0)


@pytest.mark.parametrize("seed", range(4))
def test_runs_match_the_reference(tok, ref, seed):
    rng = random.Random(seed)
    for trial in range(60):
        segments = [(repetitive_text(rng), rng.random() < 0.3)]
        safe = rng.random() < 0.7
        expected = ref.encode_segments(segments, tiktoken_safe=safe)
        got = tok.encode_segments(segments, tiktoken_safe=safe).ids
        if got != expected:
            raise AssertionError(describe_mismatch(expected, got, f"seed {seed} trial {trial} safe={safe}"))


def test_runs_over_the_chunk_cut_match_the_reference(tok, ref):
    """Runs longer than the 25k tiktoken-safe cut, of lengths around it."""
    for char in (" ", "\n", "a", "\u3000"):
        for n in (24_999, 25_000, 25_001, 31_337, 60_000):
            segments = [("x" + char * n + "y", False)]
            for safe in (True, False):
                assert tok.encode_segments(segments, tiktoken_safe=safe).ids == ref.encode_segments(
                    segments, tiktoken_safe=safe), (repr(char), n, safe)


def odd_space_vocabulary(order_of_space_runs: dict[int, int]) -> tiktoken.Encoding:
    """All 256 bytes, a few words, and runs of n spaces ranked in the order of the given keys."""
    keys = {bytes([b]): b for b in range(256)}
    for n, key in order_of_space_runs.items():
        keys[b" " * n] = key
    for word in (b"ab", b"abc", b"\n\n", b"\n\n\n\n", b"aa", b"aaaa"):
        keys.setdefault(word, 1_000 + len(keys))
    assert len(set(keys.values())) == len(keys)
    ranks = {token: rank for rank, token in enumerate(sorted(keys, key=keys.get))}
    return tiktoken.Encoding(name="odd_spaces", pat_str=r"\s+|\S+", mergeable_ranks=ranks, special_tokens={})


@pytest.mark.parametrize("space_order", [
    {2: 300, 3: 260, 4: 270, 6: 280, 8: 320},  # three spaces rank before two: no block-wide merges
    {2: 300, 4: 290, 8: 280, 16: 270, 32: 260},  # each doubling ranks before the last
    {2: 256, 3: 257, 4: 258, 5: 259, 7: 400, 9: 261, 16: 262},  # increasing, with gaps
    {2: 500, 4: 300, 3: 301},  # a pair of pairs ranks before the pair itself
])
def test_vocabularies_that_break_the_shortcut(space_order):
    enc = odd_space_vocabulary(space_order)
    vocabulary = kimi_tok.from_tiktoken(enc).vocabulary
    tok = kimi_tok.Tokenizer(vocabulary, {}, enc._pat_str, n_jobs=1, segment_cache_bytes=0)
    rng = random.Random(len(space_order))
    texts = ["x" + " " * n + "y" for n in (255, 256, 257, 1_000, 1_001, 4_096, 9_999)]
    texts += ["ab" + " " * rng.randint(256, 3_000) + "\n\n" * rng.randint(1, 200) + " " * rng.randint(1, 700)
              for _ in range(20)]
    for text in texts:
        expected = enc.encode(text)
        got = tok.encode_segments([(text, False)], tiktoken_safe=False).ids
        if got != expected:
            raise AssertionError(describe_mismatch(expected, got, f"{space_order} text of {len(text)} chars"))
    for n in (256, 1_000, 4_096, 9_999):  # these runs do take the block merge, one merge at a time or not
        blocks, heap = merge_both_ways(tok.engine.stages.tables, b" " * n)
        assert blocks == heap, n


def merge_both_ways(tables, piece: bytes):
    """``(block merge ids or None if it declined, heap merge ids)`` of one piece."""
    buf = np.frombuffer(piece, dtype=np.uint8)
    scratch = bpe.new_merge_scratch(len(piece), bpe.merge.new_pair_memo())
    out = np.zeros(len(piece), dtype=np.uint32)
    n = bpe.merge.merge_repetitive_piece(tables, buf, 0, len(piece), out, 0, scratch)
    blocks = None if n < 0 else out[:n].tolist()
    n = bpe.merge.merge_long_piece(tables, buf, 0, len(piece), out, 0, bpe.new_merge_scratch(len(piece), bpe.merge.new_pair_memo()))
    return blocks, out[:n].tolist()


def test_block_merge_equals_heap_merge_and_declines_what_is_not_repetitive():
    vocabulary, _ = kimi_tok.vocab.embedded_kimi_k3()
    tables = bpe.build_bpe_tables(vocabulary.token_bytes, vocabulary.token_offsets)
    rng = random.Random(5)
    for _ in range(40):
        piece = "".join(rng.choice((" ", "\n", "\t", "=")) * rng.randint(1, 900)
                        for _ in range(rng.randint(1, 5))).encode()
        blocks, heap = merge_both_ways(tables, piece)
        assert blocks == heap, piece[:40]
    for piece in (" \n".encode() * 500, "中".encode() * 400, bytes(range(256)) * 2):
        blocks, heap = merge_both_ways(tables, piece)
        assert blocks is None  # more than REPETITIVE_MAX_BLOCKS runs: left to the heap
        assert len(heap) > 0
