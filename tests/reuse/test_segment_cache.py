"""The segment cache is exact: ids with it equal ids without it (and the reference), always.

Agent loops re-send the same prefix every turn; ``Tokenizer(segment_cache_bytes=...)`` reuses
the ids of unchanged segments. These tests drive seeded random multi-turn sequences (segments
appended, edited by one character, removed, duplicated, reordered, flags flipped, chunking
toggled, texts re-rendered as equal but distinct ``str`` objects; empty, short, long,
surrogate-holding, control-literal and long-whitespace-run segments) through one cached
tokenizer and compare with an uncached one and with the tiktoken reference. They also check
the byte budget (``used_bytes <= budget`` after every call, eviction, budget 0 disables),
concurrent use from several threads, and ``count_tokens``.
"""

from __future__ import annotations

import os
import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kimi_tok
from kimi_tok.samples import sample_text
from kimi_tok.reuse.segment_cache import MIN_CACHED_CHARS
from tests.parity import describe_mismatch, rerender, short_repr

BIG_BUDGET = 32 << 20  # a tokenizer of our own (kimi_k3 is cached per argument tuple)
SMALL_BUDGET = 64 << 10
THREAD_BUDGET = 256 << 10  # small enough that threads evict while others read


def cache_tokenizer(budget: int) -> kimi_tok.Tokenizer:
    """kimi_k3() with a segment cache of ``budget`` bytes that every call uses, however short (the
    shipped policy sends short calls straight to the engine: test_short_calls_skip_the_cache)."""
    return kimi_tok.kimi_k3(policy=kimi_tok.Policy.from_env(segment_cache_bytes=budget, min_cached_call_chars=0))


@pytest.fixture(scope="module")
def plain() -> kimi_tok.Tokenizer:
    tok = kimi_tok.kimi_k3(segment_cache_bytes=0)
    assert tok.segment_cache is None
    return tok


@pytest.fixture()
def cached() -> kimi_tok.Tokenizer:
    tok = cache_tokenizer(BIG_BUDGET)
    tok.segment_cache.clear()
    return tok


@pytest.fixture()
def small() -> kimi_tok.Tokenizer:
    tok = cache_tokenizer(SMALL_BUDGET)
    tok.segment_cache.clear()
    return tok


def ids_of(tok, segments, tiktoken_safe: bool = True) -> list[int]:
    return tok.encode_segments(segments, tiktoken_safe=tiktoken_safe).ids


def assert_same(expected, got, segments, what: str, tiktoken_safe: bool = True) -> None:
    if list(expected) != list(got):
        raise AssertionError(describe_mismatch(
            list(expected), list(got), f"{what}: segments={short_repr(segments)} tiktoken_safe={tiktoken_safe}"
        ))


# --------------------------------------------------------------------------------------------
# Random multi-turn sequences
# --------------------------------------------------------------------------------------------


def insert_surrogates(rng: random.Random, text: str) -> str:
    """Lone surrogates (high, low, reversed pairs) and pairs written as two code points."""
    chars = list(text)
    for _ in range(rng.randint(1, 4)):
        chars.insert(rng.randrange(len(chars) + 1),
                     rng.choice(("\ud800", "\udfff", "\ude00\ud83d", "\ud83d\ude00", "\udbff")))
    return "".join(chars)


def random_text(rng: random.Random) -> str:
    """Empty, short, around the cache threshold, long, surrogates, control literals, long runs."""
    seed = rng.getrandbits(32)
    kind = rng.choices(
        ("empty", "short", "threshold", "long", "surrogates", "literals", "run"),
        weights=(1, 6, 2, 6, 1, 2, 1),
    )[0]
    if kind == "empty":
        return ""
    if kind == "short":
        return sample_text(rng.randint(1, MIN_CACHED_CHARS - 1), seed)
    if kind == "threshold":
        return sample_text(MIN_CACHED_CHARS + rng.randint(-2, 2), seed)
    if kind == "long":
        return sample_text(rng.randint(MIN_CACHED_CHARS, 6_000), seed)
    if kind == "surrogates":
        return insert_surrogates(rng, sample_text(rng.choice((40, MIN_CACHED_CHARS, 1_500)), seed))
    if kind == "literals":  # control strings: special tokens when allow_special, text otherwise
        lits = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "[EOS]", "<|im_end|>")
        parts = [sample_text(rng.randint(20, 200), seed + k) + rng.choice(lits) for k in range(rng.randint(2, 8))]
        return "".join(parts)
    # A whitespace (or letter) run over 25,000 chars: tiktoken_safe cuts it, so ids depend on the flag.
    run = rng.choice((" ", "\n", "\u3000", "a")) * rng.randint(25_001, 26_500)
    return sample_text(rng.randint(0, 300), seed) + run + sample_text(rng.randint(0, 300), seed + 1)


