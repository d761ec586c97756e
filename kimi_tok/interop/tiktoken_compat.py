"""A ``tiktoken.Encoding`` drop-in backed by kimi_tok: ``Tokenizer.as_tiktoken()``.

Code written against tiktoken keeps working and gets kimi_tok's speed::

    >>> enc = kimi_tok.kimi_k3().as_tiktoken()
    >>> enc.encode("hello world")
    [22931, 2695]
    >>> enc.encode("<|open|>hi", allowed_special={"<|open|>"})
    [163587, 9663]
    >>> enc.decode(enc.encode("héllo"))
    'héllo'

Semantics are tiktoken's, call for call: ``encode`` is one plain
``tiktoken.Encoding.encode`` call (no tiktoken-safe chunking, which is not part of
tiktoken; use ``Tokenizer.encode_segments`` for the official K3 chunked ids), with
the same ``allowed_special``/``disallowed_special`` rules and the same
``ValueError`` when disallowed special-token text occurs anywhere in the text.

Differences from tiktoken, all deliberate:

* the object is not an instance of ``tiktoken.Encoding`` (tiktoken is not required);
* ``eot_token`` looks up ``"<|endoftext|>"`` exactly as tiktoken does, so for Kimi
  K3 (which has no such token) it raises ``KeyError('<|endoftext|>')`` like an
  Encoding built from the K3 files. K3's end-of-sequence token is ``[EOS]``:
  ``enc.encode_single_token("[EOS]")``;
* when two special tokens could match at one position (one a prefix of the
  other), kimi_tok takes the longest; tiktoken's choice depends on hash order.
  Kimi K3's special tokens are prefix-free, so it never arises there;
* ``encode_to_numpy`` fixes up lone surrogates as ``encode`` does; tiktoken
  0.14's ``encode_to_numpy`` raises ``UnicodeEncodeError`` on them;
* ``encode_with_unstable`` returns its completions sorted (tiktoken's come in a
  hash set's order);
* ``_encode_single_piece`` of an empty piece raises ``ValueError`` (tiktoken's
  Rust code panics).

The drop-in pickles as its Tokenizer (a few KB for Kimi K3: ``Tokenizer.__reduce__``).
``_encode_only_native_bpe`` splits with the ``regex`` module, as tiktoken's does: that
module reads the ``&&`` class intersections of the Kimi pattern as literal text, so for
K3 its pieces are not the pre-tokenizer's (the same as tiktoken's, though).
"""

from __future__ import annotations

import bisect
import functools
import operator
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, AbstractSet, Literal

import numpy as np

from ..pipeline.bpe import encode_runs, max_ids, new_merge_scratch
from ..pipeline.bpe.merge import merge_piece, new_pair_memo
from ..pipeline.offsets import token_starts

if TYPE_CHECKING:  # pragma: no cover
    import tiktoken

    from ..tokenizer import Tokenizer

try:  # tiktoken searches for disallowed specials with ``regex`` when it is installed
    import regex as _re
except ImportError:  # pragma: no cover - regex is a dependency of tiktoken
    import re as _re

ALL = "all"
U32_LIMIT = 1 << 32
SPACE_BYTES = frozenset(b" \n\t")  # tiktoken's "all space" tokens, whose run ends an unstable tail
# Rust's char::is_whitespace (Unicode White_Space), which tiktoken's unstable completions test
WHITE_SPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029,
                         0x202F, 0x205F, 0x3000])


def real_tiktoken_encoding(tok: Tokenizer) -> tiktoken.Encoding:
    """A genuine ``tiktoken.Encoding`` with the Tokenizer's ranks, specials and pattern.

    Needs tiktoken. Handy as an independent reference for the vocabulary that
    kimi_tok ships (no ``tiktoken.model`` file needed).

    >>> real_tiktoken_encoding(kimi_tok.kimi_k3()).encode("hello world")
    [22931, 2695]
    """
    import tiktoken

    return tiktoken.Encoding(
        name=tok.name,
        pat_str=tok.pattern,
        mergeable_ranks=tok.mergeable_ranks(),
        special_tokens=tok.special_tokens,
    )


