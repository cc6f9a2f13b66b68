"""numba-cuda kernels for the three strategies; imported only when a GPU fold is asked for.

Kernels know nothing about plans or frameworks: they take numba device
arrays (real ones, or the simulator's under ``NUMBA_ENABLE_CUDASIM=1``) and a
stream. :mod:`bitfold.backends.cuda` wraps foreign arrays and chooses launch shapes.
Decoding, limb splitting, carry normalisation and rounding are the CPU's own
functions (:mod:`bitfold.kernels.ieee`), compiled for the device. A thread's
place in the grid is ``cuda.grid(1)`` and the grid's size ``cuda.gridsize(1)``,
both int64 in numba-cuda: a grid of ``2^31`` threads or more does not wrap.

Numeric contracts
-----------------
``atomic``
    ``out[index[i]] += value[i]`` with hardware float atomics in whatever
    order the scheduler picks: no guarantee, the baseline. A float16 output is
    accumulated in float32 and rounded once. On sm_90 the float32 atomic is
    ``ATOMG.E.ADD.F32.FTZ.RN``: it *flushes subnormal* operands and results to
    zero, which the CPU does not (float64 atomics do not flush). It is the one
    flush of a value in any bitfold kernel (``tests/test_cuda_compile.py``
    reads the sm_90 machine code to keep it so).
``ordered``
    The values are first gathered into the plan's stable sorted order by a
    parallel kernel (coalesced writes, ``sorted[t] = values[order[t]]``); then
    one thread per output element (bucket k, column d) walks its bucket's
    contiguous run ``sorted[offsets[k]:offsets[k+1], d]`` (increasing
    position) and computes ``acc = +0.0; acc = out_t(acc + out_t(v))`` in the
    output dtype, each addition rounded to nearest-even (no FMA can form:
    there is no multiply; numba-cuda compiles without ``fastmath``, so
    subnormals are kept). That is exactly the CPU ``ordered`` order, so finite
    and infinite results have the same bits as on the CPU. A NaN result is
    written as the canonical NaN of :data:`bitfold.CANONICAL_NAN_BITS`
    (hardware NaN payloads differ between CPU and GPU; only the canonical
    pattern is reproducible).
``exact``
    The state layout of :class:`bitfold.formats.LimbFormat`: ``(K, L + 5)`` int64, L limbs
    of 32 bits (limb j weighs ``2^(32 j + unit)``) then ``n_terms``,
    ``n_not_negzero``, ``n_nan``, ``n_posinf``, ``n_neginf``. A finite non-zero
    value ``±M·2^(p + unit)`` adds ``±(M << (p mod 32))`` split into 32-bit
    pieces to limbs ``p // 32`` and up, like the CPU ``limbs`` kernel; -0.0
    adds -1 to ``n_not_negzero`` (the per-bucket term counts are added at the
    end, to ``n_terms`` and ``n_not_negzero``); NaN/±inf count in their
    columns. Integer addition is associative, so the state after
    :func:`launch_settle` equals the CPU state bit for bit, whatever the thread
    schedule; :func:`launch_round` runs the CPU's rounding
    (:func:`bitfold.kernels.ieee.round_row`, integer arithmetic only) and
    writes the IEEE bits directly, so the result equals the CPU result bit
    for bit. Three kernels fill the state:

    * ``exact_shared`` (K limbs fit in a block's shared memory): each thread
      keeps a *run* in registers — the pieces of consecutive values it reads
      that fall on the same bucket and limb are summed there (K = 1 and
      skewed maps merge nearly everything) — and adds a run to the block's
      shared limbs when the bucket or limb changes. A shared 64-bit limb is
      two 32-bit words added with native 32-bit atomics and an explicit
      carry (:func:`_shared_add64`): sm_90 has no native 64-bit shared-memory
      atomic add (``atom.shared.add.u64`` assembles to a compare-and-swap
      loop). Special values count in 32-bit shared counters. A block then
      adds its non-zero limbs and counters to the global state with native
      64-bit global atomics.
    * ``exact_global``: 64-bit global atomics per piece (accumulating states
      of many buckets, and a forced ``"global"`` path).
    * ``exact_buckets``: one thread per output element sums its bucket in
      registers (:func:`bitfold.kernels.ieee.segment_bits`, the CPU's exact
      segment sum) and rounds in the same kernel: no state, no atomics; rows,
      folds into an existing array and K too large for shared memory.
    * ``hot_segments`` and ``hot_round``: a bucket with more positions than a
      segment (:func:`segment_length`) is skipped by ``exact_buckets`` and
      split into interleaved segments; a thread sums a segment's column
      exactly into a private row of limbs and adds it to the hot state with
      64-bit integer atomics (order-free), then one thread an element adds
      ``init`` and rounds once with the CPU's rounding. Same bits as one thread
      walking the bucket, with the work spread over the device.

    bfloat16 values are decoded from their 16-bit patterns in the kernels
    (no widened copy).

Carry bound (exact)
-------------------
Every single contribution to a limb is below ``2^32`` in magnitude (below
``2^33`` for float64 values), and each value touches a given limb at most
once. A launch adds at most ``fmt.carry_every`` values (``2^30`` for float32,
float16 and bfloat16 values, ``2^29`` for float64), starting from a normalised
state (limbs ``0 .. L-2`` in ``[0, 2^32)``). A thread's run, a block's shared
limbs (taken modulo ``2^64``, then exactly, since their true value is below
``2^62``) and every partial sum in the global state therefore stay below
``2^62`` in magnitude: the sum of the raw limbs of all blocks is bounded by
the same count of contributions. Shared special counters (32 bits) count at
most the values of one launch (``< 2^31``). The caller normalises the global
state (:func:`launch_settle`) after every launch, so any N is served in
launches of at most ``carry_every`` values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int64, uint32, uint64
from numba.core.types import float16

from ..formats import (
    F32,
    F64,
    FLOATS,
    LimbFormat,
    decoding,
    held_shift,
    limb_format_for,
    rounding_target,
)
from .ieee import (
    CHUNK,
    FINITE,
    NEGZERO,
    POSZERO,
    add_bits,
    add_exact_sum,
    bits_value,
    checked_add,
    decode,
    normalise,
    round_row,
    segment_bits,
    split_narrow,
    split_wide,
)
from .numba_cuda_compat import load_registries

load_registries()  # numba-cuda 0.30 under NumPy 2.5 (no np.row_stack) could compile no kernel

#: Dynamic shared memory a block may use without an opt-in (every CUDA GPU since cc 2.0).
SHARED_LIMIT_BYTES = 48 * 1024
#: Shared memory the system reserves per resident block (cc 8.0 and later).
SHARED_RESERVED_BYTES = 1024
#: Special-value counters a bucket keeps in shared memory: n_not_negzero, NaN, +inf, -inf.
SPECIALS = 4
#: The simulator runs kernels in Python threads: no driver to ask for more shared memory.
_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

_NUMBA_FLOAT = {"float16": float16, "float32": float32, "float64": float64}

#: value source formats: bits dtype of the view the exact kernels read, limb format.
SOURCES: dict[str, tuple[Any, LimbFormat]] = {
    "float32": (np.uint32, limb_format_for("float32")),
    "float16": (np.uint16, limb_format_for("float16")),
    "bfloat16": (np.uint16, limb_format_for("bfloat16")),
    "float64": (np.int64, limb_format_for("float64")),
}


def _decoding(source: str) -> tuple[int, int, int]:
    """``(exp_bits, frac_bits, shift)`` for :func:`bitfold.kernels.ieee.decode` of ``source``."""
    return decoding(source, SOURCES[source][1])


def shared_bytes(K: int, fmt: LimbFormat) -> int:
    """Dynamic shared memory of one ``exact_shared`` block: K buckets' limbs and counters."""
    return K * (fmt.limbs * 8 + SPECIALS * 4)