def edit_one_char(rng: random.Random, text: str) -> str:
    if not text:
        return rng.choice(("x", " ", "<"))
    i = rng.randrange(len(text))
    new = rng.choice(("x", " ", "\n", "é", "中", "😀", "|", "<", "\ud800", text[i - 1]))
    if new == text[i]:
        new = "y" if text[i] != "y" else "z"
    return text[:i] + new + text[i + 1:]


def evolve(rng: random.Random, segments: list, max_chars: int = 60_000) -> list:
    """One turn: mostly appends, plus random edits of the prefix."""
    segs = list(segments)
    for _ in range(rng.randint(1, 3)):
        op = rng.choices(
            ("append", "edit", "remove", "duplicate", "reorder", "flip", "rerender"),
            weights=(8, 3, 2, 1, 2, 2, 2),
        )[0]
        if op == "append" or not segs:
            segs += [(random_text(rng), rng.random() < 0.3) for _ in range(rng.randint(1, 4))]
        elif op == "edit":
            i = rng.randrange(len(segs))
            segs[i] = (edit_one_char(rng, segs[i][0]), segs[i][1])
        elif op == "remove":
            del segs[rng.randrange(len(segs))]
        elif op == "duplicate":
            segs.insert(rng.randrange(len(segs) + 1), segs[rng.randrange(len(segs))])
        elif op == "reorder":
            i, j = sorted(rng.sample(range(len(segs) + 1), 2)) if len(segs) > 1 else (0, 1)
            part = segs[i:j]
            rng.shuffle(part)
            segs[i:j] = part
        elif op == "flip":
            i = rng.randrange(len(segs))
            segs[i] = (segs[i][0], not segs[i][1])
        else:
            segs = rerender(segs)
    while sum(len(t) for t, _ in segs) > max_chars:
        del segs[rng.randrange(len(segs))]
    return segs


@pytest.mark.parametrize("seed", range(6))
def test_random_turns_equal_uncached_and_reference(cached, plain, ref, seed):
    """40 random turns: cached ids == uncached ids every turn, == the reference every 4th turn."""
    rng = random.Random(seed)
    segments: list = []
    for turn in range(40):
        segments = evolve(rng, segments, max_chars=100_000)
        safe = rng.random() < 0.75
        got = ids_of(cached, segments, safe)
        assert_same(ids_of(plain, segments, safe), got, segments, f"seed {seed} turn {turn}: cached vs uncached",
                    safe)
        if turn % 4 == 3:
            assert_same(ref.encode_segments(segments, tiktoken_safe=safe), got, segments,
                        f"seed {seed} turn {turn}: cached vs reference", safe)
        assert cached.count_tokens(segments, tiktoken_safe=safe) == len(got)
        assert cached.segment_cache.used_bytes <= cached.segment_cache.budget_bytes
    assert cached.segment_cache.hits > 0, "the random turns never hit the cache: the test checks nothing"


def test_same_text_other_flags_are_other_entries(cached, plain, ref):
    """A long text with control literals: allow_special and tiktoken_safe are part of the key."""
    text = ("hello <|open|>message<|sep|> [EOS] world " * 20) + " " * 25_500 + "tail"
    assert len(text) >= MIN_CACHED_CHARS
    results = {}
    for _ in range(2):  # the second round is served from the cache
        for allow in (False, True):
            for safe in (True, False):
                segs = rerender([(text, allow)])
                got = ids_of(cached, segs, safe)
                assert_same(ref.encode_segments(segs, tiktoken_safe=safe), got, segs, f"allow={allow}", safe)
                assert results.setdefault((allow, safe), got) == got
    assert len({tuple(v) for v in results.values()}) == 4  # all four keys give different ids
    assert len(cached.segment_cache) == 4


