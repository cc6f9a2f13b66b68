"""Numba CPU kernels: plan building, the ordered fold and the exact limb accumulation.

Every kernel is compiled on first use and cached on disk (``cache=True``);
Numba falls back to a per-user cache directory when the package directory is
not writable, and ``NUMBA_CACHE_DIR`` overrides both.

Exact accumulation (see :mod:`bitfold.exactsum` for the state layout): a
value ``±M·2^(p + unit)`` with integer mantissa ``M`` and shift ``p >= 0``
adds ``±M << (p mod 32)`` into int64 limbs ``p // 32`` and up, split into
32-bit pieces, so every single addition to a limb is below ``2^33`` in
magnitude. For float32 values and a small K a faster route is taken first:
values are summed in float64 *bins* by exponent (8 exponents a bin), where
every addition is exact, and the bins are flushed into the limbs before they
could round.
"""

from __future__ import annotations

import math
import sys

import numpy as np
from numba import njit, prange

MASK32 = np.int64(0xFFFFFFFF)

# Side-counter columns of the per-slot ``specials`` arrays.
NOT_NEGZERO, NAN, POSINF, NEGINF = 0, 1, 2, 3
#: Number of float64 bins of the binned float32 kernel (8 exponents each).
N_BINS = 32
#: A bin holds at most this many values between flushes: each is below 2^31
#: units of its bin, so partial sums stay below 2^53 units and are exact.
BIN_FLUSH_EVERY = 1 << 22


@njit(cache=True, parallel=True)
def _touch_pool(out):  # pragma: no cover - compiled
    for i in prange(out.shape[0]):
        out[i] = i


_POOL_STARTED = False


def start_thread_pool() -> None:
    """Start Numba's thread pool once, without changing PyTorch's thread count.

    Numba's OpenMP layer shares the OpenMP runtime with PyTorch, and starting
    its pool resets the thread count that ``torch.set_num_threads`` chose.
    Every parallel kernel is called after this, so the user's setting stays.
    """
    global _POOL_STARTED
    if _POOL_STARTED:
        return
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    _touch_pool(np.empty(2, np.int64))
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    _POOL_STARTED = True


@njit(cache=True, nogil=True)
def count_and_check(index, K):  # pragma: no cover - compiled
    """Per-bucket counts of ``index``; also the first position whose value is outside [0, K).

    Returns ``(counts, bad_position)`` with ``bad_position == -1`` when all are valid.
    """
    counts = np.zeros(K, np.int64)
    n = index.shape[0]
    for i in range(n):
        k = np.int64(index[i])
        if k < 0 or k >= K:
            return counts, np.int64(i)
        counts[k] += 1
    return counts, np.int64(-1)


@njit(cache=True, nogil=True)
def counting_sort(index, offsets, order):  # pragma: no cover - compiled
    """Stable counting sort: ``order`` lists positions bucket by bucket, increasing within each."""
    K = offsets.shape[0] - 1
    cursor = offsets[:K].copy()
    for i in range(index.shape[0]):
        k = index[i]
        order[cursor[k]] = i
        cursor[k] += 1


@njit(cache=True, nogil=True)
def ordered_fold(index, values, out):  # pragma: no cover - compiled
    """``out[index[i]] += values[i]`` for i = 0, 1, ..., N-1, each addition rounded in out's dtype.

    Within one bucket this adds its values in increasing position, which is
    exactly the stable sorted-index order.
    """
    for i in range(index.shape[0]):
        out[index[i]] += values[i]


@njit(cache=True, parallel=True)
def _gather_parallel(v, index, out):  # pragma: no cover - compiled
    n = index.shape[0]
    chunks = 64
    for c in prange(chunks):
        lo = n * c // chunks
        hi = n * (c + 1) // chunks
        ix = index[lo:hi]
        o = out[lo:hi]
        for t in range(hi - lo):
            o[t] = v[ix[t]]


#: Below this many values (or buckets) kernels run on the calling thread: a
#: parallel launch costs more than it saves, and much more while another
#: OpenMP runtime (PyTorch's) keeps its worker threads spinning.
PARALLEL_MIN_VALUES = 1 << 18
PARALLEL_MIN_BUCKETS = 1 << 14


