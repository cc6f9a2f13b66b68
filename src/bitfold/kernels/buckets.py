"""Bucket-at-a-time CPU kernels: each bucket summed exactly in a small scratch, rounded once.

The plan's stable order lists each bucket's positions together, so one
bucket at a time is gathered (a row of ``D`` contiguous values per position,
prefetched a few positions ahead) and summed in a scratch that stays in the
caches, whatever K is: no state of K superaccumulators, no atomics. This
serves folds of rows (embedding and graph gradients) and scalar folds into
very many buckets.

Exactness, in two levels:

1. Up to a chunk of rows (:data:`ROW_CHUNK` float32 rows, :data:`CHUNK`
   float64 rows; :data:`CHUNK` scalars) is added in float64. float64 rows,
   scalars and buckets of fewer than :data:`CERTIFY_MIN_TERMS` float32 rows
   have every addition checked (:func:`bitfold.kernels.ieee.checked_add`: an inexact
   addition, a NaN or an infinity turns the sum into NaN). Longer float32
   sums are added without a test, four rows at a time, while each column's
   largest and smallest magnitudes are kept; they certify that every float64
   sum of the column's terms is exact (:func:`_certified`), and a column
   without the certificate is summed again with checked adds. A sum that is
   not NaN *is* the exact sum of its values.
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
from .compile_lock import one_compiler_at_a_time
from .compiling import read_only
from .ieee import (
    CHUNK,
    add_bits,
    add_column,
    add_exact_sum,
    as_double,
    castable,
    checked_add,
    checked_add_narrow,
    float_parts,
    min_normal,
    normalise,
    round_row,
    round_scaled,
    segment_bits,
)
from .planning import touched_order
from .prefetch import copy_row_streaming, prefetch_row, store_fence, streaming_rows_ok

#: Rows (in the plan's order) prefetched ahead of the one being summed.
AHEAD = 8
#: float32 rows summed in float64 between flushes into limbs. An exact float64 sum of float32s
#: stays exact until a term falls below about 2^-29 of the running sum, which normal data
#: almost never does within this many rows; an inexact chunk is redone value by value.
#: float64 rows (whose float64 sums are rarely exact) keep the short :data:`CHUNK`.
ROW_CHUNK = 1024
#: Buckets of fewer float32 terms test every addition; longer ones (and every chunk of a
#: bucket summed into limbs) are certified once (:func:`_certified`).
CERTIFY_MIN_TERMS = 8
#: Flushes into a column's limbs between carry normalisations (each flush adds < 2^33).
FLUSHES_BETWEEN_CARRIES = 1 << 20

_F32 = (FLOATS["float32"].exponent_bits, FLOATS["float32"].fraction_bits,
        decode_shift("float32", F32))  # fmt: skip
_F64 = (FLOATS["float64"].exponent_bits, FLOATS["float64"].fraction_bits,
        decode_shift("float64", F64))  # fmt: skip


# Helpers that pass arrays are inlined by Numba (``inline="always"``): a call passing arrays
# takes and drops a reference to each (see _mend_row). Helpers of scalars only are plain
# kernels: LLVM inlines them into their loops just the same (the rows benchmark and the small
# folds measured as fast), and Numba does not copy their IR into every call site (a first
# rows fold compiled in 11.1 CPU-s instead of 12.3 on the 2-core VM).


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


@njit(cache=True, nogil=True)
def _cast_tiny(target):  # pragma: no cover - compiled
    """The output's smallest normal: exact sums at least this large (or zero) may be cast."""
    return min_normal(target[1], target[3])


@njit(cache=True, nogil=True, inline="always")
def _keep_old(x, out_f, out_bits, k, d, target):  # pragma: no cover - compiled
    """Write ``x``, a bucket's old value and its only term, as the result: a copy, bit for bit
    in any floating-point mode (a NaN: the canonical one). Only where ``fast`` (the output is
    the old value's dtype)."""
    out_f[k, d] = x
    if x != x:
        out_bits[k, d] = target[4] << target[5]


@njit(cache=True, nogil=True)
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
def _mend_row(values, bits, order, lo, hi, k, acc, out_f, out_bits, target, tiny, fast, wide,
              column, mag, init, init_bits, has_init):  # fmt: skip  # pragma: no cover
    """Row ``k`` of the output from ``acc``, the float64 sums of its columns (rows ``lo .. hi-1``),
    where a cast does not give it.

    The callers first cast every column when ``fast`` (the common case, written
    out in each loop over buckets, see below) and call this only when a sum may
    not be cast, or without ``fast``. A column whose sum may be cast is left as
    cast; one whose sum is exact (not NaN) is rounded from it once
    (:func:`_round_double`); any other one is summed exactly from its bits
    (:func:`_segment`, with ``init[k, d]`` when ``has_init``).

    Why the cast is not in here: an inlined call that passes arrays costs a
    reference count taken and dropped for each of them (atomic operations),
    and this one takes ten. Once a bucket, that was about 80 ns of the 100 ns a
    bucket of a few rows cost on a 2-core VM (256 rows into 1,000 buckets:
    24 us, 5.7 us with the cast written out and this call behind its test).
    """
    for d in range(bits.shape[1]):
        if fast and castable(acc[d], tiny):
            continue
        if acc[d] == acc[d]:
            out_bits[k, d] = _round_double(acc[d], target)
        else:
            out_bits[k, d] = _segment(values, bits, order, lo, hi, d, target, wide, column,
                                      mag, has_init, init[k % init.shape[0], d],
                                      init_bits[k % init.shape[0], d])  # fmt: skip


@njit(cache=True, nogil=True)
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
def _add_wide_rows(values, bits, order, start, stop, last, acc):  # pragma: no cover - compiled
    """Add float64 rows ``order[start:stop]`` into ``acc`` with checked adds (NaN: inexact)."""
    D = acc.shape[0]
    for t in range(start, stop):
        if t + AHEAD <= last:
            prefetch_row(values, order[t + AHEAD])
        r = order[t]
        row, row_bits = values[r], bits[r]
        for d in range(D):
            acc[d] = checked_add(acc[d], as_double(row[d], row_bits[d], _F64[0], _F64[1]))


@njit(cache=True, nogil=True)
def _magnitude(raw):  # pragma: no cover - compiled
    """The float32 bits ``raw`` without their sign: magnitudes compare as these integers do."""
    return raw & np.uint32(0x7FFFFFFF)


@njit(cache=True, nogil=True)
def _below(raw):  # pragma: no cover - compiled
    """``_magnitude(raw) - 1`` as a uint32: a zero wraps to the largest, so a minimum skips it."""
    return np.uint32(_magnitude(raw) - np.uint32(1))


@njit(cache=True, nogil=True)
def _ceil_log2(n):  # pragma: no cover - compiled
    c = 0
    while (1 << c) < n:
        c += 1
    return c


@njit(cache=True, nogil=True)
def _certified(high, below, log2_terms):  # pragma: no cover - compiled
    """True when any float64 sum of the terms is exact: every addition, in any order, is exact.

    ``high`` is the largest magnitude's bits, ``below`` the smallest non-zero
    magnitude's bits minus one (all ones when every term is zero), and at most
    ``2^log2_terms`` terms (at most 2^29) are summed. Every term is then
    finite and normal (no subnormal, which denormals-are-zero would read as
    zero), an integer multiple of ``u = 2^(eL - 150)`` (``eL`` the smallest
    biased exponent) and below ``2^(eH - 126)`` in magnitude (``eH`` the
    largest): every partial sum is a multiple of ``u`` below
    ``2^(log2_terms + eH - eL + 24)`` units, which float64 holds exactly when
    ``log2_terms + eH - eL <= 29``. (Terms all zero: ``eH = 0``, exact too.)
    uint32 operations without a branch: it vectorises over the columns.
    """
    low = np.uint32(below + np.uint32(1))  # 0 when every term is zero
    finite = high < np.uint32(0x7F800000)
    normal_or_zero = (low >= np.uint32(0x800000)) | (below == np.uint32(0xFFFFFFFF))
    narrow = np.uint32((high >> np.uint32(23)) + np.uint32(log2_terms)) <= np.uint32(
        (low >> np.uint32(23)) + np.uint32(29))  # fmt: skip
    return finite & normal_or_zero & narrow


@njit(cache=True, nogil=True)
def _recheck_narrow(bits, order, start, stop, d, init_bits, k, first):  # pragma: no cover
    """Column ``d``'s sum (``init[k, d]`` first when ``first``) by checked adds: NaN if inexact."""
    acc = -0.0
    if first:
        acc = _add_narrow(acc, init_bits[k, d])
    for t in range(start, stop):
        acc = _add_narrow(acc, bits[order[t], d])
    return acc


@njit(cache=True, nogil=True, inline="always")
def _add_narrow_rows(values, bits, order, start, stop, last, acc, high, below, init_bits, k,
                     first):  # fmt: skip  # pragma: no cover - compiled
    """``acc[d]``: the float64 sum of float32 rows ``order[start:stop]`` (and ``init[k]``).

    ``init[k]`` is a term when ``first``. The rows are added four at a time
    without a test per addition, while the largest and smallest magnitudes of
    each column are kept (integer minimum and maximum of the bits, eight
    columns an instruction). A column whose magnitudes certify that every
    float64 sum of its terms is exact (:func:`_certified`) keeps its sum; any
    other column is summed again in order with checked adds
    (:func:`_recheck_narrow`): its exact sum, or NaN. Either way ``acc[d]`` is
    the exact sum of the column's terms or NaN, and an exact sum does not
    depend on the order of its terms (nor does its sign when zero: ``-0.0``
    exactly when every term is ``-0.0``). In the caches this is about 2.2x
    as fast as a test per addition.
    """
    D = acc.shape[0]
    n_terms = stop - start + first
    if first:
        for d in range(D):
            raw = init_bits[k, d]
            acc[d] = np.float64(float32_of_bits(raw))
            high[d] = _magnitude(raw)
            below[d] = _below(raw)
    else:
        for d in range(D):
            acc[d] = -0.0
            high[d] = 0
            below[d] = 0xFFFFFFFF
    t = start
    while t + 4 <= stop:
        for a in range(4):
            if t + a + AHEAD <= last:
                prefetch_row(values, order[t + a + AHEAD])
        r0, r1, r2, r3 = bits[order[t]], bits[order[t + 1]], bits[order[t + 2]], bits[order[t + 3]]
        for d in range(D):  # float64 columns: four lanes an instruction
            acc[d] += ((np.float64(float32_of_bits(r0[d])) + np.float64(float32_of_bits(r1[d])))
                       + (np.float64(float32_of_bits(r2[d]))
                          + np.float64(float32_of_bits(r3[d]))))  # fmt: skip
        for d in range(D):  # uint32 columns: eight lanes an instruction
            high[d] = max(high[d], max(max(_magnitude(r0[d]), _magnitude(r1[d])),
                                       max(_magnitude(r2[d]), _magnitude(r3[d]))))  # fmt: skip
            below[d] = min(below[d], min(min(_below(r0[d]), _below(r1[d])),
                                         min(_below(r2[d]), _below(r3[d]))))  # fmt: skip
        t += 4
    while t < stop:
        if t + AHEAD <= last:
            prefetch_row(values, order[t + AHEAD])
        row_bits = bits[order[t]]
        for d in range(D):
            acc[d] += np.float64(float32_of_bits(row_bits[d]))
        for d in range(D):
            high[d] = max(high[d], _magnitude(row_bits[d]))
            below[d] = min(below[d], _below(row_bits[d]))
        t += 1
    log2_terms = _ceil_log2(n_terms)
    uncertified = 0
    for d in range(D):
        uncertified += not _certified(high[d], below[d], log2_terms)
    if uncertified:
        for d in range(D):
            if not _certified(high[d], below[d], log2_terms):
                acc[d] = _recheck_narrow(bits, order, start, stop, d, init_bits, k, first)


@njit(cache=True, nogil=True, inline="always")
def _sum_rows(values, bits, order, start, stop, last, acc, high, below, wide, init, init_bits, k,
              first):  # fmt: skip  # pragma: no cover - compiled
    """``acc[d]``: the exact float64 sum of rows ``order[start:stop]`` (and ``init[k]``), or NaN.

    ``init[k]`` is a term when ``first``.

    NaN where that sum is not exact in float64 (or a term is a NaN, an
    infinity or a subnormal): such a column is summed exactly some other way.
    float32 rows: :func:`_add_narrow_rows` (certified, whatever their count);
    float64 rows: checked adds.
    """
    if not wide:
        _add_narrow_rows(values, bits, order, start, stop, last, acc, high, below, init_bits, k,
                         first)  # fmt: skip
        return
    for d in range(acc.shape[0]):
        acc[d] = -0.0
    if first:
        for d in range(acc.shape[0]):
            acc[d] = checked_add(acc[d], _read(init, init_bits, k, d, wide))
    _add_wide_rows(values, bits, order, start, stop, last, acc)


@njit(cache=True, nogil=True)
def _rows_into_limbs(values, bits, order, k, lo, hi, last, limbs, acc, wide, init, init_bits,
                     has_init, chunk, unit_exp):  # fmt: skip  # pragma: no cover - compiled
    """The exact sum of rows ``order[lo:hi]`` (plus ``init[k]`` with ``has_init``) into ``limbs``.

    ``limbs`` (D, L + 5) is zeroed first and left normalised. Rows are summed
    ``chunk`` at a time in float64 (:func:`_sum_rows`); an exact chunk sum goes
    into a column's limbs at once, an inexact one value by value.
    """
    D = acc.shape[0]
    L = limbs.shape[1] - 5
    high, below = np.empty(D, np.uint32), np.empty(D, np.uint32)
    limbs[:, :] = 0
    flushes = 0
    start = lo
    while start < hi:
        stop = min(hi, start + chunk)
        first = has_init and start == lo
        _sum_rows(values, bits, order, start, stop, last, acc, high, below, wide, init, init_bits,
                  k, first)  # fmt: skip
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
    bits ``init_bits``): the result of a fold into an existing array (a bucket
    with no rows: ``init[k]`` copied when ``fast``, a NaN written as the
    canonical one). A bucket of at most ``chunk`` rows is summed in float64
    and cast or rounded from it, column by column, where that sum is exact;
    any other bucket goes through its limbs (:func:`_rows_into_limbs`).
    """
    unit_exp = target[0]
    tiny = _cast_tiny(target)
    D = values.shape[1]
    last = offsets[k1] - 1
    high, below = np.empty(D, np.uint32), np.empty(D, np.uint32)
    for k in range(k0, k1):
        lo = np.int64(offsets[k])  # int64 as in a split bucket's task: one compiled callee
        hi = np.int64(offsets[k + 1])
        if lo == hi and not has_init:
            for d in range(D):
                out_bits[k, d] = 0
            continue
        if lo == hi and fast:  # init[k] alone, in its own dtype: itself
            for d in range(D):
                _keep_old(init[k, d], out_f, out_bits, k, d, target)
            continue
        if hi - lo > chunk:
            _rows_into_limbs(values, bits, order, k, lo, hi, last, limbs, acc, wide, init,
                             init_bits, has_init, chunk, unit_exp)  # fmt: skip
            for d in range(D):
                out_bits[k, d] = _round_limbs(limbs[d], target, mag)
            continue
        if wide or hi - lo + has_init >= CERTIFY_MIN_TERMS:
            _sum_rows(values, bits, order, lo, hi, last, acc, high, below, wide, init,
                      init_bits, k, has_init)  # fmt: skip
        else:  # the commonest bucket, a few float32 rows, each addition tested: written out
            # here, as the same loop in an (inlined) function measured 1.1-1.2x the time at
            # K = 10^5 .. 10^6
            for d in range(D):
                acc[d] = -0.0
            if has_init:
                for d in range(D):
                    acc[d] = _add_narrow(acc[d], init_bits[k, d])
            for t in range(lo, hi):
                if t + AHEAD <= last:
                    prefetch_row(values, order[t + AHEAD])
                row_bits = bits[order[t]]
                for d in range(D):
                    acc[d] = _add_narrow(acc[d], row_bits[d])
        inexact = 0
        if fast:  # cast every column; mend those a cast does not give (see _mend_row)
            for d in range(D):
                out_f[k, d] = acc[d]
                inexact += not castable(acc[d], tiny)
        if inexact or not fast:
            _mend_row(values, bits, order, lo, hi, k, acc, out_f, out_bits, target, tiny, fast,
                      wide, column, mag, init, init_bits, has_init)  # fmt: skip


@njit(cache=True, nogil=True)
def _fold_scalar_buckets(values, bits, order, offsets, k0, k1, out_f, out_bits, target, fast,
                         wide, column, mag, init, init_bits, has_init):  # fmt: skip
    """:func:`_fold_buckets` for scalars (``D == 1``): the sums held in registers.

    An empty bucket is ``+0.0`` (with ``init``, when ``fast``: ``init[k]``, a NaN
    the canonical one); a bucket of at most :data:`CHUNK` values whose
    checked float64 sum is exact is rounded from it (cast when ``fast``); any
    other bucket is summed by :func:`bitfold.kernels.ieee.segment_bits`.
    """
    last = offsets[k1] - 1
    tiny = _cast_tiny(target)
    for k in range(k0, k1):
        lo = np.int64(offsets[k])  # as in _fold_buckets: one compiled segment_bits
        hi = np.int64(offsets[k + 1])
        if lo == hi and not has_init:
            out_bits[k, 0] = 0
            continue
        i = k % init.shape[0]
        if lo == hi and fast:  # init[k] alone, in its own dtype: itself, as for rows
            _keep_old(init[i, 0], out_f, out_bits, k, 0, target)
            continue
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


@njit(cache=True, nogil=True, inline="always")
def _sum_buckets(values, bits, order, offsets, k0, k1, out, out_bits, target, fast, wide, L, init,
                 init_bits, has_init, chunk):  # fmt: skip  # pragma: no cover - compiled
    """Buckets ``k0 .. k1-1`` of ``order``/``offsets`` folded into ``out``: scalars by
    :func:`_fold_scalar_buckets`, rows by :func:`_fold_buckets` (their arguments).

    The choice is made at run time, so a caller's first compile compiles both kernels; the
    scalar one adds well under a CPU-second to a first fold of rows, as most of it is callees
    the row kernel needs too (choosing in Python instead cost every small call 1.4 to 2.5 us:
    ``benchmarks/results/2026-12-08-test-suite-cpu-2core/``)."""
    D = values.shape[1]
    column, mag = np.empty(L + 5, np.int64), np.empty(L, np.int64)
    if D == 1:
        _fold_scalar_buckets(values, bits, order, offsets, k0, k1, out, out_bits, target, fast,
                             wide, column, mag, init, init_bits, has_init)  # fmt: skip
    else:
        _fold_buckets(values, bits, order, offsets, k0, k1, out, out_bits, target, fast, wide,
                      np.empty(D), np.empty((D, L + 5), np.int64), column, mag, init,
                      init_bits, has_init, chunk)  # fmt: skip


@njit(cache=True, parallel=True)
def _fold_tasks_parallel(values, bits, order, offsets, tasks, parts, out_f, out_bits, target,
                         fast, wide, L, init, init_bits, has_init, chunk):  # fmt: skip
    # pragma: no cover - compiled
    """Run every task of :func:`fold_buckets`: bucket ranges, and parts of split buckets."""
    D = values.shape[1]
    for c in prange(tasks.shape[0]):
        k0, k1, lo, hi, p = tasks[c, 0], tasks[c, 1], tasks[c, 2], tasks[c, 3], tasks[c, 4]
        if p >= 0:  # positions lo .. hi-1 of bucket k0; init is the first part's term
            acc = np.empty(D, np.float64)
            _rows_into_limbs(values, bits, order, k0, lo, hi, hi - 1, parts[p], acc, wide, init,
                             init_bits, has_init and lo == offsets[k0], chunk,
                             target[0])  # fmt: skip
            continue
        _sum_buckets(values, bits, order, offsets, k0, k1, out_f, out_bits, target, fast, wide,
                     L, init, init_bits, has_init, chunk)  # fmt: skip


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
    if tasks.shape[0] == 1:
        fold_bucket_range(values, order, offsets, int(tasks[0, 0]), int(tasks[0, 1]), out,
                          out_bits, target, fast, L, init)  # fmt: skip
        return
    from .cpu import start_thread_pool

    has_init = init is not None
    wide, values, bits, order, offsets, init, init_bits = _kernel_arrays(values, order, offsets,
                                                                         init)  # fmt: skip
    chunk = CHUNK if wide else ROW_CHUNK
    n_parts = int(split[:, 2].max()) if split.shape[0] else 0
    parts = np.empty((n_parts, values.shape[1], L + 5), np.int64)
    start_thread_pool()
    with parallel_chunksize(1):  # dynamic: a slow thread takes fewer tasks
        _fold_tasks_parallel(values, bits, order, offsets, tasks, parts, out, out_bits,
                             target, fast, wide, L, init, init_bits, has_init, chunk)  # fmt: skip
        if n_parts:
            _merge_parts(parts, split, out_bits, target)


def fold_bucket_range(values, order, offsets, k0, k1, out, out_bits, target, fast, L,
                      init=None) -> None:  # fmt: skip
    """:func:`fold_buckets` of buckets ``k0 .. k1-1`` on this thread (one task: a small fold's
    way in, with no table of tasks to make)."""
    has_init = init is not None
    wide, values, bits, order, offsets, init, init_bits = _kernel_arrays(values, order, offsets,
                                                                         init)  # fmt: skip
    _sum_buckets(values, bits, order, offsets, k0, k1, out, out_bits, target, fast, wide, L, init,
                 init_bits, has_init, CHUNK if wide else ROW_CHUNK)  # fmt: skip


@njit(cache=True, nogil=True)
def _fold_rows_into(index, sizes, wrap, values, bits, old, old_bits, target, target_bits, goal,
                    has_init, in_place, wide, L, chunk):  # fmt: skip  # pragma: no cover
    """:func:`fold_rows_into` (``old_bits``: ``old`` viewed as the values' integers;
    ``target_bits``: ``target`` as the output's signed ones)."""
    U, slot, touched, offsets, order = touched_order(index, sizes, wrap)
    if U < 0:
        return -1
    K, D = target.shape
    if not has_init:  # every bucket written: the touched ones' positions put in bucket order
        starts = np.zeros(K + 1, np.int32)
        for u in range(U):
            starts[touched[u] + 1] = offsets[u + 1] - offsets[u]
        for k in range(K):
            starts[k + 1] += starts[k]
        by_bucket = np.empty_like(order)
        for u in range(U):
            at = starts[touched[u]] - offsets[u]
            for j in range(offsets[u], offsets[u + 1]):
                by_bucket[at + j] = order[j]
        unread = np.empty((1, D), bits.dtype)  # no old value: the kernels never read it
        _sum_buckets(values, bits, by_bucket, starts, 0, K, target, target_bits, goal, True, wide,
                     L, unread.view(values.dtype), unread, False, chunk)  # fmt: skip
        return 0
    init_bits = np.empty((U, D), bits.dtype)  # the touched rows' old values
    for u in range(U):
        init_bits[u, :] = old_bits[touched[u], :]
    out = np.empty((U, D), values.dtype)
    out_bits = out.view(target_bits.dtype)
    _sum_buckets(values, bits, order, offsets, 0, U, out, out_bits, goal, True, wide, L,
                 init_bits.view(values.dtype), init_bits, True, chunk)  # fmt: skip
    nan = goal[4] << goal[5]
    for k in range(K):  # a bucket with no rows: its old value, a NaN the canonical one
        if slot[k] >= 0:
            continue
        if not in_place:
            for d in range(D):
                _keep_old(old[k, d], target, target_bits, k, d, goal)
            continue
        found = False  # read only (the old values stay): a NaN is rare
        for d in range(D):
            found |= target[k, d] != target[k, d]
        if found:
            for d in range(D):
                if target[k, d] != target[k, d]:
                    target_bits[k, d] = nan
    for u in range(U):
        target_bits[touched[u], :] = out_bits[u, :]
    return 0


def fold_rows_into(index, sizes, wrap, values, target, goal, L, old=None) -> int:  # fmt: skip
    """Fold the rows ``values`` (N, D; float32 or float64) into ``target`` (K, D, the values'
    dtype, C-contiguous, sharing no memory with ``values`` or ``index``), on this thread: 0,
    or -1 (an id out of range, found before anything is written).

    Positions are bucketed by :func:`bitfold.kernels.planning.touched_order`
    (``index`` (M, N) ids along the dimensions ``sizes``, ``wrap`` for
    negative ids). Each bucket that some row reaches becomes the correctly
    rounded sum of its rows and of its old value in ``old`` (K, D, the values'
    dtype), when given (one rounding; ``goal`` is the output's rounding
    target, ``L`` its limb count). Every other bucket is its old value, a NaN
    written as the canonical one, or +0.0 without ``old``: the bits of
    :func:`fold_buckets` with ``fast``. ``old`` may be ``target`` itself (a
    fold in place: the other buckets are only read, for a NaN); otherwise
    ``target``'s contents are never read. Only the touched rows are summed; a
    fold of a few hundred rows costs one call.
    """
    wide = values.dtype == np.float64
    bits_dtype = np.int64 if wide else np.uint32
    has_init, in_place = old is not None, old is target
    old = target if old is None else old
    return int(_fold_rows_into(index, sizes, wrap, values, values.view(bits_dtype), old,
                               old.view(bits_dtype), target,
                               target.view(np.int64 if wide else np.int32), goal, has_init,
                               in_place, wide, L, CHUNK if wide else ROW_CHUNK))  # fmt: skip


#: per (dtype, D): the read-only stand-in for a missing ``init`` (the kernels never read it)
_STAND_INS: dict[tuple[np.dtype, int], np.ndarray] = {}


def _never_read(dtype: np.dtype, D: int) -> np.ndarray:
    found = _STAND_INS.get((dtype, D))
    if found is None:
        found = _STAND_INS[(dtype, D)] = read_only(np.zeros((1, D), dtype))
    return found


def _kernel_arrays(values, order, offsets, init):
    """The arrays as the kernels take them: read-only inputs (one compiled type whatever the
    caller's flags), the values' bits, and ``init`` or its stand-in, with its bits."""
    wide = values.dtype == np.float64
    bits_dtype = np.int64 if wide else np.uint32
    values, order, offsets = read_only(values), read_only(order), read_only(offsets)
    init = _never_read(values.dtype, values.shape[1]) if init is None else read_only(init)
    return wide, values, values.view(bits_dtype), order, offsets, init, init.view(bits_dtype)


# -- staged rows: hot buckets summed in position order, the other rows copied into order ---
#: Spilled values a stream task can hold (:func:`_stream_task`); past it the staged fold
#: reports an overflow and its caller folds again without staging.
SPILL_ROWS = 256


@njit(cache=True, nogil=True, inline="always")
def _pool_row(slot, pool, used, h, d):  # pragma: no cover - compiled
    """``(row, used)``: element ``(h, d)``'s row of limbs in ``pool``, zeroed and given to it
    (``slot[h, d]``) on its first use; ``row`` is -1 when the pool is out of rows."""
    j = slot[h, d]
    if j < 0:
        if used == pool.shape[0]:
            return -1, used
        j = used
        used += 1
        slot[h, d] = j
        pool[j, :] = 0
    return j, used


@njit(cache=True, nogil=True, inline="always")
def _kept_or_pool_row(state, slot, pool, used, h, d, s):  # pragma: no cover - compiled
    """``(row, used)`` for a tested sum ``s`` of ``state[h, d]`` and a term: ``s`` is stored
    and ``row`` is -2 when it is exact (not NaN); otherwise the term belongs in the element's
    pool row ``row`` (:func:`_pool_row`; -1 when the pool is out of rows)."""
    if s == s:
        state[h, d] = s
        return -2, used
    return _pool_row(slot, pool, used, h, d)


@njit(cache=True, nogil=True)
def _spill_row(bits, i, state, h, slot, pool, used, L):  # pragma: no cover - compiled
    """The slow path of :func:`_stream_task` for hot row ``i`` of bucket slot ``h``.

    Value by value: each value whose addition into ``state[h, d]`` is exact
    (:func:`_add_narrow`'s test) is added; any other goes into its element's
    pool row (:func:`_pool_row`). Returns the pool rows used, or -1 when the pool ran out.
    """
    for d in range(bits.shape[1]):
        j, used = _kept_or_pool_row(state, slot, pool, used, h, d,
                                    _add_narrow(state[h, d], bits[i, d]))  # fmt: skip
        if j == -1:
            return -1
        if j >= 0:
            add_bits(pool[j], L, bits[i, d], _F32[0], _F32[1], _F32[2], False)
    return used


@njit(cache=True, nogil=True)
def _flush_chunk(acc, state, slot, pool, used, h, L, unit_exp):  # pragma: no cover - compiled
    """Add hot bucket ``h``'s chunk sums ``acc[h]`` (exact float64s) into ``state[h]``; reset them.

    Each chunk sum is added into ``state[h, d]`` where that addition is exact
    (:func:`checked_add_narrow`), and otherwise into the element's pool row of
    limbs (:func:`add_exact_sum`, :func:`_pool_row`). Returns the pool rows used, or -1 when
    the pool ran out.
    """
    for d in range(acc.shape[1]):
        a = acc[h, d]
        acc[h, d] = -0.0
        j, used = _kept_or_pool_row(state, slot, pool, used, h, d,
                                    checked_add_narrow(state[h, d], a))  # fmt: skip
        if j == -1:
            return -1
        if j >= 0:
            add_exact_sum(pool[j], L, a, 1, unit_exp)
    return used


@njit(cache=True, nogil=True)
def _stream_task(bits, route, lo, hi, stage, streaming, state, slot, pool, L, unit_exp, acc, high,
                 below, count, log2_count):  # fmt: skip  # pragma: no cover - compiled
    """Positions ``lo .. hi-1`` in order: a hot row added into its bucket's sums, a cold one staged.

    ``route[i] >= 0``: row ``i`` is copied to ``stage[route[i]]`` (its rank
    among the cold rows in the plan's order), with non-temporal stores when
    ``streaming``. ``route[i] < 0``: row ``i`` belongs to hot bucket
    ``h = -route[i] - 1``. Its values are added, without a test per addition,
    into the bucket's *chunk* sums ``acc[h, d]`` (float64, ``-0.0`` at the
    start), whose terms are certified all at once: the bucket keeps the
    largest magnitude (``high[h]``) and the smallest non-zero one minus one
    (``below[h]``) of every value in its chunk, over all its columns, and the
    chunk's rows (``count[h]``, ``log2_count[h]`` its ceiling log2). A row is
    added only while :func:`_certified` holds for the chunk with it: every
    float64 sum of the chunk's terms, in any order, is then exact. First a
    pass over the row takes its largest and smallest magnitudes (integer
    maximum and minimum, no store); then

    * the chunk with the row is certified: the row is added (one pass, no test);
    * it is not, but the row alone is: the chunk is flushed into the task's
      sums (:func:`_flush_chunk`) and the row starts a new chunk;
    * the row alone is not (a NaN, an infinity, a subnormal, or more than 29
      binades between its values): its values are added into ``state[h]``
      one by one with a test each (:func:`_spill_row`); the chunk stays.

    At the end every chunk is flushed. ``state[h, d]`` plus the element's pool
    row (``slot[h, d]``, -1 when none) is then exactly the sum of the values
    read. Normal data fill a chunk with hundreds of rows, so the flushes'
    tested additions are few; the certificate's two reductions a row cost
    less than a test of each addition. Returns the pool rows used, or -1 when
    the pool ran out (the sums are then incomplete and must not be used).
    Elements are indexed in two dimensions, never through a row view: a view
    made in the loop costs two atomic reference counts, which measured 2.7x
    the time of the whole row.
    """
    D = bits.shape[1]
    used = 0
    for i in range(lo, hi):
        r = route[i]
        if r >= 0:
            if streaming:
                copy_row_streaming(stage, r, bits, i)
            else:
                for d in range(D):
                    stage[r, d] = bits[i, d]
            continue
        h = -r - 1
        row_high = np.uint32(0)
        row_below = np.uint32(0xFFFFFFFF)
        for d in range(D):  # vectorised: two integer reductions
            raw = bits[i, d]
            row_high = max(row_high, _magnitude(raw))
            row_below = min(row_below, _below(raw))
        n = count[h] + 1
        g = log2_count[h] + ((1 << log2_count[h]) < n)
        new_high, new_below = max(high[h], row_high), min(below[h], row_below)
        if not _certified(new_high, new_below, g):
            if not _certified(row_high, row_below, 0):
                used = _spill_row(bits, i, state, h, slot, pool, used, L)
                if used < 0:
                    return -1
                continue
            if count[h]:
                used = _flush_chunk(acc, state, slot, pool, used, h, L, unit_exp)
                if used < 0:
                    return -1
            n, g, new_high, new_below = 1, 0, row_high, row_below
        for d in range(D):  # vectorised, no test: the chunk's certificate holds
            acc[h, d] += np.float64(float32_of_bits(bits[i, d]))
        count[h], log2_count[h], high[h], below[h] = n, g, new_high, new_below
    for h in range(acc.shape[0]):
        if count[h]:
            used = _flush_chunk(acc, state, slot, pool, used, h, L, unit_exp)
            if used < 0:
                return -1
    if streaming:
        store_fence()
    return used


@njit(cache=True, parallel=True)
def _stream_parallel(bits, route, bounds, stage, streaming, state, slot, pool, used, L, unit_exp):
    # pragma: no cover - compiled
    H, D = state.shape[1], state.shape[2]
    for s in prange(bounds.shape[0] - 1):
        acc = np.full((H, D), -0.0)
        high = np.zeros(H, np.uint32)
        below = np.full(H, 0xFFFFFFFF, np.uint32)
        count = np.zeros(H, np.int64)
        log2_count = np.zeros(H, np.int64)
        used[s] = _stream_task(bits, route, bounds[s], bounds[s + 1], stage, streaming, state[s],
                               slot[s], pool[s], L, unit_exp, acc, high, below, count,
                               log2_count)  # fmt: skip


@njit(cache=True, nogil=True)
def _merge_hot(state, slot, pool, hot, h0, h1, out_f, out_bits, target, fast, row, mag):
    # pragma: no cover - compiled
    """Hot buckets ``hot[h0:h1]``: each one's stream tasks' exact sums added, rounded once.

    Where every task's float64 sum is exact, no value was spilled and their
    checked float64 sum is exact too, that sum is cast (``fast``) or rounded
    (:func:`_round_double`); otherwise the sums and the spilled limbs are
    added as integers (:func:`bitfold.kernels.ieee.add_exact_sum`) and the
    limbs rounded once. ``row`` (L + 5) and ``mag`` (L) are int64 scratch.
    """
    S, _, D = state.shape
    L = pool.shape[2] - 5
    unit_exp = target[0]
    tiny = _cast_tiny(target)
    for h in range(h0, h1):
        k = hot[h]
        for d in range(D):
            acc = -0.0
            spilled = False
            for s in range(S):
                acc = checked_add_narrow(acc, state[s, h, d])
                spilled |= slot[s, h, d] >= 0
            if acc == acc and not spilled:
                if fast and castable(acc, tiny):
                    out_f[k, d] = acc
                else:
                    out_bits[k, d] = _round_double(acc, target)
                continue
            row[:] = 0
            for s in range(S):
                add_exact_sum(row, L, state[s, h, d], 1, unit_exp)
                j = slot[s, h, d]
                if j >= 0:
                    normalise(pool[s, j], L)  # limbs below 2^32 (a task adds up to 2^29 values)
                    for i in range(L + 5):
                        row[i] += pool[s, j, i]
            out_bits[k, d] = _round_limbs(row, target, mag)


@njit(cache=True, nogil=True)
def _fold_staged_range(values, bits, order, offsets, k0, k1, out_f, out_bits, target, fast, acc,
                       high, below, column, mag, is_hot):  # fmt: skip  # pragma: no cover
    """Buckets ``k0 .. k1-1`` of staged float32 rows: rows ``offsets[k] .. offsets[k+1]-1``.

    Hot buckets (``is_hot[k]``) are left alone: :func:`_merge_hot` writes them.

    The rows lie in order, one after the other (``order`` is the identity).
    A bucket of fewer than :data:`CERTIFY_MIN_TERMS` rows tests each addition
    (:func:`_add_narrow`); a longer one is certified by its columns' largest
    and smallest magnitudes, as the gather path does (:func:`_add_narrow_rows`;
    ``high``, ``below``: D uint32 scratch). (Certifying a bucket of one row
    costs more than testing it: 262,144 rows of 64 into 10^6 buckets took 18%
    longer.) A column whose float64 sum is exact is cast (``fast``) or
    rounded from it; any other one is summed exactly from
    its bits (:func:`_segment`, ``order`` the identity).
    """
    tiny = _cast_tiny(target)
    D = bits.shape[1]
    for k in range(k0, k1):
        lo = np.int64(offsets[k])
        hi = np.int64(offsets[k + 1])
        if lo == hi:
            if not is_hot[k]:
                for d in range(D):
                    out_bits[k, d] = 0
            continue
        if hi - lo < CERTIFY_MIN_TERMS:
            for d in range(D):
                acc[d] = -0.0
            for t in range(lo, hi):  # no row view: see _stream_task
                for d in range(D):
                    acc[d] = _add_narrow(acc[d], bits[t, d])
        else:  # no init: the rows stand in for its bits, never read
            _add_narrow_rows(values, bits, order, lo, hi, hi - 1, acc, high, below, bits, k,
                             False)  # fmt: skip
        inexact = 0
        if fast:  # as in _fold_buckets
            for d in range(D):
                out_f[k, d] = acc[d]
                inexact += not castable(acc[d], tiny)
        if inexact or not fast:  # no init: the values stand in for its arrays, never read
            _mend_row(values, bits, order, lo, hi, k, acc, out_f, out_bits, target, tiny, fast,
                      False, column, mag, values, bits, False)  # fmt: skip


@njit(cache=True, parallel=True)
def _fold_staged_parallel(values, bits, order, offsets, tasks, parts, out_f, out_bits, target,
                          fast, L, chunk, is_hot, state, slot, pool, hot, wide, has_init):
    # pragma: no cover - compiled
    """The second pass of :func:`fold_staged`, one parallel loop over ``tasks``.

    A task ``(k0, k1, -, -, -1)`` folds the staged buckets ``k0 .. k1-1``
    (:func:`_fold_staged_range`); ``(k, k + 1, lo, hi, p)`` with ``p >= 0``
    sums part ``p`` of a staged bucket into ``parts[p]``
    (:func:`_rows_into_limbs`); ``(h0, h1, -, -, -2)`` merges and rounds the
    hot buckets ``hot[h0:h1]`` (:func:`_merge_hot`). Every task writes
    output rows no other task writes. ``wide`` and ``has_init`` are False
    (float32 rows, no ``init``), passed in rather than written as constants:
    a constant would be a type of its own, and :func:`_rows_into_limbs`
    would compile again for this caller.
    """
    D = values.shape[1]
    for c in prange(tasks.shape[0]):
        k0, k1, lo, hi, p = tasks[c, 0], tasks[c, 1], tasks[c, 2], tasks[c, 3], tasks[c, 4]
        column = np.empty(L + 5, np.int64)
        mag = np.empty(L, np.int64)
        if p == -2:
            _merge_hot(state, slot, pool, hot, k0, k1, out_f, out_bits, target, fast, column,
                       mag)  # fmt: skip
            continue
        acc = np.empty(D, np.float64)
        if p >= 0:
            _rows_into_limbs(values, bits, order, k0, lo, hi, hi - 1, parts[p], acc, wide,
                             values[:1], bits[:1], has_init, chunk, target[0])  # fmt: skip
            continue
        high, below = np.empty(D, np.uint32), np.empty(D, np.uint32)
        _fold_staged_range(values, bits, order, offsets, k0, k1, out_f, out_bits, target, fast,
                           acc, high, below, column, mag, is_hot)  # fmt: skip


def fold_staged(values, route, bounds, hot, is_hot, stage, stage_order, stage_offsets, tasks,
                split, out, out_bits, target, fast, L) -> bool:  # fmt: skip
    """Fold float32 rows ``values`` (N, D) into ``out`` (K, D) in two passes; False: not done.

    A plan-only layout (:func:`bitfold.backends.host_routes.staged_layout`)
    names ``hot`` buckets (H of them) and, for every position, where its row
    goes (``route``, see :func:`_stream_task`). The first pass reads the rows
    once, in position order, as ``bounds`` (S + 1 positions) cuts them into
    fixed tasks: a hot bucket's values are added into float64 sums a task,
    in chunks of rows whose magnitudes certify them exact (a row that cannot
    be certified is added with a test per value, a value or chunk sum that
    would round spilled into limbs); every other row is
    copied into ``stage`` (uint32, one row a cold position) in the plan's
    order, so that the second pass reads it sequentially, bucket by bucket
    (``stage_offsets``, the cold buckets' ranges; ``stage_order``, the
    identity; ``tasks`` and ``split`` as in :func:`fold_buckets`, a bucket
    past the split limit summed in parts into limbs). In the same parallel
    loop (``tasks`` holds tasks of both kinds), each hot bucket's task sums
    and spilled limbs are added exactly and rounded once (:func:`_merge_hot`;
    ``is_hot``, K booleans, marks the hot buckets).
    Every result is the correctly rounded sum, the bits of :func:`fold_buckets`;
    only where the rows are read from differs. Returns False, having written
    nothing usable, when a task spilled more than :data:`SPILL_ROWS` values
    (values of very different magnitudes in one hot bucket): the caller folds
    with :func:`fold_buckets` instead.
    """
    from .cpu import start_thread_pool

    bits = values.view(np.uint32)
    S = bounds.shape[0] - 1
    H = hot.shape[0]
    D = values.shape[1]
    state = np.full((S, H, D), -0.0)
    slot = np.full((S, H, D), -1, np.int32)
    pool = np.empty((S, SPILL_ROWS, L + 5), np.int64)
    used = np.zeros(S, np.int64)
    streaming = streaming_rows_ok(stage)
    start_thread_pool()
    with parallel_chunksize(1):
        _stream_parallel(bits, route, bounds, stage, streaming, state, slot, pool, used, L,
                         target[0])  # fmt: skip
    if (used < 0).any():
        return False
    n_parts = int(split[:, 2].max()) if split.shape[0] else 0
    parts = np.empty((n_parts, D, L + 5), np.int64)
    with parallel_chunksize(1):
        # the staged rows read-only, as the bucket kernels take their inputs: one compiled type
        _fold_staged_parallel(read_only(stage.view(np.float32)), read_only(stage), stage_order,
                              stage_offsets, tasks, parts, out, out_bits, target, fast, L,
                              ROW_CHUNK, is_hot, state, slot, pool, hot, False, False)  # fmt: skip
        if n_parts:
            _merge_parts(parts, split, out_bits, target)
    return True


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


__all__ = ["CHUNK", "SPILL_ROWS", "fold_buckets", "fold_rows_into", "fold_staged", "redo_scalar",
           "round_doubles"]


one_compiler_at_a_time(globals())
