"""Every kernel a Tokenizer can use, compiled (or loaded from numba's cache) before its first call.

A call compiles the kernels of the path it takes the first time that path runs in a process:
from an empty cache ~20 s for the first call, and another set of kernels for the first call
long enough to fan out. So a Tokenizer takes each of its paths once when it is made
(``warm_up``), with a probe: a few small calls on a copy of its engine whose policy forces
every fan-out (``probe_policy``: thresholds of one byte). The probe finds its kernels by
running them, so new or changed kernels need no list here. Whether the kernels are cached
decides how:

* cached (every later process): the path of a short call (one compiled call, its segment
  bounds, decoding) is loaded now (~30 ms), the fan-outs and the agent-loop helpers by a
  background thread (another ~50 ms), which a fork waits for (``os.register_at_fork``);
* not cached (first use after an install or an edit): everything now, with one line on
  stderr saying so (``native.jit.compile_notice``), so that no later call compiles.

``warm_up_everything`` (``kimi_tok.warmup()``, ``kimi-tok warmup``) takes every path of every
kind of Tokenizer (hash routing, worker processes, a PCRE2 pattern, building the tables of a new
vocabulary) and returns what it compiled: for container images and CI.

The module lives in the reuse layer because that is the lowest one that sees every kernel: the
stages (pipeline), the fan-outs (engine) and the agent-loop helpers (reuse.parking).
"""

from __future__ import annotations

import base64
import copy
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from ..engine.engine import Engine
from ..engine.policy import Policy
from ..native import jit
from ..pipeline.bpe import build_bpe_tables, grown_piece_cache, new_piece_cache
from ..pipeline.decode import Decoder
from ..pipeline.offsets import token_spans
from ..vocab import parse_tiktoken_bpe
from .encode_ahead import OutputMemory
from .segment_cache import SegmentCache

__all__ = ["warm_up", "warm_up_everything", "wait_for_background", "probe_segments", "probe_policy"]

# Text that takes every branch the stages have: specials in special and in plain segments, words,
# contractions, numbers, symbols, CJK, emoji, long and short whitespace runs, newlines.
PROBE_TEXT = (
    "Hello, world! It's 2024; we'll test <|open|> and <|sep|> as plain text.\n\n"
    "def f(x):\n    return x ** 2  # squares\n\t\t\r\n"
    "数字 12345 và tiếng Việt — ÀÉÎÕÜ ß ﬁ 🙂🚀 \u200b\u00a0 end.   \n" * 3
    + " " * 40 + "x" * 70 + "\n" + "aaaa" * 20 + " Ünïcödé wörds'll s'more ..."
)
_TINY_TOKENS = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", b"in", b"ing"]
_TINY_MODEL = b"".join(base64.b64encode(token) + f" {rank}\n".encode() for rank, token in enumerate(_TINY_TOKENS))
PROBE_KINDS = ("kimi", "pcre2")  # the pre-tokenizers: compiled Kimi scanner, or PCRE2 for any other pattern


def probe_segments() -> list[tuple[str, bool]]:
    """A short K3 chat turn of ``PROBE_TEXT`` (about 1 KB, eight segments)."""
    return [("<|open|>", True), ("message", False), (' role="user"', False), ("<|sep|>", True),
            (PROBE_TEXT, False), ("<|close|>", True), ("message", False), ("<|sep|>", True)]


def probe_policy(policy: Policy, **changes) -> Policy:
    """``policy`` with every fan-out taken even for the probe's ~1 KB (two jobs, parts and groups of a
    few bytes), and with ``changes``."""
    settings = dict(n_jobs=max(2, policy.n_jobs), min_bytes_per_shared_job=1, fan_out_part_bytes=64,
                    min_bytes_per_job=1, min_bytes_per_process_job=1, unit_bytes=64, merge_slice_bytes=256)
    settings.update(changes)
    return policy.replace(**settings)


def _probe_engine(engine: Engine, policy: Policy) -> Engine:
    probe = copy.copy(engine)  # shares the stages (tables, piece caches): only the policy differs
    probe.policy = policy
    probe._worker_spec = None
    return probe