def reference_ids(encoding: tiktoken.Encoding, segments, tiktoken_safe: bool = True) -> list[int]:
    """The official K3 encoding of ``segments`` with a genuine ``tiktoken.Encoding``: each
    ``(text, allow_special)`` segment cut into tiktoken-safe sub-strings (``_educational``, the
    readable spec of ``../shared/kimi-k3/README.md``), each sub-string one tiktoken call
    (``allowed_special="all"`` or ``disallowed_special=()``), the ids concatenated. What
    ``kimi-tok verify`` and the tests compare with.

    >>> reference_ids(real_tiktoken_encoding(kimi_tok.kimi_k3()), [("<|open|>", True), ("hi", False)])
    [163587, 9663]
    """
    from .._educational import safe_substrings

    ids: list[int] = []
    for text, allow_special in segments:
        for sub in safe_substrings(text) if tiktoken_safe else [text]:
            if allow_special:
                ids += encoding.encode(sub, allowed_special="all")
            else:
                ids += encoding.encode(sub, disallowed_special=())
    return ids


def first_difference(expected: Sequence[int], got: Sequence[int]) -> int | None:
    """The first index where two id sequences differ (the shorter one's length if one is a prefix of
    the other), or None when they are equal."""
    n = min(len(expected), len(got))
    for i in range(n):
        if expected[i] != got[i]:
            return i
    return None if len(expected) == len(got) else n


def raise_disallowed_special_token(token: str) -> None:
    """tiktoken's ``ValueError`` for special-token text that the call did not allow."""
    raise ValueError(
        f"Encountered text corresponding to disallowed special token {token!r}.\n"
        "If you want this text to be encoded as a special token, "
        f"pass it to `allowed_special`, e.g. `allowed_special={{{token!r}, ...}}`.\n"
        "If you want this text to be encoded as normal text, disable the check for this token "
        f"by passing `disallowed_special=(enc.special_tokens_set - {{{token!r}}})`.\n"
        "To disable this check for all special tokens, pass `disallowed_special=()`.\n"
    )


@functools.lru_cache(maxsize=128)
def _alternation(tokens: frozenset[str]):
    """A regex matching any of ``tokens``, longest first (leftmost-longest search)."""
    ordered = sorted(tokens, key=lambda t: (-len(t), t))
    return _re.compile("|".join(_re.escape(t) for t in ordered))


