"""Atomics, futexes and raw memory for compiled code: threads coordinate without the GIL.

numba has no atomic operations on the CPU, so ``fetch_add`` emits LLVM's ``atomicrmw add``
(sequentially consistent) on an element of an ``int64`` array. Threads in compiled code that
take work items with it never take the same item twice and never skip one, and none of them
needs to return to Python (where it would wait for the GIL) between items.

``load``/``store``/``compare_exchange`` (atomic ``int32`` words) and ``futex`` (Linux, through libc's ``syscall``)
let a thread wait for another inside compiled code (``futex``, ``reuse.parking``); ``copy_bytes`` and
``array_at`` reach memory by address, for a thread that copies ids whose arrays its caller keeps alive and for
reading CPython's objects (``native.cpython``). ``load_u64`` and ``prefetch`` shape the loads of the BPE loop.
"""

from __future__ import annotations

from llvmlite import ir

from .jit import DeferredModule, intrinsic

types = DeferredModule("numba.core.types")  # read when numba types a call (it is imported by then)
cgutils = DeferredModule("numba.core.cgutils")


@intrinsic
def fetch_add(typingctx, counters, index, value):
    """``counters[index] += value`` atomically; returns the value before (an ``int64``).

    ``counters``: a C-contiguous ``int64`` array shared by the threads; ``index`` must be in
    range (it is not checked).
    """
    if not (isinstance(counters, types.Array) and counters.dtype == types.int64 and counters.layout == "C"
            and isinstance(index, types.Integer) and isinstance(value, types.Integer)):
        return None
    signature = types.int64(counters, index, value)

    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        at = context.cast(builder, args[1], sig.args[1], types.intp)
        increment = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", builder.gep(array.data, [at]), increment, "seq_cst")

    return signature, codegen


def _element_pointer(context, builder, array_type, array, at, at_type):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [context.cast(builder, at, at_type, types.intp)])


def _is_int32_array(array) -> bool:
    return isinstance(array, types.Array) and array.dtype == types.int32 and array.layout == "C"


@intrinsic
def load(typingctx, words, index):
    """``words[index]`` read atomically (sequentially consistent) from a C-contiguous ``int32`` array."""
    if not (_is_int32_array(words) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        return builder.load_atomic(pointer, "seq_cst", 4)

    return types.int32(words, index), codegen


@intrinsic
def store(typingctx, words, index, value):
    """``words[index] = value`` written atomically (sequentially consistent) to an ``int32`` array."""
    if not (_is_int32_array(words) and isinstance(index, types.Integer) and isinstance(value, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        builder.store_atomic(context.cast(builder, args[2], sig.args[2], types.int32), pointer, "seq_cst", 4)
        return context.get_dummy_value()

    return types.none(words, index, value), codegen


@intrinsic
def compare_exchange(typingctx, words, index, expected, new):
    """``words[index] = new`` if it holds ``expected``, atomically (sequentially consistent), on an ``int32``
    array; returns whether it did. One thread of several wins a word's change from a state."""
    if not (_is_int32_array(words) and all(isinstance(t, types.Integer) for t in (index, expected, new))):
        return None

    def codegen(context, builder, sig, args):
        pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        old, new_value = (context.cast(builder, args[k], sig.args[k], types.int32) for k in (2, 3))
        result = builder.cmpxchg(pointer, old, new_value, "seq_cst", "seq_cst")
        return builder.extract_value(result, 1)

    return types.boolean(words, index, expected, new), codegen


@intrinsic
def futex(typingctx, words, index, operation, value, syscall_number):
    """Linux ``futex(&words[index], operation, value)`` through libc's ``syscall`` (a wait with no
    timeout, or a wake); returns what ``syscall`` returned. ``syscall_number`` is the machine's
    ``SYS_futex`` (an argument, so that a kernel cached on disk does not bake it in)."""
    if not (_is_int32_array(words) and all(isinstance(t, types.Integer)
                                           for t in (index, operation, value, syscall_number))):
        return None

    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        syscall = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64], var_arg=True),
                                                 "syscall")
        as_i64 = [context.cast(builder, args[k], sig.args[k], types.int64) for k in (4, 2, 3)]
        null = ir.Constant(i64, 0)
        return builder.call(syscall, [as_i64[0], builder.ptrtoint(pointer, i64), as_i64[1], as_i64[2], null, null,
                                      null])

    return types.int64(words, index, operation, value, syscall_number), codegen


@intrinsic
def copy_bytes(typingctx, destination, source, n_bytes):
    """``memcpy(destination, source, n_bytes)`` between memory addresses (not overlapping), which
    the caller keeps alive; numba's slice assignment would first copy a source that it cannot
    prove apart from the destination."""
    if not all(isinstance(t, types.Integer) for t in (destination, source, n_bytes)):
        return None

    def codegen(context, builder, sig, args):
        i8p = ir.IntType(8).as_pointer()
        intp = context.get_value_type(types.intp)
        to, from_, n = (context.cast(builder, args[k], sig.args[k], types.intp) for k in range(3))
        cgutils.raw_memcpy(builder, builder.inttoptr(to, i8p), builder.inttoptr(from_, i8p), n, ir.Constant(intp, 1))
        return context.get_dummy_value()

    return types.none(destination, source, n_bytes), codegen


@intrinsic
def array_at(typingctx, address, length, item):
    """The ``length`` values of NumPy type ``item`` (``np.uint8``, ``np.uint32``, ...) at memory ``address`` as a
    1-D array (no copy, no owner): for memory that the caller keeps alive while the array is used."""
    if not (isinstance(address, types.Integer) and isinstance(length, types.Integer)
            and isinstance(item, types.NumberClass)):
        return None
    item_type = item.instance_type
    array_type = types.Array(item_type, 1, "C")

    def codegen(context, builder, sig, args):
        array = context.make_array(array_type)(context, builder)
        value = context.get_value_type(item_type)
        n = context.cast(builder, args[1], sig.args[1], types.intp)
        intp = context.get_value_type(types.intp)
        size = ir.Constant(intp, context.get_abi_sizeof(value))
        context.populate_array(
            array,
            data=builder.inttoptr(context.cast(builder, args[0], sig.args[0], types.intp), value.as_pointer()),
            shape=cgutils.pack_array(builder, [n]),
            strides=cgutils.pack_array(builder, [size]),
            itemsize=size,
            meminfo=None,
        )
        return array._getvalue()

    return array_type(address, length, item), codegen


@intrinsic
def load_u64(typingctx, buf, at):
    """The 8 bytes ``buf[at:at + 8]`` of a C-contiguous ``uint8`` array as one little-endian
    ``uint64``, loaded unaligned in one instruction; ``at + 8`` must be within the array (not
    checked). Keys of short pieces are built from two such loads instead of a byte loop."""
    if not (isinstance(buf, types.Array) and buf.dtype == types.uint8 and buf.layout == "C"
            and isinstance(at, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        return builder.load(builder.bitcast(pointer, ir.IntType(64).as_pointer()), align=1)

    return types.uint64(buf, at), codegen


@intrinsic
def prefetch(typingctx, array, at):
    """Ask the CPU to bring the cache line of ``array[at]`` in (LLVM's ``llvm.prefetch``, read, high
    locality); a hint only: nothing is loaded into a register and an address out of range does no
    harm. Look-ups of many independent pieces overlap their memory latency this way."""
    if not (isinstance(array, types.Array) and array.layout == "C" and isinstance(at, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1], sig.args[1])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(pointer, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.none(array, at), codegen
