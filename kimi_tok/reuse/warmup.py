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
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

from ..engine.engine import Engine
from ..engine.policy import MAX_COMPILE_JOBS, Policy, usable_cores
from ..engine.short_calls import ShortCallHelper, shares_short_calls
from ..native import jit
from ..pipeline.bpe import build_bpe_tables, grown_piece_cache, new_piece_cache
from ..pipeline.decode import Decoder
from ..pipeline.offsets import token_spans
from ..pipeline.segments import TRANSCODED_MIN_CHARS, utf8_of
from ..vocab import parse_tiktoken_bpe
from .encode_ahead import OutputMemory
from .segment_cache import SegmentCache

__all__ = ["warm_up", "warm_up_everything", "warm_up_all", "KernelBuild", "starts_cold", "kernels_cached",
           "wait_for_background", "start_background", "probe_segments", "probe_policy"]

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
                    min_bytes_per_job=1, min_bytes_per_process_job=1, unit_bytes=64, merge_slice_bytes=256,
                    min_shared_short_call_bytes=1, short_call_part_bytes=64, max_shared_in_place_chars=1 << 20)
    settings.update(changes)
    return policy.replace(**settings)


def _probe_engine(engine: Engine, policy: Policy) -> Engine:
    probe = copy.copy(engine)  # shares the stages (tables, piece caches): only the policy differs ...
    probe.policy = policy
    probe._worker_spec = None
    probe.short_call_helper = None  # ... and no short call is shared (but in _shared_parts, with a helper of its own)
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
    for wide in ("\xe9", "\u0436", "\U0001f600"):  # long strs of 1-, 2- and 4-byte characters, mostly ASCII
        utf8_of(wide + "x" * TRANSCODED_MIN_CHARS)
    if decoder is not None:
        decoder.decode_bytes(ids)
        # offsets (``return_offsets``) on a decoder of byte tokens: the same kernels without building the
        # vocabulary's offset tables, which only a call that asks for offsets needs
        text = "héllo 🙂 wörld"
        tiny = Decoder(parse_tiktoken_bpe(_TINY_MODEL, "warm-up vocabulary"), {}, decoder.tables)
        byte_ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(ids.dtype)
        token_spans(tiny.offset_tables, byte_ids, [(text, False)], True, engine.flags)


def _shared_parts(engine, reuse, decoder) -> None:
    probe = _probe_engine(engine, probe_policy(engine.policy, backend="threads", hash_routing=False))
    probe.encode_with_bounds(probe_segments(), True)
    if shares_short_calls(probe.policy, probe.fuses):  # short calls shared with a helper of the probe's own
        helper = probe.short_call_helper = ShortCallHelper(probe.stages, probe.policy, probe.splits_after_newline)
        helper.start()
        try:
            for _ in range(2):
                probe.encode(probe_segments(), True)
            shared = probe.shared_in_place_ids(probe_segments(), True)  # as the segment cache's fresh calls take it
            if shared is not None:
                shared[2]()  # the regather the store makes on a helper thread: loaded here, not compiled there
        finally:
            helper.close()


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
_done: set[str] = set()  # path_key of the paths taken in this process
_lock = threading.Lock()
_background: list[threading.Thread] = []


def paths_for(policy: Policy, fuses: bool, with_reuse: bool, every_path: bool = False) -> list[str]:
    """The paths a Tokenizer with this policy can take (``fuses``: its pattern is the Kimi scanner's;
    ``with_reuse``: it has a segment cache), by name; ``encode_with_bounds(n_jobs=...)`` can fan out
    whatever ``n_jobs`` is."""
    names = ["short call", "shared parts" if fuses else "groups and stages"]
    if with_reuse and policy.n_jobs > 1:
        names.append("agent loop")
    names.append("groups and stages")
    if every_path or policy.hash_routing:
        names.append("hash routing")
    if every_path or policy.backend == "processes":
        names.append("processes")
    return list(dict.fromkeys(names))


def path_key(name: str, fuses: bool, parked: bool) -> str:
    """How a path is known in ``_done`` and in the record of cached paths (``jit.cached_paths``): its
    name, the pre-tokenizer kind, and for the agent loop whether its helpers are parked."""
    kind = PROBE_KINDS[0] if fuses else PROBE_KINDS[1]
    return f"{kind}:{name}" + (":parked" if name == "agent loop" and parked else "")


def kernels_cached(policy: Policy, fuses: bool, with_reuse: bool) -> bool:
    """Whether a process recorded every kernel of such a Tokenizer's paths as cached for this
    package, numba and CPU (``jit.cached_paths``): then making one loads them, else compiles them."""
    parked = with_reuse and policy.parked_helpers
    cached = jit.cached_paths()
    return all(path_key(name, fuses, parked) in cached for name in paths_for(policy, fuses, with_reuse))


def _paths_for(engine: Engine, reuse, every_path: bool) -> list[str]:
    return paths_for(engine.policy, engine.fuses, reuse is not None, every_path)


