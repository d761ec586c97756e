"""Decoding: ids back to bytes and text, and look-ups between ids and token strings.

Every id's bytes (mergeable tokens and special tokens alike) lie in one buffer with dense
offsets (``Decoder``), so decoding gathers spans in one compiled call; no Python object per
id. ``id_to_token``/``token_to_id`` spell mergeable tokens in GPT-2's byte-level alphabet, as
Hugging Face shows them. ``DecodeStream`` decodes generated ids one at a time, as
``tokenizers.decoders.DecodeStream`` does.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

from ..native.jit import kernel
from ..vocab.files import Vocabulary
from .bpe import BpeTables, lookup_token
from .offsets import OffsetTables, offset_tables

REPLACEMENT_CHARACTER = "\ufffd"
_INT = {int}


@kernel
def gather_bytes(ids, all_bytes, all_offsets):
    """The bytes of ``ids`` (valid ids) back to back."""
    total = 0
    for t in ids:
        total += all_offsets[t + 1] - all_offsets[t]
    out = np.empty(total, dtype=np.uint8)
    at = 0
    for t in ids:
        start = all_offsets[t]
        length = all_offsets[t + 1] - start
        out[at:at + length] = all_bytes[start:start + length]
        at += length
    return out


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable alphabet for bytes, used by ``id_to_token``/``token_to_id`` (as HF does)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def byte_level(token: bytes) -> str:
    """``token`` in GPT-2's printable byte alphabet, as tokenizer.json spells vocabulary entries.

    >>> byte_level(b" hello")
    'Ġhello'
    """
    return "".join(BYTE_TO_CHAR[b] for b in token)


class Decoder:
    """The bytes of every id of a vocabulary and its special tokens, for decoding and look-ups."""

    def __init__(self, vocabulary: Vocabulary, special_tokens: dict[str, int], tables: BpeTables | None) -> None:
        n_ranks = vocabulary.token_offsets.shape[0] - 1
        self.tables = tables  # for token_to_id; None until a Tokenizer starting cold has made its tables
        self._special_tokens = special_tokens
        self.n_vocab = max([n_ranks - 1, *special_tokens.values()]) + 1
        specials = sorted(special_tokens.items(), key=lambda kv: kv[1])
        lengths = np.zeros(self.n_vocab, dtype=np.int64)
        lengths[:n_ranks] = np.diff(vocabulary.token_offsets)
        self.special_ids = frozenset(special_tokens.values())
        self.bytes_seen: dict[int, bytes] = {}  # the bytes of ids decoded from a list or by a DecodeStream
        self.is_special = np.zeros(self.n_vocab, dtype=np.bool_)
        self.is_valid = np.zeros(self.n_vocab, dtype=np.bool_)
        self.is_valid[:n_ranks] = True
        for text, id_ in specials:
            lengths[id_] = len(text.encode("utf-8"))
            self.is_special[id_] = True
            self.is_valid[id_] = True
        self.all_offsets = np.zeros(self.n_vocab + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.all_offsets[1:])
        self.all_bytes = np.empty(self.all_offsets[-1], dtype=np.uint8)
        self.all_bytes[: vocabulary.token_bytes.shape[0]] = vocabulary.token_bytes
        for text, id_ in specials:
            self.all_bytes[self.all_offsets[id_]:self.all_offsets[id_ + 1]] = np.frombuffer(
                text.encode("utf-8"), dtype=np.uint8
            )

    def check_ids(self, ids) -> np.ndarray:
        """``ids`` as an int64 array of valid ids; ``TypeError``/``ValueError`` name the first bad one."""
        if isinstance(ids, (str, bytes, bytearray, memoryview)) or ids is None:
            raise TypeError(f"ids must be a sequence of ints or an integer array, not {type(ids).__name__}")
        if (type(ids) is list or type(ids) is tuple) and not _INT.issuperset(map(type, ids)):
            for i, value in enumerate(ids):  # NumPy would take a bool among ints as 0 or 1
                if isinstance(value, (bool, np.bool_)):
                    raise TypeError(f"ids[{i}] = {value!r} is a {type(value).__name__}, not an int")
        try:
            array = np.asarray(ids)
        except (TypeError, ValueError):  # e.g. a ragged nested list
            raise TypeError(f"ids must be a 1-D sequence of ints, not a nested {type(ids).__name__}") from None
        if array.ndim != 1:
            raise TypeError(f"ids must be a 1-D sequence of ints, got shape {array.shape}")
        if array.size == 0:
            return np.zeros(0, dtype=np.int64)
        if array.dtype.kind not in "iu":  # floats, bools, objects, strings, timedelta64 ...
            if isinstance(ids, np.ndarray):
                raise TypeError(f"ids must be ints, got an array of dtype {array.dtype}")
            for i, value in enumerate(ids):  # a Python sequence: name the first item that is wrong
                if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                    raise TypeError(f"ids[{i}] = {value!r} is a {type(value).__name__}, not an int")
                if not 0 <= value < self.n_vocab:
                    raise ValueError(f"ids[{i}] = {value} is not a token id of this vocabulary")
            array = np.array([int(value) for value in ids], dtype=np.int64)  # e.g. uint64 and int64 items
        bad = array >= self.n_vocab  # compared in the array's own dtype: no wrap-around of uint64
        if array.dtype.kind == "i":
            bad |= array < 0
        if not bad.any():
            array = array.astype(np.int64, copy=False)
            bad = ~self.is_valid[array]
        if bad.any():
            where = int(np.flatnonzero(bad)[0])
            raise ValueError(f"ids[{where}] = {array[where]} is not a token id of this vocabulary")
        return array

    @functools.cached_property
    def offset_tables(self) -> OffsetTables:
        """Per id, the characters that start in its bytes (``offsets``), made on first use."""
        return offset_tables(self.all_bytes, self.all_offsets)

    def is_token(self, id_: int) -> bool:
        """Whether ``id_`` (an int) is a mergeable or special token of this vocabulary."""
        return 0 <= id_ < self.n_vocab and bool(self.is_valid[id_])

    def decode_bytes(self, ids) -> bytes:
        if (type(ids) is list or type(ids) is tuple) and set(map(type, ids)) == _INT:
            return self.decode_listed(ids)
        return gather_bytes(self.check_ids(ids), self.all_bytes, self.all_offsets).tobytes()

    def decode_listed(self, ids: list[int] | tuple[int, ...]) -> bytes:
        """``decode_bytes`` of a list or tuple of plain ints: each id's bytes from ``bytes_seen`` (C-level
        look-ups: ~10x faster than the array and the compiled call for a few ids, level from ~4,000;
        docs/performance.md, "Decoding a list of ids"), the ids met for the first time added after
        ``check_ids`` (which names a bad one)."""
        seen = self.bytes_seen
        try:
            return b"".join(map(seen.__getitem__, ids))
        except KeyError:
            for id_ in self.check_ids(ids).tolist():
                if id_ not in seen:
                    seen[id_] = self.token_bytes(id_)
            return b"".join(map(seen.__getitem__, ids))

    def decode_bytes_interpreted(self, ids) -> bytes:
        """``decode_bytes`` without a compiled kernel (while they compile: ``engine.interpreted``)."""
        data, offsets = self.all_bytes, self.all_offsets
        return b"".join(data[offsets[i]:offsets[i + 1]].tobytes() for i in self.check_ids(ids).tolist())

    def token_bytes(self, id_: int) -> bytes:
        """The bytes of one valid id."""
        return self.all_bytes[self.all_offsets[id_]:self.all_offsets[id_ + 1]].tobytes()

    def seen_token_bytes(self, id_: int) -> bytes:
        """``token_bytes`` of a valid id, kept in ``bytes_seen`` for the next time."""
        raw = self.bytes_seen.get(id_)
        if raw is None:
            raw = self.bytes_seen[id_] = self.token_bytes(id_)
        return raw

    def token_to_id(self, token: str) -> int | None:
        if not isinstance(token, str):
            raise TypeError(f"token must be a str, not {type(token).__name__}")
        if token in self._special_tokens:
            return self._special_tokens[token]
        try:
            raw = bytes(CHAR_TO_BYTE[c] for c in token)
        except (KeyError, TypeError):
            return None
        if not raw:
            return None
        rank = lookup_token(self.tables, np.frombuffer(raw, dtype=np.uint8))
        return None if rank < 0 else int(rank)

    def id_to_token(self, id_: int) -> str | None:
        if not isinstance(id_, (int, np.integer)):
            raise TypeError(f"id must be an int, not {type(id_).__name__}")
        if isinstance(id_, bool) or not self.is_token(int(id_)):
            return None
        raw = self.token_bytes(int(id_))
        if self.is_special[id_]:
            return raw.decode("utf-8")
        return byte_level(raw)


class DecodeStream:
    """Incremental decoding of generated ids (``Tokenizer.decode_stream``): ``step(id)`` returns
    the text that id completes, or None while it is partial (a character split over ids waits
    for its last byte). Joined, the pieces are ``decode(ids)`` up to its last whole character.

    The state machine of ``tokenizers.decoders.DecodeStream`` (tokenizers 0.23.3), step for step:
    it keeps the ids since the text last returned and the text the first ``_prefix_index`` of
    them decode to (``_prefix``); a text that ends in U+FFFD (an incomplete or invalid byte
    sequence, decoded as ``Tokenizer.decode`` does) waits for the next id. Each step decodes
    only those few ids, never the whole stream (a run of invalid bytes is decoded again at each
    step until a character completes, as in ``tokenizers``).

    >>> stream = tok.decode_stream()
    >>> [stream.step(i) for i in tok.encode("😀x").ids]
    [None, '😀', 'x']
    """

    __slots__ = ("_decoder", "skip_special_tokens", "_ids", "_pieces", "_prefix", "_prefix_index")

    def __init__(self, decoder, skip_special_tokens: bool = False, ids=None) -> None:
        if not isinstance(skip_special_tokens, (bool, np.bool_)):
            raise TypeError(f"skip_special_tokens must be a bool, not {type(skip_special_tokens).__name__}")
        self._decoder = decoder
        self.skip_special_tokens = bool(skip_special_tokens)
        self._ids: list[int] = []  # the ids since the text last returned, as tokenizers keeps them
        self._pieces: list[bytes] = []  # their bytes (none for a skipped special token)
        self._prefix = ""  # what the first ``_prefix_index`` of them decode to
        self._prefix_index = 0
        if ids is not None:
            self._ids = decoder.check_ids(ids).tolist()
            self._pieces = [self._piece(i) for i in self._ids]

    def _piece(self, id_: int) -> bytes:
        """The bytes a valid id adds to the text (none for a skipped special token)."""
        if self.skip_special_tokens and id_ in self._decoder.special_ids:
            return b""
        return self._decoder.seen_token_bytes(id_)

    def step(self, id: int | Sequence[int]) -> str | None:
        """Add the next id (or a list of ids): the text completed since the last text returned, or
        None. ``ValueError`` for an id outside the vocabulary (the stream is left as it was)."""
        decoder = self._decoder
        if type(id) is int and id in decoder.bytes_seen:  # an id met before: valid, its bytes known
            new, new_pieces = [id], [self._piece(id)]
        else:
            new = decoder.check_ids(id if isinstance(id, (list, tuple, np.ndarray)) else [id]).tolist()
            new_pieces = [self._piece(i) for i in new]
        pieces = self._pieces
        if not self._prefix and pieces:
            prefix = _text(pieces)
            if not prefix.endswith(REPLACEMENT_CHARACTER):
                self._prefix, self._prefix_index = prefix, len(pieces)
        self._ids += new
        pieces += new_pieces
        text = _text(pieces)
        prefix = self._prefix
        if text.endswith(REPLACEMENT_CHARACTER) or not _longer(text, prefix):
            return None
        if not text.startswith(prefix):
            raise ValueError(f"decode stream: the text of ids {self._ids} does not start with the text "
                             f"returned before ({prefix!r})")
        new_prefix_index = len(pieces) - self._prefix_index
        del self._ids[:self._prefix_index], pieces[:self._prefix_index]
        self._prefix = _text(pieces)
        self._prefix_index = new_prefix_index
        return text[len(prefix):]

    def __copy__(self) -> DecodeStream:
        twin = DecodeStream(self._decoder, self.skip_special_tokens)
        twin._ids, twin._pieces = list(self._ids), list(self._pieces)
        twin._prefix, twin._prefix_index = self._prefix, self._prefix_index
        return twin

    def __deepcopy__(self, memo: dict) -> DecodeStream:
        return self.__copy__()


def _text(pieces: list[bytes]) -> str:
    return b"".join(pieces).decode("utf-8", "replace")


def _longer(text: str, prefix: str) -> bool:
    """Whether ``text`` has more UTF-8 bytes than ``prefix`` (``tokenizers`` compares byte lengths)."""
    if len(text) > len(prefix) and text.startswith(prefix):
        return True
    return len(text.encode("utf-8", "surrogatepass")) > len(prefix.encode("utf-8", "surrogatepass"))
