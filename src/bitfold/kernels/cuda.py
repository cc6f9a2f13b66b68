"""numba-cuda kernels for the three strategies; imported only when a GPU fold is asked for.

Kernels know nothing about plans or frameworks: they take numba device
arrays (real ones, or the simulator's under ``NUMBA_ENABLE_CUDASIM=1``) and a
stream. :mod:`bitfold.backends.cuda` wraps foreign arrays and chooses launch shapes.
Decoding, limb splitting, carry normalisation and rounding are the CPU's own
functions (:mod:`bitfold.kernels.ieee`), compiled for the device.

Numeric contracts
-----------------
``atomic``
    ``out[index[i]] += value[i]`` with hardware float atomics (``atom.add.f32``
    or ``.f64``) in whatever order the scheduler picks: no guarantee, the
    baseline. A float16 output is accumulated in float32 and rounded once.
``ordered``
    One thread per bucket k walks the plan's stable sorted order
    ``order[offsets[k]:offsets[k+1]]`` (increasing position) and computes
    ``acc = +0.0; acc = out_t(acc + out_t(v))`` in the output dtype, each
    addition rounded to nearest-even (no FMA can form: there is no multiply;
    numba-cuda compiles without ``fastmath``, so subnormals are kept). That is
    exactly the CPU ``ordered`` order, so finite and infinite results have the
    same bits as on the CPU. A NaN result is written as the canonical NaN of
    :data:`bitfold.CANONICAL_NAN_BITS` (hardware NaN payloads differ between
    CPU and GPU; only the canonical pattern is reproducible).
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
    for bit.

Carry bound (exact)
-------------------
Every single contribution to a limb is below ``2^32`` in magnitude (below
``2^33`` for float64 values), and each value touches a given limb at most
once. A launch adds at most ``fmt.carry_every`` values (``2^30`` for float32,
float16 and bfloat16 values, ``2^29`` for float64), starting from a normalised
state (limbs ``0 .. L-2`` in ``[0, 2^32)``). Shared-memory limbs of a block
therefore stay below ``2^62`` in magnitude, and so does every partial sum
in the global state: a block merges its *raw* shared limbs, and the sum of the
raw limbs of all blocks is bounded by the same count of contributions. The
caller normalises the global state (:func:`launch_settle`) after every
launch, so any N is served in launches of at most ``carry_every`` values.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int64
from numba.core.types import float16

from ..formats import F64, FLOATS, LIMBS, OUT_DTYPES, LimbFormat, decode_shift, limb_format_for
from .ieee import (
    FINITE,
    NEGZERO,
    POSZERO,
    decode,
    normalise,
    round_row,
    segment_bits,
    split_narrow,
    split_wide,
)

#: Most dynamic shared memory a block of the shared-limb exact kernel asks for
#: (the limit without an opt-in on every CUDA GPU since compute capability 2.0).
SHARED_LIMIT_BYTES = 48 * 1024

_NUMBA_FLOAT = {"float16": float16, "float32": float32, "float64": float64}

#: value source formats: bits dtype of the view the exact kernel reads, limb format.
SOURCES: dict[str, tuple[Any, LimbFormat]] = {
    "float32": (np.uint32, limb_format_for("float32")),
    "float16": (np.uint16, limb_format_for("float16")),
    "float64": (np.int64, limb_format_for("float64")),
}


def _decoding(source: str) -> tuple[int, int, int]:
    """``(exp_bits, frac_bits, shift)`` for :func:`bitfold.kernels.ieee.decode` of ``source``."""
    f = FLOATS[source]
    return f.exponent_bits, f.fraction_bits, decode_shift(source, SOURCES[source][1])


# -- exact: accumulation kernels ------------------------------------------------------------
@cache
def exact_shared_kernel(source: str) -> Any:
    """Kernel ``(index, bits, lo, hi, state)``: per-block shared limbs, merged once per block.

    Needs ``K * L * 8`` bytes of dynamic shared memory (the launch's 4th
    parameter). Values ``lo .. hi-1`` are taken grid-stride.
    """
    EXP, FRAC, SHIFT = _decoding(source)
    fmt = SOURCES[source][1]
    parts = split_wide if fmt is F64 else split_narrow
    L = fmt.limbs

    def exact_shared(index, bits, lo, hi, state):  # pragma: no cover - compiled
        sm = cuda.shared.array(0, int64)
        tid = int64(cuda.threadIdx.x)
        nt = int64(cuda.blockDim.x)
        KL = int64(state.shape[0]) * L
        for t in range(tid, KL, nt):
            sm[t] = 0
        cuda.syncthreads()
        i = lo + int64(cuda.blockIdx.x) * nt + tid
        stride = nt * int64(cuda.gridDim.x)
        while i < hi:
            k = int64(index[i])
            cls, neg, m, p = decode(bits[i], EXP, FRAC, SHIFT)
            if cls == FINITE:
                j, a0, a1, a2 = parts(m, p)
                sgn = 1 - 2 * neg
                base = k * L + j
                if a0 != 0:
                    cuda.atomic.add(sm, base, sgn * a0)
                if a1 != 0:
                    cuda.atomic.add(sm, base + 1, sgn * a1)
                if a2 != 0:
                    cuda.atomic.add(sm, base + 2, sgn * a2)
            elif cls == NEGZERO:
                cuda.atomic.add(state, (k, L + NEGZERO), -1)
            elif cls != POSZERO:
                cuda.atomic.add(state, (k, L + cls), 1)
            i += stride
        cuda.syncthreads()
        for t in range(tid, KL, nt):
            v = sm[t]
            if v != 0:
                cuda.atomic.add(state, (t // L, t % L), v)

    return cuda.jit(exact_shared)


@cache
def exact_global_kernel(source: str) -> Any:
    """Kernel ``(index, bits, lo, hi, state)``: int64 atomics straight into the global state."""
    EXP, FRAC, SHIFT = _decoding(source)
    fmt = SOURCES[source][1]
    parts = split_wide if fmt is F64 else split_narrow
    L = fmt.limbs

    def exact_global(index, bits, lo, hi, state):  # pragma: no cover - compiled
        i = lo + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x) + int64(cuda.threadIdx.x)
        stride = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
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
    """Kernel ``(state, counts, add_counts, out_bits)``: round each bucket once; write IEEE bits.

    One thread a bucket runs :func:`bitfold.kernels.ieee.round_row`, the CPU's
    rounding, so the bits are the CPU's. ``state`` need not be normalised (it
    is normalised in a private copy); with ``add_counts`` != 0 the term counts
    ``counts[k]`` are taken as not yet added to ``n_terms`` and
    ``n_not_negzero`` (the state is not modified). ``out_bits`` is a signed
    integer array of :func:`out_bits_dtype` (int16 for float16 and bfloat16,
    int32 for float32, int64 for float64) that the caller views as the float
    dtype; ``widen_bfloat16`` writes bfloat16 results as the float32 that holds
    them exactly (bits shifted left by 16), as the CPU does for libraries
    without bfloat16.
    """
    L = limbs
    UNIT = unit_exp
    target = FLOATS[out_name]
    P, EBITS, SUB_EXP, NAN_BITS = (
        target.precision, target.exponent_bits, target.subnormal_exp, target.canonical_nan
    )
    SHIFT = 16 if (widen_bfloat16 and out_name == "bfloat16") else 0

    def round_state(state, counts, add_counts, out_bits):  # pragma: no cover - compiled
        k = cuda.grid(1)
        if k >= state.shape[0]:
            return
        extra = int64(0)
        if add_counts != 0:
            extra = int64(counts[k])
        mag = cuda.local.array(L, int64)
        out_bits[k] = round_row(state[k], L, extra, UNIT, P, EBITS, SUB_EXP, NAN_BITS, SHIFT, mag)

    return cuda.jit(round_state)


# -- exact, bucket by bucket ------------------------------------------------------------------
@cache
def buckets_kernel(source: str, out_name: str, widen_bfloat16: bool = False) -> Any:
    """Kernel ``(values, bits, order, offsets, out_bits, init, init_bits, has_init)``.

    One thread an output element.

    ``values`` (N, D) and ``bits`` (its integer view), ``out_bits`` (K, D) the
    signed-integer view of the output (as :func:`round_kernel`). Thread
    ``(k, d)`` walks bucket k's positions in the plan's order and sums column
    d with :func:`bitfold.kernels.ieee.segment_bits`, the CPU's own exact
    segment sum (checked float64 chunks, limbs in registers), then rounds
    once: no state, no atomics, whatever K is. Adjacent threads read adjacent
    columns of one row.
    """
    EXP, FRAC, SHIFT = _decoding(source)
    fmt = SOURCES[source][1]
    WIDE = fmt is F64
    L = fmt.limbs
    W = L + 5
    UNIT = fmt.unit_exp
    target = FLOATS[out_name]
    P, EBITS, SUB_EXP, NAN_BITS = (
        target.precision, target.exponent_bits, target.subnormal_exp, target.canonical_nan
    )
    OUT_SHIFT = 16 if (widen_bfloat16 and out_name == "bfloat16") else 0

    def exact_buckets(values, bits, order, offsets, out_bits, init, init_bits, has_init):
        # pragma: no cover - compiled
        i = cuda.grid(1)
        D = out_bits.shape[1]
        if i >= out_bits.shape[0] * D:
            return
        k = i // D
        d = i - k * D
        lo = offsets[k]
        hi = offsets[k + 1]
        if lo == hi and has_init == 0:
            out_bits[k, d] = 0
            return
        row = cuda.local.array(W, int64)
        mag = cuda.local.array(L, int64)
        j = k if has_init != 0 else 0  # without init, ``init`` is any array; never read
        out_bits[k, d] = segment_bits(
            values, bits, order, lo, hi, d, EXP, FRAC, SHIFT, WIDE, UNIT, P, EBITS, SUB_EXP,
            NAN_BITS, OUT_SHIFT, row, mag, has_init != 0, init[j, d], init_bits[j, d],
        )  # fmt: skip

    return cuda.jit(exact_buckets)


# -- ordered and atomic ---------------------------------------------------------------------
@cache
def ordered_kernel(out_name: str) -> Any:
    """Kernel ``(order, offsets, values, out, out_bits)``: one thread an output element, in order.

    ``values`` (N, D), ``out`` (K, D) and ``out_bits`` its signed-integer view
    (same memory), used to write the canonical NaN. Thread ``(k, d)`` adds
    column d of bucket k's rows in the plan's stable order.
    """
    OUT = _NUMBA_FLOAT[out_name]
    target = FLOATS[out_name]
    # float16 sums are formed in float32 and rounded once to float16: for a sum of two
    # float16 numbers that double rounding is innocuous (24 >= 2*11 + 2 bits), so each step
    # is the correctly rounded float16 addition, as NumPy's float16 ``+`` on the CPU.
    WIDE = float32 if out_name == "float16" else OUT
    NAN_OUT = signed_bits(target.canonical_nan, target.width)

    def ordered(order, offsets, values, out, out_bits):  # pragma: no cover - compiled
        i = cuda.grid(1)
        D = out.shape[1]
        if i >= out.shape[0] * D:
            return
        k = i // D
        d = i - k * D
        acc = OUT(0.0)
        for t in range(offsets[k], offsets[k + 1]):
            acc = OUT(WIDE(acc) + WIDE(OUT(values[order[t], d])))
        if WIDE(acc) != WIDE(acc):  # NaN (compared widened: no float16 operator needed)
            out_bits[k, d] = NAN_OUT
        else:
            out[k, d] = acc

    return cuda.jit(ordered)


@cache
def atomic_kernel(out_name: str) -> Any:
    """Kernel ``(index, values, out)``: ``out[index[i], d] += out_t(values[i, d])``, float atomics.

    ``out_name`` is ``"float32"`` or ``"float64"`` (the accumulation dtype);
    ``values`` (N, D), ``out`` (K, D).
    """
    OUT = _NUMBA_FLOAT[out_name]

    def atomic(index, values, out):  # pragma: no cover - compiled
        D = values.shape[1]
        n = values.shape[0] * D
        i = int64(cuda.blockIdx.x) * int64(cuda.blockDim.x) + int64(cuda.threadIdx.x)
        stride = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
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
    i = int64(cuda.blockIdx.x) * int64(cuda.blockDim.x) + int64(cuda.threadIdx.x)
    stride = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
    while i < flat.shape[0]:
        flat[i] = 0
        i += stride


# -- launching ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchShape:
    """Threads per block and the most blocks an accumulation launch uses."""

    threads: int = 256
    max_blocks: int = 264  # two blocks per SM on an H100/H200 (132 SMs); set from the device


def _blocks(n: int, shape: LaunchShape) -> int:
    return max(1, min(shape.max_blocks, -(-n // shape.threads)))


def _per_bucket(K: int, most: int = 128) -> tuple[int, int]:
    """(blocks, threads) for one thread a bucket: whole warps, at most ``most`` a block."""
    threads = min(most, 32 * -(-K // 32))
    return -(-K // threads), threads


def exact_path(K: int, fmt: LimbFormat) -> str:
    """``"shared"`` when one block's private limbs fit in shared memory, else ``"global"``."""
    return "shared" if K * fmt.limbs * 8 <= SHARED_LIMIT_BYTES else "global"


