"""The ways kimi_tok compiles with numba, and the machinery around its cached kernels.

``kernel``: a stage entry point; may allocate arrays (uses numba's reference
counting runtime, NRT). ``leaf``: a helper that reads and writes arrays it is
given but never allocates, compiled without NRT. Measured: with NRT, numba wraps
calls that pass arrays in atomic incref/decref pairs that its pruning pass
misses on branchy code; the Kimi scanner ran 5x slower (156 ms vs 30 ms per
4 MB) for that alone. ``leaf_inline``: a leaf whose body numba copies into each
caller. All are cached on disk and release the GIL.

Every function they compile is a ``KernelDispatcher`` listed in ``KERNELS``. A kernel called
from another with a constant argument is compiled for the argument's type, not for the
constant (numba's default compiles one copy per constant: ``KernelDispatcher``), and
numba's inliner copies a callee's IR once per call site rather than once per block
(``_inline_ir_with_one_memo``); together they cut the first compile by about a third
(docs/performance.md, "First use and load time"). The first kernel a process compiles prints
one line to stderr (``compile_notice``): what is compiled, how long it takes, where it is
cached and how to build it ahead (``kimi_tok.warmup()``, ``kimi-tok warmup``).

Where numba finds no writable cache location (a read-only install with no
writable ``NUMBA_CACHE_DIR`` or ``~/.cache``), ``cache=True`` raises at import;
the kernels are then compiled without the disk cache (every process compiles
again) and one warning says so. The cache is dropped whole when any module that
holds compiled code changed (``drop_stale_kernel_caches``), and subscripts known to
be non-negative are written ``a[index(i)]`` (``index``).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import os
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import numba as nb
import numpy as np
from llvmlite import binding as llvm
from numba.core import config, errors, event, types
from numba.core.caching import (CompileResultCacheImpl, FunctionCache, InTreeCacheLocator, NullCache,
                                UserProvidedCacheLocator)
from numba.core.codegen import JITCodeLibrary
from numba.core.compiler import CompileResult
from numba.core.registry import CPUDispatcher

_warned = False

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
    if config.CACHE_DIR:
        return [Path(config.CACHE_DIR, "_".join([folder.name, hashlib.sha1(str(folder).encode()).hexdigest()]))
                for folder in folders]
    return [folder / "__pycache__" for folder in folders]


def _stamp_file(package_dir: Path) -> Path:
    if config.CACHE_DIR:  # one cache directory may hold several trees' kernels
        return Path(config.CACHE_DIR, f"{hashlib.sha1(str(package_dir).encode()).hexdigest()[:16]}-{STAMP_NAME}")
    return package_dir / "__pycache__" / STAMP_NAME


def _ready_file(package_dir: Path = PACKAGE_DIR) -> Path:
    stamp = _stamp_file(package_dir)
    return stamp.with_name(stamp.name.replace(STAMP_NAME, READY_NAME))


def kernels_signature(package_dir: Path = PACKAGE_DIR) -> str:
    """What kernels cached here are good for: these modules, this numba and Python, this CPU."""
    cpu = f"{llvm.get_host_cpu_name()}:{llvm.get_host_cpu_features().flatten()}"
    text = f"{tree_stamp(package_dir)}|{nb.__version__}|{sys.version}|{cpu}"
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


# -- compiling ----------------------------------------------------------------------------------


class KernelDispatcher(CPUDispatcher):
    """numba's CPU dispatcher, except that a call from compiled code with constant arguments is
    compiled for their types. numba types a constant ``0`` as ``Literal[int](0)`` and compiles a
    callee once per distinct constant: the BPE kernels were compiled 2-4 times each, a fifth of the
    first compile. LLVM still sees the constants where it inlines. A callee that needs a constant
    (``literally``, indexing a heterogeneous tuple) fails to type without it and gets it."""

    def get_call_template(self, args, kws):
        plain = tuple(types.unliteral(arg) for arg in args)
        plain_kws = {name: types.unliteral(arg) for name, arg in kws.items()}
        if plain != tuple(args) or plain_kws != kws:
            try:
                return super().get_call_template(plain, plain_kws)
            except errors.TypingError:
                pass
        return super().get_call_template(args, kws)


KERNELS: dict[str, KernelDispatcher] = {}  # "module.qualname" -> dispatcher, in definition order
COMPILED: list[tuple[str, tuple]] = []  # (name, argument types) of every kernel this process compiled


def _warn_uncached() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"kimi_tok: numba has no writable cache directory, so kernels are compiled in every process "
            f"(~{COLD_COMPILE_SECONDS} s); set NUMBA_CACHE_DIR to a writable directory to cache them",
            RuntimeWarning, stacklevel=3)


class _DeferredCache:
    """A kernel's disk cache (``KernelCache``), made when the kernel is first compiled or loaded:
    numba makes it at definition, which finds the cache folder, checks that it is writable (a
    temporary file) and hashes the source, for each of the ~100 kernels of every import. Where
    numba finds no writable cache folder, the kernel is compiled in every process (one warning)."""

    def __init__(self, py_func) -> None:
        self._py_func = py_func
        self._cache = None

    def _made(self):
        if self._cache is None:
            try:
                self._cache = KernelCache(self._py_func)
            except RuntimeError as e:  # numba: "cannot cache function ...: no locator available"
                if "cannot cache" not in str(e):
                    raise
                _warn_uncached()
                self._cache = NullCache()
        return self._cache

    @property
    def cache_path(self):
        return self._made().cache_path

    def load_overload(self, sig, target_context):
        return self._made().load_overload(sig, target_context)

    def save_overload(self, sig, data):
        return self._made().save_overload(sig, data)

    def flush(self) -> None:
        self._made().flush()

    def __getattr__(self, name):
        return getattr(self._made(), name)


def _njit(**options):
    compile_with = nb.njit(cache=False, **options)

    def decorate(func):
        dispatcher = compile_with(func)
        if isinstance(dispatcher, CPUDispatcher):  # not with NUMBA_DISABLE_JIT
            dispatcher._cache = _DeferredCache(func)  # what ``cache=True`` sets up, made when first used
            dispatcher.__class__ = KernelDispatcher
            KERNELS[f"{func.__module__}.{func.__qualname__}"] = dispatcher
        return dispatcher

    return decorate


# -- loading cached kernels -----------------------------------------------------------------------
#
# A cached kernel holds its machine code and, for linking into kernels compiled later, its LLVM
# bitcode. numba parses that bitcode and lists its symbols on every load, ~2/3 of a load
# (measured: 115 of ~190 ms for the fan-out kernels); a process whose kernels are all cached never
# links one. So a kernel loaded from the cache parses its bitcode only when a compile links it.


class _LazyBitcodeLibrary(JITCodeLibrary):
    """A library loaded from the cache whose bitcode is parsed when first linked into a compile."""

    _pending_bitcode: bytes | None = None

    @property
    def _shared_module(self):
        if self._pending_bitcode is not None:
            bitcode, self._pending_bitcode = self._pending_bitcode, None
            self.__dict__["_parsed_shared_module"] = llvm.parse_bitcode(bitcode)
        return self.__dict__.get("_parsed_shared_module")

    @_shared_module.setter
    def _shared_module(self, module) -> None:
        self.__dict__["_parsed_shared_module"] = module


class _KernelCacheImpl(CompileResultCacheImpl):
    def rebuild(self, target_context, payload):
        """``CompileResult._rebuild`` with a ``_LazyBitcodeLibrary``; numba's own for anything else."""
        codegen = target_context.codegen()
        if len(payload) != 9 or codegen._library_class is not JITCodeLibrary or payload[0][1] != "object":
            return super().rebuild(target_context, payload)
        libdata, fndesc, env, signature, objectmode, lifted, typeann, reload_init, referenced_envs = payload
        for fn in reload_init or ():
            fn()
        name, _, (object_code, bitcode) = libdata
        library = _LazyBitcodeLibrary(codegen, name)
        library.enable_object_caching()
        library._set_compiled_object(object_code)
        library._pending_bitcode = bitcode
        library._finalize_final_module()
        # what numba learns from the bitcode's symbols: the names a caller looks up in this library
        codegen._engine._defined_symbols.update(
            {fndesc.llvm_func_name, fndesc.llvm_cpython_wrapper_name, fndesc.llvm_cfunc_wrapper_name})
        cfunc = target_context.get_executable(library, fndesc, env)
        result = CompileResult(target_context=target_context, typing_context=target_context.typing_context,
                               library=library, environment=env, entry_point=cfunc, fndesc=fndesc,
                               type_annotation=typeann, signature=signature, objectmode=objectmode, lifted=lifted,
                               typing_error=None, call_helper=None, metadata=None, reload_init=reload_init,
                               referenced_envs=referenced_envs)
        for referenced in referenced_envs:
            library.codegen.set_env(referenced.env_name, referenced)
        return result