def test_one_char_edit_of_cached_segment_gives_new_correct_ids(cached, ref):
    """Editing one character anywhere in a cached long segment never returns the old ids."""
    rng = random.Random(7)
    base = sample_text(3_000, seed=11) + "<|opem|>" + sample_text(500, seed=12)
    prefix = [("<|open|>", True), ("tool_result", False), ("<|sep|>", True)]
    for allow in (False, True):
        old = ids_of(cached, prefix + [(base, allow)])
        assert ids_of(cached, prefix + [(base, allow)]) == old  # now a hit
        spots = [0, 1, len(base) // 2, len(base) - 1, base.index("<|opem|>") + 5] + rng.sample(range(len(base)), 5)
        for i in spots:
            for new in ("x", "n", " ", "😀", "\ud800"):
                if base[i] == new:
                    continue
                edited = base[:i] + new + base[i + 1:]
                segs = prefix + [(edited, allow)]
                got = ids_of(cached, segs)
                assert_same(ref.encode_segments(segs), got, segs, f"edit at {i} to {new!r}")
                assert ids_of(cached, rerender(segs)) == got  # and the edited text's own entry hits
    # "<|opem|>" -> "<|open|>": with allow_special the edit creates a control token
    fixed = base.replace("<|opem|>", "<|open|>")
    assert 163587 in ids_of(cached, [(fixed, True)]) and 163587 not in ids_of(cached, [(fixed, False)])


def test_surrogate_segments_are_cached_exactly(cached, ref):
    rng = random.Random(3)
    segs = [(insert_surrogates(rng, sample_text(n, seed=n)), allow)
            for n in (10, MIN_CACHED_CHARS, 2_000, 30_000) for allow in (False, True)]
    segs.append(("\ud83d" + "a" * 24_999 + "\ude00" + "b" * 300, False))  # a pair cut apart by the 25k cut
    for safe in (True, False):
        expected = ref.encode_segments(segs, tiktoken_safe=safe)
        for _ in range(2):
            assert_same(expected, ids_of(cached, rerender(segs), safe), segs, "surrogates", safe)
    assert cached.segment_cache.hits > 0


def test_calls_with_little_new_text_store_nothing(cached, plain):
    """New segments totalling under MIN_CACHED_CHARS are encoded again rather than stored."""
    short, at = sample_text(MIN_CACHED_CHARS - 1, seed=1), sample_text(MIN_CACHED_CHARS, seed=2)
    cached.encode_segments([(short, False), ("", False), ("", True)])
    assert len(cached.segment_cache) == 0 and cached.segment_cache.used_bytes == 0
    cached.encode_segments([(at, False)])
    assert len(cached.segment_cache) == 1
    hits = cached.segment_cache.hits
    assert ids_of(cached, [(at, False), (short, False)]) == ids_of(plain, [(at, False), (short, False)])
    assert cached.segment_cache.hits == hits + 1  # the long one; the short one alone was never stored


def chat_turn(turn: int, n_chars: int) -> list:
    """A K3-style turn: short template segments around one long text (as bench.agent_loop renders)."""
    return [("<|open|>", True), ("message", False), (' role="tool"', False), ("<|sep|>", True),
            (sample_text(n_chars, seed=500 + turn), False), ("<|close|>", True), ("message", False)]


def test_agent_loop_turns_reuse_whole_runs(cached, plain, ref):
    """Turn N+1 = turn N + appended segments: every earlier segment hits, short template ones
    included, and the ids come from one run per earlier turn."""
    segments: list = []
    for turn in range(8):
        new = chat_turn(turn, 2_000 + 300 * turn)
        segments = rerender(segments) + new
        cache = cached.segment_cache
        hits, misses = cache.hits, cache.misses
        plan = cache.plan(segments, True)  # what the call below will find (plan counts too)
        assert plan.missing == list(range(len(segments) - len(new), len(segments)))
        assert len([part for part in plan.parts if isinstance(part, np.ndarray)]) == turn
        assert (cache.hits - hits, cache.misses - misses) == (len(segments) - len(new), len(new))
        got = ids_of(cached, segments)
        assert_same(ids_of(plain, segments), got, segments, f"turn {turn}")
        assert len(cache) == len(segments)
    assert_same(ref.encode_segments(segments), got, segments, "last turn vs reference")


def test_runs_are_entered_anywhere_and_extended_backwards(cached, plain):
    """Segments of a stored run found out of order: a long segment is found by the index, the
    short template segments just before it are taken from the run backwards."""
    turns = [chat_turn(turn, 1_500) for turn in range(4)]
    cached.encode_segments([seg for turn in turns for seg in turn])
    cache = cached.segment_cache
    for order in ([2, 0], [3, 1, 2], [1], [3, 2, 1, 0]):
        segments = rerender([seg for k in order for seg in turns[k]])
        plan = cache.plan(segments, True)
        assert plan.missing == [], f"order {order}: {plan.missing}"
        assert ids_of(cached, segments) == ids_of(plain, segments)
    # a turn cut in its middle: the template segments before the long text still hit
    segments = rerender(turns[2][2:] + turns[0][:5])
    assert cache.plan(segments, True).missing == []
    assert ids_of(cached, segments) == ids_of(plain, segments)


def test_edit_inside_a_run_misses_only_around_the_edit(cached, plain):
    turns = [chat_turn(turn, 1_500) for turn in range(3)]
    flat = [seg for turn in turns for seg in turn]
    cached.encode_segments(flat)
    edited = rerender(flat)
    at = len(turns[0]) + 4  # the long text of turn 1
    edited[at] = (edited[at][0][:700] + "!" + edited[at][0][701:], False)
    plan = cached.segment_cache.plan(edited, True)
    assert plan.missing == [at]
    assert ids_of(cached, edited) == ids_of(plain, edited)
    assert cached.segment_cache.plan(rerender(edited), True).missing == []  # the edited text is stored too


def test_speculate_compares_whole_runs_and_leaves_only_edits_to_verify(cached):
    """A call repeating stored runs gets verified spans (their texts compared by speculate, one list
    comparison per run); a same-length edit leaves its span to ``verify``, which names it. The
    character count remembered for guessing the next turn is the call's."""
    turns = [chat_turn(turn, 1_500) for turn in range(3)]
    flat = [seg for turn in turns for seg in turn]
    cached.encode_segments(flat)
    cache = cached.segment_cache
    again = rerender(flat) + [("appended " * 40, False)]
    speculation = cache.speculate(again, True)
    assert speculation.spans and all(span.verified for span in speculation.spans)
    assert speculation.missing == [len(flat)] and cache.verify(speculation) == []
    assert cache._recent_calls[-1].chars == sum(len(text) for text, _ in again)
    edited = rerender(flat)
    at = len(turns[0]) + 4
    edited[at] = (edited[at][0][:700] + "!" + edited[at][0][701:], False)  # same length
    speculation = cache.speculate(edited, True)
    assert speculation.missing == []
    assert [span.verified for span in speculation.spans if span.at <= at < span.at + span.end - span.first] == [False]
    assert cache.verify(speculation) == [at]


def test_prompts_of_short_segments_only_are_reused(cached, plain):
    """No segment long enough for the index: the call's first segment finds the run. An edit that
    keeps the length misses only the edited segment (the run is followed past it); one that
    changes it ends the chain, and the run stored for the rest of that call is found where the
    old run was left by the next call."""
    words = [(f"w{k} ", k % 7 == 0) for k in range(3_000)]
    cached.encode_segments(words)
    again = rerender(words)
    assert cached.segment_cache.plan(again, True).missing == []
    assert ids_of(cached, again) == ids_of(plain, again)
    edited = rerender(words)
    edited[1_500] = ("w1500!", False)  # same length
    assert cached.segment_cache.plan(edited, True).missing == [1_500]
    assert ids_of(cached, edited) == ids_of(plain, edited)
    edited = rerender(edited)
    edited[2_000] = ("w2000!!", False)  # longer
    assert cached.segment_cache.plan(edited, True).missing == list(range(1_500, 1_501)) + list(range(2_000, 3_000))
    assert ids_of(cached, edited) == ids_of(plain, edited)
    edited = rerender(edited)
    assert cached.segment_cache.plan(edited, True).missing == [1_500]  # 6 characters: never worth storing
    assert ids_of(cached, edited) == ids_of(plain, edited)


def test_calls_whose_long_segments_are_all_new_are_planned_no_further(cached, plain, ref):
    """No long segment cached and long ones holding most of the characters: speculate offers nothing
    (the short template segments a run could offer cost less to encode than to plan), every segment
    is missing, and the ids equal the reference's. One long segment cached, or short segments holding
    more than 1/8 of the characters (``MIN_LONG_SHARE``), and the call is planned in full."""
    cached.encode_segments([seg for turn in range(3) for seg in chat_turn(turn, 1_500)])
    cache = cached.segment_cache
    fresh = [seg for turn in range(10, 13) for seg in chat_turn(turn, 1_500)]  # the same template, new texts
    speculation = cache.speculate(fresh, True)
    assert (speculation.spans, speculation.missing) == ([], list(range(len(fresh))))
    assert set(speculation.fingerprints) == {4, 11, 18}  # the long texts' fingerprints, for the store
    assert cache._recent_calls[-1].chars == sum(len(text) for text, _ in fresh)
    plan = cache.resolve(speculation, cache.verify(speculation))
    assert (plan.missing, plan.parts, plan.after) == (list(range(len(fresh))), [(0, len(fresh))], [None])
    assert_same(ref.encode_segments(fresh), ids_of(cached, fresh), fresh, "long segments all new")
    cache.settle()
    assert cache.plan(rerender(fresh), True).missing == []  # stored as one run
    # one long segment cached: every template segment is taken from a run again, only the new texts miss
    mixed = [seg for turn in (20, 1, 21) for seg in chat_turn(turn, 1_500)]
    assert cache.plan(mixed, True).missing == [4, 18]
    assert_same(ref.encode_segments(mixed), ids_of(cached, mixed), mixed, "one long segment cached")
    # short segments with a quarter of the characters: the template segments are still offered
    words = [(f"w{k} ", False) for k in range(1_000)]
    cached.encode_segments(words)
    wordy = rerender(words) + [(sample_text(12_000, seed=77), False)]
    assert cache.plan(wordy, True).missing == [len(words)]
    assert_same(ref.encode_segments(wordy), ids_of(cached, wordy), wordy, "short segments reused")


def test_turns_alternating_chunking_flags_keep_their_own_runs(cached, plain):
    """Runs stored with tiktoken_safe=True are never continued into a call with False (the ids
    of a long whitespace run differ between the two), and the other way round."""
    long_run = "tail" + " " * 25_500 + "end"
    base = [(sample_text(1_000, seed=1), False), (long_run, False)]
    more = base + [(sample_text(900, seed=2), False), (long_run + "!", False)]
    for segments, safe in ((base, True), (more, True), (base, False), (more, False), (more, True),
                           (more + [(long_run, False)], False), (more + [(long_run, False)], True)):
        segments = rerender(segments)
        assert_same(ids_of(plain, segments, safe), ids_of(cached, segments, safe), segments,
                    f"tiktoken_safe={safe}", safe)
    assert cached.segment_cache.plan(rerender(more), True).missing == []
    assert cached.segment_cache.plan(rerender(more), False).missing == []


def test_returned_ids_do_not_alias_the_cache(cached):
    """Writing into the array a call returned must not change what later calls return."""
    segs = [(sample_text(2_000, seed=5), False), (sample_text(800, seed=6), False)]

    def scribble(array: np.ndarray, value: int) -> None:
        if array.flags.writeable:  # a read-only result would be safe too
            array[:] = value

    first = cached.encode_segments(segs).into_numpy()["ids"]
    expected = first.copy()
    scribble(first, 0)  # the array of a call that missed
    again = cached.encode_segments(rerender(segs)).into_numpy()["ids"]
    assert np.array_equal(again, expected)
    scribble(again, 1)  # of a call that hit on every segment
    one = cached.encode_segments(segs[:1]).into_numpy()["ids"]  # of a single hit
    assert np.array_equal(one, expected[: len(one)])
    scribble(one, 2)
    assert np.array_equal(cached.encode_segments(segs).into_numpy()["ids"], expected)


# --------------------------------------------------------------------------------------------
# The byte budget
# --------------------------------------------------------------------------------------------


def test_budget_bounds_memory_and_evicts(small, plain):
    """64 KiB budget, 120 distinct long segments in random calls: used_bytes <= budget, always."""
    cache = small.segment_cache
    assert cache.budget_bytes == SMALL_BUDGET
    rng = random.Random(0)
    # at most ~11 KiB an entry, so one call's 4 new entries + the hot one fit in the budget
    pool = [(sample_text(rng.randint(MIN_CACHED_CHARS, 2_000), seed=1000 + k), rng.random() < 0.2)
            for k in range(120)]
    hot = (sample_text(1_000, seed=999), False)
    seen = set()
    for call in range(60):
        picks = rng.sample(pool[: 2 * call + 2], min(4, 2 * call + 2)) + [hot]
        rng.shuffle(picks)
        seen.update(picks)
        got = ids_of(small, picks)
        assert got == ids_of(plain, picks)
        assert 0 <= cache.used_bytes <= SMALL_BUDGET, f"call {call}: {cache.used_bytes} > {SMALL_BUDGET}"
    assert len(cache) < len(seen), "nothing was evicted"
    # the hot segment, used in every call, survives (least-recently-used eviction)
    hits = cache.hits
    assert ids_of(small, [hot]) == ids_of(plain, [hot])
    assert cache.hits == hits + 1
    # an evicted segment misses and is encoded again, correctly
    misses = cache.misses
    assert ids_of(small, [pool[0]]) == ids_of(plain, [pool[0]])
    assert cache.misses == misses + 1


def test_entry_larger_than_budget_is_not_kept(small, plain, ref):
    big = [(sample_text(80_000, seed=77), False)]
    for _ in range(2):
        assert_same(ref.encode_segments(big), ids_of(small, big), big, "segment over budget")
        assert len(small.segment_cache) == 0 and small.segment_cache.used_bytes == 0


def test_clear_empties_the_cache(small):
    small.encode_segments([(sample_text(1_000, seed=1), False)])
    assert len(small.segment_cache) == 1 and small.segment_cache.used_bytes > 0
    small.segment_cache.clear()
    assert len(small.segment_cache) == 0 and small.segment_cache.used_bytes == 0


def test_budget_zero_disables(plain, ref):
    assert kimi_tok.kimi_k3(segment_cache_bytes=0).segment_cache is None
    segs = [(sample_text(2_000, seed=3), False)]
    assert ids_of(plain, segs) == ids_of(plain, rerender(segs)) == ref.encode_segments(segs)
    assert kimi_tok.kimi_k3().segment_cache.budget_bytes > 0  # the default keeps a cache


@pytest.mark.parametrize("bad", [-1, 1.5, "1MiB"])
def test_bad_budget_is_rejected(bad):
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    with pytest.raises((TypeError, ValueError)):
        kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, segment_cache_bytes=bad)


