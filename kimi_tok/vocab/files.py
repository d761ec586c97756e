"""Reading vocabularies: ``tiktoken.model`` files, model directories, special-token JSON.

A ``tiktoken.model`` file has one token per line, ``base64(token bytes) rank``.
It is parsed by a compiled kernel into one byte buffer plus offsets (rank order),
so loading costs no Python object per token.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..native.jit import kernel, leaf

NEWLINE = 0x0A
CARRIAGE_RETURN = 0x0D
FIELD_SEPARATOR = 0x20
PAD = ord("=")
NOT_BASE64 = -1
BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
MAX_TOKEN_BYTES = 1 << 16  # generous; a longer "token" is a corrupt file

OK = 0
ERR_NO_RANK = 1
ERR_BAD_BASE64 = 2
ERR_BAD_RANK = 3
ERR_DUPLICATE_RANK = 4
ERR_MISSING_RANK = 5
ERR_TOO_LONG = 6
ERROR_TEXT = {
    ERR_NO_RANK: "expected 'base64 rank' (two fields separated by one space)",
    ERR_BAD_BASE64: "invalid base64 token",
    ERR_BAD_RANK: "rank is not a non-negative integer",
    ERR_DUPLICATE_RANK: "rank repeats an earlier line's rank",
    ERR_MISSING_RANK: "rank is out of range: ranks must be 0..n-1 for n tokens (a rank is missing)",
    ERR_TOO_LONG: "token is implausibly long",
}


class Vocabulary(NamedTuple):
    """Mergeable tokens in rank order: rank ``i`` is ``token_bytes[offsets[i]:offsets[i+1]]``."""

    token_bytes: np.ndarray
    token_offsets: np.ndarray
    line_of_rank: np.ndarray  # 1-based line of each rank in its file (0: not from a file)


def _base64_values() -> np.ndarray:
    values = np.full(256, NOT_BASE64, dtype=np.int8)
    for value, ch in enumerate(BASE64_ALPHABET):
        values[ch] = value
    return values


BASE64_VALUES = _base64_values()


@leaf
def _decode_base64(data, start, end, out, at, values):
    """Decode ``data[start:end]`` into ``out[at:]``; returns the new end or -1."""
    length = end - start
    if length == 0 or length % 4 != 0:
        return -1
    pad = 0
    if data[end - 1] == PAD:
        pad = 2 if data[end - 2] == PAD else 1
    for q in range(start, end, 4):
        acc = 0
        for k in range(4):
            c = data[q + k]
            if c == PAD and q + k >= end - pad:
                v = 0
            else:
                v = values[c]
                if v < 0:
                    return -1
            acc = (acc << 6) | v
        out[at] = (acc >> 16) & 0xFF
        out[at + 1] = (acc >> 8) & 0xFF
        out[at + 2] = acc & 0xFF
        at += 3
    return at - pad


@kernel
def _parse_lines(data, values):
    """Returns ``(error, line, token_bytes, offsets_by_rank, line_of_rank)``."""
    n_lines = 0
    for b in data:
        if b == NEWLINE:
            n_lines += 1
    n_lines += 1
    decoded = np.empty(len(data), dtype=np.uint8)
    line_start = np.empty(n_lines, dtype=np.int64)
    line_end = np.empty(n_lines, dtype=np.int64)
    line_rank = np.empty(n_lines, dtype=np.int64)
    line_number = np.empty(n_lines, dtype=np.int64)
    n_tokens = 0
    at = 0
    i = 0
    line = 0
    empty = np.empty(0, dtype=np.int64)
    while i < len(data):
        line += 1
        end = i
        while end < len(data) and data[end] != NEWLINE:
            end += 1
        stop = end
        if stop > i and data[stop - 1] == CARRIAGE_RETURN:
            stop -= 1
        if stop > i:
            sep = i
            while sep < stop and data[sep] != FIELD_SEPARATOR:
                sep += 1
            if sep == stop or sep + 1 == stop:
                return ERR_NO_RANK, line, decoded, empty, empty
            new_at = _decode_base64(data, i, sep, decoded, at, values)
            if new_at < 0:
                return ERR_BAD_BASE64, line, decoded, empty, empty
            if new_at - at > MAX_TOKEN_BYTES:
                return ERR_TOO_LONG, line, decoded, empty, empty
            rank = 0
            for k in range(sep + 1, stop):
                d = data[k] - 48
                if d < 0 or d > 9 or rank > (1 << 40):
                    return ERR_BAD_RANK, line, decoded, empty, empty
                rank = rank * 10 + d
            line_start[n_tokens] = at
            line_end[n_tokens] = new_at
            line_rank[n_tokens] = rank
            line_number[n_tokens] = line
            n_tokens += 1
            at = new_at
        i = end + 1
    line_of_rank = np.zeros(n_tokens, dtype=np.int64)
    start_of_rank = np.empty(n_tokens, dtype=np.int64)
    end_of_rank = np.empty(n_tokens, dtype=np.int64)
    for t in range(n_tokens):
        rank = line_rank[t]
        if rank >= n_tokens:
            return ERR_MISSING_RANK, line_number[t], decoded, empty, empty
        if line_of_rank[rank] != 0:
            return ERR_DUPLICATE_RANK, line_number[t], decoded, empty, empty
        line_of_rank[rank] = line_number[t]
        start_of_rank[rank] = line_start[t]
        end_of_rank[rank] = line_end[t]
    offsets = np.zeros(n_tokens + 1, dtype=np.int64)
    token_bytes = np.empty(at, dtype=np.uint8)
    for rank in range(n_tokens):
        length = end_of_rank[rank] - start_of_rank[rank]
        token_bytes[offsets[rank]:offsets[rank] + length] = decoded[start_of_rank[rank]:end_of_rank[rank]]
        offsets[rank + 1] = offsets[rank] + length
    return OK, 0, token_bytes, offsets, line_of_rank


def parse_tiktoken_bpe(data: bytes, source: str) -> Vocabulary:
    """Parse the contents of a ``tiktoken.model`` file; ``ValueError`` names ``source`` and line.

    Blank lines are skipped, as tiktoken does.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"{source}: expected bytes, not {type(data).__name__}")
    buf = np.frombuffer(bytes(data), dtype=np.uint8)
    error, line, token_bytes, offsets, line_of_rank = _parse_lines(buf, BASE64_VALUES)
    if error != OK:
        raise ValueError(f"{source}: line {line}: {ERROR_TEXT[error]}")
    if offsets.shape[0] <= 1:
        raise ValueError(f"{source}: no tokens found (empty or truncated file)")
    return Vocabulary(token_bytes, offsets, line_of_rank)