class KernelCache(FunctionCache):
    """numba's per-function disk cache, loading with ``_LazyBitcodeLibrary``; a folder it cannot
    write but that holds kernels already is read (``_PrebuiltFolder``), and a kernel compiled there
    is not saved."""

    _impl_class = _KernelCacheImpl

    def save_overload(self, sig, data) -> None:
        if getattr(self._impl.locator, "read_only", False):
            return
        try:
            super().save_overload(sig, data)
        except OSError:  # the folder became unwritable (or full): the kernel is compiled again next time
            pass


_folder_checks: dict[str, tuple[bool, bool]] = {}  # folder -> (writable, holds cached kernels)


def _writable(folder: str) -> bool:
    """Whether kernels can be saved in ``folder`` (created if missing), as numba checks it."""
    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
        return True
    except OSError:
        return False


def _check_folder(folder: str) -> tuple[bool, bool]:
    checked = _folder_checks.get(folder)
    if checked is None:
        writable = _writable(folder)
        try:
            holds = not writable and any(name.endswith(".nbi") for name in os.listdir(folder))
        except OSError:
            holds = False
        checked = _folder_checks[folder] = (writable, holds)
    return checked


class _PrebuiltFolder:
    """numba takes a cache folder only if it can write there, so a cache built ahead (``kimi-tok
    warmup`` in a container image, a wheel's install step) is ignored where the files are read-only
    when it runs, and every process compiles again. This takes such a folder for reading when it
    holds cached kernels; saving is skipped (``KernelCache.save_overload``)."""

    read_only = False

    @classmethod
    def from_function(cls, py_func, py_file):
        if not os.path.exists(py_file):
            return None
        self = cls(py_func, py_file)
        writable, holds_kernels = _check_folder(self.get_cache_path())
        if writable:
            return self
        if holds_kernels:
            self.read_only = True
            return self
        return None

    def ensure_cache_path(self) -> None:
        if not self.read_only:
            super().ensure_cache_path()


