"""Memory hints for the CPU kernels: prefetches, and stores that bypass the caches.

Bucket-at-a-time folds read the rows of the values in the plan's sorted
order, a random order in memory; the hardware cannot guess the next row, so
each read would wait for memory. :func:`prefetch_row` emits LLVM's
``llvm.prefetch`` for every cache line of a row a few positions ahead, so
those reads overlap. Scatters into a state larger than the caches (the float
stream past 2^18 buckets) ask for the element they will add into a few
positions ahead with :func:`prefetch_item`. They change timings only: a
prefetch never faults and never changes a value.

Rows copied to scattered places that nothing reads soon (the staged rows of
:func:`bitfold.kernels.buckets.fold_staged`) are written with non-temporal
stores (:func:`copy_row_streaming`): a plain store first reads the line it
writes into, a non-temporal store of whole lines does not (measured on the
2-core VM: 262,144 rows of 64 float32 copied to random rows in 3.0 ms
against 9.7 ms). Such stores are weakly ordered: :func:`store_fence` makes
them visible before another thread reads them.
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


def _row_pointer(context, builder, signature, args, at: int) -> tuple[ir.Value, ir.Value]:
    """In an intrinsic's codegen, ``(pointer to arr[row, 0], row length)`` of the argument pair
    ``arr, row`` at ``at`` in ``args`` (``arr`` a 2-D array, ``row`` an integer)."""
    aty, ity = signature.args[at], signature.args[at + 1]
    ary = context.make_array(aty)(context, builder, args[at])
    shape = cgutils.unpack_tuple(builder, ary.shape)
    strides = cgutils.unpack_tuple(builder, ary.strides)
    row = context.cast(builder, args[at + 1], ity, types.intp)
    ptr = cgutils.get_item_pointer2(
        context, builder, data=ary.data, shape=shape, strides=strides,
        layout=aty.layout, inds=[row, context.get_constant(types.intp, 0)], wraparound=False,
    )  # fmt: skip
    return ptr, shape[1]


@intrinsic
def prefetch_row(typingctx, arr, row):  # pragma: no cover - compiled
    """Prefetch (for reading) the first cache lines of ``arr[row]``; ``arr`` is C-contiguous 2-D."""
    sig = types.void(arr, row)

    def codegen(context, builder, signature, args):
        start, width = _row_pointer(context, builder, signature, args, 0)
        itemsize = context.get_constant(types.intp, signature.args[0].dtype.bitwidth // 8)
        row_bytes = builder.mul(width, itemsize)
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


@intrinsic
def copy_row_streaming(typingctx, dst, j, src, i):  # pragma: no cover - compiled
    """``dst[j, :] = src[i, :]`` for 2-D C-contiguous uint32 arrays of the same row length,
    sixteen bytes at a time with non-temporal stores (the rest, if any, plainly).

    The caller guarantees that ``dst``'s rows start at multiples of 16 bytes
    (:func:`streaming_rows_ok`) and calls :func:`store_fence` before the rows are read
    by another thread. Values are copied bit for bit.
    """
    sig = types.void(dst, j, src, i)

    def codegen(context, builder, signature, args):
        intp = types.intp
        dp, width = _row_pointer(context, builder, signature, args, 0)
        sp, _ = _row_pointer(context, builder, signature, args, 2)
        lanes = 4
        vec = ir.VectorType(ir.IntType(32), lanes)
        dv = builder.bitcast(dp, vec.as_pointer())
        sv = builder.bitcast(sp, vec.as_pointer())
        n_vec = builder.udiv(width, context.get_constant(intp, lanes))
        hint = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with cgutils.for_range(builder, n_vec) as loop:
            value = builder.load(builder.gep(sv, [loop.index]), align=4)
            store = builder.store(value, builder.gep(dv, [loop.index]), align=16)
            store.set_metadata("nontemporal", hint)
        start = builder.mul(n_vec, context.get_constant(intp, lanes))
        one = context.get_constant(intp, 1)
        with cgutils.for_range_slice(builder, start, width, one, inc=True) as (at, _):
            builder.store(builder.load(builder.gep(sp, [at])), builder.gep(dp, [at]))
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def store_fence(typingctx):  # pragma: no cover - compiled
    """A sequentially consistent fence: earlier stores, non-temporal ones included, are
    visible to every thread before any later memory operation (on x86 a locked instruction
    or ``mfence``, either of which drains the write-combining buffers)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


def streaming_rows_ok(dst) -> bool:
    """True when every row of the 2-D C-contiguous array ``dst`` is whole cache lines, each
    starting at a multiple of :data:`LINE_BYTES`: :func:`copy_row_streaming` needs 16-byte
    alignment, and a non-temporal store of part of a line costs more than a plain store."""
    return dst.ctypes.data % LINE_BYTES == 0 and (dst.shape[1] * dst.itemsize) % LINE_BYTES == 0


__all__ = [
    "copy_row_streaming",
    "prefetch_item",
    "prefetch_row",
    "store_fence",
    "streaming_rows_ok",
]
