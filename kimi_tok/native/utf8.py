"""UTF-8 helpers for kernels that walk code points in a byte buffer.

Most buffers come from ``str.encode("utf-8")``, so they are valid UTF-8 and ``code_point_at`` checks
nothing; ``well_formed_code_point_at`` is for bytes from elsewhere (``encode_bytes``).
"""

from __future__ import annotations

import numpy as np

from .jit import index, leaf

CONTINUATION_MASK = 0x3F
TWO_BYTE_LEAD = 0xE0  # leads below this (and >= 0x80) start 2-byte sequences
THREE_BYTE_LEAD = 0xF0
ASCII_END = 0x80
CONTINUATION_END = 0xC0  # continuation bytes are 0x80..0xBF
FOUR_BYTE_END = 0xF8  # no UTF-8 sequence starts with a byte from here on
SHORTEST_CODE_POINT = (0, 0, 0x80, 0x800, 0x10000)  # by sequence length: below it the sequence is overlong


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


@leaf
def well_formed_code_point_at(buf, i, width):
    """The code point of the ``width`` bytes at ``i`` when they are its shortest UTF-8 encoding, else -1."""
    lead = buf[index(i)]
    if lead >= FOUR_BYTE_END:
        return np.int64(-1)
    for k in range(1, width):
        byte = buf[index(i + k)]
        if byte < ASCII_END or byte >= CONTINUATION_END:
            return np.int64(-1)
    cp = code_point_at(buf, i)
    if width > 1 and cp < SHORTEST_CODE_POINT[width]:
        return np.int64(-1)
    return cp
