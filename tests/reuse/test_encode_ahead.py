"""Encoding an agent loop's new segments ahead of the plan (``reuse.EncodeAhead``) is exact.

A call that extends a recent one has its segments after where that call ended encoded on
this thread (in parts that the helper takes too once done) while a helper thread validates, plans
and verifies the call. The guess can be
wrong in every way (segments before the guess are missing too, segments after it are
cached after all, an offered text differs at the same length, a segment is invalid): the
ids must still equal the uncached tokenizer's and the tiktoken reference's. Most tests pass a
policy with lower size thresholds so that small prompts take the path; one runs at the real ones.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import kimi_tok
from kimi_tok import Policy
from kimi_tok.engine.parts import SharedParts
from kimi_tok.native.futex import NO_SIGNAL, SYS_FUTEX
from kimi_tok.pipeline import bpe
from kimi_tok.reuse import encode_ahead as reuse, parking
from kimi_tok.reuse.encode_ahead import EncodeAhead
from kimi_tok.samples import sample_text
from kimi_tok.reuse.warmup import wait_for_background
from tests.conftest import k3_tokenizer
from tests.parity import describe_mismatch, rerender, short_repr

BUDGET = 64 << 20
DEFAULTS = Policy()
MIN_REUSED_IDS = DEFAULTS.min_reused_ids
LOW = {"min_ahead_plan_chars": 1_000, "min_ahead_chars": 100}  # small prompts encode ahead in one call
SHARED_LOW = {**LOW, "shared_part_bytes": 64, "min_shared_bytes": 256}  # ... or in parts of 64 bytes


def cached_tokenizer(**settings) -> kimi_tok.Tokenizer:
    """A two-job Tokenizer with a segment cache (emptied) whose policy has ``settings``."""
    tok = k3_tokenizer(Policy.from_env(n_jobs=2, segment_cache_bytes=BUDGET, min_cached_call_chars=0).replace(**settings))
    tok.segment_cache.clear()
    return tok


@pytest.fixture(scope="module")
def plain() -> kimi_tok.Tokenizer:
    return kimi_tok.kimi_k3(segment_cache_bytes=0)


@pytest.fixture()
def cached(request) -> kimi_tok.Tokenizer:
    """``cached_tokenizer`` with the settings of the ``low_thresholds`` and ``helpers`` fixtures
    when the test uses them, else the shipped thresholds."""
    settings = {}
    for name in ("low_thresholds", "helpers"):
        if name in request.fixturenames:
            settings.update(request.getfixturevalue(name))
    tok = cached_tokenizer(**settings)
    wait_for_background()  # its warm-up's agent-loop probe encodes ahead too: not a call of the test
    return tok


@pytest.fixture(params=["one call", "shared parts"])
def low_thresholds(request) -> dict:
    """Small prompts encode ahead: in one compiled call, or in parts of 64 bytes that the helper
    takes too once it has planned (``SharedParts``)."""
    return LOW if request.param == "one call" else SHARED_LOW


@pytest.fixture()
def ahead_calls(monkeypatch) -> list[int]:
    """Records ``first`` of every call that encoded ahead."""
    calls: list[int] = []
    run = EncodeAhead.run

    def spy(self, *args, **kwargs):
        calls.append(self.first)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(EncodeAhead, "run", spy)
    return calls


def chat_turn(turn: int, n_chars: int) -> list:
    """A K3-style turn: template segments around a tool output (as bench.agent_loop renders)."""
    return [("<|open|>", True), ("message", False), (' role="tool"', False), ("<|sep|>", True),
            (sample_text(n_chars, seed=9_000 + turn), False), ("<|close|>", True), ("message", False)]


def check(tok, plain, ref, segments, what: str) -> list[int]:
    got = tok.encode_segments(segments).ids
    expected = plain.encode_segments(segments).ids
    if got != expected:
        raise AssertionError(describe_mismatch(expected, got, f"{what}: {short_repr(segments)}"))
    assert got == ref.encode_segments(segments), what
    return got


@pytest.fixture(params=["default helpers", "executor helpers"])
def helpers(request) -> dict:
    """The helpers a platform has (parked in compiled code on Linux), and the executor ones used
    where there are no futexes (or with KIMI_TOK_PARKED_HELPERS=0)."""
    return {} if request.param == "default helpers" else {"parked_helpers": False, "helpers": 1}


def test_agent_loop_turns_encode_ahead(cached, plain, ref, low_thresholds, ahead_calls, helpers):
    segments: list = []
    for turn in range(6):
        new = chat_turn(turn, 1_500 + 400 * turn)
        segments = rerender(segments) + new
        check(cached, plain, ref, segments, f"turn {turn}")
        if turn:
            assert ahead_calls[-1] == len(segments) - len(new), "the new turn was not encoded ahead"
    assert len(ahead_calls) == 5
    assert cached.segment_cache.plan(rerender(segments), True).missing == []


def test_the_helper_takes_the_parts_left_once_planned(plain, ref, monkeypatch):
    """The caller holds back until the helper has planned, joined and taken its parts, so the helper
    encodes parts (whichever thread is faster); ids and stored segments are exact."""
    cached = cached_tokenizer(**SHARED_LOW)
    joined = threading.Event()
    helper_done = threading.Event()
    taken: dict[str, int] = {}
    work = SharedParts.work

    def spy(self, piece_cache, entered=NO_SIGNAL):
        if threading.current_thread() is threading.main_thread():
            parking.signal_go_from_python(entered, SYS_FUTEX)  # a parked helper plans only after this
            assert joined.wait(10), "the helper never joined"
            assert helper_done.wait(10), "the helper never finished its parts"
            taken[threading.current_thread().name] = n = work(self, piece_cache, entered)
            return n
        joined.set()
        taken[threading.current_thread().name] = n = work(self, piece_cache, entered)
        helper_done.set()
        return n

    monkeypatch.setattr(SharedParts, "work", spy)
    segments = chat_turn(0, 3_000)
    cached.encode_segments(segments)
    cached.engine.stages.piece_caches.add_spare()  # a free piece cache for the helper
    longer = rerender(segments) + chat_turn(1, 3_000)
    check(cached, plain, ref, longer, "helper took parts")
    helper_parts = sum(n for name, n in taken.items() if name != threading.main_thread().name)
    assert helper_parts > 0, taken
    assert cached.segment_cache.plan(rerender(longer), True).missing == []


def test_a_helper_without_a_free_piece_cache_leaves_the_parts_and_a_spare_is_made(plain, ref, monkeypatch):
    """Making a piece cache costs more than a helper's share of a turn: it does not join then,
    and a spare cache is made after the call, off its critical path."""
    cached = cached_tokenizer(**SHARED_LOW)
    pool = bpe.PieceCachePool(lambda: bpe.new_piece_cache(cached.engine.stages.tables.short_slots), keep=4)
    monkeypatch.setattr(cached.engine.stages, "piece_caches", pool)  # tokenizers may be shared: a pool of its own
    segments = chat_turn(0, 3_000)
    cached.encode_segments(segments)
    assert len(pool.kept()) == 1
    joined: list[int] = []
    work = SharedParts.work

    def spy(self, piece_cache, entered=NO_SIGNAL):
        n = work(self, piece_cache, entered)
        if threading.current_thread() is not threading.main_thread():
            joined.append(n)
        return n

    monkeypatch.setattr(SharedParts, "work", spy)
    longer = rerender(segments) + chat_turn(1, 3_000)
    check(cached, plain, ref, longer, "no cache for the helper")
    assert joined == []
    for _ in range(1000):  # made by the helper after the call
        if len(pool.kept()) == 2:
            break
        threading.Event().wait(0.005)
    assert len(pool.kept()) == 2


def test_count_tokens_encodes_ahead_too(cached, plain, low_thresholds, ahead_calls):
    segments = chat_turn(0, 3_000)
    cached.encode_segments(segments)
    longer = rerender(segments) + chat_turn(1, 2_000)
    assert cached.count_tokens(longer) == len(plain.encode_segments(longer))
    assert ahead_calls == [len(segments)]
    assert cached.segment_cache.plan(rerender(longer), True).missing == []  # stored by the count


def test_a_call_sent_again_is_not_encoded_ahead(cached, plain, low_thresholds, ahead_calls):
    segments = chat_turn(0, 3_000) + chat_turn(1, 3_000)
    cached.encode_segments(segments[:7])
    cached.encode_segments(segments)
    assert ahead_calls == [7]
    for _ in range(2):  # the same call again (and a count of it): nothing is new
        assert cached.encode_segments(rerender(segments)).ids == plain.encode_segments(segments).ids
        assert cached.count_tokens(rerender(segments)) == len(plain.encode_segments(segments))
    assert ahead_calls == [7]


def test_edit_before_the_new_segments_is_encoded_too(cached, plain, ref, low_thresholds, ahead_calls):
    """The guess is right about the new segments, but an earlier one changed: once at the same
    length (offered, rejected by verify) and once at another length."""
    segments = chat_turn(0, 2_500) + chat_turn(1, 2_500)
    cached.encode_segments(segments)
    text = segments[4][0]
    for k, edited_text in enumerate((text[:100] + "#" + text[101:], text + "!")):
        edited = rerender(segments)
        edited[4] = (edited_text, False)
        edited += chat_turn(2 + k, 1_000)
        check(cached, plain, ref, edited, f"edit {k}")
        assert ahead_calls[-1] == len(segments)
        segments = edited


def test_wrong_guess_encodes_what_the_plan_misses(cached, plain, ref):
    """``EncodeAhead`` run by hand with a guess that is wrong both ways: the segments after it
    are cached, the ones before it are not."""
    head, tail = chat_turn(0, 2_000), chat_turn(1, 2_000)
    cached.encode_segments(tail)
    segments = rerender(head + tail)
    first = len(head) + 2
    result = EncodeAhead(first, segments[first:]).run(cached._reuse, segments, True, want_ids=True)
    assert result.ids.tolist() == plain.encode_segments(segments).ids == ref.encode_segments(segments)
    assert result.n_ids == len(result.ids)


def test_bad_segment_in_the_prefix_names_it(cached, low_thresholds, ahead_calls):
    segments = chat_turn(0, 3_000)
    cached.encode_segments(segments)
    bad = rerender(segments) + chat_turn(1, 2_000)
    bad[2] = (b" role", False)
    with pytest.raises(TypeError, match="segment 2: text must be a str"):
        cached.encode_segments(bad)
    assert ahead_calls == [len(segments)]  # the new segments were valid: they went ahead
    bad[2] = (" role", 1)
    with pytest.raises(TypeError, match="segment 2: allow_special must be a bool"):
        cached.count_tokens(bad)


def test_returned_ids_are_the_callers(cached, plain, low_thresholds, ahead_calls):
    segments = chat_turn(0, 3_000)
    cached.encode_segments(segments)
    longer = rerender(segments) + chat_turn(1, 2_000)
    ids = cached.encode_to_numpy(longer)
    assert ahead_calls and ids.flags.writeable and ids.flags.owndata
    ids[:] = 0  # must not reach the cache
    assert cached.encode_segments(rerender(longer)).ids == plain.encode_segments(longer).ids


def test_concurrent_agent_loops_share_one_tokenizer(cached, plain, low_thresholds, helpers):
    """Four conversations on four threads, turns interleaved: guesses come from each other's calls."""

    def conversation(k: int) -> list[list[int]]:
        segments: list = []
        out = []
        for turn in range(5):
            segments = rerender(segments) + chat_turn(100 * k + turn, 1_200 + 300 * turn)
            out.append(cached.encode_segments(segments).ids)
        return out

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(conversation, range(4)))
    for k, got in enumerate(results):
        segments: list = []
        for turn in range(5):
            segments = segments + chat_turn(100 * k + turn, 1_200 + 300 * turn)
            assert got[turn] == plain.encode_segments(segments).ids, (k, turn)


