"""The first use after an install: an empty numba cache, then a warm one, in fresh processes.

The cold process gets its first prompt's exact ids within seconds (the interpreted engine) while
worker processes compile every kernel into the cache, one notice on stderr saying so; it then
switches to the compiled kernels without compiling any itself. The next process finds them all
cached: no notice, nothing compiled, and it answers its first call while a thread loads them
(``test_warm_start.py``). The build takes about as long as
``kimi-tok warmup`` (one to two minutes on two cores); the test waits for all of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from kimi_tok.native import jit
from kimi_tok.samples import sample_prompt
from tests.reference import Reference

FIRST_USE = """
import json, sys, time
started = time.perf_counter()
import kimi_tok
from kimi_tok.native import jit
from kimi_tok.reuse.warmup import KernelBuild
from kimi_tok.samples import sample_prompt
tok = kimi_tok.kimi_k3()
ids = tok.encode_segments(sample_prompt(4_000, seed=3)).ids
first = time.perf_counter() - started
compiled_at_first = tok.compiled
switched = tok.wait_until_compiled(timeout=1200)
again = tok.encode_segments(sample_prompt(4_000, seed=3)).ids
build = KernelBuild._current
if build is not None:
    build.process.wait(1200)  # the rest of the build (other Tokenizers' paths), so that nothing runs on after
print(json.dumps({"first_seconds": first, "compiled_at_first": compiled_at_first, "switched": switched,
                  "ids": ids, "again": again, "compiled_here": len(jit.COMPILED),
                  "build_exit": None if build is None else build.process.returncode}))
"""


def _run(env: dict) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", FIRST_USE], capture_output=True, text=True, env=env, timeout=2400,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_first_use_answers_in_seconds_then_runs_compiled(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in (jit.WORKER_ENV, "KIMI_TOK_COLD_START")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "numba"), KIMI_TOK_CACHE_DIR=str(tmp_path / "tables"))
    expected = Reference().encode_segments(sample_prompt(4_000, seed=3))

    cold, stderr = _run(env)
    assert cold["ids"] == expected and cold["again"] == expected
    assert not cold["compiled_at_first"] and cold["switched"]
    assert cold["first_seconds"] < 30, cold  # import, the vocabulary in Python, one prompt: ~1-2 s here
    assert cold["compiled_here"] == 0  # the worker processes compiled; this process only loaded
    assert cold["build_exit"] == 0
    notices = [line for line in stderr.splitlines() if line.startswith("kimi_tok: compiling")]
    assert len(notices) == 1 and "background" in notices[0] and "kimi-tok warmup" in notices[0], stderr

    warm, stderr = _run(env)
    assert warm["ids"] == expected and warm["again"] == expected and warm["switched"]
    assert warm["compiled_here"] == 0  # loaded, on a thread, while the first call ran interpreted
    assert warm["build_exit"] is None  # no build started
    assert "kimi_tok: compiling" not in stderr
