"""Numba CPU kernels: the ordered fold, the gather and the exact limb accumulation.

Every kernel is compiled on first use and cached on disk (``cache=True``);
Numba falls back to a per-user cache directory when the package directory is
not writable, and ``NUMBA_CACHE_DIR`` overrides both.

Exact accumulation (see :class:`bitfold.formats.LimbFormat` for the state layout): a
value ``±M·2^(p + unit)`` with integer mantissa ``M`` and shift ``p >= 0``
adds ``±M << (p mod 32)`` into int64 limbs ``p // 32`` and up, split into
32-bit pieces, so every single addition to a limb is below ``2^33`` in
magnitude. For float32 values and a small K a faster route is taken first:
values are summed in float64 *bins* by exponent (8 exponents a bin), where
every addition is exact, and the bins are flushed into the limbs before they
could round.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator

import numpy as np
from numba import get_thread_id, njit, prange

from ..formats import decoding
from .compile_lock import one_compiler_at_a_time
from .compiling import quietly
from .ieee import (
    FINITE,
    NEGZERO,
    POSZERO,
    add_bits,
    as_double,
    decode,
    normalise,
    round_row,
    split_narrow,
    split_wide,
)

_decoding = decoding


# (exp_bits, frac_bits, shift) of each value format, compile-time constants of the limb kernel
_F32, _F16, _BF16, _F64 = (_decoding(n) for n in ("float32", "float16", "bfloat16", "float64"))
#: value format -> the code the limb kernel takes (the bits array's dtype differs too)
SOURCE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}

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

    Numba ignores ``OMP_NUM_THREADS``, which launchers such as ``torchrun`` set
    to share a machine's cores between processes; without ``NUMBA_NUM_THREADS``
    the kernels take that many threads too (every result is the same bits on any
    thread count). Two processes on 2 cores each running 2 threads made a
    3,000-element gradient sum 40-100x slower than one thread each.
    """
    global _POOL_STARTED
    if _POOL_STARTED:
        return
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    with quietly():  # a kernel of one loop: its compilation is not worth a line
        _touch_pool(np.empty(2, np.int64))
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    shared = os.environ.get("OMP_NUM_THREADS", "")
    if "NUMBA_NUM_THREADS" not in os.environ and shared.isdigit() and int(shared) > 0:
        import numba

        numba.set_num_threads(min(int(shared), numba.config.NUMBA_NUM_THREADS))
    _POOL_STARTED = True


@contextlib.contextmanager
def dynamic_schedule() -> Iterator[None]:
    """Parallel loops started inside hand out one iteration at a time, to whichever thread is free.

    Numba's default splits a loop's iterations evenly among the threads up front,
    so a core slowed by another process stalls the whole loop. Loops run this way
    have a fixed number of iterations (never the thread count) whose results do
    not depend on which thread ran them.
    """
    import numba

    start_thread_pool()
    previous = numba.set_parallel_chunksize(1)
    try:
        yield
    finally:
        numba.set_parallel_chunksize(previous)


def thread_count() -> int:
    """Numba's thread count (its pool started first, keeping PyTorch's thread count)."""
    import numba

    start_thread_pool()
    return int(numba.get_num_threads())


@njit(cache=True, nogil=True)
def ordered_fold(index, values, out):  # pragma: no cover - compiled
    """``out[index[i]] += values[i]`` for i = 0, 1, ..., N-1, each addition rounded in out's dtype.

    Within one bucket this adds its values in increasing position, which is
    exactly the stable sorted-index order.
    """
    for i in range(index.shape[0]):
        out[index[i]] += values[i]


@njit(cache=True, nogil=True)
def ordered_fold_rows(index, rows, out):  # pragma: no cover - compiled
    """``out[index[i], d] += rows[i, d]`` for i = 0, 1, ..., N-1 (and every d), in out's dtype.

    Each element of a bucket adds its values in increasing position, the
    stable sorted-index order, one rounding per addition.
    """
    D = rows.shape[1]
    for i in range(index.shape[0]):
        k = index[i]
        for d in range(D):
            out[k, d] += rows[i, d]


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
    """Carry-normalise every row of a (rows, L) limb array in place (:func:`ieee.normalise`)."""
    rows, L = limbs.shape
    for r in range(rows):
        normalise(limbs[r], L)