@pytest.mark.parametrize("new_chars", [8_000, 60_000])  # one compiled call; shared parts (>= 32 KB)
def test_real_thresholds(cached, plain, ref, ahead_calls, new_chars):
    """A turn after a ~300k-character prompt takes the path with the shipped thresholds."""
    segments = chat_turn(0, 300_000)
    cached.encode_segments(segments)
    longer = rerender(segments) + chat_turn(1, new_chars)
    got = check(cached, plain, ref, longer, "real thresholds")
    assert ahead_calls == [len(segments)]
    assert np.array_equal(cached.encode_to_numpy(rerender(longer)), np.array(got, dtype=np.uint32))


def test_one_job_never_uses_a_helper_thread(plain, low_thresholds, ahead_calls):
    tok = cached_tokenizer(n_jobs=1, **low_thresholds)
    segments = chat_turn(0, 3_000)
    tok.encode_segments(segments)
    before = threading.active_count()
    longer = rerender(segments) + chat_turn(1, 2_000)
    assert tok.encode_segments(longer).ids == plain.encode_segments(longer).ids
    assert ahead_calls == [] and threading.active_count() == before


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_starts_its_own_threads(cached, plain, low_thresholds):
    """A child forked after the parent used the helper and fan-out pools has none of their
    threads: its calls must start new ones, not wait forever for the parent's."""
    segments = chat_turn(0, 3_000)
    cached.encode_segments(segments)
    longer = rerender(segments) + chat_turn(1, 2_000)
    cached.encode_segments(longer)  # the helper pool has a thread now
    big = [(sample_text(700_000, seed=77), False)]
    cached.encode_segments(big)  # and the fan-out pool
    expected = (plain.encode_segments(longer + chat_turn(2, 2_000)).ids, plain.encode_segments(big).ids)
    pid = os.fork()
    if pid == 0:  # the child: any failure or hang ends in a non-zero exit status
        status = 1
        try:
            signal.alarm(60)
            got = (cached.encode_segments(rerender(longer) + chat_turn(2, 2_000)).ids,
                   kimi_tok.kimi_k3(n_jobs=2, segment_cache_bytes=0).encode_segments(big).ids)
            status = 0 if got == expected else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"