def parse_well_formed_tiktoken_bpe(data: bytes) -> Vocabulary:
    """``parse_tiktoken_bpe`` with NumPy, for a file known to be well formed (the embedded
    vocabulary, sha256-checked): whole-array steps, no compiled kernel and no Python object per
    token, so a process that has not loaded numba yet reads the vocabulary in milliseconds."""
    raw = np.frombuffer(data, dtype=np.uint8)
    line_end = np.flatnonzero(raw == NEWLINE)
    if raw.shape[0] and raw[-1] != NEWLINE:
        line_end = np.append(line_end, raw.shape[0])
    line_start = np.concatenate(([0], line_end[:-1] + 1)).astype(np.int64)
    line_number = np.arange(1, line_end.shape[0] + 1, dtype=np.int64)
    stripped = line_end > line_start
    stripped[stripped] &= raw[line_end[stripped] - 1] == CARRIAGE_RETURN
    line_end = line_end - stripped
    used = line_end > line_start
    line_start, line_end, line_number = line_start[used], line_end[used], line_number[used]
    space = np.flatnonzero(raw == FIELD_SEPARATOR)  # one per line in a well-formed file
    if space.shape[0] != line_start.shape[0] or np.any((space < line_start) | (space >= line_end)):
        raise ValueError("not a well-formed tiktoken file: expected one 'base64 rank' per line")
    ranks = _decimal_fields(raw, space + 1, line_end)
    n = ranks.shape[0]
    if not np.array_equal(np.sort(ranks), np.arange(n)):
        raise ValueError(f"not a well-formed tiktoken file: ranks must be exactly 0..{n - 1}")
    field_length = space - line_start
    if np.any(field_length % 4):
        raise ValueError("not a well-formed tiktoken file: a base64 field's length is not a multiple of 4")
    field_start = np.zeros(n, dtype=np.int64)  # where each field's base64 starts among all fields'
    np.cumsum(field_length[:-1], out=field_start[1:])
    chars = raw[np.repeat(line_start - field_start, field_length) + np.arange(int(field_length.sum()))]
    quads = _BASE64_VALUES[chars].reshape(-1, 4).astype(np.uint32)
    if np.any(quads == NOT_BASE64 & 0xFF):
        raise ValueError("not a well-formed tiktoken file: invalid base64")
    word = quads[:, 0] << 18 | quads[:, 1] << 12 | quads[:, 2] << 6 | quads[:, 3]
    decoded = np.stack([(word >> 16) & 0xFF, (word >> 8) & 0xFF, word & 0xFF], axis=1).astype(np.uint8)
    pads = (raw[space - 1] == PAD).astype(np.int64) + (raw[space - 2] == PAD)  # in each field's last quad
    keep = np.ones(decoded.shape, dtype=np.bool_)
    last_quad = (field_start + field_length) // 4 - 1
    keep[last_quad, 2] = pads == 0
    keep[last_quad, 1] = pads < 2
    token_bytes = decoded[keep]
    lengths = field_length // 4 * 3 - pads  # in file order
    if not np.array_equal(ranks, np.arange(n)):  # bytes in rank order
        order = np.argsort(ranks)
        file_offsets = np.concatenate(([0], np.cumsum(lengths)))
        starts = file_offsets[:-1][order]
        lengths = lengths[order]
        rank_offsets = np.concatenate(([0], np.cumsum(lengths)))
        token_bytes = token_bytes[np.repeat(starts - rank_offsets[:-1], lengths) + np.arange(rank_offsets[-1])]
        line_number = line_number[order]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return Vocabulary(np.ascontiguousarray(token_bytes), offsets, line_number)


