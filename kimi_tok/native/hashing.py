"""Open-addressing hash tables over NumPy arrays, shared by the compiled stages.

Keys are byte spans of a ``uint8`` buffer (vocabulary tokens, special tokens,
pieces of the input) or packed integers (token pairs). Tables are power-of-two
sized with linear probing; ``EMPTY`` marks a free slot. Plain arrays keep the
tables picklable, memory-mappable and usable from ``nogil`` kernels.
"""

from __future__ import annotations

import numpy as np

from . import atomics
from .jit import index, kernel, leaf

EMPTY = -1
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
MIX_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio


def table_size_for(n_keys: int) -> int:
    """A power of two with room for ``n_keys`` at a load factor of at most 1/2."""
    size = 16
    while size < 2 * n_keys:
        size *= 2
    return size


@leaf
def mix64(h):
    """Spread the bits of a 64-bit value so the low bits index a table well."""
    h = (h ^ (h >> np.uint64(33))) * MIX_MULTIPLIER
    return h ^ (h >> np.uint64(29))


@leaf
def hash_span(buf, start, end):
    """A hash of ``buf[start:end]``: eight bytes at a time (unaligned loads) multiplied in, then the
    last bytes and the length, finished with ``mix64``."""
    h = FNV_OFFSET
    i = start
    while i + 8 <= end:
        h = (h ^ atomics.load_u64(buf, i)) * MIX_MULTIPLIER
        i += 8
    tail = np.uint64(end - start) << np.uint64(56)
    for k in range(end - i):
        tail ^= np.uint64(buf[index(i + k)]) << np.uint64(8 * k)
    return mix64((h ^ tail) * FNV_PRIME)


@leaf
def spans_equal(a_buf, a_start, b_buf, b_start, length):
    """Whether ``a_buf[a_start:a_start + length]`` equals ``b_buf[b_start:b_start + length]``: eight
    bytes at a time, then byte by byte."""
    k = 0
    while k + 8 <= length:
        if atomics.load_u64(a_buf, a_start + k) != atomics.load_u64(b_buf, b_start + k):
            return False
        k += 8
    while k < length:
        if a_buf[index(a_start + k)] != b_buf[index(b_start + k)]:
            return False
        k += 1
    return True


@kernel
def build_span_table(key_bytes, key_offsets, n_slots):
    """Slots holding the index of each key ``key_bytes[key_offsets[i]:key_offsets[i+1]]``.

    Returns ``(slots, duplicate)``: ``duplicate`` is the index of the first key
    equal to an earlier one, or -1.
    """
    slots = np.full(n_slots, EMPTY, dtype=np.int32)
    mask = n_slots - 1
    n_keys = key_offsets.shape[0] - 1
    for key in range(n_keys):
        start = key_offsets[key]
        length = key_offsets[key + 1] - start
        slot = np.int64(hash_span(key_bytes, start, start + length) & np.uint64(mask))
        while slots[slot] != EMPTY:
            other = slots[slot]
            o_start = key_offsets[other]
            if key_offsets[other + 1] - o_start == length and spans_equal(
                key_bytes, o_start, key_bytes, start, length
            ):
                return slots, key
            slot = (slot + 1) & mask
        slots[slot] = key
    return slots, -1


@leaf
def find_span(slots, key_bytes, key_offsets, buf, start, end, h):
    """Index of the key equal to ``buf[start:end]`` (hash ``h``), or ``EMPTY``."""
    mask = slots.shape[0] - 1
    length = end - start
    slot = np.int64(h & np.uint64(mask))
    while True:
        key = slots[index(slot)]
        if key == EMPTY:
            return EMPTY
        k_start = key_offsets[index(key)]
        if key_offsets[index(key + 1)] - k_start == length and spans_equal(
            key_bytes, k_start, buf, start, length
        ):
            return key
        slot = (slot + 1) & mask


@leaf
def int_slot(key, mask):
    return np.int64(mix64(np.uint64(key)) & np.uint64(mask))