def test_busy_helpers_mean_planning_inline(cached, plain, ref, low_thresholds, ahead_calls, monkeypatch):
    """When every helper is busy (other callers), a call plans on its own thread: never queued."""
    monkeypatch.setattr(cached._reuse.helpers, "submit", lambda fn: None)
    monkeypatch.setattr(cached._reuse.helpers, "post", lambda fn, copy: None)
    segments = chat_turn(0, 3_000)
    cached.encode_segments(segments)
    longer = rerender(segments) + chat_turn(1, 2_000)
    check(cached, plain, ref, longer, "helpers busy")
    assert ahead_calls == [len(segments)]
    assert cached.count_tokens(rerender(longer) + chat_turn(2, 500)) == len(
        plain.encode_segments(longer + chat_turn(2, 500)).ids)


def test_helper_threads_are_never_queued():
    helpers = reuse.HelperThreads(1, parked=False)
    gate = threading.Event()
    first = helpers.submit(gate.wait)
    assert first is not None
    assert helpers.submit(lambda: 1) is None  # the only helper is busy
    gate.set()
    first.result()
    second = None
    for _ in range(1000):  # the helper frees itself as its job ends
        second = helpers.submit(lambda: 2)
        if second is not None:
            break
        threading.Event().wait(0.001)
    assert second is not None and second.result() == 2


