"""The per-thread piece cache (bpe.PieceCache): exact ids while it fills, starts over and persists."""

from __future__ import annotations

import kimi_tok
from kimi_tok.pipeline import bpe
from kimi_tok.samples import sample_prompt

from tests.parity import assert_parity


def _tokenizer_with_tiny_cache(entries: int, key_bytes: int, ids: int) -> kimi_tok.Tokenizer:
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    tok = kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, n_jobs=1, segment_cache_bytes=0)
    tok.engine.stages.piece_caches = bpe.PieceCachePool(
        lambda: bpe.new_piece_cache(tok.engine.stages.tables.short_slots, entries=entries, key_bytes=key_bytes, ids=ids),
        keep=1,
    )
    return tok


def _kept_cache(tok: kimi_tok.Tokenizer) -> bpe.PieceCache:
    (cache,) = tok.engine.stages.piece_caches.kept()
    return cache


def test_cache_that_keeps_starting_over_gives_reference_ids(ref):
    tok = _tokenizer_with_tiny_cache(entries=16, key_bytes=256, ids=64)
    for seed in range(3):
        assert_parity(tok, ref, sample_prompt(60_000, seed=seed))
    assert _kept_cache(tok).used[0] <= 16


def test_pieces_larger_than_the_arenas_are_merged_but_not_stored(ref):
    tok = _tokenizer_with_tiny_cache(entries=16, key_bytes=64, ids=8)
    assert_parity(tok, ref, [(" " * 5000 + "x" + "ab" * 3000, False)])


def test_cache_persists_across_calls_and_stays_exact(ref):
    tok = _tokenizer_with_tiny_cache(entries=1 << 12, key_bytes=1 << 16, ids=1 << 14)
    segments = sample_prompt(40_000, seed=7)
    first = assert_parity(tok, ref, segments)
    stored = int(_kept_cache(tok).used[0])
    assert stored > 0
    assert tok.encode_segments(segments).ids == first  # served from the cache now
    assert int(_kept_cache(tok).used[0]) == stored  # nothing merged twice


def test_pool_keeps_a_bounded_number_of_caches_under_many_threads(ref):
    """32 threads at once borrow up to 32 caches, but only ``keep`` stay after the calls."""
    from concurrent.futures import ThreadPoolExecutor

    tok = _tokenizer_with_tiny_cache(entries=1 << 10, key_bytes=1 << 14, ids=1 << 12)
    tok.engine.stages.piece_caches = bpe.PieceCachePool(lambda: bpe.new_piece_cache(tok.engine.stages.tables.short_slots),
                                                        keep=3)
    prompts = [sample_prompt(20_000, seed=s) for s in range(8)]
    expected = [ref.encode_segments(p) for p in prompts]
    with ThreadPoolExecutor(max_workers=32) as pool:
        got = list(pool.map(lambda k: tok.encode_segments(prompts[k % 8]).ids, range(64)))
    assert all(g == expected[k % 8] for k, g in enumerate(got))
    assert len(tok.engine.stages.piece_caches.kept()) <= 3


def test_pool_never_lends_one_cache_to_two_callers_at_once():
    """The free list has no lock (its ``pop`` and ``append`` are atomic): 16 threads taking and giving back
    20,000 times each, with the interpreter switching threads every few microseconds, never hold one cache
    together, and at most ``keep`` caches are kept at the end."""
    import sys
    import threading

    made = []  # every cache ever made stays alive, so no two share an id

    def make() -> object:
        cache = object()  # returned as made: ``made[-1]`` could be another thread's by then
        made.append(cache)
        return cache

    pool = bpe.PieceCachePool(make, keep=3)
    holders: dict[int, int] = {}
    shared = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)

    def work(me: int) -> None:
        for _ in range(20_000):
            cache, bundle = pool.take()
            if holders.setdefault(id(cache), me) != me:
                shared.append(id(cache))
            del holders[id(cache)]
            pool.give_back(cache, bundle, may_grow=False)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert shared == []
    assert 1 <= len(pool.kept()) <= 3 and len({id(cache) for cache in pool.kept()}) == len(pool.kept())


