"""Exact sums in integer digits: decode, split, scatter-add, carry and round once.

The portable path's general method, for any values and any span, and the
arithmetic :mod:`bitfold.jax_psum` sums across devices with. Integer
addition is associative and commutative, so an integer scatter-add gives
the same bits in any order, atomics included.

1. *Decode* every value with integer operations only (immune to flush-to-zero):
   sign, integer significand ``M`` and shift ``p`` with ``|v| = M·2^(p + unit)``
   (:func:`bitfold.formats.decode_shift`; ``unit`` is the limb format's, -149 for
   float16/bfloat16/float32 values and -1074 for float64 values).
2. *Split* ``±M << p`` into ``w``-bit digits: digit ``p // w + t`` gets
   ``±((M << (p mod w)) >> (w t)) mod 2^w`` for a fixed number of pieces ``t``.
   NaN, +inf and -inf add 1 to their counter column instead, and -0.0 adds -1 to
   ``n_not_negzero`` (the plan's counts are added to it and to ``n_terms``).
3. *Scatter-add* every piece into one flat integer table, ``(K·D, digits + 5)``:
   each output element's digits, then the five counters of
   :class:`bitfold.formats.LimbFormat`. With int64 words the digits are 32 bits
   wide and the table *is* an accumulator state in the host's layout
   (:attr:`bitfold.ExactAccumulator.state`), kept beside the values by an
   accumulator of this backend, so states merge across backends.
   Without int64 (JAX in its default 32-bit mode) the words are int32 and the
   digits 16 bits wide (8 bits when a bucket holds more than 2^13 values), the
   same 320 bits in finer digits, converted to the host layout when a state
   leaves the device (:func:`bitfold.backends.portable.states.to_host_state`).
4. *Carry* (sequentially over the digit columns, vectorised over the output
   elements), take the sign from the top digit, and *round once* to the output
   format with integer operations: leading digit and bit length, the guard bit
   and the sticky bit, round half to even, then the bit pattern, read back as the
   output dtype.

Each addition is below ``2^w`` in magnitude: a word absorbs ``2^30`` additions
(int64, 32-bit digits) or ``2^(29 - w)`` (int32) before it could overflow.
More positions than that are taken in fixed chunks (from the shapes only)
with a carry between chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...arrays import ArrayFamily
from ...errors import FoldTypeError
from ...formats import (
    F64,
    FLOATS,
    N_NAN,
    N_NEGINF,
    N_NOT_NEGZERO,
    N_POSINF,
    N_TERMS,
    LimbFormat,
    decode_shift,
)


@dataclass(frozen=True)
class Words:
    """How exact sums are held in integer words on one array library.

    ``word`` is the integer dtype, ``digit_bits`` the width ``w`` of a digit
    (each addition to a word is below ``2^w`` in magnitude), ``digits`` the
    digit columns of an output element and ``chunk`` the most additions to one
    word between two carry passes.
    """

    word: str
    word_bits: int
    digit_bits: int
    digits: int
    chunk: int

    @property
    def columns(self) -> int:
        """Columns of a table row: the digits and the five counters."""
        return self.digits + 5


def words_for(fmt: LimbFormat, int64: bool, bound: int) -> Words:
    """The words for sums in ``fmt`` when each output element gets at most ``bound`` terms.

    int64 words hold 32-bit digits, the host's limbs (:class:`LimbFormat`).
    int32 words hold the same bits in 16-bit digits, or 8-bit digits when
    ``bound`` exceeds 2^13 (a word then absorbs 2^21 additions between carries).
    """
    if int64:
        return Words("int64", 64, 32, fmt.limbs, 1 << 30)
    if fmt is F64:
        raise FoldTypeError(
            "exact sums of float64 values need 64-bit integers: enable them "
            "(jax.config.update('jax_enable_x64', True)), as JAX itself needs for float64"
        )
    w = 16 if bound <= (1 << 13) else 8
    return Words("int32", 32, w, fmt.limbs * 32 // w, 1 << (29 - w))


def _pieces(value_dtype: str, w: int) -> int:
    """Digits one value's ``M << (p mod w)`` can touch."""
    return -(-(FLOATS[value_dtype].precision + w - 1) // w)


# -- steps 1 and 2: decode a value into digit pieces --------------------------------------------
def _digit_additions(
    ops: ArrayFamily, values: Any, rows: Any, dtype: str, fmt: LimbFormat, words: Words
) -> tuple[list[Any], list[Any]]:
    """(flat table positions, signed additions) of every piece of every value (flat arrays)."""
    f = FLOATS[dtype]
    w, word, cols, D0 = words.digit_bits, words.word, words.columns, words.digits
    bits = ops.bitcast(values, f.signed_bits_dtype.name)
    if f.width < 32:
        bits = ops.astype(bits, "int32")
    neg = bits < 0
    expo = (bits >> f.fraction_bits) & ((1 << f.exponent_bits) - 1)
    frac = bits & ((1 << f.fraction_bits) - 1)
    if f.width != words.word_bits:
        expo, frac = ops.astype(expo, word), ops.astype(frac, word)
    top = (1 << f.exponent_bits) - 1
    special = expo == top
    nan = special & (frac != 0)
    posinf = special & (frac == 0) & ~neg
    neginf = special & (frac == 0) & neg
    negzero = neg & (expo == 0) & (frac == 0)
    mant = frac + (ops.astype(expo != 0, word) << f.fraction_bits)
    p = ops.clip(expo, 1, top) + (decode_shift(dtype, fmt) - 1)
    j = p >> int(math.log2(w))
    r = p & (w - 1)
    base = rows * cols
    where = ops.where
    index, adds = [], []
    for t in range(_pieces(dtype, w)):
        if t == 0:  # the low w - r bits of M, moved up by r (never wider than w bits)
            keep = w - r
            digit = (mant - ((mant >> keep) << keep)) << r
        else:
            digit = (mant >> ops.clip(w * t - r, 0, words.word_bits - 1)) & ((1 << w) - 1)
        signed = where(neg, -digit, digit)
        col = j + t
        if t == 0:
            col = where(neginf, D0 + N_NEGINF, col)
            col = where(nan, D0 + N_NAN, where(posinf, D0 + N_POSINF, col))
            add = where(special, 1, signed)
        elif t == 1:
            col = where(special, 0, where(negzero, D0 + N_NOT_NEGZERO, col))
            add = where(special, 0, where(negzero, -1, signed))
        else:
            col = where(special, 0, col)
            add = where(special, 0, signed)
        index.append(base + col)
        adds.append(ops.astype(add, word))
    return index, adds


# -- step 3: the table --------------------------------------------------------------------------
def carry(cols: list[Any], w: int) -> list[Any]:
    """Digit columns with carries moved up: all in ``[0, 2^w)`` but the top one (signed)."""
    mask = (1 << w) - 1
    out: list[Any] = []
    carry = None
    for c in cols[:-1]:
        if carry is not None:
            c = c + carry
        carry = c >> w
        out.append(c & mask)
    out.append(cols[-1] if carry is None else cols[-1] + carry)
    return out


def carried_table(ops: ArrayFamily, table: Any, words: Words, R: int) -> Any:
    """The flat table with its digits carried (the counters as they are)."""
    t2 = table.reshape(R, words.columns)
    cols = carry([t2[:, i] for i in range(words.digits)], words.digit_bits)
    cols += [t2[:, words.digits + i] for i in range(5)]
    return ops.stack(cols, 1).reshape(-1)


def table_of(
    ops: ArrayFamily,
    like: Any,
    fmt: LimbFormat,
    words: Words,
    R: int,
    groups: list[tuple[Any, Any, str]],
    counts_rows: Any,
    bound: int,
) -> Any:
    """The flat ``(R · columns,)`` table of the exact sums of ``groups``.

    ``groups`` are ``(rows, values, dtype)``: flat values and the table row
    (output element) each one adds to. ``counts_rows`` (R,) is the number of
    terms of every output element (added to ``n_terms`` and ``n_not_negzero``),
    ``bound`` the most terms of one output element. A value adds at most one
    piece to a word, so when more than ``words.chunk`` additions could reach
    one word (``bound`` and the two counts), the groups are taken in chunks of
    positions, carried in between (decided from the shapes only); else in
    one pass.
    """
    cols = words.columns
    table = ops.zeros(like, (R * cols,), words.word)
    at = ops.arange(like, R, words.word) * cols
    index = [at + (words.digits + N_TERMS), at + (words.digits + N_NOT_NEGZERO)]
    adds = [counts_rows, counts_rows]
    # A value adds at most one piece to a word, so a word gets at most ``bound`` additions in the
    # whole fold, and two for the counts: within what a word absorbs, one pass and no carry.
    cap = bound + 2
    step = words.chunk if cap > words.chunk else None
    load = 0  # additions to one word since the last carry
    for rows, values, dtype in groups:
        n = int(values.shape[0])
        size = step or max(n, 1)
        for lo in range(0, max(n, 1), size):
            m = min(size, n - lo)
            if min(load + min(m, bound), cap) > words.chunk:
                table = ops.scatter_add(table, ops.concat(index), ops.concat(adds))
                table, index, adds, load = carried_table(ops, table, words, R), [], [], 0
            more = _digit_additions(ops, values[lo : lo + m], rows[lo : lo + m], dtype, fmt, words)
            index, adds = index + more[0], adds + more[1]
            load = min(load + min(m, bound), cap)
    return ops.scatter_add(table, ops.concat(index), ops.concat(adds))


# -- step 4: carry, sign, round once ------------------------------------------------------------
def bit_length(ops: ArrayFamily, x: Any, w: int) -> Any:
    """Bits of each non-negative ``x < 2^w`` (0 for 0), by halving: integer operations only."""
    n = x - x
    step = w // 2
    while step:
        big = (x >> step) != 0
        n = n + ops.where(big, step, 0)
        x = ops.where(big, x >> step, x)
        step //= 2
    return n + x


def round_table(
    ops: ArrayFamily, table: Any, words: Words, fmt: LimbFormat, out_name: str, shift: Any = None
) -> Any:
    """Each row of ``table`` ``(R, columns)`` rounded once to ``out_name``: an ``(R,)`` array.

    The rows need not be carried (a merged state is not): only clear of
    overflow. ``shift`` ((R,) integers, or None for 0) moves each row's digits
    up: digit ``i`` of row ``r`` weighs ``2^(unit + shift[r] + w i)`` (the
    narrow path's per-bucket units). bfloat16 results of a library without
    bfloat16 are float32 arrays holding the bfloat16 values.
    """
    target = FLOATS[out_name]
    P, F, E, S = target.precision, target.fraction_bits, target.exponent_bits, target.subnormal_exp
    w, n, word = words.digit_bits, words.digits, words.word
    where, unit = ops.where, fmt.unit_exp
    if shift is not None:
        unit = shift + unit
    cols = carry([table[:, i] for i in range(n)], w)
    neg = cols[-1] < 0
    cols = carry([where(neg, -c, c) for c in cols], w)
    digits = ops.stack(cols, 1)  # (R, n), each in [0, 2^w)
    pos = ops.arange(table, n, word).reshape(1, n)
    top = ops.amax(where(digits != 0, pos + 1, 0), 1)  # leading digit + 1; 0 for a zero sum
    zero = top == 0
    h = ops.clip(top - 1, 0, n - 1)
    lead = ops.sum(where(pos == h.reshape(-1, 1), digits, 0), 1)
    e = h * w + bit_length(ops, lead, w) + (unit - 1)  # exponent of the leading bit
    q = ops.clip(e - (P - 1), S, 1 << 20)  # exponent of the result's last bit
    below = (q - unit - 1).reshape(-1, 1)  # bits under the guard bit
    a = pos * w - below
    up, down = ops.clip(a, 0, words.word_bits - 1), ops.clip(-a, 0, w)
    part = where(a >= 0, digits << up, digits >> down)
    x = ops.sum(part, 1)  # the significand and the guard bit
    low = ops.clip(below - pos * w, 0, w)
    sticky = ops.amax(ops.astype((digits - ((digits >> low) << low)) != 0, word), 1)
    mag = x >> 1
    mag = mag + ((x & 1) & (sticky | (mag & 1)))
    biased = (q - S) + (mag >> F)
    inf_exp = (1 << E) - 1
    over = biased >= inf_exp
    bits = (ops.clip(biased, 0, inf_exp) << F) | where(over, 0, mag & ((1 << F) - 1))
    counter = table[:, n:]
    negzero = (counter[:, N_NOT_NEGZERO] == 0) & (counter[:, N_TERMS] > 0)
    bits = where(zero, 0, bits)
    sign_bit = 1 << (target.width - 1)
    signed = bits + where(neg | (zero & negzero), -sign_bit, 0)
    posinf, neginf = counter[:, N_POSINF] > 0, counter[:, N_NEGINF] > 0
    inf = inf_exp << F
    signed = where(posinf, inf, where(neginf, inf - sign_bit, signed))
    signed = where((counter[:, N_NAN] > 0) | (posinf & neginf), target.canonical_nan, signed)
    if ops.has_dtype(out_name):
        return ops.bitcast(ops.astype(signed, target.signed_bits_dtype.name), out_name)
    return ops.bitcast(ops.astype(signed << 16, "int32"), "float32")  # bfloat16, held in float32


def table_rows(ops: ArrayFamily, index: Any, D: int, like: Any, word: str) -> Any:
    """Table rows of every value of ``(positions, D)`` rows: ``index * D + d``, flat."""
    if D == 1:
        return index
    d = ops.arange(like, D, word).reshape(1, D)
    return (index.reshape(-1, 1) * D + d).reshape(-1)


def canonical_nan(ops: ArrayFamily, like: Any, out_name: str) -> Any:
    """The canonical NaN of ``out_name`` as a one-element array of ``like``'s family."""
    f = FLOATS[out_name]
    held = out_name if ops.has_dtype(out_name) else "float32"
    bits = f.canonical_nan << (16 if held != out_name else 0)
    width = FLOATS[held].signed_bits_dtype.name
    return ops.bitcast(ops.zeros(like, (1,), width) + bits, held)
