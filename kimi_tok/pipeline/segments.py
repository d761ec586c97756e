"""Segments -> one UTF-8 byte buffer plus per-segment offsets and flags.

A prompt is an ordered list of ``(text, allow_special)`` segments, each encoded on
its own. Packing them in one pass lets every later stage run as one compiled
call over the whole prompt.

A short call is not packed here: its compiled call reads the segments where CPython keeps them
(``native.cpython.read_text_pairs``), with no Python step per segment and no NumPy call on the way
(docs/performance.md, "Short calls with cold caches", "Short calls read in compiled code"). A longer
one is packed by the same reader, called once from here; the Python way (``utf8_of`` per text, then
one join) is for calls it cannot read and for the longest calls, whose texts are transcoded on
threads.

Text with lone surrogates cannot be UTF-8 encoded. tiktoken retries such text as
``text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")`` for each
string it is given, i.e. per tiktoken-safe sub-string. Those (rare) segments are
cut here with the same compiled chunking, fixed up per sub-string, and packed as
already-cut pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from ..native.cpython import LAYOUT, PAIRS_READ, ascii_bytes, read_text_pairs, str_characters
from ..native.jit import kernel
from ..native.utf8 import utf8_of_code_points
from .chunking import cut_safe_substrings


# A long str of 2- or 4-byte characters is encoded by a compiled loop that reads the characters where CPython
# keeps them, without the GIL: a tenth to a fifth of the time of CPython's UTF-8 encoder where it is mostly ASCII,
# about as fast where it is not (docs/performance.md, "Packing from the str's own characters"). Others take
# str.encode: ASCII (a copy already) and 1-byte characters.
TRANSCODED_MIN_CHARS = 1 << 14  # its fixed cost (~6 us a call) is then below str.encode's
READ_LIMIT = 1 << 62  # read_text_pairs' character and byte limits where a whole call is packed: none


class PackedSegments(NamedTuple):
    buf: np.ndarray  # uint8, the UTF-8 text of every segment back to back
    seg_start: np.ndarray  # int64 byte offsets
    seg_end: np.ndarray  # int64
    allow_special: np.ndarray  # bool
    needs_cuts: np.ndarray  # bool: apply tiktoken-safe chunking in the compiled stage
    origin: np.ndarray  # int64: index of the caller's segment each packed entry came from
    n_segments: int  # the caller's segment count


def _flag(value, name: str, where: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{where}: {name} must be a bool, not {type(value).__name__}")


def _segment(seg, index: int) -> tuple[str, bool]:
    where = f"segment {index}"
    if not isinstance(seg, (tuple, list)) or len(seg) != 2:
        raise TypeError(f"{where} must be a (text, allow_special) pair, not {type(seg).__name__}"
                        + (f" of length {len(seg)}" if isinstance(seg, (tuple, list)) else ""))
    text, allow = seg
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be a str, not {type(text).__name__}")
    if type(text) is not str:
        # A subclass's characters, as a plain str: its own __eq__, encode or __len__ never decide
        # which ids it gets (the segment cache compares texts; packing encodes them).
        text = str.__str__(text)
    return text, _flag(allow, "allow_special", where)


UTF8_PER_UNIT = {1: 2, 2: 3, 4: 4}  # the most UTF-8 bytes one character of that width takes


def utf8_of(text: str) -> bytes | np.ndarray:
    """``text.encode("utf-8")``, as bytes or a read-only ``uint8`` array (a long ASCII str's own storage, or its
    characters transcoded); ``UnicodeEncodeError`` for lone surrogates.

    >>> bytes(utf8_of("h\u00e9llo " * 10_000)) == ("h\u00e9llo " * 10_000).encode()
    True
    """
    if len(text) < TRANSCODED_MIN_CHARS:
        return text.encode("utf-8")
    if text.isascii():
        in_place = ascii_bytes(text)  # its bytes are its UTF-8: no copy (about 0.1 ms a MB)
        return text.encode("utf-8") if in_place is None else in_place
    units = str_characters(text)
    if units is None:
        return text.encode("utf-8")
    out = np.empty(UTF8_PER_UNIT[units.itemsize] * units.shape[0] + 64, dtype=np.uint8)
    n = utf8_of_code_points(units, out)  # ``units`` is read while ``text`` is alive, here
    if n < 0:
        return text.encode("utf-8")  # raises at the lone surrogate
    out.resize((n,), refcheck=False)  # gives back the room longer characters would have taken, without a copy
    out.flags.writeable = False  # read-only as str.encode's bytes are: the kernels compiled for those take it
    return out


def fix_surrogates(text: str) -> str:
    """tiktoken's fix-up: pair up surrogates, replace lone ones with U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _surrogate_substrings(text: str, tiktoken_safe: bool, flags: np.ndarray) -> list[bytes]:
    raw = text.encode("utf-8", "surrogatepass")
    if not tiktoken_safe:
        return [fix_surrogates(text).encode("utf-8")]
    buf = np.frombuffer(raw, dtype=np.uint8)
    bounds = np.array([0, len(raw)], dtype=np.int64)
    starts, ends, _ = cut_safe_substrings(buf, bounds[:1], bounds[1:], np.ones(1, dtype=np.bool_), flags)
    return [
        fix_surrogates(raw[s:e].decode("utf-8", "surrogatepass")).encode("utf-8")
        for s, e in zip(starts.tolist(), ends.tolist())
    ]


