"""Exact reuse of segment ids across calls (agent loops re-send the same prefix every turn).

The reference encodes every segment on its own, so a segment's ids depend only on
``(text, allow_special, tiktoken_safe)``: reuse is exact, not approximate. The key
is that tuple itself in a dict, so a hit compares the full text (Python's ``str``
equality) and can never return the ids of a different text; the text's hash is
computed by Python once per ``str`` object and cached on it.

Memory is bounded by a byte budget (text + ids + a fixed overhead per entry) with
least-recently-used eviction; a lock makes it safe for concurrent callers (the
encoding of misses happens outside the lock).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

import numpy as np

DEFAULT_BUDGET_BYTES = 256 << 20
MIN_CACHED_CHARS = 256  # shorter segments are cheaper to encode again than to look up and store
ENTRY_OVERHEAD_BYTES = 200  # dict slot, key tuple, array header

Key = tuple[str, bool, bool]


def check_segment_cache_bytes(value) -> None:
    """``segment_cache_bytes`` is None or a non-negative int (0 and None: no cache)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"segment_cache_bytes must be a non-negative int or None, not {value!r}")


class SegmentCache:
    """``(text, allow_special, tiktoken_safe) -> uint32 ids``, LRU within ``budget_bytes``.

    >>> cache = SegmentCache(budget_bytes=1 << 20)
    >>> cache.put(("x" * 300, False, True), np.arange(3, dtype=np.uint32))
    >>> cache.get(("x" * 300, False, True))
    array([0, 1, 2], dtype=uint32)
    """

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
            raise ValueError(f"budget_bytes must be a non-negative int, not {budget_bytes!r}")
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[Key, tuple[np.ndarray, int]] = OrderedDict()  # key -> (ids, bytes)
        self._used = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def cacheable(text: str) -> bool:
        return len(text) >= MIN_CACHED_CHARS

    @staticmethod
    def entry_bytes(key: Key, ids: np.ndarray) -> int:
        return sys.getsizeof(key[0]) + ids.nbytes + ENTRY_OVERHEAD_BYTES

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Key) -> np.ndarray | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: Key, ids: np.ndarray) -> None:
        """Store a private read-only copy of ``ids``; entries larger than the budget are not kept."""
        size = self.entry_bytes(key, ids)
        if size > self.budget_bytes:
            return
        stored = np.array(ids, dtype=np.uint32, copy=True)
        stored.setflags(write=False)
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = (stored, size)  # one write: an interrupt cannot split an entry
            self._used += size
            while self._used > self.budget_bytes and self._entries:
                _, (_, old_size) = self._entries.popitem(last=False)
                self._used -= old_size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._used = 0