class _PrebuiltUserProvidedFolder(_PrebuiltFolder, UserProvidedCacheLocator):
    @classmethod
    def from_function(cls, py_func, py_file):
        return super().from_function(py_func, py_file) if config.CACHE_DIR else None


class _PrebuiltInTreeFolder(_PrebuiltFolder, InTreeCacheLocator):
    pass


_KernelCacheImpl._locator_classes = [_PrebuiltUserProvidedFolder, _PrebuiltInTreeFolder,
                                     *CompileResultCacheImpl._locator_classes[2:]]


def cache_location() -> str:
    """Where the kernels are cached, in words (for messages)."""
    for name, dispatcher in KERNELS.items():
        if name.startswith("kimi_tok.") and isinstance(dispatcher._cache, _DeferredCache):
            made = dispatcher._cache._made()
            if isinstance(made, NullCache):
                break
            path = Path(made.cache_path)
            return f"the __pycache__ folders under {PACKAGE_DIR}" if PACKAGE_DIR in path.parents else str(path.parent)
    return "nowhere: numba has no writable cache directory (set NUMBA_CACHE_DIR)"


_notice = {"printed": False, "workers": 1}
_notice_lock = threading.Lock()


def caches_kernels() -> bool:
    """Whether compiled kernels are saved where later processes find them (else each compiles them)."""
    if config.DISABLE_JIT:
        return False
    for name, dispatcher in KERNELS.items():
        if name.startswith("kimi_tok.") and isinstance(dispatcher._cache, _DeferredCache):
            made = dispatcher._cache._made()
            return not isinstance(made, NullCache) and not getattr(made._impl.locator, "read_only", False)
    return False