def count_chars(segments) -> int | None:
    """The characters of a list or tuple of ``(text, flag)`` pairs, counted without a Python step per
    segment and before validation (the size that decides how a call runs); None for anything else."""
    if type(segments) is not list and type(segments) is not tuple:
        return None
    try:
        return sum(map(len, map(itemgetter(0), segments)))
    except (TypeError, IndexError, KeyError):
        return None


def validate_segments(segments: Sequence) -> list[tuple[str, bool]]:
    """``segments`` as a list of ``(str, bool)``; ``TypeError`` names a bad segment's index."""
    if isinstance(segments, (str, bytes)) or not isinstance(segments, Sequence):
        raise TypeError(
            "segments must be a list or tuple of (text, allow_special) pairs, not "
            + type(segments).__name__
        )
    for seg in segments:  # the common case, checked without a call per segment
        if type(seg) is not tuple or len(seg) != 2 or type(seg[0]) is not str or type(seg[1]) is not bool:
            return [_segment(seg, index) for index, seg in enumerate(segments)]
    return segments if isinstance(segments, list) else list(segments)


def pack_segments(
    segments: Sequence, tiktoken_safe: bool, flags: np.ndarray, validated: bool = False,
    utf8: Callable[[list[str]], list] | None = None,
) -> PackedSegments:
    """Validate ``segments`` (unless ``validated``) and pack them; ``TypeError`` names a bad index.
    ``utf8``: what makes each text's ``utf8_of`` (the engine's makes long calls' on two threads); without
    it the texts are read in one compiled pass (``_read_in_place``) where they can be."""
    if not validated:
        segments = validate_segments(segments)
    if utf8 is None:
        packed = _read_in_place(segments, tiktoken_safe)
        if packed is not None:
            return packed
    try:  # the common case: no surrogates, one packed entry per segment
        chunks = [utf8_of(text) for text, _ in segments] if utf8 is None else utf8([text for text, _ in segments])
    except UnicodeEncodeError:
        return _pack_with_surrogates(segments, tiktoken_safe, flags)
    n = len(segments)
    return _packed(chunks, np.fromiter(map(itemgetter(1), segments), dtype=np.bool_, count=n),
                   np.full(n, tiktoken_safe, dtype=np.bool_), np.arange(n, dtype=np.int64), n)


