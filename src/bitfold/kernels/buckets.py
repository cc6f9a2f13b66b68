"""Bucket-at-a-time CPU kernels: each bucket summed exactly in a small scratch, rounded once.

The plan's stable order lists each bucket's positions together, so one
bucket at a time is gathered (a row of ``D`` contiguous values per position,
prefetched a few positions ahead) and summed in a scratch that stays in the
caches, whatever K is: no state of K superaccumulators, no atomics. This
serves folds of rows (embedding and graph gradients) and scalar folds into
very many buckets.

Exactness, in two levels:

1. Up to a chunk of rows (:data:`ROW_CHUNK` float32 rows, :data:`CHUNK`
   float64 rows; :data:`CHUNK` scalars) is added in float64, every addition
   checked (:func:`bitfold.kernels.ieee.checked_add`: an inexact addition, a
   NaN or an infinity turns the sum into NaN). A sum that is not NaN *is*
   the exact sum of its values.
2. A column whose chunk sum is exact contributes that float64 (an integer
   multiple of the limb unit) to its integer limbs; a column whose chunk sum
   is NaN adds each of its values to the limbs instead
   (:func:`bitfold.kernels.ieee.add_bits`, which also counts NaN and
   infinities).

A bucket of at most one chunk whose float64 sum is exact is rounded straight
from that float64 (one rounding: it is exact); every other column is rounded
once from its limbs (:func:`bitfold.kernels.ieee.round_row`). Either way the
result is the correctly rounded sum, with the zero, NaN and Inf rules of
:mod:`bitfold.exact`.

A hot bucket (a Zipf map's head) may be cut into parts of positions, run in
parallel: each part's exact sum is left in its own limbs, and the parts'
limbs are added as integers and rounded once. An exact sum does not depend on
how it was cut, so the bits do not either.

:func:`redo_scalar` completes the streaming routes of
:mod:`bitfold.kernels.stream`: the buckets whose streamed float64 sum was not
exact are summed here, bucket by bucket.
"""

from __future__ import annotations

import numpy as np
from numba import njit, parallel_chunksize, prange

from ..formats import F32, F64, FLOATS, decode_shift
from .bitcast import float32_of_bits
from .ieee import (
    CHUNK,
    add_bits,
    add_column,
    add_exact_sum,
    as_double,
    castable,
    checked_add,
    float_parts,
    min_normal,
    normalise,
    round_row,
    round_scaled,
    segment_bits,
)
from .prefetch import prefetch_row

#: Rows (in the plan's order) prefetched ahead of the one being summed.
AHEAD = 8
#: float32 rows summed in float64 between flushes into limbs. An exact float64 sum of float32s
#: stays exact until a term falls below about 2^-29 of the running sum, which normal data
#: almost never does within this many rows; an inexact chunk is redone value by value.
#: float64 rows (whose float64 sums are rarely exact) keep the short :data:`CHUNK`.
ROW_CHUNK = 1024
#: Flushes into a column's limbs between carry normalisations (each flush adds < 2^33).
FLUSHES_BETWEEN_CARRIES = 1 << 20

_F32 = (FLOATS["float32"].exponent_bits, FLOATS["float32"].fraction_bits,
        decode_shift("float32", F32))  # fmt: skip
_F64 = (FLOATS["float64"].exponent_bits, FLOATS["float64"].fraction_bits,
        decode_shift("float64", F64))  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _column_into_limbs(bits, order, lo, hi, d, row, L, wide):  # pragma: no cover - compiled
    """Add values ``bits[order[t], d]`` for ``t`` in ``[lo, hi)`` into the state row ``row``."""
    if wide:
        add_column(row, L, bits, order, lo, hi, d, _F64[0], _F64[1], _F64[2], True)
    else:
        add_column(row, L, bits, order, lo, hi, d, _F32[0], _F32[1], _F32[2], False)


@njit(cache=True, nogil=True, inline="always")
def _value_into_limbs(raw, row, L, wide):  # pragma: no cover - compiled
    """Add one value (its bits) into the state row ``row``."""
    if wide:
        add_bits(row, L, raw, _F64[0], _F64[1], _F64[2], True)
    else:
        add_bits(row, L, raw, _F32[0], _F32[1], _F32[2], False)


