"""tiktoken-safe chunking: the cuts the official Python tokenizer makes before tiktoken.

Per segment (see ``../shared/kimi-k3/README.md``):

1. ``cut_chunks``: pieces of at most ``MAX_CHUNK_CHARS`` code points;
2. ``cut_substrings``: within a chunk, a cut before any character that would make a
   run of whitespace (Python ``str.isspace``) or of non-whitespace longer than
   ``MAX_RUN_CHARS``; that character starts the next sub-string as a run of 1.

Regex and BPE never cross a cut, so the cuts decide ids. Step 2 starts afresh in
every chunk, so chunks are independent units of work (the engine hands them
to threads). Both kernels walk the UTF-8 buffer and report byte offsets.
"""

from __future__ import annotations

import numpy as np

from ..native.jit import index, kernel, leaf
from ..native.utf8 import ASCII_END, code_point_at, sequence_length
from .pretokenize.unicode_classes import PY_SPACE

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
    # unsigned (jit.index): with a signed index numba's wraparound kept the loop from vectorizing (5 vs 38 GB/s)
    for i in range(index(start), index(end)):
        n += (buf[i] & CONTINUATION_MASK) != CONTINUATION_BITS
    return n


@leaf
def _chunk_end(buf, start, end):
    """Byte offset of the ``MAX_CHUNK_CHARS + 1``-th code point from ``start``, or ``end``.

    A code point takes at least one byte, so the next ``need`` bytes hold at
    most ``need`` of the code points still wanted: count them and jump.
    """
    if end - start <= MAX_CHUNK_CHARS:  # a code point takes a byte or more: no more than the limit
        return end
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
def _is_space(buf, i, flags):
    return (flags[code_point_at(buf, i)] & PY_SPACE) != 0


@leaf
def _previous_char(buf, i):
    """Start of the code point that ends just before byte ``i``."""
    i -= 1
    while (buf[i] & CONTINUATION_MASK) == CONTINUATION_BITS:
        i -= 1
    return i


@leaf
def _char_boundary_at_or_after(buf, i, end):
    while i < end and (buf[i] & CONTINUATION_MASK) == CONTINUATION_BITS:
        i += 1
    return i


@leaf
def _walk_runs(buf, i, stop, c, flags, start, run_length, run_is_space, sub_start, sub_end, sub_chunk, n):
    """Character by character over ``buf[i:stop]``: the exact rule, cutting where a run
    would exceed ``MAX_RUN_CHARS``. Returns the new ``(start, run_length, run_is_space, n)``."""
    while i < stop:
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
    return start, run_length, run_is_space, n


# Lead bytes of the non-ASCII characters Python's ``str.isspace`` accepts (U+0085, U+00A0, U+1680,
# U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000); checked against the flags in the tests.
SPACE_LEAD_BYTES = (0xC2, 0xE1, 0xE2, 0xE3)


@leaf
def _has_no_space(buf, start, stop, flags):
    """Whether no whitespace character starts in ``buf[start:stop]``: one pass over the bytes that
    decodes only characters whose lead byte can start a non-ASCII space (``SPACE_LEAD_BYTES``)."""
    for i in range(start, stop):
        byte = buf[index(i)]
        if byte < ASCII_END:
            if (flags[index(byte)] & PY_SPACE) != 0:
                return False
        elif (byte == SPACE_LEAD_BYTES[0] or byte == SPACE_LEAD_BYTES[1] or byte == SPACE_LEAD_BYTES[2]
              or byte == SPACE_LEAD_BYTES[3]) and _is_space(buf, i, flags):
            return False
    return True


@leaf
def _skip_window(buf, i, stop, flags, run_length, run_is_space):
    """Try to cross ``buf[i:stop]`` (fewer than ``MAX_RUN_CHARS`` bytes) without walking it.

    If the window changes kind at least once and the run carried into it ends
    before reaching ``MAX_RUN_CHARS``, no cut can fall inside it: every later
    run in it is shorter than the window. Then only the run that reaches
    ``stop`` matters, found by walking back from ``stop``. A window that never
    changes kind (text without spaces: CJK, base64) only lengthens the carried
    run (text without spaces is checked a byte at a time, not decoded). Returns
    ``(crossed, run_length, run_is_space)``.
    """
    if not run_is_space and _has_no_space(buf, i, stop, flags):
        carried = run_length + _count_chars(buf, i, stop)
        if carried > MAX_RUN_CHARS:
            return False, run_length, run_is_space
        return True, carried, run_is_space
    j = i
    carried = run_length
    while j < stop and _is_space(buf, j, flags) == run_is_space:
        carried += 1
        if carried > MAX_RUN_CHARS:
            return False, run_length, run_is_space
        j += sequence_length(buf[j])
    if j == stop:  # walked already: crossing it saves walking it again
        return True, carried, run_is_space
    last_kind = _is_space(buf, _previous_char(buf, stop), flags)
    q = stop
    trailing = 0
    while q > j:
        p = _previous_char(buf, q)
        if _is_space(buf, p, flags) != last_kind:
            break
        trailing += 1
        q = p
    return True, trailing, last_kind


SKIP_WINDOW_BYTES = 4096  # well below MAX_RUN_CHARS, so no run fits inside one window


@leaf
def _cut_runs(buf, start, end, c, flags, sub_start, sub_end, sub_chunk, n):
    """Append the sub-strings of chunk ``c`` (``buf[start:end]``) cut at long runs; returns ``n``.

    Ordinary text changes kind every few characters, so windows are crossed by
    ``_skip_window`` without looking at most of their bytes; a window it cannot
    cross (a long run, a possible cut) is walked exactly.
    """
    if end - start <= MAX_RUN_CHARS:  # too few bytes for a run over the limit: no cut
        sub_start[n], sub_end[n], sub_chunk[n] = start, end, c
        return n + 1
    i = start
    run_length = 0
    run_is_space = _is_space(buf, i, flags)
    while i < end:
        stop = _char_boundary_at_or_after(buf, min(i + SKIP_WINDOW_BYTES, end), end)
        crossed, new_length, new_kind = _skip_window(buf, i, stop, flags, run_length, run_is_space)
        if crossed:
            run_length, run_is_space = new_length, new_kind
        else:
            start, run_length, run_is_space, n = _walk_runs(
                buf, i, stop, c, flags, start, run_length, run_is_space, sub_start, sub_end, sub_chunk, n
            )
        i = stop
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


def cut_safe_substrings(buf, seg_start, seg_end, needs_cuts, flags):
    """Both steps at once: ``(sub_start, sub_end, sub_segment)`` of every non-empty segment."""
    chunk_start, chunk_end, chunk_segment = cut_chunks(buf, seg_start, seg_end, needs_cuts)
    sub_start, sub_end, sub_chunk = cut_substrings(buf, chunk_start, chunk_end, needs_cuts[chunk_segment], flags)
    return sub_start, sub_end, chunk_segment[sub_chunk]
