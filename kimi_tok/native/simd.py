"""SIMD for compiled code: 64 bytes classified at once into bit masks.

numba vectorizes plain loops, but a scanner needs per-byte classes as bits (bit ``k`` for byte
``at + k``) to find piece boundaries with word operations instead of a branch per byte. ``ascii_classes``
emits LLVM vector compares on one unaligned 64-byte load; LLVM lowers them to the machine's vector
instructions (AVX-512 mask compares, or AVX2 compares and ``vpmovmskb``).
"""

from __future__ import annotations

from llvmlite import ir

from .jit import DeferredModule, intrinsic

types = DeferredModule("numba.core.types")  # read when numba types a call (it is imported by then)

BLOCK_BYTES = 64
N_CLASSES = 8  # the masks ascii_classes returns, in this order:
HIGH, UPPER, LOWER, DIGIT, NEWLINE, SPACE, BLANK, APOSTROPHE = range(N_CLASSES)


def _splat(value: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(8), BLOCK_BYTES), [value] * BLOCK_BYTES)


@intrinsic
def ascii_classes(typingctx, buf, at):
    """Eight ``uint64`` masks of the 64 bytes ``buf[at:at + 64]`` (a C-contiguous ``uint8`` array; the
    caller keeps ``at + 64`` within it): bytes of 0x80 and up (``HIGH``), ``A-Z``, ``a-z``, ``0-9``,
    ``\\r`` or ``\\n``, the space, the ASCII blanks other than newlines (tab, vertical tab, form feed,
    space) and the apostrophe."""
    if not (isinstance(buf, types.Array) and buf.dtype == types.uint8 and buf.layout == "C"
            and isinstance(at, types.Integer)):
        return None
    signature = types.UniTuple(types.uint64, N_CLASSES)(buf, at)

    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        offset = context.cast(builder, args[1], sig.args[1], types.intp)
        pointer = builder.gep(array.data, [offset])
        vector_type = ir.VectorType(ir.IntType(8), BLOCK_BYTES)
        v = builder.load(builder.bitcast(pointer, vector_type.as_pointer()), align=1)

        def in_range(low: int, count: int):
            return builder.icmp_unsigned("<", builder.sub(v, _splat(low)), _splat(count))

        def equal(byte: int):
            return builder.icmp_unsigned("==", v, _splat(byte))

        newline = builder.or_(equal(0x0A), equal(0x0D))
        space = equal(0x20)
        blank = builder.or_(builder.or_(space, equal(0x09)), builder.or_(equal(0x0B), equal(0x0C)))
        masks = [builder.icmp_signed("<", v, _splat(0)), in_range(0x41, 26), in_range(0x61, 26), in_range(0x30, 10),
                 newline, space, blank, equal(0x27)]
        words = [builder.bitcast(mask, ir.IntType(BLOCK_BYTES)) for mask in masks]
        return context.make_tuple(builder, sig.return_type, words)

    return signature, codegen


def _zero_count(builder, word, name: str):
    """LLVM's ``cttz``/``ctlz`` of a nonzero 64-bit word (zero is undefined: one instruction)."""
    flag = ir.IntType(1)
    fn = builder.module.declare_intrinsic(name, [ir.IntType(64), flag])
    return builder.call(fn, [word, ir.Constant(flag, 1)])


def _is_word(word) -> bool:
    return isinstance(word, types.Integer) and word.bitwidth == 64


@intrinsic
def lowest_set_bit(typingctx, word):
    """The index of the lowest set bit of a nonzero ``uint64`` (``tzcnt``)."""
    if not _is_word(word):
        return None
    return types.int64(word), lambda context, builder, sig, args: _zero_count(builder, args[0], "llvm.cttz")


@intrinsic
def highest_set_bit(typingctx, word):
    """The index of the highest set bit of a nonzero ``uint64`` (63 - ``lzcnt``)."""
    if not _is_word(word):
        return None

    def codegen(context, builder, sig, args):
        return builder.sub(ir.Constant(ir.IntType(64), 63), _zero_count(builder, args[0], "llvm.ctlz"))

    return types.int64(word), codegen
