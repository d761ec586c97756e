"""The BPE tables of one vocabulary, built once and cached on disk (``BpeTables``).

Same algorithm as tiktoken (``_educational.bpe_merge`` is the readable spec):

1. a piece that is itself a vocabulary token is that token;
2. otherwise start from single bytes and repeatedly merge the adjacent pair whose
   concatenation has the lowest rank, the leftmost one on ties.

The tables answer the questions merging asks: a byte-span hash table for whole-piece
look-ups (``find_token``), a short-token table answering pieces of up to
``SHORT_TOKEN_BYTES`` with one integer compare, a dense 256x256 table for the first round
of byte pairs, and a pair -> merged-token table for later rounds (``pair_rank``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ...native import hashing
from ...native.hashing import EMPTY, build_span_table, find_span, hash_span, int_slot, mix64, table_size_for
from ...native.jit import index, kernel, leaf

NO_MERGE = np.int32(0x7FFFFFFF)  # rank of a pair that is not in the vocabulary
PAIR_SHIFT = 32  # pair key = left << PAIR_SHIFT | right
SHORT_TOKEN_BYTES = 7  # tokens this short are found by one integer compare
SHORT_LENGTH_SHIFT = 56  # short key = bytes little-endian | length << SHORT_LENGTH_SHIFT
NO_SHORT_KEY = np.uint64(0)  # an empty slot (real keys carry a non-zero length)
PACKED_ID_BITS = 20  # a short piece's value: up to 3 ids below 2**20 and their count in one uint64
PACKED_ID_MASK = (1 << PACKED_ID_BITS) - 1
MAX_PACKED_IDS = 3
MAX_VOCABULARY_TOKENS = 1 << PACKED_ID_BITS  # every rank must fit a packed id
PACKED_COUNT_SHIFT = MAX_PACKED_IDS * PACKED_ID_BITS
TABLES_FORMAT = 2  # part of the cache file name, with a digest of the source that lays the tables out


class BpeTables(NamedTuple):
    """Everything the BPE kernels read, built once per vocabulary."""

    token_bytes: np.ndarray  # uint8, every token's bytes in rank order
    token_offsets: np.ndarray  # int64[n + 1]
    token_slots: np.ndarray  # int32 hash slots -> rank
    byte_rank: np.ndarray  # int32[256]
    byte_pair_rank: np.ndarray  # int32[256 * 256], NO_MERGE when absent
    pair_slots: np.ndarray  # int64 pairs (left << PAIR_SHIFT | right, merged rank)
    short_slots: np.ndarray  # uint64 pairs (short key, packed ids): one cache line per probe


def cached_bpe_tables(token_bytes: np.ndarray, token_offsets: np.ndarray, root: Path) -> BpeTables:
    """``build_bpe_tables``, saved once per vocabulary under ``root`` (``Policy.cache_dir``) and
    read back on later loads (building the K3 tables takes ~10x longer than reading them: see
    docs/performance.md). An unwritable or damaged cache only means building them again.
    """
    path = root / f"bpe-tables-v{TABLES_FORMAT}-{tables_digest(token_bytes, token_offsets)}.npz"
    try:
        with np.load(path) as stored:
            return BpeTables(**{name: stored[name] for name in BpeTables._fields})
    except Exception:  # missing, truncated, not an npz, wrong fields: whatever it is, rebuild
        pass
    tables = build_bpe_tables(token_bytes, token_offsets)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        np.savez(tmp, **tables._asdict())
        os.replace(tmp, path)
    except OSError:
        pass
    return tables


def tables_digest(token_bytes: np.ndarray, token_offsets: np.ndarray) -> str:
    """Names the tables of a vocabulary as built by the source that decides their layout (this
    module and ``hashing.py``, whose hashes place the keys), so a changed layout never reads
    tables built by other code."""
    source = b"".join(Path(module.__file__).read_bytes() for module in (sys.modules[__name__], hashing))
    return hashlib.sha256(token_bytes.tobytes() + token_offsets.tobytes() + source).hexdigest()[:32]


def save_mappable_tables(tables: BpeTables, root: Path) -> Path:
    """The tables as one ``.npy`` file per array (memory-mappable), saved once per vocabulary
    under ``root``, or under the temporary directory where that cannot be written."""
    name = f"bpe-tables-v{TABLES_FORMAT}-{tables_digest(tables.token_bytes, tables.token_offsets)}"
    try:
        return _save_arrays(tables, root / name)
    except OSError:  # a read-only cache root
        return _save_arrays(tables, Path(tempfile.gettempdir()) / f"kimi_tok-{os.getuid()}" / name)


def _save_arrays(tables: BpeTables, path: Path) -> Path:
    if all((path / f"{name}.npy").is_file() for name in BpeTables._fields):
        return path
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for name, array in tables._asdict().items():
        np.save(tmp / f"{name}.npy", array)
    try:
        os.replace(tmp, path)
    except OSError:  # another process saved them first
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def map_tables(path: Path) -> BpeTables:
    """Tables saved by ``save_mappable_tables``, memory-mapped copy-on-write: worker processes
    share the pages, and the arrays keep the writable type the compiled kernels were built for."""
    return BpeTables(**{name: np.asarray(np.load(path / f"{name}.npy", mmap_mode="c")) for name in BpeTables._fields})


def build_bpe_tables(token_bytes: np.ndarray, token_offsets: np.ndarray) -> BpeTables:
    """Build the tables for a vocabulary whose rank ``i`` is ``token_bytes[off[i]:off[i+1]]``.

    Raises ``ValueError`` when a token repeats or a single byte has no token.
    """
    n_tokens = token_offsets.shape[0] - 1
    if n_tokens > MAX_VOCABULARY_TOKENS:
        raise ValueError(
            f"vocabulary of {n_tokens:,} tokens: at most {MAX_VOCABULARY_TOKENS:,} are supported "
            f"(short pieces pack their ids in {PACKED_ID_BITS} bits)"
        )
    slots, duplicate = build_span_table(token_bytes, token_offsets, table_size_for(n_tokens))
    if duplicate >= 0:
        raise ValueError(f"vocabulary token of rank {duplicate} repeats an earlier token")
    byte_rank, byte_pair_rank = _byte_tables(token_bytes, token_offsets, slots)
    missing = np.flatnonzero(byte_rank < 0)
    if missing.size:
        raise ValueError(
            f"vocabulary lacks single-byte tokens (byte-level BPE needs all 256), e.g. byte {missing[0]}"
        )
    n_pairs = _count_pairs(token_bytes, token_offsets, slots)
    pair_slots = _build_pair_table(
        token_bytes, token_offsets, slots, table_size_for(n_pairs)
    )
    n_short = int(np.count_nonzero(np.diff(token_offsets) <= SHORT_TOKEN_BYTES))
    short_slots = _build_short_table(token_bytes, token_offsets, table_size_for(n_short))
    return BpeTables(
        token_bytes, token_offsets, slots, byte_rank, byte_pair_rank, pair_slots, short_slots
    )


@leaf
def short_key(buf, start, end):
    """The bytes of a piece of at most ``SHORT_TOKEN_BYTES`` packed with its length."""
    key = np.uint64(end - start) << np.uint64(SHORT_LENGTH_SHIFT)
    for k in range(end - start):
        key |= np.uint64(buf[index(start + k)]) << np.uint64(8 * k)
    return key


@kernel
def _build_short_table(token_bytes, token_offsets, n_slots):
    table = np.zeros(2 * n_slots, dtype=np.uint64)
    mask = n_slots - 1
    for rank in range(token_offsets.shape[0] - 1):
        start = token_offsets[rank]
        end = token_offsets[rank + 1]
        if end - start > SHORT_TOKEN_BYTES:
            continue
        key = short_key(token_bytes, start, end)
        slot = np.int64(mix64(key) & np.uint64(mask))
        while table[2 * slot] != NO_SHORT_KEY:
            slot = (slot + 1) & mask
        table[2 * slot] = key
        table[2 * slot + 1] = (np.uint64(1) << np.uint64(PACKED_COUNT_SHIFT)) | np.uint64(rank)
    return table


@leaf
def find_short_piece(table, key):
    """``(packed ids or 0, slot)`` of a short piece's ``key`` in a short table."""
    mask = (table.shape[0] >> 1) - 1
    slot = np.int64(mix64(key) & np.uint64(mask))
    while True:
        stored = table[index(2 * slot)]
        if stored == key:
            return table[index(2 * slot + 1)], slot
        if stored == NO_SHORT_KEY:
            return np.uint64(0), slot
        slot = (slot + 1) & mask


