"""UTF-8 helpers for kernels that walk code points in a byte buffer.

Most buffers come from ``str.encode("utf-8")``, so they are valid UTF-8 and ``code_point_at`` checks
nothing; ``well_formed_code_point_at`` is for bytes from elsewhere (``encode_bytes``).
"""

from __future__ import annotations

import numpy as np

from .jit import index, kernel, leaf
from .simd import BLOCK_BYTES, UTF8_BLOCK_UNITS, has_byte_compress, lowest_set_bit, narrowed_block, utf8_block

CONTINUATION_MASK = 0x3F
TWO_BYTE_LEAD = 0xE0  # leads below this (and >= 0x80) start 2-byte sequences
THREE_BYTE_LEAD = 0xF0
ASCII_END = 0x80
CONTINUATION_END = 0xC0  # continuation bytes are 0x80..0xBF
FOUR_BYTE_END = 0xF8  # no UTF-8 sequence starts with a byte from here on
SHORTEST_CODE_POINT = (0, 0, 0x80, 0x800, 0x10000)  # by sequence length: below it the sequence is overlong
HIGH_SURROGATE, SURROGATE_END = 0xD800, 0xE000


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


@kernel
def utf8_of_code_points(units, out):
    """The UTF-8 of code points (``uint8``, ``uint16`` or ``uint32``, as a str of 1-, 2- or 4-byte characters
    stores them) written to ``out`` (at least ``4 * len(units) + 64`` bytes, ``2 * len(units) + 64`` for
    ``uint8``); returns its length, or -1 at a surrogate (which UTF-8 cannot encode). Runs of ASCII go 64
    bytes of units at a time (``simd.narrowed_block``). After a character that is not ASCII: where the CPU has
    a vector byte compress (``simd.has_byte_compress``), 16 characters at a time (``simd.utf8_block``) until a
    block of them is all ASCII; elsewhere one by one up to the next ASCII character, so a run of other
    characters is not looked at a block at a time for each of them."""
    n = units.shape[0]
    lanes = BLOCK_BYTES // units.itemsize
    i = 0
    j = 0
    while i < n:
        if i + lanes <= n:
            high = narrowed_block(units, i, out, j)
            if high == 0:
                i += lanes
                j += lanes
                continue
            ascii_run = lowest_set_bit(high)  # those bytes are stored already
            i += ascii_run
            j += ascii_run
        if has_byte_compress():
            # blocks of 16 characters while they hold some that are not ASCII
            while i + UTF8_BLOCK_UNITS <= n:
                written = utf8_block(units, i, out, j)
                if written < 0:
                    return np.int64(-1)
                i += UTF8_BLOCK_UNITS
                j += written
                if written == UTF8_BLOCK_UNITS:
                    break  # all ASCII: 64 bytes of units at a time again
            if i + UTF8_BLOCK_UNITS <= n:
                continue
        while i < n:
            cp = np.int64(units[index(i)])
            i += 1
            if cp < ASCII_END:
                out[index(j)] = cp
                j += 1
                if i + lanes <= n:
                    break  # blocks again
            elif cp < 0x800:
                out[index(j)] = 0xC0 | (cp >> 6)
                out[index(j + 1)] = 0x80 | (cp & CONTINUATION_MASK)
                j += 2
            elif cp < 0x10000:
                if HIGH_SURROGATE <= cp < SURROGATE_END:
                    return np.int64(-1)
                out[index(j)] = 0xE0 | (cp >> 12)
                out[index(j + 1)] = 0x80 | ((cp >> 6) & CONTINUATION_MASK)
                out[index(j + 2)] = 0x80 | (cp & CONTINUATION_MASK)
                j += 3
            else:
                out[index(j)] = 0xF0 | (cp >> 18)
                out[index(j + 1)] = 0x80 | ((cp >> 12) & CONTINUATION_MASK)
                out[index(j + 2)] = 0x80 | ((cp >> 6) & CONTINUATION_MASK)
                out[index(j + 3)] = 0x80 | (cp & CONTINUATION_MASK)
                j += 4
    return np.int64(j)
