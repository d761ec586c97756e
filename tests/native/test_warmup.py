"""First use: kernels are compiled (or loaded) before the first call needs them, with one line on
stderr when they are compiled, and a cache folder numba cannot write is still read.

The subprocess tests use a module of their own with two small kernels (seconds to compile), in a
temporary package, so that an empty cache does not mean compiling all of kimi_tok."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import kimi_tok
from kimi_tok.native import jit
from kimi_tok.reuse import warmup
from kimi_tok.samples import sample_prompt

KERNELS_MODULE = """
from kimi_tok.native.jit import kernel, leaf


@leaf
def _scaled(x, k):
    return x * k


@kernel
def total(values):
    acc = 0
    for i in range(values.shape[0]):
        acc += _scaled(values[i], 3)  # a constant argument: compiled for its type (KernelDispatcher)
    return acc
"""

RUN = """
import sys
sys.path.insert(0, {folder!r})
import numpy as np
from kimi_tok.native import jit
{before}
import probe_kernels
assert probe_kernels.total(np.arange(5, dtype=np.int64)) == 30
print("compiled", len(jit.COMPILED), "hits", probe_kernels.total.stats.cache_hits.get(probe_kernels.total.signatures[0], 0))
"""


def _run(tmp_path, env_extra: dict, before: str = "") -> subprocess.CompletedProcess:
    folder = tmp_path / "mod"
    folder.mkdir(exist_ok=True)
    (folder / "probe_kernels.py").write_text(KERNELS_MODULE)
    env = dict(os.environ, **env_extra)
    env.pop(jit.WORKER_ENV, None)
    code = RUN.format(folder=str(folder), before=textwrap.dedent(before))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          check=True)


def test_the_notice_is_printed_on_a_cold_cache_and_not_on_a_warm_one(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache")}
    cold = _run(tmp_path, env)
    assert "compiled 2 " in cold.stdout  # total and its leaf, each once
    notices = [line for line in cold.stderr.splitlines() if line.startswith("kimi_tok: compiling")]
    assert len(notices) == 1, cold.stderr
    assert "kimi-tok warmup" in notices[0] and str(tmp_path / "numba-cache") in notices[0]
    warm = _run(tmp_path, env)
    assert "compiled 0 hits 1" in warm.stdout
    assert "kimi_tok: compiling" not in warm.stderr


def test_a_cache_folder_numba_cannot_write_is_still_read(tmp_path):
    """A cache built ahead, then read-only (a container image): kernels load from it, nothing is
    written, and a kernel it lacks is compiled (in every process, but it works)."""
    cache = tmp_path / "numba-cache"
    env = {"NUMBA_CACHE_DIR": str(cache)}
    _run(tmp_path, env)  # built ahead
    files = sorted(p.name for p in cache.rglob("*") if p.is_file())
    read_only = "jit._writable = lambda folder: False  # as a read-only file system answers\n"
    warm = _run(tmp_path, env, before=read_only)
    assert "compiled 0 hits 1" in warm.stdout
    assert sorted(p.name for p in cache.rglob("*") if p.is_file()) == files  # nothing written
    for path in cache.rglob("*.nbi"):
        if "total" in path.name:
            path.unlink()  # a kernel the prebuilt cache lacks
    lacking = _run(tmp_path, env, before=read_only)
    assert "compiled 1 hits 0" in lacking.stdout
    assert not any("total" in p.name for p in cache.rglob("*.nbi"))  # compiled, not saved


def test_without_any_writable_cache_folder_kernels_are_compiled_and_work(tmp_path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"),  # empty, and the only folder numba may take
           "NUMBA_CACHE_LOCATOR_CLASSES": "kimi_tok.native.jit._PrebuiltUserProvidedFolder"}
    done = _run(tmp_path, env, before="jit._writable = lambda folder: False\n")
    assert "compiled 2 " in done.stdout
    assert "no writable cache directory" in done.stderr  # the one warning


def _loaded() -> dict[str, set]:
    """Per kimi_tok kernel, the signatures this process has compiled or loaded so far."""
    return {name: set(d.overloads) for name, d in jit.KERNELS.items() if name.startswith("kimi_tok.")}


def _new_since(before: dict[str, set]) -> list[str]:
    return sorted(f"{name}{sig}" for name, sigs in _loaded().items() for sig in sigs - before.get(name, set()))


def _use_everything(tok: kimi_tok.Tokenizer) -> None:
    """Every public way a Tokenizer's calls reach compiled code, at sizes that fan out."""
    long = sample_prompt(1_200_000, seed=11)
    short = sample_prompt(4_000, seed=12)
    tok.encode_segments(short)
    tok.encode_segments(long)
    tok.count_tokens(long)
    tok.encode_segments(short, return_offsets=True)
    ids, _ = tok.encode_with_bounds(long, n_jobs=2)
    tok.decode(ids[:1000])
    tok.profile_segments(short)
    tok.encode_batch([short, long[:40]])
    tok.profile_segments(long, n_jobs=2)
    turn = list(long)
    for k in range(3):  # an agent loop: each turn extends the last
        turn = turn + [(f"tool output {k}: " + "x y z " * 3000, False), ("<|end_of_msg|>", True)]
        tok.encode_segments([(text, flag) for text, flag in turn])


