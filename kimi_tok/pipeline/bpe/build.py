"""Building a vocabulary's BPE tables, once, and keeping them on disk (``cached_bpe_tables``).

Building the K3 tables (own splits, character starts) takes a moment; later loads read them back
from ``Policy.cache_dir`` (docs/performance.md). Worker processes memory-map a copy saved as one
``.npy`` file per array (``save_mappable_tables``/``map_tables``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from ...native import hashing
from ...native.hashing import build_span_table, table_size_for
from . import char_starts as char_starts_module, seams as seams_module, tables as tables_module
from .char_starts import CHAR_START_CODE_POINTS, build_char_starts
from .seams import N_BLOCKS, build_seam_tables
from .tables import (ID_BITS, MAX_VOCABULARY_TOKENS, SHORT_PIECE_BYTES, BpeTables, _build_own_split_table,
                     _build_pair_table, _build_short_table, _byte_tables, _count_pairs, build_long_token_bits, build_pair_filter,
                     own_splits, short_table_entries)

TABLES_FORMAT = 8  # part of the cache file name, with a digest of the source that lays the tables out


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
    """Names the tables of a vocabulary as built by the source that decides their layout (the table,
    character-start, seam and build modules, and ``hashing.py``, whose hashes place the keys), so a changed
    layout never reads tables built by other code."""
    source = b"".join(Path(module.__file__).read_bytes() for module in (tables_module, char_starts_module, seams_module,
                                                                           sys.modules[__name__], hashing))
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
            f"(the tables pack ids in {ID_BITS} bits)"
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
    all_splits = _build_pair_table(token_bytes, token_offsets, slots, table_size_for(n_pairs))
    left, right = own_splits(token_bytes, token_offsets, byte_rank, all_splits)
    pair_slots = _build_own_split_table(left, right, table_size_for(int(np.count_nonzero(left >= 0))))
    n_short = int(np.count_nonzero(np.diff(token_offsets) <= SHORT_PIECE_BYTES))
    short_slots = _build_short_table(token_bytes, token_offsets, short_table_entries(n_short))
    no_seams = np.full(N_BLOCKS, -1, dtype=np.int32)
    tables = BpeTables(token_bytes, token_offsets, slots, byte_rank, byte_pair_rank, pair_slots, short_slots,
                       np.zeros(CHAR_START_CODE_POINTS, dtype=np.uint64),
                       build_long_token_bits(token_bytes, token_offsets), build_pair_filter(left, right),
                       no_seams, np.zeros(0, dtype=np.uint64))
    every_token_built = bool(np.all((left >= 0) | (np.diff(token_offsets) == 1)))
    seam_blocks, seam_words = build_seam_tables(tables, every_token_built)
    return tables._replace(char_starts=build_char_starts(tables, left, right), seam_blocks=seam_blocks,
                           seam_words=seam_words)


# -- short pieces: two-word keys and entries of packed ids -----------------------------------------