# --------------------------------------------------------------------------------------------
# Threads
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [BIG_BUDGET, THREAD_BUDGET])
def test_concurrent_turns_equal_sequential(plain, budget):
    """4 threads x shuffled random turns on one cached Tokenizer == the sequential uncached ids."""
    tok = cache_tokenizer(budget)
    tok.segment_cache.clear()
    rng = random.Random(budget)
    prompts, segments = [], []
    for _ in range(16):  # a growing conversation (shared prefixes) ...
        segments = evolve(rng, segments, max_chars=80_000)
        prompts.append((rerender(segments), rng.random() < 0.8))
    for _ in range(4):  # ... and a few unrelated prompts
        prompts.append(([(random_text(rng), rng.random() < 0.3) for _ in range(6)], True))
    expected = [ids_of(plain, segs, safe) for segs, safe in prompts]

    def work(k: int):
        segs, safe = prompts[k]
        if rng_thread.random() < 0.5:
            segs = rerender(segs)
        if k % 3 == 0:
            return k, tok.count_tokens(segs, tiktoken_safe=safe)
        return k, ids_of(tok, segs, safe)

    rng_thread = random.Random(1)  # only decides rerender: races on it change nothing that matters
    with ThreadPoolExecutor(max_workers=4) as pool:
        for round_ in range(3):
            order = list(range(len(prompts))) * 2
            rng.shuffle(order)
            for k, got in pool.map(work, order):
                if isinstance(got, int):
                    assert got == len(expected[k]), f"round {round_} prompt {k}: count_tokens differs"
                else:
                    assert_same(expected[k], got, prompts[k][0], f"round {round_} prompt {k} in threads",
                                prompts[k][1])
            assert tok.segment_cache.used_bytes <= budget
    assert tok.segment_cache.hits > 0