# -- exact: shared-memory limbs from 32-bit atomics ---------------------------------------
@cuda.jit(device=True)
def _shared_add64(sm, t, plane, c):  # pragma: no cover - compiled
    """Add the int64 ``c`` to the 64-bit word ``t`` of ``sm``, modulo 2^64, with 32-bit atomics.

    The word's low half is ``sm[t]``, its high half ``sm[plane + t]`` (uint32).
    The low halves are added first; the old value the atomic returns tells
    whether this addition carried out of the low half, and that carry goes
    into the high half with ``c``'s own high half. Each carry is counted by
    the addition that produced it, so the pair holds the sum modulo 2^64
    whatever order the threads take.
    """
    lo = uint32(c & 0xFFFFFFFF)
    old = cuda.atomic.add(sm, t, lo)
    carry = int64((uint64(old) + uint64(lo)) >> uint64(32))
    hi = uint32(((c >> 32) + carry) & 0xFFFFFFFF)
    if hi != 0:
        cuda.atomic.add(sm, plane + t, hi)


@cuda.jit(device=True)
def _shared_read64(sm, t, plane):  # pragma: no cover - compiled
    """The signed 64-bit word ``t`` (halves ``sm[t]``, ``sm[plane + t]``), given |value| < 2^63."""
    hi = int64(sm[plane + t])
    if hi >= 0x80000000:
        hi -= 0x100000000
    return hi * 0x100000000 + int64(sm[t])


@cuda.jit(device=True)
def _shared_read32(sm, t):  # pragma: no cover - compiled
    """The signed 32-bit counter ``sm[t]`` (uint32 holding a two's complement count)."""
    n = int64(sm[t])
    if n >= 0x80000000:
        n -= 0x100000000
    return n


@cuda.jit(device=True)
def _add_run(sm, base, plane, r0, r1, r2):  # pragma: no cover - compiled
    """Add a thread's run (pieces ``r0``, ``r1``, ``r2`` of limbs base, base+1, base+2)."""
    if r0 != 0:
        _shared_add64(sm, base, plane, r0)
    if r1 != 0:
        _shared_add64(sm, base + 1, plane, r1)
    if r2 != 0:
        _shared_add64(sm, base + 2, plane, r2)


@cache
def exact_shared_kernel(source: str) -> Any:
    """Kernel ``(index, bits, lo, hi, state)``: per-block shared limbs, merged once per block.

    Needs :func:`shared_bytes` of dynamic shared memory (the launch's 4th
    parameter): two uint32 planes of ``K * L`` words (the limbs' low and high
    halves), then ``SPECIALS`` uint32 counters a bucket. Values ``lo .. hi-1``
    are taken grid-stride; ``state`` (K, L + 5) int64 receives the block's
    non-zero limbs and counters. No division and no 64-bit shared atomic.
    """
    EXP, FRAC, SHIFT = _decoding(source)
    fmt = SOURCES[source][1]
    parts = split_wide if fmt is F64 else split_narrow
    L = fmt.limbs
    S = SPECIALS

    def exact_shared(index, bits, lo, hi, state):  # pragma: no cover - compiled
        sm = cuda.shared.array(0, uint32)
        tid = int64(cuda.threadIdx.x)
        nt = int64(cuda.blockDim.x)
        K = int64(state.shape[0])
        plane = K * L  # high halves; special counters after both planes
        counters = 2 * plane
        t = tid
        while t < counters + S * K:
            sm[t] = 0
            t += nt
        cuda.syncthreads()
        i = lo + int64(cuda.blockIdx.x) * nt + tid
        stride = nt * int64(cuda.gridDim.x)
        run_k = int64(-1)
        run_j = int64(0)
        r0 = int64(0)
        r1 = int64(0)
        r2 = int64(0)
        while i < hi:
            k = int64(index[i])
            cls, neg, m, p = decode(bits[i], EXP, FRAC, SHIFT)
            if cls == FINITE:
                j, a0, a1, a2 = parts(m, p)
                if neg:
                    a0, a1, a2 = -a0, -a1, -a2
                if k == run_k and j == run_j:
                    r0 += a0
                    r1 += a1
                    r2 += a2
                else:
                    if run_k >= 0:
                        _add_run(sm, run_k * L + run_j, plane, r0, r1, r2)
                    run_k, run_j, r0, r1, r2 = k, j, a0, a1, a2
            elif cls == NEGZERO:
                cuda.atomic.add(sm, counters + S * k, uint32(0xFFFFFFFF))  # -1
            elif cls != POSZERO:
                cuda.atomic.add(sm, counters + S * k + cls - 1, uint32(1))
            i += stride
        if run_k >= 0:
            _add_run(sm, run_k * L + run_j, plane, r0, r1, r2)
        cuda.syncthreads()
        k = tid
        while k < K:
            for j in range(L):
                v = _shared_read64(sm, k * L + j, plane)
                if v != 0:
                    cuda.atomic.add(state, (k, j), v)
            for c in range(S):
                n = _shared_read32(sm, counters + S * k + c)
                if n != 0:
                    cuda.atomic.add(state, (k, L + 1 + c), n)
            k += nt

    return cuda.jit(exact_shared)