def test_segments_as_lists_from_json_are_encoded_ahead(cached, plain, ref, low_thresholds, ahead_calls):
    """Serving stacks decode prompts from JSON: segments arrive as [text, flag] lists."""
    segments = [list(segment) for segment in chat_turn(0, 3_000)]
    cached.encode_segments(segments)
    longer = [list(segment) for segment in rerender(segments) + chat_turn(1, 2_000)]
    check(cached, plain, ref, longer, "lists")
    assert ahead_calls == [len(segments)]


def test_output_memory_is_reused_only_once_let_go(plain, low_thresholds):
    """A long turn's output memory serves the next turn only when nothing references it any more:
    an output (or a view of it) the caller still holds is never written to."""
    # these short turns grow by a third each
    cached = cached_tokenizer(min_reused_ids=1_000, output_headroom=3.0, **low_thresholds)
    segments = chat_turn(0, 6_000)
    cached.encode_segments(segments)
    turns = [rerender(segments) + chat_turn(1, 2_000)]
    turns.append(rerender(turns[-1]) + chat_turn(2, 2_000))
    turns.append(rerender(turns[-1]) + chat_turn(3, 2_000))
    turns.append(rerender(turns[-1]) + chat_turn(4, 2_000))
    held = cached.encode_to_numpy(turns[0])
    snapshot = held.copy()
    view = cached.encode_to_numpy(turns[1])[5:]  # a view keeps its array's memory alive too
    view_snapshot = view.copy()
    third = cached.encode_to_numpy(turns[2])
    assert np.array_equal(held, snapshot) and np.array_equal(view, view_snapshot)
    third_block = weakref.ref(third.base)
    del third  # let go: the next turn reuses its memory (a view of the same block)
    fourth = cached.encode_to_numpy(turns[3])
    assert fourth.base is third_block() and fourth.flags.writeable
    assert not np.shares_memory(fourth, held) and not np.shares_memory(fourth, view)
    assert fourth.tolist() == plain.encode_segments(turns[3]).ids
    assert np.array_equal(held, snapshot) and np.array_equal(view, view_snapshot)
    assert held.tolist() == plain.encode_segments(turns[0]).ids