# --------------------------------------------------------------------------------------------
# count_tokens
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["cached", "plain"])
def test_count_tokens_equals_encode_length(which, cached, plain, ref):
    tok = cached if which == "cached" else plain
    rng = random.Random(5)
    texts = ["", "hello world", "<|open|> literal [EOS]", sample_text(5_000, seed=9),
             " " * 25_001 + "x", insert_surrogates(rng, sample_text(400, seed=1))]
    for text in texts:
        for safe in (True, False):
            n = tok.count_tokens(text, tiktoken_safe=safe)
            assert n == len(tok.encode(text, tiktoken_safe=safe)) == len(ref.encode(text, False, safe))
            assert n == tok.count_tokens([(text, False)], tiktoken_safe=safe)
    segs = [("<|open|>", True), ("message", False), ("<|sep|>", True), (texts[3], False), (texts[2], True),
            (texts[2], False), ("", False)]
    for segments in (segs, tuple(segs), [list(s) for s in segs], []):
        for _ in range(2):
            assert tok.count_tokens(segments) == len(tok.encode_segments(segments)) == len(
                ref.encode_segments([tuple(s) for s in segments]))


@pytest.mark.parametrize("which", ["cached", "plain"])
def test_count_tokens_bad_input_names_the_segment(which, cached, plain):
    tok = cached if which == "cached" else plain
    long_ok = (sample_text(1_000, seed=4), False)
    cases = [
        ([long_ok, (b"bytes", False)], "segment 1"),
        ([long_ok, ("x", False), ("y", "yes")], "segment 2"),
        ([("x",)], "segment 0"),
        ([long_ok, None], "segment 1"),
        ([long_ok, ("a", False, True)], "segment 1"),
    ]
    for segments, where in cases:
        with pytest.raises(TypeError, match=where):
            tok.count_tokens(segments)
    for bad in (None, b"bytes", 5, {"text": True}):
        with pytest.raises(TypeError):
            tok.count_tokens(bad)
    with pytest.raises(TypeError):
        tok.count_tokens("text", tiktoken_safe="yes")
    if tok.segment_cache is not None:  # a failed call stored nothing
        assert len(tok.segment_cache) == 0


