"""The parallel paths (issue: many cores): threads (parts shared by the caller and pool threads,
or pieces hash-routed) and worker processes.

Every id is compared with the tiktoken reference or with the sequential path, which the rest
of the suite compares with the reference. Some tests pass a policy with lower thresholds so
that inputs of a few hundred KB fan out into many small groups (the hardest case for order and
routing).
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tiktoken

import kimi_tok
import kimi_tok.engine.engine as engine_module
from kimi_tok import Policy
from kimi_tok.engine import parts, processes as workers, routing, threads as parallel
from kimi_tok.engine.policy import BACKEND_ENV, min_bytes_per_job_for, short_call_bytes_for, short_call_chars_for
from kimi_tok.pipeline import bpe
from kimi_tok.pipeline.bpe.piece_cache import ENTRIES
from kimi_tok.pipeline.bpe.tables import SHORT_PIECE_BYTES
from kimi_tok.reuse import warmup
from kimi_tok.samples import render_chat, sample_prompt, sample_text

from tests.conftest import k3_tokenizer, new_k3_tokenizer
from tests.parity import assert_parity

# how a long call fans out: threads (the default), threads with hash routing, worker processes
MODES = ["threads", "routed", "processes"]


# processes fan out from 1 MB per job; the ~1.5 MB prompts here should use them too
PROCESSES_FROM_256_KB = {"min_bytes_per_process_job": 1 << 18}
# fan out from 4 KB (no call read in place on one thread past that), split long sub-strings into 2 KB units:
# dozens of groups (or parts) per call
SMALL_GROUPS = {"min_bytes_per_job": 4096, "min_bytes_per_shared_job": 4096, "fan_out_part_bytes": 2048,
                "min_bytes_per_process_job": 4096, "unit_bytes": 2048, "max_joined_call_bytes": 1}


def mode_policy(n_jobs: int, mode: str, **settings) -> Policy:
    return Policy.from_env(n_jobs=n_jobs, segment_cache_bytes=0,
                           backend="processes" if mode == "processes" else "threads",
                           hash_routing=mode == "routed").replace(**settings)


def make_tokenizer(n_jobs: int, mode: str, **settings) -> kimi_tok.Tokenizer:
    """A new Tokenizer (cold piece caches of its own)."""
    return new_k3_tokenizer(mode_policy(n_jobs, mode, **settings))


@pytest.fixture(scope="module")
def tokenizers():
    """One Tokenizer per (mode, n_jobs); the process pool stays warm across tests."""
    return {(m, n): make_tokenizer(n, m, **PROCESSES_FROM_256_KB) for m in MODES for n in (1, 2, 4)}


@pytest.fixture(scope="module")
def small_group_tokenizers():
    """Tokenizers per (mode, n_jobs) whose calls fan out in many small groups (``SMALL_GROUPS``)."""
    return {(m, n): make_tokenizer(n, m, **SMALL_GROUPS) for m in MODES for n in (2, 4)}


def hostile_long_prompt(seed: int) -> list[tuple[str, bool]]:
    """~1.3M characters: rendered chat, specials as text and as tokens, 25k+ runs, CJK, digits."""
    rng = np.random.default_rng(seed)
    segments = sample_prompt(900_000, seed=seed)
    segments += render_chat([{"role": "tool", "content": sample_text(200_000, seed=seed + 1)}])
    segments += [
        (" " * 60_000 + "x" + "\n" * 30_001 + "y" * 50_001, False),
        ("<|open|>" + "\u4e2d\u6587" * 40_000 + "<|sep|>" + "1234567890" * 5_000, bool(rng.integers(2))),
        ("unknownwordzz " * 20_000 + "<|close|>", True),
    ]
    return segments


def _called_by_warm_up() -> bool:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename != warmup.__file__:
        frame = frame.f_back
    return frame is not None


@pytest.fixture()
def fan_outs(monkeypatch):
    """Counts the calls that went to each backend's fan-out, but for a Tokenizer's warm-up probes
    (which take every fan-out once per process, on the caller's thread or in the background)."""
    calls = {mode: 0 for mode in MODES}
    for backend, name in (("threads", "encode_parts_on_threads"), ("routed", "encode_on_threads"),
                          ("processes", "encode_on_processes")):
        def counted(*args, _real=getattr(engine_module, name), _backend=backend):
            calls[_backend] += not _called_by_warm_up()
            return _real(*args)
        monkeypatch.setattr(engine_module, name, counted)
    return calls


@pytest.mark.parametrize("backend", MODES)
@pytest.mark.parametrize("n_jobs", [1, 2, 4])
def test_long_prompts_match_the_reference(tokenizers, ref, fan_outs, backend, n_jobs):
    for seed in (3, 4):
        assert_parity(tokenizers[(backend, n_jobs)], ref, hostile_long_prompt(seed))
    assert fan_outs[backend] == (2 if n_jobs > 1 else 0)  # really parallel (and never for n_jobs=1)


def test_fan_out_threshold_follows_the_cores(ref, fan_outs, monkeypatch):
    assert min_bytes_per_job_for(1) == min_bytes_per_job_for(2) == 1 << 18
    assert min_bytes_per_job_for(4) == min_bytes_per_job_for(16) == 1 << 16
    # calls read in place on one thread: longer ones on two cores (measured), as before on more
    assert (short_call_chars_for(2), short_call_bytes_for(2)) == (1 << 17, 3 << 16)
    assert (short_call_chars_for(3), short_call_bytes_for(16)) == (1 << 16, 1 << 17)
    # as on 16 cores: the headline's 400k-character prompt fans out, its long tool output cut in
    # units of about a part (fan_out_part_bytes), so that several threads share it
    policy = mode_policy(4, "threads", min_bytes_per_job=min_bytes_per_job_for(16))
    assert policy.min_bytes_per_shared_job == 1 << 15  # the default threads fan-out, on any number of cores
    cuts = []
    cut = parts.cut_into_parts

    def spy(buf, seg_start, seg_end, *args):
        sub_start, sub_end, sub_allow, part_first = cut(buf, seg_start, seg_end, *args)
        last = (sub_start >= seg_start[-1]) & (sub_end <= seg_end[-1])
        if not _called_by_warm_up():
            cuts.append((args[3], int(last.sum()), part_first.shape[0] - 1))
        return sub_start, sub_end, sub_allow, part_first

    monkeypatch.setattr(parts, "cut_into_parts", spy)
    segments = sample_prompt(400_000, seed=5) + [(sample_text(300_000, seed=6), False)]
    assert_parity(k3_tokenizer(policy), ref, segments)
    assert fan_outs["threads"] == 1
    (min_part_bytes, tool_units, n_parts), = cuts
    assert min_part_bytes == policy.fan_out_part_bytes and tool_units >= 4 and n_parts >= 4


@pytest.mark.parametrize("backend", MODES)
@pytest.mark.parametrize("n_jobs", [2, 4])
@pytest.mark.parametrize("seed", range(3))
def test_many_small_groups_match_the_reference(small_group_tokenizers, ref, fan_outs, backend, n_jobs, seed):
    segments = sample_prompt(150_000, seed=seed) + [("<|open|>" * 50 + " \n" * 3000 + "ab" * 9000, True)]
    assert_parity(small_group_tokenizers[(backend, n_jobs)], ref, segments)
    assert fan_outs[backend] == 1


def test_a_generic_pattern_fans_out_in_groups(monkeypatch):
    """The PCRE2 path cannot share parts (no compiled scanner): its long calls still fan out, in
    contiguous groups, with the ids of the sequential path."""
    groups = []
    real = engine_module.encode_groups_on_threads

    def spy(*args):
        if not _called_by_warm_up():
            groups.append(args[-2])
        return real(*args)

    monkeypatch.setattr(engine_module, "encode_groups_on_threads", spy)
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    generic = kimi_tok.Tokenizer(vocabulary, specials, "(?:" + kimi_tok.KIMI_PATTERN + ")",
                                 policy=mode_policy(2, "threads", **SMALL_GROUPS))
    assert not generic.engine.fuses
    segments = sample_prompt(60_000, seed=11)
    assert np.array_equal(generic.encode_to_numpy(segments), make_tokenizer(1, "threads").encode_to_numpy(segments))
    assert len(groups) == 1 and len(groups[0]) > 2


def test_calls_within_the_joined_limits_run_on_one_thread_read_in_place(ref, fan_outs):
    """With two jobs, a call of up to ``max_joined_call_chars`` characters and less than ``max_joined_call_bytes``
    of UTF-8 is one compiled call that reads its segments in place, although a packed call of its size would
    fan out (from twice ``min_bytes_per_shared_job``); more characters or more UTF-8 than that fan out."""
    tok = make_tokenizer(2, "threads", min_bytes_per_shared_job=4096, max_joined_call_chars=20_000,
                         max_joined_call_bytes=30_000)
    read_in_place = []
    short_call_ids = tok.engine.short_call_ids

    def spy(*args):
        ids = short_call_ids(*args)
        read_in_place.append(ids is not None)
        return ids

    tok.engine.short_call_ids = spy
    under = sample_text(19_000, seed=31)
    assert 8192 < len(under.encode()) < 30_000
    wide = "\u0436\u0435 " * 5_000  # 15,000 characters, 25,000 bytes: over neither limit
    wider = "\u0436\u0435 " * 6_500  # 19,500 characters, 32,500 bytes: more UTF-8 than the limit
    longer = sample_text(21_000, seed=32)
    for text, fans_out in ((under, False), (wide, False), (wider, True), (longer, True)):
        read_in_place.clear()
        fan_outs["threads"] = 0
        assert tok.encode(text).ids == ref.encode(text)
        assert fan_outs["threads"] == fans_out and read_in_place[:1] == [not fans_out], (len(text), read_in_place)


def test_hash_routing_is_an_option_off_by_default(fan_outs):
    """Threads share parts of the text unless hash_routing=True (measured faster on 2 cores)."""
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    segments = sample_prompt(60_000, seed=1)
    default = k3_tokenizer(Policy.from_env(n_jobs=2, segment_cache_bytes=0).replace(**SMALL_GROUPS))
    routed = kimi_tok.kimi_k3(policy=Policy.from_env(n_jobs=2, segment_cache_bytes=0, hash_routing=True)
                              .replace(**SMALL_GROUPS))
    assert not default.hash_routing and routed.hash_routing
    assert np.array_equal(default.encode_to_numpy(segments), routed.encode_to_numpy(segments))
    assert fan_outs == {"threads": 1, "routed": 1, "processes": 0}
    for bad in (1, None, "yes"):
        with pytest.raises(TypeError, match="hash_routing"):
            kimi_tok.Tokenizer(vocabulary, specials, hash_routing=bad)
        with pytest.raises(TypeError, match="hash_routing"):
            kimi_tok.kimi_k3(hash_routing=bad)


@pytest.mark.parametrize("backend", MODES)
def test_routed_calls_give_sequential_ids_call_after_call(tokenizers, small_group_tokenizers, backend):
    """Warm route caches (merged short pieces in every route's table) keep giving the same ids."""
    sequential = tokenizers[("threads", 1)]
    for seed in range(6):
        segments = sample_prompt(60_000, seed=200 + seed % 3)  # seeds repeat: caches are warm
        expected = sequential.encode_to_numpy(segments)
        assert np.array_equal(small_group_tokenizers[(backend, 4)].encode_to_numpy(segments), expected)


def test_identical_pieces_are_merged_once_by_their_route():
    """Each distinct long unknown piece of a call is merged and stored once, by its route."""
    tok = make_tokenizer(4, "routed", **SMALL_GROUPS)
    words = [f"zq{'x' * (14 + k)}vj" for k in range(40)]
    rng = np.random.default_rng(0)
    chosen = rng.choice(words, 10_000).tolist()
    text = "\n".join(chosen)  # a newline before a letter: units split there, so groups fan out
    assert len(text) < 400_000  # one tiktoken-safe chunk: no word is cut in two
    pieces = set(chosen)  # the Kimi pattern's pieces are the words and the newlines (tokens)
    assert all(tok.token_to_id(p) is None and len(p.encode()) > SHORT_PIECE_BYTES for p in pieces)
    ids = tok.encode(text).into_numpy()["ids"]
    assert np.array_equal(ids, make_tokenizer(1, "threads").encode_to_numpy([(text, False)]))
    (route_caches,) = tok.engine._router._route_caches[4].kept()
    expected = [0] * 4
    for piece in pieces:
        raw = np.frombuffer(piece.encode(), dtype=np.uint8)
        expected[routing.route_of(raw, 0, raw.size, 4)] += 1
    assert [int(c.used[ENTRIES]) for c in route_caches.caches] == expected
    assert min(expected) > 0  # the 41 pieces spread over all 4 routes


@pytest.mark.parametrize("backend", MODES)
def test_concurrent_callers_share_one_parallel_tokenizer(ref, fan_outs, backend):
    """6 threads call one n_jobs=2 Tokenizer at once (3 rounds): everyone gets the sequential ids."""
    tok = make_tokenizer(2, backend, **PROCESSES_FROM_256_KB)
    prompts = [sample_prompt(n, seed=300 + k) for k, n in enumerate([700_000, 20_000, 600_000, 0, 550_000, 90_000])]
    sequential = [make_tokenizer(1, "threads").encode_to_numpy(p) for p in prompts]
    assert_parity(tok, ref, prompts[1])
    with ThreadPoolExecutor(max_workers=6) as pool:
        for _ in range(3):
            results = list(pool.map(lambda k: (k, tok.encode_to_numpy(prompts[k])), range(len(prompts))))
            for k, ids in results:
                assert np.array_equal(ids, sequential[k]), f"prompt {k} differs when callers run at once"
    assert fan_outs[backend] == 3 * 3  # the three long prompts fanned out in every round


def test_backend_argument_and_environment(monkeypatch):
    assert make_tokenizer(2, "routed").backend == "threads"
    assert kimi_tok.kimi_k3(backend="processes").backend == "processes"
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert Policy.from_env().backend == "threads"
    monkeypatch.setenv(BACKEND_ENV, "processes")
    assert Policy.from_env().backend == "processes"
    assert Policy.from_env(backend="threads").backend == "threads"  # an argument wins
    monkeypatch.setenv(BACKEND_ENV, "gpu")
    with pytest.raises(ValueError, match="KIMI_TOK_BACKEND='gpu'"):
        Policy.from_env()
    for bad in ("loky", "", "Threads", 1):
        with pytest.raises(ValueError, match="backend="):
            kimi_tok.kimi_k3(backend=bad)


def test_workers_map_the_tables_instead_of_pickling_them():
    """The spec a task carries is small; the worker's tables are memory maps of the saved files."""
    tok = make_tokenizer(2, "processes")
    spec = tok.engine.worker_spec()
    assert len(repr(spec)) < 20_000
    mapped = bpe.map_tables(__import__("pathlib").Path(spec.tables_dir))
    for name in bpe.BpeTables._fields:
        array = getattr(mapped, name)
        assert isinstance(array.base, np.memmap) or isinstance(array, np.memmap), name
        assert np.array_equal(array, getattr(tok.engine.stages.tables, name)), name
    encoder = workers.worker_encoder(spec)
    assert workers.worker_encoder(spec) is encoder  # built once per process
    text = "a worker encodes this <|open|> too"
    buf = np.frombuffer(text.encode(), dtype=np.uint8).copy()
    with workers.shared_text(buf) as path:
        ids, _, _ = workers.encode_group(spec, path, np.array([0]), np.array([buf.size]), np.array([True]))
        assert os.path.exists(path)
    assert not os.path.exists(path)
    assert ids.tolist() == tok.encode(text, allow_special=True).ids


def test_a_process_pool_stays_warm_between_calls(fan_outs):
    """The same loky executor and worker processes serve consecutive calls."""
    tok = make_tokenizer(2, "processes", **PROCESSES_FROM_256_KB)
    segments = sample_prompt(700_000, seed=5)
    tok.encode_segments(segments)
    pool = workers.process_pool(2)
    pids = set(pool._processes)
    tok.encode_segments(segments)
    assert workers.process_pool(2) is pool and set(pool._processes) == pids
    assert fan_outs["processes"] == 2


def test_joblib_loky_works_after_the_process_backend(fan_outs):
    """The process backend keeps a loky executor of its own: joblib's loky backend, which reuses
    loky's singleton executor, still works after a call (and the call after it too)."""
    import joblib

    tok = make_tokenizer(2, "processes", **PROCESSES_FROM_256_KB)
    segments = sample_prompt(700_000, seed=5)
    expected = tok.encode_to_numpy(segments)
    assert joblib.Parallel(n_jobs=2, backend="loky")(joblib.delayed(abs)(-k) for k in range(4)) == [0, 1, 2, 3]
    assert np.array_equal(tok.encode_to_numpy(segments), expected)
    assert fan_outs["processes"] == 2


def test_misses_merged_in_many_small_slices(ref):
    """Routes merge their misses slice by slice (so Ctrl-C stops them promptly): tiny slices,
    long unknown pieces and repeats across slices still give the reference's ids."""
    tok = make_tokenizer(4, "routed", merge_slice_bytes=64, **SMALL_GROUPS)
    words = ["zq" + "x" * k + "vj" for k in range(5, 400, 7)]
    rng = np.random.default_rng(1)
    text = "\n".join(rng.choice(words, 3_000).tolist()) + "\n" + "q" * 30_000
    assert_parity(tok, ref, [(text, False), ("\n".join(words), False)])


def test_killed_worker_processes_are_replaced(fan_outs):
    """Workers killed between calls (the OOM killer, say): the next call gets a fresh pool and the
    right ids."""
    import signal
    import time

    tok = make_tokenizer(2, "processes", **PROCESSES_FROM_256_KB)
    segments = sample_prompt(700_000, seed=6)
    expected = make_tokenizer(1, "threads").encode_to_numpy(segments)
    assert np.array_equal(tok.encode_to_numpy(segments), expected)
    for pid in list(workers.process_pool(2)._processes):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    assert np.array_equal(tok.encode_to_numpy(segments), expected)
    assert fan_outs["processes"] == 2


def test_processes_work_with_an_unwritable_cache_dir(tmp_path, fan_outs, ref):
    """The mappable tables go to the temporary directory when the cache root cannot be written
    (here it lies below a regular file, which fails for root too)."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    tok = make_tokenizer(2, "processes", cache_dir=blocker / "cache", **PROCESSES_FROM_256_KB)
    spec = tok.engine.worker_spec()
    assert not spec.tables_dir.startswith(str(blocker))
    assert_parity(tok, ref, sample_prompt(700_000, seed=11))
    assert fan_outs["processes"] == 1


@pytest.mark.parametrize("mode", ["routed", "processes"])
def test_generic_pattern_and_odd_vocabulary_in_every_mode(ref, fan_outs, mode):
    """The PCRE2 pre-tokenizer (a non-Kimi pattern text) and a vocabulary whose ranks are shuffled
    away from tiktoken's usual order: the parallel modes still give the reference's ids."""
    from tests.reference import load_pattern, load_special_tokens

    base = ref.enc
    ranks = sorted(base._mergeable_ranks, key=lambda t: (len(t) != 2, base._mergeable_ranks[t]))
    odd = tiktoken.Encoding(name="odd", pat_str="(?:" + load_pattern() + ")",
                            mergeable_ranks={t: r for r, t in enumerate(ranks)},
                            special_tokens={t: i + len(ranks) for t, i in
                                            zip(load_special_tokens(), range(len(load_special_tokens())))})
    vocabulary, specials = kimi_tok.from_tiktoken(odd).vocabulary, odd._special_tokens
    tok = kimi_tok.Tokenizer(vocabulary, specials, odd._pat_str, policy=mode_policy(2, mode, **SMALL_GROUPS))

    class OddReference(type(ref)):
        def __init__(self) -> None:
            self.enc = odd

    segments = sample_prompt(120_000, seed=21) + [(" \n" * 2000 + "<|open|>" + "ab" * 9000, True)]
    assert_parity(tok, OddReference(), segments)
    assert fan_outs[mode] == 1


def test_a_call_does_not_wait_for_pool_threads_busy_with_other_work():
    """With every pool thread busy elsewhere, the caller encodes all parts itself, and its queued
    helpers are cancelled rather than waited for."""
    tok = make_tokenizer(2, "threads")
    segments = sample_prompt(700_000, seed=12)
    expected = make_tokenizer(1, "threads").encode_to_numpy(segments)
    pool = parallel.thread_pool(2)
    release = threading.Event()
    blockers = [pool.submit(release.wait, 30) for _ in range(pool._max_workers)]
    try:
        with ThreadPoolExecutor(max_workers=1) as caller:
            ids = caller.submit(tok.encode_to_numpy, segments).result(timeout=20)  # not waiting for the blockers
        assert np.array_equal(ids, expected)
        assert not any(blocker.done() for blocker in blockers)
    finally:
        release.set()
    for blocker in blockers:
        blocker.result()
