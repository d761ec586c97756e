"""Character starts: a merge may begin from each character's own encoding instead of its bytes.

BPE starts a piece from single bytes; in Chinese text most merges only rebuild characters from
their UTF-8 bytes (three bytes, two merges, four pair look-ups each). ``char_starts[cp]`` gives
the ids BPE makes of code point ``cp``'s bytes alone (one or two tokens) where starting from them
gives the same ids as starting from the bytes, or the ids of a stage of that merge (below);
elsewhere 0, and the character starts as bytes.

Why it is exact. Write ``solo(c)`` for the ids BPE makes of character ``c`` alone and
``lastrank(c)`` for the highest rank among those ids (every merge on ``c`` alone makes a token of
at most that rank, since a token ranks above the two it is merged from: checked for the
vocabulary, else nothing starts early). Merges happen only along a token's own split
(``tables``), so a merge that reaches into ``c`` before ``c`` is whole joins a part of ``c``
(a proper suffix at its end, a proper prefix at its start) with a part outside it: a token whose
own split has a continuation-bytes-only left half (a *right straddle* of ``c``) or an
incomplete-character right half (a *left straddle*). While ``c`` is not whole, one of its own
merges is always available at a rank of at most ``lastrank(c)``, so a straddle ranking above
``lastrank(c)`` cannot come first. A character none of whose straddles ranks below its
``lastrank`` therefore becomes ``solo(c)`` before anything touches it, exactly as if it had
started so. The other way round, a pair that exists at the start only because ``c`` starts
whole contains an id of ``solo(c)``, so it ranks above everything needed to build that id: it
cannot be merged earlier than when starting from bytes, nor can anything that would have beaten
it there be merged later.

Stages. Where the lowest straddle ``s`` of ``c`` ranks below ``lastrank(c)``, the same argument
holds for the merges of ``c`` alone that rank below ``s`` (ranks rise along a merge, so they are
the first ones): until they are done one of them is available below ``s``, so no straddle comes
first, and they commute with every merge outside ``c`` that happens meanwhile. ``c`` then starts
from the parts they leave, when at most two (Thai and Devanagari letters: the lead and first
continuation byte merged, the last byte alone, instead of three bytes). Tested against the byte
start and tiktoken (tests/pipeline/test_char_starts.py).
"""

from __future__ import annotations

import numpy as np

from ...native.jit import kernel, leaf
from .tables import ID_BITS, ID_MASK, NO_MERGE, pair_rank

CHAR_START_CODE_POINTS = 0x30000  # U+0000..U+2FFFF (all CJK and the scripts that merge); others start as bytes
COUNT_SHIFT = 62  # a character start: count << 62 | first token's length << 60 | id1 << 20 | id0
FIRST_LENGTH_SHIFT = 60
CONTINUATION_LOW, CONTINUATION_END = 0x80, 0xC0


@leaf
def start_count(value):
    return np.int64(value >> np.uint64(COUNT_SHIFT))


@leaf
def start_id(value, k):
    return np.int64((value >> np.uint64(ID_BITS * k)) & np.uint64(ID_MASK))


@leaf
def start_first_length(value):
    return np.int64((value >> np.uint64(FIRST_LENGTH_SHIFT)) & np.uint64(3))


@leaf
def _utf8(cp, out):
    """The UTF-8 bytes of ``cp`` into ``out``; returns their count."""
    if cp < 0x80:
        out[0] = cp
        return 1
    if cp < 0x800:
        out[0] = 0xC0 | (cp >> 6)
        out[1] = 0x80 | (cp & 0x3F)
        return 2
    if cp < 0x10000:
        out[0] = 0xE0 | (cp >> 12)
        out[1] = 0x80 | ((cp >> 6) & 0x3F)
        out[2] = 0x80 | (cp & 0x3F)
        return 3
    out[0] = 0xF0 | (cp >> 18)
    out[1] = 0x80 | ((cp >> 12) & 0x3F)
    out[2] = 0x80 | ((cp >> 6) & 0x3F)
    out[3] = 0x80 | (cp & 0x3F)
    return 4


@leaf
def _solo(tables, raw, n, parts, ends, below):
    """BPE of ``raw[:n]`` alone (leftmost lowest merge first), merging only pairs ranked below ``below``,
    into ``parts``/``ends`` (each part's end); returns ``(count, lastrank)``; ``lastrank`` is -1 when
    nothing merges."""
    for i in range(n):
        parts[i] = tables.byte_rank[raw[i]]
        ends[i] = i + 1
    count = n
    last = -1
    while count > 1:
        at = -1
        best = np.int64(NO_MERGE)
        for i in range(count - 1):
            r = np.int64(pair_rank(tables, parts[i], parts[i + 1]))
            if r < best:
                best = r
                at = i
        if at < 0 or best >= below:
            break
        last = max(last, best)
        parts[at] = best
        ends[at] = ends[at + 1]
        for i in range(at + 1, count - 1):
            parts[i] = parts[i + 1]
            ends[i] = ends[i + 1]
        count -= 1
    return count, last


@leaf
def _is_continuation(byte):
    return byte >= CONTINUATION_LOW and byte < CONTINUATION_END


