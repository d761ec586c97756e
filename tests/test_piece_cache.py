"""The per-thread piece cache (bpe.PieceCache): exact ids while it fills, starts over and persists."""

from __future__ import annotations

import kimi_tok
from kimi_tok import bpe
from kimi_tok.samples import sample_prompt

from tests.parity import assert_parity


def _tokenizer_with_tiny_cache(entries: int, key_bytes: int, ids: int) -> kimi_tok.Tokenizer:
    vocabulary, specials = kimi_tok.embedded_kimi_k3()
    tok = kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, n_jobs=1, segment_cache_bytes=0)
    tok._thread_state.piece_cache = bpe.new_piece_cache(tok._bpe, entries=entries, key_bytes=key_bytes, ids=ids)
    return tok


def test_cache_that_keeps_starting_over_gives_reference_ids(ref):
    tok = _tokenizer_with_tiny_cache(entries=16, key_bytes=256, ids=64)
    for seed in range(3):
        assert_parity(tok, ref, sample_prompt(60_000, seed=seed))
    assert tok._thread_state.piece_cache.used[0] <= 16


def test_pieces_larger_than_the_arenas_are_merged_but_not_stored(ref):
    tok = _tokenizer_with_tiny_cache(entries=16, key_bytes=64, ids=8)
    assert_parity(tok, ref, [(" " * 5000 + "x" + "ab" * 3000, False)])


def test_cache_persists_across_calls_and_stays_exact(ref):
    tok = _tokenizer_with_tiny_cache(entries=1 << 12, key_bytes=1 << 16, ids=1 << 14)
    segments = sample_prompt(40_000, seed=7)
    first = assert_parity(tok, ref, segments)
    stored = int(tok._thread_state.piece_cache.used[0])
    assert stored > 0
    assert tok.encode_segments(segments).ids == first  # served from the cache now
    assert int(tok._thread_state.piece_cache.used[0]) == stored  # nothing merged twice
