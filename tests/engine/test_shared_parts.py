"""Work sharing in compiled code: ``atomics.fetch_add`` and ``parallel.SharedParts``.

Threads take parts of one call's text from a shared counter; whatever the part size and the
number of threads, the ids and per-segment bounds must equal those of one compiled call.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kimi_tok
from kimi_tok.native.atomics import fetch_add
from kimi_tok.native.jit import kernel
from kimi_tok.engine.parts import SharedParts
from kimi_tok.samples import render_chat, sample_text


@kernel
def _take_all(counters, taken):
    """Take indices from ``counters[0]`` until none is left; count each in ``taken``."""
    n = 0
    while True:
        k = fetch_add(counters, 0, 1)
        if k >= taken.shape[0]:
            return n
        taken[k] += 1
        fetch_add(counters, 1, 1)
        n += 1


def test_fetch_add_hands_out_every_index_exactly_once():
    counters = np.zeros(2, dtype=np.int64)
    taken = np.zeros(2_000_000, dtype=np.int64)
    counts: list[int] = []
    threads = [threading.Thread(target=lambda: counts.append(_take_all(counters, taken))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (taken == 1).all()
    assert sum(counts) == taken.shape[0] == counters[1]
    assert counters[0] == taken.shape[0] + len(threads)  # each thread's last, refused, take


@pytest.fixture(scope="module")
def tok() -> kimi_tok.Tokenizer:
    return kimi_tok.kimi_k3(segment_cache_bytes=0)


def prompts():
    chat = render_chat([
        {"role": "system", "content": sample_text(3_000, seed=1)},
        {"role": "user", "content": sample_text(12_000, seed=2) + "<|open|>literal<|close|>"},
    ])
    return {
        "chat": (chat, True),
        "empty segments": ([("", False), (sample_text(5_000, seed=3), False), ("", True), ("x", False)], True),
        "lone surrogate": ([("a\ud800b " * 300, False), (sample_text(2_000, seed=4), True)], True),
        "whole segments": ([(sample_text(9_000, seed=5) + "<|open|>", True)], False),
        "one long line": ([("ab" * 20_000, False)], True),
    }


@pytest.mark.parametrize("name", list(prompts()))
@pytest.mark.parametrize("part_bytes, shrink", [(1, 0), (64, 0), (4_096, 0), (1 << 22, 0), (1, 4), (256, 3)])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_parts_give_the_ids_and_bounds_of_one_call(tok, name, part_bytes, shrink, n_threads):
    segments, tiktoken_safe = prompts()[name]
    packed = tok.engine.pack(segments, tiktoken_safe)
    expected_ids, expected_bounds = tok.engine.encode_fused(packed)
    shared = tok.engine.shared_parts(packed, part_bytes, shrink)
    done: list[int] = []

    def work():
        with tok.engine.stages.piece_caches.borrow() as cache:
            done.append(shared.work(cache))

    helpers = [threading.Thread(target=work) for _ in range(n_threads - 1)]
    for helper in helpers:
        helper.start()
    work()
    for helper in helpers:
        helper.join()
    assert sum(done) == shared.n_parts
    ids, bounds = shared.ids_and_bounds()
    assert ids.dtype == expected_ids.dtype
    np.testing.assert_array_equal(ids, expected_ids)
    np.testing.assert_array_equal(bounds, expected_bounds)


def part_sizes(shared: SharedParts) -> list[int]:
    return [int(shared.sub_end[b - 1] - shared.sub_start[a])
            for a, b in zip(shared.part_first[:-1].tolist(), shared.part_first[1:].tolist())]


def test_parts_are_about_the_size_asked(tok):
    packed = tok.engine.pack([(sample_text(40_000, seed=6), False)], True)
    sizes = part_sizes(tok.engine.shared_parts(packed, 4_096, 0))
    assert len(sizes) > 5
    assert all(size >= 4_096 for size in sizes[:-1])


def test_guided_parts_shrink_toward_the_end(tok):
    """Each part holds at least a quarter of the bytes left at its start (and the minimum): large
    parts first, small ones last (as far as the sub-strings can be cut: a stretch without a safe
    point stays whole)."""
    packed = tok.engine.pack([(sample_text(100_000, seed=8), False)], True)
    sizes = part_sizes(tok.engine.shared_parts(packed, 1_024, shrink=4))
    left = sum(sizes)
    for size in sizes[:-1]:
        assert size >= max(1_024, left // 4)
        left -= size
    assert len(sizes) >= 5 and sizes[0] >= sum(sizes) // 4 and min(sizes) < sizes[0] // 2


def test_ids_only_once_every_part_is_done(tok):
    packed = tok.engine.pack([(sample_text(3_000, seed=7), False)], True)
    shared = tok.engine.shared_parts(packed, 256, 0)
    with pytest.raises(RuntimeError, match="before every part"):
        shared.ids_and_bounds()
    with tok.engine.stages.piece_caches.borrow() as cache:
        shared.work(cache)
        assert shared.work(cache) == 0  # nothing left to take
    np.testing.assert_array_equal(shared.ids_and_bounds()[0], tok.engine.encode_fused(packed)[0])


def test_parts_and_compiled_calls_stay_under_max_part_bytes(tok):
    """However large the text and the guided share, a part holds about ``max_part_bytes`` at most,
    and ``work`` returns to Python after about that much (where a Ctrl-C is raised), calling again
    until no part is left: the ids are those of one compiled call."""
    from kimi_tok.engine import parts

    packed = tok.engine.pack([(sample_text(600_000, seed=9), False)], True)
    shared = SharedParts(tok.engine.stages, packed, tok.engine.flags, 4_096, True, shrink=2, max_part_bytes=50_000)
    sizes = part_sizes(shared)
    longest_sub = int((shared.sub_end - shared.sub_start).max())
    assert max(sizes) < 50_000 + longest_sub and sum(sizes) > 10 * 50_000
    calls = []
    real = parts.encode_claimed_parts

    def counted(*args):
        calls.append(real(*args))
        return calls[-1]

    parts.encode_claimed_parts, restore = counted, parts.encode_claimed_parts
    try:
        with tok.engine.stages.piece_caches.borrow() as cache:
            assert shared.work(cache) == len(sizes)
    finally:
        parts.encode_claimed_parts = restore
    assert len(calls) >= sum(sizes) // (50_000 + longest_sub) and min(calls[:-1]) >= 1
    np.testing.assert_array_equal(shared.ids_and_bounds()[0], tok.engine.encode_fused(packed)[0])


def test_stop_leaves_no_part_to_take(tok):
    packed = tok.engine.pack([(sample_text(30_000, seed=10), False)], True)
    shared = tok.engine.shared_parts(packed, 1_024, 0)
    assert shared.parts_left() > 1
    shared.stop()
    with tok.engine.stages.piece_caches.borrow() as cache:
        assert shared.parts_left() == 0 and shared.work(cache) == 0
