"""UTF-8 helpers for kernels that walk code points in a byte buffer.

The buffers come from ``str.encode("utf-8")``, so they are valid UTF-8: no
checks are repeated here.
"""

from __future__ import annotations

import numpy as np

from .jit import index, leaf

CONTINUATION_MASK = 0x3F
TWO_BYTE_LEAD = 0xE0  # leads below this (and >= 0x80) start 2-byte sequences
THREE_BYTE_LEAD = 0xF0
ASCII_END = 0x80


@leaf
def sequence_length(lead):
    if lead < ASCII_END:
        return 1
    if lead < TWO_BYTE_LEAD:
        return 2
    if lead < THREE_BYTE_LEAD:
        return 3
    return 4


@leaf
def code_point_at(buf, i):
    """The code point starting at byte ``i``."""
    lead = np.int64(buf[index(i)])
    if lead < ASCII_END:
        return np.int64(lead)
    if lead < TWO_BYTE_LEAD:
        return ((lead & 0x1F) << 6) | (buf[index(i + 1)] & CONTINUATION_MASK)
    if lead < THREE_BYTE_LEAD:
        return ((lead & 0x0F) << 12) | ((buf[index(i + 1)] & CONTINUATION_MASK) << 6) | (
            buf[index(i + 2)] & CONTINUATION_MASK
        )
    return (
        ((lead & 0x07) << 18)
        | ((buf[index(i + 1)] & CONTINUATION_MASK) << 12)
        | ((buf[index(i + 2)] & CONTINUATION_MASK) << 6)
        | (buf[index(i + 3)] & CONTINUATION_MASK)
    )