@njit(cache=True, nogil=True, inline="always")
def _round_limbs(row, target, mag):  # pragma: no cover - compiled
    unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift = target
    return round_row(row, mag.shape[0], 0, unit_exp, precision, exp_bits, subnormal_exp,
                     nan_bits, out_shift, mag)  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _read(values, bits, i, d, wide):  # pragma: no cover - compiled
    """``values[i, d]`` as a float64, immune to denormals-are-zero (:func:`as_double`)."""
    if wide:
        return as_double(values[i, d], bits[i, d], _F64[0], _F64[1])
    return as_double(values[i, d], bits[i, d], _F32[0], _F32[1])


@njit(cache=True, nogil=True, inline="always")
def _cast_tiny(target):  # pragma: no cover - compiled
    """The output's smallest normal: exact sums at least this large (or zero) may be cast."""
    return min_normal(target[1], target[3])


@njit(cache=True, nogil=True, inline="always")
def _round_double(x, target):  # pragma: no cover - compiled
    """An exact float64 (not NaN) rounded once to the target: its bits."""
    _, precision, exp_bits, subnormal_exp, _, out_shift = target
    neg, m, e = float_parts(x)
    if m == 0:
        neg = np.int64(np.signbit(x))
    return round_scaled(m, e, neg, precision, exp_bits, subnormal_exp, out_shift)


@njit(cache=True, nogil=True, inline="always")
def _segment(values, bits, order, lo, hi, d, target, wide, row, mag, has_init, init_value,
             init_raw):  # fmt: skip  # pragma: no cover
    """:func:`bitfold.kernels.ieee.segment_bits` with the value format's decoding constants."""
    unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift = target
    if wide:
        return segment_bits(values, bits, order, lo, hi, d, _F64[0], _F64[1], _F64[2], True,
                            unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift,
                            row, mag, has_init, init_value, init_raw, False)  # fmt: skip
    return segment_bits(values, bits, order, lo, hi, d, _F32[0], _F32[1], _F32[2], False,
                        unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift, row,
                        mag, has_init, init_value, init_raw, False)  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _add_narrow(acc, raw):  # pragma: no cover - compiled
    """:func:`checked_add` of ``acc`` and the float32 of bits ``raw``: NaN unless exact.

    A float32 subnormal gives NaN (the float unit would read it as zero under
    denormals-are-zero): its column is summed from the bits instead. Every
    other float32, and every exact sum of float32s, is a multiple of 2^-149,
    so an exact float64 sum is never subnormal and no smallest-normal test is
    needed. No branch: it vectorises over a row.
    """
    a = raw & np.uint32(0x7FFFFFFF)
    x = np.float64(float32_of_bits(raw))
    s = acc + x
    ok = (s - acc == x) & (s - x == acc) & ((a == 0) | (a >= np.uint32(0x800000)))
    return s if ok else np.nan


@njit(cache=True, nogil=True, inline="always")
def _add_rows(values, bits, order, start, stop, last, acc, wide):  # pragma: no cover - compiled
    """Add rows ``order[start:stop]`` into ``acc`` (D float64) with checked adds (NaN: inexact).

    The value format is tested once, outside the loops: a test inside the row
    loop kept LLVM from vectorising the float32 columns (1.5x the time).
    """
    D = acc.shape[0]
    if wide:
        for t in range(start, stop):
            if t + AHEAD <= last:
                prefetch_row(values, order[t + AHEAD])
            r = order[t]
            row, row_bits = values[r], bits[r]
            for d in range(D):
                acc[d] = checked_add(acc[d], as_double(row[d], row_bits[d], _F64[0], _F64[1]))
        return
    for t in range(start, stop):
        if t + AHEAD <= last:
            prefetch_row(values, order[t + AHEAD])
        row_bits = bits[order[t]]
        for d in range(D):
            acc[d] = _add_narrow(acc[d], row_bits[d])


@njit(cache=True, nogil=True, inline="always")
def _start_sum(acc, init, init_bits, k, first, wide):  # pragma: no cover - compiled
    """``acc = -0.0`` in every column, plus ``init[k]`` when ``first``."""
    for d in range(acc.shape[0]):
        acc[d] = -0.0
    if first:
        for d in range(acc.shape[0]):
            acc[d] = checked_add(acc[d], _read(init, init_bits, k, d, wide))


