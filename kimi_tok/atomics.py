"""An atomic counter for compiled code: threads share a list of work items without the GIL.

numba has no atomic operations on the CPU, so ``fetch_add`` emits LLVM's ``atomicrmw add``
(sequentially consistent) on an element of an ``int64`` array. Threads in compiled code that
take work items with it never take the same item twice and never skip one, and none of them
needs to return to Python (where it would wait for the GIL) between items.
"""

from __future__ import annotations

from numba import types
from numba.extending import intrinsic


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
