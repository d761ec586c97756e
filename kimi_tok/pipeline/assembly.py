"""Assembly: the stages after the tiktoken-safe cuts in one compiled call, into one ``uint32`` array.

``SubstringEncoder`` holds what the stages of one vocabulary need (BPE tables, the
special-token table, the pre-tokenizer, piece caches); it is all a worker needs (a thread
shares the Tokenizer's, a worker process builds its own from memory-mapped tables).

``encode_packed_fused`` runs everything from the packed segments on, the tiktoken-safe cuts
included, as ONE compiled call: no Python between the stages, so the GIL stays free for
another thread the whole time. ``encode_substrings_fused`` runs specials -> scanner -> BPE
over sub-strings (one part or group of a fan-out). With a PCRE2 pre-tokenizer the stages run
one by one (``SubstringEncoder.encode``). Every id covers at least one byte, so an output as
long as the text's bytes always has room. ``encode_pairs_fused`` is ``encode_packed_fused`` for a
short call, whose segments it reads where CPython keeps them (``native.cpython.read_text_pairs``).
"""

from __future__ import annotations

import os

import numpy as np

from ..native import jit
from ..native.cpython import LAYOUT, PAIRS_READ, read_text_pairs
from ..native.jit import DeferredModule, kernel
from . import bpe
from .chunking import cut_chunks, cut_substrings
from .bpe.piece_cache import growth_needed
from .pretokenize import pretokenizer_for
from .pretokenize.kimi_scanner import scan_runs
from .pretokenize.unicode_classes import code_point_flags
from .segments import count_chars
from .specials import build_special_table, split_specials

bundles = DeferredModule("kimi_tok.native.bundles")  # imports numba: read when a kernel is typed

ID_DTYPE = np.uint32
MIN_KEPT_PIECE_CACHES = 4  # piece caches kept between calls: at least this many, else one per core


@kernel
def cut_packed(buf, seg_start, seg_end, needs_cuts, allow_special, flags):
    """The tiktoken-safe cuts of packed segments: ``(sub_start, sub_end, sub_allow)``."""
    chunk_start, chunk_end, chunk_segment = cut_chunks(buf, seg_start, seg_end, needs_cuts)
    sub_start, sub_end, sub_chunk = cut_substrings(buf, chunk_start, chunk_end, needs_cuts[chunk_segment], flags)
    return sub_start, sub_end, allow_special[chunk_segment[sub_chunk]]


@kernel
def encode_substrings_fused(tables, specials, scan_table, buf, sub_start, sub_end, sub_allow, out, cache):
    """Specials -> Kimi scanner -> BPE over sub-strings, in one call.

    Writes the ids to ``out`` (at least as long as the sub-strings' bytes: every id covers a
    byte or more); returns ``(n_ids, run_start, run_out_end)``.
    """
    run_start, run_end, run_special = split_specials(buf, sub_start, sub_end, sub_allow, specials)
    first_piece, piece_end = scan_runs(buf, run_start, run_end, run_special, scan_table)
    run_out_end = np.empty(run_start.shape[0], dtype=np.int64)
    n = bpe.encode_runs(tables, buf, run_start, run_end, run_special, first_piece, piece_end, out, run_out_end,
                        cache)
    return n, run_start, run_out_end


@kernel
def encode_packed_fused(tables, specials, scan_table, flags, buf, seg_start, seg_end, needs_cuts, allow_special,
                        out, cache):
    """Chunking -> run cuts -> specials -> Kimi scanner -> BPE over packed segments, in one call
    (``out`` at least ``buf.shape[0]`` long); returns ``(n_ids, run_start, run_out_end)``."""
    sub_start, sub_end, sub_allow = cut_packed(buf, seg_start, seg_end, needs_cuts, allow_special, flags)
    return encode_substrings_fused(tables, specials, scan_table, buf, sub_start, sub_end, sub_allow, out, cache)


@kernel
def encode_pairs_fused(tables, specials, scan_table, flags, address, n_pairs, layout, max_chars, max_bytes,
                       tiktoken_safe, cache):
    """``encode_packed_fused`` of the tuple of ``n_pairs`` ``(str, bool)`` pairs at ``address``, read in place
    (``native.cpython.read_text_pairs``): ``(ids, status)``, the ids in an array of their length; nothing done
    and no ids unless ``status`` is ``PAIRS_READ``."""
    buf, seg_start, seg_end, allow_special, status = read_text_pairs(address, n_pairs, layout, max_chars, max_bytes)
    if status != PAIRS_READ:
        return np.empty(0, dtype=ID_DTYPE), status
    out, n, _, _ = encode_read_pairs(tables, specials, scan_table, flags, buf, seg_start, seg_end, allow_special,
                                     tiktoken_safe, cache)
    return out[:n].copy(), status