@njit(cache=True, nogil=True)
def _rows_into_limbs(values, bits, order, k, lo, hi, last, limbs, acc, wide, init, init_bits,
                     has_init, chunk, unit_exp):  # fmt: skip  # pragma: no cover - compiled
    """The exact sum of rows ``order[lo:hi]`` (plus ``init[k]`` with ``has_init``) into ``limbs``.

    ``limbs`` (D, L + 5) is zeroed first and left normalised. Rows are summed
    ``chunk`` at a time in float64 (checked adds); an exact chunk sum goes into
    a column's limbs at once, an inexact one value by value.
    """
    D = acc.shape[0]
    L = limbs.shape[1] - 5
    limbs[:, :] = 0
    flushes = 0
    start = lo
    while start < hi:
        stop = min(hi, start + chunk)
        first = has_init and start == lo
        _start_sum(acc, init, init_bits, k, first, wide)
        _add_rows(values, bits, order, start, stop, last, acc, wide)
        for d in range(D):
            if acc[d] == acc[d]:
                add_exact_sum(limbs[d], L, acc[d], stop - start + first, unit_exp)
            else:
                _column_into_limbs(bits, order, start, stop, d, limbs[d], L, wide)
                if first:
                    _value_into_limbs(init_bits[k, d], limbs[d], L, wide)
        flushes += 1
        if flushes % FLUSHES_BETWEEN_CARRIES == 0:
            for d in range(D):
                normalise(limbs[d], L)
        start = stop
    for d in range(D):
        normalise(limbs[d], L)


@njit(cache=True, nogil=True)
def _fold_buckets(values, bits, order, offsets, k0, k1, out_f, out_bits, target, fast, wide,
                  acc, limbs, column, mag, init, init_bits, has_init, chunk):  # fmt: skip
    """Fold buckets ``k0 .. k1-1`` of rows ``values`` (N, D) into ``out`` (K, D).

    ``bits`` is ``values`` viewed as integers; ``out_f``/``out_bits`` are the
    output viewed as floats and as signed integers of the output's width.
    ``target = (unit_exp, precision, exp_bits, subnormal_exp, nan_bits,
    out_shift)``; ``fast`` when an exact float64 sum may simply be cast to the
    output dtype (float32 values to float32, float64 values to float64);
    ``wide`` for float64 values. ``acc`` (D float64), ``limbs`` (D, L + 5),
    ``column`` (L + 5) and ``mag`` (L) are scratch. With ``has_init`` every
    bucket's sum has one more term, ``init[k, d]`` (the values' dtype; its
    bits ``init_bits``): the result of a fold into an existing array. A bucket
    of at most ``chunk`` rows is summed in float64 and cast or rounded from
    it, column by column, where that sum is exact; any other bucket goes
    through its limbs (:func:`_rows_into_limbs`).
    """
    unit_exp = target[0]
    tiny = _cast_tiny(target)
    D = values.shape[1]
    last = offsets[k1] - 1
    for k in range(k0, k1):
        lo = offsets[k]
        hi = offsets[k + 1]
        if lo == hi and not has_init:
            for d in range(D):
                out_bits[k, d] = 0
            continue
        if hi - lo > chunk:
            _rows_into_limbs(values, bits, order, k, lo, hi, last, limbs, acc, wide, init,
                             init_bits, has_init, chunk, unit_exp)  # fmt: skip
            for d in range(D):
                out_bits[k, d] = _round_limbs(limbs[d], target, mag)
            continue
        _start_sum(acc, init, init_bits, k, has_init, wide)
        _add_rows(values, bits, order, lo, hi, last, acc, wide)
        inexact = 0
        if fast:  # the common case: cast every column, then mend the others
            for d in range(D):
                out_f[k, d] = acc[d]
                inexact += not castable(acc[d], tiny)
        else:
            inexact = D
        if inexact:
            for d in range(D):
                if fast and castable(acc[d], tiny):
                    continue
                if acc[d] == acc[d]:
                    out_bits[k, d] = _round_double(acc[d], target)
                else:
                    out_bits[k, d] = _segment(values, bits, order, lo, hi, d, target, wide,
                                              column, mag, has_init, init[k % init.shape[0], d],
                                              init_bits[k % init.shape[0], d])  # fmt: skip


