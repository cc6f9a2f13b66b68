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

import math

import numpy as np
from numba import njit, prange
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

from .compile_lock import one_compiler_at_a_time
from .ieee import (
    add_bits,
    add_exact_sum,
    as_double,
    checked_add,
    magnitude,
    min_normal,
    round_row,
    round_scaled,
)


@njit(cache=True, nogil=True, inline="always")
def _added_exactly(fast, i, x):  # pragma: no cover - compiled
    """``fast[i] += x`` when that float64 addition is exact (:func:`checked_add`): True; else
    False, ``fast[i]`` unchanged (the caller takes the element to its limb row)."""
    s = checked_add(fast[i], x)
    if s == s:
        fast[i] = s
        return True
    return False


#: Bits of the low word of a wider element (the rest, signed, in the high word).
WIDE_LOW_BITS = 56
#: Bits of the low lane of a wide element (two lanes of 32 bits share a word).
LANE_BITS = 24
#: Classes of a block on the wire (HALF: two elements a word; THIRDS: two lanes an element,
#: three lanes a word).
NARROW, WIDE, WIDER, FULL, HALF, THIRDS = 0, 1, 2, 3, 4, 5
#: Bits (sign included) of a half element: its sum over the ranks is a signed 32-bit lane.
HALF_BITS = 32
#: Bits of a lane of a THIRDS element (three a word): its sum over the ranks is signed, below
#: 2^(THIRD_BITS - 1) in magnitude. The element's low ``split = THIRD_BITS - 1 - growth``
#: bits go in one lane (unsigned: their sum stays below 2^(THIRD_BITS - 1)), the rest, signed,
#: in the next.
THIRD_BITS = 21
#: Bounds of an element without bits (a zero): neutral for MIN of lo and MAX of hi.
NO_LO, NO_HI = 1 << 20, -(1 << 20)
#: ``hi`` of an element that met a NaN or an infinity: its block goes FULL.
SPECIAL_HI = 1 << 19
#: The bits of a float64 ``-0.0`` (as int64).
NEGATIVE_ZERO_BITS = np.int64(-(1 << 63))
#: ``hi`` of a block whose bounds an add could not keep (a limb row, the edge of a span):
#: :func:`block_bounds` reads it again. Above every real ``hi``, so merging keeps it.
DIRTY_HI = 1 << 30
#: Independent chunks of blocks a parallel kernel cuts the work into.
CHUNKS = 64
#: Limbs below the value that a division keeps (2^128: far below any rounding position).
QUOTIENT_EXTRA_LIMBS = 4


# -- adding ---------------------------------------------------------------------------------------
@njit(cache=True, nogil=True, inline="always")
def slow_row(i, fast, slow_of, slow, used, adds, unit):  # pragma: no cover - compiled
    """Element i's limb row: its own, or a new one holding its exact float64 sum; -1 if none free.

    ``adds`` is the term count of that float64 sum. A new row turns the
    element slow (``fast[i]`` NaN, ``slow_of[i]`` the row).
    """
    r = slow_of[i]
    if r >= 0:
        return r
    r = used[0]
    if r == slow.shape[0]:
        return -1
    used[0] += 1
    slow_of[i] = r
    slow[r, :] = 0
    add_exact_sum(slow[r], slow.shape[1] - 5, fast[i], adds, unit)
    fast[i] = np.nan
    return r


@njit(cache=True, nogil=True, inline="always")
def _block_parts(v, lo, top, negzero):  # pragma: no cover - compiled
    """A block's bounds widened by a float64 (its bits): lowest bit, biased exponent, -0.0."""
    ef = (v >> 52) & 0x7FF
    m = (v & 0xFFFFFFFFFFFFF) | (np.int64(1) << 52)
    lo = min(lo, NO_LO if ef == 0 else ef - 1075 + _trailing_zeros(m))
    return lo, max(top, ef), negzero | (v == NEGATIVE_ZERO_BITS)


@njit(cache=True, nogil=True, inline="always")
def _subnormals(bits, i0, i1, dec):  # pragma: no cover - compiled
    """Whether ``bits[i0:i1]`` hold a subnormal's (a float unit in denormals-are-zero mode
    would read it as zero: such a block takes the careful path, :func:`as_double`)."""
    all_bits = (np.int64(1) << (dec[0] + dec[1])) - 1
    least = np.int64(all_bits)  # the least magnitude's bits minus one, zeros wrapping above
    at = np.uint64(i0)  # unsigned indices (never negative): the loops here vectorise
    for j in range(i1 - i0):
        least = min(least, ((np.int64(bits[at + np.uint64(j)]) & all_bits) - 1) & all_bits)
    return least < (np.int64(1) << dec[1]) - 1


@njit(cache=True, nogil=True, inline="always")
def _first_block(values, bits, fast, fast_bits, slow_of, k0, k1, offset, dec):
    # pragma: no cover - compiled
    """Elements ``k0 .. k1-1`` of a first add written (``fast``, ``slow_of``) with their bounds
    ``(bad, lo, top, negzero)``; ``bad``: a NaN, an infinity or a subnormal, to write again."""
    at, src, count = np.uint64(k0), np.uint64(k0 - offset), k1 - k0
    for j in range(count):
        fast[at + np.uint64(j)] = np.float64(values[src + np.uint64(j)])
    bad = False
    lo = np.int64(NO_LO)
    top = np.int64(0)  # the largest biased exponent: hi = top - 1022 (0: all zeros)
    negzero = False
    for j in range(count):  # no branch: it vectorises
        v = fast_bits[at + np.uint64(j)]
        bad |= ((v >> 52) & 0x7FF) == 0x7FF
        lo, top, negzero = _block_parts(v, lo, top, negzero)
        slow_of[at + np.uint64(j)] = -1
    return bad | _subnormals(bits, k0 - offset, k1 - offset, dec), lo, top, negzero


