"""The ways kimi_tok compiles with numba, and the machinery around its cached kernels.

``kernel``: a stage entry point; may allocate arrays (uses numba's reference
counting runtime, NRT). ``leaf``: a helper that reads and writes arrays it is
given but never allocates, compiled without NRT. Measured: with NRT, numba wraps
calls that pass arrays in atomic incref/decref pairs that its pruning pass
misses on branchy code; the Kimi scanner ran 5x slower (156 ms vs 30 ms per
4 MB) for that alone. ``leaf_inline``: a leaf whose body numba copies into each
caller. All are cached on disk and release the GIL.

This module does not import numba: the decorators declare a kernel (``Declared``) and
``materialize`` imports numba and makes every declared one a numba dispatcher
(``numba_backend``), rebinding the package's names to them, on the first call of any kernel or
when a Tokenizer loads its compiled path (``import kimi_tok`` stays ~0.3 s faster, and a first
call can run on the interpreted engine while a thread loads the kernels). Every compiled kernel
is a ``numba_backend.KernelDispatcher`` listed in ``KERNELS``: a kernel called from another with
a constant argument is compiled for the argument's type, not for the constant, and numba's
inliner copies a callee's IR once per call site rather than once per block; together they cut
the first compile by about a third (docs/performance.md, "First use and load time"). The first
kernel a process compiles prints one line to stderr (``compile_notice``): what is compiled, how
long it takes, where it is cached and how to build it ahead (``kimi_tok.warmup()``,
``kimi-tok warmup``).

Where numba finds no writable cache location (a read-only install with no
writable ``NUMBA_CACHE_DIR`` or ``~/.cache``), ``cache=True`` raises at import;
the kernels are then compiled without the disk cache (every process compiles
again) and one warning says so. The cache is dropped whole when any module that
holds compiled code changed (``drop_stale_kernel_caches``), and subscripts known to
be non-negative are written ``a[index(i)]`` (``index``).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.util
import os
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

PACKAGE_DIR = Path(__file__).resolve().parent.parent
STAMP_NAME = "kimi_tok-kernels.stamp"  # in the package's top __pycache__ (and in NUMBA_CACHE_DIR)
READY_NAME = "kimi_tok-kernels.ready"  # beside the stamp: the warm-up paths whose kernels are all cached
WORKER_ENV = "KIMI_TOK_COMPILE_WORKER"  # set in warm-up worker processes: their parent prints the notice
COLD_COMPILE_SECONDS = 60  # every path of a default Tokenizer on one core from an empty cache (docs/performance.md)


# -- the stale-cache guard ----------------------------------------------------------------------


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


def _python_files(package_dir: Path) -> list[Path]:
    """Every ``.py`` file of the package, ``__pycache__`` folders not walked (they hold the kernels)."""
    found = []
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(root, name) for name in sorted(files) if name.endswith(".py")]
    return found


def compiled_modules(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The modules whose code or constants can end up in a compiled kernel: those that use this
    module's decorators (and ``native/``), and the modules they import from."""
    kernels = [path for path in _python_files(package_dir)
               if path.parent.name == "native" or ".jit import" in path.read_text("utf-8", errors="replace")]
    found = set(kernels)
    for path in kernels:
        found |= _imported_modules(path, package_dir)
    return sorted(found)