# -- the paths --------------------------------------------------------------------------------------
#
# Each takes (engine, reuse, decoder) and runs one path on probe_segments(); ``_PATHS`` runs them in
# the order a new process needs them. A path is taken once per process and pre-tokenizer kind: the
# kernels' argument types do not depend on the vocabulary or the policy.


def _short_call(engine, reuse, decoder) -> None:
    segments = probe_segments()
    ids = engine.encode(segments, True).ids
    tiny_cache = new_piece_cache(entries=16, key_bytes=64, ids=16, short_entries=16)
    tiny_cache.used[:] = (8, 0, 0, 12, 0, 1)  # as a call leaves a cache that should grow: its entries move over
    grown_piece_cache(tiny_cache)
    engine.encode(segments, False, want_ids=False)
    engine.encode_with_bounds(segments, True)
    if decoder is not None:
        decoder.decode_bytes(ids)
        # offsets (``return_offsets``) on a decoder of byte tokens: the same kernels without building the
        # vocabulary's offset tables, which only a call that asks for offsets needs
        text = "héllo 🙂 wörld"
        tiny = Decoder(parse_tiktoken_bpe(_TINY_MODEL, "warm-up vocabulary"), {}, decoder._tables)
        byte_ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(ids.dtype)
        token_spans(tiny.offset_tables, byte_ids, [(text, False)], True, engine.flags)


def _shared_parts(engine, reuse, decoder) -> None:
    _probe_engine(engine, probe_policy(engine.policy, backend="threads", hash_routing=False)).encode_with_bounds(
        probe_segments(), True)


def _groups_and_stages(engine, reuse, decoder) -> None:
    segments = probe_segments()
    probe = _probe_engine(engine, probe_policy(engine.policy, backend="threads", hash_routing=False))
    probe.profile(segments, True, 1)  # the stages one by one (profile_segments; PCRE2 patterns)
    probe.profile(segments, True, 2)  # groups on threads
    if not engine.fuses:
        probe.encode_with_bounds(segments, True)


def _hash_routing(engine, reuse, decoder) -> None:
    _probe_engine(engine, probe_policy(engine.policy, backend="threads", hash_routing=True)).encode_with_bounds(
        probe_segments(), True)


def _processes(engine, reuse, decoder) -> None:
    _probe_engine(engine, probe_policy(engine.policy, backend="processes", hash_routing=False)).encode_with_bounds(
        probe_segments(), True)


def _agent_loop(engine, reuse, decoder) -> None:
    """Three turns of a conversation on a copy of ``reuse`` with a small cache: the second and third
    extend the one before, so they are encoded ahead while a helper (the Tokenizer's own helpers:
    parked on Linux) plans them; then one sent again (all cached)."""
    if reuse is None:
        return
    policy = probe_policy(reuse.policy, min_bytes_per_job=1 << 20, min_ahead_plan_chars=1, min_ahead_chars=1,
                          min_shared_bytes=1, shared_part_bytes=64, min_reused_ids=1, min_cached_call_chars=0)
    probe = copy.copy(reuse)
    probe.engine = _probe_engine(reuse.engine, policy)
    probe.policy = policy
    probe.cache = SegmentCache(1 << 22)
    probe.output_memory = OutputMemory(policy.min_reused_ids, policy.output_headroom)
    turn = probe_segments()
    for _ in range(3):
        probe.encode(turn, True)
        probe.encode(list(turn), True, want_ids=False)
        turn = turn + [(f"turn {len(turn)}: " + PROBE_TEXT[::-1], False), ("<|end_of_msg|>", True)]
    probe.encode([(text, flag) for text, flag in turn], True)


_PATHS: list[tuple[str, Callable]] = [
    ("short call", _short_call),
    ("shared parts", _shared_parts),
    ("agent loop", _agent_loop),
    ("groups and stages", _groups_and_stages),
    ("hash routing", _hash_routing),
    ("processes", _processes),
]
_done: set[tuple[str, str, bool]] = set()  # (path, pre-tokenizer kind, parked helpers) taken in this process
_lock = threading.Lock()
_background: list[threading.Thread] = []


