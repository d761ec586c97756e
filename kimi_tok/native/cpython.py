"""CPython's own objects read where CPython keeps them: a str's characters, a short call's segments.

Both readers rely on CPython's layout of tuples and compact strs (PEP 393), probed at import on objects
whose contents are known. Where a probe fails (another implementation, a free-threaded build, a layout
that changed) ``LAYOUT`` is None, ``str_characters`` answers None, and callers take the Python way.

* ``str_characters``: a str that is not ASCII as a NumPy array over its own storage, which
  ``pipeline.segments.utf8_of`` encodes in compiled code (docs/performance.md, "Packing from the str's own
  characters"); ``ascii_bytes``: an ASCII str's storage, which is its UTF-8, as a read-only array that
  ``utf8_of`` hands over without a copy.
* ``read_text_pairs`` (compiled): a tuple of ``(str, bool)`` pairs, checked and encoded to UTF-8 in one
  pass: a short call's segments without a Python step or a bytes object per segment (docs/performance.md,
  "Short calls read in compiled code").

Reading by address is safe while the caller holds the tuple: a tuple, its pairs and their strs never
change and the tuple keeps them alive, so the compiled reader may run without the GIL. It reads only what
is set when an object is made (its type, its size, a str's kind and characters), never what CPython fills
in later (a str's hash or cached UTF-8).
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

from .atomics import array_at
from .jit import index, kernel, leaf
from .utf8 import utf8_of_code_points

WORD = ctypes.sizeof(ctypes.c_void_p)
# A compact str: object header (reference count, type), length, hash, then ``state``, whose bits 2-4 hold the
# character width and bits 5 and 6 the compact and ASCII flags; the characters follow the header, which is
# shorter for an ASCII str (one 1-byte character and the terminating NUL after it, by ``sys.getsizeof``)
STATE_OFFSET = 2 * WORD + 2 * ctypes.sizeof(ctypes.c_ssize_t)
COMPACT, ASCII = 0x20, 0x40
ASCII_HEADER = sys.getsizeof("a") - 2
WIDE_HEADER = sys.getsizeof("\xe9") - 2
UNIT_TYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}
# LAYOUT, an int64 array the compiled reader takes: the addresses of the types and bools it compares with,
# then where a field is, in words from an object's start (a tuple's items, a str's length) or in bytes
TUPLE_TYPE, STR_TYPE, TRUE, FALSE, TYPE_WORD, SIZE_WORD, ITEMS_WORD, STATE_AT, ASCII_AT, WIDE_AT = range(10)
# read_text_pairs' status: read, or why not (the call is then packed from Python)
PAIRS_READ, NOT_PAIRS, TOO_LONG, LONE_SURROGATE = 0, 1, 2, 3
UTF8_ROOM = 64  # bytes past the end that utf8_of_code_points may write (a block of narrowed units)


def _words(obj: object, n: int):
    return (ctypes.c_int64 * n).from_address(id(obj))


def _layout() -> np.ndarray | None:
    """LAYOUT, when the probes below read what Python says these objects hold; else None."""
    if sys.implementation.name != "cpython":
        return None  # id() need not be an address there
    items = tuple.__basicsize__ // WORD
    layout = np.array([id(tuple), id(str), id(True), id(False), 1, 2, items, STATE_OFFSET, ASCII_HEADER,
                       WIDE_HEADER], dtype=np.int64)
    try:
        pair = ("".join(["pro", "be"]), False)
        words = _words(pair, items + 2)
        if (words[1], words[2], words[items], words[items + 1]) != (id(tuple), 2, id(pair[0]), id(False)):
            return None
        for text, width, codec in (("xyz" * 3, 1, "ascii"), ("\xe9xyz" * 3, 1, "latin-1"),
                                   ("\u0436xyz" * 3, 2, "utf-16-le"), ("\U0001f600xyz" * 3, 4, "utf-32-le")):
            words = _words(text, 3)
            state = ctypes.c_uint8.from_address(id(text) + STATE_OFFSET).value
            ascii_flag = ASCII if text.isascii() else 0
            header = ASCII_HEADER if ascii_flag else WIDE_HEADER
            if ((words[1], words[2]) != (id(str), len(text)) or state & (COMPACT | ASCII) != COMPACT | ascii_flag
                    or (state >> 2) & 7 != width
                    or ctypes.string_at(id(text) + header, len(text) * width) != text.encode(codec)):
                return None
    except (ValueError, OverflowError):
        return None
    return layout


LAYOUT = _layout()


def str_characters(text: str) -> np.ndarray | None:
    """A str's characters as an array over CPython's own storage (``uint8``, ``uint16`` or ``uint32``: no copy;
    valid while ``text`` lives), or None for an ASCII str (its bytes are its UTF-8), one that is not compact,
    or a Python whose layout was not recognised."""
    if LAYOUT is None:
        return None
    state = ctypes.c_uint8.from_address(id(text) + STATE_OFFSET).value
    width = (state >> 2) & 7
    if state & (COMPACT | ASCII) != COMPACT or width not in UNIT_TYPES:
        return None
    storage = (ctypes.c_char * (len(text) * width)).from_address(id(text) + WIDE_HEADER)
    return np.frombuffer(storage, dtype=UNIT_TYPES[width])


def ascii_bytes(text: str) -> np.ndarray | None:
    """An ASCII str's characters, which are its UTF-8, as a read-only ``uint8`` array over CPython's own storage
    (no copy; the array keeps ``text`` alive, as ``str.encode``'s bytes would keep themselves), or None for a str
    that is not compact ASCII or a Python whose layout was not recognised."""
    if LAYOUT is None:
        return None
    state = ctypes.c_uint8.from_address(id(text) + STATE_OFFSET).value
    if state & (COMPACT | ASCII) != COMPACT | ASCII:
        return None
    storage = (ctypes.c_char * len(text)).from_address(id(text) + ASCII_HEADER)
    storage.text = text  # the array's base holds the str: the storage lives as long as the array
    view = np.frombuffer(storage, dtype=np.uint8)
    view.flags.writeable = False  # a str never changes; the kernels take it as they take bytes
    return view


@leaf
def _pair_at(items, i, layout):
    """``(text, flag, length, state)`` of pair ``i`` (addresses, then the text's length and state byte), or
    ``text`` 0 when it is not an exact tuple of an exact str and a bool, or the str is not compact. An object's
    type is checked before any field past its header is read."""
    pair = array_at(items[index(i)], layout[ITEMS_WORD] + 2, np.int64)
    if pair[index(layout[TYPE_WORD])] != layout[TUPLE_TYPE] or pair[index(layout[SIZE_WORD])] != 2:
        return np.int64(0), np.int64(0), np.int64(0), np.int64(0)
    text = pair[index(layout[ITEMS_WORD])]
    flag = pair[index(layout[ITEMS_WORD] + 1)]
    head = array_at(text, layout[SIZE_WORD] + 1, np.int64)
    if head[index(layout[TYPE_WORD])] != layout[STR_TYPE] or (flag != layout[TRUE] and flag != layout[FALSE]):
        return np.int64(0), np.int64(0), np.int64(0), np.int64(0)
    state = np.int64(array_at(text + layout[STATE_AT], 1, np.uint8)[0])
    if state & COMPACT == 0:
        return np.int64(0), np.int64(0), np.int64(0), np.int64(0)
    return text, flag, head[index(layout[SIZE_WORD])], state


@kernel
def read_text_pairs(address, n, layout, max_chars, max_bytes):
    """``(buf, seg_start, seg_end, allow_special, status)`` of the tuple of ``n`` pairs at ``address``: each str's
    UTF-8 back to back in ``buf``, where each starts and ends, and each flag. ``status`` is ``PAIRS_READ``, or
    (the arrays then empty) ``NOT_PAIRS`` for anything but exact tuples of an exact str and a bool,
    ``TOO_LONG`` past ``max_chars`` characters or ``max_bytes`` bytes, ``LONE_SURROGATE``."""
    items = array_at(address + WORD * layout[ITEMS_WORD], n, np.int64)
    n_chars = 0
    for i in range(n):
        text, _, length, _ = _pair_at(items, i, layout)
        if text == 0:
            return _declined(NOT_PAIRS)
        n_chars += length
        if n_chars > max_chars:  # a long call of many segments is declined without reading them all
            return _declined(TOO_LONG)
    buf = np.empty(4 * n_chars + UTF8_ROOM, dtype=np.uint8)
    seg_start = np.empty(n, dtype=np.int64)
    seg_end = np.empty(n, dtype=np.int64)
    allow_special = np.empty(n, dtype=np.bool_)
    at = 0
    for i in range(n):
        text, flag, length, state = _pair_at(items, i, layout)
        seg_start[i] = at
        allow_special[i] = flag == layout[TRUE]
        width = (state >> 2) & 7
        if state & ASCII:
            chars = array_at(text + layout[ASCII_AT], length, np.uint8)
            for k in range(length):
                buf[index(at + k)] = chars[index(k)]
            at += length
        else:
            if width == 1:
                written = utf8_of_code_points(array_at(text + layout[WIDE_AT], length, np.uint8), buf[at:])
            elif width == 2:
                written = utf8_of_code_points(array_at(text + layout[WIDE_AT], length, np.uint16), buf[at:])
            else:
                written = utf8_of_code_points(array_at(text + layout[WIDE_AT], length, np.uint32), buf[at:])
            if written < 0:
                return _declined(LONE_SURROGATE)
            at += written
        seg_end[i] = at
    if at >= max_bytes:
        return _declined(TOO_LONG)
    return buf[:at], seg_start, seg_end, allow_special, PAIRS_READ


@kernel
def _declined(status):
    return (np.empty(0, dtype=np.uint8), np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
            np.empty(0, dtype=np.bool_), status)
