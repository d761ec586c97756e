"""Many prompts in one call (``Tokenizer.encode_batch``): items spread over threads.

Every item is validated first, so a bad one raises (naming ``items[i]`` and its segment)
before any work. Then, for a tokenizer with a segment cache, each item long enough to use it
(``Policy.min_cached_call_chars``) goes through the cache as its own call (``encode_each``): items long enough to fan out on their own
(``fans_out``) are encoded one after another by this thread, each over the engine's pool as
a single call would be; the others are taken one at a time, in order, by this thread and
``n_jobs - 1`` batch workers (an item runs the compiled stages without the GIL, so one
worker packs its next item while another encodes). Without a segment cache there is nothing
to look up per item (nor for the items too short to use the cache): consecutive items are
encoded as one engine call of all their segments
(``encode_in_groups``, up to ``GROUP_CHARS`` of text each), which shares its parts over the
threads, and the ids are cut back into items. Segments are encoded each on its own, so
either way an item's ids are those of ``encode_segments``.

The batch workers are threads of their own, not the engine's pool: an item that fans out
after all (its UTF-8 is longer than its characters suggest) waits on the engine's pool, so
a pool thread must never be the one waiting.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..pipeline.segments import validate_segments
from .engine import Engine
from .policy import Policy
from .threads import GrowingPool

Segments = list[tuple[str, bool]]
GROUP_CHARS = 1 << 22  # text per engine call of a batch without a cache (its output is 4 bytes per byte)

_workers = GrowingPool("kimi_tok_batch")


def batch_workers(n_workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of batch workers, grown on demand and kept warm between calls."""
    return _workers.get(n_workers)


def validate_items(items: Sequence, allow_special: bool) -> list[Segments]:
    """``items`` as lists of ``(str, bool)`` segments: a ``str`` item is one segment with
    ``allow_special``. ``TypeError``/``ValueError`` name the item (and its segment).

    >>> validate_items(["hi", [("<|sep|>", True)]], False)
    [[('hi', False)], [('<|sep|>', True)]]
    """
    if not isinstance(allow_special, (bool, np.bool_)):
        raise TypeError(f"allow_special must be a bool, not {type(allow_special).__name__}")
    allow_special = bool(allow_special)
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"items must be a list or tuple of texts or segment lists, not {type(items).__name__}")
    checked: list[Segments] = []
    for i, item in enumerate(items):
        if isinstance(item, str):
            checked.append([(str.__str__(item), allow_special)])  # a subclass's text, as a plain str
            continue
        if isinstance(item, (bytes, bytearray)) or not isinstance(item, Sequence):
            raise TypeError(f"items[{i}] must be a str or a list of (text, allow_special) segments, "
                            f"not {type(item).__name__}")
        try:
            checked.append(validate_segments(item))
        except (TypeError, ValueError) as e:
            raise type(e)(f"items[{i}]: {e}") from None
    return checked


def fans_out(n_chars: int, policy: Policy, fuses: bool) -> bool:
    """Whether a call of ``n_chars`` characters surely fans out over threads on its own
    (``Engine.encode_packed``: from twice the per-job minimum of bytes; a character is at
    least one byte)."""
    if policy.n_jobs == 1:
        return False
    if policy.backend != "threads":
        return n_chars >= 2 * policy.min_bytes_per_process_job
    shares_parts = fuses and not policy.hash_routing
    return n_chars >= 2 * (policy.min_bytes_per_shared_job if shares_parts else policy.min_bytes_per_job)


def encode_items(run: Callable, items: list[Segments], tiktoken_safe: bool, engine: Engine,
                 cached: bool) -> list[np.ndarray]:
    """The ids of each of ``items`` (validated), in item order: ``encode_each`` through ``run``
    (a Tokenizer's path to its segment cache) when ``cached``, else ``encode_in_groups``."""
    if not cached:
        return encode_in_groups(engine, items, tiktoken_safe)
    limit = engine.policy.min_cached_call_chars  # shorter items skip the cache as calls: encoded in groups
    short = [i for i, item in enumerate(items) if sum(len(text) for text, _ in item) < limit]
    if not short:
        return encode_each(lambda item: run(item, tiktoken_safe, True).ids, items, engine.policy, engine.fuses)
    results: list = [None] * len(items)
    for i, ids in zip(short, encode_in_groups(engine, [items[i] for i in short], tiktoken_safe)):
        results[i] = ids
    rest = [i for i in range(len(items)) if results[i] is None]
    for i, ids in zip(rest, encode_each(lambda item: run(item, tiktoken_safe, True).ids, [items[i] for i in rest],
                                        engine.policy, engine.fuses)):
        results[i] = ids
    return results


def encode_in_groups(engine: Engine, items: list[Segments], tiktoken_safe: bool) -> list[np.ndarray]:
    """Consecutive items as one engine call each (up to ``GROUP_CHARS``, or one longer item), the
    ids cut back into items (views of the call's array)."""
    sizes = [sum(len(text) for text, _ in item) for item in items]
    results: list[np.ndarray] = []
    start = 0
    while start < len(items):
        end, chars = start + 1, sizes[start]
        while end < len(items) and chars + sizes[end] <= GROUP_CHARS:
            chars += sizes[end]
            end += 1
        group = items[start:end]
        ids, bounds = engine.encode_with_bounds([segment for item in group for segment in item], tiktoken_safe,
                                                validated=True)
        cuts = bounds[np.cumsum([0] + [len(item) for item in group])].tolist()
        results += [ids[a:b] for a, b in zip(cuts[:-1], cuts[1:])]
        start = end
    return results


def encode_each(encode: Callable[[Segments], np.ndarray], items: list[Segments], policy: Policy,
                fuses: bool) -> list[np.ndarray]:
    """``[encode(item) for item in items]``: long items first, on this thread; the others shared
    with up to ``n_jobs - 1`` batch workers. In item order."""
    results: list[np.ndarray | None] = [None] * len(items)
    short: list[int] = []
    for i, item in enumerate(items):
        if fans_out(sum(len(text) for text, _ in item), policy, fuses):
            results[i] = encode(item)
        else:
            short.append(i)
    n_workers = min(policy.n_jobs, len(short)) - 1
    if n_workers <= 0:
        for i in short:
            results[i] = encode(items[i])
        return results  # type: ignore[return-value]
    claims = itertools.count()  # next() on a count is atomic under the GIL
    stop = threading.Event()  # an item raised (or Ctrl-C here): the others take no more items

    def work() -> None:
        try:
            while not stop.is_set():
                k = next(claims)
                if k >= len(short):
                    return
                results[short[k]] = encode(items[short[k]])
        except BaseException:
            stop.set()
            raise

    helpers = [batch_workers(n_workers).submit(work) for _ in range(n_workers)]
    try:
        work()
    finally:
        for helper in helpers:  # every item taken is done (or has raised) once its worker returns
            if not helper.cancel():
                helper.exception()
    for helper in helpers:
        if not helper.cancelled() and helper.exception() is not None:
            raise helper.exception()
    return results  # type: ignore[return-value]
