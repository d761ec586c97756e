"""``Encoding``: the ids of one call, handed to NumPy without a copy, and their offsets if asked."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from .pipeline.assembly import ID_DTYPE


class Encoding:
    """The ids of one call, in a ``uint32`` NumPy array, and with ``return_offsets=True`` their
    code-point spans in the text (``offsets``).

    >>> enc = kimi_tok.kimi_k3().encode("hello world", return_offsets=True)
    >>> len(enc), enc.ids, enc.offsets.tolist()
    (2, [22931, 2695], [[0, 5], [5, 11]])
    """

    __slots__ = ("_ids", "_special_mask", "_offsets")

    def __init__(self, ids: np.ndarray, special_mask: Callable[[np.ndarray], np.ndarray] | None = None,
                 offsets: np.ndarray | None = None) -> None:
        self._ids: np.ndarray | None = ids
        self._special_mask = special_mask
        self._offsets = offsets

    def _array(self) -> np.ndarray:
        if self._ids is None:
            raise ValueError("this Encoding was drained by into_numpy()")
        return self._ids

    def __len__(self) -> int:
        return len(self._array())

    def __reduce__(self):
        """Pickled as its ids, offsets and the positions of its special tokens (not the vocabulary's mask)."""
        known = self._ids is not None and self._special_mask is not None
        return _unpickled, (self._ids, np.flatnonzero(self._special_mask(self._ids)) if known else None, self._offsets)

    def __repr__(self) -> str:
        if self._ids is None:
            return "Encoding(drained)"
        return f"Encoding(n_ids={len(self._ids)})"

    @property
    def ids(self) -> list[int]:
        """The ids as a Python list (a copy; prefer ``into_numpy`` for long prompts)."""
        return self._array().tolist()

    @property
    def offsets(self) -> np.ndarray:
        """``(n, 2)`` int64 ``[start, end)`` code-point spans of the ids in the text (for segments,
        in their texts joined); a token with part of a multi-byte character spans that character.
        ``ValueError`` unless the call had ``return_offsets=True``."""
        if self._offsets is None:
            raise ValueError("this Encoding has no offsets: encode with return_offsets=True")
        return self._offsets

    def into_numpy(
        self,
        ids: bool = True,
        attention_mask: bool = False,
        type_ids: bool = False,
        special_tokens_mask: bool = False,
    ) -> dict[str, np.ndarray]:
        """Hand the ids to NumPy without copying; the Encoding is drained afterwards.

        Returns a dict with the requested ``uint32`` arrays: ``"ids"``,
        ``"attention_mask"`` (ones), ``"type_ids"`` (zeros) and
        ``"special_tokens_mask"`` (1 where the id is a special token).
        """
        array = self._array()
        result: dict[str, np.ndarray] = {}
        if ids:
            result["ids"] = array
        if attention_mask:
            result["attention_mask"] = np.ones(len(array), dtype=ID_DTYPE)
        if type_ids:
            result["type_ids"] = np.zeros(len(array), dtype=ID_DTYPE)
        if special_tokens_mask:
            if self._special_mask is None:
                raise ValueError("special_tokens_mask needs an Encoding made by a Tokenizer")
            result["special_tokens_mask"] = self._special_mask(array).astype(ID_DTYPE)
        self._ids = None
        return result


def _unpickled(ids: np.ndarray | None, special_positions: np.ndarray | None, offsets: np.ndarray | None) -> Encoding:
    mask = None if special_positions is None else functools.partial(_mask_at, special_positions)
    return Encoding(ids, mask, offsets)


def _mask_at(positions: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The special-token mask of an unpickled Encoding's ``ids``: true at ``positions``."""
    mask = np.zeros(len(ids), dtype=bool)
    mask[positions] = True
    return mask