def test_texts_sharing_a_fingerprint_never_share_ids(ref):
    """Same length, same start/middle/end samples, different elsewhere: each gets its own ids."""
    from kimi_tok.reuse.segment_cache import fingerprint

    tok = cache_tokenizer(1 << 20)
    tok.segment_cache.clear()
    base = "alpha beta gamma delta " * 40
    first = base[:100] + "X" * 50 + base[150:]
    second = base[:100] + "Y" * 50 + base[150:]
    assert fingerprint((first, False, True)) == fingerprint((second, False, True))
    for text in (first, second, first, second):
        segments = [(text, False)]
        assert tok.encode_segments(segments).ids == ref.encode_segments(segments)
        assert tok.count_tokens(segments) == len(ref.encode_segments(segments))


def test_hint_to_an_evicted_run_that_lives_on(cached, plain):
    """A continuation hint may point to a run already evicted but still alive (a concurrent call
    holds it): it is not offered, the call encodes those segments again, ids stay exact."""
    first, second = chat_turn(0, 2_000), chat_turn(1, 2_000)
    cache = cached.segment_cache
    cached.encode_segments(first)
    cached.encode_segments(rerender(first) + second)  # the run of `first` hints at the run of `second`
    cached.encode_segments(rerender(first))  # `first` is now the most recently used
    cache.settle()
    alive = list(cache._runs)  # what a concurrent call's plan would hold
    cache._evict_oldest()  # evicts the run of `second`
    assert len(cache) == len(first) and len(alive) == 2
    both = rerender(first) + rerender(second)
    assert cache.plan(both, True).missing == list(range(len(first), len(both)))
    assert ids_of(cached, both) == ids_of(plain, both)