def test_output_memory_unit():
    memory = reuse.OutputMemory(MIN_REUSED_IDS, DEFAULTS.output_headroom)
    first = memory.take(MIN_REUSED_IDS)
    block = weakref.ref(first.base)
    assert block().shape[0] >= MIN_REUSED_IDS and first.shape == (MIN_REUSED_IDS,)
    memory.keep(first)
    del first
    again = memory.take(MIN_REUSED_IDS + 10)  # within the headroom: the same block
    assert again.base is block() and again.shape == (MIN_REUSED_IDS + 10,)
    memory.keep(again)
    other = memory.take(100)  # ``again`` is still held here: its block is never handed out twice
    assert not np.shares_memory(other, again) and again.shape == (MIN_REUSED_IDS + 10,)
    held = again[:5]
    memory.keep(again)
    del again
    assert not np.shares_memory(memory.take(100), held)  # a view alone keeps the block too
    memory.keep(held)
    del held
    size = block().shape[0]
    bigger = memory.take(size + 1)  # outgrown: a new, larger block
    assert bigger.base.shape[0] > size and block() is None  # the old one is freed
    block = weakref.ref(bigger.base)
    memory.keep(bigger)
    del bigger
    short = memory.take(10)  # short outputs are arrays of their own (they fault in quickly)
    assert short.base is None and short.flags.owndata
    assert memory.take(MIN_REUSED_IDS).base is block()  # and leave the kept block kept


