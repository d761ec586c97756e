"""A warm start: the kernels are cached, but the process has not loaded numba yet.

``import kimi_tok`` does not import numba (``native.jit`` declares the kernels; ``materialize``
makes them numba dispatchers when first needed). A Tokenizer made before that answers calls of up
to ``Policy.interpreted_chars_while_loading`` characters on the interpreted engine while a thread
loads the kernels; longer calls wait for them. The ids are the same either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import kimi_tok
from kimi_tok import KIMI_PATTERN
from kimi_tok.native import jit
from kimi_tok.samples import sample_prompt
from kimi_tok.vocab import embedded_kimi_k3
from tests.reference import Reference

IMPORT_ONLY = """
import json, sys
import kimi_tok
from kimi_tok.native import jit
print(json.dumps({"numba": "numba" in sys.modules, "llvm": "llvmlite.binding" in sys.modules,
                  "materialized": jit.materialized(), "declared": len(jit._declared)}))
"""

WARM_PROCESS = """
import json, sys
import kimi_tok
from kimi_tok.native import jit
from kimi_tok.samples import sample_prompt
tok = kimi_tok.kimi_k3()
first = tok.encode_segments(sample_prompt(4_000, seed=11)).ids
switched = tok.wait_until_compiled(timeout=600)
again = tok.encode_segments(sample_prompt(4_000, seed=11)).ids
print(json.dumps({"first": first, "again": again, "switched": switched, "compiled_here": len(jit.COMPILED),
                  "materialized": jit.materialized(), "declared_left": len(jit._declared)}))
"""


def _child(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (jit.WORKER_ENV, "KIMI_TOK_COLD_START")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_kimi_tok_does_not_import_numba():
    got = _child(IMPORT_ONLY)
    assert got["numba"] is False and got["llvm"] is False and got["materialized"] is False
    assert got["declared"] > 50  # every kernel declared, none made yet


def test_a_warm_process_answers_first_then_loads_without_compiling():
    """The kernels are cached (conftest warms up before any test): a fresh process loads them."""
    expected = Reference().encode_segments(sample_prompt(4_000, seed=11))
    got = _child(WARM_PROCESS)
    assert got["first"] == expected and got["again"] == expected
    assert got["switched"] and got["materialized"] and got["declared_left"] == 0
    assert got["compiled_here"] == 0


@pytest.fixture
def warm_start(monkeypatch):
    """Tokenizers made under this fixture start warm (as if numba were not loaded yet), and their
    kernels finish loading when the test sets the returned event."""
    from kimi_tok import tokenizer

    loaded = threading.Event()
    real_warm_up = tokenizer.warm_up

    def held_warm_up(*args, **kwargs):
        loaded.wait(120)
        return real_warm_up(*args, **kwargs)

    monkeypatch.setattr(tokenizer.jit, "materialized", lambda: False)
    monkeypatch.setattr(tokenizer, "warm_up", held_warm_up)
    yield loaded
    loaded.set()


def test_short_calls_run_interpreted_while_the_kernels_load(warm_start):
    ref = Reference()
    tok = kimi_tok.Tokenizer(*embedded_kimi_k3(), KIMI_PATTERN, policy=kimi_tok.Policy())  # not from the environment
    assert not tok.compiled and tok._interpreted is not None
    segs = sample_prompt(8_000, seed=12)
    expected = ref.encode_segments(segs)
    assert tok.encode_segments(segs).ids == expected
    assert tok.count_tokens(segs) == len(expected)
    assert tok.decode(expected) == "".join(text for text, _ in segs)
    assert not tok.compiled
    warm_start.set()
    assert tok.wait_until_compiled(timeout=120) and tok._interpreted is None
    assert tok.encode_segments(segs).ids == expected


def test_long_calls_wait_for_the_kernels(warm_start):
    policy = kimi_tok.Policy(interpreted_chars_while_loading=2_000)
    tok = kimi_tok.Tokenizer(*embedded_kimi_k3(), KIMI_PATTERN, policy=policy)
    short, long = sample_prompt(1_500, seed=13), sample_prompt(3_000, seed=14)
    assert sum(len(text) for text, _ in short) <= 2_000 < sum(len(text) for text, _ in long)
    ref = Reference()
    assert tok.encode_segments(short).ids == ref.encode_segments(short)  # interpreted, at once
    got: dict = {}
    thread = threading.Thread(target=lambda: got.update(ids=tok.encode_segments(long).ids))
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and not got  # longer than the policy allows: waits for the kernels
    warm_start.set()
    thread.join(120)
    assert got == {"ids": ref.encode_segments(long)} and tok.compiled


def test_bad_segments_while_loading_raise_as_they_do_compiled(warm_start):
    tok = kimi_tok.Tokenizer(*embedded_kimi_k3(), KIMI_PATTERN, policy=kimi_tok.Policy())
    assert not tok.compiled
    with pytest.raises(TypeError, match="segment 1: text must be a str, not int"):
        tok.encode_segments([("a", False), (5, False)])
    with pytest.raises(TypeError, match="segments must be a list or tuple"):
        tok.encode_segments("text")


def test_the_loading_setting_is_checked():
    with pytest.raises(ValueError, match="interpreted_chars_while_loading must be a positive int"):
        kimi_tok.Policy(interpreted_chars_while_loading=0)
