"""The narrow path: each output element's own unit, one int64 word a term.

For values of at most 24 significant bits and libraries with int64 words
(torch, CuPy, NumPy, JAX with ``jax_enable_x64``): a max-scatter of every
output element's largest magnitude gives it a unit such that its terms sum
below ``2^63``; one scatter-add of the words and one rounding
(:func:`narrow_fold`). Where an element's terms do not fit one word (a span
of more than about ``63 - 24 - log2(count)`` binary orders), or meet NaN or
infinity, a flag sends the fold to the digit path (:mod:`.digits`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...arrays import ArrayFamily
from ...formats import FLOATS, decode_shift
from .digits import bit_length, round_table
from .terms import NARROW, NARROW_BITS, WRAP, Terms, larger, value_bits


def narrow_applies(dtypes: list[str], int64: bool) -> bool:
    """Whether the narrow path is tried for values of ``dtypes``: int64 words, and significands
    narrow enough to leave a useful span of exponents (float64's 53 bits leave too few)."""
    return int64 and max(FLOATS[d].precision for d in dtypes) <= 24


def _scales_exactly(ops: ArrayFamily, like: Any) -> bool:
    """Whether narrow words are made by a float64 scaling (fast in eager libraries) rather than
    integer shifts: where the library has fast float64 beside the values
    (:meth:`~bitfold.arrays.ArrayFamily.fast_float64`; not Apple's MPS).

    Exact and immune to flush-to-zero: only terms the integer first pass found normal are
    scaled, by a power of two that makes each an integer of at most 63 bits (no term has bits
    below its element's unit), so no subnormal meets the float unit, in or out.
    """
    return ops.fast_float64(like)


def _powers(ops: ArrayFamily, like: Any) -> Any:
    """``2^s`` for ``s`` in ``[0, 63)``, int64 on ``like``'s device (kept per device)."""
    return ops.constant(like, np.left_shift(1, np.arange(NARROW_BITS, dtype=np.int64)))


def narrow_fold(
    terms: Terms, counts: Any, out_name: str, *, scaled: bool | None = None
) -> tuple[Any, Any]:
    """(rounded sums of shape ``terms.shape``, a scalar flag set where they may be wrong).

    ``counts`` (``shape``, int64) are the terms of every output element. Two
    passes over the values, each with one integer scatter (order-free):

    1. a max-scatter of ``magnitude bits << 1 | (term is not -0.0)``: every
       output element's largest magnitude, and whether every term is -0.0.
       The element's unit is ``2^u``, the lowest that keeps ``count`` terms
       below ``2^63``: ``u = top + bit_length(count) - 63`` (``top``: the
       exponent just above the largest term), never below the format's unit;
    2. every term as one int64 word, a multiple of its element's unit, one
       scatter-add, and each sum rounded once (:func:`round_table`, integer
       operations only). Words are the significand shifted as integers, or,
       where the library has float64 on the device (:func:`_scales_exactly`),
       the term times ``2^-u`` in float64, exact for the terms it is used on.

    The flag is set when a term had bits below its element's unit (its
    element spans more than a word holds), an element met NaN or infinity,
    or (float64 scaling) a term is subnormal; the caller then takes the digit
    path. Eager CPU folds take the values in chunks (:meth:`Terms.chunks`). ``scaled`` says how
    words are made: by the float64 scaling (True) or integer shifts (False); None, the
    scaling where :func:`_scales_exactly` says it is exact.
    """
    ops, like, fmt, shape, groups = terms.ops, terms.like, terms.fmt, terms.shape, terms.groups
    word = NARROW.word
    top_exp = ops.zeros(like, shape, word) - 1  # exponent just above the largest term; -1: none
    special = ops.zeros(like, shape, word)
    negzero = None  # every term -0.0 (vacuous for none)
    for index, values, dtype in groups:
        f = FLOATS[dtype]
        sign = -(1 << (f.width - 1))  # -0.0's pattern
        best = ops.zeros(like, shape, word) - 1
        for lo, hi in terms.chunks(index):
            bits, mag = value_bits(ops, values[lo:hi], dtype)
            # magnitude, then one bit: the term is not -0.0 (the max says both at once)
            key = (ops.astype(mag, word) << 1) | ops.astype(bits != sign, word)
            best = ops.scatter_max(best, index[lo:hi], key)
        all_negzero = best <= 0  # -1: no term here
        negzero = all_negzero if negzero is None else negzero & all_negzero
        big, top = best >> 1, (1 << f.exponent_bits) - 1
        special = special | ops.astype(big >= (top << f.fraction_bits), word)
        e = ops.clip(big >> f.fraction_bits, 1, top) + (decode_shift(dtype, fmt) - 1)
        top_exp = larger(ops, top_exp, ops.where(big < 0, -1, e + f.precision))
    headroom = bit_length(ops, ops.clip(counts, 0, (1 << 31) - 1), 32)
    unit = ops.clip(top_exp + headroom - NARROW_BITS, 0, 1 << 20)
    if scaled is None:
        scaled = _scales_exactly(ops, like)
    flags = [ops.amax(special.reshape(-1), 0)]
    sums = ops.zeros(like, shape, word)
    for index, values, dtype in groups:
        f = FLOATS[dtype]
        held = "int32" if f.width <= 32 else "int64"
        if scaled:  # 2^-(u + unit) as float64 bits: every normal term times it is an integer
            scale = ops.bitcast((1023 - fmt.unit_exp - unit) << 52, "float64")
        else:  # s = max(e, 1) + lift: the shift of a term's significand to its element's unit
            lift = ops.astype(decode_shift(dtype, fmt) - 1 - unit, held)
        for lo, hi in terms.chunks(index):
            if hi == lo:
                continue
            at = index[lo:hi]
            bits, mag = value_bits(ops, values[lo:hi], dtype)
            if scaled:
                # a subnormal term would meet the float unit: flagged (integers only)
                wrapped = mag + WRAP  # 0 -> the largest; m >= 1 -> m - 1 - 2^31
                least = ops.astype(ops.amax((~wrapped).reshape(-1), 0), word)  # ~: the least
                flags.append(least + ((1 << f.fraction_bits) - (1 << 31)))  # > 0: m < 2^F
                x = ops.astype(values[lo:hi], "float64") * ops.take(scale, at)
                w = ops.astype(x, word)
                lost = ops.astype(ops.astype(w, "float64") != x, "int32")
            else:
                e = ops.clip(mag >> f.fraction_bits, 1, (1 << f.exponent_bits) - 1)
                mant = mag + ((1 - e) << f.fraction_bits)
                sgn = bits >> (31 if held == "int32" else 63)  # 0 or -1
                mant = ops.astype((mant ^ sgn) - sgn, word)
                s = e + ops.take(lift, at)
                lost = ops.astype((s < 0) & (mag != 0), "int32")
                power = ops.take(_powers(ops, like), ops.clip(s, 0, NARROW_BITS - 1).reshape(-1))
                w = mant * power.reshape(s.shape)
            flags.append(ops.astype(ops.amax(lost.reshape(-1), 0), word))
            sums = ops.scatter_add(sums, at, w)
    bad = ops.amax(ops.stack([ops.astype(g, word).reshape(()) for g in flags], 0), 0) > 0
    flat, c = sums.reshape(-1), counts.reshape(-1)
    zero = flat - flat
    cols = [flat & ((1 << 32) - 1), flat >> 32, c, ops.where(negzero.reshape(-1), 0, c), zero,
            zero, zero]  # fmt: skip
    out = round_table(ops, ops.stack(cols, 1), NARROW, fmt, out_name, shift=unit.reshape(-1))
    return out.reshape(shape), bad
