"""Special-token split: text runs and special tokens of every sub-string.

Where ``allow_special`` is true, the text of a special token becomes that token
(tiktoken's ``allowed_special="all"``) and the regex and BPE never cross it.
Elsewhere special-looking text is ordinary text. The search is leftmost, then
longest: for vocabularies where no special token is a prefix of another (Kimi
K3's), that is exactly tiktoken's alternation.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..native.hashing import EMPTY, build_span_table, find_span, hash_span, table_size_for
from ..native.jit import kernel, leaf

TEXT_RUN = -1  # run_special value of a run of ordinary text


class SpecialTable(NamedTuple):
    token_bytes: np.ndarray  # uint8, every special token's bytes
    token_offsets: np.ndarray  # int64[n + 1]
    ids: np.ndarray  # int64 id of each special token
    slots: np.ndarray  # int32 hash slots -> index
    lengths: np.ndarray  # int64 distinct token lengths, longest first
    first_byte: np.ndarray  # bool[256]: some token starts with this byte
    first_pair: np.ndarray  # bool[65536]: some token starts with these two bytes


def build_special_table(special_tokens: dict[str, int]) -> SpecialTable:
    names = sorted(special_tokens, key=special_tokens.__getitem__)
    encoded = [name.encode("utf-8") for name in names]
    if any(len(e) == 0 for e in encoded):
        raise ValueError("special tokens: the empty string cannot be a special token")
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(e) for e in encoded])
    token_bytes = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
    slots, duplicate = build_span_table(token_bytes, offsets, table_size_for(len(encoded)))
    if duplicate >= 0:
        raise ValueError(f"special tokens: {names[duplicate]!r} is listed twice")
    first_byte = np.zeros(256, dtype=np.bool_)
    first_pair = np.zeros(256 * 256, dtype=np.bool_)
    for e in encoded:
        first_byte[e[0]] = True
        if len(e) > 1:
            first_pair[e[0] * 256 + e[1]] = True
    lengths = np.array(sorted({len(e) for e in encoded}, reverse=True), dtype=np.int64)
    ids = np.array([special_tokens[n] for n in names], dtype=np.int64)
    return SpecialTable(token_bytes, offsets, ids, slots, lengths, first_byte, first_pair)


@leaf
def _special_at(buf, i, end, table):
    """Index of the longest special token at ``buf[i:]``, or ``EMPTY``."""
    lead = buf[i]
    if not table.first_byte[lead]:
        return EMPTY
    for length in table.lengths:
        if i + length > end:
            continue
        if length > 1 and not table.first_pair[np.int64(lead) * 256 + buf[i + 1]]:
            continue
        k = find_span(table.slots, table.token_bytes, table.token_offsets, buf, i, i + length,
                      hash_span(buf, i, i + length))
        if k != EMPTY:
            return k
    return EMPTY


@leaf
def _emit(run_start, run_end, run_special, n, start, end, special):
    if n < run_start.shape[0]:
        run_start[n], run_end[n], run_special[n] = start, end, special
    return n + 1


@leaf
def _find_runs(buf, sub_start, sub_end, sub_allow, table, run_start, run_end, run_special):
    """Write the runs into the arrays (as far as they reach); returns the run count."""
    n = 0
    for k in range(sub_start.shape[0]):
        text_start = sub_start[k]
        end = sub_end[k]
        if sub_allow[k]:
            i = text_start
            while i < end:
                special = _special_at(buf, i, end, table)
                if special == EMPTY:
                    i += 1
                    continue
                if i > text_start:
                    n = _emit(run_start, run_end, run_special, n, text_start, i, TEXT_RUN)
                length = table.token_offsets[special + 1] - table.token_offsets[special]
                n = _emit(run_start, run_end, run_special, n, i, i + length, table.ids[special])
                i += length
                text_start = i
        if end > text_start:
            n = _emit(run_start, run_end, run_special, n, text_start, end, TEXT_RUN)
    return n


@kernel
def split_specials(buf, sub_start, sub_end, sub_allow, table):
    """Runs ``(run_start, run_end, run_special)``; ``run_special`` is an id or ``TEXT_RUN``.

    A first pass over allowed sub-strings counts the runs, so the arrays are
    sized exactly whatever the density of special tokens.
    """
    capacity = sub_start.shape[0]
    if sub_allow.any():
        none = np.empty(0, dtype=np.int64)
        capacity = _find_runs(buf, sub_start, sub_end, sub_allow, table, none, none, none)
    run_start = np.empty(capacity, dtype=np.int64)
    run_end = np.empty(capacity, dtype=np.int64)
    run_special = np.empty(capacity, dtype=np.int64)
    n = _find_runs(buf, sub_start, sub_end, sub_allow, table, run_start, run_end, run_special)
    return run_start[:n], run_end[:n], run_special[:n]