def launch_exact(
    index: Any,
    bits: Any,
    source: str,
    state: Any,
    counts: Any,
    stream: Any,
    *,
    shape: LaunchShape = LaunchShape(),
    path: str = "auto",
    count_terms: bool = True,
    chunk: int | None = None,
) -> None:
    """Add every value exactly into ``state`` (K, L + 5) int64.

    ``bits`` is the flat bit view of the values (uint32 for float32, uint16
    for float16, int64 for float64); ``state`` must be settled on entry (zeros
    are). Values are split into launches of at most ``fmt.carry_every``; the
    state is settled (carry-normalised) after each. With ``count_terms`` the
    term counts are added at the end and ``state`` then equals the CPU
    ``limbs`` kernel's state for the same values, bit for bit. Without it the
    last settle is skipped: the caller rounds with ``add_counts=True``.
    ``chunk`` (tests) lowers the number of values a launch takes.
    """
    fmt = SOURCES[source][1]
    K = int(state.shape[0])
    n = int(bits.shape[0])
    if path == "auto":
        path = exact_path(K, fmt)
    settle = settle_kernel(fmt.limbs)[(*_per_bucket(K), stream)]
    lo = 0
    every = min(chunk or fmt.carry_every, fmt.carry_every)
    while lo < n:
        hi = min(n, lo + every)
        blocks = _blocks(hi - lo, shape)
        if path == "shared":
            nbytes = K * fmt.limbs * 8
            exact_shared_kernel(source)[blocks, shape.threads, stream, nbytes](
                index, bits, lo, hi, state
            )
        elif path == "global":
            exact_global_kernel(source)[blocks, shape.threads, stream](index, bits, lo, hi, state)
        else:
            raise ValueError(f"unknown exact path {path!r}; choose 'auto', 'shared' or 'global'")
        lo = hi
        if lo < n:
            settle(state, counts, 0)
    if count_terms:
        settle(state, counts, 1)