@cache
def exact_global_kernel(source: str) -> Any:
    """Kernel ``(index, bits, lo, hi, state)``: int64 atomics straight into the global state.

    sm_90 has native 64-bit global atomic adds (``ATOMG.E.ADD.64``): no
    compare-and-swap loop.
    """
    EXP, FRAC, SHIFT = _decoding(source)
    fmt = SOURCES[source][1]
    parts = split_wide if fmt is F64 else split_narrow
    L = fmt.limbs

    def exact_global(index, bits, lo, hi, state):  # pragma: no cover - compiled
        i = lo + cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < hi:
            k = int64(index[i])
            cls, neg, m, p = decode(bits[i], EXP, FRAC, SHIFT)
            if cls == FINITE:
                j, a0, a1, a2 = parts(m, p)
                sgn = 1 - 2 * neg
                if a0 != 0:
                    cuda.atomic.add(state, (k, j), sgn * a0)
                if a1 != 0:
                    cuda.atomic.add(state, (k, j + 1), sgn * a1)
                if a2 != 0:
                    cuda.atomic.add(state, (k, j + 2), sgn * a2)
            elif cls == NEGZERO:
                cuda.atomic.add(state, (k, L + NEGZERO), -1)
            elif cls != POSZERO:
                cuda.atomic.add(state, (k, L + cls), 1)
            i += stride

    return cuda.jit(exact_global)


# -- exact: settling (normalise + counts) and rounding ---------------------------------------
@cache
def settle_kernel(limbs: int) -> Any:
    """Kernel ``(state, counts, add_counts)``: one thread a bucket.

    With ``add_counts`` != 0, adds ``counts[k]`` to ``n_terms`` and
    ``n_not_negzero`` (the CPU ``limbs`` kernel's convention). Then
    carry-normalises the limbs: limbs ``0 .. L-2`` in ``[0, 2^32)``, the top limb
    signed, the integer unchanged (the same normal form as the CPU state).
    """
    L = limbs

    def settle(state, counts, add_counts):  # pragma: no cover - compiled
        k = cuda.grid(1)
        if k >= state.shape[0]:
            return
        if add_counts != 0:
            c = int64(counts[k])
            state[k, L] += c
            state[k, L + 1] += c
        normalise(state[k], L)

    return cuda.jit(settle)


def _source_constants(source: str) -> tuple[int, int, int, bool, int, int, int]:
    """A kernel factory's constants of a value format: ``(EXP, FRAC, SHIFT, WIDE, L, W,
    UNIT)``, its decoding, whether it takes float64's wide limbs, its limbs, its state row
    width and its limb unit."""
    exp, frac, shift = _decoding(source)
    fmt = SOURCES[source][1]
    return exp, frac, shift, fmt is F64, fmt.limbs, fmt.limbs + 5, fmt.unit_exp


def _target_constants(out_name: str, widen_bfloat16: bool) -> tuple[int, int, int, int, int]:
    """``(P, EBITS, SUB_EXP, NAN_BITS, OUT_SHIFT)`` of a rounding target (a bfloat16 result
    held in float32 with ``widen_bfloat16``)."""
    shift = held_shift(out_name) if widen_bfloat16 else 0
    return (*_rounding_target(out_name), shift)


def _rounding_target(out_name: str) -> tuple[int, int, int, int]:
    """``(precision, exponent bits, smallest subnormal exponent, canonical NaN)`` of a target."""
    return rounding_target(out_name, F32)[1:5]


def signed_bits(unsigned: int, width: int) -> int:
    """The two's complement value of a ``width``-bit pattern (what a signed int view holds)."""
    return unsigned - (1 << width) if unsigned >= 1 << (width - 1) else unsigned


def out_bits_dtype(out_name: str, widen_bfloat16: bool = False) -> Any:
    """The signed integer dtype :func:`round_kernel` writes for ``out_name``."""
    if out_name == "bfloat16":
        return np.int32 if widen_bfloat16 else np.int16
    return {"float16": np.int16, "float32": np.int32, "float64": np.int64}[out_name]