class TiktokenEncoding:
    """kimi_tok behind ``tiktoken.Encoding``'s API; get one with ``Tokenizer.as_tiktoken()``.

    >>> enc = TiktokenEncoding(kimi_tok.kimi_k3())
    >>> enc.encode_batch(["hello world", "<|sep|>"], allowed_special="all")
    [[22931, 2695], [163589]]
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.name: str = tokenizer.name
        self._pat_str: str = tokenizer.pattern
        self._special_tokens: dict[str, int] = tokenizer.special_tokens
        self._special_token_values = frozenset(self._special_tokens.values())
        self.max_token_value: int = tokenizer.n_vocab - 1

    def __repr__(self) -> str:
        return f"<Encoding {self.name!r}>"

    def __reduce__(self):
        """Pickled as its Tokenizer (small: see ``Tokenizer.__reduce__``)."""
        return TiktokenEncoding, (self.tokenizer,)

    # -- vocabulary --------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        """``max_token_value + 1``, as in tiktoken."""
        return self.max_token_value + 1

    @property
    def eot_token(self) -> int:
        """The id of ``<|endoftext|>``; ``KeyError`` when there is none (as in tiktoken; K3 has none)."""
        return self._special_tokens["<|endoftext|>"]

    @functools.cached_property
    def special_tokens_set(self) -> set[str]:
        """The special tokens' texts."""
        return set(self._special_tokens)

    @functools.cached_property
    def _mergeable_ranks(self) -> dict[bytes, int]:
        """``{token bytes: rank}``, built on first use (for code that reads tiktoken's internals)."""
        return self.tokenizer.mergeable_ranks()

    def is_special_token(self, token: int) -> bool:
        """Whether ``token`` is a special token's id."""
        assert isinstance(token, int)
        return token in self._special_token_values

    def token_byte_values(self) -> list[bytes]:
        """The bytes of every mergeable token, sorted (a new list each call, as in tiktoken).

        >>> enc.token_byte_values()[:2]
        [b'\\x00', b'\\x01']
        """
        return list(self._sorted_tokens[0])

    @functools.cached_property
    def _sorted_tokens(self) -> tuple[list[bytes], list[int]]:
        """The mergeable tokens' bytes in sorted order, and their ranks."""
        by_rank = self._token_bytes
        ranks = sorted(range(len(by_rank)), key=by_rank.__getitem__)
        return [by_rank[r] for r in ranks], ranks

    @functools.cached_property
    def _token_bytes(self) -> list[bytes]:
        """The bytes of each mergeable token, by rank."""
        data = self.tokenizer.vocabulary.token_bytes.tobytes()
        offsets = self.tokenizer.vocabulary.token_offsets.tolist()
        return [data[offsets[r]:offsets[r + 1]] for r in range(len(offsets) - 1)]

    # -- encoding ----------------------------------------------------------------

    def encode_ordinary(self, text: str) -> list[int]:
        """Ids of ``text`` with special-token text treated as plain text.

        >>> enc.encode_ordinary("<|sep|>")
        [27, 91, 40433, 91, 29]
        """
        return self._encode_plain(text, allow_special=False).tolist()

    def encode(
        self,
        text: str,
        *,
        allowed_special: Literal["all"] | AbstractSet[str] = set(),  # noqa: B006 - tiktoken's signature
        disallowed_special: Literal["all"] | Collection[str] = ALL,
    ) -> list[int]:
        """Ids of ``text``; ``ValueError`` if it holds disallowed special-token text.

        ``allowed_special`` texts become control tokens; by default every other
        special token is disallowed; ``disallowed_special=()`` encodes them as text.

        >>> enc.encode("<|sep|>", allowed_special="all")
        [163589]
        """
        return self._encode_array(text, allowed_special, disallowed_special).tolist()

    def encode_to_numpy(
        self,
        text: str,
        *,
        allowed_special: Literal["all"] | AbstractSet[str] = set(),  # noqa: B006
        disallowed_special: Literal["all"] | Collection[str] = ALL,
    ) -> np.ndarray:
        """``encode`` as a ``uint32`` NumPy array (no list is built)."""
        return self._encode_array(text, allowed_special, disallowed_special)

    def encode_ordinary_batch(self, text: list[str], *, num_threads: int = 8) -> list[list[int]]:
        """``encode_ordinary`` of each text, on ``num_threads`` threads."""
        with ThreadPoolExecutor(num_threads) as pool:
            return list(pool.map(self.encode_ordinary, text))

    def encode_batch(
        self,
        text: list[str],
        *,
        num_threads: int = 8,
        allowed_special: Literal["all"] | AbstractSet[str] = set(),  # noqa: B006
        disallowed_special: Literal["all"] | Collection[str] = ALL,
    ) -> list[list[int]]:
        """``encode`` of each text, on ``num_threads`` threads."""
        allowed, disallowed = self._resolve_specials(allowed_special, disallowed_special)
        encode = functools.partial(self.encode, allowed_special=allowed, disallowed_special=frozenset(disallowed))
        with ThreadPoolExecutor(num_threads) as pool:
            return list(pool.map(encode, text))

    def encode_single_token(self, text_or_bytes: str | bytes) -> int:
        """The id of a text that is exactly one token (special tokens included); else ``KeyError``.

        >>> enc.encode_single_token("[EOS]")
        163585
        """
        raw = text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) else text_or_bytes
        if not isinstance(raw, bytes):
            raise TypeError(_not_an_instance(raw, "bytes"))
        rank = self._mergeable_ranks.get(raw)
        if rank is not None:
            return rank
        try:
            return self._special_tokens[raw.decode("utf-8")]
        except (UnicodeDecodeError, KeyError):
            raise KeyError(raw) from None

    def _resolve_specials(self, allowed_special, disallowed_special):
        """tiktoken's rules: ``"all"`` expands, and the disallowed set defaults to all not allowed."""
        if allowed_special == ALL:
            allowed_special = self.special_tokens_set
        if disallowed_special == ALL:
            disallowed_special = self.special_tokens_set - allowed_special
        return allowed_special, disallowed_special

    def _encode_array(self, text, allowed_special, disallowed_special, strict_utf8: bool = False) -> np.ndarray:
        allowed, disallowed = self._resolve_specials(allowed_special, disallowed_special)
        if disallowed:
            match = _alternation(frozenset(disallowed)).search(text)
            if match:
                raise_disallowed_special_token(match.group())
        _require_str(text)
        if strict_utf8:
            text.encode("utf-8")  # lone surrogates: tiktoken's UnicodeEncodeError, without encode's fix-up
        if not isinstance(allowed, (set, frozenset)):
            raise TypeError(_not_an_instance(allowed, "set"))
        if allowed is not self.special_tokens_set:  # "all" is known to hold str only
            for token in allowed:
                _require_str(token)
        allowed = self.special_tokens_set.intersection(allowed)
        if not allowed:
            return self._encode_plain(text, allow_special=False)
        if len(allowed) == len(self._special_tokens):
            return self._encode_plain(text, allow_special=True)
        return self._encode_with_some_specials(text, frozenset(allowed))

    def _encode_plain(self, text: str, allow_special: bool) -> np.ndarray:
        """One tiktoken call: all specials or none, no tiktoken-safe chunking."""
        return self.tokenizer.encode_to_numpy([(_require_str(text), allow_special)], tiktoken_safe=False)

    def _encode_with_some_specials(self, text: str, allowed: frozenset[str]) -> np.ndarray:
        """Only ``allowed`` specials are control tokens: cut there, the rest is ordinary text.

        tiktoken runs its regex on the text between allowed specials independently,
        so encoding the pieces as separate segments gives the same ids.
        """
        segments: list[tuple[str, bool]] = []
        start = 0
        for match in _alternation(allowed).finditer(text):
            segments += [(text[start : match.start()], False), (match.group(), True)]
            start = match.end()
        segments.append((text[start:], False))
        return self.tokenizer.encode_to_numpy(segments, tiktoken_safe=False)

    def encode_with_unstable(
        self,
        text: str,
        *,
        allowed_special: Literal["all"] | AbstractSet[str] = set(),  # noqa: B006
        disallowed_special: Literal["all"] | Collection[str] = ALL,
    ) -> tuple[list[int], list[list[int]]]:
        """The stable ids of ``text`` and the id sequences that may continue them (tiktoken's own
        semantics: ``CoreBPE._encode_unstable_native``), completions sorted.

        The stable ids leave out the last piece's (and the all-space tokens before it); every
        completion starts with ids whose bytes extend that tail.

        >>> stable, completions = enc.encode_with_unstable("hello fanta")
        >>> stable, [22931, 285, 8983] in completions
        ([22931], True)
        """
        tokens = self._encode_array(text, allowed_special, disallowed_special, strict_utf8=True).tolist()
        allowed = self.special_tokens_set.intersection(self._resolve_specials(allowed_special, disallowed_special)[0])
        tail_start = 0
        if allowed:
            for match in _alternation(frozenset(allowed)).finditer(text):
                tail_start = match.end()
        tail = text[tail_start:].encode("utf-8")
        if not tail:  # the text ends with a special token (or is empty): nothing is unstable
            return tokens, []
        n_unstable = self._with_space_tokens_before(tokens, len(self._single_piece(tail[self._last_piece_start(tail):])))
        unstable = self.decode_bytes(tokens[len(tokens) - n_unstable:])
        return tokens[: len(tokens) - n_unstable], self._completions(unstable)

    def _completions(self, unstable: bytes) -> list[list[int]]:
        """Every id sequence that may encode text starting with ``unstable`` (tiktoken's search)."""
        sorted_bytes, sorted_ranks = self._sorted_tokens
        lo, hi = _prefix_range(sorted_bytes, unstable)
        completions = {(rank,) for rank in sorted_ranks[lo:hi]}  # single tokens that start with it
        texts, raw = [], []  # a prefix of the unstable bytes plus a token that starts with the rest
        for i in range(max(1, len(unstable) - self._longest_token), len(unstable)):  # longer: no token
            prefix = unstable[:i]
            lo, hi = _prefix_range(sorted_bytes, unstable[i:])
            for token in sorted_bytes[lo:hi]:
                possibility = prefix + token
                try:  # text is split by the regex first (a split may come in), other bytes are one piece
                    texts.append(possibility.decode("utf-8"))
                except UnicodeDecodeError:
                    raw.append(possibility)
        for ids, bounds in (self._encode_each(texts), self._bpe_each(raw, whole_first=False)):
            completions.update(_until_covered(ids, bounds, self._token_lengths, len(unstable)))
        size = _last_char_size(unstable)
        if 0 < size < len(unstable) and ord(unstable[-size:].decode("utf-8")) in WHITE_SPACE:
            ids, _ = self._bpe_each([unstable[:-size], unstable[-size:]], whole_first=False)
            completions.add(tuple(ids.tolist()))  # a split before trailing whitespace may open up
        return [list(ids) for ids in sorted(completions)]

    def _encode_each(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """``encode_ordinary`` of each text in one call: ``(ids, bounds)``, text ``i``'s ids at
        ``ids[bounds[i]:bounds[i + 1]]``."""
        if not texts:
            return np.empty(0, dtype=np.uint32), np.zeros(1, dtype=np.int64)
        return self.tokenizer.encode_with_bounds([(t, False) for t in texts], tiktoken_safe=False)

    def _bpe_each(self, pieces: list[bytes], whole_first: bool) -> tuple[np.ndarray, np.ndarray]:
        """The ids of each (non-empty) piece, merged as one piece without the regex split:
        ``(ids, bounds)`` as ``_encode_each``. ``whole_first`` (tiktoken's ``encode_single_piece``):
        a piece that is a token is that token; else (``byte_pair_encode``) it is merged anyway."""
        if not pieces:
            return np.empty(0, dtype=np.uint32), np.zeros(1, dtype=np.int64)
        stages = self.tokenizer.engine.stages
        buf = np.frombuffer(b"".join(pieces), dtype=np.uint8).copy()
        piece_end = np.cumsum([len(piece) for piece in pieces], dtype=np.int64)
        run_start = piece_end - [len(piece) for piece in pieces]
        out = np.empty(max_ids(len(buf), len(pieces)), dtype=np.uint32)
        bounds = np.zeros(len(pieces) + 1, dtype=np.int64)
        with stages.piece_caches.borrow() as cache:  # one compiled call, one run of one piece each
            n = encode_runs(stages.tables, buf, run_start, piece_end, np.full(len(pieces), -1, dtype=np.int64),
                            np.arange(len(pieces) + 1, dtype=np.int64), piece_end, out, bounds[1:], cache)
        ids = out[:n]
        if not whole_first:  # a piece found whole: its merges, which need not reach that token
            for i in np.flatnonzero(np.diff(bounds) == 1).tolist():
                merged = self._merges(buf[run_start[i]:piece_end[i]])
                if merged != [int(ids[bounds[i]])]:
                    parts = [ids[bounds[j]:bounds[j + 1]].tolist() for j in range(len(pieces))]
                    parts[i] = merged
                    return self._bpe_joined(parts)
        return ids, bounds

    def _merges(self, piece: np.ndarray) -> list[int]:
        """The BPE merges of one piece (tiktoken's ``byte_pair_encode``), even if it is a token."""
        out = np.empty(len(piece), dtype=np.uint32)
        n = merge_piece(self.tokenizer.engine.stages.tables, piece.copy(), 0, len(piece), out, 0,
                        new_merge_scratch(len(piece), new_pair_memo()))
        return out[:n].tolist()

    def _bpe_joined(self, parts: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        ids = np.array([token for part in parts for token in part], dtype=np.uint32)
        bounds = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(part) for part in parts], out=bounds[1:])
        return ids, bounds

    @functools.cached_property
    def _token_lengths(self) -> np.ndarray:
        return np.diff(self.tokenizer.vocabulary.token_offsets)

    @functools.cached_property
    def _longest_token(self) -> int:
        return int(self._token_lengths.max(initial=0))

    def _with_space_tokens_before(self, tokens: list[int], n_last: int) -> int:
        """tiktoken's ``_increase_last_piece_token_len``: the last piece's ``n_last`` ids, and the
        all-space tokens before them when its first one is all space (regex splits of spaces move)."""
        if n_last > 0 and self._is_all_space(tokens[-n_last]):
            while n_last < len(tokens) and self._is_all_space(tokens[-n_last - 1]):
                n_last += 1
        return n_last

    def _is_all_space(self, token: int) -> bool:
        """Whether a mergeable token's bytes are all spaces, newlines or tabs (a special one is not)."""
        return 0 <= token < len(self._token_bytes) and SPACE_BYTES.issuperset(self._token_bytes[token])

    def _last_piece_start(self, run: bytes) -> int:
        """Where the last pre-tokenizer piece of the text run ``run`` (UTF-8, not empty) starts."""
        buf = np.frombuffer(run, dtype=np.uint8).copy()
        one = np.zeros(1, dtype=np.int64)
        _, piece_end = self.tokenizer.engine.stages.pretokenizer.scan(buf, one, one + len(run), one - 1)
        return int(piece_end[-2]) if len(piece_end) > 1 else 0

    def _single_piece(self, piece: bytes) -> list[int]:
        """tiktoken's ``encode_single_piece``: the piece's token if it is one, else its merges."""
        return self._bpe_each([piece], whole_first=True)[0].tolist()

    # -- tiktoken's private helpers, which its tests and tools call ------------------

    def _encode_single_piece(self, text_or_bytes: str | bytes) -> list[int]:
        """Ids of one piece without the regex split (special-token text is plain text).

        >>> enc._encode_single_piece("helloqqqq") == enc._encode_single_piece(b"helloqqqq")
        True
        """
        raw = text_or_bytes.encode("utf-8") if isinstance(text_or_bytes, str) else text_or_bytes
        if not isinstance(raw, bytes):
            raise TypeError(_not_an_instance(raw, "bytes"))
        if not raw:
            raise ValueError("_encode_single_piece: the piece is empty")
        return self._single_piece(raw)

    def _encode_only_native_bpe(self, text: str) -> list[int]:
        """``encode_ordinary`` with the regex split done by the ``regex`` module, as tiktoken does."""
        import regex

        pattern = regex.compile(self._pat_str)
        ids: list[int] = []
        for piece in regex.findall(pattern, text):
            ids.extend(self._single_piece(piece.encode("utf-8")))
        return ids

    def _encode_bytes(self, text: bytes) -> list[int]:
        """Ids of bytes that may not be UTF-8 (tiktoken's ``_encode_bytes``): the valid prefix is
        encoded as text, its last piece plus everything from the first invalid byte on as one piece.

        >>> enc.decode_bytes(enc._encode_bytes(b"caf\\xc3")) == b"caf\\xc3"
        True
        """
        if not isinstance(text, bytes):
            raise TypeError(_not_an_instance(text, "bytes"))
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError as e:
            valid = e.start  # bytes up to here are valid UTF-8 (Rust's valid_up_to)
        else:
            return self.encode_ordinary(decoded)
        tokens = self.encode_ordinary(text[:valid].decode("utf-8"))
        n_last = 0
        if valid:
            n_last = len(self._single_piece(text[self._last_piece_start(text[:valid]):valid]))
        n_last = self._with_space_tokens_before(tokens, n_last)
        if tokens and n_last > 0:
            unstable = self.decode_bytes(tokens[len(tokens) - n_last:]) + text[valid:]
            tokens = tokens[: len(tokens) - n_last]
        else:
            unstable = text[valid:]
        if unstable:
            tokens += self._single_piece(unstable)
        return tokens

    # -- decoding ----------------------------------------------------------------

    def decode_bytes(self, tokens: Sequence[int]) -> bytes:
        """The bytes of ``tokens``; ``KeyError`` for an id outside the vocabulary (as tiktoken).

        >>> enc.decode_bytes([22931, 2695])
        b'hello world'
        """
        try:
            return self.tokenizer.decode_bytes(tokens)
        except (TypeError, ValueError):
            return self.tokenizer.decode_bytes(self._checked_ids(tokens))

    def decode(self, tokens: Sequence[int], errors: str = "replace") -> str:
        """The text of ``tokens``; invalid UTF-8 is handled by ``errors`` (lossy by default)."""
        return self.decode_bytes(tokens).decode("utf-8", errors=errors)

    def decode_single_token_bytes(self, token: int) -> bytes:
        """The bytes of one token (special tokens included); ``KeyError`` if unknown.

        >>> enc.decode_single_token_bytes(163587)
        b'<|open|>'
        """
        token = _as_u32(token)
        if not self._is_token(token):
            raise KeyError(str(token))
        return self.tokenizer.decode_bytes([token])

    def decode_tokens_bytes(self, tokens: Sequence[int]) -> list[bytes]:
        """The bytes of each token, e.g. to show token boundaries."""
        return [self.decode_single_token_bytes(token) for token in tokens]

    def decode_with_offsets(self, tokens: Sequence[int]) -> tuple[str, list[int]]:
        """The text of ``tokens`` and the character where each token starts (a token that starts
        inside a character: that character's); ``UnicodeDecodeError`` unless the bytes are UTF-8,
        as in tiktoken. The offsets are one compiled pass (``pipeline.offsets.token_starts``).

        >>> enc.decode_with_offsets([22931, 2695])
        ('hello world', [0, 5])
        """
        decoder = self.tokenizer._decoder
        try:
            ids = decoder.check_ids(tokens)
        except (TypeError, ValueError):
            self.decode_tokens_bytes(tokens)  # tiktoken's error for the first bad token
            raise
        text = decoder.decode_bytes(ids).decode("utf-8", errors="strict")
        return text, token_starts(decoder.offset_tables, ids).tolist()

    def decode_batch(
        self, batch: Sequence[Sequence[int]], *, errors: str = "replace", num_threads: int = 8
    ) -> list[str]:
        """``decode`` of each id list, on ``num_threads`` threads."""
        with ThreadPoolExecutor(num_threads) as pool:
            return list(pool.map(functools.partial(self.decode, errors=errors), batch))

    def decode_bytes_batch(self, batch: Sequence[Sequence[int]], *, num_threads: int = 8) -> list[bytes]:
        """``decode_bytes`` of each id list, on ``num_threads`` threads."""
        with ThreadPoolExecutor(num_threads) as pool:
            return list(pool.map(self.decode_bytes, batch))

    def _is_token(self, token: int) -> bool:
        return self.tokenizer.is_token(token)

    def _checked_ids(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` as ints, raising the error tiktoken raises for the first bad one."""
        if isinstance(tokens, str):
            raise TypeError("Can't extract `str` to `Vec`")
        if not isinstance(tokens, (Sequence, np.ndarray)):
            raise TypeError(_not_an_instance(tokens, "Sequence"))
        ids = [_as_u32(token) for token in tokens]
        for token in ids:
            if not self._is_token(token):
                raise KeyError(f"Invalid token for decoding: {token}")
        return ids


def _prefix_range(sorted_bytes: list[bytes], prefix: bytes) -> tuple[int, int]:
    """``lo, hi``: the items of ``sorted_bytes[lo:hi]`` are those that start with ``prefix``."""
    lo = bisect.bisect_left(sorted_bytes, prefix)
    stem = prefix.rstrip(b"\xff")
    if not stem:
        return lo, len(sorted_bytes)
    return lo, bisect.bisect_left(sorted_bytes, stem[:-1] + bytes([stem[-1] + 1]), lo)


def _until_covered(ids: np.ndarray, bounds: np.ndarray, lengths: np.ndarray, n_bytes: int) -> list[tuple[int, ...]]:
    """Each sequence ``ids[bounds[i]:bounds[i + 1]]`` cut after its first ids that cover ``n_bytes`` (>= 1)."""
    covered = np.cumsum(lengths[ids], dtype=np.int64)  # strictly rising: every token has a byte
    before = np.concatenate([np.zeros(1, dtype=np.int64), covered])[bounds[:-1]]
    ends = np.minimum(np.searchsorted(covered, before + n_bytes) + 1, bounds[1:])
    flat = ids.tolist()
    return [tuple(flat[start:end]) for start, end in zip(bounds[:-1].tolist(), ends.tolist())]


def _last_char_size(data: bytes) -> int:
    """The UTF-8 length of the valid character ending ``data`` (0 if it does not end with one)."""
    for size in range(1, min(4, len(data)) + 1):
        try:
            if len(data[-size:].decode("utf-8")) == 1:
                return size
        except UnicodeDecodeError:
            continue
    return 0


def _as_u32(token) -> int:
    """``token`` as an int in tiktoken's id range (``TypeError``/``OverflowError`` otherwise)."""
    value = operator.index(token)
    if not 0 <= value < U32_LIMIT:
        raise OverflowError("out of range integral type conversion attempted")
    return value


def _require_str(text) -> str:
    if not isinstance(text, str):
        raise TypeError(_not_an_instance(text, "str"))
    return text


def _not_an_instance(value, expected: str) -> str:
    """tiktoken's (PyO3's) wording for an argument of the wrong type."""
    if value is None:
        return f"'None' is not an instance of '{expected}'"
    return f"'{type(value).__name__}' object is not an instance of '{expected}'"