@pytest.mark.skipif(reuse.new_memory(4096) is None, reason="no private anonymous mappings on this platform")
def test_outgrown_output_memory_grows_in_place():
    """A free block too small for the next turn is the same mapping resized: what the earlier
    turns wrote moves along (no copy, no page faulted in again)."""
    memory = reuse.OutputMemory(MIN_REUSED_IDS, DEFAULTS.output_headroom)
    first = memory.take(MIN_REUSED_IDS)
    mapping = first.base.base.obj
    first[:] = np.arange(first.shape[0], dtype=np.uint32)
    capacity = first.base.shape[0] + 1
    memory.keep(first)
    del first
    grown = memory.take(capacity)
    assert grown.base.base.obj is mapping and grown.base.shape[0] >= capacity
    assert np.array_equal(grown[:MIN_REUSED_IDS], np.arange(MIN_REUSED_IDS))
    memory.keep(grown)
    held = grown[:3]
    del grown
    again = memory.take(capacity * 2)  # ``held`` keeps the block: a new mapping, the old one untouched
    assert again.base.base.obj is not mapping and held.tolist() == [0, 1, 2]


def test_fault_in_writes_one_id_per_page_of_the_view_only():
    """The helper faults in the pages the caller will write the new ids to: one write per page,
    nothing outside the view."""
    block = np.full(8 * 4096, 7, dtype=np.uint32)
    view = block[1000:20_000]
    reuse.fault_in(view)
    per_page = mmap.PAGESIZE // 4
    written = np.flatnonzero(block != 7)
    assert written.tolist() == list(range(1000, 20_000, per_page))
    assert np.diff(written).max() <= per_page  # every page of the view


@pytest.mark.skipif(reuse.SCHED_GETCPU is None or len(os.sched_getaffinity(0)) < 2,
                    reason="needs sched_getcpu, sched_setaffinity and two cores")
def test_a_single_helper_is_woken_off_the_callers_core():
    helpers = reuse.HelperThreads(1, parked=False)
    assert helpers.submit(lambda: 0).result() == 0  # learns the helper's thread id
    thread_id = helpers._helper_thread_id
    before = os.sched_getaffinity(thread_id)
    for _ in range(1000):  # the helper releases itself just after its job
        job = helpers.submit(lambda: reuse.SCHED_GETCPU())
        if job is not None:
            break
        threading.Event().wait(0.001)
    ran_on = job.result()
    after = os.sched_getaffinity(thread_id)
    assert thread_id is not None and after and after < before and ran_on in after


def test_helper_threads_stop_steering_a_thread_they_cannot_steer():
    helpers = reuse.HelperThreads(1, parked=False)
    helpers._helper_thread_id = 2 ** 31 - 1  # no such thread
    if reuse.SCHED_GETCPU is not None:
        helpers._off_the_callers_core(helpers._helper_thread_id)
        assert helpers._helper_thread_id is None
    assert helpers.submit(lambda: 5).result() == 5


def test_parked_helpers_can_be_turned_off_from_the_environment():
    """``KIMI_TOK_PARKED_HELPERS=0``: executor helpers, and a turn still encoded ahead, exactly."""
    code = (
        "import kimi_tok\n"
        "policy = kimi_tok.Policy.from_env(n_jobs=2).replace(min_ahead_plan_chars=1_000, min_ahead_chars=100,\n"
        "                                                    min_cached_call_chars=0)\n"
        "tok, plain = kimi_tok.kimi_k3(policy=policy), kimi_tok.kimi_k3(segment_cache_bytes=0)\n"
        "assert not tok.policy.parked_helpers and not tok._reuse.helpers.parked\n"
        "first = [('x ' * 800, False), ('<|sep|>', True)]\n"
        "tok.encode_segments(first)\n"
        "longer = [((t + ' ')[:-1], a) for t, a in first] + [('the next turn ' * 50, False)]\n"
        "assert tok.encode_segments(longer).ids == plain.encode_segments(longer).ids\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "KIMI_TOK_PARKED_HELPERS": "0"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr
