"""Bucket-at-a-time CPU kernels: each bucket summed exactly in a small scratch, rounded once.

The plan's stable order lists each bucket's positions together, so one
bucket at a time is gathered (a row of ``D`` contiguous values per position)
and summed in a scratch that stays in the caches, whatever K is: no state of
K superaccumulators, no atomics. This serves folds of rows (embedding and
graph gradients) and scalar folds into many buckets.

Exactness, in two levels:

1. Up to :data:`CHUNK` rows are added in float64, each addition checked by
   TwoSum (the exact rounding error of a float64 addition, computed with
   float64 operations). When every error is zero the float64 sum *is* the
   exact sum; NaN and infinities make the error NaN, so they never pass.
2. A column whose chunk sum is exact contributes that float64 (an integer
   multiple of the limb unit) to its integer limbs; a column whose chunk sum
   is not exact adds each of its values to the limbs instead
   (:func:`bitfold.kernels.ieee.add_bits`, which also counts NaN and
   infinities).

A bucket of at most CHUNK rows whose float64 sum is exact is rounded straight
from that float64 (one rounding: it is exact); every other column is rounded
once from its limbs (:func:`bitfold.kernels.ieee.round_row`). Either way the
result is the correctly rounded sum, with the zero, NaN and Inf rules of
:mod:`bitfold.exact`.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..formats import F32, F64, FLOATS, decode_shift
from .ieee import add_bits, add_double, double_parts, normalise, round_row, round_scaled

#: Rows summed in float64 (TwoSum-checked) before they are flushed into limbs.
CHUNK = 32
#: Flushes into a column's limbs between carry normalisations (each flush adds < 2^33).
FLUSHES_BETWEEN_CARRIES = 1 << 20

_F32 = (FLOATS["float32"].exponent_bits, FLOATS["float32"].fraction_bits,
        decode_shift("float32", F32))  # fmt: skip
_F64 = (FLOATS["float64"].exponent_bits, FLOATS["float64"].fraction_bits,
        decode_shift("float64", F64))  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _column_into_limbs(bits, order, lo, hi, d, row, L, wide):  # pragma: no cover - compiled
    """Add values ``bits[order[t], d]`` for ``t`` in ``[lo, hi)`` into the state row ``row``."""
    for t in range(lo, hi):
        if wide:
            add_bits(row, L, bits[order[t], d], _F64[0], _F64[1], _F64[2], True)
        else:
            add_bits(row, L, bits[order[t], d], _F32[0], _F32[1], _F32[2], False)
        if (t - lo) % (1 << 29) == (1 << 29) - 1:
            normalise(row, L)


@njit(cache=True, nogil=True)
def _fold_buckets(values, bits, order, offsets, k0, k1, out_f, out_bits, target, fast, wide,
                  acc, err, limbs, column, mag):  # fmt: skip  # pragma: no cover - compiled
    """Fold buckets ``k0 .. k1-1`` of rows ``values`` (N, D) into ``out`` (K, D).

    ``bits`` is ``values`` viewed as integers; ``out_f``/``out_bits`` are the
    output viewed as floats and as signed integers of the output's width.
    ``target = (unit_exp, precision, exp_bits, subnormal_exp, nan_bits,
    out_shift)``; ``fast`` when an exact float64 sum may simply be cast to the
    output dtype (float32 values to float32, float64 values to float64);
    ``wide`` for float64 values. ``acc``/``err`` (D float64), ``limbs``
    (D, L + 5), ``column`` (L + 5) and ``mag`` (L) are scratch.
    """
    unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift = target
    D = values.shape[1]
    L = mag.shape[0]
    acc_bits = acc.view(np.int64)
    for k in range(k0, k1):
        lo = offsets[k]
        hi = offsets[k + 1]
        if lo == hi:
            for d in range(D):
                out_bits[k, d] = 0
            continue
        single = hi - lo <= CHUNK
        if not single:
            limbs[:, :] = 0
        flushes = 0
        start = lo
        while start < hi:
            stop = min(hi, start + CHUNK)
            for d in range(D):
                acc[d] = -0.0
                err[d] = 0.0
            for t in range(start, stop):
                row = values[order[t]]
                for d in range(D):
                    b = np.float64(row[d])
                    a = acc[d]
                    s = a + b
                    bb = s - a
                    err[d] += abs((a - (s - bb)) + (b - bb))
                    acc[d] = s
            if single:
                for d in range(D):
                    if err[d] == 0.0:
                        if fast:
                            out_f[k, d] = acc[d]
                        else:
                            neg, m, e = double_parts(acc_bits[d])
                            out_bits[k, d] = round_scaled(
                                m, e, neg, precision, exp_bits, subnormal_exp, out_shift
                            )
                    else:
                        column[:] = 0
                        _column_into_limbs(bits, order, lo, hi, d, column, L, wide)
                        out_bits[k, d] = round_row(
                            column, L, 0, unit_exp, precision, exp_bits, subnormal_exp, nan_bits,
                            out_shift, mag,
                        )  # fmt: skip
            else:
                n = stop - start
                for d in range(D):
                    if err[d] == 0.0:
                        add_double(limbs[d], acc_bits[d], unit_exp)
                        limbs[d, L] += n
                        if acc_bits[d] != np.int64(-9223372036854775808):  # not -0.0
                            limbs[d, L + 1] += 1
                    else:
                        _column_into_limbs(bits, order, start, stop, d, limbs[d], L, wide)
                flushes += 1
                if flushes % FLUSHES_BETWEEN_CARRIES == 0:
                    for d in range(D):
                        normalise(limbs[d], L)
            start = stop
        if not single:
            for d in range(D):
                out_bits[k, d] = round_row(
                    limbs[d], L, 0, unit_exp, precision, exp_bits, subnormal_exp, nan_bits,
                    out_shift, mag,
                )  # fmt: skip


@njit(cache=True, parallel=True)
def _fold_buckets_parallel(values, bits, order, offsets, bounds, out_f, out_bits, target, fast,
                           wide, L):  # fmt: skip  # pragma: no cover - compiled
    D = values.shape[1]
    for c in prange(bounds.shape[0] - 1):
        acc = np.empty(D, np.float64)
        err = np.empty(D, np.float64)
        limbs = np.empty((D, L + 5), np.int64)
        column = np.empty(L + 5, np.int64)
        mag = np.empty(L, np.int64)
        _fold_buckets(values, bits, order, offsets, bounds[c], bounds[c + 1], out_f, out_bits,
                      target, fast, wide, acc, err, limbs, column, mag)  # fmt: skip


def fold_buckets(values, order, offsets, bounds, out, out_bits, target, fast, L) -> None:
    """Fold the rows ``values`` (N, D; float32 or float64) bucket by bucket into ``out`` (K, D).

    ``bounds`` cuts the buckets into independent ranges (run in parallel when
    there is more than one); ``out_bits`` is ``out`` viewed as signed
    integers of the output's width; ``target`` and ``fast`` as in
    :func:`_fold_buckets`; ``L`` the limbs of the values' limb format.
    """
    wide = values.dtype == np.float64
    bits = values.view(np.int64 if wide else np.uint32)
    if bounds.shape[0] > 2:
        from .cpu import start_thread_pool

        start_thread_pool()
        _fold_buckets_parallel(values, bits, order, offsets, bounds, out, out_bits, target, fast,
                               wide, L)  # fmt: skip
        return
    D = values.shape[1]
    _fold_buckets(values, bits, order, offsets, bounds[0], bounds[-1], out, out_bits, target,
                  fast, wide, np.empty(D), np.empty(D), np.empty((D, L + 5), np.int64),
                  np.empty(L + 5, np.int64), np.empty(L, np.int64))  # fmt: skip


__all__ = ["CHUNK", "fold_buckets"]
