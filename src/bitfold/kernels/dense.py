"""Numba kernels of exact element-wise sums of whole arrays (gradients), and their wire words.

A *dense sum* holds, for every element, the exact sum of every value added to
it: a float64 (``fast``) while that float64 is exact (every addition checked
by :func:`bitfold.kernels.ieee.checked_add`), or, from the first addition that
would round (or a NaN or an infinity), a full state row of integer limbs and
counters (``slow[slow_of[i]]``; ``slow_of[i]`` is -1 while the element is
fast, and ``fast[i]`` NaN once it is not).

On the wire (:mod:`bitfold.distributed`) the elements are cut into blocks; a
block's elements are integer multiples of ``2^lo`` below ``2^hi`` in
magnitude on every rank (both bounds all-reduced first), so each element is
written, in units of ``2^lo``, as

* *narrow* (63 bits): one int64 word;
* *wide* (86 bits): one int64 word of the bits above the lowest 24, and the
  lowest 24 bits in a 32-bit lane of a word shared by two elements (a word and
  a half);
* *wider* (118 bits): two words, bits ``[lo, lo + 56)`` then the rest, signed;
* *full* (anything wider, NaN and infinities): its whole limb row and counters.

Every lane keeps room for the sum over the ranks, so an all-reduce with SUM
of the words is exact.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .ieee import (
    add_bits,
    add_exact_sum,
    bit_length,
    checked_add,
    float_parts,
    normalise,
    round_row,
    round_scaled,
)

#: Bits of the low word of a wider element (the rest, signed, in the high word).
WIDE_LOW_BITS = 56
#: Bits of the low lane of a wide element (two lanes of 32 bits share a word).
LANE_BITS = 24
#: Classes of a block on the wire.
NARROW, WIDE, WIDER, FULL = 0, 1, 2, 3
#: Bounds of an element without bits (a zero): neutral for MIN of lo and MAX of hi.
NO_LO, NO_HI = 1 << 20, -(1 << 20)
#: ``hi`` of an element that met a NaN or an infinity: its block goes FULL.
SPECIAL_HI = 1 << 19
#: Limbs below the value that a division keeps (2^128: far below any rounding position).
QUOTIENT_EXTRA_LIMBS = 4


# -- adding ---------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def add_values(fast, values, bits, slow_of, slow, used, adds, unit, dec, wide):  # pragma: no cover
    """Add ``values`` element-wise, exactly; returns the element to resume from, or -1.

    ``adds`` is how many arrays were added before (the term count of a fast
    element), ``unit`` the limb unit, ``dec = (exp_bits, frac_bits, shift)``
    decodes ``bits``. When ``slow`` has no free row the call stops and
    returns the element to resume from once the caller has grown it.
    """
    L = slow.shape[1] - 5
    for i in range(values.shape[0]):
        s = checked_add(fast[i], np.float64(values[i]))
        if s == s:
            fast[i] = s
            continue
        r = slow_of[i]
        if r < 0:
            r = used[0]
            if r == slow.shape[0]:
                return i
            used[0] += 1
            slow_of[i] = r
            slow[r, :] = 0
            add_exact_sum(slow[r], L, fast[i], adds, unit)
            fast[i] = np.nan
        add_bits(slow[r], L, bits[i], dec[0], dec[1], dec[2], wide)
    return -1


# -- bounds ---------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _trailing_zeros(v):  # pragma: no cover - compiled
    tz = 0
    while (v >> tz) & 1 == 0:
        tz += 1
    return tz


@njit(cache=True, nogil=True)
def magnitude(row, L, mag):  # pragma: no cover - compiled
    """|value| of a limb row into ``mag`` (normalised, non-negative); returns its sign."""
    for j in range(L):
        mag[j] = row[j]
    normalise(mag, L)
    negative = mag[L - 1] < 0
    if negative:
        for j in range(L):
            mag[j] = -mag[j]
        normalise(mag, L)
    return negative


@njit(cache=True, nogil=True)
def element_bounds(x, slow_row, unit, mag):  # pragma: no cover - compiled
    """``(lo, hi)`` of one element: a multiple of ``2^lo`` below ``2^hi`` in magnitude.

    ``slow_row`` is its limb row when ``x`` is NaN (not fast). A zero gives
    ``(NO_LO, NO_HI)``; a NaN or an infinity ``hi = SPECIAL_HI``.
    """
    if x == x:
        _, m, e = float_parts(x)
        if m == 0:
            return NO_LO, NO_HI
        return e + _trailing_zeros(m), e + bit_length(m)
    L = mag.shape[0]
    if slow_row[L + 2] or slow_row[L + 3] or slow_row[L + 4]:
        return NO_LO, SPECIAL_HI
    magnitude(slow_row, L, mag)
    lo = NO_LO
    hi = NO_HI
    for j in range(L):
        if mag[j] != 0:
            lo = unit + 32 * j + _trailing_zeros(mag[j])
            break
    for j in range(L - 1, -1, -1):
        if mag[j] != 0:
            hi = unit + 32 * j + bit_length(mag[j])
            break
    return lo, hi


@njit(cache=True, parallel=True)
def block_bounds(fast, slow_of, slow, block, unit, out):  # pragma: no cover - compiled
    """``out[b] = (-lo, hi)`` over every element of block ``b`` (``block`` elements a block)."""
    n = fast.shape[0]
    L = slow.shape[1] - 5
    for b in prange(out.shape[0]):
        mag = np.empty(L, np.int64)
        lo = NO_LO
        hi = NO_HI
        for i in range(b * block, min(n, (b + 1) * block)):
            r = max(slow_of[i], 0)
            a, z = element_bounds(fast[i], slow[r], unit, mag)
            lo = min(lo, a)
            hi = max(hi, z)
        out[b, 0] = -lo
        out[b, 1] = hi


# -- words ----------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _add_shifted(v, p, w):  # pragma: no cover - compiled
    """Add ``v·2^p`` (``0 <= v < 2^53``; bits below 2^0 are zero) into the 56-bit/rest words."""
    if p < 0:
        v >>= -p
        p = 0
    if p >= WIDE_LOW_BITS:
        w[1] += v << (p - WIDE_LOW_BITS)
    else:
        keep = WIDE_LOW_BITS - p
        w[0] += (v & ((np.int64(1) << keep) - 1)) << p
        w[1] += v >> keep
    w[1] += w[0] >> WIDE_LOW_BITS
    w[0] &= (np.int64(1) << WIDE_LOW_BITS) - 1


@njit(cache=True, nogil=True)
def element_words(x, slow_row, unit, lo, w, mag):  # pragma: no cover - compiled
    """The element's exact value in units of ``2^lo`` as words ``w = (low 56 bits, rest)``."""
    w[0] = 0
    w[1] = 0
    if x == x:
        neg, m, e = float_parts(x)
        _add_shifted(m, e - lo, w)
    else:
        L = mag.shape[0]
        neg = magnitude(slow_row, L, mag)
        for j in range(L):
            if mag[j] != 0:
                _add_shifted(mag[j], unit + 32 * j - lo, w)
    if neg and (w[0] != 0 or w[1] != 0):  # two's complement across the two words
        if w[0] != 0:
            w[0] = (np.int64(1) << WIDE_LOW_BITS) - w[0]
            w[1] = -w[1] - 1
        else:
            w[1] = -w[1]