def _paths_for(engine: Engine, reuse, every_path: bool) -> list[str]:
    """The paths a Tokenizer with this engine and reuse layer can take (its policy decides hash
    routing and processes; ``encode_with_bounds(n_jobs=...)`` can fan out whatever ``n_jobs`` is)."""
    policy = engine.policy
    names = ["short call", "shared parts" if engine.fuses else "groups and stages"]
    if reuse is not None and policy.n_jobs > 1:
        names.append("agent loop")
    names.append("groups and stages")
    if every_path or policy.hash_routing:
        names.append("hash routing")
    if every_path or policy.backend == "processes":
        names.append("processes")
    return list(dict.fromkeys(names))


def _take(names: list[str], engine: Engine, reuse, decoder) -> list[str]:
    """Take the paths ``names`` not taken yet in this process; returns those it took."""
    kind = PROBE_KINDS[0] if engine.fuses else PROBE_KINDS[1]
    parked = bool(reuse is not None and reuse.helpers.parked)
    taken = []
    for name, path in _PATHS:
        key = (name, kind, parked if name == "agent loop" else False)
        if name not in names or key in _done:
            continue
        with _lock:  # one thread takes a path at a time; the other finds it done
            if key in _done:
                continue
            path(engine, reuse, decoder)
            _done.add(key)
        taken.append(name)
    return taken


def warm_up(engine: Engine, reuse=None, decoder=None) -> None:
    """Make sure no call of a Tokenizer with these parts compiles a kernel later (see the module
    docstring): the short-call path now, the others now if that compiled anything, else on a
    background thread."""
    names = _paths_for(engine, reuse, every_path=False)
    compiled = len(jit.COMPILED)
    _take(names[:1], engine, reuse, decoder)
    if len(jit.COMPILED) > compiled:  # not cached: compile the rest now, while the notice is on screen
        _take(names, engine, reuse, decoder)
        return
    thread = threading.Thread(target=_take, args=(names, engine, reuse, decoder), name="kimi_tok-warm_up",
                              daemon=True)
    with _lock:
        _background[:] = [t for t in _background if t.is_alive()]
        _background.append(thread)
    thread.start()


def wait_for_background() -> None:
    """Wait for the background warm-ups started so far (a fork does: a child must not inherit
    numba's compiler lock held by a thread it does not have)."""
    for thread in list(_background):
        if thread is not threading.current_thread():
            thread.join()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=wait_for_background)


def warm_up_everything(tokenizers: Callable[[], list], *, processes: bool = True) -> dict:
    """Compile (or load) every kernel kimi_tok has a path to, for every kind of Tokenizer that
    ``tokenizers()`` makes (objects with ``engine``, ``_reuse`` and ``_decoder``: the facade's
    Tokenizers), plus those that read a vocabulary file and build its tables. Returns
    ``{"seconds", "compiled", "kernels", "cache"}``: wall time, kernels compiled (0: all were cached),
    kernels loaded or compiled in all, and where they are cached."""
    start = time.perf_counter()
    compiled = len(jit.COMPILED)
    vocabulary = parse_tiktoken_bpe(_TINY_MODEL, "warm-up vocabulary")  # reading a tiktoken file
    build_bpe_tables(vocabulary.token_bytes, vocabulary.token_offsets)  # a new vocabulary's tables
    wait_for_background()
    for tok in tokenizers():
        names = _paths_for(tok.engine, tok._reuse, every_path=True)
        if not processes:
            names.remove("processes")
        _take(names, tok.engine, tok._reuse, tok._decoder)
    wait_for_background()
    kernels = sum(len(d.overloads) for name, d in jit.KERNELS.items() if name.startswith("kimi_tok."))
    return {"seconds": time.perf_counter() - start, "compiled": len(jit.COMPILED) - compiled, "kernels": kernels,
            "cache": jit.cache_location()}