@cache
def round_kernel(limbs: int, unit_exp: int, out_name: str, widen_bfloat16: bool = False) -> Any:
    """Kernel ``(state, counts, add_counts, clear, out_bits)``: round each bucket once; IEEE bits.

    One thread a bucket runs :func:`bitfold.kernels.ieee.round_row`, the CPU's
    rounding, so the bits are the CPU's. ``state`` need not be normalised (it
    is normalised in a private copy); with ``add_counts`` != 0 the term counts
    ``counts[k]`` are taken as not yet added to ``n_terms`` and
    ``n_not_negzero`` (the state is not modified). ``out_bits`` is a signed
    integer array of :func:`out_bits_dtype` (int16 for float16 and bfloat16,
    int32 for float32, int64 for float64) that the caller views as the float
    dtype; ``widen_bfloat16`` writes bfloat16 results as the float32 that holds
    them exactly (bits shifted left by 16), as the CPU does for libraries
    without bfloat16. With ``clear`` != 0 the state row is zeroed once read,
    ready for the next fold (a scratch state needs no zeroing launch).
    """
    L = limbs
    UNIT = unit_exp
    P, EBITS, SUB_EXP, NAN_BITS = _rounding_target(out_name)
    SHIFT = 16 if (widen_bfloat16 and out_name == "bfloat16") else 0

    def round_state(state, counts, add_counts, clear, out_bits):  # pragma: no cover - compiled
        k = cuda.grid(1)
        if k >= state.shape[0]:
            return
        extra = int64(0)
        if add_counts != 0:
            extra = int64(counts[k])
        mag = cuda.local.array(L, int64)
        out_bits[k] = round_row(state[k], L, extra, UNIT, P, EBITS, SUB_EXP, NAN_BITS, SHIFT, mag)
        if clear != 0:
            for j in range(L + 5):
                state[k, j] = 0

    return cuda.jit(round_state)


# -- exact, bucket by bucket ------------------------------------------------------------------
@cache
def buckets_kernel(source: str, out_name: str, widen_bfloat16: bool = False) -> Any:
    """Kernel ``(values, bits, order, offsets, out_bits, init, init_bits, has_init, split)``.

    One thread an output element; with ``split`` > 0, buckets of more than
    ``split`` positions are left alone (written by :func:`hot_round_kernel`).

    ``values`` (N, D) and ``bits`` (its integer view), ``out_bits`` (K, D) the
    signed-integer view of the output (as :func:`round_kernel`). Thread
    ``(k, d)`` walks bucket k's positions in the plan's order and sums column
    d with :func:`bitfold.kernels.ieee.segment_bits`, the CPU's own exact
    segment sum (checked float64 chunks, limbs in registers), then rounds
    once: no state, no atomics, whatever K is. Adjacent threads read adjacent
    columns of one row.
    """
    EXP, FRAC, SHIFT, WIDE, L, W, UNIT = _source_constants(source)
    P, EBITS, SUB_EXP, NAN_BITS, OUT_SHIFT = _target_constants(out_name, widen_bfloat16)
    FROM_BITS = source == "bfloat16"

    def exact_buckets(values, bits, order, offsets, out_bits, init, init_bits, has_init, split):
        # pragma: no cover - compiled
        i = cuda.grid(1)
        D = out_bits.shape[1]
        if i >= out_bits.shape[0] * D:
            return
        k = i // D
        d = i - k * D
        lo = offsets[k]
        hi = offsets[k + 1]
        if split > 0 and hi - lo > split:
            return  # a hot bucket: summed in segments by hot_segments_kernel, rounded by hot_round
        if lo == hi and has_init == 0:
            out_bits[k, d] = 0
            return
        row = cuda.local.array(W, int64)
        mag = cuda.local.array(L, int64)
        j = k if has_init != 0 else 0  # without init, ``init`` is any array; never read
        out_bits[k, d] = segment_bits(
            values, bits, order, lo, hi, d, EXP, FRAC, SHIFT, WIDE, UNIT, P, EBITS, SUB_EXP,
            NAN_BITS, OUT_SHIFT, row, mag, has_init != 0, init[j, d], init_bits[j, d], FROM_BITS,
        )  # fmt: skip

    return cuda.jit(exact_buckets)


# -- exact, hot buckets split across threads and blocks ---------------------------------------
#: The fewest positions a segment of a hot bucket holds (fewer would spend more on merging).
SEGMENT_MIN = 64
#: The most positions a segment holds: a thread's row of limbs never needs normalising.
SEGMENT_MAX = 1 << 20
#: The most bytes the state of the hot buckets' segments may take on the device.
HOT_STATE_BYTES = 64 << 20


