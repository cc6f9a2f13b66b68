"""Streaming kernels for scalar folds: one float64 (or int64) a bucket, no limbs.

Position order (:func:`float_sums`, :func:`half_sums`): values are read once,
in position order, and added into a state of one float64 (or one int64) per
bucket, small enough to stay in the caches for K up to a few hundred
thousand, as a scatter-add would; each of a fixed number of *slots* (never
the thread count) takes an equal range of positions into its own state, and
the slots are merged at the end.

Sorted order (:func:`sorted_sums`, for K beyond that): the values are read in
the plan's stable order, bucket after bucket, through a static array of the
bucket of each sorted position, and each bucket's running sum is stored at
every step (the last store wins): no branch depends on the bucket sizes, so
millions of tiny buckets cost no mispredictions.

Exactness:

* :func:`float_sums` (float32 values, no offsets needed): every addition is checked
  (:func:`bitfold.kernels.ieee.checked_add`); a bucket whose float64 sum was
  ever inexact, or met a NaN or an infinity, ends as NaN and is summed again
  bucket by bucket through the plan's order (the caller's redo). The others
  hold their exact sum.
* :func:`half_sums` (float16 values): a float16 is an integer multiple of
  2^-24 below 2^16, so the sum of fewer than 2^23 of them, in units of
  2^-24, is an exact int64: an integer scatter-add, each value's integer
  read from a table of all 65,536 patterns. NaN and infinities are counted
  aside.
"""

from __future__ import annotations

import numpy as np
from numba import get_thread_id, njit, prange

from .compile_lock import one_compiler_at_a_time
from .compiling import read_only
from .ieee import as_double, castable, checked_add, checked_add_narrow, round_row, round_scaled
from .prefetch import prefetch_item, prefetch_row

#: Positions (in the plan's order) prefetched ahead by :func:`sorted_sums`.
AHEAD = 16
#: :func:`float_sums` prefetches each bucket's sum this many positions ahead when there are
#: more than FAR_MIN_K buckets (a slot's 8-byte sums then exceed a core's L2 cache).
FAR_AHEAD = 32
FAR_MIN_K = 1 << 18
#: Below this many buckets a one-slot :func:`float_sums` merges on the calling thread.
PARALLEL_MIN_K = 1 << 16


#: The bits of a float32 -0.0.
NEGATIVE_ZERO_BITS = 0x80000000


@njit(cache=True, nogil=True)
def _add_checked(ix, vs, bs, sums, bounded):  # pragma: no cover - compiled
    # how many values were -0.0; with bounded, -1 at an entry of ix outside [0, len(sums))
    K = np.uint64(sums.shape[0])
    negative_zeros = 0
    for t in range(ix.shape[0]):  # from 0: no negative-index checks in the loop
        k = ix[t]
        if bounded and np.uint64(k) >= K:  # a negative entry wraps past K too
            return -1
        sums[k] = checked_add_narrow(sums[k], as_double(vs[t], bs[t], 8, 23))
        negative_zeros += bs[t] == NEGATIVE_ZERO_BITS
    return negative_zeros


@njit(cache=True, nogil=True)
def _add_checked_far(ix, vs, bs, sums, n, bounded):  # pragma: no cover - compiled
    K = np.uint64(sums.shape[0])
    negative_zeros = 0  # a state past the caches: ask for the sums ahead (a prefetch never faults)
    for t in range(n):  # ix holds n + FAR_AHEAD entries
        prefetch_item(sums, ix[t + FAR_AHEAD])
        k = ix[t]
        if bounded and np.uint64(k) >= K:
            return -1
        sums[k] = checked_add_narrow(sums[k], as_double(vs[t], bs[t], 8, 23))
        negative_zeros += bs[t] == NEGATIVE_ZERO_BITS
    return negative_zeros


@njit(cache=True, nogil=True)
def _float_range(index, values, lo, hi, sums, far, bounded):  # pragma: no cover - compiled
    """Add values ``lo .. hi-1`` into ``sums``; how many were -0.0.

    With ``bounded`` every entry is checked first: -1 at one outside ``[0, K)``.
    """
    ix, vs, bs = index[lo:hi], values[lo:hi], values[lo:hi].view(np.uint32)
    split = max(0, (hi - lo) - FAR_AHEAD) if far else 0
    negative_zeros = _add_checked_far(ix, vs, bs, sums, split, bounded) if split else 0
    if negative_zeros < 0:
        return -1
    rest = _add_checked(ix[split:], vs[split:], bs[split:], sums, bounded)
    return -1 if rest < 0 else negative_zeros + rest