@leaf
def packed_count(packed):
    return np.int64(packed >> np.uint64(PACKED_COUNT_SHIFT))


@leaf
def packed_id(packed, k):
    return np.int64((packed >> np.uint64(PACKED_ID_BITS * k)) & np.uint64(PACKED_ID_MASK))


@leaf
def find_short_token(table, buf, start, end):
    """Rank of the token ``buf[start:end]`` (at most ``SHORT_TOKEN_BYTES``), or ``EMPTY``."""
    packed, _ = find_short_piece(table, short_key(buf, start, end))
    if packed_count(packed) != 1:
        return EMPTY
    return packed_id(packed, 0)


@kernel
def _byte_tables(token_bytes, token_offsets, slots):
    byte_rank = np.full(256, EMPTY, dtype=np.int32)
    byte_pair_rank = np.full(256 * 256, NO_MERGE, dtype=np.int32)
    probe = np.zeros(2, dtype=np.uint8)
    for a in range(256):
        probe[0] = a
        byte_rank[a] = find_span(slots, token_bytes, token_offsets, probe, 0, 1, hash_span(probe, 0, 1))
        for b in range(256):
            probe[1] = b
            rank = find_span(slots, token_bytes, token_offsets, probe, 0, 2, hash_span(probe, 0, 2))
            if rank != EMPTY:
                byte_pair_rank[a * 256 + b] = rank
    return byte_rank, byte_pair_rank