def _stat_digest(paths: list[Path], package_dir: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        stat = path.stat()
        digest.update(f"{path.relative_to(package_dir)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def sources_stamp(package_dir: Path = PACKAGE_DIR) -> str:
    """A digest of the path, size and modification time of every module that holds compiled code."""
    return _stat_digest(compiled_modules(package_dir), package_dir)


def tree_stamp(package_dir: Path = PACKAGE_DIR) -> str:
    """The same digest over every module of the package: when it is unchanged, so are the compiled
    modules, and an import checks no more than that (~80 ``stat`` calls; reading and parsing the
    modules to find the compiled ones costs ~10x more)."""
    return _stat_digest(_python_files(package_dir), package_dir)


def kernel_cache_dirs(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Where numba caches the package's kernels: the ``__pycache__`` folders next to the modules,
    or with ``NUMBA_CACHE_DIR`` set, the folders numba names after each source folder there."""
    folders = sorted({path.parent for path in _python_files(package_dir)})
    if numba_cache_dir():
        return [Path(numba_cache_dir(), "_".join([folder.name, hashlib.sha1(str(folder).encode()).hexdigest()]))
                for folder in folders]
    return [folder / "__pycache__" for folder in folders]


def _stamp_file(package_dir: Path) -> Path:
    if numba_cache_dir():  # one cache directory may hold several trees' kernels
        return Path(numba_cache_dir(), f"{hashlib.sha1(str(package_dir).encode()).hexdigest()[:16]}-{STAMP_NAME}")
    return package_dir / "__pycache__" / STAMP_NAME


def _ready_file(package_dir: Path = PACKAGE_DIR) -> Path:
    stamp = _stamp_file(package_dir)
    return stamp.with_name(stamp.name.replace(STAMP_NAME, READY_NAME))


def numba_cache_dir() -> str:
    """``NUMBA_CACHE_DIR`` as numba reads it (its config once imported, else the environment)."""
    numba = sys.modules.get("numba")
    config = getattr(getattr(numba, "core", None), "config", None)
    return config.CACHE_DIR if config is not None else os.environ.get("NUMBA_CACHE_DIR", "")


def _cpu_identity() -> str:
    """The CPU kernels are compiled for: its model and feature flags (``/proc/cpuinfo``; LLVM's
    host CPU where there is none). Read without loading LLVM (~50 ms)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            wanted = ("vendor_id", "model name", "flags", "isa", "features", "cpu model", "Features")
            return "|".join(line.strip() for line in f.read().split("\n\n")[0].split("\n")
                            if line.split(":")[0].strip() in wanted)
    except OSError:
        from llvmlite import binding as llvm

        return f"{llvm.get_host_cpu_name()}:{llvm.get_host_cpu_features().flatten()}"


def _numba_identity() -> str:
    """The installed numba, without importing it: its location, and its ``__init__``'s size and time."""
    spec = importlib.util.find_spec("numba")
    if spec is None or spec.origin is None:
        return "no numba"
    stat = os.stat(spec.origin)
    return f"{spec.origin}:{stat.st_size}:{stat.st_mtime_ns}"


def kernels_signature(package_dir: Path = PACKAGE_DIR) -> str:
    """What kernels cached here are good for: these modules, this numba and Python, this CPU
    (computed without importing numba)."""
    text = f"{tree_stamp(package_dir)}|{_numba_identity()}|{sys.version}|{_cpu_identity()}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_paths(package_dir: Path = PACKAGE_DIR) -> set[str]:
    """The warm-up paths (``reuse.warmup``) whose kernels a process cached for this signature: a
    Tokenizer whose paths are all here loads its kernels, any other compiles them first."""
    try:
        lines = _ready_file(package_dir).read_text().split("\n")
    except OSError:
        return set()
    if lines[0] != kernels_signature(package_dir):
        return set()
    return {line for line in lines[1:] if line}


def record_cached_paths(paths, package_dir: Path = PACKAGE_DIR) -> None:
    """Add ``paths`` to the ones ``cached_paths`` lists (appended: processes compiling at once each
    add theirs); nothing where the cache cannot be written."""
    ready = _ready_file(package_dir)
    signature = kernels_signature(package_dir)
    try:
        try:
            lines = ready.read_text().split("\n")
        except OSError:
            lines = [""]
        if lines[0] != signature:
            partial = ready.with_name(f"{ready.name}.{os.getpid()}")
            partial.write_text(signature + "\n")
            os.replace(partial, ready)
            lines = [signature]
        new = [path for path in dict.fromkeys(paths) if path not in lines]
        if new:
            with open(ready, "a") as f:
                f.write("".join(f"{path}\n" for path in new))
    except OSError:
        pass


def drop_stale_kernel_caches(package_dir: Path = PACKAGE_DIR) -> bool:
    """Delete numba's cached kernels of the package (``kernel_cache_dirs``) if any module holding
    compiled code (``compiled_modules``) changed since they were written; returns whether it did.

    numba checks a cached kernel against its own file only: a kernel that inlines a function from
    another module keeps the old machine code after that module is edited (measured here: an
    edited chunking.py left ``encoder.cut_packed`` at its old speed, 23 vs 3 us, until its cache
    was deleted; it could as well keep old behaviour). An installed package is replaced whole, so
    every file's stamp changes and numba drops them itself; this is for trees that are edited.
    A read-only tree is left alone (numba then caches elsewhere, per file, as before).

    The stamp file holds two digests: of every module's path, size and modification time (checked
    first: equal means nothing changed) and of the compiled modules only (an edit elsewhere keeps
    the kernels and only updates the first digest).
    """
    stamp_file = _stamp_file(package_dir)
    tree = tree_stamp(package_dir)
    try:
        stored_tree, stored = stamp_file.read_text().split("\n")[:2]
    except (OSError, ValueError):  # no stamp yet, or an older format
        stored_tree, stored = "", None
    if stored_tree == tree:
        return False
    stamp = sources_stamp(package_dir)
    stale = []
    try:
        stamp_file.parent.mkdir(parents=True, exist_ok=True)
        if stored != stamp:
            stale = [path for folder in kernel_cache_dirs(package_dir) if folder.is_dir()
                     for path in folder.iterdir() if path.suffix in (".nbi", ".nbc")]
            for path in stale:
                path.unlink(missing_ok=True)
            _ready_file(package_dir).unlink(missing_ok=True)
        partial = stamp_file.with_name(f"{stamp_file.name}.{os.getpid()}")
        partial.write_text(f"{tree}\n{stamp}\n")
        os.replace(partial, stamp_file)  # processes importing at once each write a whole stamp
    except OSError:
        return False
    return bool(stale)


drop_stale_kernel_caches()


# -- declaring and materializing -----------------------------------------------------------------


KERNELS: dict[str, object] = {}  # "module.qualname" -> numba dispatcher, in definition order (once materialized)
COMPILED: list[tuple[str, tuple]] = []  # (name, argument types) of every kernel this process compiled


class Declared:
    """A function to compile with numba, declared before numba is imported. Calling it (or reading
    a dispatcher attribute such as ``signatures``) materializes every declared function first;
    ``materialize`` also rebinds the package's names to the compiled ones, so hot paths never pass
    through this object."""

    def __init__(self, py_func, kind: str, options: dict) -> None:
        functools.update_wrapper(self, py_func)
        self.py_func = py_func
        self.kind = kind  # "function" (numba.njit) or "intrinsic" (numba.extending.intrinsic)
        self.options = options
        self._compiled = None

    def compiled(self):
        if self._compiled is None:
            materialize()
        return self._compiled

    def __call__(self, *args, **kwargs):
        return self.compiled()(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.compiled(), name)

    def __repr__(self) -> str:
        return f"<declared {self.kind} {self.py_func.__module__}.{self.py_func.__qualname__}>"


class DeferredModule:
    """A module imported when first used (``types = DeferredModule("numba.core.types")`` in code
    that builds intrinsics): the name resolves at typing time, after ``materialize``."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute):
        return getattr(importlib.import_module(self._name), attribute)


_declared: list[Declared] = []  # not yet materialized, in definition order
_materialize_lock = threading.RLock()
_backend = None  # numba_backend, once materialized


def materialized() -> bool:
    """Whether numba is imported and every declared function compiled-or-loadable (``materialize``)."""
    return _backend is not None


def materialize():
    """Import numba and make every declared function a numba dispatcher (or intrinsic); rebind the
    names that hold a declared function, in the package's modules and the modules that declared
    one, to what it became. Idempotent and thread-safe; returns ``numba_backend``."""
    global _backend
    if _backend is not None:
        return _backend
    with _materialize_lock:
        if _backend is None:
            from . import numba_backend as backend

            backend.attach(sys.modules[__name__])
            modules = {name for name in sys.modules if name == "kimi_tok" or name.startswith("kimi_tok.")}
            for declared in _declared:
                declared._compiled = _make(backend, declared)
                modules.add(declared.py_func.__module__)
            for name in modules:
                _rebind(sys.modules.get(name))
            _declared.clear()
            _backend = backend
    return _backend


def _make(backend, declared: Declared):
    return backend.make_dispatcher(declared) if declared.kind == "function" else backend.make_intrinsic(declared)


def _rebind(module) -> None:
    namespace = getattr(module, "__dict__", None)
    if namespace is None:
        return
    for key, value in list(namespace.items()):
        if isinstance(value, Declared):
            namespace[key] = value._compiled
        elif isinstance(value, DeferredModule):
            namespace[key] = importlib.import_module(value._name)


def _declare(kind: str, **options):
    def decorate(func):
        declared = Declared(func, kind, options)
        with _materialize_lock:
            if _backend is None:
                _declared.append(declared)
                return declared
        declared._compiled = _make(_backend, declared)  # a module imported after materialize
        return declared._compiled

    return decorate


def intrinsic(func):
    """``numba.extending.intrinsic``, declared (see ``Declared``)."""
    return _declare("intrinsic")(func)


def cache_location() -> str:
    """Where the kernels are cached, in words (for messages)."""
    return materialize().cache_location()


def caches_kernels() -> bool:
    """Whether compiled kernels are saved where later processes find them (else each compiles them)."""
    return materialize().caches_kernels()


def __getattr__(name: str):
    """numba-specific names (``KernelDispatcher``, the cache folders) from ``numba_backend``."""
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(materialize(), name)


def _writable(folder: str) -> bool:
    """Whether kernels can be saved in ``folder`` (created if missing), as numba checks it."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
        return True
    except OSError:
        return False


_notice = {"printed": False, "workers": 1}
_notice_lock = threading.Lock()


def compile_notice(workers: int = 1, background: bool = False) -> str:
    """The line printed when kernels are compiled: what, why, about how long, where, and how to do it ahead."""
    seconds = max(5, round(COLD_COMPILE_SECONDS / max(1, min(workers, 4)) * 1.2))
    where = "NUMBA_CACHE_DIR=" + numba_cache_dir() if numba_cache_dir() else cache_location()
    how = (f", in {workers} background process{'es' if workers > 1 else ''} (about {seconds} s; until then calls run "
           f"on a slower interpreted path with the same ids)" if background else f" (about {seconds} s)")
    return (f"kimi_tok: compiling its numba kernels for this machine, once{how}; later processes load "
            f"them in about a second from {where}; to do it ahead, e.g. in a container image or CI: "
            f"`kimi-tok warmup` or `python -c 'import kimi_tok; kimi_tok.warmup()'`")


def announce_compile(workers: int = 1, background: bool = False) -> bool:
    """Print ``compile_notice`` to stderr unless this process did already (or is a warm-up
    worker, whose parent does); returns whether it printed."""
    with _notice_lock:
        if _notice["printed"] or os.environ.get(WORKER_ENV):
            return False
        _notice["printed"] = True
    print(compile_notice(workers, background), file=sys.stderr, flush=True)
    return True


# Hot kernels write a subscript known to be >= 0 as ``a[index(i)]``: numba wraps a negative signed
# index around (``a[-1]`` is the last item), a compare and select on every access that also keeps
# loops from vectorizing; an unsigned index skips that. Measured: BPE of a fresh prompt 15-20% faster.
index = np.uintp

kernel = _declare("function", nogil=True)
leaf = _declare("function", nogil=True, _nrt=False)
leaf_inline = _declare("function", nogil=True, _nrt=False, inline="always")