@njit(cache=True, parallel=True)
def _float_slots(index, values, sums, far, negative_zeros, bounded):  # pragma: no cover
    # slot s takes the s-th of S equal ranges (fewer slots than threads)
    n = index.shape[0]
    S = sums.shape[0]
    for s in prange(S):
        sums[s, :] = 0.0  # cleared by the thread that fills it: in parallel, its pages local
        negative_zeros[s] = _float_range(index, values, n * s // S, n * (s + 1) // S, sums[s],
                                         far, bounded)  # fmt: skip


@njit(cache=True, parallel=True)
def _clear_slots(sums):  # pragma: no cover - compiled
    for s in prange(sums.shape[0]):
        sums[s, :] = 0.0


@njit(cache=True, parallel=True)
def _float_chunks(index, values, sums, far, negative_zeros, bounded):  # pragma: no cover
    # one slot a thread; equal chunks of positions handed to whichever thread is free
    n = index.shape[0]
    C = negative_zeros.shape[0]
    for c in prange(C):
        s = get_thread_id()  # this thread's own slot: no two threads share one
        negative_zeros[c] = _float_range(index, values, n * c // C, n * (c + 1) // C, sums[s],
                                         far, bounded)  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def _store_sum(out, k, acc, tiny):  # pragma: no cover - compiled
    # a bucket's float64 sum into out[k], cast (one rounding), or NaN (to be redone): 1 if NaN
    ok = castable(acc, tiny)
    out[k] = acc if ok else np.nan
    return 0 if ok else 1


@njit(cache=True, nogil=True)
def _merge_float(sums, out, tiny, k0, k1):  # pragma: no cover - compiled
    # how many buckets were left NaN (to be redone)
    S = sums.shape[0]
    inexact = 0
    for k in range(k0, k1):
        acc = sums[0, k]
        for s in range(1, S):
            acc = checked_add_narrow(acc, sums[s, k])
        inexact += _store_sum(out, k, acc, tiny)
    return inexact