@njit(cache=True, nogil=True)
def _fold_scalar_buckets(values, bits, order, offsets, k0, k1, out_f, out_bits, target, fast,
                         wide, column, mag, init, init_bits, has_init):  # fmt: skip
    """:func:`_fold_buckets` for scalars (``D == 1``): the sums held in registers.

    An empty bucket is ``+0.0``; a bucket of at most :data:`CHUNK` values whose
    checked float64 sum is exact is rounded from it (cast when ``fast``); any
    other bucket is summed by :func:`bitfold.kernels.ieee.segment_bits`.
    """
    last = offsets[k1] - 1
    tiny = _cast_tiny(target)
    for k in range(k0, k1):
        lo = offsets[k]
        hi = offsets[k + 1]
        if lo == hi and not has_init:
            out_bits[k, 0] = 0
            continue
        i = k % init.shape[0]
        if hi - lo <= CHUNK:
            acc = -0.0
            if has_init:
                acc = checked_add(acc, _read(init, init_bits, i, 0, wide))
            for t in range(lo, hi):
                if t + AHEAD <= last:
                    prefetch_row(values, order[t + AHEAD])
                acc = checked_add(acc, _read(values, bits, order[t], 0, wide))
            if acc == acc:
                if fast and castable(acc, tiny):
                    out_f[k, 0] = acc
                else:
                    out_bits[k, 0] = _round_double(acc, target)
                continue
        out_bits[k, 0] = _segment(values, bits, order, lo, hi, 0, target, wide, column, mag,
                                  has_init, init[i, 0], init_bits[i, 0])  # fmt: skip


@njit(cache=True, parallel=True)
def _fold_tasks_parallel(values, bits, order, offsets, tasks, parts, out_f, out_bits, target,
                         fast, wide, L, init, init_bits, has_init, chunk):  # fmt: skip
    # pragma: no cover - compiled
    """Run every task of :func:`fold_buckets`: bucket ranges, and parts of split buckets."""
    D = values.shape[1]
    for c in prange(tasks.shape[0]):
        k0, k1, lo, hi, p = tasks[c, 0], tasks[c, 1], tasks[c, 2], tasks[c, 3], tasks[c, 4]
        acc = np.empty(D, np.float64)
        if p >= 0:  # positions lo .. hi-1 of bucket k0; init is the first part's term
            _rows_into_limbs(values, bits, order, k0, lo, hi, hi - 1, parts[p], acc, wide, init,
                             init_bits, has_init and lo == offsets[k0], chunk,
                             target[0])  # fmt: skip
            continue
        column = np.empty(L + 5, np.int64)
        mag = np.empty(L, np.int64)
        if D == 1:
            _fold_scalar_buckets(values, bits, order, offsets, k0, k1, out_f, out_bits, target,
                                 fast, wide, column, mag, init, init_bits, has_init)  # fmt: skip
        else:
            _fold_buckets(values, bits, order, offsets, k0, k1, out_f, out_bits, target, fast,
                          wide, acc, np.empty((D, L + 5), np.int64), column, mag, init,
                          init_bits, has_init, chunk)  # fmt: skip


@njit(cache=True, parallel=True)
def _merge_parts(parts, split, out_bits, target):  # pragma: no cover - compiled
    """Each split bucket ``split[h] = (k, first part, end part)``: its parts' limbs added, rounded.

    The parts are normalised limb rows of exact partial sums (counters too),
    so their integer sum is the bucket's exact state, rounded once.
    """
    D = parts.shape[1]
    L = parts.shape[2] - 5
    for h in prange(split.shape[0]):
        k, p0, p1 = split[h, 0], split[h, 1], split[h, 2]
        row = np.empty(L + 5, np.int64)
        mag = np.empty(L, np.int64)
        for d in range(D):
            row[:] = parts[p0, d]
            for p in range(p0 + 1, p1):
                for j in range(L + 5):
                    row[j] += parts[p, d, j]
            out_bits[k, d] = _round_limbs(row, target, mag)