def _decimal_fields(raw: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The decimal numbers ``raw[start[i]:end[i]]`` (at most 18 digits each), as int64."""
    width = end - start
    if np.any((width < 1) | (width > 18)):
        raise ValueError("not a well-formed tiktoken file: a rank is not a number")
    value = np.zeros(start.shape[0], dtype=np.int64)
    for column in range(int(width.max())):  # one digit of every number at a time
        digit = raw[np.minimum(start + column, raw.shape[0] - 1)].astype(np.int64) - ord("0")
        inside = column < width
        if np.any(inside & ((digit < 0) | (digit > 9))):
            raise ValueError("not a well-formed tiktoken file: a rank is not a number")
        value = np.where(inside, value * 10 + digit, value)
    return value


_BASE64_VALUES = np.full(256, NOT_BASE64 & 0xFF, dtype=np.uint8)
_BASE64_VALUES[np.frombuffer(BASE64_ALPHABET, dtype=np.uint8)] = np.arange(64, dtype=np.uint8)
_BASE64_VALUES[PAD] = 0


def vocabulary_from_ranks(mergeable_ranks: dict[bytes, int]) -> Vocabulary:
    """A ``Vocabulary`` from tiktoken's ``{token bytes: rank}`` (ranks must be 0..n-1)."""
    n = len(mergeable_ranks)
    by_rank: list[bytes | None] = [None] * n
    for token, rank in mergeable_ranks.items():
        if not (0 <= rank < n) or by_rank[rank] is not None:
            raise ValueError(f"mergeable ranks must be exactly 0..{n - 1}; found {rank}")
        by_rank[rank] = token
    lengths = np.fromiter((len(t) for t in by_rank), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    token_bytes = np.frombuffer(b"".join(by_rank), dtype=np.uint8).copy()
    return Vocabulary(token_bytes, offsets, np.zeros(n, dtype=np.int64))


def read_json(path: Path):
    """A UTF-8 JSON file; ``ValueError`` naming the file and line of what is wrong."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ValueError(f"{path}: line {line}: not valid UTF-8 (byte 0x{raw[e.start]:02x})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: invalid JSON: {e.msg}") from None


def read_special_tokens_json(path: Path) -> dict[str, int]:
    """``{"token": id, ...}`` (as in ``special_tokens.json``)."""
    table = read_json(path)
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) for k, v in table.items()
    ):
        raise ValueError(f"{path}: expected an object mapping token text to integer id")
    return table


def read_tokenizer_config(path: Path) -> dict[str, int]:
    """Special tokens from a Hugging Face ``tokenizer_config.json``'s ``added_tokens_decoder``."""
    config = read_json(path)
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    if not isinstance(decoder, dict):
        raise ValueError(f"{path}: no 'added_tokens_decoder' object")
    specials: dict[str, int] = {}
    for key, entry in decoder.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()) or not isinstance(
            entry, dict
        ) or not isinstance(entry.get("content"), str):
            raise ValueError(f"{path}: added_tokens_decoder entry {key!r} is not {{id: {{'content': str}}}}")
        if entry["content"] in specials:  # one text, two ids: one id would be lost
            raise ValueError(f"{path}: added_tokens_decoder ids {specials[entry['content']]} and {key} "
                             f"have the same content {entry['content']!r}")
        specials[entry["content"]] = int(key)
    return specials


def read_chat_template(directory: Path) -> str | dict[str, str] | None:
    """A model directory's chat template: ``chat_template.jinja``, else ``tokenizer_config.json``'s
    ``chat_template`` (a str, or a list of ``{"name", "template"}`` read as a dict); None if none."""
    directory = Path(directory)
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text("utf-8")
    config_path = directory / "tokenizer_config.json"
    config = read_json(config_path) if config_path.is_file() else {}
    template = config.get("chat_template") if isinstance(config, dict) else None
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                          and isinstance(t.get("template"), str) for t in template):
        return {t["name"]: t["template"] for t in template}
    raise ValueError(f"{config_path}: chat_template must be a str or a list of {{'name': str, 'template': str}}")


def read_model(path: Path) -> tuple[Vocabulary, dict[str, int] | None, str]:
    """A ``tiktoken.model`` file, or a directory with it and ``tokenizer_config.json``:
    ``(vocabulary, special tokens of the config or None, sha256 of the model file)``."""
    path = Path(path)
    specials = None
    if path.is_dir():
        config = path / "tokenizer_config.json"
        specials = read_tokenizer_config(config) if config.exists() else None
        path = path / "tiktoken.model"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such tiktoken.model file")
    raw = path.read_bytes()
    return parse_tiktoken_bpe(raw, str(path)), specials, hashlib.sha256(raw).hexdigest()