@njit(cache=True, parallel=True)
def _merge_float_parallel(sums, out, tiny):  # pragma: no cover - compiled
    K = out.shape[0]
    inexact = np.zeros(64, np.int64)
    for c in prange(64):
        inexact[c] = _merge_float(sums, out, tiny, K * c // 64, K * (c + 1) // 64)
    return inexact.sum()


@njit(cache=True, nogil=True)
def _negative_zero_buckets(index, bits, out):  # pragma: no cover - compiled
    # per bucket summed to zero: bit 1 = it has a -0.0 term, bit 2 = it has another term
    seen = np.zeros(out.shape[0], np.uint8)
    for t in range(index.shape[0]):
        k = index[t]
        if out[k] == 0.0:
            seen[k] |= 1 if bits[t] == NEGATIVE_ZERO_BITS else 2
    for k in range(out.shape[0]):
        if seen[k] == 1:
            out[k] = -0.0


def float_sums(index, values, sums: np.ndarray, out: np.ndarray, bounded: bool = False) -> int:
    """Each bucket's float64 sum of ``values`` (float32), stored into ``out``, or NaN; how many NaN.

    ``sums`` (slots, K) float64, whatever it holds, gives the private states
    of the slots: each is cleared to ``+0.0`` (by the thread that fills it),
    and they are merged with checked additions at the end. With one a thread,
    a fixed number of equal chunks of positions (never the thread count) go
    to whichever thread is free, into its own state; with fewer, each takes
    an equal range. ``out`` (K,) float32 or float64 receives each bucket's
    exact sum cast to its dtype (one rounding), or NaN where the float64 sum
    was ever inexact or met a NaN or an infinity, or where the cast could
    meet flush-to-zero (:func:`bitfold.kernels.ieee.castable`). An empty
    bucket is ``+0.0``; a bucket of ``-0.0`` terms only is ``-0.0`` (when a
    -0.0 was read, one more pass over the index finds them). Needs no
    offsets: a one-shot plan does not count its buckets. An exact sum is
    unique, so nothing depends on the number of slots.

    With ``bounded`` (an index not checked yet: :attr:`bitfold.Fold.unchecked_index`)
    every entry is checked against ``[0, K)`` as its value is added; at an
    entry outside, the fold stops and returns -1, ``out`` meaningless.
    """
    slots, K = sums.shape
    index, values = read_only(index), read_only(values)
    far = K > FAR_MIN_K
    tiny = float(np.finfo(out.dtype).tiny)
    one = slots == 1 and K < PARALLEL_MIN_K
    if one:
        sums[0] = 0.0
        negative_zeros = np.array([_float_range(index, values, 0, index.shape[0], sums[0], far,
                                                   bounded)])  # fmt: skip
    else:
        from .cpu import DYNAMIC_CHUNKS, dynamic_schedule, thread_count

        threads = thread_count()
        if slots == threads and threads > 1:  # a slow core takes fewer chunks
            negative_zeros = np.zeros(DYNAMIC_CHUNKS, np.int64)
            _clear_slots(sums)
            with dynamic_schedule():
                _float_chunks(index, values, sums, far, negative_zeros, bounded)
        else:
            negative_zeros = np.zeros(slots, np.int64)
            _float_slots(index, values, sums, far, negative_zeros, bounded)
    if (negative_zeros < 0).any():
        return -1
    inexact = _merge_float(sums, out, tiny, 0, K) if one else _merge_float_parallel(sums, out, tiny)
    if negative_zeros.any():
        _negative_zero_buckets(index, values.view(np.uint32), out)
    return int(inexact)


# -- partitioned: the values grouped by their id's high bits, each group's sums in the caches --
@njit(cache=True, nogil=True)
def _group_range(bits, dest, grouped, lo, hi):  # pragma: no cover - compiled
    negative_zeros = 0
    for t in range(lo, hi):
        b = bits[t]
        grouped[dest[t]] = b  # the bits move, not a float: no denormals-are-zero on the way
        negative_zeros += b == NEGATIVE_ZERO_BITS
    return negative_zeros


@njit(cache=True, parallel=True)
def _group_chunks(bits, dest, grouped, negative_zeros):  # pragma: no cover - compiled
    n = bits.shape[0]
    C = negative_zeros.shape[0]
    for c in prange(C):
        negative_zeros[c] = _group_range(bits, dest, grouped, n * c // C, n * (c + 1) // C)


@njit(cache=True, nogil=True)
def _partition_sum(grouped, local, lo, hi, sums, out, base, tiny):  # pragma: no cover - compiled
    # one partition's buckets: sums in position order into ``sums``, then cast into ``out``
    width = min(out.shape[0] - base, sums.shape[0])
    sums[:width] = 0.0
    values = grouped.view(np.float32)
    for j in range(lo, hi):
        k = local[j]
        sums[k] = checked_add_narrow(sums[k], as_double(values[j], grouped[j], 8, 23))
    inexact = 0
    for k in range(width):
        inexact += _store_sum(out, base + k, sums[k], tiny)
    return inexact


@njit(cache=True, parallel=True)
def _partition_sums(grouped, local, starts, sums, out, tiny, inexact):
    # pragma: no cover - compiled
    for p in prange(starts.shape[0] - 1):
        s = get_thread_id()  # this thread's own sums: no two threads share them
        inexact[p] = _partition_sum(grouped, local, starts[p], starts[p + 1], sums[s], out,
                                    p * sums.shape[1], tiny)  # fmt: skip


def partition_sums(index, values, dest, local, starts, grouped, sums, out) -> int:
    """:func:`float_sums` over the plan's partitions: the same sums, or NaN; how many NaN.

    ``dest``, ``local`` and ``starts`` are the plan's partition layout
    (:func:`bitfold.kernels.planning.partition_layout`). The values' bits are
    first moved to their places in ``grouped`` (N,) uint32 (each partition's
    values in position order); then each partition, handed to whichever thread
    is free, adds its values in that order, with checked additions, into its
    thread's row of ``sums`` (threads, buckets a partition) float64, cleared
    first, and casts them into ``out`` (K,): each bucket's exact sum rounded
    once to the output's dtype, NaN where a float64 sum was ever inexact or
    met a NaN or an infinity, or where the cast could meet flush-to-zero. A
    bucket's sums stay in a core's L2 cache (at 10^6 buckets, 512 KiB of
    them a partition against 8 MB a slot for :func:`float_sums`), and no
    slots are merged. Empty buckets are ``+0.0``, buckets of ``-0.0`` terms
    only ``-0.0``. An exact sum is unique: nothing depends on the threads.
    """
    from .cpu import DYNAMIC_CHUNKS, dynamic_schedule

    negative_zeros = np.zeros(DYNAMIC_CHUNKS, np.int64)
    bits = values.view(np.uint32)
    _group_chunks(bits, dest, grouped, negative_zeros)
    tiny = float(np.finfo(out.dtype).tiny)
    inexact = np.zeros(starts.shape[0] - 1, np.int64)
    with dynamic_schedule():
        _partition_sums(grouped, local, starts, sums, out, tiny, inexact)
    if negative_zeros.any():
        _negative_zero_buckets(index, bits, out)
    return int(inexact.sum())


@njit(cache=True, nogil=True)
def _sorted_range(values, bits, dec, order, sorted_buckets, t0, t1, out, tiny):
    # pragma: no cover - compiled
    acc = -0.0
    prev = -1
    wide = dec[1] > 23  # float64 values: the subnormal clause of checked_add is needed
    for t in range(t0, t1):
        if t + AHEAD < t1:
            prefetch_row(values, order[t + AHEAD])
        k = sorted_buckets[t]
        x = as_double(values[order[t], 0], bits[order[t], 0], dec[0], dec[1])
        start = -0.0 if k != prev else acc
        acc = checked_add(start, x) if wide else checked_add_narrow(start, x)
        out[k] = acc if castable(acc, tiny) else np.nan
        prev = k


@njit(cache=True, parallel=True)
def _sorted_ranges(values, bits, dec, order, sorted_buckets, starts, out, tiny):
    # pragma: no cover - compiled
    for c in prange(starts.shape[0] - 1):
        _sorted_range(values, bits, dec, order, sorted_buckets, starts[c], starts[c + 1], out,
                      tiny)  # fmt: skip


def sorted_sums(values, order, sorted_buckets, starts, out) -> None:
    """Each non-empty bucket's checked float64 sum of ``values`` (N, 1), stored into ``out``.

    ``sorted_buckets[t]`` is the bucket of sorted position ``t``; ``starts``
    cuts the sorted positions at bucket boundaries into ranges summed
    independently. ``out`` (K,) float32 or float64, filled by the caller with
    the result of an empty bucket, receives every non-empty bucket's exact
    sum, cast to its dtype (one rounding: the sum is exact), or NaN where the
    float64 sum was not exact or met a NaN or an infinity, or where the cast
    could meet flush-to-zero (a non-zero sum below ``out``'s smallest normal:
    :func:`bitfold.kernels.ieee.castable`); values are read DAZ-immune.
    """
    wide = values.dtype == np.float64
    bits = values.view(np.int64 if wide else np.uint32)
    dec = (11, 52) if wide else (8, 23)
    tiny = float(np.finfo(out.dtype).tiny)
    if starts.shape[0] > 2:
        from .cpu import start_thread_pool

        start_thread_pool()
        _sorted_ranges(values, bits, dec, order, sorted_buckets, starts, out, tiny)
    else:
        _sorted_range(values, bits, dec, order, sorted_buckets, starts[0], starts[-1], out, tiny)


def _half_table() -> np.ndarray:
    """Every float16 bit pattern's value in units of 2^-24, as int64 (0 for NaN and infinities)."""
    b = np.arange(1 << 16, dtype=np.int64)
    e = (b >> 10) & 0x1F
    m = b & 0x3FF
    magnitude = np.where(e == 0, m, (m | 0x400) << np.maximum(e - 1, 0))
    magnitude[e == 0x1F] = 0
    return np.where(b & 0x8000, -magnitude, magnitude)


#: float16 bits -> value in units of 2^-24 (a 512 KiB table: it stays in the cache).
HALF_UNITS = _half_table()


@njit(cache=True, nogil=True)
def _half_slot(index, bits, lo, hi, sums, table):  # pragma: no cover - compiled
    """Add values ``lo .. hi-1`` into ``sums``; True when a NaN or an infinity was among them."""
    special = 0
    ix, bt = index[lo:hi], bits[lo:hi]  # from 0: no negative-index checks in the loop
    for t in range(hi - lo):
        b = bt[t]
        special |= (b & 0x7C00) == 0x7C00  # no branch: counted in a second pass if ever
        sums[ix[t]] += table[b]
    return special != 0


@njit(cache=True, parallel=True)
def _half_slots(index, bits, sums, table):  # pragma: no cover - compiled
    n = index.shape[0]
    S = sums.shape[0]
    found = np.zeros(S, np.bool_)
    for s in prange(S):
        found[s] = _half_slot(index, bits, n * s // S, n * (s + 1) // S, sums[s], table)
    return found.any()


@njit(cache=True, nogil=True)
def _count_half_specials(index, bits, specials):  # pragma: no cover - compiled
    for i in range(index.shape[0]):
        b = bits[i]
        if (b & 0x7C00) == 0x7C00:
            k = index[i]
            if b & 0x3FF:
                specials[k, 0] += 1
            elif b & 0x8000:
                specials[k, 2] += 1
            else:
                specials[k, 1] += 1


def half_sums(index, bits, sums: np.ndarray, specials: np.ndarray) -> None:
    """Add float16 values (their uint16 ``bits``) into per-slot int64 ``sums`` (S, K).

    Units of 2^-24; ``specials`` (K, 3) int64 counts NaN, +inf and -inf.
    Both are zeroed by the caller; slot s takes the s-th of S equal ranges.
    """
    if sums.shape[0] == 1:
        found = _half_slot(index, bits, 0, index.shape[0], sums[0], HALF_UNITS)
    else:
        from .cpu import start_thread_pool

        start_thread_pool()
        found = _half_slots(index, bits, sums, HALF_UNITS)
    if found:
        _count_half_specials(index, bits, specials)


@njit(cache=True, nogil=True)
def _finish_half(sums, specials, bits, order, offsets, k0, k1, out_bits, target):
    # pragma: no cover - compiled
    _, precision, exp_bits, subnormal_exp, nan_bits, out_shift = target
    row = np.zeros(7, np.int64)  # two limbs and the five counters, for the special cases
    mag = np.empty(2, np.int64)
    for k in range(k0, k1):
        lo = offsets[k]
        hi = offsets[k + 1]
        s = np.int64(0)
        for slot in range(sums.shape[0]):
            s += sums[slot, k]
        n_nan, n_pos, n_neg = specials[k, 0], specials[k, 1], specials[k, 2]
        if n_nan or n_pos or n_neg:
            row[:] = 0
            row[2] = 1
            row[3] = 1
            row[4] = n_nan
            row[5] = n_pos
            row[6] = n_neg
            out_bits[k] = round_row(row, 2, 0, -24, precision, exp_bits, subnormal_exp, nan_bits,
                                    out_shift, mag)  # fmt: skip
        elif s != 0:
            neg = s < 0
            out_bits[k] = round_scaled(-s if neg else s, -24, neg, precision, exp_bits,
                                       subnormal_exp, out_shift)  # fmt: skip
        else:  # a zero sum: -0.0 only when the bucket has terms and every one is -0.0
            negzero = hi > lo
            for t in range(lo, hi):
                if bits[order[t]] != 0x8000:
                    negzero = False
                    break
            out_bits[k] = round_scaled(0, -24, negzero, precision, exp_bits, subnormal_exp,
                                       out_shift)  # fmt: skip


@njit(cache=True, parallel=True)
def _finish_half_parallel(sums, specials, bits, order, offsets, out_bits, target):
    # pragma: no cover - compiled
    K = out_bits.shape[0]
    for c in prange(64):
        _finish_half(sums, specials, bits, order, offsets, K * c // 64, K * (c + 1) // 64,
                     out_bits, target)  # fmt: skip


def finish_half(sums, specials, bits, order, offsets, out_bits, target) -> None:
    """Merge the slots of :func:`half_sums` and round each bucket once into ``out_bits`` (K,).

    ``target`` as in :func:`bitfold.kernels.buckets.fold_buckets`; zeros,
    NaN and infinities follow the contract of :mod:`bitfold.exact`.
    """
    if out_bits.shape[0] >= 1 << 14:
        from .cpu import start_thread_pool

        start_thread_pool()
        _finish_half_parallel(sums, specials, bits, order, offsets, out_bits, target)
    else:
        _finish_half(sums, specials, bits, order, offsets, 0, out_bits.shape[0], out_bits, target)


__all__ = ["finish_half", "float_sums", "half_sums", "partition_sums", "sorted_sums"]


one_compiler_at_a_time(globals())