def _take(names: list[str], engine: Engine, reuse, decoder) -> list[str]:
    """Take the paths ``names`` not taken yet in this process; returns those it took."""
    parked = bool(reuse is not None and reuse.helpers.parked)
    taken = []
    for name, path in _PATHS:
        key = path_key(name, engine.fuses, parked)
        if name not in names or key in _done:
            continue
        with _lock:  # one thread takes a path at a time; the other finds it done
            if key in _done:
                continue
            path(engine, reuse, decoder)
            _done.add(key)
        jit.record_cached_paths([key])
        taken.append(name)
    return taken


def warm_up(engine: Engine, reuse=None, decoder=None) -> None:
    """Make sure no call of a Tokenizer with these parts compiles a kernel later (see the module
    docstring): the short-call path now, the others now if that compiled anything, else on a
    background thread."""
    if os.environ.get(jit.WORKER_ENV):
        return  # a process of ``warm_up_all`` takes the paths of its share only
    names = _paths_for(engine, reuse, every_path=False)
    compiled = len(jit.COMPILED)
    _take(names[:1], engine, reuse, decoder)
    if len(jit.COMPILED) > compiled:  # not cached: compile the rest now, while the notice is on screen
        _take(names, engine, reuse, decoder)
        return
    start_background(_take_in_background, (names, engine, reuse, decoder), "kimi_tok-warm_up")


def _take_in_background(names: list[str], engine: Engine, reuse, decoder) -> None:
    """``_take`` on a background thread. Once the main thread has ended (a short script, a command-line error)
    the interpreter is shutting down and the pools refuse new work: the paths left are not taken, silently."""
    try:
        _take(names, engine, reuse, decoder)
    except Exception:
        if threading.main_thread().is_alive():
            raise


def start_background(target: Callable, args: tuple, name: str) -> threading.Thread:
    """Run ``target(*args)`` on a daemon thread that loads kernels: ``wait_for_background`` (and a fork) waits for it."""
    thread = threading.Thread(target=target, args=args, name=name, daemon=True)
    with _lock:
        _background[:] = [t for t in _background if t.is_alive()]
        _background.append(thread)
    thread.start()
    return thread


def wait_for_background() -> None:
    """Wait for the background warm-ups started so far (a fork does: a child must not inherit
    numba's compiler lock held by a thread it does not have)."""
    for thread in list(_background):
        if thread is not threading.current_thread():
            thread.join()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=wait_for_background)


def warm_up_everything(tokenizers: Callable[[], list], *, processes: bool = True, part: tuple[int, int] = (0, 1)) -> dict:
    """Compile (or load) every kernel kimi_tok has a path to, for every kind of Tokenizer that
    ``tokenizers()`` makes (objects with ``engine``, ``_reuse`` and ``_decoder``: the facade's
    Tokenizers), plus those that read a vocabulary file and build its tables. ``part=(k, n)``
    takes the k-th of n shares only (``warm_up_all``): share 0 holds what a default
    Tokenizer needs, the other paths go round the others. Returns ``{"seconds", "compiled",
    "kernels", "cache"}``: wall time, kernels compiled (0: all were cached), kernels loaded or
    compiled in all, and where they are cached."""
    start = time.perf_counter()
    compiled = len(jit.COMPILED)
    index, count = part
    if index == 0:
        vocabulary = parse_tiktoken_bpe(_TINY_MODEL, "warm-up vocabulary")  # reading a tiktoken file
        build_bpe_tables(vocabulary.token_bytes, vocabulary.token_offsets)  # a new vocabulary's tables
    wait_for_background()
    shared = 0
    for position, tok in enumerate(tokenizers()):
        first = paths_for(tok.engine.policy, tok.engine.fuses, tok._reuse is not None) if position == 0 else []
        names = [name for name in _paths_for(tok.engine, tok._reuse, every_path=True)
                 if processes or name != "processes"]
        mine = []
        for name in names:
            if name in first:
                owner = 0
            else:
                owner, shared = (1 + shared % (count - 1) if count > 1 else 0), shared + 1
            if owner == index:
                mine.append(name)
        _take(mine, tok.engine, tok._reuse, tok._decoder)
    wait_for_background()
    kernels = sum(len(d.overloads) for name, d in jit.KERNELS.items() if name.startswith("kimi_tok."))
    return {"seconds": time.perf_counter() - start, "compiled": len(jit.COMPILED) - compiled, "kernels": kernels,
            "cache": jit.cache_location()}


def warm_up_all(tokenizers: Callable[[], list], *, processes: bool = True, jobs: int | None = None,
                part: tuple[int, int] | None = None) -> dict:
    """``warm_up_everything`` in ``jobs`` processes at once (default: the cores, at most
    ``MAX_COMPILE_JOBS``): this one takes share 0, the others the rest; then everything once more in
    this process, which loads what they cached and compiles what they missed. ``part=(k, n)``:
    share k of n only (what the other processes run: ``kimi-tok warmup --part k/n``)."""
    start = time.perf_counter()
    with _as_warm_up_process():
        if part is not None:
            return warm_up_everything(tokenizers, processes=processes, part=part)
        workers = _start_shares(jobs or min(MAX_COMPILE_JOBS, usable_cores()), processes)
        try:
            done = warm_up_everything(tokenizers, processes=processes, part=(0, len(workers) + 1))
        finally:
            shares = _finish_shares(workers)
        if workers:
            compiled = done["compiled"] + sum(share["compiled"] for share in shares)
            done = warm_up_everything(tokenizers, processes=processes)
            done["compiled"] += compiled
        return {**done, "seconds": time.perf_counter() - start, "processes": len(workers) + 1}


