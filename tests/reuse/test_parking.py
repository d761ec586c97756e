"""Helper threads parked in compiled code (``parking.ParkedHelper``) and the copy they do ahead.

A parked helper is woken by ``post``: it copies the job's arrays into the destination without
the GIL, then runs the posted function only once the caller has signalled GO (from compiled
code, or ``release``); ``result`` waits for it. The segment cache remembers each call's layout
(``RecentCall``) so that the next turn's cached ids can be copied before the plan confirms them:
the ids must be exact whether the copy was used, rejected (an edit) or skipped (helper busy).
"""

from __future__ import annotations

import threading
import time

import numba
import numpy as np
import pytest

import kimi_tok
from kimi_tok import Policy
from kimi_tok.native import futex
from kimi_tok.native.futex import SYS_FUTEX
from kimi_tok.reuse import encode_ahead as reuse, parking
from kimi_tok.samples import sample_text
from tests.parity import rerender

pytestmark = pytest.mark.skipif(not parking.PARKING, reason="parked helpers need Linux futexes")


def copy_job(sources: list[np.ndarray], destination: np.ndarray, fault_from: int, fault_to: int) -> parking.CopyJob:
    addresses = [(source.__array_interface__["data"][0], source.shape[0]) for source in sources]
    return parking.CopyJob(sources, np.array(addresses, dtype=np.int64).reshape(-1), destination, fault_from,
                           fault_to)


def test_a_posted_job_copies_then_waits_for_go_then_runs():
    helper = parking.ParkedHelper("kimi_tok-test")
    sources = [np.arange(k * 1000, k * 1000 + 700 + k, dtype=np.uint32) for k in range(5)]
    n = sum(source.shape[0] for source in sources)
    destination = np.full(n + 5000, 7, dtype=np.uint32)
    ran = threading.Event()
    seen: list[np.ndarray] = []

    def fn():
        seen.append(destination.copy())  # what the copy left, before this thread writes anything
        ran.set()
        return "planned"

    posted = helper.post(fn, copy_job(sources, destination, n, n + 3000))
    assert not ran.wait(0.2), "ran before GO"
    posted.release()
    assert posted.result() == "planned" and ran.is_set()
    got = seen[0]
    assert np.array_equal(got[:n], np.concatenate(sources))
    fault_region = got[n:n + 3000]
    assert set(fault_region[::parking.IDS_PER_PAGE].tolist()) == {0}  # one id per page written
    assert set(np.delete(fault_region, np.s_[::parking.IDS_PER_PAGE]).tolist()) == {7}
    assert set(got[n + 3000:].tolist()) == {7}


@numba.njit(nogil=True)
def go_from_compiled_code(go_words, syscall_number):
    """As the caller's ``encode_claimed_parts`` signals GO."""
    futex.signal(go_words, syscall_number)
    return 0


def test_go_from_compiled_code_and_many_jobs_in_a_row():
    helper = parking.ParkedHelper("kimi_tok-test")
    for k in range(50):
        posted = helper.post(lambda k=k: k * k, None)
        if k % 2:
            parking.signal_go_from_python(helper.go_words, SYS_FUTEX)
        else:
            go_from_compiled_code(helper.go_words, SYS_FUTEX)
        assert posted.result() == k * k


def test_a_helper_that_slept_waiting_for_go_is_woken():
    helper = parking.ParkedHelper("kimi_tok-test")
    posted = helper.post(lambda: "late", None)
    time.sleep(0.05)  # well past the spin: the helper sleeps on the futex
    posted.release()
    assert posted.result() == "late"


def test_errors_reach_the_caller_and_the_helper_stays_usable():
    helper = parking.ParkedHelper("kimi_tok-test")

    def fail():
        raise TypeError("segment 3: text must be a str, not bytes")

    posted = helper.post(fail, None)
    posted.release()
    with pytest.raises(TypeError, match="segment 3"):
        posted.result()
    again = helper.post(lambda: 1, None)
    again.release()
    assert again.result() == 1


def test_a_copy_job_that_does_not_fit_is_refused():
    helper = parking.ParkedHelper("kimi_tok-test")
    source = np.arange(100, dtype=np.uint32)
    with pytest.raises(ValueError, match="copy job"):
        helper.post(lambda: None, copy_job([source], np.empty(50, dtype=np.uint32), 0, 0))


def test_parked_helpers_are_never_queued_and_come_back_after_result():
    helpers = reuse.HelperThreads(1, parked=True)
    first = helpers.post(lambda: "a", None)
    assert first is not None
    assert helpers.post(lambda: "b", None) is None  # the only helper is taken until its result
    first.release()
    assert first.result() == "a"
    second = helpers.post(lambda: "c", None)
    assert second is not None and second.helper is first.helper
    second.release()
    assert second.result() == "c"
    assert helpers.submit(lambda: "d") is None  # parked helpers take no executor jobs


# small prompts encode ahead, their outputs reused; one parked helper
LOW = {"min_ahead_plan_chars": 1_000, "min_ahead_chars": 100, "min_reused_ids": 1_000, "parked_helpers": True,
       "helpers": 1}


def parked_tokenizer() -> kimi_tok.Tokenizer:
    """A new two-job Tokenizer (a helper and a segment cache of its own) with ``LOW`` thresholds."""
    from kimi_tok.vocab import embedded_kimi_k3

    vocabulary, specials = embedded_kimi_k3()
    policy = Policy.from_env(n_jobs=2, segment_cache_bytes=64 << 20, min_cached_call_chars=0).replace(**LOW)
    return kimi_tok.Tokenizer(vocabulary, specials, policy=policy)