def segment_length(positions: int, row_size: int, width: int, threads: int) -> int:
    """The positions a thread sums at most in a fold of rows (a power of two).

    About the work of one thread when ``positions * row_size`` values are
    spread over ``threads`` resident threads (at least :data:`SEGMENT_MIN`),
    and large enough that the hot buckets' state, at most ``positions /
    length`` rows of ``row_size * width`` int64, stays under
    :data:`HOT_STATE_BYTES`. Buckets with more positions are *hot*: split into
    segments of at most this many positions. It tunes the work; never the result.
    """
    work = -(-positions * row_size // max(1, threads))
    state = -(-positions * row_size * width * 8 // HOT_STATE_BYTES)
    want = max(SEGMENT_MIN, work, state)
    return min(SEGMENT_MAX, 1 << (want - 1).bit_length())


@dataclass(frozen=True)
class HotSegmentTable:
    """The hot buckets of a plan for one segment length (host arrays; built once per plan).

    ``buckets[h]`` is the h-th bucket with more than ``length`` positions;
    its ``ceil(count / length)`` segments are numbered ``starts[h] ..
    starts[h+1]-1`` and ``segment_bucket[s]`` maps a segment back to ``h``.
    Segment ``j`` of bucket ``k`` takes the bucket's positions ``offsets[k] +
    j``, ``+ n_segments``, ... (interleaved: adjacent threads read adjacent
    positions).
    """

    length: int
    buckets: np.ndarray  # int64 (H,)
    starts: np.ndarray  # int64 (H + 1,)
    segment_bucket: np.ndarray  # int32 (S,)

    @property
    def hot(self) -> int:
        return int(self.buckets.shape[0])

    @property
    def segments(self) -> int:
        return int(self.segment_bucket.shape[0])


def hot_segment_table(offsets: np.ndarray, length: int) -> HotSegmentTable:
    """The :class:`HotSegmentTable` of bucket ``offsets`` for segments of ``length`` positions."""
    counts = np.diff(np.asarray(offsets, np.int64))
    buckets = np.flatnonzero(counts > length).astype(np.int64)
    per = -(-counts[buckets] // length)
    starts = np.zeros(buckets.size + 1, np.int64)
    np.cumsum(per, out=starts[1:])
    segment_bucket = np.repeat(np.arange(buckets.size, dtype=np.int32), per)
    return HotSegmentTable(int(length), buckets, starts, segment_bucket)


@cache
def hot_segments_kernel(source: str) -> Any:
    """Kernel ``(values, bits, order, offsets, hot, starts, seg_bucket, s0, s1, state)``.

    One thread a (segment, column) of the segments ``s0 .. s1-1``, column
    fastest: it sums its segment's positions of column d exactly in a private
    row of limbs (chunks of :data:`bitfold.kernels.ieee.CHUNK` values summed in
    float64 with every addition checked, an inexact chunk value by value:
    :func:`bitfold.kernels.ieee.segment_bits`'s method), then adds the row's
    non-zero words to ``state[h * D + d]`` ((H * D, L + 5) int64) with 64-bit
    integer atomics, which are order-free. A segment holds at most
    :data:`SEGMENT_MAX` values, so a private limb stays below ``2^54``; the
    caller settles ``state`` before a bucket could have received ``2^29`` values.
    """
    EXP, FRAC, SHIFT, WIDE, L, W, UNIT = _source_constants(source)
    FROM_BITS = source == "bfloat16"

    def hot_segments(values, bits, order, offsets, hot, starts, seg_bucket, s0, s1, state):
        # pragma: no cover - compiled
        D = int64(bits.shape[1])
        i = cuda.grid(1)
        s = s0 + i // D
        if s >= s1:
            return
        d = i - (s - s0) * D
        h = int64(seg_bucket[s])
        step = starts[h + 1] - starts[h]
        k = hot[h]
        t = int64(offsets[k]) + (s - starts[h])
        hi = int64(offsets[k + 1])
        row = cuda.local.array(W, int64)
        for j in range(W):
            row[j] = 0
        while t < hi:
            acc = -0.0
            first = t
            n = int64(0)
            while n < CHUNK and t < hi:
                if FROM_BITS:
                    x = bits_value(bits[order[t], d], EXP, FRAC, SHIFT, UNIT)
                else:
                    x = float64(values[order[t], d])
                acc = checked_add(acc, x)
                t += step
                n += 1
            if acc == acc:
                add_exact_sum(row, L, acc, n, UNIT)
            else:
                u = first
                for _ in range(n):
                    add_bits(row, L, bits[order[u], d], EXP, FRAC, SHIFT, WIDE)
                    u += step
        base = h * D + d
        for j in range(W):
            if row[j] != 0:
                cuda.atomic.add(state, (base, j), row[j])

    return cuda.jit(hot_segments)


@cache
def hot_round_kernel(source: str, out_name: str, widen_bfloat16: bool = False) -> Any:
    """Kernel ``(state, hot, out_bits, init_bits, has_init)``: round the hot buckets once.

    A thread a column d, for the hot buckets h of its grid row (2-D grid, no division):
    copies ``state[h * D + d]``, adds
    ``init_bits[hot[h], d]`` as one more term with ``has_init`` != 0, rounds
    with :func:`bitfold.kernels.ieee.round_row` (the CPU's rounding) into
    ``out_bits[hot[h], d]`` and zeroes the state row for the next fold.
    """
    EXP, FRAC, SHIFT, WIDE, L, W, UNIT = _source_constants(source)
    P, EBITS, SUB_EXP, NAN_BITS, OUT_SHIFT = _target_constants(out_name, widen_bfloat16)

    def hot_round(state, hot, out_bits, init_bits, has_init):  # pragma: no cover - compiled
        d = cuda.grid(1)
        D = out_bits.shape[1]
        if d >= D:
            return
        row = cuda.local.array(W, int64)
        mag = cuda.local.array(L, int64)
        h = int64(cuda.blockIdx.y)
        while h < hot.shape[0]:  # grid-stride over the hot buckets (gridDim.y <= 65,535)
            i = h * D + d
            k = hot[h]
            for j in range(W):
                row[j] = state[i, j]
                state[i, j] = 0
            if has_init != 0:
                add_bits(row, L, init_bits[k, d], EXP, FRAC, SHIFT, WIDE)
            out_bits[k, d] = round_row(row, L, 0, UNIT, P, EBITS, SUB_EXP, NAN_BITS, OUT_SHIFT,
                                       mag)  # fmt: skip
            h += int64(cuda.gridDim.y)

    return cuda.jit(hot_round)


# -- ordered and atomic ---------------------------------------------------------------------
@cuda.jit
def gather_rows(order, values, out):  # pragma: no cover - compiled
    """``out[t, :] = values[order[t], :]``: the values in the plan's sorted order (grid-stride).

    Consecutive threads write consecutive elements (coalesced writes); the
    reads are the plan's gathers, all in flight at once.
    """
    D = values.shape[1]
    n = out.shape[0] * D
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < n:
        t = i // D
        d = i - t * D
        out[t, d] = values[order[t], d]
        i += stride


@cache
def ordered_kernel(out_name: str) -> Any:
    """Kernel ``(offsets, sorted, out, out_bits)``: one thread an output element, in order.

    ``sorted`` (N, D) holds the values in the plan's order (:func:`gather_rows`),
    ``out`` (K, D) and ``out_bits`` its signed-integer view (same memory),
    used to write the canonical NaN. Thread ``(k, d)`` adds column d of rows
    ``offsets[k] .. offsets[k+1]-1`` one after the other.
    """
    OUT = _NUMBA_FLOAT[out_name]
    target = FLOATS[out_name]
    # float16 sums are formed in float32 and rounded once to float16: for a sum of two
    # float16 numbers that double rounding is innocuous (24 >= 2*11 + 2 bits), so each step
    # is the correctly rounded float16 addition, as NumPy's float16 ``+`` on the CPU.
    WIDE = float32 if out_name == "float16" else OUT
    NAN_OUT = signed_bits(target.canonical_nan, target.width)

    def ordered(offsets, sorted_values, out, out_bits):  # pragma: no cover - compiled
        i = cuda.grid(1)
        D = out.shape[1]
        if i >= out.shape[0] * D:
            return
        k = i // D
        d = i - k * D
        acc = OUT(0.0)
        for t in range(offsets[k], offsets[k + 1]):
            acc = OUT(WIDE(acc) + WIDE(OUT(sorted_values[t, d])))
        if WIDE(acc) != WIDE(acc):  # NaN (compared widened: no float16 operator needed)
            out_bits[k, d] = NAN_OUT
        else:
            out[k, d] = acc

    return cuda.jit(ordered)


@cache
def atomic_kernel(out_name: str) -> Any:
    """Kernel ``(index, values, out)``: ``out[index[i], d] += out_t(values[i, d])``, float atomics.

    ``out_name`` is ``"float32"`` or ``"float64"`` (the accumulation dtype);
    ``values`` (N, D), ``out`` (K, D). No promise on the bits: the order is
    the scheduler's, and the float32 atomic flushes subnormals to zero on the
    GPU (``ATOMG.E.ADD.F32.FTZ.RN`` on sm_90), which the CPU does not.
    """
    OUT = _NUMBA_FLOAT[out_name]

    def atomic(index, values, out):  # pragma: no cover - compiled
        D = values.shape[1]
        n = values.shape[0] * D
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < n:
            r = i // D
            d = i - r * D
            cuda.atomic.add(out, (index[r], d), OUT(values[r, d]))
            i += stride

    return cuda.jit(atomic)


@cuda.jit
def cast_f32_to_f16(src, dst):  # pragma: no cover - compiled
    """``dst[k] = float16(src[k])``, rounded to nearest-even."""
    k = cuda.grid(1)
    if k < dst.shape[0]:
        dst[k] = float16(src[k])


@cuda.jit
def zero_fill(flat):  # pragma: no cover - compiled
    """Set every element of a flat array to zero (grid-stride)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < flat.shape[0]:
        flat[i] = 0
        i += stride


@cuda.jit
def add_fill(flat, other):  # pragma: no cover - compiled
    """``flat[i] += other[i]`` for every element of two flat int64 arrays (grid-stride)."""
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < flat.shape[0]:
        flat[i] += other[i]
        i += stride


# -- launching ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchShape:
    """Threads per block and the fewest and most blocks an accumulation launch uses."""

    threads: int = 256
    max_blocks: int = 264  # two blocks per SM on an H100/H200 (132 SMs); set from the device
    min_blocks: int = 1


@dataclass(frozen=True)
class DeviceLimits:
    """What a device offers the kernels: SMs and shared memory (bytes)."""

    sms: int = 132
    shared_per_block: int = SHARED_LIMIT_BYTES  # with the opt-in, when the driver allows it
    shared_per_sm: int = 228 * 1024
    threads_per_sm: int = 2048

    def shared_launch(self, nbytes: int, threads: int = 256) -> LaunchShape:
        """The launch shape of ``exact_shared`` blocks of ``nbytes``: as many as fit on each SM.

        Blocks resident at once on an SM are limited by its shared memory and
        its threads (at most 8 of 256 threads); one wave of them is the most a
        launch uses, and every SM gets at least one.
        """
        fit = self.shared_per_sm // (nbytes + SHARED_RESERVED_BYTES)
        per_sm = max(1, min(fit, self.threads_per_sm // threads))
        return LaunchShape(threads, self.sms * per_sm, self.sms)


def device_limits(device: Any) -> DeviceLimits:
    """The :class:`DeviceLimits` of a numba device (defaults where an attribute is missing)."""
    base = DeviceLimits()

    def attr(name: str, default: int) -> int:
        try:
            return int(getattr(device, name))
        except Exception:  # the simulator's device, or an attribute the driver lacks
            return default

    optin = attr("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", SHARED_LIMIT_BYTES)
    return DeviceLimits(
        sms=attr("MULTIPROCESSOR_COUNT", base.sms),
        shared_per_block=SHARED_LIMIT_BYTES if _SIMULATOR else max(SHARED_LIMIT_BYTES, optin),
        shared_per_sm=attr("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR", base.shared_per_sm),
        threads_per_sm=attr("MAX_THREADS_PER_MULTIPROCESSOR", base.threads_per_sm),
    )


#: (kernel, device, argument types) -> dynamic shared bytes the driver was told to allow.
_SHARED_ALLOWED: dict[tuple[int, int, tuple[Any, ...]], int] = {}


def allow_dynamic_shared(kernel: Any, args: tuple[Any, ...], nbytes: int) -> bool:
    """Let ``kernel``, launched with ``args``, use ``nbytes`` of dynamic shared memory.

    Launches above 48 KB must opt in (``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``,
    up to the device's ``MAX_SHARED_MEMORY_PER_BLOCK_OPTIN``: 227 KB on an
    H100/H200). True when the launch may go ahead; False when the driver
    refused (or the simulator, which cannot opt in, is asked for more than 48 KB).
    """
    if nbytes <= SHARED_LIMIT_BYTES:
        return True
    if _SIMULATOR:
        return False
    from numba.cuda.cudadrv.driver import binding, driver

    types = tuple(kernel.typeof_pyval(a) for a in args)
    device = cuda.get_current_device().id
    key = (id(kernel), device, types)
    if _SHARED_ALLOWED.get(key, 0) >= nbytes:
        return True
    try:
        compiled = kernel.compile(types)
        compiled.bind()
        function = compiled._codelibrary.get_cufunc()
        attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        driver.cuKernelSetAttribute(attr, int(nbytes), function.handle, device)
    except Exception:  # an old driver or numba-cuda without these entry points: no opt-in
        return False
    _SHARED_ALLOWED[key] = int(nbytes)
    return True


def _blocks(n: int, shape: LaunchShape) -> int:
    return max(1, min(shape.max_blocks, -(-n // shape.threads)))


def _per_bucket(K: int, most: int = 128) -> tuple[int, int]:
    """(blocks, threads) for one thread a bucket: whole warps, at most ``most`` a block."""
    threads = min(most, 32 * -(-K // 32))
    return -(-K // threads), threads


def exact_path(K: int, fmt: LimbFormat, shared_limit: int = SHARED_LIMIT_BYTES) -> str:
    """``"shared"`` when one block's limbs fit in ``shared_limit`` bytes, else ``"global"``."""
    return "shared" if shared_bytes(K, fmt) <= shared_limit else "global"


#: Values a block takes at least per bucket: fewer would spend more on merging its K limbs.
VALUES_PER_BUCKET = 16


def launch_exact(
    index: Any,
    bits: Any,
    source: str,
    state: Any,
    counts: Any,
    stream: Any,
    *,
    shape: LaunchShape | None = None,
    path: str = "auto",
    count_terms: bool = True,
    chunk: int | None = None,
    shared_limit: int = SHARED_LIMIT_BYTES,
) -> None:
    """Add every value exactly into ``state`` (K, L + 5) int64.

    ``bits`` is the flat bit view of the values (uint32 for float32, uint16
    for float16 and bfloat16, int64 for float64); ``state`` must be settled on
    entry (zeros are). Values are split into launches of at most
    ``fmt.carry_every``; the state is settled (carry-normalised) after each.
    With ``count_terms`` the term counts are added at the end and ``state``
    then equals the CPU ``limbs`` kernel's state for the same values, bit for
    bit. Without it the last settle is skipped: the caller rounds with
    ``add_counts=True``. ``chunk`` (tests) lowers the number of values a
    launch takes. A ``"shared"`` path whose limbs need more than
    ``shared_limit`` bytes is refused (``ValueError``): it could not launch.
    ``shape`` None: the default :class:`LaunchShape`.
    """
    shape = shape or LaunchShape()
    fmt = SOURCES[source][1]
    K = int(state.shape[0])
    n = int(bits.shape[0])
    nbytes = shared_bytes(K, fmt)
    kernel = exact_shared_kernel(source)
    if path == "auto":
        path = exact_path(K, fmt, shared_limit)
        args = (index, bits, 0, n, state)
        if path == "shared" and not allow_dynamic_shared(kernel, args, nbytes):
            path = "global"  # the driver would not give the shared memory
    if path == "shared" and nbytes > shared_limit:
        raise ValueError(
            f"the shared-memory exact kernel needs {nbytes:,} bytes of shared memory a block for "
            f"K = {K:,} buckets of {source} values ({shared_bytes(1, fmt)} bytes a bucket); this "
            f"device allows {shared_limit:,}"
        )
    if path not in ("shared", "global"):
        raise ValueError(f"unknown exact path {path!r}; choose 'auto', 'shared' or 'global'")
    settle = settle_kernel(fmt.limbs)[(*_per_bucket(K), stream)]
    lo = 0
    every = min(chunk or fmt.carry_every, fmt.carry_every)
    while lo < n:
        hi = min(n, lo + every)
        if path == "shared":
            wanted = max(shape.min_blocks, (hi - lo) // (VALUES_PER_BUCKET * max(K, 1)))
            blocks = max(1, min(_blocks(hi - lo, shape), wanted))
            args = (index, bits, lo, hi, state)
            if not allow_dynamic_shared(kernel, args, nbytes):
                raise ValueError(
                    f"the driver did not let the shared-memory exact kernel use {nbytes:,} "
                    "bytes of shared memory a block"
                )
            kernel[blocks, shape.threads, stream, nbytes](*args)
        else:
            blocks = _blocks(hi - lo, shape)
            exact_global_kernel(source)[blocks, shape.threads, stream](index, bits, lo, hi, state)
        lo = hi
        if lo < n:
            settle(state, counts, 0)
    if count_terms:
        settle(state, counts, 1)


def launch_settle(state: Any, counts: Any, add_counts: bool, fmt: LimbFormat, stream: Any) -> None:
    """Normalise ``state`` in place (and add the term counts with ``add_counts``; ``counts``
    may be None without them)."""
    settle_kernel(fmt.limbs)[(*_per_bucket(int(state.shape[0])), stream)](
        state, _unread(state) if counts is None else counts, 1 if add_counts else 0
    )


def _unread(state: Any) -> Any:
    """A 1-D int64 array to pass as the ``counts`` a kernel does not read (``add_counts`` 0):
    the state's own flat view, so the launch takes the compiled signature."""
    return state.reshape(int(state.shape[0]) * int(state.shape[1]))


def launch_merge(into: Any, other: Any, fmt: LimbFormat, stream: Any) -> None:
    """``into += other`` for two states ``(R, L + 5)`` int64 on one device, then carried.

    Integer addition, exact in any order; the carry (:func:`launch_settle`)
    brings limbs ``0 .. L-2`` back into ``[0, 2^32)`` without changing the
    integer, the host's :func:`bitfold.backends.host_state.merge_states` normal
    form, so merges may repeat without nearing int64 overflow.
    """
    n = int(into.shape[0]) * int(into.shape[1])
    if n:
        add_fill[(*_per_bucket(n, 256), stream)](into.reshape(n), other.reshape(n))
        launch_settle(into, None, False, fmt, stream)


def launch_round(
    state: Any,
    counts: Any,
    add_counts: bool,
    fmt: LimbFormat,
    out_name: str,
    out_bits: Any,
    stream: Any,
    *,
    widen_bfloat16: bool = False,
    clear: bool = False,
) -> None:
    """Round ``state`` into ``out_bits`` (the result's signed-int view); ``clear`` zeroes it.

    ``counts`` may be None without ``add_counts`` (the state holds its term counts).
    """
    K = int(state.shape[0])
    kernel = round_kernel(fmt.limbs, fmt.unit_exp, out_name, widen_bfloat16)
    counts = _unread(state) if counts is None else counts
    kernel[(*_per_bucket(K), stream)](
        state, counts, 1 if add_counts else 0, 1 if clear else 0, out_bits
    )


def launch_ordered(
    order: Any, offsets: Any, values: Any, sorted_values: Any, out: Any, out_bits: Any,
    out_name: str, stream: Any, *, shape: LaunchShape | None = None,
) -> None:  # fmt: skip
    """The ``ordered`` fold of rows ``values`` (N, D) into ``out`` (K, D).

    ``sorted_values`` (N, D, the values' dtype) is scratch: the values are
    gathered into it in the plan's order, then a thread an output element
    adds its bucket's contiguous run. ``shape`` None: the default :class:`LaunchShape`.
    """
    shape = shape or LaunchShape()
    n = int(values.shape[0]) * int(values.shape[1])
    if n:
        blocks = min(-(-n // shape.threads), 16 * shape.max_blocks)
        gather_rows[blocks, shape.threads, stream](order, values, sorted_values)
    m = int(out.shape[0]) * int(out.shape[1])
    if m:
        ordered_kernel(out_name)[(*_per_bucket(m, 64), stream)](
            offsets, sorted_values, out, out_bits
        )


def launch_atomic(
    index: Any, values: Any, out: Any, out_name: str, stream: Any, *, shape: LaunchShape
) -> None:
    """Float atomics of rows ``values`` (N, D) into the zeroed ``out`` (K, D; float32 or 64)."""
    n = int(values.shape[0]) * int(values.shape[1])
    if n:
        blocks = min(-(-n // shape.threads), 1 << 20)
        atomic_kernel(out_name)[blocks, shape.threads, stream](index, values, out)


def launch_buckets(
    values: Any, bits: Any, order: Any, offsets: Any, source: str, out_name: str, out_bits: Any,
    stream: Any, *, widen_bfloat16: bool = False, init: Any = None, init_bits: Any = None,
    hot: DeviceHotSegmentTable | None = None, hot_state: Any = None,
) -> None:  # fmt: skip
    """The exact fold of rows ``values`` (N, D), bucket by bucket, into ``out_bits`` (K, D).

    ``init`` (K, D) in the values' dtype, and its bit view, add one term a
    bucket. For bfloat16 ``values`` and ``init`` may be the bits themselves.
    With ``hot`` (a :class:`DeviceHotSegmentTable` with hot buckets) the buckets of
    more than ``hot.length`` positions are split into segments summed by
    many threads (:func:`launch_hot`) into ``hot_state`` ((H * D, L + 5)
    int64, zero on entry, left zero); the others take one thread an element.
    Either way each element is its bucket's correctly rounded sum.
    """
    n = int(out_bits.shape[0]) * int(out_bits.shape[1])
    if n:
        kernel = buckets_kernel(source, out_name, widen_bfloat16)
        has_init = init is not None
        if not has_init:
            init, init_bits = values, bits  # never read
        split = hot.length if hot is not None and hot.hot else 0
        kernel[(*_per_bucket(n, 128), stream)](values, bits, order, offsets, out_bits, init,
                                               init_bits, 1 if has_init else 0,
                                               split)  # fmt: skip
        if split:
            launch_hot(values, bits, order, offsets, source, out_name, out_bits, stream, hot,
                       hot_state, widen_bfloat16=widen_bfloat16, init_bits=init_bits,
                       has_init=has_init)  # fmt: skip


@dataclass(frozen=True)
class DeviceHotSegmentTable:
    """A :class:`HotSegmentTable` on one device: its three arrays uploaded, its sizes kept."""

    length: int
    hot: int
    segments: int
    buckets: Any
    starts: Any
    segment_bucket: Any


#: Values a bucket may receive between two settles of the hot state (2^33 each at most).
_HOT_SETTLE_EVERY = 1 << 29


def launch_hot(
    values: Any, bits: Any, order: Any, offsets: Any, source: str, out_name: str, out_bits: Any,
    stream: Any, hot: DeviceHotSegmentTable, state: Any, *, widen_bfloat16: bool = False,
    init_bits: Any = None, has_init: bool = False, threads: int = 256,
) -> None:  # fmt: skip
    """Sum the hot buckets' segments into ``state`` and round them into ``out_bits``.

    A launch takes at most ``2^29 / hot.length`` segments, so no bucket
    receives ``2^29`` values before :func:`settle_kernel` normalises the state
    again; the rounding kernel adds ``init`` and leaves the state zeroed.
    """
    fmt = SOURCES[source][1]
    D = int(bits.shape[1])
    per_launch = max(1, _HOT_SETTLE_EVERY // hot.length)
    kernel = hot_segments_kernel(source)
    s0 = 0
    while s0 < hot.segments:
        s1 = min(hot.segments, s0 + per_launch)
        blocks = -(-(s1 - s0) * D // threads)
        kernel[blocks, threads, stream](values, bits, order, offsets, hot.buckets, hot.starts,
                                        hot.segment_bucket, s0, s1, state)  # fmt: skip
        s0 = s1
        if s0 < hot.segments:
            settle_kernel(fmt.limbs)[(*_per_bucket(hot.hot * D), stream)](state, hot.starts, 0)
    if init_bits is None:
        init_bits = bits  # never read
    tx = min(128, 32 * -(-D // 32))
    grid = (-(-D // tx), min(hot.hot, 65535))
    hot_round_kernel(source, out_name, widen_bfloat16)[grid, (tx, 1), stream](
        state, hot.buckets, out_bits, init_bits, 1 if has_init else 0
    )


def launch_zero(flat: Any, stream: Any, shape: LaunchShape | None = None) -> None:
    """Zero a flat numba device array (at most ``4 * shape.max_blocks`` blocks)."""
    shape = shape or LaunchShape()
    n = int(flat.shape[0])
    if n:
        blocks = min(-(-n // shape.threads), 4 * shape.max_blocks)
        zero_fill[blocks, shape.threads, stream](flat)


def launch_cast_f16(src: Any, dst: Any, stream: Any) -> None:
    """``dst = float16(src)`` elementwise."""
    n = int(dst.shape[0])
    if n:
        cast_f32_to_f16[(*_per_bucket(n, 256), stream)](src, dst)