@njit(cache=True, nogil=True, inline="always")
def _add_range(index, bits, lo, hi, acc, sp, exp_bits, frac_bits, shift, wide):  # pragma: no cover
    """Add values ``lo .. hi-1`` (their bit patterns) into the limbs ``acc`` and counters ``sp``."""
    ix, bt = index[lo:hi], bits[lo:hi]
    for t in range(hi - lo):
        k = ix[t]
        cls, neg, m, p = decode(bt[t], exp_bits, frac_bits, shift)
        if cls == FINITE:
            sign = 1 - 2 * neg
            if wide:
                j, a0, a1, a2 = split_wide(m, p)
                acc[k, j + 2] += sign * a2
            else:
                j, a0, a1, a2 = split_narrow(m, p)
            acc[k, j] += sign * a0
            acc[k, j + 1] += sign * a1
        elif cls == NEGZERO:
            sp[k, NOT_NEGZERO] -= 1  # the caller adds the term counts
        elif cls != POSZERO:
            sp[k, cls - 1] += 1  # NAN, POSINF, NEGINF -> their side-counter columns


@njit(cache=True, nogil=True)
def _limbs_slot(index, bits, lo, hi, acc, sp, source, carry_every):  # pragma: no cover
    start = lo
    while start < hi:
        stop = min(hi, start + carry_every)
        # one call a format, so that its constants are folded into the inlined loop
        if source == 0:
            _add_range(index, bits, start, stop, acc, sp, _F32[0], _F32[1], _F32[2], False)
        elif source == 1:
            _add_range(index, bits, start, stop, acc, sp, _F16[0], _F16[1], _F16[2], False)
        elif source == 2:
            _add_range(index, bits, start, stop, acc, sp, _BF16[0], _BF16[1], _BF16[2], False)
        else:
            _add_range(index, bits, start, stop, acc, sp, _F64[0], _F64[1], _F64[2], True)
        normalise_rows(acc)
        start = stop


@njit(cache=True, parallel=True)
def _limbs_parallel(index, bits, limbs, specials, source, carry_every):  # pragma: no cover
    n = bits.shape[0]
    S = limbs.shape[0]
    for s in prange(S):
        _limbs_slot(
            index, bits, n * s // S, n * (s + 1) // S, limbs[s], specials[s], source, carry_every
        )


def exact_accumulate(index, bits, source, limbs, specials, carry_every) -> None:
    """Add every value into private per-slot limbs; slot s takes the s-th of S equal ranges.

    ``bits`` are the values' bit patterns (uint16, uint32, or int64 for
    float64) and ``source`` the :data:`SOURCE_CODES` entry of their format.
    ``limbs`` is (S, K, L) int64 and ``specials``
    (S, K, 4) int64, both zeroed by the caller. The number of slots S is
    chosen by the caller from the problem size, never from the thread count;
    since integer addition is associative the result would not depend on it
    anyway. Limbs are carry-normalised after every ``carry_every`` values of
    a slot, so no limb can overflow whatever the bucket sizes.
    """
    if limbs.shape[0] == 1:
        _limbs_slot(index, bits, 0, bits.shape[0], limbs[0], specials[0], source, carry_every)
    else:
        start_thread_pool()
        _limbs_parallel(index, bits, limbs, specials, source, carry_every)


@njit(cache=True, nogil=True)
def _rows_into_state(index, bits, state, D, d0, d1, wide):  # pragma: no cover - compiled
    L = state.shape[1] - 5
    for i in range(index.shape[0]):
        base = np.int64(index[i]) * D
        for d in range(d0, d1):
            if wide:
                add_bits(state[base + d], L, bits[i, d], _F64[0], _F64[1], _F64[2], True)
            else:
                add_bits(state[base + d], L, bits[i, d], _F32[0], _F32[1], _F32[2], False)