@pytest.fixture()
def copies_used(monkeypatch) -> list[bool]:
    """Whether each plan found the ids copied ahead to be its cached parts."""
    used: list[bool] = []
    same = reuse._same_sources

    def spy(*args):
        used.append(same(*args))
        return used[-1]

    monkeypatch.setattr(reuse, "_same_sources", spy)
    return used


def turn(k: int, n_chars: int) -> list:
    return [("<|open|>", True), ("tool", False), ("<|sep|>", True), (sample_text(n_chars, seed=500 + k), False),
            ("<|close|>", True)]


def check(tok, plain, ref, segments: list) -> None:
    """The cached tokenizer's ids equal the uncached one's and the tiktoken reference's."""
    got = tok.encode_to_numpy(segments).tolist()
    assert got == plain.encode_segments(segments).ids
    assert got == ref.encode_segments(segments)


def test_an_agent_loop_turn_starts_from_the_ids_copied_ahead(ref, copies_used):
    tok = parked_tokenizer()
    plain = kimi_tok.kimi_k3(segment_cache_bytes=0)
    segments: list = []
    for k in range(6):
        segments = rerender(segments) + turn(k, 2_000 + 300 * k)
        check(tok, plain, ref, segments)
    assert copies_used and all(copies_used)  # every turn after the first two found its prefix copied
    tok.segment_cache.settle()  # the stores a helper makes after a call returns
    recent = tok.segment_cache._recent_calls[-1]
    assert recent.runs() is not None and recent.copies[1::2].sum() == len(plain.encode_segments(segments))


def test_a_copy_the_plan_rejects_is_redone(ref, copies_used):
    """A turn of one conversation right after another conversation's call with the same shape (the
    guess takes that call): the ids copied ahead are not the plan's, so the plan copies its own. An
    earlier segment edited as well: the plan encodes it too, and assembles the ids itself."""
    tok = parked_tokenizer()
    plain = kimi_tok.kimi_k3(segment_cache_bytes=0)
    first, other = turn(0, 3_000), turn(1, 3_000)  # equal lengths: the same segment keys
    tok.encode_segments(first)
    tok.encode_segments(other)
    longer = rerender(first) + turn(2, 1_500)
    check(tok, plain, ref, longer)
    assert copies_used == [False]
    edited = rerender(longer)
    text = edited[3][0]
    edited[3] = (text[:50] + ("#" if text[50] != "#" else "%") + text[51:], False)
    edited += turn(3, 1_500)
    check(tok, plain, ref, edited)
    assert copies_used == [False]  # more missing than the guess: no offer to check


def test_a_busy_helper_means_no_copy_ahead(ref):
    """With the helper taken by another caller, the plan runs inline and copies the ids itself."""
    tok = parked_tokenizer()
    helpers = tok._reuse.helpers
    plain = kimi_tok.kimi_k3(segment_cache_bytes=0)
    segments = turn(0, 3_000)
    tok.encode_segments(segments)
    tok.segment_cache.settle()  # the helper stored the call's segments after it returned: now it is idle
    busy = helpers.post(lambda: None, None)
    assert busy is not None
    try:
        longer = rerender(segments) + turn(1, 2_000)
        check(tok, plain, ref, longer)
    finally:
        busy.release()
        busy.result()


def test_a_layout_with_an_evicted_run_is_not_copied():
    tok = parked_tokenizer()
    segments = turn(0, 3_000)
    tok.encode_segments(segments)
    tok.segment_cache.settle()
    recent = tok.segment_cache._recent_calls[-1]
    assert recent.runs() is not None
    tok.segment_cache.clear()
    assert recent.runs() is None  # its runs are gone: nothing to copy from


def test_a_layout_with_a_stretch_in_the_middle_is_copied_in_call_order(ref, copies_used):
    """A turn whose edited segment was encoded between cached parts: the next turn's copy ahead
    follows that call's order (cached, edited, cached, new) and the plan takes it."""
    tok = parked_tokenizer()
    plain = kimi_tok.kimi_k3(segment_cache_bytes=0)
    segments = turn(0, 3_000) + turn(1, 3_000)
    tok.encode_segments(segments)
    edited = rerender(segments)
    edited[3] = (edited[3][0] + " (edited)", False)  # another length: missing, between cached parts
    edited += turn(2, 1_500)
    tok.encode_segments(edited)
    tok.segment_cache.settle()
    layout = tok.segment_cache._recent_calls[-1].layout
    assert layout is not None and len(layout[0]) == 4, layout  # cached, edited, cached, new
    longer = rerender(edited) + turn(3, 1_500)
    check(tok, plain, ref, longer)
    assert copies_used[-1] is True


def test_a_result_taken_twice_does_not_wait_for_the_helpers_next_caller():
    """After ``result`` the helper may serve another caller: a second ``result`` or ``release`` (an
    error path) must neither wait for that caller's job nor signal it."""
    helpers = reuse.HelperThreads(1, parked=True)
    first = helpers.post(lambda: "first", None)
    first.release()
    assert first.result() == "first"
    second = helpers.post(lambda: "second", None)  # the same helper, now another caller's
    assert second is not None and second.helper is first.helper
    first.release()  # must not let the second job past its GO
    ran = threading.Event()
    second.fn = lambda: ran.set()
    assert not ran.wait(0.2)
    assert first.result() == "first"  # returns at once
    second.release()
    second.result()
    assert ran.is_set()