def test_a_cache_grows_as_calls_fill_it_and_stays_exact(ref):
    """A cache a call filled (or made start over) grows before the next call (its entries moved over):
    new text keeps finding the words seen before, and the ids stay the reference's."""
    from kimi_tok.pipeline.bpe.piece_cache import MAX_SHORT_CACHE_ENTRIES
    from kimi_tok.pipeline.bpe.tables import ENTRY_WORDS

    tok = _tokenizer_with_tiny_cache(entries=16, key_bytes=256, ids=64)
    tok.engine.stages.piece_caches = bpe.PieceCachePool(
        lambda: bpe.new_piece_cache(entries=16, key_bytes=256, ids=64, short_entries=256), keep=1,
        grow=bpe.grown_piece_cache)
    sizes = []
    for seed in range(6):
        assert_parity(tok, ref, sample_prompt(60_000, seed=seed))
        cache = _kept_cache(tok)
        sizes.append((cache.short_slots.shape[0] // ENTRY_WORDS, cache.key_at.shape[0]))
    assert sizes[-1][0] > 256 and sizes[-1][1] > 16  # both tables grew ...
    assert all(a <= b for a, b in zip(sizes, sizes[1:]))  # ... never shrank ...
    assert sizes[-1][0] <= MAX_SHORT_CACHE_ENTRIES  # ... and stay bounded
    first = assert_parity(tok, ref, sample_prompt(60_000, seed=0))
    assert tok.encode_segments(sample_prompt(60_000, seed=0)).ids == first  # served from the grown cache


def test_a_cache_seeded_with_the_vocabulary_starts_over_and_never_grows():
    """A thread's short table starts as the vocabulary's entries in a larger table; calls that fill it
    make it start over (its merged pieces dropped, the vocabulary's put back) but never grow it, so
    giving a cache back never stalls on moving a large table; the ids stay tiktoken's."""
    import random

    import tiktoken

    from kimi_tok.pipeline.bpe.piece_cache import SEEDED_SHORT_FACTOR, SHORT_BASE, SHORT_RESETS
    from kimi_tok.pipeline.bpe.tables import ENTRY_WORDS

    tokens = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", b"in", b"ing", b" wor", b"ld"]
    enc = tiktoken.Encoding(name="tiny", pat_str=kimi_tok.KIMI_PATTERN,
                            mergeable_ranks={t: r for r, t in enumerate(tokens)}, special_tokens={})
    tok = kimi_tok.from_tiktoken(enc, policy=kimi_tok.Policy.from_env(n_jobs=1, segment_cache_bytes=0))
    vocabulary_entries = tok.engine.stages.tables.short_slots.shape[0] // ENTRY_WORDS
    rng = random.Random(5)
    for _ in range(30):  # fresh words every call: many merged short pieces
        text = " ".join("".join(rng.choice("thingworld") for _ in range(rng.randint(3, 12))) for _ in range(400))
        assert tok.encode(text, tiktoken_safe=False).ids == enc.encode_ordinary(text)
    (cache,) = tok.engine.stages.piece_caches.kept()[:1]
    assert cache.used[SHORT_BASE] > 0 and cache.used[SHORT_RESETS] > 0  # seeded, and it started over
    assert cache.short_slots.shape[0] // ENTRY_WORDS == SEEDED_SHORT_FACTOR * vocabulary_entries  # never grown


def test_a_short_call_keeps_its_caches_bundle_until_the_cache_grows(ref):
    """A short call hands its kernel the tables and a piece cache as one bundle (``native.bundles``),
    made on the cache's first short call and given back with it; a cache that grows gets a new one
    (the old bundle holds the old arrays), and the ids stay the reference's throughout."""
    import random

    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    tok = kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, n_jobs=1, segment_cache_bytes=0)
    pool = tok.engine.stages.piece_caches = bpe.PieceCachePool(
        lambda: bpe.new_piece_cache(entries=16, key_bytes=256, ids=64, short_entries=256), keep=1,
        grow=bpe.grown_piece_cache)

    def kept() -> tuple[bpe.PieceCache, object]:
        cache, bundle = pool.take()
        pool.give_back(cache, bundle)
        return cache, bundle

    assert kept()[1] is None  # a new cache: no short call has used it
    assert tok.encode("hello world").ids == ref.encode_segments([("hello world", False)])
    cache, bundle = kept()
    assert bundle is not None
    assert tok.encode("hello again").ids == ref.encode_segments([("hello again", False)])
    assert kept() == (cache, bundle)  # the same cache, with the same bundle
    rng = random.Random(11)

    def words(n: int) -> str:
        return " ".join("".join(rng.choice("qwertyuiopasdfghjklzxcvbnm") for _ in range(rng.randint(20, 40)))
                        for _ in range(n))

    grown = 0
    for _ in range(40):  # fresh long words: merged pieces fill the tiny general table, which grows
        text = words(20)
        assert tok.encode(text).ids == ref.encode_segments([(text, False)])
        now, now_bundle = kept()
        if now is not cache:
            grown += 1
            assert now_bundle is None  # dropped with the old arrays
            before = int(now.used[0])
            text = words(2)
            assert tok.encode(text).ids == ref.encode_segments([(text, False)])
            now, now_bundle = kept()
            assert int(now.used[0]) > before  # the new bundle's cache is the grown one: its merges landed there
        cache = now
    assert grown >= 2


def test_growth_needed_answers_as_the_tables_fill():
    """``growth_needed`` (asked by a short call's kernel, so that giving the cache back reads no NumPy
    scalars) says grow exactly where ``grown_piece_cache`` grows: not for a fresh cache, yes for a general
    table half full (one made smaller than the default), yes for an unseeded short table that started over, never
    for a seeded one nor for a general table of the default size (reserved at the largest)."""
    from kimi_tok.pipeline.bpe.piece_cache import (ENTRIES, SEEDED_SHORT_FACTOR, SHORT_RESETS, growth_needed)

    cache = bpe.new_piece_cache(entries=16, key_bytes=256, ids=64, short_entries=256)
    assert tuple(growth_needed(cache)) == (False, False)
    assert bpe.grown_piece_cache(cache) is cache
    cache.used[ENTRIES] = 8
    assert tuple(growth_needed(cache)) == (False, True)
    grown = bpe.grown_piece_cache(cache)
    assert grown.key_at.shape[0] == 64 and grown.short_slots is cache.short_slots
    grown.used[SHORT_RESETS] = 1  # the grown cache has counts of its own (moved over)
    assert tuple(growth_needed(grown)) == (True, False)
    assert bpe.grown_piece_cache(grown).short_slots.shape[0] == 2 * grown.short_slots.shape[0]
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    tok = kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, n_jobs=1, segment_cache_bytes=0)
    seeded = bpe.new_piece_cache(tok.engine.stages.tables.short_slots)
    seeded.used[SHORT_RESETS] = 3  # started over, but seeded from the vocabulary: never grows
    assert tuple(growth_needed(seeded)) == (False, False)
    seeded.used[ENTRIES] = seeded.key_at.shape[0] - 1  # a general table of the default size is the largest
    assert tuple(growth_needed(seeded)) == (False, False) and bpe.grown_piece_cache(seeded) is seeded
    assert seeded.short_slots.shape[0] == SEEDED_SHORT_FACTOR * tok.engine.stages.tables.short_slots.shape[0]