def launch_settle(state: Any, counts: Any, add_counts: bool, fmt: LimbFormat, stream: Any) -> None:
    """Normalise ``state`` in place (and add the term counts with ``add_counts``)."""
    settle_kernel(fmt.limbs)[(*_per_bucket(int(state.shape[0])), stream)](
        state, counts, 1 if add_counts else 0
    )


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
) -> None:
    """Round ``state`` into ``out_bits`` (the signed-int view of the result)."""
    K = int(state.shape[0])
    kernel = round_kernel(fmt.limbs, fmt.unit_exp, out_name, widen_bfloat16)
    kernel[(*_per_bucket(K), stream)](state, counts, 1 if add_counts else 0, out_bits)


def launch_ordered(
    order: Any, offsets: Any, values: Any, out: Any, out_bits: Any, out_name: str, stream: Any
) -> None:
    """The ``ordered`` fold of rows ``values`` (N, D) into ``out`` (K, D): a thread an element."""
    n = int(out.shape[0]) * int(out.shape[1])
    if n:
        ordered_kernel(out_name)[(*_per_bucket(n, 64), stream)](
            order, offsets, values, out, out_bits
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
) -> None:
    """The exact fold of rows ``values`` (N, D), bucket by bucket, into ``out_bits`` (K, D).

    ``init`` (K, D) in the values' dtype, and its bit view, add one term a bucket.
    """
    n = int(out_bits.shape[0]) * int(out_bits.shape[1])
    if n:
        kernel = buckets_kernel(source, out_name, widen_bfloat16)
        has_init = init is not None
        if not has_init:
            init, init_bits = values, bits  # never read
        kernel[(*_per_bucket(n, 128), stream)](values, bits, order, offsets, out_bits, init,
                                               init_bits, 1 if has_init else 0)  # fmt: skip


