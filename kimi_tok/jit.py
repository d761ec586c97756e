"""The two ways kimi_tok compiles with numba.

``kernel``: a stage entry point; may allocate arrays (uses numba's reference
counting runtime, NRT). ``leaf``: a helper that reads and writes arrays it is
given but never allocates, compiled without NRT. Measured: with NRT, numba wraps
calls that pass arrays in atomic incref/decref pairs that its pruning pass
misses on branchy code; the Kimi scanner ran 5x slower (156 ms vs 30 ms per
4 MB) for that alone. All are cached on disk and release the GIL.
"""

from __future__ import annotations

import numba as nb

kernel = nb.njit(cache=True, nogil=True)
leaf = nb.njit(cache=True, nogil=True, _nrt=False)
leaf_inline = nb.njit(cache=True, nogil=True, _nrt=False, inline="always")
