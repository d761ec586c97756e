"""The interpreted engine: the exact ids in Python and PCRE2, with no compiled kernel.

A Tokenizer made where numba has not compiled kimi_tok's kernels yet (the first use after an
install, a new container) answers its calls with this engine while worker processes compile the
kernels (``reuse.warmup.KernelBuild``), and one made where they are cached answers its first calls
with it while the process loads them. The steps are those of the compiled pipeline, in Python:
the tiktoken-safe cuts (``safe_substrings``), the special tokens (leftmost, then longest), the
pattern through PCRE2 JIT (``pipeline.pretokenize.pcre2_pattern``), and BPE with tiktoken's rule
(a piece that is a token is that token; otherwise the leftmost lowest-ranked pair merges first).
It runs at a few MB/s: a stopgap, not a path to tune (docs/performance.md, "First use").
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence

import numpy as np

from ..pipeline.assembly import ID_DTYPE
from ..pipeline.chunking import MAX_CHUNK_CHARS, MAX_RUN_CHARS
from ..pipeline.pretokenize.pcre2_pattern import compile_pcre2
from ..pipeline.segments import fix_surrogates, validate_segments
from .engine import Encoded

MERGED_PIECES_KEPT = 1 << 16  # merged pieces remembered (a dict, emptied when full)
SHORT_MERGE_BYTES = 32  # pieces up to this long merge by scanning all pairs; longer ones with a heap
_RUNS = re.compile(r"\s+|\S+")  # Python's \s is exactly str.isspace (tests/api/test_interpreted.py)


def safe_substrings(text: str) -> list[str]:
    """tiktoken-safe chunking: chunks of ``MAX_CHUNK_CHARS`` code points, each cut again wherever
    more than ``MAX_RUN_CHARS`` characters of one kind (``str.isspace`` or not) follow each other
    (as ``_educational.safe_substrings``, with the runs found by a regex)."""
    subs: list[str] = []
    for chunk_start in range(0, len(text), MAX_CHUNK_CHARS):
        chunk = text[chunk_start:chunk_start + MAX_CHUNK_CHARS]
        if len(chunk) <= MAX_RUN_CHARS:
            subs.append(chunk)
            continue
        start = 0
        for run in _RUNS.finditer(chunk):
            cut, run_end = run.start() + MAX_RUN_CHARS, run.end()
            while cut < run_end:
                subs.append(chunk[start:cut])
                start, cut = cut, cut + MAX_RUN_CHARS
        subs.append(chunk[start:])
    return subs


class InterpretedEngine:
    """Exact ids without compiled code: ``encode`` as ``Engine.encode`` (same arguments and result).

    >>> engine = InterpretedEngine({b"h": 0, b"i": 1, b"hi": 2}, {"<|s|>": 3}, r"\\S+|\\s+")
    >>> engine.encode([("hi<|s|>", True)], True).ids.tolist()
    [2, 3]
    """

    def __init__(self, ranks: dict[bytes, int], special_tokens: dict[str, int], pattern: str) -> None:
        self.ranks = ranks
        self.special_tokens = dict(special_tokens)
        self.regex = compile_pcre2(pattern)
        by_length = sorted(self.special_tokens, key=len, reverse=True)  # at one position, the longest first
        self._specials = re.compile("|".join(map(re.escape, by_length))) if by_length else None
        self._merged: dict[bytes, tuple[int, ...]] = {}

    def encode(self, segments: Sequence, tiktoken_safe: bool, want_ids: bool = True,
               validated: bool = False) -> Encoded:
        """All ids of ``segments`` (validated here unless ``validated``)."""
        ids: list[int] = []
        for text, allow_special in (segments if validated else validate_segments(segments)):
            for sub in (safe_substrings(text) if tiktoken_safe else [text]):
                self._encode_substring(sub, allow_special, ids)
        return Encoded(np.array(ids, dtype=ID_DTYPE) if want_ids else None, len(ids))

    def _encode_substring(self, text: str, allow_special: bool, ids: list[int]) -> None:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates: tiktoken's fix-up, per string it is given
            text = fix_surrogates(text)
        start = 0
        if allow_special and self._specials is not None:
            for match in self._specials.finditer(text):
                self._encode_text_run(text[start:match.start()], ids)
                ids.append(self.special_tokens[match.group()])
                start = match.end()
        self._encode_text_run(text[start:], ids)

    def _encode_text_run(self, text: str, ids: list[int]) -> None:
        if not text:
            return
        ranks, merged = self.ranks, self._merged
        for match in self.regex.finditer(text):
            piece = match.group().encode("utf-8")
            rank = ranks.get(piece)
            if rank is not None:
                ids.append(rank)
                continue
            known = merged.get(piece)
            if known is None:
                known = tuple(self.merge(piece))
                if len(merged) >= MERGED_PIECES_KEPT:
                    merged.clear()
                merged[piece] = known
            ids.extend(known)

    def merge(self, piece: bytes) -> list[int]:
        """BPE of a piece that is not a token (tiktoken's rule: the leftmost lowest-ranked pair first)."""
        if len(piece) > SHORT_MERGE_BYTES:
            return self._merge_with_heap(piece)
        ranks = self.ranks
        parts = [piece[i:i + 1] for i in range(len(piece))]
        pair_ranks = [ranks.get(parts[i] + parts[i + 1]) for i in range(len(parts) - 1)]
        while True:
            best = at = None
            for i, rank in enumerate(pair_ranks):
                if rank is not None and (best is None or rank < best):
                    best, at = rank, i
            if at is None:
                return [ranks[part] for part in parts]
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
            del pair_ranks[at]
            if at < len(parts) - 1:
                pair_ranks[at] = ranks.get(parts[at] + parts[at + 1])
            if at > 0:
                pair_ranks[at - 1] = ranks.get(parts[at - 1] + parts[at])

    def _merge_with_heap(self, piece: bytes) -> list[int]:
        """The same merges for a long piece: a heap of (rank, start of the left part, end of the right
        part) over parts linked by position; an entry whose parts changed since is skipped."""
        ranks = self.ranks
        n = len(piece)
        end = list(range(1, n + 1))  # end[i]: end of the part starting at byte i (while alive)
        after = list(range(1, n + 1))  # after[i]: start of the next part (n: none)
        before = list(range(-1, n - 1))
        alive = [True] * n
        heap = [(rank, i, i + 2) for i in range(n - 1) if (rank := ranks.get(piece[i:i + 2])) is not None]
        heapq.heapify(heap)
        while heap:
            rank, i, right_end = heapq.heappop(heap)
            j = after[i]
            if not alive[i] or j >= n or end[j] != right_end:
                continue  # stale: a part of the pair changed since it was pushed
            end[i], alive[j] = right_end, False
            after[i] = after[j]
            if after[j] < n:
                before[after[j]] = i
            for left in (i, before[i]):
                if left >= 0 and after[left] < n:
                    pair_end = end[after[left]]
                    pair_rank = ranks.get(piece[left:pair_end])
                    if pair_rank is not None:
                        heapq.heappush(heap, (pair_rank, left, pair_end))
        ids, i = [], 0
        while i < n:
            ids.append(ranks[piece[i:end[i]]])
            i = after[i]
        return ids