def test_short_calls_skip_the_cache(ref):
    """With the shipped policy a call of fewer than ``min_cached_call_chars`` characters is encoded
    without the cache (planning would cost more than encoding): nothing looked up, nothing
    stored; a longer one is stored, and its ids come back from the cache."""
    tok = kimi_tok.kimi_k3(segment_cache_bytes=BIG_BUDGET + 1)
    tok.segment_cache.clear()
    limit = tok.policy.min_cached_call_chars
    assert limit == kimi_tok.Policy().min_cached_call_chars > 0
    short = [("<|open|>", True), (sample_text(limit - 100, seed=31), False), ("<|close|>", True)]
    assert tok.encode_segments(short).ids == ref.encode_segments(short)
    assert len(tok.segment_cache) == 0 and tok.segment_cache.hits == tok.segment_cache.misses == 0
    long = short[:1] + [(sample_text(limit + 100, seed=32), False)] + short[2:]
    assert tok.encode_segments(long).ids == ref.encode_segments(long)
    assert len(tok.segment_cache) == 3
    assert tok.encode_segments(rerender(long)).ids == ref.encode_segments(long)
    assert tok.segment_cache.hits == 3
    with pytest.raises(ValueError, match="min_cached_call_chars"):
        kimi_tok.Policy(min_cached_call_chars=-1)


