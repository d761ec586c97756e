"""Short calls shared with a helper thread parked in compiled code (``engine.short_calls``).

A short call read in place cuts its text into parts that the caller and the engine's
``ShortCallHelper`` take from one counter. The ids must be the reference's whether the helper
took parts, arrived late (the caller takes the job back), is busy with another caller's call, was
closed, or belongs to a process that forked. The policies here share every call (thresholds of a
byte, parts of 64 bytes) so that the helper's parts cut every kind of text.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time

import pytest

import kimi_tok
from kimi_tok import Policy
from kimi_tok.engine import short_calls
from kimi_tok.native.cpython import LAYOUT
from kimi_tok.native.futex import HAS_FUTEX
from kimi_tok.reuse.warmup import wait_for_background
from kimi_tok.samples import render_chat, sample_prompt, sample_text
from kimi_tok.vocab import KIMI_PATTERN, embedded_kimi_k3
from tests.parity import assert_parity, rerender

pytestmark = pytest.mark.skipif(not HAS_FUTEX or LAYOUT is None,
                                reason="the helper waits on Linux futexes; short calls are read in place")


def sharing_policy(**changes) -> Policy:
    """Every short call shared (a byte is enough), in parts of 64 bytes or more."""
    settings = dict(n_jobs=2, segment_cache_bytes=0, min_shared_short_call_bytes=1, short_call_part_bytes=64,
                    short_call_part_shrink=2)
    settings.update(changes)
    return Policy.from_env(**settings)


def own_tokenizer(policy: Policy) -> kimi_tok.Tokenizer:
    """A Tokenizer of its own, not one of the few that ``kimi_k3`` keeps for the process (the other tests' own)."""
    return kimi_tok.Tokenizer(*embedded_kimi_k3(), KIMI_PATTERN, name="short calls test", policy=policy)


def started(policy: Policy):
    """A Tokenizer of its own with its helper thread started, for a module's tests; the thread stopped after."""
    tok = own_tokenizer(policy)
    helper(tok).start()
    yield tok
    helper(tok).close()


@pytest.fixture(scope="module")
def tok():
    yield from started(sharing_policy())


def helper(tok: kimi_tok.Tokenizer) -> short_calls.ShortCallHelper:
    return tok._compiled()[0].short_call_helper


def calls() -> dict[str, tuple[list[tuple[str, bool]], bool]]:
    chat = render_chat([
        {"role": "system", "content": sample_text(4_000, seed=11)},
        {"role": "user", "content": sample_text(20_000, seed=12) + "<|open|>literal<|close|>"},
        {"role": "assistant", "content": "数字テスト 12345 — ÀÉÎ ß 🙂\n" * 300},
    ])
    return {
        "chat": (chat, True),
        "chat, no cuts": (chat, False),
        "prompt": (sample_prompt(40_000, seed=13), True),
        "25k cuts": ([("a" * 30_001 + " " * 26_000 + "\n" * 3 + "b" * 27_000, False), ("<|close|>", True)], True),
        "one line": ([("word, " * 8_000, False)], True),
        "specials in text": ([(sample_text(6_000, seed=14) + "<|open|><|sep|>", True), ("<|sep|>", False)], True),
        "empty segments": ([("", False), (sample_text(9_000, seed=15), False), ("", True), ("x", False)], True),
        "han and spaces": ([("数字" * 4_000 + "\n  \n" + "テスト " * 2_000, False)], True),
    }


@pytest.mark.parametrize("name", list(calls()))
def test_shared_short_calls_give_the_reference_ids(tok, ref, name):
    segments, tiktoken_safe = calls()[name]
    for _ in range(3):  # the helper may take parts of some calls and not others
        assert_parity(tok, ref, rerender(segments), tiktoken_safe)


def test_parts_of_whole_sub_strings_give_the_reference_ids(ref):
    """Where a special token holds a newline the text is not split after newlines (``splits_after_newline``):
    the parts are whole tiktoken-safe sub-strings."""
    tok = own_tokenizer(sharing_policy())
    engine = tok._compiled()[0]
    engine.short_call_helper = short_calls.ShortCallHelper(engine.stages, tok.policy, splits_after_newline=False)
    engine.short_call_helper.start()
    try:
        for name in ("chat", "25k cuts", "empty segments", "han and spaces"):
            segments, tiktoken_safe = calls()[name]
            for _ in range(3):
                assert_parity(tok, ref, rerender(segments), tiktoken_safe)
    finally:
        engine.short_call_helper.close()


def test_the_helper_takes_parts_of_calls_back_to_back(tok, ref):
    """Calls in a row find the helper awake (it spins a while after each job): it takes parts."""
    segments = sample_prompt(60_000, seed=21)
    expected = ref.encode_segments(segments)
    before = helper(tok).parts_taken
    for _ in range(400):
        assert tok.encode_segments(rerender(segments)).ids == expected
        if helper(tok).parts_taken > before:
            break
    assert helper(tok).parts_taken > before


def failures_of_callers(tok, ref, prompts: list, rounds: int, fresh: bool = False) -> list[str]:
    """Four threads calling ``tok`` at once, each going round ``prompts`` from its own start; the calls whose ids
    were not the reference's. ``fresh``: each call's texts end in its thread and round (none was seen before)."""
    expected = [ref.encode_segments(p) for p in prompts]
    failures: list[str] = []

    def caller(k: int) -> None:
        for r in range(rounds):
            i = (k + r) % len(prompts)
            if fresh:
                segments = [(text + f" {k}-{r}", allow) for text, allow in prompts[i]]
                wanted = ref.encode_segments(segments)
            else:
                segments, wanted = rerender(prompts[i]), expected[i]
            if tok.encode_segments(segments).ids != wanted:
                failures.append(f"thread {k}, round {r}, prompt {i}")

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return failures


def test_callers_on_several_threads_share_one_helper(tok, ref):
    prompts = [sample_prompt(25_000 + 5_000 * k, seed=30 + k) for k in range(4)]
    assert failures_of_callers(tok, ref, prompts, rounds=12) == []


# Run in a process of its own whose allocator unmaps every block of 16 kB or more when it is freed: a helper that
# reads an array the caller already freed then faults rather than reading whatever the memory holds next.
LATE_HELPER = """
import ctypes, sys, threading, time
import numba
import kimi_tok
from kimi_tok import Policy
from kimi_tok.engine import short_calls as sc
from kimi_tok.native import atomics, futex
from kimi_tok.samples import sample_text
from kimi_tok.vocab import KIMI_PATTERN, embedded_kimi_k3

@numba.njit
def take(words, state, new):  # the helper's POSTED -> RUNNING (a caller that has taken every part takes it back)
    return atomics.compare_exchange(words, sc.STATE, state, new)

def tokenizer(**changes):
    return kimi_tok.Tokenizer(*embedded_kimi_k3(), KIMI_PATTERN, name="late helper", policy=Policy.from_env(**changes))

tok = tokenizer(n_jobs=2, segment_cache_bytes=0, min_shared_short_call_bytes=1, short_call_part_bytes=64,
                short_call_part_shrink=2)
alone = tokenizer(n_jobs=1, segment_cache_bytes=0)
engine = tok._compiled()[0]
helper = engine.short_call_helper = sc.ShortCallHelper(engine.stages, tok.policy, engine.splits_after_newline)
words, job = helper.words, helper.job
words[sc.STATE] = sc.IDLE  # as start() leaves it, without a thread: this one is the helper
deadline = time.monotonic() + 600
for attempt in range(40):  # until this thread takes a job before its caller has encoded every part
    text = sample_text(120_000, seed=5 + attempt)
    expected = alone.encode(text).ids
    got = {}
    if sys.argv[1] == "short call":
        caller = threading.Thread(target=lambda: got.update(ids=tok.encode(text).ids))
    else:  # as the segment cache's fresh calls: the ids, each segment's bounds and the ids gathered again
        def in_place():
            ids, bounds, regather = engine.shared_in_place_ids([(text, False)], True)
            got.update(ids=ids.tolist(), bounds=bounds.tolist(), again=regather().tolist())
        caller = threading.Thread(target=in_place)
    caller.start()
    state = int(words[sc.STATE])
    while state & sc.PHASE_MASK != sc.POSTED and caller.is_alive():
        assert time.monotonic() < deadline, "no job was posted"
        state = int(words[sc.STATE])
    number = state >> sc.PHASE_BITS
    if state & sc.PHASE_MASK != sc.POSTED or not take(words, state, number << sc.PHASE_BITS | sc.RUNNING):
        caller.join()  # it ran alone or took its job back
        assert got["ids"] == expected
        continue
    while words[sc.DONE_SLEEPER] != 1:  # the caller has encoded every part and waits for this thread
        assert time.monotonic() < deadline, "the caller did not wait for the helper"
    n_subs, n_parts = int(job[sc.N_SUBS]), int(job[sc.N_PART_FIRST]) - 1
    for field, n_bytes in ((sc.BUF, job[sc.N_BUF]), (sc.SUB_START, 8 * n_subs), (sc.SUB_END, 8 * n_subs),
                           (sc.SUB_ALLOW, n_subs), (sc.PART_FIRST, 8 * (n_parts + 1)), (sc.COUNTERS, 16),
                           (sc.OUT, 4 * job[sc.N_BUF]), (sc.PART_N_IDS, 8 * n_parts), (sc.SUB_N_IDS, 8 * n_subs)):
        ctypes.string_at(int(job[field]), int(n_bytes))  # what a helper still on a part reads or writes
    assert ctypes.string_at(int(job[sc.BUF]), int(job[sc.N_BUF])) == text.encode()
    words[sc.STATE] = number << sc.PHASE_BITS | sc.IDLE
    futex.set_and_wake(words, sc.DONE, number, sc.DONE_SLEEPER, futex.SYS_FUTEX)
    caller.join()
    assert got["ids"] == expected
    assert sys.argv[1] == "short call" or (got["again"] == expected and got["bounds"] == [0, len(expected)])
    print("arrays alive")
    break
"""


@pytest.mark.parametrize("call", ["short call", "fresh call of the segment cache"])
def test_a_caller_keeps_its_job_arrays_until_the_helper_is_done(call):
    """A caller that has encoded every part while the helper is still on one waits with every array the job
    points into alive: numba frees an array after its last use in a function, which was the caller's own parts
    (the helper then read text from freed memory: wrong ids under concurrent callers, or a fault)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(16 << 10))
    result = subprocess.run([sys.executable, "-c", LATE_HELPER, call], env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0 and "arrays alive" in result.stdout, result.stderr[-3000:]


def test_a_long_call_starts_the_helper_and_a_short_one_does_not(ref):
    tok = own_tokenizer(Policy.from_env(n_jobs=2, segment_cache_bytes=0))
    threshold = tok.policy.min_shared_short_call_bytes
    small = sample_prompt(2_000, seed=41)
    assert_parity(tok, ref, small)
    time.sleep(0.2)
    assert not helper(tok).running
    long = sample_prompt(2 * threshold, seed=42)
    assert_parity(tok, ref, long)
    deadline = time.monotonic() + 30
    while not helper(tok).running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert helper(tok).running
    assert_parity(tok, ref, rerender(long))
    helper(tok).close()


def test_the_helper_makes_a_piece_cache_of_its_own(ref):
    """A starting helper leaves the free piece caches to calls: the long call that starts it may be fanning
    out, and a thread of that call that finds no free cache makes one in the call."""
    tok = own_tokenizer(sharing_policy())
    assert_parity(tok, ref, [("a call that leaves its piece cache free", False)])
    wait_for_background()
    pool = tok.engine.stages.piece_caches
    free = pool.kept()
    assert free
    helper(tok).start()
    try:
        assert [id(c) for c in pool.kept()] == [id(c) for c in free]  # none taken
        assert_parity(tok, ref, calls()["prompt"][0])
    finally:
        before = len(pool.kept())
        helper(tok).close()
    assert len(pool.kept()) == min(before + 1, pool._keep)  # the helper's, given back when it stopped


@pytest.mark.parametrize("changes", [dict(n_jobs=1), dict(parked_helpers=False), dict(hash_routing=True),
                                     dict(backend="processes")])
def test_no_helper_where_calls_cannot_share(changes, ref):
    tok = own_tokenizer(sharing_policy(**changes))
    assert helper(tok) is None
    assert_parity(tok, ref, calls()["chat"][0])


def test_no_helper_for_other_patterns():
    tok = kimi_tok.Tokenizer(*embedded_kimi_k3(), r"\S+|\s+", name="pcre2", policy=sharing_policy())
    assert helper(tok) is None


def test_a_closed_helper_stops_its_thread_and_calls_run_alone(ref):
    tok = own_tokenizer(sharing_policy())
    helper(tok).start()
    thread = helper(tok)._thread
    segments = calls()["prompt"][0]
    assert_parity(tok, ref, segments)
    helper(tok).close()
    assert not thread.is_alive()
    taken = helper(tok).parts_taken
    for _ in range(3):
        assert_parity(tok, ref, rerender(segments))
    time.sleep(0.1)
    assert not helper(tok).running and helper(tok).parts_taken == taken  # not started again


def test_a_dropped_helper_stops_its_thread(ref):
    tok = own_tokenizer(sharing_policy())
    helper(tok).start()
    thread = helper(tok)._thread
    assert_parity(tok, ref, calls()["prompt"][0])
    del tok
    gc.collect()
    thread.join(timeout=10)
    assert not thread.is_alive()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_starts_a_helper_of_its_own(tok, ref):
    segments = calls()["prompt"][0]
    expected = ref.encode_segments(segments)
    assert tok.encode_segments(segments).ids == expected
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not here
        code = 1
        try:
            ok = all(tok.encode_segments(rerender(segments)).ids == expected for _ in range(3))
            deadline = time.monotonic() + 30
            while not helper(tok).running and time.monotonic() < deadline:
                time.sleep(0.01)
            ok = ok and helper(tok).running and tok.encode_segments(rerender(segments)).ids == expected
            code = 0 if ok else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert helper(tok).running and tok.encode_segments(rerender(segments)).ids == expected


# -- the segment cache's fresh calls, read in place and shared (Engine.shared_in_place_ids) -------------------


def cached_sharing_policy(**changes) -> Policy:
    """Calls from 1,000 characters on go through the segment cache, and its new segments are read in place and
    shared with the helper (parts of 64 bytes or more)."""
    settings = dict(segment_cache_bytes=64 << 20, min_cached_call_chars=1_000, max_joined_call_chars=1_000,
                    max_shared_in_place_chars=1 << 20)
    settings.update(changes)
    return sharing_policy(**settings)


@pytest.fixture(scope="module")
def cached_tok():
    yield from started(cached_sharing_policy())


def watch_shared_in_place(tok, monkeypatch) -> list:
    """Each result of the engine's ``shared_in_place_ids`` (None: declined), appended as calls make them."""
    engine = tok._compiled()[0]
    results = []
    original = engine.shared_in_place_ids

    def watched(segments, tiktoken_safe):
        result = original(segments, tiktoken_safe)
        results.append(result)
        return result

    monkeypatch.setattr(engine, "shared_in_place_ids", watched)
    return results


@pytest.mark.parametrize("name", list(calls()))
def test_fresh_cached_calls_read_in_place_give_the_reference_ids(cached_tok, ref, name, monkeypatch):
    segments, tiktoken_safe = calls()[name]
    results = watch_shared_in_place(cached_tok, monkeypatch)
    for _ in range(2):  # the second time from the cache: the stored bounds put each segment's ids back
        assert_parity(cached_tok, ref, rerender(segments), tiktoken_safe)
    assert results and results[0] is not None  # the helper was idle: the call was shared
    # each segment alone from the cache, in another order: every stored bound is right
    shuffled = rerender(segments[::-1])
    assert_parity(cached_tok, ref, shuffled, tiktoken_safe)


def test_edited_calls_share_only_their_new_segments(cached_tok, ref, monkeypatch):
    segments = sample_prompt(30_000, seed=51)
    assert_parity(cached_tok, ref, segments)
    results = watch_shared_in_place(cached_tok, monkeypatch)
    edited = rerender(segments)
    longest = max(range(len(edited)), key=lambda i: len(edited[i][0]))
    edited[longest] = (edited[longest][0][::-1], edited[longest][1])
    edited.append((sample_text(5_000, seed=52), False))
    assert_parity(cached_tok, ref, edited)
    shared = [result for result in results if result is not None]
    assert shared and all(len(bounds) == 3 for _, bounds, _ in shared)  # the two new segments, nothing else


def test_the_kernel_gives_bounds_and_a_copy_that_gathers_again(cached_tok):
    engine = cached_tok._compiled()[0]
    for name, (segments, tiktoken_safe) in calls().items():
        result = engine.shared_in_place_ids(rerender(segments), tiktoken_safe)
        assert result is not None, name
        ids, bounds, regather = result
        expected_ids, expected_bounds = engine.encode_with_bounds(segments, tiktoken_safe)
        assert ids.tolist() == expected_ids.tolist() and bounds.tolist() == expected_bounds.tolist(), name
        ids[:] = 0  # what the caller does with its ids does not reach the copy the cache stores
        again = regather()
        assert again is not ids and again.tolist() == expected_ids.tolist(), name


def test_fresh_cached_calls_go_packed_where_the_helper_cannot_take_part(ref, monkeypatch):
    """No thread yet (it starts after the first such call), or closed: declined before reading, packed instead."""
    tok = own_tokenizer(cached_sharing_policy())
    results = watch_shared_in_place(tok, monkeypatch)
    segments = sample_prompt(30_000, seed=61)
    assert_parity(tok, ref, segments)
    assert results == [None]  # the helper had not started: this call started it
    deadline = time.monotonic() + 30
    while not helper(tok).running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert helper(tok).running
    assert_parity(tok, ref, sample_prompt(30_000, seed=62))
    assert results[-1] is not None
    helper(tok).close()
    assert_parity(tok, ref, sample_prompt(30_000, seed=63))
    assert results[-1] is None


def test_fresh_cached_calls_longer_than_the_limit_go_packed(ref, monkeypatch):
    tok = own_tokenizer(cached_sharing_policy(max_shared_in_place_chars=10_000))
    helper(tok).start()
    results = watch_shared_in_place(tok, monkeypatch)
    assert_parity(tok, ref, sample_prompt(30_000, seed=71))
    assert results == []
    helper(tok).close()


def test_fresh_cached_calls_from_callers_on_several_threads(cached_tok, ref):
    prompts = [sample_prompt(20_000 + 4_000 * k, seed=80 + k) for k in range(4)]
    assert failures_of_callers(cached_tok, ref, prompts, rounds=8, fresh=True) == []


@pytest.mark.parametrize("name", ["min_shared_short_call_bytes", "short_call_part_bytes", "short_call_part_shrink",
                                  "max_shared_in_place_chars"])
def test_policy_checks_the_sharing_settings(name):
    with pytest.raises(ValueError, match=name):
        Policy(**{name: -1})
