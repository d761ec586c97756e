"""tiktoken-safe chunking: the cuts the official Python tokenizer makes before tiktoken.

Per segment (see ``../shared/kimi-k3/README.md``):

1. ``cut_chunks``: pieces of at most ``MAX_CHUNK_CHARS`` code points;
2. ``cut_substrings``: within a chunk, a cut before any character that would make a
   run of whitespace (Python ``str.isspace``) or of non-whitespace longer than
   ``MAX_RUN_CHARS``; that character starts the next sub-string as a run of 1.

Regex and BPE never cross a cut, so the cuts decide ids. Step 2 starts afresh in
every chunk, so chunks are independent units of work (``parallel.py`` hands them
to threads). Both kernels walk the UTF-8 buffer and report byte offsets.
"""

from __future__ import annotations

import numpy as np

from .jit import kernel, leaf
from .unicode_classes import PY_SPACE
from .utf8 import ASCII_END, code_point_at, sequence_length

MAX_CHUNK_CHARS = 400_000
MAX_RUN_CHARS = 25_000
CONTINUATION_MASK = 0xC0
CONTINUATION_BITS = 0x80  # bytes 10xxxxxx continue a code point


@leaf
def _total_bytes(starts, ends):
    total = 0
    for k in range(starts.shape[0]):
        total += ends[k] - starts[k]
    return total


@leaf
def _count_chars(buf, start, end):
    """Code points that start in ``buf[start:end]`` (a branch-free loop numba vectorizes)."""
    n = 0
    for i in range(start, end):
        n += (buf[i] & CONTINUATION_MASK) != CONTINUATION_BITS
    return n


@leaf
def _chunk_end(buf, start, end):
    """Byte offset of the ``MAX_CHUNK_CHARS + 1``-th code point from ``start``, or ``end``.

    A code point takes at least one byte, so the next ``need`` bytes hold at
    most ``need`` of the code points still wanted: count them and jump.
    """
    pos = start
    need = MAX_CHUNK_CHARS
    while need > 0:
        step = min(need, end - pos)
        if step == 0:
            return end
        need -= _count_chars(buf, pos, pos + step)
        pos += step
    while pos < end and (buf[pos] & CONTINUATION_MASK) == CONTINUATION_BITS:
        pos += 1
    return pos


@leaf
def _cut_chunks(buf, seg_start, seg_end, needs_cuts, chunk_start, chunk_end, chunk_segment):
    n = 0
    for s in range(seg_start.shape[0]):
        start = seg_start[s]
        end = seg_end[s]
        while start < end:
            stop = _chunk_end(buf, start, end) if needs_cuts[s] else end
            chunk_start[n], chunk_end[n], chunk_segment[n] = start, stop, s
            n += 1
            start = stop
    return n


@kernel
def cut_chunks(buf, seg_start, seg_end, needs_cuts):
    """Chunks ``(chunk_start, chunk_end, chunk_segment)`` of every non-empty segment.

    Segments without ``needs_cuts`` are one chunk each.
    """
    capacity = seg_start.shape[0] + _total_bytes(seg_start, seg_end) // MAX_CHUNK_CHARS + 1
    chunk_start = np.empty(capacity, dtype=np.int64)
    chunk_end = np.empty(capacity, dtype=np.int64)
    chunk_segment = np.empty(capacity, dtype=np.int64)
    n = _cut_chunks(buf, seg_start, seg_end, needs_cuts, chunk_start, chunk_end, chunk_segment)
    return chunk_start[:n], chunk_end[:n], chunk_segment[:n]


@leaf
def _cut_runs(buf, start, end, c, flags, sub_start, sub_end, sub_chunk, n):
    """Append the sub-strings of chunk ``c`` (``buf[start:end]``) cut at long runs; returns ``n``."""
    i = start
    run_length = 0
    run_is_space = (flags[code_point_at(buf, i)] & PY_SPACE) != 0
    while i < end:
        lead = buf[i]
        if lead < ASCII_END:
            is_space = (flags[lead] & PY_SPACE) != 0
            width = 1
        else:
            is_space = (flags[code_point_at(buf, i)] & PY_SPACE) != 0
            width = sequence_length(lead)
        if is_space != run_is_space:
            run_length = 1
            run_is_space = is_space
        else:
            run_length += 1
            if run_length > MAX_RUN_CHARS:
                sub_start[n], sub_end[n], sub_chunk[n] = start, i, c
                n += 1
                start = i
                run_length = 1
        i += width
    sub_start[n], sub_end[n], sub_chunk[n] = start, end, c
    return n + 1


@leaf
def _cut_all(buf, chunk_start, chunk_end, needs_cuts, flags, sub_start, sub_end, sub_chunk):
    n = 0
    for c in range(chunk_start.shape[0]):
        if needs_cuts[c]:
            n = _cut_runs(buf, chunk_start[c], chunk_end[c], c, flags, sub_start, sub_end, sub_chunk, n)
        else:
            sub_start[n], sub_end[n], sub_chunk[n] = chunk_start[c], chunk_end[c], c
            n += 1
    return n


@kernel
def cut_substrings(buf, chunk_start, chunk_end, needs_cuts, flags):
    """Sub-strings ``(sub_start, sub_end, sub_chunk)`` of non-empty chunks, cut at long runs."""
    capacity = chunk_start.shape[0] + _total_bytes(chunk_start, chunk_end) // MAX_RUN_CHARS + 1
    sub_start = np.empty(capacity, dtype=np.int64)
    sub_end = np.empty(capacity, dtype=np.int64)
    sub_chunk = np.empty(capacity, dtype=np.int64)
    n = _cut_all(buf, chunk_start, chunk_end, needs_cuts, flags, sub_start, sub_end, sub_chunk)
    return sub_start[:n], sub_end[:n], sub_chunk[:n]


def safe_substrings(buf, seg_start, seg_end, needs_cuts, flags):
    """Both steps at once: ``(sub_start, sub_end, sub_segment)`` of every non-empty segment."""
    chunk_start, chunk_end, chunk_segment = cut_chunks(buf, seg_start, seg_end, needs_cuts)
    sub_start, sub_end, sub_chunk = cut_substrings(buf, chunk_start, chunk_end, needs_cuts[chunk_segment], flags)
    return sub_start, sub_end, chunk_segment[sub_chunk]
