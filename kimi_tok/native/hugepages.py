"""Tables in transparent huge pages: fewer TLB misses when text the caches have not seen is encoded.

The BPE tables (~26 MB), each piece cache's short table (32 MB) and the scanner's code-point table (1 MB)
are probed at random. On 4 KB pages they span ~11,000 pages, far more than a core's TLB
holds: once a serving stack has done other work between two calls (parsed a request, run a
garbage collection), most probes of a new turn's text also walk the page tables. Laid out in
one anonymous mapping advised ``MADV_HUGEPAGE``, they take a few dozen 2 MB pages where the
kernel's transparent huge pages are in ``madvise`` or ``always`` mode. Measured on the agent
loop's last turn (2-core dev machine): encoding its new text after the other encoder's call
and a collection, it took less time (docs/agent-loops.md).

Where ``mmap`` has no ``MADV_HUGEPAGE`` (Windows, macOS) arrays are plain NumPy arrays.
"""

from __future__ import annotations

import mmap
from collections.abc import Sequence

import numpy as np

HUGE_PAGE_BYTES = 2 << 20  # x86-64 and most arm64 kernels; elsewhere the advice only aligns the arrays
ARRAY_ALIGNMENT = 64  # every array starts on a cache line


def _supported() -> bool:
    return all(hasattr(mmap, name) for name in ("MADV_HUGEPAGE", "MAP_PRIVATE", "MAP_ANONYMOUS"))


def empty_in_huge_pages(layout: Sequence[tuple[tuple[int, ...] | int, np.dtype]]) -> list[np.ndarray]:
    """Uninitialized C-contiguous arrays of the given ``(shape, dtype)``, back to back in one private
    anonymous mapping advised for transparent huge pages (plain ``np.empty`` arrays where there is
    no such advice). A page is only backed by memory once written; the arrays keep the mapping."""
    if not _supported():
        return [np.empty(shape, dtype=dtype) for shape, dtype in layout]
    sizes = [int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize for shape, dtype in layout]
    offsets = []
    total = 0
    for n_bytes in sizes:
        total = -(-total // ARRAY_ALIGNMENT) * ARRAY_ALIGNMENT
        offsets.append(total)
        total += n_bytes
    # one huge page more than needed, so that the arrays can start on a huge-page boundary
    size = (-(-max(total, 1) // HUGE_PAGE_BYTES) + 1) * HUGE_PAGE_BYTES
    try:
        memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except OSError:  # no mapping to be had (a limit on mappings or address space): plain arrays
        return [np.empty(shape, dtype=dtype) for shape, dtype in layout]
    try:
        memory.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages: still a mapping, on small pages
        pass
    raw = np.frombuffer(memory, dtype=np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE_BYTES
    arrays = []
    for (shape, dtype), offset, n_bytes in zip(layout, offsets, sizes):
        arrays.append(raw[start + offset:start + offset + n_bytes].view(dtype).reshape(shape))
    return arrays


def zeros_in_huge_pages(layout: Sequence[tuple[tuple[int, ...] | int, np.dtype]]) -> list[np.ndarray]:
    """``empty_in_huge_pages``, zeroed: a fresh anonymous mapping reads as zeros already, so no page is
    written (nor backed by memory) until used; the plain-array fallback is zeroed."""
    arrays = empty_in_huge_pages(layout)
    if not _supported() or any(not isinstance(a.base, np.ndarray) for a in arrays):
        for array in arrays:
            array.fill(0)
    return arrays


def in_huge_pages(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Copies of ``arrays`` in huge pages (``empty_in_huge_pages``)."""
    copies = empty_in_huge_pages([(array.shape, array.dtype) for array in arrays])
    for copy, array in zip(copies, arrays):
        copy[...] = array
    return copies