@njit(cache=True, parallel=True)
def encode(fast, slow_of, slow, adds, unit, block, classes, lo, offsets, words):
    # pragma: no cover - compiled
    """Write every element's words at ``offsets[b]`` + its place in block ``b`` (module doc)."""
    n = fast.shape[0]
    W = slow.shape[1]
    L = W - 5
    for b in prange(classes.shape[0]):
        mag = np.empty(L, np.int64)
        row = np.empty(W, np.int64)
        w = np.empty(2, np.int64)
        pos = offsets[b]
        count = min(n, (b + 1) * block) - b * block
        for i in range(b * block, min(n, (b + 1) * block)):
            r = max(slow_of[i], 0)
            if classes[b] == FULL:
                if fast[i] == fast[i]:
                    row[:] = 0
                    add_exact_sum(row, L, fast[i], adds, unit)
                    words[pos : pos + W] = row
                else:
                    words[pos : pos + W] = slow[r]
                pos += W
                continue
            element_words(fast[i], slow[r], unit, lo[b], w, mag)
            if classes[b] == WIDER:
                words[pos] = w[0]
                words[pos + 1] = w[1]
                pos += 2
            elif classes[b] == WIDE:  # high bits in its own word, 24 low bits in a shared lane
                j = i - b * block
                words[pos] = (w[0] >> LANE_BITS) + (w[1] << (WIDE_LOW_BITS - LANE_BITS))
                lane = w[0] & ((np.int64(1) << LANE_BITS) - 1)
                words[offsets[b] + count + j // 2] += lane << (32 * (j % 2))
                pos += 1
            else:
                words[pos] = (w[1] << WIDE_LOW_BITS) + w[0]
                pos += 1


@njit(cache=True, nogil=True)
def negzero_flags(fast, slow_of, slow, out):  # pragma: no cover - compiled
    """``out[i] = 1`` when every term of element i was -0.0 (or it had none), else 0."""
    L = slow.shape[1] - 5
    for i in range(fast.shape[0]):
        if fast[i] == fast[i]:
            out[i] = 1 if (fast[i] == 0.0 and np.signbit(fast[i])) else 0
        else:
            out[i] = 1 if slow[slow_of[i], L + 1] == 0 else 0


# -- rounding the reduced words -------------------------------------------------------------------
@njit(cache=True, nogil=True)
def divide_row(row, L, n, dst, mag):  # pragma: no cover - compiled
    """``dst`` := the value of ``row`` divided by ``n``, with :data:`QUOTIENT_EXTRA_LIMBS` more.

    ``dst`` has ``L + QUOTIENT_EXTRA_LIMBS`` limbs (its unit that many limbs
    lower) and the row's five counters; a non-zero remainder sets the lowest
    bit, far below any rounding position, so rounding ``dst`` once gives the
    correctly rounded quotient. ``0 < n < 2^31``.
    """
    E = QUOTIENT_EXTRA_LIMBS
    negative = magnitude(row, L, mag)
    rem = np.int64(0)
    for j in range(L + E - 1, -1, -1):
        limb = mag[j - E] if j >= E else np.int64(0)
        cur = (rem << 32) | limb
        dst[j] = cur // n
        rem = cur - dst[j] * n
    if rem != 0:
        dst[0] |= 1
    if negative:
        for j in range(L + E):
            dst[j] = -dst[j]
    for c in range(5):
        dst[L + E + c] = row[L + c]


@njit(cache=True, parallel=True)
def decode(words, classes, lo, offsets, block, n, unit, L, negzero, mean_over, start, stop,
           out_bits, target):  # fmt: skip  # pragma: no cover - compiled
    """Round elements ``start .. stop-1`` of the reduced words once into ``out_bits``.

    ``negzero[i]`` (1: every term on every rank was -0.0) signs a zero sum;
    ``mean_over`` > 1 divides the exact sum by it first (one rounding).
    ``target`` as in :func:`bitfold.kernels.buckets.fold_buckets`.
    """
    _, precision, exp_bits, subnormal_exp, nan_bits, out_shift = target
    E = QUOTIENT_EXTRA_LIMBS
    W = L + 5
    for b in prange(start // block, (stop + block - 1) // block):
        row = np.zeros(W + E, np.int64)
        quot = np.zeros(W + E, np.int64)
        mag = np.empty(L + E, np.int64)
        c = classes[b]
        width = W if c == FULL else (2 if c == WIDER else 1)
        count = min(n, (b + 1) * block) - b * block
        for i in range(max(start, b * block), min(stop, (b + 1) * block)):
            j = i - b * block
            pos = offsets[b] + j * width
            if c == FULL:
                rl = L
                row[:W] = words[pos : pos + W]
                u = unit
            else:  # a small row: 32-bit limbs of w0 + w1·2^56, unit 2^lo
                rl = 4
                if c == WIDER:
                    w0 = words[pos]
                    w1 = words[pos + 1]
                elif c == WIDE:  # X = high·2^24 + lane
                    lane = (words[offsets[b] + count + j // 2] >> (32 * (j % 2))) & 0xFFFFFFFF
                    high = words[pos]
                    w0 = lane + ((high & ((1 << 32) - 1)) << LANE_BITS)
                    w1 = high >> 32
                else:
                    w0 = words[pos] & ((1 << WIDE_LOW_BITS) - 1)
                    w1 = words[pos] >> WIDE_LOW_BITS
                if w0 == 0 and w1 == 0:
                    out_bits[i - start] = round_scaled(0, 0, negzero[i], precision, exp_bits,
                                                       subnormal_exp, out_shift)  # fmt: skip
                    continue
                if mean_over == 1 and c == NARROW and abs(words[pos]) < (1 << 62):
                    s = words[pos]
                    out_bits[i - start] = round_scaled(abs(s), lo[b], s < 0, precision, exp_bits,
                                                       subnormal_exp, out_shift)  # fmt: skip
                    continue
                row[0] = w0 & 0xFFFFFFFF  # w0 + w1·2^56 = row[0] + row[1]·2^32 + row[2]·2^64
                row[1] = (w0 >> 32) + ((w1 & 0xFF) << 24)
                row[2] = w1 >> 8
                row[3] = 0
                row[4] = 1  # n_terms
                row[5] = 1  # n_not_negzero (a zero sum was handled above)
                row[6] = 0
                row[7] = 0
                row[8] = 0
                u = lo[b]
            if mean_over == 1:
                out_bits[i - start] = round_row(row, rl, 0, u, precision, exp_bits, subnormal_exp,
                                                nan_bits, out_shift, mag)  # fmt: skip
            else:
                divide_row(row, rl, mean_over, quot, mag)
                out_bits[i - start] = round_row(
                    quot, rl + E, 0, u - 32 * E, precision, exp_bits, subnormal_exp, nan_bits,
                    out_shift, mag,
                )  # fmt: skip


@njit(cache=True)
def zero_elements(words, classes, offsets, block, n, out):  # pragma: no cover - compiled
    """``out[i] = 1`` where element i's reduced words are zero (narrow, wide, wider blocks)."""
    for b in range(classes.shape[0]):
        c = classes[b]
        count = min(n, (b + 1) * block) - b * block
        for j in range(count):
            i = b * block + j
            if c == NARROW:
                out[i] = words[offsets[b] + j] == 0
            elif c == WIDE:
                lane = (words[offsets[b] + count + j // 2] >> (32 * (j % 2))) & 0xFFFFFFFF
                out[i] = words[offsets[b] + j] == 0 and lane == 0
            elif c == WIDER:
                out[i] = words[offsets[b] + 2 * j] == 0 and words[offsets[b] + 2 * j + 1] == 0
            else:
                out[i] = 0


@njit(cache=True, nogil=True)
def merge_sums(fast, slow_of, slow, used, other_fast, other_slow_of, other_slow, adds,
               other_adds, unit):  # fmt: skip  # pragma: no cover - compiled
    """Add another dense sum of the same shape and format into this one; -1 or resume index.

    ``adds`` and ``other_adds`` are the arrays each had taken (the term
    counts of their fast elements).
    """
    L = slow.shape[1] - 5
    W = L + 5
    for i in range(fast.shape[0]):
        x = other_fast[i]
        if x == x and fast[i] == fast[i]:
            s = checked_add(fast[i], x)
            if s == s:
                fast[i] = s
                continue
        r = slow_of[i]
        if r < 0:
            r = used[0]
            if r == slow.shape[0]:
                return i
            used[0] += 1
            slow_of[i] = r
            slow[r, :] = 0
            add_exact_sum(slow[r], L, fast[i], adds, unit)
            fast[i] = np.nan
        if x == x:
            add_exact_sum(slow[r], L, x, other_adds, unit)
        else:
            for j in range(W):
                slow[r, j] += other_slow[other_slow_of[i], j]
    return -1


__all__ = [
    "FULL",
    "LANE_BITS",
    "NARROW",
    "NO_HI",
    "NO_LO",
    "QUOTIENT_EXTRA_LIMBS",
    "SPECIAL_HI",
    "WIDE",
    "WIDER",
    "WIDE_LOW_BITS",
    "add_values",
    "block_bounds",
    "decode",
    "encode",
    "merge_sums",
    "negzero_flags",
    "zero_elements",
]
