"""Software prefetches for the CPU kernels: ask for memory before it is read or added into.

Bucket-at-a-time folds read the rows of the values in the plan's sorted
order, a random order in memory; the hardware cannot guess the next row, so
each read would wait for memory. :func:`prefetch_row` emits LLVM's
``llvm.prefetch`` for every cache line of a row a few positions ahead, so
those reads overlap. Scatters into a state larger than the caches (the float
stream past 2^18 buckets) ask for the element they will add into a few
positions ahead with :func:`prefetch_item`. They change timings only: a
prefetch never faults and never changes a value.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

#: Bytes of a cache line on the CPUs bitfold runs on.
LINE_BYTES = 64
#: Most cache lines of one row that are prefetched.
MAX_LINES = 64


def _prefetch(builder: ir.IRBuilder, ptr: ir.Value, write: bool) -> None:
    """Emit ``llvm.prefetch`` of the cache line at ``ptr``: for reading or writing, kept in all
    cache levels, data cache."""
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    builder.call(fn, [ptr, i32(int(write)), i32(3), i32(1)])


@intrinsic
def prefetch_row(typingctx, arr, row):  # pragma: no cover - compiled
    """Prefetch (for reading) the first cache lines of ``arr[row]``; ``arr`` is C-contiguous 2-D."""
    sig = types.void(arr, row)

    def codegen(context, builder, signature, args):
        aryty, rowty = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        shape = cgutils.unpack_tuple(builder, ary.shape)
        strides = cgutils.unpack_tuple(builder, ary.strides)
        index = context.cast(builder, args[1], rowty, types.intp)
        start = cgutils.get_item_pointer2(
            context, builder, data=ary.data, shape=shape, strides=strides,
            layout=aryty.layout, inds=[index, context.get_constant(types.intp, 0)],
            wraparound=False,
        )  # fmt: skip
        itemsize = context.get_constant(types.intp, aryty.dtype.bitwidth // 8)
        row_bytes = builder.mul(shape[1], itemsize)
        base = builder.ptrtoint(start, ir.IntType(64))
        for offset in range(0, MAX_LINES * LINE_BYTES, LINE_BYTES):
            off = context.get_constant(types.intp, offset)
            with builder.if_then(builder.icmp_signed("<", off, row_bytes)):
                line = builder.inttoptr(builder.add(base, off), start.type)
                _prefetch(builder, line, write=False)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch_item(typingctx, arr, i):  # pragma: no cover - compiled
    """Prefetch (for writing: the caller adds into it) the cache line of ``arr[i]``, 1-D."""
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        aryty, _ = signature.args
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        _prefetch(builder, ptr, write=True)
        return context.get_dummy_value()

    return sig, codegen


__all__ = ["prefetch_item", "prefetch_row"]