@pytest.mark.parametrize("where", ["one compiled call", "shared parts"])
def test_a_call_returns_before_a_helper_stores_its_segments(ref, monkeypatch, where):
    """A long call's new segments are stored by a helper thread once the call has returned
    (``SegmentCache.store_elsewhere``): the caller may write to its ids at once, readers of the cache
    (the next call, ``len``) wait for the store, and an error in it is raised there, not lost. A call
    that shared parts among threads has the store's copy of its ids gathered again on the helper, from
    the engine's own memory (``Engine.encode_with_regather``); another is copied before it returns."""
    import threading
    import time

    from kimi_tok.engine.parts import SharedParts

    # one job: a call of any length runs as one compiled call
    tok = kimi_tok.kimi_k3(n_jobs=1 if where == "one compiled call" else None, segment_cache_bytes=BIG_BUDGET + 3)
    cache = tok.segment_cache
    cache.clear()
    stored_on: list[int] = []
    gathered_on: list[int] = []
    store = cache.store
    ids_and_bounds = SharedParts.ids_and_bounds

    def slow_store(*args, **kwargs):
        time.sleep(0.05)  # long enough for the caller to write to its ids first
        stored_on.append(threading.get_ident())
        return store(*args, **kwargs)

    def gather(self):
        gathered_on.append(threading.get_ident())
        return ids_and_bounds(self)

    monkeypatch.setattr(cache, "store", slow_store)
    monkeypatch.setattr(SharedParts, "ids_and_bounds", gather)
    n_chars = tok.policy.min_cached_call_chars + 1_000 if where == "one compiled call" else \
        max(tok.policy.min_cached_call_chars, tok.engine.max_fused_bytes()) + 10_000
    segments = chat_turn(0, n_chars)
    ids = tok.encode_segments(segments).into_numpy()["ids"]
    expected = ref.encode_segments(segments)
    assert ids.tolist() == expected
    ids[:] = 0  # the caller's own array: the cache keeps a copy
    assert len(cache) == len(segments)  # waited for the store
    assert stored_on and threading.get_ident() not in stored_on  # made on a helper thread
    if where == "shared parts":  # gathered by the call, then again by the store
        assert len(gathered_on) == 2 and gathered_on[0] == threading.get_ident() != gathered_on[1], gathered_on
    else:
        assert gathered_on == []
    assert tok.encode_segments(rerender(segments)).ids == expected  # every segment from the cache

    def failing_store(*args, **kwargs):
        raise RuntimeError("store failed")

    monkeypatch.setattr(cache, "store", failing_store)
    other = chat_turn(1, tok.policy.min_cached_call_chars + 1_000)
    assert tok.encode_segments(other).ids == ref.encode_segments(other)
    with pytest.raises(RuntimeError, match="store failed"):
        len(cache)
    assert len(cache) == len(segments)  # raised once; the cache holds what it held
    monkeypatch.setattr(cache, "store", store)
    assert tok.encode_segments(rerender(other)).ids == ref.encode_segments(other)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_fork_waits_for_the_stores_a_helper_is_making(ref, monkeypatch):
    """A process forked while a helper stores a call's segments waits for the store first: the child
    inherits the whole run (and no lock held by a thread it does not have) and encodes from it."""
    import time

    tok = kimi_tok.kimi_k3(segment_cache_bytes=BIG_BUDGET + 4)
    cache = tok.segment_cache
    cache.clear()
    store = cache.store

    def slow_store(*args, **kwargs):
        time.sleep(0.2)
        return store(*args, **kwargs)

    monkeypatch.setattr(cache, "store", slow_store)
    segments = chat_turn(2, tok.policy.min_cached_call_chars + 1_000)
    expected = ref.encode_segments(segments)
    assert tok.encode_segments(segments).ids == expected
    assert cache._pending  # still storing
    pid = os.fork()
    if pid == 0:  # the child: no pytest from here on
        ok = False
        try:
            hits = cache.hits
            ok = (len(cache) == len(segments) and tok.encode_segments(rerender(segments)).ids == expected
                  and cache.hits == hits + len(segments))
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert len(cache) == len(segments)


@pytest.mark.parametrize("segments, message", [
    ([("a", False), (5, False)], "segment 1: text must be a str, not int"),
    ([("a",)], "segment 0 must be a .text, allow_special. pair"),
    ([("a", False), None], "segment 1 must be a .text, allow_special. pair, not NoneType"),
    ([("a", "yes")], "segment 0: allow_special must be a bool, not str"),
    ((seg for seg in [("a", False)]), "segments must be a list or tuple"),
])
def test_short_calls_through_the_cache_name_bad_segments(segments, message):
    """Short calls go to the engine before the cache's own validation (``reuse._fewer_chars``): the engine's
    names the same problems."""
    tok = kimi_tok.kimi_k3(segment_cache_bytes=BIG_BUDGET + 1)
    with pytest.raises(TypeError, match=message):
        tok.encode_segments(segments)


def test_stores_still_running_at_exit_are_waited_for(tmp_path):
    """A process that exits right after a long call waits for the store a helper makes of it (none runs while the
    interpreter tears down), and a store that failed does not keep the others from being waited for."""
    import subprocess
    import sys
    import textwrap

    marker = tmp_path / "stored"
    script = textwrap.dedent(f"""
        import threading
        import time
        import kimi_tok
        from kimi_tok.samples import sample_prompt

        def tokenizer(budget):
            return kimi_tok.kimi_k3(policy=kimi_tok.Policy.from_env(segment_cache_bytes=budget, n_jobs=2))

        failing, kept = tokenizer({BIG_BUDGET} + 11), tokenizer({BIG_BUDGET} + 12)
        failing.wait_until_compiled()
        kept.wait_until_compiled()

        def fail(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError("store failed")

        def slow(*args, store=kept.segment_cache.store, **kwargs):
            time.sleep(0.3)
            store(*args, **kwargs)
            open({str(marker)!r}, "w").write(str(len(kept.segment_cache._runs)))

        failing.segment_cache.store = fail
        kept.segment_cache.store = slow
        prompt = sample_prompt(kept.policy.min_cached_call_chars + 10_000, seed=5)
        for seed in range(6, 40):  # until a failing store is pending (a call whose helper is busy stores itself)
            failing.encode_segments(sample_prompt(kept.policy.min_cached_call_chars + 10_000, seed=seed))
            if failing.segment_cache._pending:
                break
        assert failing.segment_cache._pending
        kept.encode_segments(prompt)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == "1"  # the slow store ran to its end before the process exited
