"""Tables laid out in transparent huge pages (``hugepages.py``): same contents, dtypes, shapes and
writability as plain arrays, each on a cache line, in one mapping per table; plain arrays where the
platform has no such advice. The kernels' results with them are what every other test checks."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

import kimi_tok
from kimi_tok.native import hugepages
from kimi_tok.pipeline import bpe


def _mapping_of(array: np.ndarray):
    while isinstance(array, np.ndarray) and array.base is not None:
        array = array.base
    return array.obj if isinstance(array, memoryview) else array


def test_copies_keep_contents_types_and_alignment():
    arrays = [np.arange(10, dtype=np.uint8), np.arange(12, dtype=np.int64).reshape(3, 4),
              np.empty(0, dtype=np.int32), np.full(7, -1, dtype=np.int32), np.array([True, False])]
    copies = hugepages.in_huge_pages(arrays)
    for array, copy in zip(arrays, copies):
        assert copy.dtype == array.dtype and copy.shape == array.shape and np.array_equal(copy, array)
        assert copy.flags.c_contiguous and copy.flags.writeable and copy.flags.aligned
        assert copy.ctypes.data % hugepages.ARRAY_ALIGNMENT == 0
    copies[0][:] = 0  # the copies are the caller's, not views of the originals
    assert arrays[0].tolist() == list(range(10))
    if hugepages._supported():
        assert len({id(_mapping_of(copy)) for copy in copies}) == 1
        assert isinstance(_mapping_of(copies[0]), mmap.mmap)
        assert copies[0].ctypes.data % hugepages.HUGE_PAGE_BYTES == 0  # the first starts a huge page


def test_empty_arrays_do_not_overlap():
    a, b, c = hugepages.empty_in_huge_pages([(5, np.uint8), ((2, 3), np.int64), (1000, np.int32)])
    a[:] = 1
    b[:] = 2
    c[:] = 3
    assert (a == 1).all() and (b == 2).all() and (c == 3).all()


def test_plain_arrays_where_there_is_no_huge_page_advice(monkeypatch):
    monkeypatch.setattr(hugepages, "_supported", lambda: False)
    (copy,) = hugepages.in_huge_pages([np.arange(4, dtype=np.int64)])
    assert copy.base is None and copy.tolist() == [0, 1, 2, 3]


def test_plain_arrays_when_no_mapping_can_be_made(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(hugepages.mmap, "mmap", refuse)
    (copy,) = hugepages.in_huge_pages([np.arange(3, dtype=np.int32)])
    assert copy.base is None and copy.tolist() == [0, 1, 2]


@pytest.mark.skipif(not hugepages._supported(), reason="no MADV_HUGEPAGE here")
def test_a_tokenizers_tables_and_piece_caches_are_in_huge_page_mappings():
    """The tables in one mapping; a piece cache's short table and pair memo in one each (so either can grow
    on its own); its general table, reserved at full size, in plain arrays backed as they are written."""
    tok = kimi_tok.kimi_k3()
    tables = tok.engine.stages.tables
    assert len({id(_mapping_of(array)) for array in tables}) == 1
    assert isinstance(_mapping_of(tables.pair_slots), mmap.mmap)
    cache = bpe.new_piece_cache()
    assert isinstance(_mapping_of(cache.short_slots), mmap.mmap) and isinstance(_mapping_of(cache.pair_memo), mmap.mmap)
    assert _mapping_of(cache.short_slots) is not _mapping_of(cache.pair_memo)
    assert not any(isinstance(_mapping_of(array), mmap.mmap) for array in cache[:8])  # the general table
    assert (cache.slots == bpe.tables.EMPTY).all() and not cache.used.any()
    assert not cache.short_slots.any() and not cache.pair_memo.any()  # empty: merged pieces only, no copy
    assert isinstance(_mapping_of(tok.engine.stages.pretokenizer.scan_table), mmap.mmap)
