"""``simd.utf8_block``: 16 code units to UTF-8 in one vector step (one byte compress where the CPU has AVX-512
VBMI2, a compress LLVM spells out byte by byte elsewhere); checked here on every code point, whichever of the
two this machine compiles. ``utf8_of_code_points`` takes it only where it is one instruction
(``has_byte_compress``); tests/pipeline/test_packing.py checks that loop on whole texts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from kimi_tok.native import jit

UNITS = 16


@pytest.fixture(scope="module")
def blocks():
    jit.materialize()
    import numba

    from kimi_tok.native.simd import utf8_block

    @numba.njit(cache=False)
    def transcode_blocks(units, out, lengths):
        """Each block of 16 units at ``out[64 * b:]``, its length (or -1) in ``lengths[b]``."""
        for b in range(units.shape[0] // UNITS):
            lengths[b] = utf8_block(units, UNITS * b, out, 64 * b)

    def run(code_points, dtype):
        units = np.array(code_points, dtype=dtype)
        n_blocks = len(code_points) // UNITS
        out = np.zeros(64 * n_blocks, dtype=np.uint8)
        lengths = np.zeros(n_blocks, dtype=np.int64)
        transcode_blocks(units, out, lengths)
        return out, lengths

    return run


def _check(code_points, out, lengths):
    for b, length in enumerate(lengths):
        chars = "".join(map(chr, code_points[UNITS * b:UNITS * (b + 1)]))
        try:
            want = chars.encode("utf-8")
        except UnicodeEncodeError:
            assert length == -1, (b, chars)
            continue
        assert length == len(want), (b, chars)
        assert bytes(out[64 * b:64 * b + length]) == want, (b, chars)


@pytest.mark.parametrize("dtype, end", [(np.uint8, 0x100), (np.uint16, 0x10000), (np.uint32, 0x110000)])
def test_every_code_point_in_order_and_shuffled(blocks, dtype, end):
    code_points = list(range(end))
    _check(code_points, *blocks(code_points, dtype))  # neighbours: one width a block, surrogates together
    random.Random(end).shuffle(code_points)
    _check(code_points, *blocks(code_points, dtype))  # widths mixed in a block, a surrogate in some


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_a_surrogate_in_every_lane(blocks, dtype):
    for lane in range(UNITS):
        for surrogate in (0xD800, 0xDBFF, 0xDC00, 0xDFFF):
            code_points = [0x4E2D] * UNITS
            code_points[lane] = surrogate
            _, lengths = blocks(code_points + [0xD7FF] * UNITS + [0xE000] * UNITS, dtype)
            assert list(lengths) == [-1, 48, 48]


def test_has_byte_compress_follows_the_cpu_the_kernels_are_compiled_for():
    jit.materialize()
    import numba
    from numba.core.registry import cpu_target

    from kimi_tok.native.simd import BYTE_COMPRESS_FEATURE, has_byte_compress

    features = cpu_target.target_context.codegen()._tm_features.split(",")
    assert numba.njit(lambda: has_byte_compress())() == (BYTE_COMPRESS_FEATURE in features)