@njit(cache=True, parallel=True)
def _rows_into_state_parallel(index, bits, state, D, blocks, wide):  # pragma: no cover
    for b in prange(blocks):
        _rows_into_state(index, bits, state, D, D * b // blocks, D * (b + 1) // blocks, wide)


def accumulate_rows(index, bits, state, carry_every) -> None:
    """Add rows exactly into a state of rows: ``state[index[i] * D + d] += value[i, d]``.

    ``bits`` is the (n, D) bit view of float32 (uint32) or float64 (int64)
    rows; ``state`` is (K * D, L + 5) int64, limbs and the five counters of
    each output element (:func:`bitfold.kernels.ieee.add_bits`). Columns are
    split between threads (each element belongs to one), and the limbs are
    normalised after every ``carry_every`` positions.
    """
    n, D = bits.shape
    wide = bits.dtype == np.int64
    blocks = min(D, 16) if n * D >= PARALLEL_MIN_VALUES else 1
    if blocks > 1:
        start_thread_pool()
    L = state.shape[1] - 5
    for lo in range(0, n, carry_every):
        hi = min(n, lo + carry_every)
        if blocks > 1:
            _rows_into_state_parallel(index[lo:hi], bits[lo:hi], state, D, blocks, wide)
        else:
            _rows_into_state(index[lo:hi], bits[lo:hi], state, D, 0, D, wide)
        normalise_rows(state[:, :L])


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
                sign = 1 - 2 * np.int64(f < 0.0)
                j, a0, a1, a2 = split_wide(np.int64(math.ldexp(abs(f), -unit)), unit + 149)
                acc[k, j] += sign * a0
                acc[k, j + 1] += sign * a1
                acc[k, j + 2] += sign * a2


@njit(cache=True, nogil=True)
def _bin_range(index, values, bits, lo, hi, bins):  # pragma: no cover - compiled
    K = bins.shape[1]
    flat = bins.reshape(-1)
    # slicing first lets the loop start at 0, so Numba drops negative-index checks
    ix, bt, vs = index[lo:hi], bits[lo:hi], values[lo:hi]
    width = np.uint64(K)
    for t in range(hi - lo):
        b = (np.uint64(bt[t]) >> np.uint64(26)) & np.uint64(0x1F)  # the biased exponent // 8
        flat[b * width + np.uint64(ix[t])] += as_double(vs[t], bt[t], 8, 23)  # DAZ-immune


#: bfloat16 values are widened to float32 (exactly) in blocks of this many, in the cache.
BF16_BLOCK = 4096


@njit(cache=True, nogil=True)
def _bin_range_bf16(index, bits16, lo, hi, bins, wide_bits):  # pragma: no cover - compiled
    """:func:`_bin_range` for bfloat16 bit patterns, widened to float32 in ``wide_bits`` blocks."""
    wide = wide_bits.view(np.float32)
    for b0 in range(lo, hi, BF16_BLOCK):
        b1 = min(hi, b0 + BF16_BLOCK)
        src = bits16[b0:b1]
        for j in range(b1 - b0):
            wide_bits[j] = np.uint32(src[j]) << 16  # the float32 of the same value
        _bin_range(index[b0:b1], wide, wide_bits, 0, b1 - b0, bins)


@njit(cache=True, nogil=True)
def _binned_slot(index, values, lo, hi, bins, acc, sp, flush_every, bf16):  # pragma: no cover
    """Positions ``lo .. hi-1`` into one slot's ``bins``, flushed into its limbs ``acc`` and
    specials ``sp`` every ``flush_every``; ``values`` float32, or (``bf16``) bfloat16 values
    given as their uint16 bit patterns."""
    bits = np.empty(0, np.uint32) if bf16 else values.view(np.uint32)
    wide_bits = np.empty(BF16_BLOCK if bf16 else 0, np.uint32)
    start = lo
    while start < hi:
        stop = min(hi, start + flush_every)
        if bf16:
            _bin_range_bf16(index, values, start, stop, bins, wide_bits)
        else:
            _bin_range(index, values, bits, start, stop, bins)
        _flush_bins(bins, acc, sp)
        normalise_rows(acc)
        start = stop


@njit(cache=True, parallel=True)
def _binned_parallel(index, values, bins, limbs, specials, flush_every, bf16):  # pragma: no cover
    n = values.shape[0]
    S = bins.shape[0]
    for s in prange(S):
        lo, hi = n * s // S, n * (s + 1) // S
        _binned_slot(index, values, lo, hi, bins[s], limbs[s], specials[s], flush_every, bf16)


#: Position chunks of the dynamically scheduled binned kernel (fixed: never the thread count).
DYNAMIC_CHUNKS = 64


@njit(cache=True, parallel=True)
def _binned_dynamic(index, values, bins, limbs, specials, flush_every, bf16, chunks, pending):
    # pragma: no cover - compiled
    n = values.shape[0]
    bits = np.empty(0, np.uint32) if bf16 else values.view(np.uint32)
    for c in prange(chunks):
        s = get_thread_id()  # this thread's own slot: no two threads share one
        lo, hi = n * c // chunks, n * (c + 1) // chunks
        if pending[s] + (hi - lo) > flush_every:  # a bin never holds more than flush_every
            _flush_bins(bins[s], limbs[s], specials[s])
            normalise_rows(limbs[s])
            pending[s] = 0
        if bf16:
            _bin_range_bf16(index, values, lo, hi, bins[s], np.empty(BF16_BLOCK, np.uint32))
        else:
            _bin_range(index, values, bits, lo, hi, bins[s])
        pending[s] += hi - lo


@njit(cache=True, nogil=True)
def _flush_slots(bins, limbs, specials):  # pragma: no cover - compiled
    for s in range(bins.shape[0]):
        _flush_bins(bins[s], limbs[s], specials[s])
        normalise_rows(limbs[s])


def exact_binned_accumulate(index, values, bins, limbs, specials, flush_every) -> None:
    """float32 (or bfloat16) values, small K: exact float64 bins per slot, flushed into limbs.

    ``values`` are float32, or the uint16 bit patterns of bfloat16 values.
    ``bins`` is (S, 32, K) float64 filled with -0.0, ``limbs`` (S, K, L) and
    ``specials`` (S, K, 4) int64 zeroed, all by the caller. ``flush_every``
    must not exceed :data:`BIN_FLUSH_EVERY`.

    When there is a slot for every thread, the values are cut into
    :data:`DYNAMIC_CHUNKS` equal ranges (more when a range would exceed
    ``flush_every``) handed to the threads as they become free, each adding
    into its own slot: a core slowed by another process takes fewer chunks
    instead of stalling the fold. Otherwise slot s takes the s-th of S equal
    ranges. Every bin and limb addition is exact, so the merged state (and
    every result bit) is the same for any split of the work.
    """
    bf16 = values.dtype == np.uint16
    S = bins.shape[0]
    if S == 1:
        _binned_slot(index, values, 0, values.shape[0], bins[0], limbs[0], specials[0],
                     flush_every, bf16)  # fmt: skip
        return
    start_thread_pool()
    import numba

    if S >= numba.get_num_threads():
        n = values.shape[0]
        chunks = max(DYNAMIC_CHUNKS, -(-n // flush_every))
        with dynamic_schedule():
            _binned_dynamic(index, values, bins, limbs, specials, flush_every, bf16, chunks,
                            np.zeros(S, np.int64))  # fmt: skip
        _flush_slots(bins, limbs, specials)
    else:
        _binned_parallel(index, values, bins, limbs, specials, flush_every, bf16)


@njit(cache=True, nogil=True)
def _merge_bucket(limbs, specials, state, L, k):  # pragma: no cover - compiled
    S = limbs.shape[0]
    for s in range(S):
        for j in range(L):
            state[k, j] += limbs[s, k, j]
        for c in range(4):
            state[k, L + 1 + c] += specials[s, k, c]
    normalise(state[k], L)


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
def _round_serial(state, L, target, out_bits):  # pragma: no cover - compiled
    unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift = target
    mag = np.empty(L, np.int64)
    for k in range(state.shape[0]):
        out_bits[k] = round_row(
            state[k], L, 0, unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift, mag
        )


@njit(cache=True, parallel=True)
def _round_parallel(state, L, target, out_bits):  # pragma: no cover - compiled
    unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift = target
    K = state.shape[0]
    chunks = 64
    scratch = np.empty((chunks, L), np.int64)
    for c in prange(chunks):
        for k in range(K * c // chunks, K * (c + 1) // chunks):
            out_bits[k] = round_row(
                state[k], L, 0, unit_exp, precision, exp_bits, subnormal_exp, nan_bits,
                out_shift, scratch[c],
            )


def round_states(state, L, target, out_bits) -> None:
    """Round each bucket's exact sum once (:func:`bitfold.kernels.ieee.round_row`).

    ``state`` is (K, L + 5) int64; ``target = (unit_exp, precision, exp_bits,
    subnormal_exp, nan_bits, out_shift)``; ``out_bits`` is the signed integer
    array of the output's width that the caller views as the float dtype.
    """
    if state.shape[0] >= PARALLEL_MIN_BUCKETS:
        start_thread_pool()
        _round_parallel(state, L, target, out_bits)
    else:
        _round_serial(state, L, target, out_bits)


one_compiler_at_a_time(globals())