def compile_notice(workers: int = 1, background: bool = False) -> str:
    """The line printed when kernels are compiled: what, why, about how long, where, and how to do it ahead."""
    seconds = max(5, round(COLD_COMPILE_SECONDS / max(1, min(workers, 4)) * 1.2))
    where = "NUMBA_CACHE_DIR=" + config.CACHE_DIR if config.CACHE_DIR else cache_location()
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


class _CompileListener(event.Listener):
    """Records every compile of a kimi_tok kernel (a cache miss); the first one prints the notice."""

    def on_start(self, ev) -> None:
        dispatcher = ev.data.get("dispatcher")
        if isinstance(dispatcher, KernelDispatcher):
            COMPILED.append((f"{dispatcher.py_func.__module__}.{dispatcher.py_func.__qualname__}",
                             tuple(ev.data.get("args", ()))))
            if not _notice["printed"]:
                announce_compile(_notice["workers"])

    def on_end(self, ev) -> None:
        pass


event.register("numba:compile", _CompileListener())


# numba's inliner (``inline="always"``) copies the callee's IR block by block, each block with a
# ``copy.deepcopy`` of its own, so every block drags along its own copy of the callee's whole
# scope: quadratic in the callee's size. One memo per inlining copies the scope once; the IR it
# produces is the same (checked: identical LLVM for the Kimi scanner). Measured: the scanner's
# inlining took 8.4 of 54 s of a first compile before, 1.0 s after.
try:
    from numba.core import inline_closurecall as _inliner

    _numba_inline_ir = _inliner.InlineWorker.inline_ir
    _inliner.copy  # noqa: B018 (the module it copies with: replaced during one inlining)
except (ImportError, AttributeError):  # another numba: its own inliner
    _inliner = None


class _OneMemoCopy:
    """The ``copy`` module as the inliner sees it during one inlining: one memo for all blocks."""

    def __init__(self) -> None:
        self.memo: dict = {}

    def deepcopy(self, x, memo=None):
        return copy.deepcopy(x, self.memo if memo is None else memo)

    def __getattr__(self, name):
        return getattr(copy, name)


def _inline_ir_with_one_memo(self, *args, **kwargs):
    saved = _inliner.copy
    _inliner.copy = _OneMemoCopy()  # numba compiles under its global lock: no other inlining meanwhile
    try:
        return _numba_inline_ir(self, *args, **kwargs)
    finally:
        _inliner.copy = saved


if _inliner is not None:
    _inliner.InlineWorker.inline_ir = _inline_ir_with_one_memo


# Hot kernels write a subscript known to be >= 0 as ``a[index(i)]``: numba wraps a negative signed
# index around (``a[-1]`` is the last item), a compare and select on every access that also keeps
# loops from vectorizing; an unsigned index skips that. Measured: BPE of a fresh prompt 15-20% faster.
index = np.uintp

kernel = _njit(nogil=True)
leaf = _njit(nogil=True, _nrt=False)
leaf_inline = _njit(nogil=True, _nrt=False, inline="always")
