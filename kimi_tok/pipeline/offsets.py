"""Token offsets: the code-point span of each id in the text it was encoded from.

An id's bytes are known (``Decoder.all_bytes``), and an encoding's ids hold the text's UTF-8
back to back, so the spans follow from one pass over the ids: count the UTF-8 lead bytes
(every byte but ``10xxxxxx``) of each id (``OffsetTables``, once per vocabulary) and add
them up. A token that starts or ends inside a multi-byte character gets that whole
character's span, as Hugging Face ``tokenizers`` gives it. No Python object per id.

Lone surrogates: the encoder fixes them up per tiktoken-safe sub-string
(``segments.fix_surrogates``); a surrogate pair becomes one character, which is two code
points of the caller's ``str``. Such characters are listed (``wide_characters``, a slow path
taken only when the count of characters shows one) and count two.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ..native.jit import kernel
from .chunking import cut_safe_substrings
from .segments import fix_surrogates

CONTINUATION_MASK = 0xC0
CONTINUATION = 0x80
SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
NO_WIDE = np.zeros(0, dtype=np.int64)


class OffsetTables(NamedTuple):
    """Per id, ``(characters that start in its bytes) << 1 | (its first byte is a continuation
    byte)``: one small array (uint16 where it fits: 320 KB for K3), probed once per token."""

    per_id: np.ndarray


@kernel
def count_leads(all_bytes, all_offsets):
    """``(leads, starts_inside)`` of every id of a vocabulary (``Decoder.all_bytes``/``all_offsets``)."""
    n = all_offsets.shape[0] - 1
    leads = np.zeros(n, dtype=np.int64)
    starts_inside = np.zeros(n, dtype=np.int64)
    for t in range(n):
        start = all_offsets[t]
        end = all_offsets[t + 1]
        count = 0
        for k in range(start, end):
            if (all_bytes[k] & CONTINUATION_MASK) != CONTINUATION:
                count += 1
        leads[t] = count
        if end > start and (all_bytes[start] & CONTINUATION_MASK) == CONTINUATION:
            starts_inside[t] = 1
    return leads, starts_inside


def offset_tables(all_bytes: np.ndarray, all_offsets: np.ndarray) -> OffsetTables:
    """The ``OffsetTables`` of a vocabulary (a few ms, once: ``Decoder.offset_tables``)."""
    leads, starts_inside = count_leads(all_bytes, all_offsets)
    per_id = (leads << 1) | starts_inside
    small = per_id.max(initial=0) <= np.iinfo(np.uint16).max
    return OffsetTables(per_id.astype(np.uint16) if small else per_id)  # small: it stays in cache after an encode


@kernel
def character_spans(ids, per_id, wide):
    """``(spans, n_characters)``: ``spans[i]`` is id ``i``'s ``[start, end)`` in characters of the
    concatenated bytes, where the characters at the (sorted) indices ``wide`` count two. An id
    that starts inside a character starts where that character starts (0 if none came before:
    tiktoken's ``decode_with_offsets``)."""
    n = ids.shape[0]
    spans = np.empty((n, 2), dtype=np.int64)
    n_wide = wide.shape[0]
    chars = 0  # characters started so far
    wide_before_start = 0
    wide_before_end = 0
    for i in range(n):
        entry = np.int64(per_id[ids[i]])
        first = chars - 1 if (entry & 1) and chars > 0 else chars
        end = chars + (entry >> 1)
        while wide_before_start > 0 and wide[wide_before_start - 1] >= first:  # only after an empty id
            wide_before_start -= 1
        while wide_before_start < n_wide and wide[wide_before_start] < first:
            wide_before_start += 1
        while wide_before_end < n_wide and wide[wide_before_end] < end:
            wide_before_end += 1
        spans[i, 0] = first + wide_before_start
        spans[i, 1] = end + wide_before_end
        chars = end
    return spans, chars


def substrings_as_given(text: str, tiktoken_safe: bool, flags: np.ndarray) -> list[str]:
    """The tiktoken-safe sub-strings of a text holding lone surrogates, as the caller's code points
    (the encoder fixes each one up on its own: ``segments.pack_segments``)."""
    if not tiktoken_safe:
        return [text]
    raw = text.encode("utf-8", "surrogatepass")
    buf = np.frombuffer(raw, dtype=np.uint8)
    bounds = np.array([0, len(raw)], dtype=np.int64)
    starts, ends, _ = cut_safe_substrings(buf, bounds[:1], bounds[1:], np.ones(1, dtype=np.bool_), flags)
    return [raw[s:e].decode("utf-8", "surrogatepass") for s, e in zip(starts.tolist(), ends.tolist())]


def wide_characters(segments: Sequence[tuple[str, bool]], tiktoken_safe: bool, flags: np.ndarray) -> np.ndarray:
    """Indices, among the characters the encoder saw, of those made from a surrogate pair."""
    wide: list[int] = []
    seen = 0  # characters before this segment
    for text, _ in segments:
        if not SURROGATE_PAIR.search(text):
            seen += len(text)
            continue
        for sub in substrings_as_given(text, tiktoken_safe, flags):
            pairs = [m.start() for m in SURROGATE_PAIR.finditer(sub)]
            wide += [seen + at - k for k, at in enumerate(pairs)]
            seen += len(sub) - len(pairs)
            assert len(fix_surrogates(sub)) == len(sub) - len(pairs)
    return np.array(wide, dtype=np.int64)


def token_spans(tables: OffsetTables, ids: np.ndarray, segments: Sequence[tuple[str, bool]], tiktoken_safe: bool,
                flags: np.ndarray) -> np.ndarray:
    """The ``(n, 2)`` int64 code-point spans of ``ids`` (the encoding of validated ``segments``)
    into ``"".join(text for text, _ in segments)``.

    >>> segments = [("<|open|>", True), ("héllo", False)]
    >>> token_spans(tok._decoder.offset_tables, tok.encode_to_numpy(segments), segments, True, flags).tolist()
    [[0, 8], [8, 9], [9, 11], [11, 13]]
    """
    spans, n_chars = character_spans(ids, tables.per_id, NO_WIDE)
    if n_chars != sum(len(text) for text, _ in segments):  # surrogate pairs became one character each
        spans, _ = character_spans(ids, tables.per_id, wide_characters(segments, tiktoken_safe, flags))
    return spans


def token_starts(tables: OffsetTables, ids: np.ndarray) -> np.ndarray:
    """Where each id starts, in characters of the ids' bytes decoded (tiktoken's ``decode_with_offsets``)."""
    return character_spans(ids, tables.per_id, NO_WIDE)[0][:, 0]