def _read_in_place(segments: list[tuple[str, bool]], tiktoken_safe: bool) -> PackedSegments | None:
    """Validated ``segments`` packed by one compiled pass over the texts where CPython keeps them
    (``native.cpython.read_text_pairs``: no Python step, bytes object or copy per segment); None where
    that reader cannot read them (not CPython, lone surrogates, a str it does not know)."""
    if LAYOUT is None:
        return None
    pairs = tuple(segments)  # the reader walks a tuple's items; this holds them while it reads
    n = len(pairs)
    buf, seg_start, seg_end, allow_special, status = read_text_pairs(id(pairs), n, LAYOUT, READ_LIMIT, READ_LIMIT)
    if status != PAIRS_READ:
        return None
    buf.flags.writeable = False  # as the other ways pack (bytes, a str's storage): the kernels compiled for those
    return PackedSegments(buf, seg_start, seg_end, allow_special, np.full(n, tiktoken_safe, dtype=np.bool_),
                          np.arange(n, dtype=np.int64), n)


def _pack_with_surrogates(segments: list[tuple[str, bool]], tiktoken_safe: bool, flags: np.ndarray) -> PackedSegments:
    """Segments with lone surrogates cut into tiktoken-safe sub-strings, each fixed up on its own."""
    chunks: list[bytes] = []
    allow: list[bool] = []
    cut: list[bool] = []
    origin: list[int] = []
    for index, (text, allow_special) in enumerate(segments):
        try:
            chunks.append(text.encode("utf-8"))
            allow.append(allow_special)
            cut.append(tiktoken_safe)
            origin.append(index)
        except UnicodeEncodeError:
            for sub in _surrogate_substrings(text, tiktoken_safe, flags):
                chunks.append(sub)
                allow.append(allow_special)
                cut.append(False)
                origin.append(index)
    return _packed(chunks, np.array(allow, dtype=np.bool_), np.array(cut, dtype=np.bool_),
                   np.array(origin, dtype=np.int64), len(segments))


def _packed(chunks: list[bytes | np.ndarray], allow: np.ndarray, cut: np.ndarray, origin: np.ndarray,
            n_segments: int) -> PackedSegments:
    lengths = np.fromiter(map(len, chunks), dtype=np.int64, count=len(chunks))
    seg_end = np.cumsum(lengths)
    if len(chunks) == 1 and isinstance(chunks[0], np.ndarray):
        buf = chunks[0]  # one transcoded text: no copy
    else:
        buf = np.frombuffer(b"".join(chunks), dtype=np.uint8)
    return PackedSegments(buf, seg_end - lengths, seg_end, allow, cut, origin, n_segments)


@kernel
def bounds_by_segment(seg_end, origin, n_segments, unit_start, unit_out_end):
    """Where each of the caller's ``n_segments`` segments starts and ends in the ids
    (``n_segments + 1`` offsets), from units of text in order (runs or sub-strings, each inside
    one packed segment): unit ``u`` starts at byte ``unit_start[u]`` and its ids end at
    ``unit_out_end[u]``. ``seg_end`` and ``origin``: the packed segments' ends and callers' indices."""
    bounds = np.zeros(n_segments + 1, dtype=np.int64)
    packed = 0
    done = 0
    for u in range(unit_start.shape[0]):
        while packed < seg_end.shape[0] - 1 and seg_end[packed] <= unit_start[u]:
            packed += 1
        bounds[origin[packed] + 1] += unit_out_end[u] - done
        done = unit_out_end[u]
    for i in range(n_segments):
        bounds[i + 1] += bounds[i]
    return bounds


def segment_bounds(packed: PackedSegments, run_start: np.ndarray, run_out_end: np.ndarray) -> np.ndarray:
    """Where each of the caller's segments starts and ends in the ids (``n_segments + 1`` offsets)."""
    return bounds_by_segment(packed.seg_end, packed.origin, packed.n_segments, run_start, run_out_end)