@njit(cache=True, nogil=True, inline="always")
def _next_block(values, bits, fast, tmp, k0, k1, offset, dec):  # pragma: no cover - compiled
    """Elements ``k0 .. k1-1`` of a later add, written only when every sum stays an exact
    float64 (``bad`` False), with the bounds of the sums as :func:`_first_block`."""
    at, src, count = np.uint64(k0), np.uint64(k0 - offset), k1 - k0
    for j in range(count):
        u = np.uint64(j)
        tmp[u] = checked_add(fast[at + u], np.float64(values[src + u]))
    tmp_bits = tmp.view(np.int64)
    bad = False
    lo = np.int64(NO_LO)
    top = np.int64(0)
    negzero = False
    for j in range(count):
        v = tmp_bits[np.uint64(j)]
        bad |= ((v >> 52) & 0x7FF) == 0x7FF
        lo, top, negzero = _block_parts(v, lo, top, negzero)
    bad |= _subnormals(bits, k0 - offset, k1 - offset, dec)
    if not bad:
        for j in range(count):
            fast[at + np.uint64(j)] = tmp[np.uint64(j)]
    return bad, lo, top, negzero


@njit(cache=True, nogil=True)
def add_span(fast, slow_of, slow, used, values, bits, offset, i0, i1, adds, unit, dec, wide,
             bounds, block, first, strict, tmp):  # fmt: skip  # pragma: no cover - compiled
    """Add ``values[i0:i1]`` into elements ``offset + i0 ..``, exactly, keeping block bounds.

    ``first``: the sum was empty (``fast`` and ``slow_of`` are written, never
    read; a finite value is its own exact float64, a NaN or an infinity takes a
    limb row). Otherwise ``adds`` arrays were added before (the term count of a
    fast element). ``dec = (exp_bits, frac_bits, shift)`` decodes ``bits``.

    A block (``block`` elements, from element 0) whose elements all stay fast
    is computed into ``tmp`` first and written whole, its bounds with it
    (``bounds[b] = (-lo, hi, -z)`` as :func:`block_bounds` gives them: set when
    the span covers the block, merged when ``first``, else marked
    :data:`DIRTY_HI`). A block that needs a limb row is marked ``DIRTY_HI``
    and added element by element — or, when ``strict``, left untouched and its
    first element returned. Returns -1 when done, or the index (into
    ``values``) to resume from once the caller has grown ``slow``.
    """
    n_all = fast.shape[0]
    L = slow.shape[1] - 5
    fast_bits = fast.view(np.int64)
    i = i0
    while i < i1:
        g = offset + i
        b = g // block
        end = min(i1, (b + 1) * block - offset)
        if first:
            bad, lo, top, negzero = _first_block(values, bits, fast, fast_bits, slow_of,
                                                 offset + i, offset + end, offset, dec)
        else:
            bad, lo, top, negzero = _next_block(values, bits, fast, tmp, offset + i, offset + end,
                                                offset, dec)  # fmt: skip
        if not bad:
            hi = top - 1022 if top else np.int64(NO_HI)
            if g == b * block and end - i == min(block, n_all - g):  # the whole block
                bounds[b, 0] = -lo
                bounds[b, 1] = hi
                bounds[b, 2] = -1 if negzero else 0
            elif first:  # the rest of the block is empty or was written by this add
                bounds[b, 0] = max(bounds[b, 0], -lo)
                bounds[b, 1] = max(bounds[b, 1], hi)
                if negzero:
                    bounds[b, 2] = -1
            else:
                bounds[b, 1] = DIRTY_HI
            i = end
            continue
        if strict:
            return i
        bounds[b, 1] = DIRTY_HI  # a limb row: block_bounds reads the block again
        for j in range(i, end):
            k = offset + j
            x = as_double(values[j], bits[j], dec[0], dec[1])
            if first:
                if x - x == 0.0:
                    fast[k] = x
                    slow_of[k] = -1
                    continue
                fast[k] = -0.0  # no term yet: the new row starts empty
                slow_of[k] = -1
                r = slow_row(k, fast, slow_of, slow, used, 0, unit)
            else:
                if _added_exactly(fast, k, x):
                    continue
                r = slow_row(k, fast, slow_of, slow, used, adds, unit)
            if r < 0:
                return j
            add_bits(slow[r], L, bits[j], dec[0], dec[1], dec[2], wide)
        i = end
    return -1