@kernel
def encode_read_pairs(tables, specials, scan_table, flags, buf, seg_start, seg_end, allow_special, tiktoken_safe,
                      cache):
    """``encode_packed_fused`` of segments ``read_text_pairs`` read: ``(out, n_ids, run_start, run_out_end)``, the
    ids in ``out[:n_ids]``."""
    needs_cuts = np.full(seg_start.shape[0], tiktoken_safe, dtype=np.bool_)
    out = np.empty(buf.shape[0], dtype=ID_DTYPE)
    n, run_start, run_out_end = encode_packed_fused(tables, specials, scan_table, flags, buf, seg_start, seg_end,
                                                    needs_cuts, allow_special, out, cache)
    return out, n, run_start, run_out_end


@kernel
def bundle_stages(tables, specials, scan_table, flags, cache):
    """A short call's arrays as one object (``native.bundles``), for ``encode_pairs_bundled``."""
    return bundles.StagesBundle(tables, specials, scan_table, flags, cache)


@kernel
def encode_pairs_bundled(bundle, address, n_pairs, layout, max_chars, max_bytes, tiktoken_safe):
    """``encode_pairs_fused`` with the stages' tables and a piece cache given as one bundle; returns
    ``(ids, status, whether the cache may need growing)`` (``bpe.growth_needed``)."""
    ids, status = encode_pairs_fused(bundle.tables, bundle.specials, bundle.scan_table, bundle.flags, address,
                                     n_pairs, layout, max_chars, max_bytes, tiktoken_safe, bundle.cache)
    grow_short, grow_general = growth_needed(bundle.cache)
    return ids, status, grow_short or grow_general