def gather(v: np.ndarray, index: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = v[index[i]]`` (the forward of a folded layer)."""
    if index.shape[0] >= PARALLEL_MIN_VALUES:
        start_thread_pool()
        _gather_parallel(v, index, out)
    else:
        np.take(v, index, out=out)


@njit(cache=True, nogil=True)
def normalise_rows(limbs):  # pragma: no cover - compiled
    """Carry-normalise every row of a (rows, L) limb array in place.

    Afterwards limbs ``0 .. L-2`` of each row lie in ``[0, 2^32)``; the top
    limb is signed and holds the rest. The represented integers do not change.
    """
    rows, L = limbs.shape
    for r in range(rows):
        for j in range(L - 1):
            c = limbs[r, j] >> 32
            limbs[r, j] -= c << 32
            limbs[r, j + 1] += c


@njit(cache=True, nogil=True)
def _add_f32_range(index, bits, lo, hi, acc, sp):  # pragma: no cover - compiled
    ix, bt = index[lo:hi], bits[lo:hi]
    for t in range(hi - lo):
        b = np.int64(bt[t])
        k = ix[t]
        e = (b >> 23) & 0xFF
        m = b & 0x7FFFFF
        neg = b >> 31
        if e == 0xFF:
            if m != 0:
                sp[k, NAN] += 1
            elif neg:
                sp[k, NEGINF] += 1
            else:
                sp[k, POSINF] += 1
            continue
        if e == 0:
            if m == 0:
                sp[k, NOT_NEGZERO] -= neg  # the caller adds the term counts
                continue
            p = np.int64(0)
        else:
            m |= 0x800000
            p = e - 1
        shifted = m << (p & 31)
        j = p >> 5
        sign = 1 - 2 * neg
        acc[k, j] += sign * (shifted & MASK32)
        acc[k, j + 1] += sign * (shifted >> 32)


@njit(cache=True, nogil=True)
def _add_f64_range(index, bits, lo, hi, acc, sp):  # pragma: no cover - compiled
    ix, bt = index[lo:hi], bits[lo:hi]
    for t in range(hi - lo):
        b = bt[t]
        k = ix[t]
        e = (b >> 52) & 0x7FF
        m = b & 0xFFFFFFFFFFFFF
        neg = np.int64(b < 0)
        if e == 0x7FF:
            if m != 0:
                sp[k, NAN] += 1
            elif neg:
                sp[k, NEGINF] += 1
            else:
                sp[k, POSINF] += 1
            continue
        if e == 0:
            if m == 0:
                sp[k, NOT_NEGZERO] -= neg  # the caller adds the term counts
                continue
            p = np.int64(0)
        else:
            m |= 0x10000000000000
            p = e - 1
        s = p & 31
        j = p >> 5
        low = (m & MASK32) << s  # < 2^63
        high = (m >> 32) << s  # < 2^52
        sign = 1 - 2 * neg
        acc[k, j] += sign * (low & MASK32)
        acc[k, j + 1] += sign * ((low >> 32) + (high & MASK32))
        acc[k, j + 2] += sign * (high >> 32)


@njit(cache=True, nogil=True)
def _limbs_slot(index, bits, wide, lo, hi, acc, sp, carry_every):  # pragma: no cover - compiled
    start = lo
    while start < hi:
        stop = min(hi, start + carry_every)
        if wide:
            _add_f64_range(index, bits, start, stop, acc, sp)
        else:
            _add_f32_range(index, bits, start, stop, acc, sp)
        normalise_rows(acc)
        start = stop


@njit(cache=True, parallel=True)
def _limbs_parallel(index, bits, wide, limbs, specials, carry_every):  # pragma: no cover
    n = bits.shape[0]
    S = limbs.shape[0]
    for s in prange(S):
        _limbs_slot(
            index, bits, wide, n * s // S, n * (s + 1) // S, limbs[s], specials[s], carry_every
        )


def exact_accumulate(index, bits, wide, limbs, specials, carry_every) -> None:
    """Add every value into private per-slot limbs; slot s takes the s-th of S equal ranges.

    ``limbs`` is (S, K, L) int64 and ``specials`` (S, K, 4) int64, both zeroed
    by the caller. ``wide`` selects the float64 layout (``bits`` int64) over
    the float32 one (``bits`` uint32). The number of slots S is chosen by the
    caller from the problem size, never from the thread count; since integer
    addition is associative the result would not depend on it anyway.
    Limbs are carry-normalised after every ``carry_every`` values of a slot,
    so no limb can overflow whatever the bucket sizes.
    """
    if limbs.shape[0] == 1:
        _limbs_slot(index, bits, wide, 0, bits.shape[0], limbs[0], specials[0], carry_every)
    else:
        start_thread_pool()
        _limbs_parallel(index, bits, wide, limbs, specials, carry_every)


@njit(cache=True, nogil=True)
def _add_shifted(acc, k, magnitude, negative, shift):  # pragma: no cover - compiled
    """Add ``±magnitude · 2^shift`` (magnitude < 2^53) into row k of the limbs."""
    s = shift & 31
    j = shift >> 5
    low = (magnitude & MASK32) << s
    high = (magnitude >> 32) << s
    sign = 1 - 2 * negative
    acc[k, j] += sign * (low & MASK32)
    acc[k, j + 1] += sign * ((low >> 32) + (high & MASK32))
    acc[k, j + 2] += sign * (high >> 32)


@njit(cache=True, nogil=True)
def _flush_bins(bins, acc, sp):  # pragma: no cover - compiled
    """Move every float64 bin into the integer limbs and reset it to -0.0.

    Bin b holds an exact multiple of 2^(8b - 150) (2^-149 for b = 0), below
    2^53 such units. A bin still at -0.0 received nothing but -0.0 terms.
    Bin 31 also receives infinities and NaNs, whose float64 sum is exactly
    the IEEE special the contract asks for.
    """
    B, K = bins.shape
    for b in range(B):
        unit = 8 * b - 150 if b > 0 else -149
        for k in range(K):
            f = bins[b, k]
            if f == 0.0 and math.copysign(1.0, f) < 0.0:
                continue
            bins[b, k] = -0.0
            sp[k, NOT_NEGZERO] += 1
            if f != f:
                sp[k, NAN] += 1
            elif f == np.inf:
                sp[k, POSINF] += 1
            elif f == -np.inf:
                sp[k, NEGINF] += 1
            elif f != 0.0:
                negative = np.int64(f < 0.0)
                magnitude = np.int64(math.ldexp(abs(f), -unit))
                _add_shifted(acc, k, magnitude, negative, unit + 149)


@njit(cache=True, nogil=True)
def _bin_range(index, values, bits, lo, hi, bins):  # pragma: no cover - compiled
    K = bins.shape[1]
    flat = bins.reshape(-1)
    # slicing first lets the loop start at 0, so Numba drops negative-index checks
    ix, bt, vs = index[lo:hi], bits[lo:hi], values[lo:hi]
    for t in range(hi - lo):
        b = (np.int64(bt[t]) >> 26) & 0x1F  # the biased exponent // 8
        flat[b * K + ix[t]] += np.float64(vs[t])


@njit(cache=True, nogil=True)
def _binned_slot(index, values, lo, hi, bins, acc, sp, flush_every):  # pragma: no cover
    bits = values.view(np.uint32)
    start = lo
    while start < hi:
        stop = min(hi, start + flush_every)
        _bin_range(index, values, bits, start, stop, bins)
        _flush_bins(bins, acc, sp)
        normalise_rows(acc)
        start = stop


@njit(cache=True, parallel=True)
def _binned_parallel(index, values, bins, limbs, specials, flush_every):  # pragma: no cover
    n = values.shape[0]
    S = bins.shape[0]
    for s in prange(S):
        _binned_slot(
            index, values, n * s // S, n * (s + 1) // S, bins[s], limbs[s], specials[s], flush_every
        )


def exact_binned_accumulate(index, values, bins, limbs, specials, flush_every) -> None:
    """float32 values, small K: exact float64 bins per slot, flushed into per-slot limbs.

    ``bins`` is (S, 32, K) float64 filled with -0.0, ``limbs`` (S, K, L) and
    ``specials`` (S, K, 4) int64 zeroed, all by the caller. Slot s takes the
    s-th of S equal ranges of the values. ``flush_every`` must not exceed
    :data:`BIN_FLUSH_EVERY`.
    """
    if bins.shape[0] == 1:
        _binned_slot(index, values, 0, values.shape[0], bins[0], limbs[0], specials[0], flush_every)
    else:
        start_thread_pool()
        _binned_parallel(index, values, bins, limbs, specials, flush_every)


@njit(cache=True, nogil=True)
def _merge_bucket(limbs, specials, state, L, k):  # pragma: no cover - compiled
    S = limbs.shape[0]
    for s in range(S):
        for j in range(L):
            state[k, j] += limbs[s, k, j]
        for c in range(4):
            state[k, L + 1 + c] += specials[s, k, c]
    for j in range(L - 1):
        c = state[k, j] >> 32
        state[k, j] -= c << 32
        state[k, j + 1] += c


@njit(cache=True, nogil=True)
def _merge_serial(limbs, specials, state, L):  # pragma: no cover - compiled
    for k in range(state.shape[0]):
        _merge_bucket(limbs, specials, state, L, k)


@njit(cache=True, parallel=True)
def _merge_parallel(limbs, specials, state, L):  # pragma: no cover - compiled
    for k in prange(state.shape[0]):
        _merge_bucket(limbs, specials, state, L, k)


def merge_slots(limbs, specials, state, L) -> None:
    """Add the per-slot limbs and side counters into ``state`` (K, L + 5) and normalise it."""
    if state.shape[0] >= PARALLEL_MIN_BUCKETS:
        start_thread_pool()
        _merge_parallel(limbs, specials, state, L)
    else:
        _merge_serial(limbs, specials, state, L)


@njit(cache=True, nogil=True)
def _bit_length(x):  # pragma: no cover - compiled
    n = 0
    while x > 0:
        x >>= 1
        n += 1
    return n


@njit(cache=True, nogil=True)
def _finalise_bucket(state, L, unit_exp, precision, q_min, out, k, mag):  # pragma: no cover
    n_terms = state[k, L]
    n_not_negzero = state[k, L + 1]
    n_nan = state[k, L + 2]
    n_pos = state[k, L + 3]
    n_neg = state[k, L + 4]
    if n_nan > 0 or (n_pos > 0 and n_neg > 0):
        out[k] = np.nan
        return
    if n_pos > 0:
        out[k] = np.inf
        return
    if n_neg > 0:
        out[k] = -np.inf
        return
    for j in range(L):
        mag[j] = state[k, j]
    for j in range(L - 1):
        c = mag[j] >> 32
        mag[j] -= c << 32
        mag[j + 1] += c
    negative = mag[L - 1] < 0
    if negative:
        for j in range(L):
            mag[j] = -mag[j]
        for j in range(L - 1):
            c = mag[j] >> 32
            mag[j] -= c << 32
            mag[j + 1] += c
    top = -1
    for j in range(L - 1, -1, -1):
        if mag[j] != 0:
            top = j
            break
    if top < 0:
        if n_terms > 0 and n_not_negzero == 0:
            out[k] = -0.0
        else:
            out[k] = 0.0
        return
    bitlen = 32 * top + _bit_length(mag[top])
    q = max(bitlen - precision, q_min)
    m = np.int64(0)
    for j in range(top + 1):
        sh = 32 * j - q
        if sh >= 0:
            m += mag[j] << sh
        elif sh > -64:
            m += mag[j] >> (-sh)
    if q > 0:
        t = q - 1  # the half bit
        jt = min(t >> 5, L - 1)
        bt = t - 32 * jt
        half = (mag[jt] >> bt) & 1
        sticky = (mag[jt] & ((np.int64(1) << bt) - 1)) != 0
        for j in range(jt):
            if mag[j] != 0:
                sticky = True
        if half == 1 and (sticky or (m & 1) == 1):
            m += 1
    value = math.ldexp(np.float64(m), q + unit_exp)
    out[k] = -value if negative else value


@njit(cache=True, nogil=True)
def _finalise_serial(state, L, unit_exp, precision, q_min, out):  # pragma: no cover
    mag = np.empty(L, np.int64)
    for k in range(state.shape[0]):
        _finalise_bucket(state, L, unit_exp, precision, q_min, out, k, mag)


@njit(cache=True, parallel=True)
def _finalise_parallel(state, L, unit_exp, precision, q_min, out):  # pragma: no cover
    K = state.shape[0]
    chunks = 64
    scratch = np.empty((chunks, L), np.int64)
    for c in prange(chunks):
        for k in range(K * c // chunks, K * (c + 1) // chunks):
            _finalise_bucket(state, L, unit_exp, precision, q_min, out, k, scratch[c])


def finalise(state, L, unit_exp, precision, q_min, out) -> None:
    """Round each bucket's exact sum once, to ``precision`` significant bits.

    ``state`` rows hold L limbs (value = sum limb_j * 2^(32 j + unit_exp)),
    then n_terms, n_not_negzero, n_nan, n_posinf, n_neginf. The result, written
    to the float64 array ``out``, is exactly representable in the target
    format (precision bits, smallest subnormal ``2^(q_min + unit_exp)``) or
    beyond its range, in which case the caller's cast turns it into ±inf.
    Specials: NaN if any NaN or both infinities, else the infinity present.
    A zero sum is -0.0 only when the bucket is non-empty and all its terms
    are -0.0; a non-zero sum that rounds to zero keeps its sign.
    """
    if state.shape[0] >= PARALLEL_MIN_BUCKETS:
        start_thread_pool()
        _finalise_parallel(state, L, unit_exp, precision, q_min, out)
    else:
        _finalise_serial(state, L, unit_exp, precision, q_min, out)
