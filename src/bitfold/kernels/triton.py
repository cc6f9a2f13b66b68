"""Triton kernels of the exact and ordered folds; imported only when a Triton fold is asked for.

Kernels know nothing about plans or frameworks: they take torch tensors (on a
GPU, or on the CPU under ``TRITON_INTERPRET=1``) of value *bit patterns*, the
plan's sorted order and offsets, and write result bit patterns.
:mod:`bitfold.backends.triton` chooses the launches. Every kernel is plain
Triton, so one source serves NVIDIA (CUDA), AMD (ROCm) and Intel (XPU) GPUs.

Numeric contract
----------------
``exact`` gives the correctly rounded sum of every bucket, the same bits as the
host backend (:mod:`bitfold.exact`) and the Fraction oracle, whatever the order
programs run in:

* Values are decoded from their bits with integer operations (sign, integer
  significand ``M`` and shift ``p``, ``|v| = M·2^(p + unit)``), and nothing is
  flushed to zero; the one float unit that sees a value is the lanes' float64
  word of narrow values (below), exact by its certificate.
* ``±M << (p mod 32)`` is cut into 32-bit pieces added to limbs ``p // 32`` and
  up of a bucket's *limb tile* (``(L_PAD, lanes)`` int64 in registers, the limb
  format of :class:`bitfold.formats.LimbFormat`). Integer addition is exact and
  associative, so the tile holds the exact sum in any order.
* *Lanes* (:func:`lanes_kernel`): one lane an output element (bucket, column)
  walks its bucket's run of the sorted order and rounds in registers: no state,
  no atomics, no second pass. Rows are read whole, a row's columns by
  neighbouring lanes.
* *One word a value* (the lanes' common case): a lane sums its run in one pass
  into one word and keeps its terms' exponent bounds as it goes; where its
  certificate holds (no NaN or infinity, and ``bit_length(terms) + (p_hi - p_lo)
  + significand bits`` at most 53 for float32, bfloat16 and float16 values, whose
  word is a float64 sum, or 62 for float64 values, one shifted integer a value
  in an int64 word) the word is exact, and it is rounded once, straight to the
  output dtype (:func:`_round_float_sum`, :func:`_round_word`: no double
  rounding through float32). Lanes the certificate refuses take the limbs.
  Widening a narrow value to float64 is exact and keeps subnormals (no
  ``.ftz``), and a certified float64 sum has no subnormal and no rounding.
* *Hot buckets* (more positions than a lane walks): :func:`hot_kernel` splits
  them into chunks of the sorted order; a program sums a chunk, all its lanes
  on one bucket, carries its tile and adds it into the bucket's row of an int64
  state with 64-bit integer atomics (order-free: the same integers in any
  order); :func:`round_rows_kernel` then rounds each hot element once.
* Rounding (:func:`_round_tile`) is the host's (:func:`bitfold.kernels.ieee.round_row`)
  in integer arithmetic: carry, sign, leading limb, guard and sticky bits,
  round half to even, the IEEE pattern. NaN results are the canonical NaN.

``ordered`` (:func:`ordered_kernel`) adds each bucket's values in increasing
position, one rounding an addition in the output dtype, the host's order:
float32 and float64 sums in the hardware's round-to-nearest adds, float16 and
bfloat16 sums formed in float32 (exact for two narrow operands' sum up to one
rounding, and float32 has more than twice their precision plus two bits, so
the double rounding is innocuous) and rounded to the output with integer
operations (:func:`_round_float_bits`); values narrowed to the output dtype
the same way. No multiply, so no fused multiply-add can form.

Blind spots of the CPU interpreter, closed in the code
------------------------------------------------------
* Shifts: every shift amount is clamped to ``[0, 63]`` and its out-of-range
  case selected away with ``where`` (a shift by 64 or more is poison on a GPU).
* Memory: every load and store is masked to its tensor's extent; indices
  that only masked lanes compute are clamped first.
* Offsets: every program id is widened to int64 before it is multiplied
  (``tl.program_id(0).to(tl.int64) * BLOCK``), so no offset wraps past 2^31
  elements. The interpreter's program ids are int32 too, but no test can
  afford 2^31 elements in it; the source and the sm_90 PTX are checked.
* Devices: Triton launches on torch's *current* device and stream, whatever
  the tensors' device. Every launch (the folds' and the all-reduce words' of
  :mod:`bitfold.kernels.triton_words`) runs under
  :func:`bitfold.backends.triton.launching`, which makes the tensor's device
  current (a ``cuda:1`` tensor while ``cuda:0`` is current).
* Races: no program reads what another writes. Programs share memory only
  through 64-bit integer atomic adds (``atom.add.u64``, relaxed: the values
  are integers, so any order gives the same bits), and a kernel reads a state
  only after the kernel that filled it has finished (stream order).
* Float rounding: the only float arithmetic on an exact value is the lanes'
  float64 sum of narrow values, exact by its certificate (no addition rounds),
  and that sum's one rounding to a float32 output (``cvt.rn.f32.f64``); the
  ordered adds have no multiply (no FMA contraction).
* Float-to-int conversions: none of a value (bits are reinterpreted, never
  converted); the only one in the machine code is ptxas's reciprocal in an
  integer division of positions by the row size.

Carry bound: a lane or chunk adds at most :data:`MAX_RUN` values before its
tile is carried; a piece is below ``2^33``; so a limb stays below ``2^62``.
Merged tiles are carried (limbs below ``2^32`` but the top one), so a state
row absorbs ``2^29`` merges. The backend refuses a ``hot_min`` or ``chunk``
above :data:`MAX_RUN` by name, before any launch; rows of no elements
launch nothing (an empty result of the right shape).

Closed here but proved only on a device
---------------------------------------
The suite runs without a GPU; these closings are checked by other means,
not by running them where they matter:

* the device guard with a recording guard and a fake ``torch.cuda.device``
  (and ``torch.xpu.device``): no launch on a second GPU, and no CuPy array
  on its external stream, runs here;
* the 64-bit offsets in the source and the sm_90 PTX (no AMD code is read
  for them), never with 2^31 elements;
* the hot table's compaction (scans and one scatter, not
  ``torch.nonzero_static``, which older torch releases lack on CUDA and
  XPU) on CPU tensors with ``nonzero_static`` removed, and its one read of
  the sizes counted there; torch 2.4 itself is not installed here, and a
  sync that a CUDA operation would hide inside is not visible on the CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: The most values a lane or a chunk sums before its limbs are carried (2^29 · 2^33 = 2^62).
MAX_RUN = 1 << 29
MASK32 = tl.constexpr(0xFFFFFFFF)


# -- integer helpers -------------------------------------------------------------------------
@triton.jit
def _shl(x, s):
    """``x << s`` for ``0 <= s``; 0 where ``s >= 64`` (never a shift by 64 or more)."""
    return tl.where(s < 64, x << tl.minimum(s, 63), 0)


@triton.jit
def _shr(x, s):
    """``x >> s`` (arithmetic) for ``0 <= s``; the sign fill where ``s >= 64``."""
    return x >> tl.minimum(s, 63)


@triton.jit
def _bit_length(x):
    """Number of bits of a non-negative int64 (0 for 0): six halving steps."""
    n = tl.zeros_like(x)
    for i in tl.static_range(6):
        big = (x >> (32 >> i)) != 0
        x = tl.where(big, x >> (32 >> i), x)
        n += tl.where(big, 32 >> i, 0)
    return n + (x != 0).to(tl.int64)


@triton.jit
def _raw32(raw, BITS_MASK: tl.constexpr):
    """A 16- or 32-bit pattern (loaded as int16 or int32) in the low bits of an int32."""
    if BITS_MASK == 0xFFFF:
        out = raw.to(tl.int32) & 0xFFFF
    else:
        out = raw.to(tl.int32)
    return out


@triton.jit
def _decode(raw, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr, SHIFT: tl.constexpr):
    """IEEE bits (int64, the pattern in the low bits) -> the value's parts.

    Returns ``(finite, negative, m, p, nan, pinf, ninf, negzero)``: ``finite``
    marks non-zero finite values ``±m·2^(p + unit)`` (``m`` and ``p`` are 0
    elsewhere); the other four mark the special classes.
    """
    e_max: tl.constexpr = (1 << EXP_BITS) - 1
    e = (raw >> FRAC_BITS) & e_max
    frac = raw & ((1 << FRAC_BITS) - 1)
    negative = ((raw >> (EXP_BITS + FRAC_BITS)) & 1) != 0
    special = e == e_max
    zero = (e == 0) & (frac == 0)
    finite = (~special) & (~zero)
    m = tl.where(e == 0, frac, frac | (1 << FRAC_BITS))
    p = tl.where(e == 0, SHIFT, e - 1 + SHIFT)
    m = tl.where(finite, m, 0)
    p = tl.where(finite, p, 0)
    nan = special & (frac != 0)
    pinf = special & (frac == 0) & (~negative)
    ninf = special & (frac == 0) & negative
    negzero = zero & negative
    return finite, negative, m, p, nan, pinf, ninf, negzero


@triton.jit
def _pieces(m, p, negative, WIDE: tl.constexpr):
    """``±m << (p mod 32)`` cut into three 32-bit pieces for limbs ``p // 32`` and up.

    Narrow significands (below 2^24) fill two pieces, wide ones (below 2^53)
    three; every piece is below ``2^33`` in magnitude.
    """
    s = p & 31
    if WIDE:
        low = (m & MASK32) << s
        high = (m >> 32) << s
        a0 = low & MASK32
        a1 = (low >> 32) + (high & MASK32)
        a2 = high >> 32
    else:
        shifted = m << s
        a0 = shifted & MASK32
        a1 = shifted >> 32
        a2 = tl.zeros_like(m)
    sign = tl.where(negative, -1, 1).to(tl.int64)
    return p >> 5, a0 * sign, a1 * sign, a2 * sign


@triton.jit
def _add_pieces(acc, limb, j, a0, a1, a2):
    """Add the pieces of one value a lane (``j``, ``a*``: shape ``(lanes,)``) to the tile."""
    jj = j[None, :]
    return (
        acc
        + tl.where(limb == jj, a0[None, :], 0)
        + tl.where(limb == jj + 1, a1[None, :], 0)
        + tl.where(limb == jj + 2, a2[None, :], 0)
    )


@triton.jit
def _take(acc, n_negzero, n_nan, n_pinf, n_ninf, limb, raw, EXP_BITS: tl.constexpr,
          FRAC_BITS: tl.constexpr, SHIFT: tl.constexpr, WIDE: tl.constexpr):  # fmt: skip
    """One value a lane (its bits ``raw``) added to the tile, or counted if it is special."""
    _finite, negative, m, p, nan, pinf, ninf, negzero = _decode(raw, EXP_BITS, FRAC_BITS, SHIFT)
    j, a0, a1, a2 = _pieces(m, p, negative, WIDE)
    return (
        _add_pieces(acc, limb, j, a0, a1, a2),
        negzero.to(tl.int64) + n_negzero,
        n_nan + nan.to(tl.int64),
        n_pinf + pinf.to(tl.int64),
        n_ninf + ninf.to(tl.int64),
    )


@triton.jit
def _limb(acc, limb, j):
    """Row ``j`` of the tile (``j`` a scalar or one index a lane)."""
    return tl.sum(tl.where(limb == j, acc, 0), axis=0)


@triton.jit
def _carry(acc, limb, L: tl.constexpr):
    """Carry the tile: limbs ``0 .. L-2`` into ``[0, 2^32)``, the top limb signed; same value."""
    for j in range(L - 1):
        c = _limb(acc, limb, j) >> 32
        acc = acc - tl.where(limb == j, c << 32, 0) + tl.where(limb == j + 1, c, 0)
    return acc


# -- rounding --------------------------------------------------------------------------------
@triton.jit
def _encode(m, e, negative, PREC: tl.constexpr, TEXP: tl.constexpr, SUBEXP: tl.constexpr):
    """The IEEE pattern of ``±m·2^e`` (``m`` already rounded to ``PREC`` bits, or ``2^PREC``
    after a carry; ``e >= SUBEXP``); beyond the range ``±inf``; ``m == 0`` a signed zero."""
    hidden: tl.constexpr = 1 << (PREC - 1)
    bias: tl.constexpr = (1 << (TEXP - 1)) - 1
    e_inf: tl.constexpr = (1 << TEXP) - 1
    sign: tl.constexpr = -(1 << (PREC + TEXP - 2)) * 2  # the sign bit, sign-extended
    over = m == (hidden << 1)
    m = tl.where(over, m >> 1, m)
    e = tl.where(over, e + 1, e)
    s = tl.minimum(PREC - _bit_length(m), e - SUBEXP)
    s = tl.maximum(s, 0)
    m = _shl(m, s)
    e = e - s
    e_field = e + (PREC - 1) + bias
    normal = tl.where(
        e_field >= e_inf, e_inf << (PREC - 1), (e_field << (PREC - 1)) | (m - hidden)
    )
    bits = tl.where(m >= hidden, normal, m)
    return tl.where(negative, bits | sign, bits)


@triton.jit
def _round_tile(
    acc, limb, n_terms, n_not_negzero, n_nan, n_pinf, n_ninf,
    L: tl.constexpr, UNIT: tl.constexpr, PREC: tl.constexpr, TEXP: tl.constexpr,
    SUBEXP: tl.constexpr, NAN_BITS: tl.constexpr,
):  # fmt: skip
    """Round every lane's exact sum (limb tile and counters) once, to nearest-even.

    The host's :func:`bitfold.kernels.ieee.round_row`, lane-parallel: any NaN,
    or ``+inf`` with ``-inf``, gives the canonical NaN; one infinity that
    infinity; an empty bucket or a zero sum ``+0.0``, ``-0.0`` when every term
    is ``-0.0``; a sum beyond the range ``±inf``; a tiny non-zero sum keeps its
    sign. Returns the result's bit pattern, int64.
    """
    sign: tl.constexpr = -(1 << (PREC + TEXP - 2)) * 2  # the sign bit, sign-extended
    e_inf: tl.constexpr = (1 << TEXP) - 1
    inf_bits: tl.constexpr = e_inf << (PREC - 1)
    acc = _carry(acc, limb, L)
    negative = _limb(acc, limb, L - 1) < 0
    acc = tl.where(negative[None, :], -acc, acc)
    acc = _carry(acc, limb, L)
    nonzero = acc != 0
    top = tl.max(tl.where(nonzero, limb, -1), axis=0)
    bitlen = 32 * top + _bit_length(_limb(acc, limb, top[None, :]))
    q = tl.maximum(tl.maximum(bitlen - PREC, SUBEXP - UNIT), 0)
    shift = 32 * limb - q[None, :]
    part = tl.where(shift >= 0, _shl(acc, tl.maximum(shift, 0)), _shr(acc, tl.maximum(-shift, 0)))
    m = tl.sum(part, axis=0)
    t = tl.maximum(q - 1, 0)  # the half bit (used where q > 0)
    jt = tl.minimum(t >> 5, L - 1)
    bt = t - 32 * jt
    word = _limb(acc, limb, jt[None, :])
    half = (_shr(word, bt) & 1) == 1
    below = (word & (_shl(tl.full(bt.shape, 1, tl.int64), bt) - 1)) != 0
    below = below | (tl.max(tl.where(nonzero & (limb < jt[None, :]), 1, 0), axis=0) > 0)
    up = (q > 0) & half & (below | ((m & 1) == 1))
    bits = _encode(m + up.to(tl.int64), q + UNIT, negative, PREC, TEXP, SUBEXP)
    zero = tl.where((n_terms > 0) & (n_not_negzero == 0), sign, 0).to(tl.int64)
    bits = tl.where(top < 0, zero, bits)
    bits = tl.where(n_ninf > 0, inf_bits | sign, bits)
    bits = tl.where(n_pinf > 0, inf_bits, bits)
    return tl.where((n_nan > 0) | ((n_pinf > 0) & (n_ninf > 0)), NAN_BITS, bits)


@triton.jit
def _round_float_bits(
    raw, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr,
    PREC: tl.constexpr, TEXP: tl.constexpr, SUBEXP: tl.constexpr, NAN_BITS: tl.constexpr,
):  # fmt: skip
    """A float (its bits) rounded once to a narrower format, nearest-even, integers only."""
    sign: tl.constexpr = -(1 << (PREC + TEXP - 2)) * 2  # the sign bit, sign-extended
    e_inf: tl.constexpr = (1 << TEXP) - 1
    inf_bits: tl.constexpr = e_inf << (PREC - 1)
    bias: tl.constexpr = (1 << (EXP_BITS - 1)) - 1
    finite, negative, m, p, nan, pinf, ninf, negzero = _decode(raw, EXP_BITS, FRAC_BITS, 0)
    e = p - bias - FRAC_BITS + 1  # |v| = m·2^e
    q = tl.maximum(_bit_length(m) - PREC, SUBEXP - e)
    q = tl.maximum(q, 0)
    r = _shr(m, q)
    half = (_shr(m, tl.maximum(q - 1, 0)) & 1) == 1
    below = (m & (_shl(tl.full(m.shape, 1, tl.int64), tl.maximum(q - 1, 0)) - 1)) != 0
    up = (q > 0) & (q < 64) & half & (below | ((r & 1) == 1))
    r = tl.where(q < 64, r, 0) + up.to(tl.int64)
    bits = _encode(r, e + q, negative, PREC, TEXP, SUBEXP)
    bits = tl.where(finite, bits, tl.where(negzero, sign, 0))
    bits = tl.where(pinf, inf_bits, bits)
    bits = tl.where(ninf, inf_bits | sign, bits)
    return tl.where(nan, NAN_BITS, bits)


@triton.jit
def _round_word(
    word, e, n_terms, n_not_negzero, n_nan, n_pinf, n_ninf,
    PREC: tl.constexpr, TEXP: tl.constexpr, SUBEXP: tl.constexpr, NAN_BITS: tl.constexpr,
):  # fmt: skip
    """Round ``word · 2^e`` (a lane's exact sum in one signed int64, ``|word| < 2^62``) once,
    to nearest-even; the counters' rules as :func:`_round_tile`'s. Integers only."""
    sign: tl.constexpr = -(1 << (PREC + TEXP - 2)) * 2  # the sign bit, sign-extended
    e_inf: tl.constexpr = (1 << TEXP) - 1
    inf_bits: tl.constexpr = e_inf << (PREC - 1)
    negative = word < 0
    a = tl.where(negative, -word, word)
    q = tl.maximum(tl.maximum(_bit_length(a) - PREC, SUBEXP - e), 0)
    r = _shr(a, q)
    t = tl.maximum(q - 1, 0)
    half = (_shr(a, t) & 1) == 1
    below = (a & (_shl(tl.full(a.shape, 1, tl.int64), t) - 1)) != 0
    up = (q > 0) & half & (below | ((r & 1) == 1))
    bits = _encode(r + up.to(tl.int64), e + q, negative, PREC, TEXP, SUBEXP)
    zero = tl.where((n_terms > 0) & (n_not_negzero == 0), sign, 0).to(tl.int64)
    bits = tl.where(a == 0, zero, bits)
    bits = tl.where(n_ninf > 0, inf_bits | sign, bits)
    bits = tl.where(n_pinf > 0, inf_bits, bits)
    return tl.where((n_nan > 0) | ((n_pinf > 0) & (n_ninf > 0)), NAN_BITS, bits)


@triton.jit
def _add_word(word, p_lo, hi_key, signs, raw, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr,
              SHIFT: tl.constexpr):  # fmt: skip
    """One float64 value (its pattern ``raw``, int64) added to a lane's word: one pass.

    The word holds the lane's terms so far at the unit ``2^(p_lo + UNIT)``, ``p_lo`` the lowest
    finite non-zero term's shift so far: a term below it first moves the word up to its own
    unit. While the lane's final certificate holds, every shift is below ``p_hi - p_lo < 62``
    and every partial sum below ``2^62``, so the word is exact; a lane it refuses discards its
    word. Shift amounts are taken mod 64 (never a shift by 64 or more); ``m`` is 0 where the
    value is not finite. ``hi_key`` and ``signs`` as :func:`_add_float`'s.
    """
    finite, negative, m, p, _nan, _pinf, _ninf, _negzero = _decode(raw, EXP_BITS, FRAC_BITS,
                                                                   SHIFT)  # fmt: skip
    lo = tl.where(finite, tl.minimum(p_lo, p), p_lo)
    term = m << ((p - lo) & 63)
    word = word << ((p_lo - lo) & 63)
    return (
        word + tl.where(negative, -term, term),
        lo,
        tl.maximum(hi_key, raw & ((1 << (EXP_BITS + FRAC_BITS)) - 1)),
        signs | (raw ^ -(1 << (EXP_BITS + FRAC_BITS))),
    )


@triton.jit
def _as_float64(raw, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr):
    """A float32, bfloat16 or float16 pattern (int32, low bits) as the float64 of its value.

    Widening is exact and keeps subnormals (``cvt.f64.f32`` and ``cvt.f32.f16``, no ``.ftz``):
    every value of these formats is a normal float64.
    """
    if FRAC_BITS == 23:
        out = raw.to(tl.float32, bitcast=True).to(tl.float64)
    elif EXP_BITS == 8:  # bfloat16: the high half of a float32
        out = (raw << 16).to(tl.float32, bitcast=True).to(tl.float64)
    else:
        out = raw.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32).to(tl.float64)
    return out


@triton.jit
def _add_float(total, hi_key, lo_key, signs, raw, EXP_BITS: tl.constexpr,
               FRAC_BITS: tl.constexpr):  # fmt: skip
    """One narrow value (its pattern ``raw``, int32) added to a lane's float64 sum.

    Beside the sum: ``hi_key`` the largest magnitude's bits (an exponent field of all ones:
    a NaN or an infinity), ``lo_key`` the smallest non-zero magnitude's bits less one
    (unsigned: a zero's is ``2^32 - 1``, never the least), ``signs`` the OR of the patterns
    xor ``-0.0``'s (0 while every term is ``-0.0``). A masked load reads ``-0.0``, which
    changes none of the four.
    """
    mag = raw & ((1 << (EXP_BITS + FRAC_BITS)) - 1)
    if EXP_BITS + FRAC_BITS == 31:
        not_negzero = raw ^ -(1 << 31)  # float32's sign bit, an int32's
    else:
        not_negzero = raw ^ (1 << (EXP_BITS + FRAC_BITS))
    return (
        total + _as_float64(raw, EXP_BITS, FRAC_BITS),
        tl.maximum(hi_key, mag),
        tl.minimum(lo_key, (mag - 1).to(tl.uint32, bitcast=True)),
        signs | not_negzero,
    )


@triton.jit
def _fits(terms, span, ROOM: tl.constexpr):
    """``bit_length(terms) + span <= ROOM`` (``0 <= terms < 2^31``): ``terms < 2^(ROOM - span)``,
    a shift and a compare instead of the bit length."""
    room = ROOM - span
    return (room >= 0) & ((terms.to(tl.int32) >> tl.minimum(tl.maximum(room, 0), 31).to(tl.int32))
                          == 0)  # fmt: skip


@triton.jit
def _round_float_sum(
    total, hi_key, lo_key, signs, terms, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr,
    PREC: tl.constexpr, TEXP: tl.constexpr, SUBEXP: tl.constexpr, NAN_BITS: tl.constexpr,
):  # fmt: skip
    """``(fits, bits)`` of a lane's float64 sum of narrow terms (:func:`_add_float`).

    The certificate: no NaN or infinity, and ``bit_length(terms) + (p_hi - p_lo) +
    FRAC_BITS + 1 <= 53`` for the terms' shifts ``p`` (``|v| = m·2^(p + unit)``,
    ``m < 2^(FRAC_BITS + 1)``): every term and partial sum is then an integer multiple of
    ``2^(p_lo + unit)`` below ``2^53`` of them (all normal float64s), so every addition is
    exact in any order and ``total`` is the exact sum. Its one rounding goes from the float64
    bits straight to the output (:func:`_round_float_bits`, integers only; a float64 output is
    the sum itself, a float32 one the hardware's conversion, round to nearest even without
    ``.ftz``); a zero sum is ``+0.0``, or ``-0.0`` when every term is ``-0.0``.
    """
    sign: tl.constexpr = -(1 << (PREC + TEXP - 2)) * 2  # the sign bit, sign-extended
    e_max: tl.constexpr = (1 << EXP_BITS) - 1
    lo_mag = (lo_key + 1).to(tl.int32, bitcast=True)  # 0 where no term is non-zero
    p_hi = tl.maximum(hi_key >> FRAC_BITS, 1)
    p_lo = tl.maximum(lo_mag >> FRAC_BITS, 1)
    span = tl.where(lo_mag == 0, 0, p_hi - p_lo)
    fits = (hi_key < (e_max << FRAC_BITS)) & _fits(terms, span, 53 - (FRAC_BITS + 1))
    sum_bits = total.to(tl.int64, bitcast=True)
    if PREC == 53:
        bits = sum_bits
    elif PREC == 24 and TEXP == 8:  # float32: the conversion rounds once, to nearest even
        bits = total.to(tl.float32).to(tl.int32, bitcast=True).to(tl.int64)
    else:  # float16, bfloat16: straight from the float64 bits (no double rounding)
        bits = _round_float_bits(sum_bits, 11, 52, PREC, TEXP, SUBEXP, NAN_BITS)
    zero = tl.where((terms > 0) & (signs == 0), sign, 0).to(tl.int64)
    return fits, tl.where((sum_bits << 1) == 0, zero, bits)


# -- exact: lanes ------------------------------------------------------------------------------
@triton.jit
def _lanes(offsets_ptr, K, D, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """This program's lanes: ``(column, live, bucket, its run's start, its count)`` a lane.

    Lane ``i`` is column ``d`` of bucket ``k`` (neighbouring lanes: neighbouring
    columns); lanes past ``K`` or ``D`` are not live and read bucket 0.
    """
    lane = tl.arange(0, BLOCK_K * BLOCK_D)
    k = tl.program_id(0).to(tl.int64) * BLOCK_K + lane // BLOCK_D
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + lane % BLOCK_D
    live = (k < K) & (d < D)
    kc = tl.where(live, k, 0).to(tl.int64)
    lo = tl.load(offsets_ptr + kc, mask=live, other=0)
    count = tl.load(offsets_ptr + kc + 1, mask=live, other=0) - lo
    return d, live, kc, lo, count


@triton.jit
def lanes_kernel(
    bits_ptr, order_ptr, offsets_ptr, init_ptr, out_ptr, K, D, hot_min,
    BITS_MASK: tl.constexpr, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr,
    SHIFT: tl.constexpr, WIDE: tl.constexpr, HAS_INIT: tl.constexpr,
    L: tl.constexpr, L_PAD: tl.constexpr, UNIT: tl.constexpr, PREC: tl.constexpr,
    TEXP: tl.constexpr, SUBEXP: tl.constexpr, NAN_BITS: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, WORD: tl.constexpr,
):  # fmt: skip
    """One lane an output element: its bucket's run summed exactly in registers, rounded once.

    Lanes of buckets with ``hot_min`` positions or more write nothing (the hot
    kernels fold them). ``init`` (bits in the values' format) is one more term.

    With ``WORD``, a lane walks its run once, summing its terms into one word
    and keeping their exponent bounds ``p_lo .. p_hi`` (finite non-zero values;
    ``±m·2^(p + UNIT)``, ``m < 2^(FRAC_BITS + 1)``) and whether any is a NaN or
    an infinity. With ``n`` terms, where ``bit_length(n) + (p_hi - p_lo) +
    FRAC_BITS + 1`` is at most the word's bits (the certificate) every term and
    partial sum is an integer multiple of ``2^(p_lo + UNIT)`` that the word holds
    exactly: float32, bfloat16 and float16 values add their float64 values (53
    bits, :func:`_add_float`; one add a value, no rounding), float64 values one
    shifted integer to an int64 word (62 bits, :func:`_add_word`). One rounding
    follows. Lanes the certificate refuses walk their run again into the limb
    tile; a program whose lanes all hold it never does.
    """
    d, live, kc, lo, count = _lanes(offsets_ptr, K, D, BLOCK_K, BLOCK_D)
    walk = live & (count < hot_min)
    run = tl.where(walk, count, 0)
    limb = tl.arange(0, L_PAD)[:, None]
    zeros = tl.zeros((BLOCK_K * BLOCK_D,), tl.int64)
    n_negzero = zeros
    n_nan = zeros
    n_pinf = zeros
    n_ninf = zeros
    terms = run + HAS_INIT
    word_bits = zeros
    if WORD and WIDE:
        # float64 values: one int64 word a value, its unit and the bounds kept in one pass
        neg0_wide: tl.constexpr = -(1 << (EXP_BITS + FRAC_BITS))  # -0.0's pattern, int64
        p_lo = zeros + (1 << 20)
        hi_key = zeros
        signs = zeros
        word = zeros
        for t in range(0, tl.max(run, axis=0)):
            here = walk & (t < run)
            row = tl.load(order_ptr + tl.where(here, lo + t, 0), mask=here, other=0).to(tl.int64)
            w_raw = tl.load(bits_ptr + row * D + d, mask=here, other=neg0_wide).to(tl.int64)
            word, p_lo, hi_key, signs = _add_word(word, p_lo, hi_key, signs, w_raw, EXP_BITS,
                                                  FRAC_BITS, SHIFT)  # fmt: skip
        if HAS_INIT:
            w_raw = tl.load(init_ptr + kc * D + d, mask=walk, other=neg0_wide).to(tl.int64)
            word, p_lo, hi_key, signs = _add_word(word, p_lo, hi_key, signs, w_raw, EXP_BITS,
                                                  FRAC_BITS, SHIFT)  # fmt: skip
        e_max_wide: tl.constexpr = (1 << EXP_BITS) - 1
        p_hi = tl.maximum(hi_key >> FRAC_BITS, 1) - 1 + SHIFT  # 0 .. where no term is non-zero
        p_lo = tl.maximum(tl.minimum(p_lo, p_hi), 0)
        fits = hi_key < (e_max_wide << FRAC_BITS)  # no NaN or infinity
        fits = fits & _fits(terms, p_hi - p_lo, 62 - (FRAC_BITS + 1))
        word_bits = _round_word(word, p_lo + UNIT, terms, (signs != 0).to(tl.int64), zeros,
                                zeros, zeros, PREC, TEXP, SUBEXP, NAN_BITS)  # fmt: skip
        run = tl.where(fits, 0, run)  # the limbs take the lanes the certificate refused
        walk_limbs = walk & (~fits)
    elif WORD:
        # float32, bfloat16, float16 values: one float64 sum, exact where the certificate
        # holds, and the magnitudes' bounds and the signs of zeros kept in the same pass
        neg0: tl.constexpr = -(1 << (EXP_BITS + FRAC_BITS))  # -0.0, as the loaded integer
        small = tl.zeros((BLOCK_K * BLOCK_D,), tl.int32)
        total = tl.zeros((BLOCK_K * BLOCK_D,), tl.float64)
        hi_key = small
        lo_key = (small - 1).to(tl.uint32, bitcast=True)
        signs = small
        for t in range(0, tl.max(run, axis=0)):
            here = walk & (t < run)
            row = tl.load(order_ptr + tl.where(here, lo + t, 0), mask=here, other=0).to(tl.int64)
            w_raw = _raw32(tl.load(bits_ptr + row * D + d, mask=here, other=neg0), BITS_MASK)
            total, hi_key, lo_key, signs = _add_float(total, hi_key, lo_key, signs, w_raw,
                                                      EXP_BITS, FRAC_BITS)  # fmt: skip
        if HAS_INIT:
            w_raw = _raw32(tl.load(init_ptr + kc * D + d, mask=walk, other=neg0), BITS_MASK)
            total, hi_key, lo_key, signs = _add_float(total, hi_key, lo_key, signs, w_raw,
                                                      EXP_BITS, FRAC_BITS)  # fmt: skip
        fits, word_bits = _round_float_sum(total, hi_key, lo_key, signs, terms, EXP_BITS,
                                           FRAC_BITS, PREC, TEXP, SUBEXP, NAN_BITS)  # fmt: skip
        run = tl.where(fits, 0, run)  # the limbs take the lanes the certificate refused
        walk_limbs = walk & (~fits)
    else:
        fits = zeros != 0
        walk_limbs = walk
    # the word's results now (nothing of theirs stays live across the limbs); every lane's
    # element is written once: by the word where its certificate holds, else by the limbs
    dest = out_ptr + kc * D + d
    tl.store(dest, word_bits.to(out_ptr.dtype.element_ty), mask=walk & fits)
    # the limbs, their carries and their rounding only in a program with a lane that needs them
    if tl.max(walk_limbs.to(tl.int32), axis=0) > 0:
        acc = tl.zeros((L_PAD, BLOCK_K * BLOCK_D), tl.int64)
        for t in range(0, tl.max(run, axis=0)):
            here = walk & (t < run)
            row = tl.load(order_ptr + tl.where(here, lo + t, 0), mask=here,
                          other=0).to(tl.int64)  # fmt: skip
            raw = tl.load(bits_ptr + row * D + d, mask=here, other=0).to(tl.int64) & BITS_MASK
            acc, n_negzero, n_nan, n_pinf, n_ninf = _take(
                acc, n_negzero, n_nan, n_pinf, n_ninf, limb, raw, EXP_BITS, FRAC_BITS, SHIFT,
                WIDE)
        if HAS_INIT:
            raw = tl.load(init_ptr + kc * D + d, mask=walk_limbs, other=0).to(tl.int64)
            acc, n_negzero, n_nan, n_pinf, n_ninf = _take(
                acc, n_negzero, n_nan, n_pinf, n_ninf, limb, raw & BITS_MASK, EXP_BITS,
                FRAC_BITS, SHIFT, WIDE)
        tile_bits = _round_tile(acc, limb, terms, terms - n_negzero, n_nan, n_pinf, n_ninf,
                                L, UNIT, PREC, TEXP, SUBEXP, NAN_BITS)  # fmt: skip
        tl.store(dest, tile_bits.to(out_ptr.dtype.element_ty), mask=walk_limbs)


@triton.jit
def _count_specials(n_negzero, n_nan, n_pinf, n_ninf, nan, pinf, ninf, negzero):
    """A tile's special values counted a column (``(BLOCK_N, BLOCK_D)`` flags summed over
    axis 0), only in a tile that holds one: most tiles skip the four sums."""
    odd = nan | pinf | ninf | negzero
    if tl.max(odd.to(tl.int32), axis=None) > 0:
        n_negzero += tl.sum(negzero.to(tl.int64), axis=0)
        n_nan += tl.sum(nan.to(tl.int64), axis=0)
        n_pinf += tl.sum(pinf.to(tl.int64), axis=0)
        n_ninf += tl.sum(ninf.to(tl.int64), axis=0)
    return n_negzero, n_nan, n_pinf, n_ninf


# -- exact: hot buckets ------------------------------------------------------------------------
@triton.jit
def hot_kernel(
    bits_ptr, order_ptr, chunk_ptr, state_ptr, D,
    BITS_MASK: tl.constexpr, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr,
    SHIFT: tl.constexpr, WIDE: tl.constexpr, L: tl.constexpr, L_PAD: tl.constexpr,
    W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """One program a chunk of one hot bucket's run: summed exactly, merged into its state row.

    ``chunk_ptr`` holds ``(row, start, end)`` a chunk: the state row of the
    bucket (its rank among the hot buckets) and the chunk's range of the sorted
    order. The program reads ``BLOCK_N`` positions at a time (rows whole),
    adds their pieces limb by limb over the limbs they touch, carries its tile
    and adds it to ``state[row]`` with 64-bit integer atomics. Term counts are
    not added (the rounding adds the plan's counts).
    """
    c = tl.program_id(0).to(tl.int64)
    hot = tl.load(chunk_ptr + 3 * c).to(tl.int64)
    start = tl.load(chunk_ptr + 3 * c + 1).to(tl.int64)
    end = tl.load(chunk_ptr + 3 * c + 2).to(tl.int64)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    dlive = d < D
    limb = tl.arange(0, L_PAD)[:, None]
    acc = tl.zeros((L_PAD, BLOCK_D), tl.int64)
    n_negzero = tl.zeros((BLOCK_D,), tl.int64)
    n_nan = tl.zeros((BLOCK_D,), tl.int64)
    n_pinf = tl.zeros((BLOCK_D,), tl.int64)
    n_ninf = tl.zeros((BLOCK_D,), tl.int64)
    for s in range(start, end, BLOCK_N):
        t = s + tl.arange(0, BLOCK_N)
        tlive = t < end
        row = tl.load(order_ptr + tl.where(tlive, t, 0), mask=tlive, other=0).to(tl.int64)
        here = tlive[:, None] & dlive[None, :]
        raw = tl.load(bits_ptr + row[:, None] * D + d[None, :], mask=here, other=0)
        if WIDE:
            raw = raw.to(tl.int64) & BITS_MASK
            finite, negative, m, p, nan, pinf, ninf, negzero = _decode(raw, EXP_BITS, FRAC_BITS,
                                                                       SHIFT)  # fmt: skip
            n_negzero, n_nan, n_pinf, n_ninf = _count_specials(
                n_negzero, n_nan, n_pinf, n_ninf, nan, pinf, ninf, negzero)
            j, a0, a1, a2 = _pieces(m, p, negative, WIDE)
            j_lo = tl.min(tl.where(finite, j, L), axis=None)
            j_hi = tl.max(tl.where(finite, j, -3), axis=None)
            for jj in range(j_lo, j_hi + 3):
                part = tl.where(j == jj, a0, 0) + tl.where(j + 1 == jj, a1, 0)
                part += tl.where(j + 2 == jj, a2, 0)
                acc += tl.where(limb == jj, tl.sum(part, axis=0)[None, :], 0)
        else:
            # narrow values in 32-bit integers: one signed word ±m << (p mod 32) (below 2^56)
            # a value, cut into its low 32 bits (limb p // 32) and the signed rest (the next)
            raw = _raw32(raw, BITS_MASK)
            finite, negative, m, p, nan, pinf, ninf, negzero = _decode(raw, EXP_BITS, FRAC_BITS,
                                                                       SHIFT)  # fmt: skip
            n_negzero, n_nan, n_pinf, n_ninf = _count_specials(
                n_negzero, n_nan, n_pinf, n_ninf, nan, pinf, ninf, negzero)
            w = m.to(tl.int64) << (p & 31)
            w = tl.where(negative, -w, w)
            j = p >> 5
            j_lo = tl.min(tl.where(finite, j, L), axis=None)
            j_hi = tl.max(tl.where(finite, j, -2), axis=None)
            for jj in range(j_lo, j_hi + 2):
                part = tl.where(j == jj, w & MASK32, tl.where(j + 1 == jj, w >> 32, 0))
                acc += tl.where(limb == jj, tl.sum(part, axis=0)[None, :], 0)
    acc = _carry(acc, limb, L)
    base = (hot * D + d) * W
    for j in range(L):
        v = _limb(acc, limb, j)
        tl.atomic_add(state_ptr + base + j, v, mask=dlive & (v != 0), sem="relaxed")
    tl.atomic_add(state_ptr + base + L + 1, -n_negzero, mask=dlive & (n_negzero != 0),
                  sem="relaxed")  # fmt: skip
    tl.atomic_add(state_ptr + base + L + 2, n_nan, mask=dlive & (n_nan != 0), sem="relaxed")
    tl.atomic_add(state_ptr + base + L + 3, n_pinf, mask=dlive & (n_pinf != 0), sem="relaxed")
    tl.atomic_add(state_ptr + base + L + 4, n_ninf, mask=dlive & (n_ninf != 0), sem="relaxed")


@triton.jit
def round_rows_kernel(
    state_ptr, out_ptr, target_ptr, terms_ptr, init_ptr, R, D,
    BITS_MASK: tl.constexpr, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr,
    SHIFT: tl.constexpr, WIDE: tl.constexpr, HAS_TARGET: tl.constexpr,
    HAS_TERMS: tl.constexpr, HAS_INIT: tl.constexpr,
    L: tl.constexpr, L_PAD: tl.constexpr, W: tl.constexpr, UNIT: tl.constexpr,
    PREC: tl.constexpr, TEXP: tl.constexpr, SUBEXP: tl.constexpr, NAN_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """Round ``R`` state rows once each (read only): row ``r`` is element ``r`` of the result.

    With ``HAS_TARGET``, row ``r`` is column ``r % D`` of bucket
    ``target[r // D]`` (the hot buckets of a fold), which it is written to;
    ``HAS_TERMS`` adds that bucket's count ``terms[r // D]`` to ``n_terms`` and
    ``n_not_negzero``; ``HAS_INIT`` adds the bucket's ``init`` element as one
    more term.
    """
    r = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = r < R
    rc = tl.where(live, r, 0).to(tl.int64)
    limb = tl.arange(0, L_PAD)[:, None]
    acc = tl.load(state_ptr + rc[None, :] * W + limb, mask=live[None, :] & (limb < L), other=0)
    n_terms = tl.load(state_ptr + rc * W + L, mask=live, other=0)
    n_not_negzero = tl.load(state_ptr + rc * W + L + 1, mask=live, other=0)
    n_nan = tl.load(state_ptr + rc * W + L + 2, mask=live, other=0)
    n_pinf = tl.load(state_ptr + rc * W + L + 3, mask=live, other=0)
    n_ninf = tl.load(state_ptr + rc * W + L + 4, mask=live, other=0)
    dest = rc
    if HAS_TARGET:
        k = tl.load(target_ptr + rc // D, mask=live, other=0).to(tl.int64)
        dest = k * D + rc % D
        if HAS_TERMS:
            extra = tl.load(terms_ptr + k, mask=live, other=0).to(tl.int64)
            n_terms += extra
            n_not_negzero += extra
    if HAS_INIT:
        raw = tl.load(init_ptr + dest, mask=live, other=0).to(tl.int64) & BITS_MASK
        acc, negzero, n_nan, n_pinf, n_ninf = _take(
            acc, tl.zeros_like(n_terms), n_nan, n_pinf, n_ninf, limb, raw, EXP_BITS, FRAC_BITS,
            SHIFT, WIDE)
        n_terms += 1
        n_not_negzero += 1 - negzero
    bits = _round_tile(acc, limb, n_terms, n_not_negzero, n_nan, n_pinf, n_ninf,
                       L, UNIT, PREC, TEXP, SUBEXP, NAN_BITS)  # fmt: skip
    tl.store(out_ptr + dest, bits.to(out_ptr.dtype.element_ty), mask=live)


# -- exact: values into a state, in position order ---------------------------------------------
@triton.jit
def scatter_kernel(
    bits_ptr, index_ptr, state_ptr, N, D,
    BITS_MASK: tl.constexpr, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr,
    SHIFT: tl.constexpr, WIDE: tl.constexpr, L: tl.constexpr, W: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Add values ``(N, D)`` into state rows ``index[i] * D + d`` with 64-bit integer atomics.

    Pieces into limbs, ``-1`` to ``n_not_negzero`` a ``-0.0`` and the special
    counters; term counts are the caller's. Order-free: the same state in any
    schedule. At most :data:`MAX_RUN` values a launch reach one row.
    """
    i = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    here = (i < N)[:, None] & (d < D)[None, :]
    ic = tl.where(i < N, i, 0).to(tl.int64)
    k = tl.load(index_ptr + ic, mask=i < N, other=0).to(tl.int64)
    raw = tl.load(bits_ptr + ic[:, None] * D + d[None, :], mask=here, other=0)
    raw = raw.to(tl.int64) & BITS_MASK
    finite, negative, m, p, nan, pinf, ninf, negzero = _decode(raw, EXP_BITS, FRAC_BITS, SHIFT)
    j, a0, a1, a2 = _pieces(m, p, negative, WIDE)
    base = (k[:, None] * D + d[None, :]) * W
    tl.atomic_add(state_ptr + base + j, a0, mask=here & finite & (a0 != 0), sem="relaxed")
    tl.atomic_add(state_ptr + base + j + 1, a1, mask=here & finite & (a1 != 0), sem="relaxed")
    if WIDE:
        tl.atomic_add(state_ptr + base + j + 2, a2, mask=here & finite & (a2 != 0), sem="relaxed")
    minus = tl.full(a0.shape, -1, tl.int64)
    one = tl.full(a0.shape, 1, tl.int64)
    tl.atomic_add(state_ptr + base + L + 1, minus, mask=here & negzero, sem="relaxed")
    tl.atomic_add(state_ptr + base + L + 2, one, mask=here & nan, sem="relaxed")
    tl.atomic_add(state_ptr + base + L + 3, one, mask=here & pinf, sem="relaxed")
    tl.atomic_add(state_ptr + base + L + 4, one, mask=here & ninf, sem="relaxed")


# -- ordered -----------------------------------------------------------------------------------
@triton.jit
def ordered_kernel(
    values_ptr, order_ptr, offsets_ptr, out_ptr, K, D,
    NARROW: tl.constexpr, WIDE_ACC: tl.constexpr, VAL_NARROW: tl.constexpr,
    PREC: tl.constexpr, TEXP: tl.constexpr, SUBEXP: tl.constexpr, NAN_BITS: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """``acc = +0.0; acc = out(acc + out(v))`` over each bucket's run in increasing position.

    ``values`` are float32 (float16 and bfloat16 values are widened exactly by
    the caller) or float64. ``WIDE_ACC``: float64 output, float64 adds.
    ``NARROW``: float16/bfloat16 output; the sum of two output values is formed
    in float32 and rounded to the output with integer operations.
    ``VAL_NARROW``: float64 values with a narrower output: each value is
    rounded once to the output, by the hardware conversion for float32 and by
    :func:`_round_float_bits` from its float64 bits for the narrow ones. The result is
    written as float bits (float32/float64) or as the narrow pattern (int16);
    NaN results as the canonical NaN.
    """
    d, live, kc, lo, count = _lanes(offsets_ptr, K, D, BLOCK_K, BLOCK_D)
    run = tl.where(live, count, 0)
    if WIDE_ACC:
        acc = tl.zeros((BLOCK_K * BLOCK_D,), tl.float64)
    else:
        acc = tl.zeros((BLOCK_K * BLOCK_D,), tl.float32)
    for t in range(0, tl.max(run, axis=0)):
        here = t < run
        row = tl.load(order_ptr + tl.where(here, lo + t, 0), mask=here, other=0).to(tl.int64)
        v = tl.load(values_ptr + row * D + d, mask=here, other=0.0)
        if WIDE_ACC:
            total = acc + v.to(tl.float64)
        elif VAL_NARROW:
            v64 = v.to(tl.float64)
            if NARROW:
                vb = _round_float_bits(v64.to(tl.int64, bitcast=True), 11, 52,
                                       PREC, TEXP, SUBEXP, NAN_BITS)  # fmt: skip
                v32 = _widen(vb, PREC, TEXP)
            else:
                v32 = v64.to(tl.float32)
            total = acc + v32
        else:
            v32 = v.to(tl.float32)
            if NARROW:
                v32 = _narrow32(v32, PREC, TEXP, SUBEXP, NAN_BITS)
            total = acc + v32
        if NARROW:
            total = _narrow32(total, PREC, TEXP, SUBEXP, NAN_BITS)
        acc = tl.where(here, total, acc)
    out_bits = acc.to(tl.int64, bitcast=True) if WIDE_ACC else acc.to(tl.int32, bitcast=True)
    out_bits = out_bits.to(tl.int64)
    if WIDE_ACC:
        bits = out_bits
        is_nan = ((bits >> 52) & 0x7FF) == 0x7FF
        is_nan = is_nan & ((bits & ((1 << 52) - 1)) != 0)
    elif NARROW:
        bits = _round_float_bits(out_bits & MASK32, 8, 23, PREC, TEXP, SUBEXP, NAN_BITS)
        is_nan = bits == NAN_BITS
    else:
        bits = out_bits & MASK32
        is_nan = (((bits >> 23) & 0xFF) == 0xFF) & ((bits & 0x7FFFFF) != 0)
    bits = tl.where(is_nan, NAN_BITS, bits)
    tl.store(out_ptr + kc * D + d, bits.to(out_ptr.dtype.element_ty), mask=live)


@triton.jit
def _narrow32(x, PREC: tl.constexpr, TEXP: tl.constexpr, SUBEXP: tl.constexpr,
              NAN_BITS: tl.constexpr):  # fmt: skip
    """A float32 rounded to the narrow output format, as the float32 that holds it (exact)."""
    bits = _round_float_bits(x.to(tl.int32, bitcast=True).to(tl.int64) & MASK32, 8, 23,
                             PREC, TEXP, SUBEXP, NAN_BITS)  # fmt: skip
    return _widen(bits, PREC, TEXP)


@triton.jit
def _widen(bits, PREC: tl.constexpr, TEXP: tl.constexpr):
    """A float16 or bfloat16 pattern (int64) as the float32 of the same value (integers only)."""
    frac_bits: tl.constexpr = PREC - 1
    bias: tl.constexpr = (1 << (TEXP - 1)) - 1
    e_max: tl.constexpr = (1 << TEXP) - 1
    negative = ((bits >> (PREC - 1 + TEXP)) & 1) != 0
    e = (bits >> frac_bits) & e_max
    frac = bits & ((1 << frac_bits) - 1)
    # subnormal: normalise the fraction (float32's range holds every narrow subnormal)
    lead = _bit_length(frac)  # 1 .. frac_bits where e == 0 and frac != 0
    sub_shift = frac_bits + 1 - lead
    e32 = tl.where(e == 0, 1 - bias + 127 - sub_shift, e - bias + 127)
    f32 = tl.where(e == 0, _shl(frac, sub_shift) & ((1 << frac_bits) - 1), frac) << (23 - frac_bits)
    out = (e32 << 23) | f32
    out = tl.where((e == 0) & (frac == 0), 0, out)
    out = tl.where(e == e_max, (0xFF << 23) | (frac << (23 - frac_bits)), out)
    out = tl.where(negative, out | (1 << 31), out)
    return out.to(tl.int32).to(tl.float32, bitcast=True)


def next_power_of_2(n: int) -> int:
    """The smallest power of two at least ``n`` (Triton block shapes are powers of two)."""
    return 1 << max(int(n) - 1, 0).bit_length()


__all__ = [
    "MAX_RUN",
    "hot_kernel",
    "lanes_kernel",
    "next_power_of_2",
    "ordered_kernel",
    "round_rows_kernel",
    "scatter_kernel",
]