class SubstringEncoder:
    """Special tokens, pre-tokenizer and BPE tables of one vocabulary, plus its piece caches."""

    def __init__(self, tables: bpe.BpeTables, special_tokens: dict[str, int], pattern: str) -> None:
        self.tables = tables
        self.specials = build_special_table(special_tokens)
        self.pretokenizer = pretokenizer_for(pattern)
        self.piece_caches = bpe.PieceCachePool(
            lambda: bpe.new_piece_cache(self.tables.short_slots), keep=max(MIN_KEPT_PIECE_CACHES, os.cpu_count() or 1),
            grow=bpe.grown_piece_cache
        )

    def runs_and_pieces(self, buf, sub_start, sub_end, sub_allow, clock=None):
        """``(run_start, run_end, run_special, first_piece, piece_end)`` of some sub-strings."""
        run_start, run_end, run_special = split_specials(buf, sub_start, sub_end, sub_allow, self.specials)
        if clock:
            clock.lap("specials")
        first_piece, piece_end = self.pretokenizer.scan(buf, run_start, run_end, run_special)
        if clock:
            clock.lap("pretokenize")
        return run_start, run_end, run_special, first_piece, piece_end

    def encode(self, buf, sub_start, sub_end, sub_allow, clock=None):
        """All stages fused on one worker: ``(ids, run_start, run_out_end)``.

        With the Kimi scanner and no stages timed, one compiled call (``encode_substrings_fused``):
        a thread of the fan-out then takes the GIL only to start and to end."""
        if not clock and self.fuses:
            n_subs = sub_start.shape[0]
            out = np.empty(int(sub_end[-1] - sub_start[0]) if n_subs else 0, dtype=ID_DTYPE)  # an id covers >= 1 byte
            with self.piece_caches.borrow() as cache:
                n, run_start, run_out_end = encode_substrings_fused(
                    self.tables, self.specials, self.pretokenizer.scan_table, buf, sub_start, sub_end, sub_allow, out,
                    cache
                )
            out.resize((n,), refcheck=False)  # shrinks in place: no copy of the ids
            return out, run_start, run_out_end
        run_start, run_end, run_special, first_piece, piece_end = self.runs_and_pieces(
            buf, sub_start, sub_end, sub_allow, clock
        )
        n_runs = run_start.shape[0]
        span = int(run_end[-1] - run_start[0]) if n_runs else 0
        out = np.empty(bpe.max_ids(span, n_runs), dtype=ID_DTYPE)
        run_out_end = np.empty(n_runs, dtype=np.int64)
        with self.piece_caches.borrow() as cache:
            n = bpe.encode_runs(self.tables, buf, run_start, run_end, run_special, first_piece, piece_end, out,
                                run_out_end, cache)
        if clock:
            clock.lap("bpe")
        out.resize((n,), refcheck=False)  # shrinks in place: no copy of the ids
        return out, run_start, run_out_end

    @property
    def fuses(self) -> bool:
        """Whether ``encode_packed`` can run: the pre-tokenizer is compiled (PCRE2 needs Python per match)."""
        return self.pretokenizer.scan_table is not None

    def encode_pairs(self, pairs: tuple, max_chars: int, max_bytes: int, tiktoken_safe: bool,
                     helper=None) -> np.ndarray | None:
        """The ids of a short call's segments, a tuple of ``(str, bool)`` pairs read in place by one compiled call;
        None (nothing done) for anything else, more than ``max_chars`` characters or ``max_bytes`` bytes of
        UTF-8, or lone surrogates (``native.cpython.read_text_pairs``). ``helper``: an object whose
        ``encode_pairs(args)`` runs the call instead of ``encode_pairs_bundled(*args)`` (the engine's
        ``ShortCallHelper``, which shares long calls with a thread)."""
        if LAYOUT is None or not pairs:
            return None
        # the common case in this frame: after other work each Python frame between costs a call microseconds
        # (docs/performance.md, "Short calls without the layers between")
        taken = cache, short_call = self.piece_caches.take(make=False)
        entry = helper.short_entry if helper is not None else None
        if cache is None or short_call is None or (entry is None if helper is not None
                                                   else short_call[1] is encode_pairs_bundled):
            result = self._with_pairs_cache(pairs, max_chars, max_bytes, tiktoken_safe,
                                            helper.encode_pairs if helper is not None else None, taken)
            return None if result is None else result[0]
        # ``pairs`` (this frame holds it) keeps every pair and str alive while the call reads them
        if entry is None:
            ids, status, may_grow = short_call[1](short_call[0], id(pairs), len(pairs), LAYOUT, max_chars, max_bytes,
                                                  tiktoken_safe)
        else:
            ids, status, may_grow, start = entry(short_call[0], id(pairs), len(pairs), LAYOUT, max_chars, max_bytes,
                                                 tiktoken_safe, *helper.tail)
            if start:
                helper.start_after_call()
        self.piece_caches.give_back(cache, short_call, may_grow)  # not after an error: see PieceCachePool.borrow
        return ids if status == PAIRS_READ else None

    def encode_pairs_with_bounds(self, pairs: tuple, max_chars: int, max_bytes: int, tiktoken_safe: bool, helper):
        """``encode_pairs`` through ``helper.encode_pairs_with_bounds``: ``(ids, bounds, regather)`` (segment ``i``'s
        ids are ``ids[bounds[i]:bounds[i + 1]]``; ``regather`` as ``engine.Engine.encode_with_regather`` gives it),
        or None (nothing done)."""
        result = self._with_pairs_cache(pairs, max_chars, max_bytes, tiktoken_safe, helper.encode_pairs_with_bounds)
        return None if result is None else result[:1] + result[3:]

    def _with_pairs_cache(self, pairs: tuple, max_chars: int, max_bytes: int, tiktoken_safe: bool, encode,
                          taken: tuple | None = None):
        """``encode(args)`` (``encode_pairs_bundled`` if None) with a piece cache of the pool (``taken``: what the
        caller took from it already), on a short call's arguments: its result, whose first three items are
        ``(ids, status, may_grow)``; None if nothing was done."""
        if LAYOUT is None or not pairs:
            return None
        cache, short_call = taken or self.piece_caches.take(make=False)
        if cache is None:  # none free: a new one (~6 ms) only for a call that is not too long
            chars = count_chars(pairs)
            if chars is None or chars > max_chars:
                return None
            cache, short_call = self.piece_caches.take()
        if short_call is None:  # the cache's first short call (or first since it grew): through the dispatcher
            bundle = bundle_stages(self.tables, self.specials, self.pretokenizer.scan_table, code_point_flags(), cache)
            short_call = (bundle, encode_pairs_bundled)
        bundle, bundled = short_call
        # ``pairs`` (this frame holds it) keeps every pair and str alive while the call reads them
        args = (bundle, id(pairs), len(pairs), LAYOUT, max_chars, max_bytes, tiktoken_safe)
        if encode is not None:
            result = encode(args)
        else:
            result = bundled(*args)
            if bundled is encode_pairs_bundled:  # later calls skip the dispatcher's typing of the bundle
                short_call = (bundle, jit.compiled_entry(encode_pairs_bundled, args))
        self.piece_caches.give_back(cache, short_call, result[2])  # not after an error: see PieceCachePool.borrow
        return result if result[1] == PAIRS_READ else None

    def encode_packed(self, buf, seg_start, seg_end, needs_cuts, allow_special, flags, out):
        """Every stage from the packed segments on (their tiktoken-safe cuts included), in one
        compiled call without the GIL; ids into ``out`` (at least ``buf.shape[0]`` long).
        Returns ``(n_ids, run_start, run_out_end)``."""
        with self.piece_caches.borrow() as cache:
            return encode_packed_fused(self.tables, self.specials, self.pretokenizer.scan_table, flags, buf, seg_start,
                                       seg_end, needs_cuts, allow_special, out, cache)
