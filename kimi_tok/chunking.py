"""tiktoken-safe chunking: the cuts the official Python tokenizer makes before tiktoken.

Per segment (see ``../shared/kimi-k3/README.md``):

1. pieces of at most ``MAX_CHUNK_CHARS`` code points;
2. within a piece, a cut before any character that would make a run of
   whitespace (Python ``str.isspace``) or of non-whitespace longer than
   ``MAX_RUN_CHARS``; that character starts the next sub-string as a run of 1.

Regex and BPE never cross a cut, so the cuts decide ids. The kernel walks code
points of the UTF-8 buffer and reports sub-strings as byte offsets.
"""

from __future__ import annotations

import numpy as np

from .jit import kernel, leaf
from .unicode_classes import PY_SPACE
from .utf8 import ASCII_END, code_point_at, sequence_length

MAX_CHUNK_CHARS = 400_000
MAX_RUN_CHARS = 25_000


@leaf
def _max_substrings(seg_start, seg_end):
    total_bytes = 0
    for s in range(seg_start.shape[0]):
        total_bytes += seg_end[s] - seg_start[s]
    return seg_start.shape[0] + total_bytes // MAX_RUN_CHARS + 1


@leaf
def _cut_segment(buf, start, end, s, flags, sub_start, sub_end, sub_segment, n):
    """Append the tiktoken-safe sub-strings of segment ``s`` (``buf[start:end]``); returns ``n``."""
    i = start
    chars_in_chunk = MAX_CHUNK_CHARS  # forces a fresh chunk at the first character
    run_length = 0
    run_is_space = False
    while i < end:
        lead = buf[i]
        if lead < ASCII_END:
            is_space = (flags[lead] & PY_SPACE) != 0
            width = 1
        else:
            is_space = (flags[code_point_at(buf, i)] & PY_SPACE) != 0
            width = sequence_length(lead)
        if chars_in_chunk == MAX_CHUNK_CHARS:
            if i > start:
                sub_start[n], sub_end[n], sub_segment[n] = start, i, s
                n += 1
                start = i
            chars_in_chunk = 0
            run_length = 0
            run_is_space = is_space
        if is_space != run_is_space:
            run_length = 1
            run_is_space = is_space
        else:
            run_length += 1
            if run_length > MAX_RUN_CHARS:
                sub_start[n], sub_end[n], sub_segment[n] = start, i, s
                n += 1
                start = i
                run_length = 1
        chars_in_chunk += 1
        i += width
    sub_start[n], sub_end[n], sub_segment[n] = start, end, s
    return n + 1


@leaf
def _cut_all(buf, seg_start, seg_end, needs_cuts, flags, sub_start, sub_end, sub_segment):
    n = 0
    for s in range(seg_start.shape[0]):
        start = seg_start[s]
        end = seg_end[s]
        if start == end:
            continue
        if needs_cuts[s]:
            n = _cut_segment(buf, start, end, s, flags, sub_start, sub_end, sub_segment, n)
        else:
            sub_start[n], sub_end[n], sub_segment[n] = start, end, s
            n += 1
    return n


@kernel
def cut_substrings(buf, seg_start, seg_end, needs_cuts, flags):
    """Sub-strings ``(sub_start, sub_end, sub_segment)`` of every non-empty segment."""
    capacity = _max_substrings(seg_start, seg_end)
    sub_start = np.empty(capacity, dtype=np.int64)
    sub_end = np.empty(capacity, dtype=np.int64)
    sub_segment = np.empty(capacity, dtype=np.int64)
    n = _cut_all(buf, seg_start, seg_end, needs_cuts, flags, sub_start, sub_end, sub_segment)
    return sub_start[:n], sub_end[:n], sub_segment[:n]
