"""Triton kernels of the exact all-reduce's wire words: bounds, words and the rounding decode.

The same arithmetic as the host's Numba kernels (:mod:`bitfold.kernels.dense`:
``array_bounds``, ``array_words``, ``decode`` of half, thirds and narrow
blocks) and as :mod:`bitfold.dense_device`'s tensor operations, one pass a
kernel: a program takes ``BLOCKS`` blocks of the wire's ``BLOCK`` elements
(a ``(BLOCKS, BLOCK)`` tile), reads each value's bits once and writes its
block's bounds, its words or its rounded sums. Integer operations only (no
float unit sees a value: subnormals are exact in any mode); every shift is
clamped below 64; every load and store is masked; every offset is int64 (the
program id is widened before it is multiplied: ``b * BLOCK`` passes 2^31 on
large arrays); no atomics (each word is gathered from the elements that feed
it, so no program writes what another does). Launches run under the folds'
device guard (:func:`bitfold.backends.triton.launching`).

Numeric contract: :func:`words_kernel`'s words are the host's words bit for
bit, and :func:`decode_kernel` rounds each element's exact sum ``S·2^lo``
(divided by ``MEAN``) once, to nearest even: the host decode's bits.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton import _bit_length, _shl, _shr

#: Codes of the wire's block classes (:mod:`bitfold.kernels.dense`).
_NARROW = tl.constexpr(0)
_HALF = tl.constexpr(4)
_THIRDS = tl.constexpr(5)
_LANE1 = tl.constexpr(1 << 21)  # lane 1 of a thirds word (21-bit lanes): times 2^21
_LANE2 = tl.constexpr(1 << 42)  # lane 2: times 2^42


@triton.jit
def _parts(raw, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr):
    """A float's bits (int64, the pattern in the low bits) as ``(special, negative, m, e)``:
    the value ``±m·2^e`` unless ``special`` (NaN or infinity)."""
    top: tl.constexpr = (1 << EXP_BITS) - 1
    bias: tl.constexpr = (1 << (EXP_BITS - 1)) - 1
    ef = (raw >> FRAC_BITS) & top
    m = (raw & ((1 << FRAC_BITS) - 1)) | tl.where(ef != 0, 1 << FRAC_BITS, 0)
    e = tl.maximum(ef, 1) - (bias + FRAC_BITS)
    negative = ((raw >> (EXP_BITS + FRAC_BITS)) & 1) != 0
    return ef == top, negative, m, e


@triton.jit
def _load_bits(bits_ptr, at, live, BITS_MASK: tl.constexpr):
    """The bits of elements ``at`` (0 where not ``live``), as int64 holding the pattern."""
    return tl.load(bits_ptr + at, mask=live, other=0).to(tl.int64) & BITS_MASK


@triton.jit
def bounds_kernel(
    bits_ptr, out_ptr, n, blocks,
    EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr, BITS_MASK: tl.constexpr,
    NO_LO: tl.constexpr, NO_HI: tl.constexpr, SPECIAL_HI: tl.constexpr,
    BLOCK: tl.constexpr, BLOCKS: tl.constexpr,
):  # fmt: skip
    """``out[b] = (-lo, hi, -z)`` (int32) of every block ``b`` (the host's array bounds; a block
    with a NaN or an infinity gets ``hi = SPECIAL_HI``)."""
    b = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    j = tl.arange(0, BLOCK)
    at = b[:, None] * BLOCK + j[None, :]
    live = (b[:, None] < blocks) & (at < n)
    raw = _load_bits(bits_ptr, at, live, BITS_MASK)
    special, negative, m, e = _parts(raw, EXP_BITS, FRAC_BITS)
    value = (m != 0) & ~special
    low = e + _bit_length(m & -m) - 1
    top = e + _bit_length(m)
    lo = tl.min(tl.where(value, low, NO_LO), axis=1)
    hi = tl.max(tl.where(value, top, NO_HI), axis=1)
    hi = tl.where(tl.max(special.to(tl.int32), axis=1) > 0, SPECIAL_HI, hi)
    z = tl.max(((m == 0) & negative & ~special).to(tl.int32), axis=1)
    ok = b < blocks
    tl.store(out_ptr + 3 * b, (-lo).to(tl.int32), mask=ok)
    tl.store(out_ptr + 3 * b + 1, hi.to(tl.int32), mask=ok)
    tl.store(out_ptr + 3 * b + 2, -z, mask=ok)


@triton.jit
def _shifted(bits_ptr, at, live, lo, EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr,
             BITS_MASK: tl.constexpr):  # fmt: skip
    """Elements ``at`` as signed integers in units of ``2^lo`` (0 where not ``live``)."""
    raw = _load_bits(bits_ptr, at, live, BITS_MASK)
    _, negative, m, e = _parts(raw, EXP_BITS, FRAC_BITS)
    shift = e - lo
    x = tl.where(shift >= 0, _shl(m, tl.maximum(shift, 0)), _shr(m, tl.maximum(-shift, 0)))
    x = tl.where(live, x, 0)
    return tl.where(negative, -x, x)


@triton.jit
def _block_facts(b, classes_ptr, lo_ptr, offsets_ptr, n, blocks, BLOCK: tl.constexpr):
    """Blocks ``b``'s ``(class, lo, first word, count, a, rw)``, each a ``(BLOCKS, 1)`` column
    (``a``: a thirds block's paired words; ``rw``: the words of its rest, never 0)."""
    ok = b < blocks
    klass = tl.load(classes_ptr + b, mask=ok, other=0)[:, None]
    lo = tl.load(lo_ptr + b, mask=ok, other=0)[:, None]
    base = tl.load(offsets_ptr + b, mask=ok, other=0)[:, None]
    count = tl.where(ok, tl.minimum(n - b * BLOCK, BLOCK), 0)[:, None]
    a = count // 2
    r = count - a + count % 2
    return klass, lo, base, count, a, tl.maximum((r + 2) // 3, 1)


@triton.jit
def _rest_lane(bits_ptr, first, t, a, count, live, lo, split, low_mask, EXP_BITS: tl.constexpr,
               FRAC_BITS: tl.constexpr, BITS_MASK: tl.constexpr):  # fmt: skip
    """Entry ``t`` of a thirds block's rest R: the high part of ``x[a + t]`` while ``a + t`` is
    in the block, then the odd last element's low part, then 0."""
    high = t < count - a
    e = tl.where(high, a + t, count - 1)
    live = live & (t < count - a + count % 2)
    x = _shifted(bits_ptr, first + e, live, lo, EXP_BITS, FRAC_BITS, BITS_MASK)
    return tl.where(live, tl.where(high, x >> split, x & low_mask), 0)


@triton.jit
def words_kernel(
    bits_ptr, classes_ptr, lo_ptr, offsets_ptr, words_ptr, n, blocks, split,
    EXP_BITS: tl.constexpr, FRAC_BITS: tl.constexpr, BITS_MASK: tl.constexpr,
    BLOCK: tl.constexpr, BLOCKS: tl.constexpr,
):  # fmt: skip
    """Every word of every half, thirds or narrow block: word ``k`` of a block gathered from
    the elements that feed it (the host's ``_pack``: half ``x[2k] + x[2k+1]·2^32``; thirds
    word ``k < a`` is (low of ``k``, high of ``k``, low of ``a + k``), the rest three lanes of
    the highs of ``a ..`` and the odd last element's low; narrow ``x[k]``)."""
    b = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    klass, lo, base, count, a, rw = _block_facts(b, classes_ptr, lo_ptr, offsets_ptr, n, blocks,
                                                 BLOCK)  # fmt: skip
    k = tl.arange(0, BLOCK)[None, :]
    first = b[:, None] * BLOCK
    half = klass == _HALF
    thirds = klass == _THIRDS
    words = tl.where(half, (count + 1) // 2, tl.where(thirds, (2 * count + 2) // 3, count))
    slot = k < words
    low_mask = (tl.full(k.shape, 1, tl.int64) << split) - 1
    # narrow: x[k]; half: x[2k] and x[2k+1]
    e0 = tl.where(half, 2 * k, k)
    x0 = _shifted(bits_ptr, first + e0, slot & (e0 < count), lo, EXP_BITS, FRAC_BITS, BITS_MASK)
    e1 = 2 * k + 1
    x1 = _shifted(bits_ptr, first + e1, slot & half & (e1 < count), lo, EXP_BITS, FRAC_BITS,
                  BITS_MASK)  # fmt: skip
    word = x0 + x1 * (1 << 32)
    # thirds, a paired word k < a: x[k] (both lanes) and the low of x[a + k]
    xa = _shifted(bits_ptr, first + a + k, slot & thirds & (k < a), lo, EXP_BITS, FRAC_BITS,
                  BITS_MASK)  # fmt: skip
    paired = (x0 & low_mask) + (x0 >> split) * _LANE1 + (xa & low_mask) * _LANE2
    # thirds, a rest word a + w: lanes t = w, rw + w, 2 rw + w of the rest R
    w = k - a
    rest = _rest_lane(bits_ptr, first, w, a, count, slot & thirds & (k >= a), lo, split,
                      low_mask, EXP_BITS, FRAC_BITS, BITS_MASK)  # fmt: skip
    rest += _LANE1 * _rest_lane(bits_ptr, first, rw + w, a, count, slot & thirds & (k >= a), lo,
                                split, low_mask, EXP_BITS, FRAC_BITS, BITS_MASK)  # fmt: skip
    rest += _LANE2 * _rest_lane(bits_ptr, first, 2 * rw + w, a, count, slot & thirds & (k >= a),
                                lo, split, low_mask, EXP_BITS, FRAC_BITS, BITS_MASK)  # fmt: skip
    word = tl.where(thirds, tl.where(k < a, paired, rest), word)
    tl.store(words_ptr + base + k, word, mask=slot & (b[:, None] < blocks))


@triton.jit
def _sign_extend(t, BITS: tl.constexpr):
    """The low ``BITS`` bits of ``t`` as a signed integer."""
    half: tl.constexpr = 1 << (BITS - 1)
    return ((t & ((1 << BITS) - 1)) ^ half) - half


@triton.jit
def _lane(t, lane):
    """Lane 0, 1 or 2 of reduced thirds words ``t`` (21-bit lanes), recovered from the bottom
    up."""
    x = _sign_extend(t, 21)
    t = (t - x) >> 21
    y = _sign_extend(t, 21)
    z = (t - y) >> 21
    return tl.where(lane == 0, x, tl.where(lane == 1, y, z))


@triton.jit
def decode_kernel(
    words_ptr, classes_ptr, lo_ptr, offsets_ptr, negzero_ptr, out_ptr, n, blocks, split, mean,
    HAS_SIGNS: tl.constexpr, PREC: tl.constexpr, TEXP: tl.constexpr, SUBEXP: tl.constexpr,
    BLOCK: tl.constexpr, BLOCKS: tl.constexpr,
):  # fmt: skip
    """Every element's reduced sum ``S·2^lo`` divided by ``mean``, rounded once to nearest
    even: the output format's bits (``PREC`` bits of precision, ``TEXP`` of exponent, the
    smallest subnormal ``2^SUBEXP``). A zero sum is ``-0.0`` where ``negzero`` says every
    term on every rank was (``HAS_SIGNS``), else ``+0.0``."""
    b = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    klass, lo, base, count, a, rw = _block_facts(b, classes_ptr, lo_ptr, offsets_ptr, n, blocks,
                                                 BLOCK)  # fmt: skip
    j = tl.arange(0, BLOCK)[None, :]
    live = j < count
    at = b[:, None] * BLOCK + j
    half = klass == _HALF
    thirds = klass == _THIRDS
    # narrow: word j; half: a lane of word j // 2; thirds: a low lane and a high one
    paired = j < a
    second = (j >= a) & (j < 2 * a)
    t_high = tl.where(second, j - a, a)
    t_low = a + 1  # the odd last element's low, in the rest
    at_low = tl.where(paired, j, tl.where(second, j - a, a + t_low % rw))
    lane_low = tl.where(paired, 0, tl.where(second, 2, t_low // rw))
    at_high = tl.where(paired, j, a + t_high % rw)
    lane_high = tl.where(paired, 1, t_high // rw)
    first = tl.where(half, j // 2, tl.where(thirds, at_low, j))
    t = tl.load(words_ptr + base + first, mask=live, other=0)
    h = tl.load(words_ptr + base + at_high, mask=live & thirds, other=0)
    half_low = _sign_extend(t, 32)
    s = tl.where(half, tl.where(j % 2 == 1, (t - half_low) >> 32, half_low), t)
    s = tl.where(thirds, _lane(t, lane_low) + _lane(h, lane_high) * (
        tl.full(t.shape, 1, tl.int64) << split), s)  # fmt: skip
    negative = s < 0
    mag = tl.where(negative, -s, s)
    unit = lo + tl.zeros(mag.shape, tl.int64)
    sticky = tl.zeros(mag.shape, tl.int1)
    if mean > 1:  # the quotient's top 62 bits and whether anything is left below them
        shift = 62 - _bit_length(mag)
        scaled = _shl(mag, shift)
        q1 = scaled // mean
        r1 = (scaled - q1 * mean) << 31
        q2 = r1 // mean
        r2 = r1 - q2 * mean
        keep = tl.minimum(tl.maximum(62 - _bit_length(q1), 0), 31)
        drop = 31 - keep
        mag = _shl(q1, keep) | (q2 >> drop)
        sticky = ((q2 - ((q2 >> drop) << drop)) != 0) | (r2 != 0)
        unit = unit - shift - keep
    # round mag·2^unit (and the sticky bits below) to PREC bits, nearest even
    last = tl.maximum(unit + _bit_length(mag) - PREC, SUBEXP)  # the result's last bit
    sh = last - unit
    exact = _shl(mag, tl.maximum(-sh, 0))
    d = tl.minimum(tl.maximum(sh - 1, 0), 63)
    x = mag >> d  # the significand and the guard bit
    sticky = sticky | ((mag - (x << d)) != 0)
    kept = x >> 1
    rounded = kept + ((x & 1) & (sticky.to(tl.int64) | (kept & 1)))
    m = tl.where(sh <= 0, exact, rounded)
    F: tl.constexpr = PREC - 1
    top: tl.constexpr = (1 << TEXP) - 1
    biased = (last - SUBEXP) + (m >> F)
    bits = tl.where(biased >= top, top << F, (tl.minimum(biased, top) << F) | (m & ((1 << F) - 1)))
    zero = (mag == 0) & ~sticky
    bits = tl.where(zero, 0, bits)
    sign_bit: tl.constexpr = -(1 << (PREC + TEXP - 2)) * 2  # the sign bit, sign-extended
    if HAS_SIGNS:
        flag = tl.load(negzero_ptr + at, mask=live, other=0)
        negative = negative | ((s == 0) & (flag != 0))
    bits = tl.where(negative, bits | sign_bit, bits)
    if TEXP == 11:
        tl.store(out_ptr + at, bits, mask=live & (b[:, None] < blocks))
    elif TEXP == 8 and PREC == 24:
        tl.store(out_ptr + at, bits.to(tl.int32), mask=live & (b[:, None] < blocks))
    else:
        tl.store(out_ptr + at, bits.to(tl.int16), mask=live & (b[:, None] < blocks))


__all__ = ["bounds_kernel", "decode_kernel", "words_kernel"]
