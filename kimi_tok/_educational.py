"""A readable pure-Python Kimi K3 tokenizer: the spec the compiled kernels are tested against.

Slow on purpose: no tables, no caches, no compiled code. Read it top to bottom to
learn what ``Tokenizer.encode_segments`` computes.

>>> from kimi_tok._educational import EducationalTokenizer
>>> edu = EducationalTokenizer.from_kimi_k3()
>>> edu.encode_segments([("<|open|>", True), ("hello world", False)])
[163587, 22931, 2695]
"""

from __future__ import annotations

from .pipeline.chunking import MAX_CHUNK_CHARS, MAX_RUN_CHARS
from .pipeline.pretokenize.pcre2_pattern import RegexPreTokenizer
from .vocab.kimi_k3 import KIMI_PATTERN


def safe_substrings(text: str) -> list[str]:
    """tiktoken-safe chunking: 400k-character chunks, then cuts in 25k same-kind runs."""
    subs: list[str] = []
    for chunk_start in range(0, len(text), MAX_CHUNK_CHARS):
        chunk = text[chunk_start : chunk_start + MAX_CHUNK_CHARS]
        start, run_length, run_is_space = 0, 0, chunk[0].isspace()
        for i, ch in enumerate(chunk):
            if ch.isspace() != run_is_space:
                run_length, run_is_space = 1, ch.isspace()
            else:
                run_length += 1
                if run_length > MAX_RUN_CHARS:
                    subs.append(chunk[start:i])
                    start, run_length = i, 1
        subs.append(chunk[start:])
    return subs


def bpe_merge(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Merge the lowest-ranked adjacent pair (leftmost on ties) until none is a token."""
    if piece in ranks:  # a piece that is a token is that token
        return [ranks[piece]]
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        pair_ranks = [ranks.get(parts[i] + parts[i + 1]) for i in range(len(parts) - 1)]
        candidates = [(r, i) for i, r in enumerate(pair_ranks) if r is not None]
        if not candidates:
            break
        _, i = min(candidates)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return [ranks[p] for p in parts]


class EducationalTokenizer:
    def __init__(self, ranks: dict[bytes, int], special_tokens: dict[str, int], pattern: str = KIMI_PATTERN):
        self.ranks = ranks
        self.special_tokens = special_tokens
        self.pretokenizer = RegexPreTokenizer(pattern)

    @classmethod
    def from_kimi_k3(cls) -> "EducationalTokenizer":
        from .vocab.kimi_k3 import embedded_kimi_k3

        vocabulary, specials = embedded_kimi_k3()
        data, offsets = vocabulary.token_bytes.tobytes(), vocabulary.token_offsets.tolist()
        ranks = {data[offsets[r] : offsets[r + 1]]: r for r in range(len(offsets) - 1)}
        return cls(ranks, specials)

    def split_specials(self, text: str) -> list[tuple[str, int | None]]:
        """``[(text, None) or (special text, id)]``: leftmost, then longest, special token."""
        out: list[tuple[str, int | None]] = []
        start = i = 0
        by_length = sorted(self.special_tokens, key=len, reverse=True)
        while i < len(text):
            match = next((s for s in by_length if text.startswith(s, i)), None)
            if match is None:
                i += 1
                continue
            if i > start:
                out.append((text[start:i], None))
            out.append((match, self.special_tokens[match]))
            i += len(match)
            start = i
        if start < len(text):
            out.append((text[start:], None))
        return out

    def encode_ordinary(self, text: str) -> list[int]:
        """Pre-tokenize with the regex, then BPE-merge every piece."""
        ids: list[int] = []
        for piece in self.pretokenizer.split(text):
            ids.extend(bpe_merge(piece.encode("utf-8"), self.ranks))
        return ids

    def encode_segments(self, segments, tiktoken_safe: bool = True) -> list[int]:
        ids: list[int] = []
        for text, allow_special in segments:
            for sub in safe_substrings(text) if tiktoken_safe else [text]:
                sub = sub.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
                for part, special_id in self.split_specials(sub) if allow_special else [(sub, None)]:
                    ids.extend([special_id] if special_id is not None else self.encode_ordinary(part))
        return ids