@kernel
def straddle_tokens(token_bytes, token_offsets, left, right):
    """The tokens whose own split could reach into a character: left half only continuation bytes, or
    right half starting with a lead byte and ending before its character does (a few hundred)."""
    keep = np.zeros(token_offsets.shape[0] - 1, dtype=np.bool_)
    for t in range(token_offsets.shape[0] - 1):
        if left[t] < 0:
            continue
        a_start, a_end = token_offsets[left[t]], token_offsets[left[t] + 1]
        only_continuation = True
        for k in range(a_start, a_end):
            if not _is_continuation(token_bytes[k]):
                only_continuation = False
                break
        b_start, b_end = token_offsets[right[t]], token_offsets[right[t] + 1]
        lead = token_bytes[b_start]
        need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        incomplete = lead >= CONTINUATION_END and b_end - b_start < need
        for k in range(b_start + 1, b_end):
            if not _is_continuation(token_bytes[k]):
                incomplete = False
        keep[t] = only_continuation or incomplete
    return np.flatnonzero(keep)


@leaf
def _copy_token(tables, t, out, at):
    s, e = tables.token_offsets[t], tables.token_offsets[t + 1]
    for k in range(e - s):
        out[at + k] = tables.token_bytes[s + k]
    return at + e - s


@kernel
def build_char_starts(tables, left, right):
    """``char_starts`` for the vocabulary of ``tables`` (``left``/``right``: each token's own split)."""
    starts = np.zeros(CHAR_START_CODE_POINTS, dtype=np.uint64)
    for t in range(left.shape[0]):  # the proof needs every token to rank above the two it is merged from
        if left[t] >= t or right[t] >= t:
            return starts
    chosen = straddle_tokens(tables.token_bytes, tables.token_offsets, left, right)
    # the straddles' halves back to back (token k: left half 2k, right half 2k + 1), so the check of
    # each character walks a few hundred tokens, not the vocabulary
    total = 0
    for k in range(chosen.shape[0]):
        total += tables.token_offsets[chosen[k] + 1] - tables.token_offsets[chosen[k]]
    straddle_bytes = np.empty(max(total, 1), dtype=np.uint8)
    sub_offsets = np.zeros(2 * chosen.shape[0] + 1, dtype=np.int64)
    at = 0
    for k in range(chosen.shape[0]):
        at = _copy_token(tables, left[chosen[k]], straddle_bytes, at)
        sub_offsets[2 * k + 1] = at
        at = _copy_token(tables, right[chosen[k]], straddle_bytes, at)
        sub_offsets[2 * k + 2] = at
    raw = np.zeros(4, dtype=np.uint8)
    parts = np.zeros(4, dtype=np.int64)
    ends = np.zeros(4, dtype=np.int64)
    for cp in range(0x80, CHAR_START_CODE_POINTS):
        if cp >= 0xD800 and cp < 0xE000:
            continue  # surrogates are never encoded
        n = _utf8(cp, raw)
        count, last = _solo(tables, raw, n, parts, ends, NO_MERGE)
        if last < 0:
            continue  # nothing merges: bytes are the start
        lowest = _lowest_straddle(straddle_bytes, sub_offsets, chosen, raw, n)
        if lowest < last:  # only the merges below the lowest straddle happen before anything reaches in
            count, last = _solo(tables, raw, n, parts, ends, lowest)
            if last < 0:
                continue
        if count > 2:
            continue  # more ids than a start holds
        value = np.uint64(count) << np.uint64(COUNT_SHIFT)
        value |= np.uint64(parts[0])
        if count == 2:
            value |= np.uint64(parts[1]) << np.uint64(ID_BITS)
            value |= np.uint64(ends[0]) << np.uint64(FIRST_LENGTH_SHIFT)
        starts[cp] = value
    return starts


@leaf
def _lowest_straddle(straddle_bytes, sub_offsets, ranks, raw, n):
    """The lowest rank of a straddle of the character ``raw[:n]`` (NO_MERGE if none): of the straddle tokens
    (token k, rank ``ranks[k]``: left half ``2k``, right half ``2k + 1`` of ``straddle_bytes``), those whose
    left half is a proper suffix of the character or whose right half is a proper prefix."""
    lowest = np.int64(NO_MERGE)
    for k in range(ranks.shape[0]):
        a_start, a_end = sub_offsets[2 * k], sub_offsets[2 * k + 1]
        b_start, b_end = sub_offsets[2 * k + 1], sub_offsets[2 * k + 2]
        a_len, b_len = a_end - a_start, b_end - b_start
        if a_len < n and _is_continuation(straddle_bytes[a_start]):
            same = True
            for j in range(a_len):
                if straddle_bytes[a_start + j] != raw[n - a_len + j]:
                    same = False
                    break
            if same:
                lowest = min(lowest, ranks[k])
        if b_len < n and not _is_continuation(straddle_bytes[b_start]):
            same = True
            for j in range(b_len):
                if straddle_bytes[b_start + j] != raw[j]:
                    same = False
                    break
            if same:
                lowest = min(lowest, ranks[k])
    return lowest
