"""A long call's texts transcoded on several threads (``threads.utf8_on_threads``) pack to the same
buffer as on one thread, and the ids equal the reference's."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import kimi_tok
from kimi_tok.engine import threads
from kimi_tok.pipeline.segments import TRANSCODED_MIN_CHARS, pack_segments
from tests.conftest import k3_tokenizer
from tests.parity import assert_parity

LOW = {"min_parallel_pack_chars": 1_000, "segment_cache_bytes": 0}


def mixed_segments(seed: int) -> list[tuple[str, bool]]:
    """Long texts of every kind utf8_of meets (ASCII, 1-byte Latin, 2-byte mostly ASCII or mostly not,
    4-byte) between short template segments."""
    rng = np.random.default_rng(seed)
    n = TRANSCODED_MIN_CHARS + 3_000
    kinds = [
        "def f(x):\n    return x + 1\n" * (n // 27 + 1),
        "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e " * (n // 20),
        "hello \u4e16\u754c world, " * (n // 15),
        "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 " * (n // 11),
        "emoji \U0001f600 in code = 1;\n" * (n // 24),
        "x" * 50 + "\u4e2d\u6587" * (n // 2),
    ]
    order = rng.permutation(len(kinds))
    segments: list[tuple[str, bool]] = []
    for k in order:
        segments += [("<|im_user|>", True), (kinds[k][: n + int(rng.integers(0, 2_000))], False), ("\n", False)]
    return segments


def test_parallel_utf8_equals_one_thread():
    """Every text's UTF-8 is the same whichever thread made it, and the packed buffers are equal."""
    segments = mixed_segments(0)
    texts = [text for text, _ in segments]
    got = threads.utf8_on_threads(texts, 3, TRANSCODED_MIN_CHARS)
    assert [bytes(chunk) for chunk in got] == [text.encode("utf-8") for text in texts]
    one = pack_segments(segments, True, None)
    many = pack_segments(segments, True, None, utf8=lambda ts: threads.utf8_on_threads(ts, 2, TRANSCODED_MIN_CHARS))
    assert bytes(one.buf) == bytes(many.buf)
    for field in ("seg_start", "seg_end", "allow_special", "needs_cuts", "origin"):
        assert np.array_equal(getattr(one, field), getattr(many, field)), field


def test_parallel_utf8_runs_on_pool_threads(monkeypatch):
    """The long texts are shared: some are transcoded on another thread than the caller's.

    The caller waits (up to 30 s) for a pool thread to start on its share: otherwise, on a loaded
    machine, the caller may finish its own share first and take back the helper's unstarted one."""
    seen = set()
    helper_started = threading.Event()
    real = threads.utf8_of

    def spy(text):
        if len(text) >= TRANSCODED_MIN_CHARS:
            seen.add(threading.get_ident())
            if threading.current_thread() is threading.main_thread():
                helper_started.wait(30)
            else:
                helper_started.set()
        return real(text)

    monkeypatch.setattr(threads, "utf8_of", spy)
    threads.utf8_on_threads([text for text, _ in mixed_segments(1)], 2, TRANSCODED_MIN_CHARS)
    assert len(seen) == 2


@pytest.mark.parametrize("seed", [2, 3])
def test_parallel_packing_ids_equal_reference(ref, seed):
    """A tokenizer that packs from 1,000 characters on two threads gives the reference's ids."""
    tok = k3_tokenizer(kimi_tok.Policy.from_env(n_jobs=2).replace(**LOW))
    assert_parity(tok, ref, mixed_segments(seed))


def test_parallel_packing_lone_surrogate(ref):
    """A lone surrogate in a text another thread transcodes is fixed up as the reference does."""
    tok = k3_tokenizer(kimi_tok.Policy.from_env(n_jobs=2).replace(**LOW))
    segments = mixed_segments(4)
    text, allow = segments[4]
    segments[4] = (text[:5_000] + "\ud800" + text[5_000:], allow)
    with pytest.raises(UnicodeEncodeError):
        threads.utf8_on_threads([t for t, _ in segments], 2, TRANSCODED_MIN_CHARS)
    assert_parity(tok, ref, segments)


def test_parallel_packing_busy_pool():
    """With the pool's threads busy, the caller transcodes their share itself rather than wait."""
    release = threading.Event()
    pool = threads.thread_pool(2)
    blockers = [pool.submit(release.wait) for _ in range(pool._max_workers)]
    timer = threading.Timer(60, release.set)  # a caller that waited for the pool would fail here, not hang
    timer.start()
    try:
        texts = [text for text, _ in mixed_segments(5)]
        got = threads.utf8_on_threads(texts, 2, TRANSCODED_MIN_CHARS)
        assert not release.is_set(), "the call waited for the busy pool's threads"
        assert [bytes(chunk) for chunk in got] == [text.encode("utf-8") for text in texts]
    finally:
        timer.cancel()
        release.set()
        for blocker in blockers:
            blocker.result()


def test_policy_rejects_bad_threshold():
    for bad in (0, -5, 2.5, True, "1000"):
        with pytest.raises(ValueError, match="min_parallel_pack_chars"):
            kimi_tok.Policy.from_env().replace(min_parallel_pack_chars=bad)


def test_the_threshold_follows_the_cpu_unless_the_policy_sets_it():
    """By default a call transcodes on threads from 4M characters where the kernels have AVX-512 VBMI2's byte
    compress (one compiled pass is 16 characters a step there), from 2M elsewhere; a policy's value wins."""
    from kimi_tok.engine.engine import PARALLEL_PACK_CHARS
    from kimi_tok.native.simd import kernels_have_byte_compress

    assert kimi_tok.Policy().min_parallel_pack_chars is None
    tok = k3_tokenizer(kimi_tok.Policy.from_env(segment_cache_bytes=0))
    assert tok.engine.min_parallel_pack_chars == PARALLEL_PACK_CHARS[kernels_have_byte_compress()]
    assert PARALLEL_PACK_CHARS == {True: 1 << 22, False: 1 << 21}
    assert k3_tokenizer(kimi_tok.Policy.from_env().replace(**LOW)).engine.min_parallel_pack_chars == 1_000


def test_calls_either_side_of_the_threshold_give_reference_ids(ref, monkeypatch):
    """The default kimi_k3() packs a call just under its threshold (past the 1M characters it once was) in one
    compiled pass and one just over it on threads; both give the reference's ids. Mixed scripts, so that the
    one pass meets characters of every width."""
    from kimi_tok.engine import engine as engine_module
    from kimi_tok.samples import sample_prompt

    tok = kimi_tok.kimi_k3(segment_cache_bytes=0)
    limit = tok.engine.min_parallel_pack_chars
    assert limit > 1 << 20
    on_threads = []
    real = engine_module.utf8_on_threads
    monkeypatch.setattr(engine_module, "utf8_on_threads", lambda *a, **k: on_threads.append(1) or real(*a, **k))
    wide = ["caf\u00e9 cr\u00e8me ", "\u0436\u0443\u043a ", "\u4e2d\u6587\u3002", "x\U0001f600 "]
    for k, n in enumerate((limit - 20_000, limit + 20_000)):
        segments = sample_prompt(n // 2, seed=k)
        segments += [(wide[i % 4] * (n // 2 // len(wide[i % 4]) // 4), False) for i in range(4)]
        chars = sum(len(text) for text, _ in segments)
        assert (chars < limit) == (k == 0), (chars, limit)
        assert_parity(tok, ref, segments)
        assert len(on_threads) == k  # the first call in one pass, the second on threads
