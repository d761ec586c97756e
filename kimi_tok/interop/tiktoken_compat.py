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
* ``encode_with_unstable``, ``decode_with_offsets`` and ``token_byte_values``
  are not provided.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, AbstractSet, Literal

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import tiktoken

    from ..tokenizer import Tokenizer

try:  # tiktoken searches for disallowed specials with ``regex`` when it is installed
    import regex as _re
except ImportError:  # pragma: no cover - regex is a dependency of tiktoken
    import re as _re

ALL = "all"
U32_LIMIT = 1 << 32


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

    def _encode_array(self, text, allowed_special, disallowed_special) -> np.ndarray:
        allowed, disallowed = self._resolve_specials(allowed_special, disallowed_special)
        if disallowed:
            match = _alternation(frozenset(disallowed)).search(text)
            if match:
                raise_disallowed_special_token(match.group())
        _require_str(text)
        if not isinstance(allowed, (set, frozenset)):
            raise TypeError(_not_an_instance(allowed, "set"))
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
