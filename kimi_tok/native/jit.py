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
again) and one warning says so. The cache is dropped whole when any module that
holds compiled code changed (``drop_stale_kernel_caches``), and subscripts known to
be non-negative are written ``a[index(i)]`` (``index``).
"""

from __future__ import annotations

import ast
import hashlib
import os
import warnings
from pathlib import Path

import numba as nb
import numpy as np

_warned = False

PACKAGE_DIR = Path(__file__).resolve().parent.parent
STAMP_NAME = "kimi_tok-kernels.stamp"  # in the package's top __pycache__


def _imported_modules(path: Path, package_dir: Path) -> set[Path]:
    """The package's modules that ``path`` imports by relative imports (``from .x import y``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            parts = node.module.split(".") if node.module else []
            for name in [None, *(alias.name for alias in node.names)]:  # a package, or modules of it
                target = base.joinpath(*parts, *([name] if name else []))
                for candidate in (target.with_suffix(".py"), target / "__init__.py"):
                    if candidate.is_file() and package_dir in candidate.parents:
                        found.add(candidate)
    return found


def compiled_modules(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The modules whose code or constants can end up in a compiled kernel: those that use this
    module's decorators (and ``native/``), and the modules they import from."""
    kernels = [path for path in sorted(package_dir.rglob("*.py"))
               if path.parent.name == "native" or ".jit import" in path.read_text("utf-8", errors="replace")]
    found = set(kernels)
    for path in kernels:
        found |= _imported_modules(path, package_dir)
    return sorted(found)


def sources_stamp(package_dir: Path = PACKAGE_DIR) -> str:
    """A digest of the path, size and modification time of every module that holds compiled code."""
    digest = hashlib.sha256()
    for path in compiled_modules(package_dir):
        stat = path.stat()
        digest.update(f"{path.relative_to(package_dir)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def drop_stale_kernel_caches(package_dir: Path = PACKAGE_DIR) -> bool:
    """Delete numba's cached kernels in the package's ``__pycache__`` folders if any module holding
    compiled code (``compiled_modules``) changed since they were written; returns whether it did.

    numba checks a cached kernel against its own file only: a kernel that inlines a function from
    another module keeps the old machine code after that module is edited (measured here: an
    edited chunking.py left ``encoder.cut_packed`` at its old speed, 23 vs 3 us, until its cache
    was deleted; it could as well keep old behaviour). An installed package is replaced whole, so
    every file's stamp changes and numba drops them itself; this is for trees that are edited.
    A read-only tree is left alone (numba then caches elsewhere, per file, as before).
    """
    cache_dir = package_dir / "__pycache__"
    stamp_file = cache_dir / STAMP_NAME
    stamp = sources_stamp(package_dir)
    try:
        if stamp_file.read_text() == stamp:
            return False
    except OSError:  # no stamp yet
        pass
    try:
        cache_dir.mkdir(exist_ok=True)
        stale = [path for pattern in ("*.nbi", "*.nbc") for path in package_dir.rglob(f"__pycache__/{pattern}")]
        for path in stale:
            path.unlink(missing_ok=True)
        partial = cache_dir / f"{STAMP_NAME}.{os.getpid()}"
        partial.write_text(stamp)
        os.replace(partial, stamp_file)  # processes importing at once each write a whole stamp
    except OSError:
        return False
    return bool(stale)


drop_stale_kernel_caches()


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


# Hot kernels write a subscript known to be >= 0 as ``a[index(i)]``: numba wraps a negative signed
# index around (``a[-1]`` is the last item), a compare and select on every access that also keeps
# loops from vectorizing; an unsigned index skips that. Measured: BPE of a fresh prompt 15-20% faster.
index = np.uintp

kernel = _njit(nogil=True)
leaf = _njit(nogil=True, _nrt=False)
leaf_inline = _njit(nogil=True, _nrt=False, inline="always")