@contextlib.contextmanager
def _as_warm_up_process():
    """This process takes the paths of ``warm_up_everything`` itself: its Tokenizers neither start a
    build of their own nor take their paths when made (``jit.WORKER_ENV``)."""
    saved = os.environ.get(jit.WORKER_ENV)
    os.environ[jit.WORKER_ENV] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(jit.WORKER_ENV, None)
        else:
            os.environ[jit.WORKER_ENV] = saved


def _start_shares(jobs: int, processes: bool) -> list[subprocess.Popen]:
    """Processes taking shares 1..jobs-1 of ``warm_up_everything`` (``python -m kimi_tok warmup
    --part k/jobs``). Two processes that save one kernel's index at once can lose an entry: the
    last pass of ``warm_up_all`` compiles it again."""
    command = [sys.executable, "-m", "kimi_tok", "warmup"] + ([] if processes else ["--no-processes"])
    env = {**os.environ, jit.WORKER_ENV: "1"}
    return [subprocess.Popen([*command, "--part", f"{k}/{jobs}"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            for k in range(1, jobs)]


def _finish_shares(workers: list[subprocess.Popen]) -> list[dict]:
    """Wait for the share processes; their results (``warm_up_everything``'s), or ``RuntimeError``
    with the end of its output if one failed."""
    results = []
    for worker in workers:
        out, err = worker.communicate()
        if worker.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-5:]
            raise RuntimeError(f"a kernel-compiling process failed (exit code {worker.returncode}): "
                               + " / ".join(tail))
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    return results


# A build in a process group of its own keeps compiling when Ctrl-C stops the process that started it
# (Python 3.11+; on 3.10 it stops too, and the next process starts it again).
_OWN_PROCESS_GROUP = {"process_group": 0} if sys.version_info >= (3, 11) else {}


class KernelBuild:
    """Every kernel compiled into numba's cache by worker processes (``python -m kimi_tok warmup``),
    while this process goes on: it never holds the GIL to compile. One build at a time per
    process, shared by the Tokenizers that wait for it; it finishes even if this process ends."""

    _current: "KernelBuild | None" = None
    _lock = threading.Lock()

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.output = tempfile.TemporaryFile()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kimi_tok", "warmup", "--jobs", str(jobs)], stdin=subprocess.DEVNULL,
            stdout=self.output, stderr=subprocess.STDOUT, env={**os.environ, jit.WORKER_ENV: "1"},
            **_OWN_PROCESS_GROUP)  # not stopped by Ctrl-C meant for this process

    @classmethod
    def started(cls, jobs: int) -> "KernelBuild":
        """The build under way, else a new one."""
        with cls._lock:
            if cls._current is None or cls._current.process.poll() is not None:
                cls._current = cls(jobs)
            return cls._current

    def wait_until(self, cached: Callable[[], bool], poll_seconds: float = 0.25) -> bool:
        """Wait until ``cached()`` holds or the build ends; returns ``cached()``."""
        while not cached():
            try:
                self.process.wait(poll_seconds)
            except subprocess.TimeoutExpired:
                continue
            return cached()
        return True

    def failed(self) -> bool:
        """Whether the build ended with an error (else it ended well, or is still running)."""
        return self.process.poll() not in (None, 0)

    def failure(self) -> str:
        """The end of the build's output, to say why it did not cache the kernels."""
        self.output.seek(0)
        lines = self.output.read().decode("utf-8", "replace").strip().splitlines()
        return " / ".join(lines[-5:]) or f"exit code {self.process.poll()}"


def starts_cold(policy: Policy, fuses: bool, with_reuse: bool) -> bool:
    """Whether a Tokenizer with this policy should answer with the interpreted engine while worker
    processes compile its kernels (``Policy.cold_start``): they are not cached yet, and the
    processes' work would be (numba can save kernels here)."""
    return (policy.cold_start == "background" and not os.environ.get(jit.WORKER_ENV)
            and not kernels_cached(policy, fuses, with_reuse) and jit.caches_kernels())  # (this imports numba)


def build_kernels_first(policy: Policy, fuses: bool, with_reuse: bool) -> None:
    """With ``cold_start="wait"``: a Tokenizer whose kernels are not cached has worker processes
    compile them before it goes on (``compile_jobs`` cores at once instead of one)."""
    if (policy.cold_start != "wait" or os.environ.get(jit.WORKER_ENV) or kernels_cached(policy, fuses, with_reuse)
            or not jit.caches_kernels()):
        return
    jit.announce_compile(policy.compile_jobs)
    KernelBuild.started(policy.compile_jobs).wait_until(lambda: kernels_cached(policy, fuses, with_reuse))
