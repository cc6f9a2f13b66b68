"""The IEEE arithmetic of the exact fold, written once and compiled for the CPU and for CUDA.

Every function here is a plain Python function registered with
``numba.extending.register_jitable``: Numba compiles it into the CPU kernels
(``njit``) of :mod:`bitfold.kernels.cpu` and into the device kernels
(``cuda.jit``) of :mod:`bitfold.kernels.cuda`, so decoding a value, cutting it
into limb pieces, normalising carries and rounding a sum once exist in one
copy. They use integer arithmetic only (no float operation, so no FMA, no
flush-to-zero and no rounding mode can change a result), and take the format
facts of :mod:`bitfold.formats` as arguments.

The fast float64 paths (:func:`checked_add` and its callers) are immune to the
float unit's flush-to-zero (FTZ) and denormals-are-zero (DAZ) modes, which
``torch.set_flush_denormal(True)`` and XLA's CPU threads turn on: a value is
read into float64 through :func:`as_double`, which rebuilds a subnormal from its
bits with integer operations; :func:`checked_add` never returns a subnormal
(a sum that would be one is reported inexact, and summed in integer limbs); and
an exact float64 sum is cast to the output only when :func:`castable` says the
cast cannot meet a subnormal result, else rounded with integer operations.

State row layout (see :class:`bitfold.formats.LimbFormat`): ``L`` int64 limbs,
limb ``j`` weighing ``2^(32 j + unit_exp)``, then ``n_terms``,
``n_not_negzero``, ``n_nan``, ``n_posinf``, ``n_neginf``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import float64, int64
from numba.extending import register_jitable

MASK32 = 0xFFFFFFFF
#: Values summed in float64 (each addition checked) before the sum is flushed into limbs.
CHUNK = 32

#: Classes of a decoded value; 1..4 are also the counter columns after the L limbs
#: (n_not_negzero, n_nan, n_posinf, n_neginf).
FINITE, NEGZERO, NAN, POSINF, NEGINF, POSZERO = 0, 1, 2, 3, 4, 5


@register_jitable
def decode(raw, exp_bits, frac_bits, shift):  # pragma: no cover - compiled
    """IEEE bits -> ``(class, negative, M, p)`` with a finite value ``±M·2^(p + unit_exp)``.

    ``raw`` is the value's bit pattern (any integer type; float64 patterns as
    int64), ``exp_bits``/``frac_bits`` its format's widths and ``shift`` the
    :func:`bitfold.formats.decode_shift` of the format into the limb format.
    ``M`` and ``p`` are meaningful for ``FINITE`` values only.
    """
    b = int64(raw)
    e_max = (int64(1) << exp_bits) - 1
    e = (b >> frac_bits) & e_max
    m = b & ((int64(1) << frac_bits) - 1)
    neg = (b >> (exp_bits + frac_bits)) & 1
    if e == e_max:
        if m != 0:
            return NAN, neg, m, e
        if neg:
            return NEGINF, neg, m, e
        return POSINF, neg, m, e
    if e == 0:
        if m == 0:
            if neg:
                return NEGZERO, neg, m, e
            return POSZERO, neg, m, e
        return FINITE, neg, m, int64(shift)  # subnormal
    return FINITE, neg, m | (int64(1) << frac_bits), e - 1 + shift


@register_jitable
def split_narrow(m, p):  # pragma: no cover - compiled
    """``M < 2^24`` shifted by ``p mod 32``: ``(j, piece j, piece j+1, 0)``, pieces below 2^32."""
    shifted = m << (p & 31)
    return p >> 5, shifted & MASK32, shifted >> 32, int64(0)


@register_jitable
def split_wide(m, p):  # pragma: no cover - compiled
    """``M < 2^53`` shifted by ``p mod 32``: ``(j, piece j, j+1, j+2)``, pieces below 2^33."""
    s = p & 31
    low = (m & MASK32) << s
    high = (m >> 32) << s
    return p >> 5, low & MASK32, (low >> 32) + (high & MASK32), high >> 32


@register_jitable
def normalise(limbs, L):  # pragma: no cover - compiled
    """Carry-normalise the first ``L`` limbs of a 1-D array in place.

    Afterwards limbs ``0 .. L-2`` lie in ``[0, 2^32)`` and the top limb is
    signed and holds the rest; the integer they represent does not change.
    """
    for j in range(L - 1):
        c = limbs[j] >> 32
        limbs[j] -= c << 32
        limbs[j + 1] += c


@register_jitable
def bit_length(x):  # pragma: no cover - compiled
    """Number of bits of a non-negative int64."""
    n = int64(0)
    while x > 0:
        x >>= 1
        n += 1
    return n


@register_jitable
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


@register_jitable
def round_row(row, L, extra_terms, unit_exp, precision, exp_bits, subnormal_exp, nan_bits,
              out_shift, mag):  # fmt: skip  # pragma: no cover - compiled
    """Round the exact sum of one state row once, to nearest-even; return its IEEE bit pattern.

    ``row`` holds ``L`` limbs and the five counters (it need not be
    normalised and is not modified; ``mag`` is an int64 scratch of ``L``
    entries). ``extra_terms`` is added to ``n_terms`` and ``n_not_negzero``
    (terms the row's counters do not include yet). The target format has
    ``precision`` significant bits, ``exp_bits`` exponent bits and smallest
    subnormal ``2^subnormal_exp``; its pattern is returned shifted left by
    ``out_shift`` (16 writes a bfloat16 as the float32 that holds it), as the
    signed integer of the pattern's width.

    Rules: any NaN, or ``+inf`` with ``-inf``, gives ``nan_bits``; one
    infinity gives that infinity; an empty bucket or a zero sum ``+0.0``,
    except ``-0.0`` when the bucket has terms and every one is ``-0.0``; a
    non-zero sum that rounds to zero keeps its sign; a finite sum beyond the
    range gives ``±inf``.
    """
    width = precision + exp_bits + out_shift
    sign = -(int64(1) << (width - 2)) * 2  # adding it sets the sign bit of a width-bit integer
    e_inf = (int64(1) << exp_bits) - 1
    inf_bits = (e_inf << (precision - 1)) << out_shift
    n_terms = row[L] + extra_terms
    n_not_negzero = row[L + 1] + extra_terms
    n_nan = row[L + 2]
    n_pos = row[L + 3]
    n_neg = row[L + 4]
    if n_nan > 0 or (n_pos > 0 and n_neg > 0):
        return int64(nan_bits) << out_shift
    if n_pos > 0:
        return inf_bits
    if n_neg > 0:
        return inf_bits + sign
    negative = magnitude(row, L, mag)
    top = -1
    for j in range(L - 1, -1, -1):
        if mag[j] != 0:
            top = j
            break
    if top < 0:
        if n_terms > 0 and n_not_negzero == 0:
            return sign  # -0.0
        return int64(0)
    bitlen = 32 * top + bit_length(mag[top])
    q_min = subnormal_exp - unit_exp
    if q_min < 0:
        q_min = 0
    q = bitlen - precision
    if q < q_min:
        q = q_min
    m = int64(0)
    for j in range(top + 1):
        sh = 32 * j - q
        if sh >= 0:
            m += mag[j] << sh
        elif sh > -64:
            m += mag[j] >> (-sh)
    if q > 0:
        t = q - 1  # the half bit
        jt = t >> 5
        if jt > L - 1:
            jt = L - 1
        bt = t - 32 * jt
        half = (mag[jt] >> bt) & 1
        sticky = (mag[jt] & ((int64(1) << bt) - 1)) != 0
        for j in range(jt):
            if mag[j] != 0:
                sticky = True
        if half == 1 and (sticky or (m & 1) == 1):
            m += 1
    return encode(m, q + unit_exp, negative, precision, exp_bits, subnormal_exp, out_shift)


@register_jitable
def encode(m, e, negative, precision, exp_bits, subnormal_exp, out_shift):  # pragma: no cover
    """The IEEE pattern of ``±m·2^e`` where ``m`` was already rounded to the target.

    ``m`` has at most ``precision`` bits (or is ``2^precision`` after a
    carry), ``e >= subnormal_exp``; a value beyond the range gives ``±inf``,
    ``m == 0`` a signed zero. Returned as in :func:`round_row`.
    """
    width = precision + exp_bits + out_shift
    sign = -(int64(1) << (width - 2)) * 2
    bias = (int64(1) << (exp_bits - 1)) - 1
    e_inf = (int64(1) << exp_bits) - 1
    hidden = int64(1) << (precision - 1)
    if m == hidden << 1:
        m >>= 1
        e += 1
    if m == 0:
        bits = int64(0)
    else:
        s = precision - bit_length(m)  # >= 0: move the leading bit to the hidden position
        room = e - subnormal_exp  # how far down the exponent may go (>= 0)
        if s > room:
            s = room
        m <<= s
        e -= s
        if m >= hidden:
            e_field = e + (precision - 1) + bias
            if e_field >= e_inf:
                bits = (e_inf << (precision - 1)) << out_shift
            else:
                bits = ((e_field << (precision - 1)) | (m - hidden)) << out_shift
        else:
            bits = m << out_shift  # subnormal: e == subnormal_exp
    if negative:
        bits += sign
    return bits


@register_jitable
def round_scaled(m, e, negative, precision, exp_bits, subnormal_exp, out_shift):  # pragma: no cover
    """Round ``±m·2^e`` (an exact value, ``0 <= m < 2^63``) once to nearest-even; its IEEE bits.

    A non-zero value that rounds to zero keeps its sign; ``m == 0`` gives a
    zero of the given sign. Returned as in :func:`round_row`.
    """
    q = bit_length(m) - precision
    if q < subnormal_exp - e:
        q = subnormal_exp - e
    if q > 0:
        if q > 63:
            r = int64(0)  # far below the smallest subnormal: below half of it too
        else:
            r = m >> q
            half = (m >> (q - 1)) & 1
            sticky = (m & ((int64(1) << (q - 1)) - 1)) != 0
            if half == 1 and (sticky or (r & 1) == 1):
                r += 1
        return encode(r, e + q, negative, precision, exp_bits, subnormal_exp, out_shift)
    return encode(m, e, negative, precision, exp_bits, subnormal_exp, out_shift)


@register_jitable
def add_bits(row, L, raw, exp_bits, frac_bits, shift, wide):  # pragma: no cover - compiled
    """Add one value (its IEEE bits) into a state row: its limbs and its five counters.

    ``exp_bits``/``frac_bits``/``shift`` as in :func:`decode`; ``wide`` for
    53-bit mantissas (:func:`split_wide`). Each limb receives less than
    ``2^33`` in magnitude, so a row takes ``2^29`` values between
    normalisations.
    """
    cls, neg, m, p = decode(raw, exp_bits, frac_bits, shift)
    row[L] += 1
    if cls == FINITE:
        sign = 1 - 2 * neg
        if wide:
            j, a0, a1, a2 = split_wide(m, p)
            row[j + 2] += sign * a2
        else:
            j, a0, a1, a2 = split_narrow(m, p)
        row[j] += sign * a0
        row[j + 1] += sign * a1
        row[L + 1] += 1
    elif cls == POSZERO:
        row[L + 1] += 1
    elif cls != NEGZERO:
        row[L + cls] += 1  # n_nan, n_posinf, n_neginf
        row[L + 1] += 1


#: The smallest normal float64, 2^-1022: exact float64 sums below it (other than zero) are
#: never kept, so that no later float operation meets a subnormal (see the module docstring).
DBL_MIN = 2.0**-1022


@register_jitable
def checked_add(a, b):  # pragma: no cover - compiled
    """``a + b`` in float64 when that addition is exact and not subnormal, else NaN.

    With ``s = fl(a + b)``: when ``s - a == b`` and ``s - b == a`` (both
    computed in float64) the addition was exact; when it was not, its error is
    a non-zero multiple of the smaller of the two operands' units in the last
    place, so one of the two differences misses its operand. NaN and
    infinities fail the test too, so a NaN result means "sum this exactly
    some other way". A non-zero ``s`` below :data:`DBL_MIN` is refused too:
    under flush-to-zero it would have been flushed (and the test fails), so it
    is refused in every mode, and an exact float64 sum is never subnormal.
    Operands are never subnormal (:func:`as_double`, and this rule). No
    branch: it vectorises. (Written as "inexact or subnormal", which compiles to
    about two thirds of the time of the equivalent "exact and normal or zero".)
    """
    s = a + b
    exact = (s - a == b) & (s - b == a)
    subnormal = (abs(s) < DBL_MIN) & (s != 0.0)
    return np.nan if (not exact) | subnormal else s


@register_jitable
def checked_add_narrow(a, b):  # pragma: no cover - compiled
    """:func:`checked_add` for sums of float32 (or narrower) values: half its time.

    Every float32, float16 or bfloat16 value, read by :func:`as_double`, is an
    integer multiple of 2^-149, and so is every exact sum of them: a non-zero
    exact sum is at least 2^-149 in magnitude, far above :data:`DBL_MIN`, and an
    inexact one rounds to a neighbour of such a sum. No operand and no result
    is ever a float64 subnormal, in any floating-point mode, so the subnormal
    clause of :func:`checked_add` can never fire and is left out. Callers pass
    only such sums (both operands sums of values of those formats, or ``-0.0``).
    """
    s = a + b
    return s if (s - a == b) & (s - b == a) else np.nan


@register_jitable
def as_double(x, raw, exp_bits, frac_bits):  # pragma: no cover - compiled
    """The float64 of value ``x`` (float32 or float64) whose IEEE bits are ``raw``, DAZ-immune.

    A normal value, zero, infinity or NaN is widened by the float unit (which
    never flushes those). A subnormal (biased exponent 0, fraction non-zero) is
    rebuilt from its bits with integer operations and one exact product of
    normal float64s, ``±fraction · 2^(smallest subnormal exponent)``, where the
    float unit in denormals-are-zero mode would have read ``±0``. A subnormal
    that float64 cannot hold as a normal number (a float64 subnormal) gives
    NaN: "sum this exactly some other way", as :func:`checked_add` does.
    """
    b = int64(raw)
    if (b >> frac_bits) & ((int64(1) << exp_bits) - 1) != 0:  # normal, infinite or NaN
        return float64(x)
    m = b & ((int64(1) << frac_bits) - 1)
    if m == 0:  # a zero
        return float64(x)
    tiny_exp = 2 - (int64(1) << (exp_bits - 1)) - frac_bits  # -149 for float32
    if tiny_exp < -1022:
        return np.nan
    y = float64(m) * math.ldexp(1.0, int(tiny_exp))
    return -y if (b >> (exp_bits + frac_bits)) & 1 else y


@register_jitable
def min_normal(precision, subnormal_exp):  # pragma: no cover - compiled
    """The smallest normal number of a format (its precision and smallest subnormal exponent)."""
    return math.ldexp(1.0, int(subnormal_exp + precision - 1))


@register_jitable
def castable(x, tiny):  # pragma: no cover - compiled
    """True when the exact float64 ``x`` may be cast to the output by the float unit, in any mode.

    ``x`` is not NaN and is zero or at least ``tiny``, the output's smallest
    normal (:func:`min_normal`): the cast rounds it once, correctly, and cannot
    produce a subnormal that flush-to-zero would turn into zero. Otherwise the
    caller rounds ``x`` with integer operations (:func:`round_scaled`).
    """
    return x == x and (x == 0.0 or abs(x) >= tiny)


@register_jitable
def float_parts(x):  # pragma: no cover - compiled
    """A finite float64 as ``(negative, M, e)`` with ``x == ±M·2^e`` (no bit view: frexp)."""
    neg = int64(0)
    if x < 0.0:
        neg = int64(1)
    f, e = math.frexp(abs(x))
    return neg, int64(math.ldexp(f, 53)), int64(e) - 53


@register_jitable
def add_exact_sum(row, L, x, count, unit_exp):  # pragma: no cover - compiled
    """Add ``x``, the exact float64 sum of ``count`` values, into a state row (counters too).

    ``x`` is an integer multiple of ``2^unit_exp`` (a sum of values the limb
    format holds); it is ``-0.0`` only when every one of its terms was.
    """
    neg, m, e = float_parts(x)
    if m != 0:
        j, a0, a1, a2 = split_wide(m, e - unit_exp)
        sign = 1 - 2 * neg
        row[j] += sign * a0
        row[j + 1] += sign * a1
        row[j + 2] += sign * a2
    row[L] += count
    if not (x == 0.0 and math.copysign(1.0, x) < 0.0):
        row[L + 1] += 1


@register_jitable
def bits_value(raw, exp_bits, frac_bits, shift, unit_exp):  # pragma: no cover - compiled
    """The float64 holding the value of IEEE bits ``raw`` exactly (formats up to float64).

    For value formats without a native type on the device (bfloat16): ``raw``
    is decoded (:func:`decode`) and rebuilt as ``±M·2^(p + unit_exp)``.
    """
    cls, neg, m, p = decode(raw, exp_bits, frac_bits, shift)
    if cls == FINITE:
        x = math.ldexp(float64(m), int(p + unit_exp))
    elif cls == NAN:
        return np.nan
    elif cls == POSINF or cls == NEGINF:
        x = np.inf
    else:
        x = 0.0
    return -x if neg else x


@register_jitable
def add_column(row, L, bits, order, lo, hi, d, exp_bits, frac_bits, shift, wide):
    """Add ``bits[order[t], d]`` for ``t`` in ``[lo, hi)`` into a state row, value by value."""
    for t in range(lo, hi):
        add_bits(row, L, bits[order[t], d], exp_bits, frac_bits, shift, wide)
        if (t - lo) % (1 << 29) == (1 << 29) - 1:
            normalise(row, L)


@register_jitable
def segment_bits(values, bits, order, lo, hi, d, exp_bits, frac_bits, shift, wide,
                 unit_exp, precision, out_exp_bits, subnormal_exp, nan_bits, out_shift, row,
                 mag, has_init, init_value, init_raw, from_bits):  # fmt: skip
    """The correctly rounded sum of ``values[order[t], d]`` for ``t`` in ``[lo, hi)``: its bits.

    In chunks of :data:`CHUNK` values summed in float64 with every addition
    checked (:func:`checked_add`): an exact chunk sum goes into the limbs of
    ``row`` at once, an inexact one (or one with a NaN or an infinity) value
    by value (:func:`add_bits`, with the value format's ``exp_bits``,
    ``frac_bits``, ``shift``, ``wide``); the limbs are rounded once
    (:func:`round_row`). A segment of at most CHUNK values with an exact sum
    is rounded straight from it. With ``has_init`` the segment has one more
    term, ``init_value`` (in the values' format; ``init_raw`` its bits): the
    result is the correctly rounded sum of it and the values. ``row`` (L + 5)
    and ``mag`` (L) are scratch; the target is described as for
    :func:`round_row`. With ``from_bits`` the values are read from ``bits``
    only (:func:`bitfold.kernels.ieee.bits_value`; ``values`` and
    ``init_value`` are not read): bfloat16 on a device without the type.
    """
    L = mag.shape[0]
    for j in range(L + 5):
        row[j] = 0
    if lo == hi and has_init:
        add_bits(row, L, init_raw, exp_bits, frac_bits, shift, wide)
    start = lo
    while start < hi:
        stop = min(hi, start + CHUNK)
        first = has_init and start == lo
        acc = -0.0
        if first:
            if from_bits:
                x = bits_value(init_raw, exp_bits, frac_bits, shift, unit_exp)
            else:
                x = as_double(init_value, init_raw, exp_bits, frac_bits)
            acc = checked_add(acc, x)
        for t in range(start, stop):
            if from_bits:
                x = bits_value(bits[order[t], d], exp_bits, frac_bits, shift, unit_exp)
            else:
                x = as_double(values[order[t], d], bits[order[t], d], exp_bits, frac_bits)
            acc = checked_add(acc, x)
        if acc == acc:
            if start == lo and stop == hi:  # the whole segment, exact: round it
                neg, m, e = float_parts(acc)
                if m == 0:
                    neg = int64(math.copysign(1.0, acc) < 0.0)
                return round_scaled(m, e, neg, precision, out_exp_bits, subnormal_exp, out_shift)
            add_exact_sum(row, L, acc, stop - start + int64(first), unit_exp)
        else:
            add_column(row, L, bits, order, start, stop, d, exp_bits, frac_bits, shift, wide)
            if first:
                add_bits(row, L, init_raw, exp_bits, frac_bits, shift, wide)
        if (stop - lo) % (CHUNK << 20) == 0:
            normalise(row, L)
        start = stop
    return round_row(row, L, 0, unit_exp, precision, out_exp_bits, subnormal_exp, nan_bits,
                     out_shift, mag)  # fmt: skip


__all__ = [
    "CHUNK",
    "DBL_MIN",
    "FINITE",
    "NAN",
    "NEGINF",
    "NEGZERO",
    "POSINF",
    "POSZERO",
    "add_bits",
    "add_column",
    "add_exact_sum",
    "as_double",
    "bit_length",
    "bits_value",
    "castable",
    "checked_add",
    "checked_add_narrow",
    "decode",
    "encode",
    "float_parts",
    "magnitude",
    "min_normal",
    "normalise",
    "round_row",
    "round_scaled",
    "segment_bits",
    "split_narrow",
    "split_wide",
]