def test_no_kernel_is_compiled_or_loaded_after_a_tokenizer_is_made():
    tok = kimi_tok.kimi_k3()
    warmup.wait_for_background()
    before, compiled = _loaded(), len(jit.COMPILED)
    _use_everything(tok)
    assert _new_since(before) == [], "a path the warm-up at Tokenizer creation does not take"
    assert len(jit.COMPILED) == compiled


def test_no_kernel_is_compiled_or_loaded_after_warmup(tmp_path):
    done = kimi_tok.warmup(processes=False)
    assert done["kernels"] > 10 and done["seconds"] > 0
    before, compiled = _loaded(), len(jit.COMPILED)
    vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
    for tok in (kimi_tok.kimi_k3(hash_routing=True), kimi_tok.kimi_k3(n_jobs=1, segment_cache_bytes=0),
                kimi_tok.Tokenizer(vocabulary, specials, r"\S+|\s+")):
        warmup.wait_for_background()
        _use_everything(tok)
    assert _new_since(before) == []
    assert len(jit.COMPILED) == compiled


def test_the_probe_takes_the_fan_outs_it_forces():
    """The probe's policy makes ~1 KB fan out: else its paths would compile nothing new."""
    policy = warmup.probe_policy(kimi_tok.Policy.from_env())
    tok = kimi_tok.kimi_k3()
    probe = warmup._probe_engine(tok.engine, policy)
    packed = probe.pack(warmup.probe_segments(), True)
    assert packed.buf.shape[0] >= 2 * policy.min_bytes_per_shared_job
    ids, bounds = probe.encode_with_bounds(warmup.probe_segments(), True)
    expected, expected_bounds = tok.engine.encode_with_bounds(warmup.probe_segments(), True, n_jobs=1)
    assert np.array_equal(ids, expected) and np.array_equal(bounds, expected_bounds)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_fork_waits_for_the_background_warm_up(monkeypatch):
    """A child must not inherit numba's compiler lock from a thread it does not have."""
    take = warmup._take

    def slow_take(*args):
        time.sleep(0.5)
        return take(*args)

    monkeypatch.setattr(warmup, "_take", slow_take)
    tok = kimi_tok.Tokenizer(*kimi_tok.vocab.embedded_kimi_k3(), kimi_tok.KIMI_PATTERN)
    started = list(warmup._background)
    assert any(t.is_alive() for t in started)
    pid = os.fork()  # the at-fork hook joins the warm-up thread first
    if pid == 0:
        os._exit(0)
    assert not any(t.is_alive() for t in started)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert tok.encode("hello world").ids == [22931, 2695]
