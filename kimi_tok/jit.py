"""The two ways kimi_tok compiles with numba.

``kernel``: a stage entry point; may allocate arrays (uses numba's reference
counting runtime, NRT). ``leaf``: a helper that reads and writes arrays it is
given but never allocates, compiled without NRT. Measured: with NRT, numba wraps
calls that pass arrays in atomic incref/decref pairs that its pruning pass
misses on branchy code; the Kimi scanner ran 5x slower (156 ms vs 30 ms per
4 MB) for that alone. All are cached on disk and release the GIL.

Where numba finds no writable cache location (a read-only install with no
writable ``NUMBA_CACHE_DIR`` or ``~/.cache``), ``cache=True`` raises at import;
the kernels are then compiled without the disk cache (every process compiles
again, ~20 s) and one warning says so.
"""

from __future__ import annotations

import warnings

import numba as nb

_warned = False


def _njit(**options):
    cached = nb.njit(cache=True, **options)
    uncached = nb.njit(cache=False, **options)

    def decorate(func):
        global _warned
        try:
            return cached(func)
        except RuntimeError as e:  # numba: "cannot cache function ...: no locator available"
            if "cannot cache" not in str(e):
                raise
            if not _warned:
                _warned = True
                warnings.warn(
                    "kimi_tok: numba has no writable cache directory, so kernels are compiled in every "
                    "process (~20 s); set NUMBA_CACHE_DIR to a writable directory to cache them",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return uncached(func)

    return decorate


kernel = _njit(nogil=True)
leaf = _njit(nogil=True, _nrt=False)
leaf_inline = _njit(nogil=True, _nrt=False, inline="always")
