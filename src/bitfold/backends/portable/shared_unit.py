"""The shared-unit path: one unit for every output element, one word a term, no gather.

Two reductions (the largest and the least nonzero magnitude) give one unit
``2^u`` for the whole fold, the lowest that keeps the fullest bucket's sum
below ``2^63`` (:func:`shared_unit_plan`); where every term is a multiple
of it, each word is one float32 multiplication, then one scatter-add and
one rounding, rounded to odd, then one float conversion
(:func:`shared_unit_fold`, :func:`round_words`). In JAX's 32-bit mode the
words are int32 digits of each term.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...arrays import ArrayFamily
from ...formats import FLOATS, decode_shift
from .digits import Words, carry, round_table
from .flags import choose
from .terms import NARROW, NARROW_BITS, WRAP, Terms, larger, value_bits


def _extremes(terms: Terms, index: Any, values: Any, dtype: str, word: str) -> tuple[Any, Any]:
    """(largest magnitude bits, least nonzero magnitude bits or 0 for none) of ``values``:
    0-d ``word`` arrays, from two reductions a chunk (order-free)."""
    ops = terms.ops
    highs, lows = [], []
    for lo, hi in terms.chunks(index):
        _, mag = value_bits(ops, values[lo:hi], dtype)
        mag = mag.reshape(-1)
        highs.append(ops.amax(mag, 0))
        lows.append(ops.amin(mag + WRAP, 0))
    high = ops.astype(ops.amax(ops.stack(highs, 0), 0), word)
    low = ops.amin(ops.stack(lows, 0), 0)  # int32: m - 2^31 - 1 for the least nonzero m
    if word == "int32":
        return high, ops.where(low == WRAP, 0, low - WRAP)  # wrapping back to m
    low = ops.astype(low, word)
    return high, ops.where(low == WRAP, 0, low + ((1 << 31) + 1))


@dataclass(frozen=True)
class SharedWords:
    """How the shared-unit path holds its sums: each term an integer of at most ``span`` bits.

    int64: one word a sum (``digit_bits`` 63, one digit), ``span`` = 63 less
    the bits of the fullest bucket's count. int32 (JAX's 32-bit mode): each
    term cut into ``digits`` digits of ``digit_bits`` bits (16, or 8 past
    2^15 terms), one digit column a word, so a column absorbs every term of
    its element; ``span`` = ``digits · digit_bits``, and ``headroom`` digit
    columns above them take the sums' carries.
    """

    word: str
    digit_bits: int
    digits: int
    span: int
    headroom: int = 0

    @property
    def columns(self) -> int:
        """Digit columns of a sum: the terms' digits and the carries' above them."""
        return self.digits + self.headroom


def shared_words(word: str, bound: int) -> SharedWords | None:
    """The shared-unit layout for ``bound`` terms an element: one int64 word up to 2^15 terms,
    else int32 digits (56 bits of span whatever the count), or None where they cannot absorb
    the terms (more than 2^23)."""
    b = int(bound).bit_length()
    if word == "int64" and b <= 15:  # a span of 48 bits or more in one word
        return SharedWords("int64", 63, 1, NARROW_BITS - b)
    w = 16 if b <= 15 else 8 if b <= 23 else 0
    if not w:
        return None
    n = -(-56 // w)
    return SharedWords("int32", w, n, n * w, headroom=-(-(b + 1) // w))


def shared_unit_plan(terms: Terms, layout: SharedWords) -> tuple[Any, Any]:
    """(unit ``u`` as a 0-d array of ``layout.word``, a 0-d flag set where it serves every term).

    One unit ``2^(u + fmt.unit_exp)`` for every output element: the lowest
    that keeps the largest magnitude within ``layout.span`` bits (for int64:
    a bucket's sum below ``2^63``). It serves when every term is finite,
    every nonzero term normal, and the least nonzero magnitude's last
    significand bit is at or above the unit; then every term times
    ``2^-(u + fmt.unit_exp)`` is an integer of at most ``span`` bits, made
    exactly by one float32 multiplication (normal in, normal out: no flush to
    zero can touch it). Two reductions over the values, no scatter.
    """
    ops, like, fmt = terms.ops, terms.like, terms.fmt
    top = None  # the exponent just above the largest term (in fmt units)
    fits: list[tuple[Any, Any, Any]] = []
    for index, values, dtype in terms.groups:
        f = FLOATS[dtype]
        if int(values.shape[0]) == 0:
            continue
        high, low = _extremes(terms, index, values, dtype, layout.word)
        e_high = ops.clip(high >> f.fraction_bits, 1, 1 << 20) + (decode_shift(dtype, fmt) - 1)
        group_top = ops.where(high == 0, 0, e_high + f.precision)
        finite = high < (((1 << f.exponent_bits) - 1) << f.fraction_bits)
        normal = (low == 0) | (low >= (1 << f.fraction_bits))
        last_bit = (low >> f.fraction_bits) + (decode_shift(dtype, fmt) - 1)  # of the least term
        ok = finite & normal
        top = group_top if top is None else larger(ops, top, group_top)
        fits.append((ok, low, last_bit))
    if top is None:
        zero = ops.zeros(like, (), layout.word)
        return zero, zero == 0
    least = max(0, -fmt.unit_exp - 127)  # the lowest unit whose multiplier float32 holds
    unit = ops.clip(top - layout.span, least, 1 << 20)
    scale_exp = -(unit + fmt.unit_exp)  # 2^scale_exp: a term's multiplier, a float32 power
    good = scale_exp >= -126
    for ok, low, last_bit in fits:
        good = good & ok & ((low == 0) | (last_bit >= unit))
    return unit, good


def shared_unit_sums(terms: Terms, unit: Any, layout: SharedWords) -> Any:
    """Every output element's terms summed in words of the shared unit: shape ``shape`` (int64)
    or ``shape + (digits,)`` (int32 digit columns, not carried).

    Valid where :func:`shared_unit_plan` said it serves: each term times
    ``2^-(unit + fmt.unit_exp)`` in float32 is an exact integer; int64 takes it
    whole, int32 its ``digits`` base-``2^w`` digits of the magnitude, each cut
    out with exact float operations (scalings by powers of two, floors and a
    subtraction of integers below ``2^24``), signed as the term.
    """
    ops, fmt, shape = terms.ops, terms.fmt, terms.shape
    scale_bits = ops.astype(127 - fmt.unit_exp - unit, "int32") << 23
    scale = ops.bitcast(ops.clip(scale_bits, 1 << 23, 254 << 23), "float32")
    cut = layout.word == "int32"
    sums = ops.zeros(terms.like, (*shape, layout.digits) if cut else shape, layout.word)
    w = layout.digit_bits
    for index, values, _ in terms.groups:
        for lo, hi in terms.chunks(index):
            if hi == lo:
                continue
            x = ops.astype(values[lo:hi], "float32") * scale
            if not cut:
                sums = ops.scatter_add(sums, index[lo:hi], ops.astype(x, "int64"))
                continue
            neg = x < 0
            mag = ops.where(neg, -x, x)
            pieces = []
            for j in range(layout.digits):
                above = ops.floor(mag * (2.0 ** -(w * j)))  # the magnitude's digits j and up
                digit = ops.astype(above - ops.floor(above * 2.0**-w) * 2.0**w, "int32")
                pieces.append(ops.where(neg, -digit, digit))
            sums = ops.scatter_add(sums, index[lo:hi], ops.stack(pieces, -1))
    return sums


def _not_all_negzero(terms: Terms) -> Any:
    """Whether each output element has a term that is not -0.0 (shape ``terms.shape``, bool):
    an integer max-scatter, order-free."""
    ops = terms.ops
    seen = ops.zeros(terms.like, terms.shape, "int32")
    for index, values, dtype in terms.groups:
        sign = -(1 << (FLOATS[dtype].width - 1))  # -0.0's pattern
        for lo, hi in terms.chunks(index):
            if hi > lo:
                bits, _ = value_bits(ops, values[lo:hi], dtype)
                seen = ops.scatter_max(seen, index[lo:hi], ops.astype(bits != sign, "int32"))
    return seen > 0


def shared_unit_fold(
    terms: Terms, counts: Any, unit: Any, layout: SharedWords, out_name: str, *, signs: bool = True
) -> tuple[Any, Any]:
    """(rounded sums of shape ``terms.shape`` by the shared unit, a 0-d flag: look again).

    For use where :func:`shared_unit_plan` said the unit serves: one
    scatter-add of words and one rounding. An element whose terms sum to zero
    is -0.0 when every term is -0.0, and a result below the target's normal
    range needs the integer rounding. With ``signs`` both are settled here
    (a max-scatter of the terms' signs, made only when some sum is zero;
    :func:`round_table` where :func:`round_words` flags a small result) and
    the flag says only whether some sum is zero. Without, every zero sum is
    +0.0, small results are as :func:`round_words` made them, and the flag is
    set where either happened: the caller looks again.
    """
    ops, like, fmt, shape = terms.ops, terms.like, terms.fmt, terms.shape
    sums = shared_unit_sums(terms, unit, layout)
    c = counts.reshape(-1)
    R = c.shape[0]
    if layout.word == "int32":
        columns = [sums.reshape(R, layout.digits)[:, j] for j in range(layout.digits)]
        digits = carry(columns + [c - c] * layout.headroom, layout.digit_bits)
        nonzero = ops.amax(ops.stack([ops.astype(d != 0, "int32") for d in digits], 1), 1)
        is_zero = nonzero == 0
    else:
        flat = sums.reshape(-1)
        digits = [flat & ((1 << 32) - 1), flat >> 32]
        is_zero = flat == 0
    zero_sum = ops.amax(ops.astype(is_zero & (c > 0), "int32"), 0) > 0
    not_negzero = c
    if signs:
        not_negzero = choose(
            ops, like, zero_sum,
            lambda: ops.where(_not_all_negzero(terms).reshape(-1), c, 0),
            lambda: c,
        )  # fmt: skip

    def by_table() -> Any:
        zero = c - c
        cols = [*digits, c, not_negzero, zero, zero, zero]
        words = NARROW
        if layout.word == "int32":
            words = Words("int32", 32, layout.digit_bits, layout.columns, 1 << 30)
        unit_rows = zero + unit
        return round_table(ops, ops.stack(cols, 1), words, fmt, out_name, shift=unit_rows)

    fast = layout.word == "int64" and ops.has_dtype("float64") and ops.has_dtype(out_name)
    if out_name == "float64" or not fast:
        return by_table().reshape(shape), zero_sum
    negzero = is_zero & (c > 0) & (not_negzero == 0)
    out, tiny = round_words(ops, sums.reshape(-1), unit + fmt.unit_exp, negzero, out_name)
    if signs:
        return choose(ops, like, tiny, by_table, lambda: out).reshape(shape), zero_sum
    return out.reshape(shape), zero_sum | tiny


def round_words(
    ops: ArrayFamily, sums: Any, exponent: Any, negzero: Any, out_name: str
) -> tuple[Any, Any]:
    """(each int64 ``sums[r]·2^exponent`` rounded once to ``out_name``, a 0-d flag set where
    some result may fall below the format's normal range: those need :func:`round_table`).

    For float32, float16 and bfloat16 results (``exponent`` 0-d, the shared
    unit's). The magnitude is rounded to odd at ``p`` bits (53 for float32,
    24 for the 16-bit formats: at least two more than the target's) with
    integer operations, which float64 then holds exactly, times an exact power
    of two; the one conversion to the target rounds half to even, and a value
    rounded to odd with two spare bits rounds to the target as the exact value
    does. Every float in the way is normal (the flag keeps results below the
    target's normal range out), so flush-to-zero cannot touch them. ``negzero``
    marks the zero sums that are -0.0.
    """
    f = FLOATS[out_name]
    p = 53 if f.precision > 11 else 24
    neg = sums < 0
    mag = ops.where(neg, -sums, sums)
    bits = (ops.bitcast(ops.astype(mag, "float64"), "int64") >> 52) - 1022  # >= bit length
    cut = ops.clip(bits - p, 0, 63)
    kept = mag >> cut
    kept = kept | ops.astype((kept << cut) != mag, "int64")  # the sticky bit: round to odd
    power = ops.bitcast((ops.clip(exponent + cut, -1022, 1023) + 1023) << 52, "float64")
    value = ops.astype(kept, "float64") * power
    if p == 24:  # exact in float32: one rounding, float32 to the 16-bit format
        value = ops.astype(value, "float32")
    out = ops.astype(value, out_name)
    out = ops.where(neg | negzero, -out, out)
    normal = f.subnormal_exp + f.precision - 1  # the least normal exponent
    tiny = (mag != 0) & (bits - 2 + exponent < normal)
    return out, ops.amax(ops.astype(tiny, "int32"), 0) > 0