@kernel
def _for_each_split(token_bytes, token_offsets, slots, pair_slots, count_only):
    """Visit every split of every token into two tokens; count or insert the pairs."""
    n_pairs = 0
    mask = (pair_slots.shape[0] >> 1) - 1
    for merged in range(token_offsets.shape[0] - 1):
        start = token_offsets[merged]
        end = token_offsets[merged + 1]
        for cut in range(start + 1, end):
            left = find_span(slots, token_bytes, token_offsets, token_bytes, start, cut,
                             hash_span(token_bytes, start, cut))
            if left == EMPTY:
                continue
            right = find_span(slots, token_bytes, token_offsets, token_bytes, cut, end,
                              hash_span(token_bytes, cut, end))
            if right == EMPTY:
                continue
            n_pairs += 1
            if not count_only:
                key = (np.int64(left) << PAIR_SHIFT) | right
                slot = int_slot(key, mask)
                while pair_slots[2 * slot] != EMPTY:
                    slot = (slot + 1) & mask
                pair_slots[2 * slot] = key
                pair_slots[2 * slot + 1] = merged
    return n_pairs


def _count_pairs(token_bytes, token_offsets, slots) -> int:
    return _for_each_split(token_bytes, token_offsets, slots, np.full(2, EMPTY, dtype=np.int64), True)


def _build_pair_table(token_bytes, token_offsets, slots, n_slots):
    pair_slots = np.full(2 * n_slots, EMPTY, dtype=np.int64)
    _for_each_split(token_bytes, token_offsets, slots, pair_slots, False)
    return pair_slots


@leaf
def pair_rank(tables, left, right):
    """Rank of the token whose bytes are ``left`` + ``right``, or ``NO_MERGE``."""
    key = (np.int64(left) << PAIR_SHIFT) | right
    table = tables.pair_slots
    mask = (table.shape[0] >> 1) - 1
    slot = int_slot(key, mask)
    while True:
        stored = table[index(2 * slot)]
        if stored == key:
            return np.int32(table[index(2 * slot + 1)])
        if stored == EMPTY:
            return NO_MERGE
        slot = (slot + 1) & mask


@leaf
def find_token(tables, buf, start, end):
    """Rank of the token whose bytes are ``buf[start:end]`` (non-empty), or ``EMPTY``."""
    length = end - start
    if length == 1:
        return np.int64(tables.byte_rank[index(buf[index(start)])])
    if length <= SHORT_TOKEN_BYTES:
        return find_short_token(tables.short_slots, buf, start, end)
    return find_span(tables.token_slots, tables.token_bytes, tables.token_offsets, buf, start, end,
                     hash_span(buf, start, end))


@leaf
def lookup_token(tables, buf):
    """Rank of the token whose bytes are ``buf``, or ``EMPTY``."""
    return find_token(tables, buf, 0, buf.shape[0])