def launch_zero(flat: Any, stream: Any, shape: LaunchShape = LaunchShape()) -> None:
    """Zero a flat numba device array (at most ``4 * shape.max_blocks`` blocks)."""
    n = int(flat.shape[0])
    if n:
        blocks = min(-(-n // shape.threads), 4 * shape.max_blocks)
        zero_fill[blocks, shape.threads, stream](flat)


def launch_cast_f16(src: Any, dst: Any, stream: Any) -> None:
    """``dst = float16(src)`` elementwise."""
    n = int(dst.shape[0])
    if n:
        cast_f32_to_f16[(*_per_bucket(n, 256), stream)](src, dst)


# -- what the compile check builds -------------------------------------------------------------
def compile_targets() -> list[tuple[str, Any, tuple[Any, ...]]]:
    """``(name, python function, argument types)`` of every kernel, for ``cuda.compile_ptx``."""
    from numba import types

    i32, i64 = types.int32, types.int64
    arr = types.Array
    targets: list[tuple[str, Any, tuple[Any, ...]]] = []
    bit_types = {"float32": types.uint32, "float16": types.uint16, "float64": types.int64}
    for source, bt in bit_types.items():
        sig = (arr(i32, 1, "C"), arr(bt, 1, "C"), i64, i64, arr(i64, 2, "C"))
        targets.append((f"exact_shared[{source}]", exact_shared_kernel(source).py_func, sig))
        targets.append((f"exact_global[{source}]", exact_global_kernel(source).py_func, sig))
    ints = {"float16": types.int16, "float32": types.int32, "float64": types.int64}
    for fmt in LIMBS.values():
        for out_name, widen in [(n, False) for n in OUT_DTYPES] + [("bfloat16", True)]:
            bits_t = types.int32 if widen else ints.get(out_name, types.int16)
            targets.append(
                (
                    f"round[{fmt.name}->{out_name}{'>float32' if widen else ''}]",
                    round_kernel(fmt.limbs, fmt.unit_exp, out_name, widen).py_func,
                    (arr(i64, 2, "C"), arr(i64, 1, "C"), i64, arr(bits_t, 1, "C")),
                )
            )
        targets.append(
            (
                f"settle[{fmt.name}]",
                settle_kernel(fmt.limbs).py_func,
                (arr(i64, 2, "C"), arr(i64, 1, "C"), i64),
            )
        )
    floats = {"float16": types.float16, "float32": types.float32, "float64": types.float64}
    pairs = [("float32", o) for o in floats] + [("float16", "float32"), ("float64", "float64")]
    for value_name, out_name in pairs:
        targets.append(
            (
                f"ordered[{value_name}->{out_name}]",
                ordered_kernel(out_name).py_func,
                (
                    arr(i32, 1, "C"),
                    arr(i32, 1, "C"),
                    arr(floats[value_name], 2, "C"),
                    arr(floats[out_name], 2, "C"),
                    arr(ints[out_name], 2, "C"),
                ),
            )
        )
    for value_name, out_name in [("float32", "float32"), ("float32", "float64"),
                                 ("float16", "float32"), ("float64", "float64")]:  # fmt: skip
        targets.append(
            (
                f"atomic[{value_name}->{out_name}]",
                atomic_kernel(out_name).py_func,
                (arr(i32, 1, "C"), arr(floats[value_name], 2, "C"), arr(floats[out_name], 2, "C")),
            )
        )
    bucket_cases = [("float32", o, False) for o in ("float32", "float16", "float64")]
    bucket_cases += [("float32", "bfloat16", True), ("float32", "bfloat16", False)]
    bucket_cases += [("float16", "float32", False), ("float64", "float64", False)]
    for source, out_name, widen in bucket_cases:
        bits_t = types.int32 if widen else ints.get(out_name, types.int16)
        targets.append(
            (
                f"buckets[{source}->{out_name}{'>float32' if widen else ''}]",
                buckets_kernel(source, out_name, widen).py_func,
                (
                    arr(floats[source], 2, "C"),
                    arr(bit_types[source], 2, "C"),
                    arr(i32, 1, "C"),
                    arr(i32, 1, "C"),
                    arr(bits_t, 2, "C"),
                    arr(floats[source], 2, "C"),
                    arr(bit_types[source], 2, "C"),
                    i64,
                ),
            )
        )
    targets.append(
        (
            "cast_f32_to_f16",
            cast_f32_to_f16.py_func,
            (arr(types.float32, 1, "C"), arr(types.float16, 1, "C")),
        )
    )
    targets.append(("zero_fill", zero_fill.py_func, (arr(i64, 1, "C"),)))
    return targets
