"""What kimi_tok compiles with, once numba is imported (``jit.materialize`` imports this module).

``native.jit`` declares the kernels without importing numba, so that ``import kimi_tok`` and a
first call on the interpreted engine do not wait for numba (~0.3 s) and its first kernel load;
this module turns each declared kernel into a numba dispatcher (``KernelDispatcher``) with a
disk cache made on first use (``_DeferredCache``, ``KernelCache``), loads cached kernels without
parsing their bitcode (``_LazyBitcodeLibrary``), reads cache folders it cannot write
(``_PrebuiltFolder``), records compiles (``_CompileListener``) and inlines with one memo.
"""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path

import numba as nb
from llvmlite import binding as llvm
from numba.core import config, errors, event, types
from numba.core.caching import (CompileResultCacheImpl, FunctionCache, InTreeCacheLocator, NullCache,
                                UserProvidedCacheLocator)
from numba.core.codegen import JITCodeLibrary
from numba.core.compiler import CompileResult
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic, typeof_impl

jit = None  # native.jit, which imports this module and hands itself over (``attach``): the registries live there
_warned = False


def attach(declaring_module) -> None:
    """Serve ``declaring_module`` (``native.jit``): its registries (``KERNELS``, ``COMPILED``, the
    notice), and its ``Declared`` objects typed as what they stand for."""
    global jit
    if jit is not None:
        return
    jit = declaring_module
    typeof_impl.register(jit.Declared)(_typeof_declared)
    event.register("numba:compile", _CompileListener())


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


def make_dispatcher(declared) -> CPUDispatcher:
    """The numba dispatcher of a declared kernel: cached on disk, listed in ``jit.KERNELS``."""
    func = declared.py_func
    dispatcher = nb.njit(cache=False, **declared.options)(func)
    if isinstance(dispatcher, CPUDispatcher):  # not with NUMBA_DISABLE_JIT
        dispatcher._cache = _DeferredCache(func)  # what ``cache=True`` sets up, made when first used
        dispatcher.__class__ = KernelDispatcher
        jit.KERNELS[f"{func.__module__}.{func.__qualname__}"] = dispatcher
    return dispatcher


def compiled_entry(dispatcher, args: tuple):
    """What ``dispatcher(*args)`` runs once numba has chosen it: the compiled function's entry point for
    these arguments' types (it still unboxes each argument), to call again with arguments of the same types
    without the dispatcher typing each one (``typeof`` of a structref is Python code: ~10 us a call after
    other work, docs/performance.md, "The fixed cost of a short call"). ``dispatcher`` itself where it has
    no such overload yet, or is not a numba dispatcher (``NUMBA_DISABLE_JIT``)."""
    if not isinstance(dispatcher, CPUDispatcher):
        return dispatcher
    found = dispatcher.overloads.get(tuple(dispatcher.typeof_pyval(arg) for arg in args))
    return dispatcher if found is None else found.entry_point


def make_intrinsic(declared):
    """numba's ``@intrinsic`` of a declared one."""
    return intrinsic(declared.py_func)


def _typeof_declared(value, context):
    """A reference the rebinding missed (a module outside the package that imported a kernel from
    another) types as what it stands for."""
    return typeof_impl(value.compiled(), context)


def _warn_uncached() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            f"kimi_tok: numba has no writable cache directory, so kernels are compiled in every process "
            f"(~{jit.COLD_COMPILE_SECONDS} s); set NUMBA_CACHE_DIR to a writable directory to cache them",
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


def _check_folder(folder: str) -> tuple[bool, bool]:
    checked = _folder_checks.get(folder)
    if checked is None:
        writable = jit._writable(folder)
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
    for name, dispatcher in jit.KERNELS.items():
        if name.startswith("kimi_tok.") and isinstance(dispatcher._cache, _DeferredCache):
            made = dispatcher._cache._made()
            if isinstance(made, NullCache):
                break
            path = Path(made.cache_path)
            inside = jit.PACKAGE_DIR in path.parents
            return f"the __pycache__ folders under {jit.PACKAGE_DIR}" if inside else str(path.parent)
    return "nowhere: numba has no writable cache directory (set NUMBA_CACHE_DIR)"


def caches_kernels() -> bool:
    """Whether compiled kernels are saved where later processes find them (else each compiles them)."""
    if config.DISABLE_JIT:
        return False
    for name, dispatcher in jit.KERNELS.items():
        if name.startswith("kimi_tok.") and isinstance(dispatcher._cache, _DeferredCache):
            made = dispatcher._cache._made()
            return not isinstance(made, NullCache) and not getattr(made._impl.locator, "read_only", False)
    return False


class _CompileListener(event.Listener):
    """Records every compile of a kimi_tok kernel (a cache miss); the first one prints the notice."""

    def on_start(self, ev) -> None:
        dispatcher = ev.data.get("dispatcher")
        if isinstance(dispatcher, KernelDispatcher):
            jit.COMPILED.append((f"{dispatcher.py_func.__module__}.{dispatcher.py_func.__qualname__}",
                                 tuple(ev.data.get("args", ()))))
            if not jit._notice["printed"]:
                jit.announce_compile(jit._notice["workers"])

    def on_end(self, ev) -> None:
        pass


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


