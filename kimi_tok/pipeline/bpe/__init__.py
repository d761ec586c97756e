"""Byte-pair encoding, compiled with numba: tables built once per vocabulary (``tables``, ``build``,
``char_starts``, ``seams``), merging (``merge``), piece caches kept across calls (``piece_cache``), and the pass over a call's pieces
(``encode``)."""

from .encode import encode_piece, encode_runs, max_ids
from .merge import new_merge_scratch
from .piece_cache import PieceCache, PieceCachePool, grown_piece_cache, new_piece_cache
from .build import build_bpe_tables, cached_bpe_tables, map_tables, save_mappable_tables
from .tables import BpeTables, find_token, lookup_token

__all__ = ["BpeTables", "PieceCache", "PieceCachePool", "build_bpe_tables", "cached_bpe_tables", "encode_runs",
           "encode_piece", "find_token", "grown_piece_cache", "lookup_token", "map_tables", "max_ids", "new_merge_scratch",
           "new_piece_cache", "save_mappable_tables"]