def fold_buckets(values, order, offsets, tasks, split, out, out_bits, target, fast, L,
                 init=None) -> None:  # fmt: skip
    """Fold the rows ``values`` (N, D; float32 or float64) bucket by bucket into ``out`` (K, D).

    ``tasks`` (T, 5) int64, independent pieces of work run in parallel when
    there is more than one: a row ``(k0, k1, -, -, -1)`` folds buckets
    ``k0 .. k1-1``; a row ``(k, k + 1, lo, hi, p)`` sums positions ``lo ..
    hi-1`` of the plan's order (a part of bucket ``k``) exactly into part
    ``p``. ``split`` (S, 3) lists each split bucket as ``(k, first part, end
    part)``: its parts' exact sums are added as integers and rounded once,
    so splitting a bucket changes no bit. ``out_bits`` is ``out`` viewed as
    signed integers of the output's width; ``target`` and ``fast`` as in
    :func:`_fold_buckets`; ``L`` the limbs of the values' limb format;
    ``init`` (K, D), in the values' dtype, an extra first term of every bucket.
    """
    wide = values.dtype == np.float64
    bits_dtype = np.int64 if wide else np.uint32
    bits = values.view(bits_dtype)
    has_init = init is not None
    if not has_init:
        init = np.zeros((1, values.shape[1]), values.dtype)  # never read
    init_bits = init.view(bits_dtype)
    chunk = CHUNK if wide else ROW_CHUNK
    n_parts = int(split[:, 2].max()) if split.shape[0] else 0
    parts = np.empty((n_parts, values.shape[1], L + 5), np.int64)
    if tasks.shape[0] > 1:
        from .cpu import start_thread_pool

        start_thread_pool()
        with parallel_chunksize(1):  # dynamic: a slow thread takes fewer tasks
            _fold_tasks_parallel(values, bits, order, offsets, tasks, parts, out, out_bits,
                                 target, fast, wide, L, init, init_bits, has_init,
                                 chunk)  # fmt: skip
            if n_parts:
                _merge_parts(parts, split, out_bits, target)
        return
    D = values.shape[1]
    column, mag = np.empty(L + 5, np.int64), np.empty(L, np.int64)
    k0, k1 = tasks[0, 0], tasks[0, 1]
    if D == 1:
        _fold_scalar_buckets(values, bits, order, offsets, k0, k1, out, out_bits, target, fast,
                             wide, column, mag, init, init_bits, has_init)  # fmt: skip
    else:
        limbs = np.empty((D, L + 5), np.int64)
        _fold_buckets(values, bits, order, offsets, k0, k1, out, out_bits, target, fast, wide,
                      np.empty(D), limbs, column, mag, init, init_bits, has_init,
                      chunk)  # fmt: skip


# -- redoing the buckets a streaming route could not sum exactly ----------------------------
@njit(cache=True, nogil=True)
def _redo_scalar(which, values, bits, order, offsets, out_bits, target, wide, column, mag):
    # pragma: no cover - compiled
    for k in which:
        out_bits[k] = _segment(values, bits, order, offsets[k], offsets[k + 1], 0, target, wide,
                               column, mag, False, values[0, 0], bits[0, 0])  # fmt: skip


def redo_scalar(which, values, order, offsets, out_bits, target, L) -> None:
    """Sum the buckets listed in ``which`` again, exactly, into ``out_bits`` (K,)."""
    wide = values.dtype == np.float64
    bits = values.view(np.int64 if wide else np.uint32)
    column, mag = np.empty(L + 5, np.int64), np.empty(L, np.int64)
    _redo_scalar(which, values, bits, order, offsets, out_bits, target, wide, column, mag)


@njit(cache=True, nogil=True)
def _round_doubles(sums, out_bits, target):  # pragma: no cover - compiled
    for k in range(sums.shape[0]):
        if sums[k] == sums[k]:
            out_bits[k] = _round_double(sums[k], target)


def round_doubles(sums, out_bits, target) -> None:
    """Round exact float64 sums once to the target (NaN entries: :func:`redo_scalar`)."""
    _round_doubles(sums, out_bits, target)


__all__ = ["CHUNK", "fold_buckets", "redo_scalar", "round_doubles"]
