"""Reading a float32 from its bits inside compiled kernels, without a second array view.

:func:`float32_of_bits` reinterprets a ``uint32`` bit pattern as the float32
with those bits (LLVM's ``bitcast``; no conversion, no rounding). A kernel
that reads only the bits of a value, and takes its float from them, loads
each value once and keeps one array in its inner loop, which vectorises.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


@intrinsic
def float32_of_bits(typingctx, raw):  # pragma: no cover - compiled
    """The float32 whose IEEE bit pattern is the low 32 bits of the integer ``raw``, bit for bit.

    (Integers wider than 32 bits are accepted so that a kernel compiled for
    both float32 and float64 values types; they are cut to their low 32 bits.)
    """
    if not isinstance(raw, types.Integer):
        return None
    sig = types.float32(raw)

    def codegen(context, builder, signature, args):
        value = args[0]
        if signature.args[0].bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif signature.args[0].bitwidth < 32:
            value = builder.zext(value, ir.IntType(32))
        return builder.bitcast(value, context.get_value_type(types.float32))

    return sig, codegen


__all__ = ["float32_of_bits"]