@njit(cache=True, parallel=True)
def add_blocks(fast, slow_of, slow, used, values, bits, offset, adds, unit, dec, wide, bounds,
               block, first, strict, pending):  # fmt: skip  # pragma: no cover - compiled
    """:func:`add_span` of all of ``values`` in :data:`CHUNKS` chunks of whole blocks, in parallel.

    Strict: no limb row is taken here (``strict`` is True, an argument rather
    than a constant, which would be a type of its own: :func:`add_span` then
    compiles once for this caller and the limb rows' pass). ``pending[c] = (start, stop)``: the
    span of chunk c left for :func:`add_span` (start -1: none), to be run one
    chunk after the other. The chunks never depend on the thread count, and
    neither do the rows' order or any bit.
    """
    n = values.shape[0]
    if n == 0:
        for c in range(CHUNKS):
            pending[c, 0] = -1
        return
    b0 = offset // block
    nb = (offset + n - 1) // block + 1 - b0
    for c in prange(CHUNKS):
        tmp = np.empty(block, np.float64)
        i0 = max(0, (b0 + nb * c // CHUNKS) * block - offset)
        i1 = min(n, (b0 + nb * (c + 1) // CHUNKS) * block - offset)
        pending[c, 0] = add_span(fast, slow_of, slow, used, values, bits, offset, i0, i1, adds,
                                 unit, dec, wide, bounds, block, first, strict, tmp)  # fmt: skip
        pending[c, 1] = i1


# -- bounds ---------------------------------------------------------------------------------------
@njit(cache=True, nogil=True, inline="always")
def _block_span(n, b, block):  # pragma: no cover - compiled
    """Block ``b``'s first element as an unsigned index, and its element count.

    Indexing with ``first + np.uint64(j)`` tells Numba the index is never
    negative: no wrap-around test an element, so the block's loop vectorises
    (about 1.5x the speed of ``range(b * block, ...)``).
    """
    return np.uint64(b * block), min(n - b * block, block)


@njit(cache=True, nogil=True)
def _trailing_zeros(v):  # pragma: no cover - compiled
    """Trailing zero bits of a non-zero int64 (the processor's instruction)."""
    return np.int64(trailing_zeros(v))


@njit(cache=True, nogil=True)
def _bit_length(v):  # pragma: no cover - compiled
    """Bits of a non-negative int64 (the processor's count of leading zeros)."""
    return 64 - np.int64(leading_zeros(v))


@njit(cache=True, nogil=True, inline="always")
def _fast_parts(x):  # pragma: no cover - compiled
    """A float64's bits (int64) as ``(special, M, e)``, value ``±M·2^e`` unless ``special``.

    ``special``: the exponent field is all ones (a NaN: the element is slow). No branch, so
    the loops over a block vectorise.
    """
    ef = (x >> 52) & 0x7FF
    m = (x & 0xFFFFFFFFFFFFF) | (np.int64(ef != 0) << 52)
    return ef == 0x7FF, m, max(ef, np.int64(1)) - 1075


@njit(cache=True, nogil=True)
def _double_parts(b):  # pragma: no cover - compiled
    """A finite float64's bits (int64) as ``(negative, M, e)``, value ``±M·2^e``."""
    _, m, e = _fast_parts(b)
    return b < 0, m, e


@njit(cache=True, nogil=True)
def fast_bounds(x_bits):  # pragma: no cover - compiled
    """``(lo, hi)`` of an exact float64 (its bits): a multiple of ``2^lo`` below ``2^hi``.

    A zero gives ``(NO_LO, NO_HI)``. Scalars only: no array crosses the call.
    """
    _, m, e = _double_parts(x_bits)
    if m == 0:
        return NO_LO, NO_HI
    return e + _trailing_zeros(m), e + _bit_length(m)


@njit(cache=True, nogil=True)
def slow_bounds(row, unit, mag):  # pragma: no cover - compiled
    """``(lo, hi)`` of a limb row; ``hi = SPECIAL_HI`` when it met a NaN or an infinity."""
    L = mag.shape[0]
    if row[L + 2] or row[L + 3] or row[L + 4]:
        return NO_LO, SPECIAL_HI
    magnitude(row, L, mag)
    lo = NO_LO
    hi = NO_HI
    for j in range(L):
        if mag[j] != 0:
            lo = unit + 32 * j + _trailing_zeros(mag[j])
            break
    for j in range(L - 1, -1, -1):
        if mag[j] != 0:
            hi = unit + 32 * j + _bit_length(mag[j])
            break
    return lo, hi


@njit(cache=True, nogil=True, inline="always")
def _block_bound(b, fast, fast_bits, slow_of, slow, block, unit, out, mag):
    # pragma: no cover - compiled
    n = fast.shape[0]
    lo = np.int64(NO_LO)
    hi = np.int64(NO_HI)
    slow_here = False
    negzero = False
    for i in range(b * block, min(n, (b + 1) * block)):
        special, m, e = _fast_parts(fast_bits[i])
        slow_here |= special
        negzero |= fast_bits[i] == NEGATIVE_ZERO_BITS
        lo = min(lo, NO_LO if m == 0 else e + _trailing_zeros(m))
        hi = max(hi, NO_HI if m == 0 else e + _bit_length(m))
    if slow_here:
        lo = np.int64(NO_LO)
        hi = np.int64(NO_HI)
        for i in range(b * block, min(n, (b + 1) * block)):
            if fast[i] == fast[i]:
                a, z = fast_bounds(fast_bits[i])
            else:
                a, z = slow_bounds(slow[slow_of[i]], unit, mag)
            negzero |= all_negative_zero(i, fast_bits, slow_of, slow)
            lo = min(lo, a)
            hi = max(hi, z)
    out[b, 0] = -lo
    out[b, 1] = hi
    out[b, 2] = -1 if negzero else 0


@njit(cache=True, parallel=True)
def block_bounds(fast, slow_of, slow, block, unit, out, only_dirty=False):
    # pragma: no cover - compiled
    """``out[b] = (-lo, hi, -z)`` over every element of block ``b`` (``block`` elements a block).

    ``z`` is 1 when an element of the block may sum to ``-0.0`` (every term this sum took
    was ``-0.0``, or it took none), else 0. A block of fast elements is one branch-free pass;
    a block holding a slow element (its ``fast`` is NaN) is read again element by element.
    ``only_dirty``: only the blocks whose ``hi`` is :data:`DIRTY_HI` (the others were kept
    by the adds, :func:`add_span`).
    """
    L = slow.shape[1] - 5
    fast_bits = fast.view(np.int64)
    B = out.shape[0]
    for c in prange(CHUNKS):
        mag = np.empty(L, np.int64)  # scratch once a chunk of blocks, not once a block
        for b in range(B * c // CHUNKS, B * (c + 1) // CHUNKS):
            if not only_dirty or out[b, 1] == DIRTY_HI:
                _block_bound(b, fast, fast_bits, slow_of, slow, block, unit, out, mag)


@njit(cache=True, nogil=True, inline="always")
def thirds_fit(magnitude_bits, growth):  # pragma: no cover - compiled
    """Whether elements of ``magnitude_bits`` (top minus lowest bit) travel as THIRDS.

    The low lane takes ``split = THIRD_BITS - 1 - growth`` bits: its sum over
    at most ``2^growth`` ranks stays below ``2^(THIRD_BITS - 1)``; the high
    part, below ``2^(magnitude_bits - split)``, sums below ``2^(THIRD_BITS -
    1)`` when ``magnitude_bits <= 2 (THIRD_BITS - 1 - growth)``.
    """
    split = THIRD_BITS - 1 - growth
    return split >= 1 and magnitude_bits <= 2 * split


@njit(cache=True, nogil=True)
def wire_classes(bounds, size, block, growth, limbs, lanes_fit, classes, lo, offsets, signs):
    # pragma: no cover - compiled
    """Every block's class, unit, first word and whether its zero signs travel (one pass).

    ``bounds[b] = (-lo, hi, -z)`` reduced with MAX over the ranks; ``growth``
    bits hold the sum over them; ``lanes_fit``: few enough ranks for the wide
    and wider lanes. See :func:`bitfold.dense.wire_layout`.
    """
    offsets[0] = 0
    for b in range(bounds.shape[0]):
        low = -np.int64(bounds[b, 0])
        hi = np.int64(bounds[b, 1])
        count = min(block, size - block * b)
        if hi == NO_HI:  # no bits: narrow, unit 1
            c = NARROW
            low = 0
        elif hi >= SPECIAL_HI:
            c = FULL
        else:
            bits = hi - low + growth + 1  # magnitude, growth over the ranks, sign
            if bits <= HALF_BITS:
                c = HALF
            elif thirds_fit(hi - low, growth):
                c = THIRDS
            elif bits <= 63:
                c = NARROW
            elif lanes_fit and bits <= LANE_BITS + 62:
                c = WIDE
            elif lanes_fit and bits <= WIDE_LOW_BITS + 62:
                c = WIDER
            else:
                c = FULL
        classes[b] = c
        lo[b] = low
        if c == NARROW:
            words = count
        elif c == HALF:
            words = (count + 1) // 2
        elif c == THIRDS:
            words = (2 * count + 2) // 3
        elif c == WIDE:
            words = count + (count + 1) // 2
        elif c == WIDER:
            words = 2 * count
        else:
            words = count * (limbs + 5)
        offsets[b + 1] = offsets[b] + words
        signs[b] = bounds[b, 2] < 0 and c != FULL


# -- one array, straight from its bits (an exact all-reduce of one array) ------------------------
@njit(cache=True, nogil=True, inline="always")
def _raw_parts(raw, exp_bits, frac_bits):  # pragma: no cover - compiled
    """A float's bits (int64) as ``(special, M, e)``, value ``±M·2^e`` unless ``special``
    (NaN or infinity). Integer operations only: subnormals are read exactly in any mode."""
    ef = (raw >> frac_bits) & ((np.int64(1) << exp_bits) - 1)
    m = (raw & ((np.int64(1) << frac_bits) - 1)) | (np.int64(ef != 0) << frac_bits)
    bias = (np.int64(1) << (exp_bits - 1)) - 1
    return ef == (np.int64(1) << exp_bits) - 1, m, max(ef, np.int64(1)) - bias - frac_bits


@njit(cache=True, parallel=True)
def array_bounds(bits, exp_bits, frac_bits, block, out):  # pragma: no cover - compiled
    """:func:`block_bounds` of a sum that took one array (its bits, float32 or float64);
    returns False, with ``out`` unfinished, when the array holds a NaN or an infinity."""
    n = bits.shape[0]
    B = out.shape[0]
    sign = exp_bits + frac_bits
    magnitude_bits = (np.int64(1) << sign) - 1  # (wraps to all for float64)
    special_in = np.zeros(CHUNKS, np.bool_)
    for c in prange(CHUNKS):
        for b in range(B * c // CHUNKS, B * (c + 1) // CHUNKS):
            first, count = _block_span(n, b, block)
            lo = np.int64(NO_LO)
            hi = np.int64(NO_HI)
            negzero = np.int64(0)  # integer flags, no branch: the loop vectorises
            special_here = np.int64(0)
            for j in range(count):
                raw = np.int64(bits[first + np.uint64(j)])
                special, m, e = _raw_parts(raw, exp_bits, frac_bits)
                special_here |= np.int64(special)
                negzero |= np.int64((raw & magnitude_bits) == 0) & ((raw >> sign) & 1)
                # m | 2^62 and m | 1 are never zero (m < 2^53): no branch before the counts
                low = e + _trailing_zeros(m | (np.int64(1) << 62))
                top = e + _bit_length(m | np.int64(1))
                lo = min(lo, np.int64(NO_LO) if m == 0 else low)
                hi = max(hi, np.int64(NO_HI) if m == 0 else top)
            out[b, 0] = -lo
            out[b, 1] = hi
            out[b, 2] = -1 if negzero else 0
            special_in[c] |= special_here != 0
    return not special_in.any()


@njit(cache=True, nogil=True, inline="always")
def _trailing_zeros32(v):  # pragma: no cover - compiled
    """Trailing zero bits of a non-zero uint32, as ``31 - leading zeros`` of its lowest set bit:
    a vector count of leading zeros exists (AVX-512), a vector count of trailing zeros does not
    (3x the speed in a block's loop)."""
    return np.uint32(31) - np.uint32(leading_zeros(np.uint32(v & np.uint32(np.uint32(0) - v))))


@njit(cache=True, parallel=True)
def array_bounds_narrow(bits, block, out):  # pragma: no cover - compiled
    """:func:`array_bounds` of float32 bits (uint32), in 32-bit lanes: the same bounds.

    ``hi`` is the top of the block's largest magnitude (the top grows with the
    magnitude, and magnitudes order as their bits do), so each element costs a
    maximum; ``lo`` the least ``max(E, 1) + tz(M)`` over the non-zero elements
    (``E`` the exponent field, ``M`` the significand with its hidden bit), both
    less the float32's 150. Every operation is on uint32 lanes with no branch:
    the block's loop vectorises (3.1 ms for 4M float32 on one thread, the int64 loop 9.5).
    """
    n = bits.shape[0]
    B = out.shape[0]
    no_low = np.uint32(0xFFFFFFFF)
    special_in = np.zeros(CHUNKS, np.bool_)
    for c in prange(CHUNKS):
        for b in range(B * c // CHUNKS, B * (c + 1) // CHUNKS):
            first, count = _block_span(n, b, block)
            top = np.uint32(0)
            low = no_low
            flags = np.uint32(0)  # bit 0: a NaN or an infinity; bit 1: a -0.0
            for j in range(count):
                raw = np.uint32(bits[first + np.uint64(j)])
                mag = raw & np.uint32(0x7FFFFFFF)
                top = max(top, mag)
                ef = mag >> np.uint32(23)
                m = (raw & np.uint32(0x7FFFFF)) | (np.uint32(ef != 0) << np.uint32(23))
                here = max(ef, np.uint32(1)) + _trailing_zeros32(m | np.uint32(1 << 31))
                low = min(low, no_low if mag == 0 else here)
                flags |= np.uint32(mag >= np.uint32(0x7F800000)) | (
                    np.uint32(raw == np.uint32(0x80000000)) << np.uint32(1))  # fmt: skip
            hi = np.int64(NO_HI)
            if top != 0:
                ef = np.int64(top >> np.uint32(23))
                m = np.int64(top & np.uint32(0x7FFFFF)) | (np.int64(ef != 0) << 23)
                hi = max(ef, np.int64(1)) - 150 + _bit_length(m)
            out[b, 0] = -(np.int64(NO_LO) if low == no_low else np.int64(low) - 150)
            out[b, 1] = hi
            out[b, 2] = -1 if flags & np.uint32(2) else 0
            special_in[c] |= (flags & np.uint32(1)) != 0
    return not special_in.any()


@njit(cache=True, parallel=True)
def array_words(bits, exp_bits, frac_bits, block, classes, lo, offsets, split, words):
    # pragma: no cover - compiled
    """:func:`encode` of a sum that took one array (its bits, no NaN or infinity), every block
    narrow, half or thirds: one shift an element (then packed)."""
    n = bits.shape[0]
    B = lo.shape[0]
    for c in prange(CHUNKS):
        held, lanes = np.empty(block, np.int64), _lane_scratch(block)  # a packed block's scratch
        for b in range(B * c // CHUNKS, B * (c + 1) // CHUNKS):
            first, count = _block_span(n, b, block)
            if classes[b] == NARROW:  # straight into the words
                _array_shifts(bits, first, count, exp_bits, frac_bits, lo[b], words,
                              np.uint64(offsets[b]))  # fmt: skip
            else:  # into the scratch, then packed
                _array_shifts(bits, first, count, exp_bits, frac_bits, lo[b], held, np.uint64(0))
                _pack(held, lanes, count, words, offsets[b], classes[b], split)


@njit(cache=True, nogil=True)
def _array_shifts(bits, first, count, exp_bits, frac_bits, low, dst, at):
    # pragma: no cover - compiled
    """``dst[at + j]``: element ``first + j``'s bits as an integer in units of ``2^low``.

    A function of its own (not inlined into the parallel loop), with one destination: a vector
    loop."""
    for j in range(count):
        raw = np.int64(bits[first + np.uint64(j)])
        _, m, e = _raw_parts(raw, exp_bits, frac_bits)
        shift = e - low  # within (-64, 63) for the non-zero values of a narrow block
        x = m << min(shift, 63) if shift >= 0 else m >> min(-shift, 63)
        dst[at + np.uint64(j)] = -x if (raw >> (exp_bits + frac_bits)) & 1 else x


@njit(cache=True, nogil=True, inline="always")
def _place(held, lanes, count, words, pos, klass, split):  # pragma: no cover - compiled
    """A block's elements ``held[:count]`` into its words from ``pos``: one a word (NARROW),
    else packed (:func:`_pack`)."""
    if klass == NARROW:
        for j in range(count):
            words[pos + j] = held[j]
    else:
        _pack(held, lanes, count, words, pos, klass, split)


@njit(cache=True, nogil=True)  # not inlined: in the parallel loops it would not vectorise
def _pack(held, lanes, count, words, pos, klass, split):  # pragma: no cover - compiled
    """A packed block's elements ``held[:count]`` into its words from ``pos``.

    HALF: ``held[2i] + held[2i+1]·2^32`` a word, each below 2^31 in magnitude
    and so is its sum over the ranks (:data:`HALF_BITS`). THIRDS: element j
    is two lanes, its low ``split`` bits and the rest (with its sign), three
    lanes a word, lane ``k`` of a word times ``2^(THIRD_BITS k)`` (the order
    of the lanes: the comment below); every lane's sum over the ranks stays
    below ``2^(THIRD_BITS - 1)`` (:func:`thirds_fit`). Either way the sum of
    the words holds every lane's sum, recovered exactly from the bottom up
    (:func:`_unpack`).
    """
    if klass == HALF:
        for i in range(count // 2):
            words[pos + i] = held[2 * i] + held[2 * i + 1] * np.int64(1 << 32)
        if count % 2:
            words[pos + count // 2] = held[count - 1]
        return
    # Pairs first: word w < a = count // 2 is (low of w, high of w, low of w + a), three
    # contiguous runs; the rest, R = (highs of a .. count-1, then the low of the last
    # element when count is odd), fill rw = ceil(len(R) / 3) words as three runs of R.
    # Unsigned positions: Numba's negative-index wrap would keep LLVM from vector loops.
    a = np.uint64(count // 2)
    at = np.uint64(pos)
    low = (np.int64(1) << split) - 1
    for w in range(a):
        x, y = held[w], held[a + w]
        words[at + w] = _thirds_word(x & low, x >> split, y & low)
    r, rw = _rest_lanes(count)
    for j in range(np.uint64(count) - a):
        lanes[j] = held[a + j] >> split
    if count % 2:
        lanes[r - 1] = held[count - 1] & low
    for j in range(r, 3 * rw):
        lanes[j] = 0
    for w in range(rw):
        words[at + a + w] = _thirds_word(lanes[w], lanes[rw + w], lanes[2 * rw + w])


@njit(cache=True, nogil=True, inline="always")
def _thirds_word(a, b, c):  # pragma: no cover - compiled
    """Three lanes in one word, ``a + b·2^21 + c·2^42`` (each below 2^20 in magnitude)."""
    return a + (b << THIRD_BITS) + (c << (2 * THIRD_BITS))


@njit(cache=True, nogil=True, inline="always")
def _thirds_lanes(t):  # pragma: no cover - compiled
    """The three lanes of a (reduced) word of :func:`_thirds_word`'s, recovered from the bottom
    up: each sum is below 2^20 in magnitude, so sign-extending its 21 bits gives it."""
    shift = 64 - THIRD_BITS
    a = (t << shift) >> shift
    t = (t - a) >> THIRD_BITS
    b = (t << shift) >> shift
    return a, b, (t - b) >> THIRD_BITS


@njit(cache=True, nogil=True, inline="always")
def _rest_lanes(count):  # pragma: no cover - compiled
    """(lanes, words) of a THIRDS block's rest after its ``count // 2`` paired words."""
    r = np.uint64(count - count // 2 + count % 2)
    return r, (r + np.uint64(2)) // np.uint64(3)


@njit(cache=True, nogil=True, inline="always")
def _lane_scratch(block):  # pragma: no cover - compiled
    """A scratch for the lanes of a THIRDS block of ``block`` elements (3 ceil(2 block / 3))."""
    return np.empty(3 * ((2 * block + 2) // 3), np.int64)


@njit(cache=True, nogil=True)  # not inlined: in the parallel loops it would not vectorise
def _unpack(words, pos, count, held, lanes, klass, split):  # pragma: no cover - compiled
    """The reduced sums of a packed block's elements into ``held[:count]`` (inverse of _pack)."""
    if klass == HALF:
        for i in range((count + 1) // 2):
            t = words[pos + i]
            a = (t << 32) >> 32  # the low lane, sign-extended: |A| < 2^31
            held[2 * i] = a
            if 2 * i + 1 < count:
                held[2 * i + 1] = (t - a) >> 32
        return
    a = np.uint64(count // 2)
    at = np.uint64(pos)
    for w in range(a):
        low, high, next_low = _thirds_lanes(words[at + w])
        held[w] = low + (high << split)
        held[a + w] = next_low  # the low lane of element a + w; its high one below
    r, rw = _rest_lanes(count)
    for w in range(rw):
        lanes[w], lanes[rw + w], lanes[2 * rw + w] = _thirds_lanes(words[at + a + w])
    if count % 2:
        held[count - 1] = lanes[r - 1]
    for j in range(np.uint64(count) - a):
        held[a + j] += lanes[j] << split


# -- words ----------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _split(v, p, w0, w1):  # pragma: no cover - compiled
    """``(w0, w1) + v·2^p`` (``0 <= v < 2^53``; bits below 2^0 are zero), carried."""
    if p < 0:
        v >>= -p
        p = 0
    if p >= WIDE_LOW_BITS:
        w1 += v << (p - WIDE_LOW_BITS)
    else:
        keep = WIDE_LOW_BITS - p
        w0 += (v & ((np.int64(1) << keep) - 1)) << p
        w1 += v >> keep
    w1 += w0 >> WIDE_LOW_BITS
    w0 &= (np.int64(1) << WIDE_LOW_BITS) - 1
    return w0, w1


@njit(cache=True, nogil=True)
def _signed(neg, w0, w1):  # pragma: no cover - compiled
    """Two's complement of ``(w0, w1)`` across the two words when ``neg``."""
    if neg and (w0 != 0 or w1 != 0):
        if w0 != 0:
            return (np.int64(1) << WIDE_LOW_BITS) - w0, -w1 - 1
        return w0, -w1
    return w0, w1


@njit(cache=True, nogil=True)
def fast_words(x_bits, lo):  # pragma: no cover - compiled
    """An exact float64 (its bits) in units of ``2^lo`` as ``(low 56 bits, rest)``."""
    neg, m, e = _double_parts(x_bits)
    w0, w1 = _split(m, e - lo, np.int64(0), np.int64(0))
    return _signed(neg, w0, w1)


@njit(cache=True, nogil=True)
def slow_words(row, unit, lo, mag):  # pragma: no cover - compiled
    """A limb row's value in units of ``2^lo`` as ``(low 56 bits, rest)``."""
    L = mag.shape[0]
    neg = magnitude(row, L, mag)
    w0 = np.int64(0)
    w1 = np.int64(0)
    for j in range(L):
        if mag[j] != 0:
            w0, w1 = _split(mag[j], unit + 32 * j - lo, w0, w1)
    return _signed(neg, w0, w1)


@njit(cache=True, nogil=True, inline="always")
def _encode_block(b, fast, fast_bits, slow_of, slow, adds, unit, block, classes, lo, offsets,
                  split, words, mag, row, held, lanes):  # fmt: skip  # pragma: no cover
    n = fast.shape[0]
    W = slow.shape[1]
    L = W - 5
    pos = offsets[b]
    first, count = _block_span(n, b, block)
    if classes[b] == NARROW or classes[b] == HALF or classes[b] == THIRDS:  # one shift each
        slow_here = np.int64(0)
        low = lo[b]
        for j in range(count):  # into the scratch, then placed: one vector loop
            raw = fast_bits[first + np.uint64(j)]
            special, m, e = _fast_parts(raw)
            slow_here |= np.int64(special)
            shift = e - low  # within (-64, 63) for the non-zero values of a narrow block
            x = m << min(shift, 63) if shift >= 0 else m >> min(-shift, 63)
            held[np.uint64(j)] = -x if raw < 0 else x
        if slow_here:
            for j in range(count):
                i = b * block + j
                if fast[i] != fast[i]:
                    w0, w1 = slow_words(slow[slow_of[i]], unit, lo[b], mag)
                    held[j] = (w1 << WIDE_LOW_BITS) + w0
        _place(held, lanes, count, words, pos, classes[b], split)
        return
    if classes[b] == WIDE:  # the shared lanes are added into: zero them (``words`` is not)
        for j in range((count + 1) // 2):
            words[offsets[b] + count + j] = 0
    for i in range(b * block, b * block + count):
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
        if fast[i] == fast[i]:
            w0, w1 = fast_words(fast_bits[i], lo[b])
        else:
            w0, w1 = slow_words(slow[r], unit, lo[b], mag)
        if classes[b] == WIDER:
            words[pos] = w0
            words[pos + 1] = w1
            pos += 2
        elif classes[b] == WIDE:  # high bits in its own word, 24 low bits in a shared lane
            j = i - b * block
            words[pos] = (w0 >> LANE_BITS) + (w1 << (WIDE_LOW_BITS - LANE_BITS))
            lane = w0 & ((np.int64(1) << LANE_BITS) - 1)
            words[offsets[b] + count + j // 2] += lane << (32 * (j % 2))
            pos += 1


@njit(cache=True, parallel=True)
def encode(fast, slow_of, slow, adds, unit, block, classes, lo, offsets, split, words):
    # pragma: no cover - compiled
    """Write every element's words at ``offsets[b]`` + its place in block ``b`` (module doc)."""
    W = slow.shape[1]
    fast_bits = fast.view(np.int64)
    B = classes.shape[0]
    for c in prange(CHUNKS):
        mag = np.empty(W - 5, np.int64)  # scratch once a chunk of blocks, not once a block
        row = np.empty(W, np.int64)
        held, lanes = np.empty(block, np.int64), _lane_scratch(block)  # a packed block's scratch
        for b in range(B * c // CHUNKS, B * (c + 1) // CHUNKS):
            _encode_block(b, fast, fast_bits, slow_of, slow, adds, unit, block, classes, lo,
                          offsets, split, words, mag, row, held, lanes)  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def all_negative_zero(i, fast_bits, slow_of, slow):  # pragma: no cover - compiled
    """Whether every term of element i was -0.0 (or it had none): its sum may be ``-0.0``.

    A fast element holds ``-0.0`` itself; a slow one counts its terms that were not.
    """
    if slow_of[i] < 0:
        return fast_bits[i] == NEGATIVE_ZERO_BITS
    L = slow.shape[1] - 5
    return slow[slow_of[i], L + 1] == 0  # the row's count of terms that were not -0.0


@njit(cache=True, nogil=True)
def negzero_flags(fast, slow_of, slow, out):  # pragma: no cover - compiled
    """``out[i] = 1`` when every term of element i was -0.0 (or it had none), else 0."""
    fast_bits = fast.view(np.int64)
    for i in range(fast.shape[0]):
        out[i] = 1 if all_negative_zero(i, fast_bits, slow_of, slow) else 0


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


@njit(cache=True, nogil=True, inline="always")
def _castable_word(w, x, least):  # pragma: no cover - compiled
    """Word ``w`` (float64 ``x`` after its unit) is an exact float64 that casts in any mode."""
    return (abs(w) < (np.int64(1) << 53)) & ((w == 0) | (abs(x) >= least))


@njit(cache=True, nogil=True, inline="always")
def _cast_block(words, base, i0, i1, start, scale, tiny, mean_over, precision, negzero, signs,
                out_f, qs):  # fmt: skip
    # pragma: no cover - compiled
    """Elements ``i0 .. i1-1`` of a narrow block (word ``base + i``, unit ``scale``) rounded by
    the float unit, when that is exact for all of them; returns whether it was (else the
    caller rounds every one of them again with integers: without a mean, the elements are
    written as they are cast, and the caller overwrites them).

    A word ``w`` with ``|w| < 2^53`` is the exact float64 ``x = w·scale`` (zero: ``-0.0``
    where ``negzero`` says every term on every rank was; without ``signs``, ``negzero`` is a
    block of zeros). Without a mean,
    the cast of ``x`` (at least the output's smallest normal ``tiny``) rounds once. With one,
    ``q = fl64(x / mean_over)`` is the correctly rounded quotient; for a float32 output, the
    cast of ``q`` is the correctly rounded quotient unless ``q`` is a float32 midpoint (a
    midpoint between ``q`` and the exact quotient would be a float64 nearer to it than
    ``q``) and ``mean_over`` is not a power of two (those divide exactly); ``q`` at least
    ``2·tiny`` keeps every step normal in any mode.
    """
    least = tiny if mean_over == 1 else 2.0 * tiny
    ok = True
    # unsigned positions: a signed one would keep Numba's negative-index wrap, and LLVM would
    # gather and scatter element by element instead of loading vectors (9.3 -> 6.0 ms for 4M)
    at_word, at_in, at_out = np.uint64(base + i0), np.uint64(i0), np.uint64(i0 - start)
    at_sign = at_in if signs else np.uint64(0)  # a block of zeros, read from its start
    if mean_over == 1:  # written straight to the output: the caller rewrites them unless ok
        for j in range(i1 - i0):
            w = words[at_word + np.uint64(j)]
            x = np.float64(w) * scale
            ok &= _castable_word(w, x, least)
            zero_sign = (w == 0) & (negzero[at_sign + np.uint64(j)] != 0)
            out_f[at_out + np.uint64(j)] = -0.0 if zero_sign else x  # a zero sum: its sign
        return ok
    for j in range(i1 - i0):
        w = words[at_word + np.uint64(j)]
        q = np.float64(w) * scale / mean_over
        ok &= _castable_word(w, q, least)
        zero_sign = (w == 0) & (negzero[at_sign + np.uint64(j)] != 0)
        qs[np.uint64(j)] = -0.0 if zero_sign else q
    if mean_over & (mean_over - 1) and precision < 53:  # a power of two divides exactly
        half = np.int64(1) << (52 - precision)  # the float64 bits of a midpoint below the output's
        below = (half << 1) - 1
        q_bits = qs.view(np.int64)
        for j in range(i1 - i0):
            ok &= (q_bits[np.uint64(j)] & below) != half
    if ok:
        for j in range(i1 - i0):
            out_f[at_out + np.uint64(j)] = qs[np.uint64(j)]
    return ok


@njit(cache=True, nogil=True, inline="always")
def _decode_block(b, words, classes, lo, offsets, split, block, n, unit, L, negzero, signs,
                  mean_over, start, stop, out_f, out_bits, fast, target, row, quot, mag, qs,
                  held, lanes):  # fmt: skip  # pragma: no cover - compiled
    _, precision, exp_bits, subnormal_exp, nan_bits, out_shift = target
    E = QUOTIENT_EXTRA_LIMBS
    W = L + 5
    c = classes[b]
    width = W if c == FULL else (2 if c == WIDER else 1)
    count = min(n, (b + 1) * block) - b * block
    base = offsets[b]  # where the block's words start; a packed block's are unpacked first
    if c == HALF or c == THIRDS:
        _unpack(words, base, count, held, lanes, c, split)
        words = held
        base = 0
        c = NARROW
    # a narrow sum below 2^53 times 2^lo is an exact float64: one cast rounds it
    castable = fast and c == NARROW and -1022 <= lo[b] <= 970
    direct = castable and mean_over == 1
    scale = math.ldexp(1.0, lo[b]) if castable else 1.0
    tiny = min_normal(precision, subnormal_exp)
    if castable and _cast_block(words, base - b * block, max(start, b * block),
                                min(stop, (b + 1) * block), start, scale, tiny, mean_over,
                                precision, negzero, signs, out_f, qs):  # fmt: skip
        return
    for i in range(max(start, b * block), min(stop, (b + 1) * block)):
        j = i - b * block
        pos = base + j * width
        if direct and abs(words[pos]) < (1 << 53) and words[pos] != 0:
            x = np.float64(words[pos]) * scale
            if abs(x) >= tiny:  # cast once, never to a subnormal flush-to-zero would clear
                out_f[i - start] = x
                continue
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
                sign = negzero[i] if signs else 0
                out_bits[i - start] = round_scaled(0, 0, sign, precision, exp_bits,
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


@njit(cache=True, parallel=True)
def decode(words, classes, lo, offsets, split, block, n, unit, L, negzero, mean_over, start,
           stop, out_f, out_bits, fast, target):  # fmt: skip  # pragma: no cover - compiled
    """Round elements ``start .. stop-1`` of the reduced words once into ``out_bits``.

    ``negzero[i]`` (1: every term on every rank was -0.0) signs a zero sum (an empty
    ``negzero``: every zero sum is +0.0);
    ``mean_over`` > 1 divides the exact sum by it first (one rounding).
    ``target`` as in :func:`bitfold.kernels.buckets.fold_buckets`; ``fast``
    when the output is float32 or float64 (``out_f``, the same memory as
    ``out_bits``), whose narrow sums are cast straight from a float64.
    """
    E = QUOTIENT_EXTRA_LIMBS
    b0 = start // block
    B = (stop + block - 1) // block - b0
    signs = negzero.shape[0] != 0
    if not signs:  # read as a block of zeros: the same vector loop, no flag per element
        negzero = np.zeros(block, np.int32)
    for c in prange(CHUNKS):
        row = np.zeros(L + 5 + E, np.int64)  # scratch once a chunk of blocks
        quot = np.zeros(L + 5 + E, np.int64)
        mag = np.empty(L + E, np.int64)
        qs = np.empty(block)
        held, lanes = np.empty(block, np.int64), _lane_scratch(block)  # a packed block's sums
        for b in range(b0 + B * c // CHUNKS, b0 + B * (c + 1) // CHUNKS):
            _decode_block(b, words, classes, lo, offsets, split, block, n, unit, L, negzero,
                          signs, mean_over, start, stop, out_f, out_bits, fast, target, row, quot,
                          mag, qs, held, lanes)  # fmt: skip


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
        if x == x and fast[i] == fast[i] and _added_exactly(fast, i, x):
            continue
        r = slow_row(i, fast, slow_of, slow, used, adds, unit)
        if r < 0:
            return i
        if x == x:
            add_exact_sum(slow[r], L, x, other_adds, unit)
        else:
            for j in range(W):
                slow[r, j] += other_slow[other_slow_of[i], j]
    return -1


__all__ = [
    "DIRTY_HI",
    "FULL",
    "HALF",
    "HALF_BITS",
    "LANE_BITS",
    "NARROW",
    "NO_HI",
    "NO_LO",
    "QUOTIENT_EXTRA_LIMBS",
    "SPECIAL_HI",
    "THIRDS",
    "THIRD_BITS",
    "WIDE",
    "WIDER",
    "WIDE_LOW_BITS",
    "add_blocks",
    "add_span",
    "array_bounds",
    "array_bounds_narrow",
    "array_words",
    "block_bounds",
    "decode",
    "encode",
    "merge_sums",
    "negzero_flags",
    "wire_classes",
]


one_compiler_at_a_time(globals())
