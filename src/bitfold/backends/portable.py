"""The portable backend: exact folds written once in the array library's own operations.

It folds torch tensors on any device (CPU, CUDA, ROCm, MPS, XPU), CuPy arrays
and JAX arrays on any backend (and NumPy arrays, when asked), with nothing
but the operations of their array family (:mod:`bitfold.arrays`): integer
views of float bits, shifts and masks, an integer scatter-add, gathers,
``where`` and reductions. There is no switch on the library: the same lines
run everywhere, so the CPU tests prove the code that runs on a device.

Method
------
Integer addition is associative and commutative, so an integer scatter-add
gives the same bits in any order, atomics included.

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
   leaves the device.
4. *Carry* (sequentially over the digit columns, vectorised over the output
   elements), take the sign from the top digit, and *round once* to the output
   format with integer operations: leading digit and bit length, the guard bit
   and the sticky bit, round half to even, then the bit pattern, read back as the
   output dtype.

Two narrow paths (int64 words: torch, CuPy, NumPy, JAX with
``jax_enable_x64``; values of at most 24 significant bits) come first, each
term one int64 word:

* the shared unit (:func:`shared_unit_plan`, :func:`shared_unit_fold`): two
  reductions (the largest and the least nonzero magnitude) give one unit
  ``2^u`` for the whole fold, the lowest that keeps the fullest bucket's sum
  below ``2^63``; where every term is a multiple of it, each word is one
  float32 multiplication, then one scatter-add and one rounding (rounded to
  odd, then one float conversion: :func:`round_words`). Taken where a flag
  can be read without waiting (eager CPU arrays), in JAX (``lax.cond``), and
  in a ``torch.compile`` graph on the CPU (:mod:`.portable_torch`);
* each element's own unit (:func:`narrow_fold`): a max-scatter of every
  output element's largest magnitude gives it a unit such that its terms
  sum below ``2^63``; one scatter-add of the words and one rounding.

Where an element's terms do not fit one word (a span of more than about
``63 - 24 - log2(count)`` binary orders), or meet NaN or infinity, a flag
sends the whole fold to the digit path above: read where it lies for an
eager CPU tensor, ``lax.cond`` in JAX, both made and one selected elsewhere
(no host synchronisation in any case).

Each addition is below ``2^w`` in magnitude: a word absorbs ``2^30`` additions
(int64, 32-bit digits) or ``2^(29 - w)`` (int32) before it could overflow.
More positions than that are taken in fixed chunks (from the shapes only)
with a carry between chunks.

Numeric contract: the host's (:mod:`bitfold.exact`). ``exact`` returns the
correctly rounded sum of every bucket, the same bits as the host path and
the Fraction oracle, on every device; NaN results are the canonical NaN of
:data:`bitfold.formats.FLOATS`. Nothing waits for the device inside a fold
(no ``.item()``, no shape that depends on the data): a torch fold traces with
fake tensors to ATen ops and compiles with ``torch.compile(fullgraph=True)``;
a JAX fold runs under ``jit``, ``grad`` and ``vmap``.

``ordered`` adds each bucket's values in increasing position, one rounding
an addition, the host's order and bits (a loop of ``max(counts)`` vector
steps: slow for hot buckets, use ``exact``); ``atomic`` is the library's
float scatter-add.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import ArrayFamily, family_of, from_numpy, place_of, to_numpy
from ..errors import DeviceError, FoldError, FoldTypeError
from ..formats import (
    F64,
    FLOATS,
    N_NAN,
    N_NEGINF,
    N_NOT_NEGZERO,
    N_POSINF,
    N_TERMS,
    LimbFormat,
    check_value_dtype,
    decode_shift,
    dtype_name,
    limb_format_for,
)
from ..validate import Values
from . import device_plan, host_state
from .registry import FOLDS, Backend, InitRule

if TYPE_CHECKING:
    from ..plan import Fold

NAME = "portable"
#: The array families whose operations this backend is written against.
FAMILIES: tuple[str, ...] = ("torch", "cupy", "jax", "numpy")


# -- integer words -------------------------------------------------------------------------------
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
def _terms(
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
def _carry(cols: list[Any], w: int) -> list[Any]:
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
    cols = _carry([t2[:, i] for i in range(words.digits)], words.digit_bits)
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
            more = _terms(ops, values[lo : lo + m], rows[lo : lo + m], dtype, fmt, words)
            index, adds = index + more[0], adds + more[1]
            load = min(load + min(m, bound), cap)
    return ops.scatter_add(table, ops.concat(index), ops.concat(adds))


# -- step 4: carry, sign, round once ------------------------------------------------------------
def _bit_length(ops: ArrayFamily, x: Any, w: int) -> Any:
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
    cols = _carry([table[:, i] for i in range(n)], w)
    neg = cols[-1] < 0
    cols = _carry([where(neg, -c, c) for c in cols], w)
    digits = ops.stack(cols, 1)  # (R, n), each in [0, 2^w)
    pos = ops.arange(table, n, word).reshape(1, n)
    top = ops.amax(where(digits != 0, pos + 1, 0), 1)  # leading digit + 1; 0 for a zero sum
    zero = top == 0
    h = ops.clip(top - 1, 0, n - 1)
    lead = ops.sum(where(pos == h.reshape(-1, 1), digits, 0), 1)
    e = h * w + _bit_length(ops, lead, w) + (unit - 1)  # exponent of the leading bit
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


@dataclass(frozen=True)
class Terms:
    """The terms of one fold on one array family, for the one-word paths.

    ``groups`` are ``(index, values, dtype)``: output ids ``(n,)`` and values
    ``(n,) + shape[1:]``, summed into output elements of ``shape`` beside
    ``like`` (its library and device) in the limb format ``fmt``.
    """

    ops: ArrayFamily
    like: Any
    fmt: LimbFormat
    shape: tuple[int, ...]
    groups: list[tuple[Any, Any, str]]

    def chunks(self, index: Any) -> list[tuple[int, int]]:
        """The position ranges an eager fold takes ``index``'s values in (:func:`_chunks`)."""
        R = math.prod(self.shape)
        return _chunks(self.ops, self.like, int(index.shape[0]), R // self.shape[0], R)


# -- the narrow path: one int64 word a value ----------------------------------------------------
#: The narrow path's sums: one signed int64 word a bucket, rounded as two 32-bit digits.
NARROW = Words("int64", 64, 32, 2, 1 << 30)
#: Bits of a narrow word a sum may fill (its sign bit kept clear).
NARROW_BITS = 63


def narrow_applies(dtypes: list[str], int64: bool) -> bool:
    """Whether the narrow path is tried for values of ``dtypes``: int64 words, and significands
    narrow enough to leave a useful span of exponents (float64's 53 bits leave too few)."""
    return int64 and max(FLOATS[d].precision for d in dtypes) <= 24


def _scatter_rows(ops: ArrayFamily, how: str, target: Any, index: Any, src: Any) -> Any:
    """``target[index[i]] = how(target[index[i]], src[i])`` for values ``(n,)`` or rows
    ``(n, D)`` into ``(K,)`` or ``(K, D)``; ``how``: "add" (the family's scatter-add), "max" or
    "min" (integers: order-free like the add; each library's own scatter)."""
    if how == "add":
        return ops.scatter_add(target, index, src)
    if ops.name == "torch":
        if len(src.shape) == 2:
            index = index.reshape(-1, 1).expand(src.shape)
        return target.scatter_reduce(0, index, src, f"a{how}")
    if ops.name == "jax":
        return getattr(target.at[index], how)(src)
    if ops.name == "cupy":
        import cupyx

        getattr(cupyx, f"scatter_{how}")(target, index, src)
        return target
    getattr(np, {"max": "maximum", "min": "minimum"}[how]).at(target, index, src)
    return target


def _scales_exactly(ops: ArrayFamily, like: Any) -> bool:
    """Whether narrow words are made by a float64 scaling (fast in eager libraries) rather than
    integer shifts: where the library has float64 on the values' device (not Apple's MPS).

    Exact and immune to flush-to-zero: only terms the integer first pass found normal are
    scaled, by a power of two that makes each an integer of at most 63 bits (no term has bits
    below its element's unit), so no subnormal meets the float unit, in or out.
    """
    return ops.has_dtype("float64") and ops.device(like) != "mps"


def _powers(ops: ArrayFamily, like: Any) -> Any:
    """``2^s`` for ``s`` in ``[0, 63)``, int64 on ``like``'s device (kept per device)."""
    return ops.constant(like, np.left_shift(1, np.arange(NARROW_BITS, dtype=np.int64)))


def _larger(ops: ArrayFamily, a: Any, b: Any) -> Any:
    return ops.where(a > b, a, b)


#: ``2^31 - 1``: added to a magnitude (int32, wrapping) so that 0 becomes the largest value and
#: every other magnitude ``m`` becomes ``m - 2^31 - 1``: a minimum then finds the least nonzero.
_WRAP = (1 << 31) - 1


def _value_bits(ops: ArrayFamily, values: Any, dtype: str) -> tuple[Any, Any]:
    """(signed bit patterns, their magnitudes' bits): int32 for 16-bit formats, else the width."""
    f = FLOATS[dtype]
    bits = ops.bitcast(values, f.signed_bits_dtype.name)
    if f.width < 32:
        bits = ops.astype(bits, "int32")
    return bits, bits & ((1 << (f.width - 1)) - 1)


def _chunks(ops: ArrayFamily, like: Any, n: int, row: int, R: int) -> list[tuple[int, int]]:
    """Position ranges an eager fold takes in turn (from the shapes only): each chunk's
    temporaries stay in the caches and are made again from freed memory, where one pass over
    all the values would fault in fresh pages for every operation. Traced folds: one range."""
    if ops.cache_key(like) is None or ops.name not in ("torch", "numpy"):
        return [(0, n)]
    step = max(1, max(1 << 18, 4 * R) // max(row, 1))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)] or [(0, 0)]


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
    path. Eager CPU folds take the values in chunks (:func:`_chunks`). ``scaled`` says how
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
            bits, mag = _value_bits(ops, values[lo:hi], dtype)
            # magnitude, then one bit: the term is not -0.0 (the max says both at once)
            key = (ops.astype(mag, word) << 1) | ops.astype(bits != sign, word)
            best = _scatter_rows(ops, "max", best, index[lo:hi], key)
        all_negzero = best <= 0  # -1: no term here
        negzero = all_negzero if negzero is None else negzero & all_negzero
        big, top = best >> 1, (1 << f.exponent_bits) - 1
        special = special | ops.astype(big >= (top << f.fraction_bits), word)
        e = ops.clip(big >> f.fraction_bits, 1, top) + (decode_shift(dtype, fmt) - 1)
        top_exp = _larger(ops, top_exp, ops.where(big < 0, -1, e + f.precision))
    headroom = _bit_length(ops, ops.clip(counts, 0, (1 << 31) - 1), 32)
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
            bits, mag = _value_bits(ops, values[lo:hi], dtype)
            if scaled:
                # a subnormal term would meet the float unit: flagged (integers only)
                wrapped = mag + _WRAP  # 0 -> the largest; m >= 1 -> m - 1 - 2^31
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
            sums = _scatter_rows(ops, "add", sums, at, w)
    bad = ops.amax(ops.stack([ops.astype(g, word).reshape(()) for g in flags], 0), 0) > 0
    flat, c = sums.reshape(-1), counts.reshape(-1)
    zero = flat - flat
    cols = [flat & ((1 << 32) - 1), flat >> 32, c, ops.where(negzero.reshape(-1), 0, c), zero,
            zero, zero]  # fmt: skip
    out = round_table(ops, ops.stack(cols, 1), NARROW, fmt, out_name, shift=unit.reshape(-1))
    return out.reshape(shape), bad


# -- the shared-unit path: one unit for every output element, no gather -------------------------
def _extremes(terms: Terms, index: Any, values: Any, dtype: str, word: str) -> tuple[Any, Any]:
    """(largest magnitude bits, least nonzero magnitude bits or 0 for none) of ``values``:
    0-d ``word`` arrays, from two reductions a chunk (order-free)."""
    ops = terms.ops
    highs, lows = [], []
    for lo, hi in terms.chunks(index):
        _, mag = _value_bits(ops, values[lo:hi], dtype)
        mag = mag.reshape(-1)
        highs.append(ops.amax(mag, 0))
        lows.append(ops.amin(mag + _WRAP, 0))
    high = ops.astype(ops.amax(ops.stack(highs, 0), 0), word)
    low = ops.amin(ops.stack(lows, 0), 0)  # int32: m - 2^31 - 1 for the least nonzero m
    if word == "int32":
        return high, ops.where(low == _WRAP, 0, low - _WRAP)  # wrapping back to m
    low = ops.astype(low, word)
    return high, ops.where(low == _WRAP, 0, low + ((1 << 31) + 1))


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
        top = group_top if top is None else _larger(ops, top, group_top)
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
                sums = _scatter_rows(ops, "add", sums, index[lo:hi], ops.astype(x, "int64"))
                continue
            neg = x < 0
            mag = ops.where(neg, -x, x)
            pieces = []
            for j in range(layout.digits):
                above = ops.floor(mag * (2.0 ** -(w * j)))  # the magnitude's digits j and up
                digit = ops.astype(above - ops.floor(above * 2.0**-w) * 2.0**w, "int32")
                pieces.append(ops.where(neg, -digit, digit))
            sums = _scatter_rows(ops, "add", sums, index[lo:hi], ops.stack(pieces, -1))
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
                bits, _ = _value_bits(ops, values[lo:hi], dtype)
                seen = _scatter_rows(ops, "max", seen, index[lo:hi],
                                     ops.astype(bits != sign, "int32"))  # fmt: skip
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
        digits = _carry(columns + [c - c] * layout.headroom, layout.digit_bits)
        nonzero = ops.amax(ops.stack([ops.astype(d != 0, "int32") for d in digits], 1), 1)
        is_zero = nonzero == 0
    else:
        flat = sums.reshape(-1)
        digits = [flat & ((1 << 32) - 1), flat >> 32]
        is_zero = flat == 0
    zero_sum = ops.amax(ops.astype(is_zero & (c > 0), "int32"), 0) > 0
    not_negzero = c
    if signs:
        not_negzero = _choose(
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
        return _choose(ops, like, tiny, by_table, lambda: out).reshape(shape), zero_sum
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


def _choose(ops: ArrayFamily, like: Any, flag: Any, if_set: Any, if_clear: Any) -> Any:
    """``if_set()`` where the 0-d ``flag`` is set, else ``if_clear()``: with no host wait.

    JAX: ``lax.cond`` (one branch runs, inside ``jit`` too); an eager torch CPU
    tensor or a NumPy array: the flag is read where it lies (no device to wait
    for). Elsewhere (a torch device, fake tensors, ``torch.compile``) both are
    made and one is selected with ``where``: ``torch.cond`` would run one, but
    inductor's post-grad passes refused some of its graphs here.
    """
    if ops.name == "jax":
        import jax

        return jax.lax.cond(flag, if_set, if_clear)
    if _reads_flags(ops, like):
        return if_set() if bool(flag) else if_clear()
    return ops.where(flag, if_set(), if_clear())


def _reads_flags(ops: ArrayFamily, like: Any) -> bool:
    """Whether a 0-d flag beside ``like`` is read without waiting for a device: eager values
    in host memory (a torch CPU tensor outside a trace, a NumPy array)."""
    compiling = ops.name == "torch" and _torch_compiling()
    return not compiling and ops.cache_key(like) is not None and ops.device(like) == "cpu"


def _torch_compiling() -> bool:
    import torch

    return bool(torch.compiler.is_compiling())


# -- what a plan gives the device, made once per device ----------------------------------------
def _constant(plan: Fold, ops: ArrayFamily, like: Any, what: str, build: Any) -> Any:
    """``build()`` (a host array) on ``like``'s device; kept on the plan unless tracing.

    Under ``torch.compile`` the plan must have met the device once before (a
    first, eager call), as for a CUDA-graph capture: the compiled fold then
    reads the kept constants.
    """
    key = ops.cache_key(like)
    if key is None:
        return ops.constant(like, build())
    return plan.prepared(("portable", what, key), lambda: ops.constant(like, build()))


def _max_count(plan: Fold) -> int:
    """The most values of one bucket (a Python int, kept on the plan).

    A plan built on a device reads it from its counts there (one read, once).
    """
    built = plan.device_tensors
    if built is not None:
        return plan.prepared(("portable", "max-count"), lambda: int(built.counts.max()))
    return plan.prepared(("portable", "max-count"), lambda: int(plan.counts.max()))


def _torch_on_device(plan: Fold, ops: ArrayFamily, like: Any) -> bool:
    """True when the plan's arrays for ``like`` come from its torch tensors on ``like``'s device
    (:mod:`bitfold.backends.device_plan`): a plan built on a device, eager torch values."""
    eager = ops.cache_key(like) is not None
    return ops.name == "torch" and plan.device_tensors is not None and eager


def _plan_array(plan: Fold, ops: ArrayFamily, like: Any, what: str, word: str) -> Any:
    """The plan's ``what`` ("order", "starts", "counts") as ``word`` integers on ``like``'s device.

    Kept on the plan; a plan built on a device derives it there from its
    tensors (:func:`device_plan.plan_tensors`), never through the host.
    """
    if _torch_on_device(plan, ops, like):
        import torch

        def derived() -> Any:
            t = device_plan.plan_tensors(plan, like.device)
            src = {"order": t.order, "starts": t.offsets[:-1], "counts": t.counts}[what]
            return src.to(getattr(torch, word))

        return plan.prepared(("portable", f"{what}-{word}", ops.cache_key(like)), derived)
    host = {"order": lambda: plan.order, "starts": lambda: plan.offsets[:-1],
            "counts": lambda: plan.counts}[what]  # fmt: skip
    return _constant(plan, ops, like, f"{what}-{word}", lambda: host().astype(word))


def _counts_rows(plan: Fold, ops: ArrayFamily, like: Any, D: int, extra: int, word: str) -> Any:
    """Every bucket's count plus ``extra``, repeated for its ``D`` table rows, as ``word``."""
    what = f"counts-rows-{word}-{D}-{bool(extra)}"
    if _torch_on_device(plan, ops, like):
        counts = _plan_array(plan, ops, like, "counts", word)
        return plan.prepared(("portable", what, ops.cache_key(like)),
                             lambda: (counts + extra).repeat_interleave(D))  # fmt: skip
    return _constant(plan, ops, like, what,
                     lambda: np.repeat(plan.counts + extra, D).astype(word))  # fmt: skip


def _index(plan: Fold, ops: ArrayFamily, like: Any, word: str) -> Any:
    """The plan's flat index as ``word`` integers on ``like``'s device (kept on the plan).

    torch int64: the plan's one torch index there (:func:`device_plan.index_tensor`).
    """
    if ops.name == "torch" and word == "int64" and ops.cache_key(like) is not None:
        return device_plan.index_tensor(plan, like.device)
    return _constant(plan, ops, like, f"index-{word}", lambda: plan.index.astype(word))


def _rows(ops: ArrayFamily, index: Any, D: int, like: Any, word: str) -> Any:
    """Table rows of every value of ``(positions, D)`` rows: ``index * D + d``, flat."""
    if D == 1:
        return index
    d = ops.arange(like, D, word).reshape(1, D)
    return (index.reshape(-1, 1) * D + d).reshape(-1)


def _float_name(x: Any) -> str:
    """The canonical dtype name of a float array (a refusal for any other)."""
    return check_value_dtype(dtype_name(x))


def _values_format(dtype: str, init_dtype: str | None) -> LimbFormat:
    fmt = limb_format_for(dtype)
    if init_dtype is not None and limb_format_for(init_dtype) is F64:
        return F64  # float64 init and float32 values: both summed in the float64 format
    return fmt


def _check_family(values: Any) -> ArrayFamily:
    ops = family_of(values)
    if ops.name not in FAMILIES:
        raise DeviceError(
            f"the portable path folds {', '.join(FAMILIES)} arrays; got {ops.name} arrays "
            f"({type(values).__module__}.{type(values).__qualname__})"
        )
    return ops


def _check_out(ops: ArrayFamily, out_name: str) -> None:
    if out_name == "float64" and not ops.has_dtype("float64"):
        raise FoldTypeError(
            "float64 results need jax_enable_x64 (JAX makes no float64 arrays without it)"
        )


# -- the strategies ----------------------------------------------------------------------------
def fold_exact(
    plan: Fold, values: Any, spec: Values, out_name: str, *, init: Any = None, **options: Any
) -> Any:
    """Every bucket's exact sum, rounded once to ``out_name``, on the values' device.

    ``init`` ((K,) + trailing, same library and device, any float dtype) is one
    more term of every output element. Same bits as the host path.
    """
    check_options(options)
    ops = _check_family(values)
    _check_out(ops, out_name)
    K, D = plan.K, spec.row_size
    init_dtype = None if init is None else _float_name(init)
    bound = _max_count(plan) + (init is not None)
    word = words_for(_values_format(spec.dtype, init_dtype), ops.has_int64(values), bound).word
    index = _index(plan, ops, values, word)
    counts = _counts_rows(plan, ops, values, D, int(init is not None), word)
    if ops.name == "torch" and _reads_flags(ops, values):
        from .portable_torch import use_eager_fold

        use_eager_fold(_eager_torch_sums)
    flat = exact_sums(ops, values, index, counts, init, K, D, bound, out_name)
    return flat.reshape((K, *spec.trailing))


def _eager_torch_sums(values: Any, *args: Any) -> Any:
    """:func:`exact_sums` of eager torch tensors (what a compiled CPU fold falls back to)."""
    return exact_sums(family_of(values), values, *args)


def exact_sums(
    ops: ArrayFamily,
    values: Any,
    index: Any,
    counts: Any,
    init: Any,
    K: int,
    D: int,
    bound: int,
    out_name: str,
    *,
    words: Words | None = None,
    scaled: bool | None = None,
) -> Any:
    """The exact fold of ``values`` ((n,) or (n, ...) with ``D`` elements a row) by ``index``
    ((n,), the plan's words) into ``K`` buckets, rounded once: a flat ``(K·D,)`` array.

    ``counts`` ((K·D,), the plan's words) are every output element's terms,
    ``bound`` the most of one element (``init`` counted). Paths, each exact,
    the first that serves taken: the shared unit (:func:`shared_unit_plan`,
    where flags can be read or ``lax.cond`` branches), one word per element's
    unit (:func:`narrow_fold`), the digit tables (:func:`table_of`). Under
    ``torch.compile``, torch CPU tensors fold by the shared unit in the graph,
    and an operator (:mod:`bitfold.backends.portable_torch`) folds eagerly
    where it did not serve.

    ``words`` (default :func:`words_for` the values' library and ``bound``) hold
    the digit path's sums; ``scaled`` is :func:`narrow_fold`'s. ``index`` and
    ``counts`` are integers of ``words.word``.
    """
    dtype = _float_name(values)
    init_dtype = None if init is None else _float_name(init)
    fmt = _values_format(dtype, init_dtype)
    if words is None:
        words = words_for(fmt, ops.has_int64(values), bound)

    def digits() -> Any:
        table = table_of(ops, values, fmt, words, K * D, groups(), counts, bound)
        return round_table(ops, table.reshape(K * D, words.columns), words, fmt, out_name)

    def groups() -> list[tuple[Any, Any, str]]:
        rows = [(_rows(ops, index, D, values, words.word), values.reshape(-1), dtype)]
        if init is not None:
            rows.append((ops.arange(values, K * D, words.word), init.reshape(-1), init_dtype))
        return rows

    dtypes = [dtype] + ([] if init is None else [init_dtype])
    narrow = narrow_applies(dtypes, words.word == "int64")
    layout = shared_words(words.word, bound)
    if layout is None or max(FLOATS[d].precision for d in dtypes) > 24:
        return digits()  # float64 values, or more terms an element than int32 digits hold
    shape = (K,) if D == 1 else (K, D)
    narrow_groups = [(index, values.reshape((-1, *shape[1:])), dtype)]
    if init is not None:
        narrow_groups.append((ops.arange(values, K, words.word), init.reshape(shape), init_dtype))
    element_counts = counts.reshape(shape)
    terms = Terms(ops, values, fmt, shape, narrow_groups)

    def per_element() -> Any:
        if not narrow:
            return digits()
        out, bad = narrow_fold(terms, element_counts, out_name, scaled=scaled)
        return _choose(ops, values, bad, digits, lambda: out.reshape(-1))

    compiled_cpu = ops.name == "torch" and _torch_compiling() and ops.device(values) == "cpu"
    if not (_reads_flags(ops, values) or ops.name == "jax" or compiled_cpu):
        return per_element()
    unit, good = shared_unit_plan(terms, layout)
    if compiled_cpu:  # the shared unit in the graph; an eager fold where it does not serve
        from .portable_torch import portable_exact_unless

        out, zero_sum = shared_unit_fold(terms, element_counts, unit, layout, out_name,
                                         signs=False)  # fmt: skip
        redo = ~good | zero_sum
        return portable_exact_unless(out.reshape(-1), redo, values, index, counts, init, K, D,
                                     bound, out_name)  # fmt: skip

    def shared() -> Any:
        out, _ = shared_unit_fold(terms, element_counts, unit, layout, out_name)
        return out.reshape(-1)

    return _choose(ops, values, good, shared, per_element)


def segment_fold(
    data: Any, segment_ids: Any, num_segments: int, out_name: str, *, check: bool = True
) -> Any:
    """The exact fold of ``data`` ((n,) + trailing) by traced ``segment_ids`` ((n,)), no plan.

    For ids that live on the device only (JAX ids inside ``jit``): the counts
    come from an integer scatter of ones, the chunking from ``n``. An id
    outside ``[0, num_segments)`` cannot be refused without reading the ids on
    the host, so with ``check`` the whole result is the canonical NaN instead
    (never a silently wrong sum).
    """
    ops = _check_family(data)
    _check_out(ops, out_name)
    dtype = _float_name(data)
    n = int(segment_ids.shape[0])
    trailing = tuple(int(s) for s in data.shape[1:])
    K, D = num_segments, math.prod(trailing)
    fmt = limb_format_for(dtype)
    words = words_for(fmt, ops.has_int64(data), n)
    ids = ops.astype(segment_ids, words.word)
    ones = ops.astype(ids - ids + 1, words.word)
    counts = ops.scatter_add(ops.zeros(data, (K,), words.word), ids, ones)
    if D != 1:
        counts = (counts.reshape(-1, 1) + ops.zeros(data, (1, D), words.word)).reshape(-1)
    out = exact_sums(ops, data, ids, counts, None, K, D, max(n, 1), out_name)
    if check and n:
        bad = ops.amax(ops.astype((ids < 0) | (ids >= K), words.word), 0)
        nan = _canonical_nan(ops, out, out_name)
        out = ops.where(bad > 0, nan, out)
    return out.reshape((K, *trailing))


def _canonical_nan(ops: ArrayFamily, like: Any, out_name: str) -> Any:
    """The canonical NaN of ``out_name`` as a one-element array of ``like``'s family."""
    f = FLOATS[out_name]
    held = out_name if ops.has_dtype(out_name) else "float32"
    bits = f.canonical_nan << (16 if held != out_name else 0)
    width = FLOATS[held].signed_bits_dtype.name
    return ops.bitcast(ops.zeros(like, (1,), width) + bits, held)


def fold_ordered(
    plan: Fold, values: Any, spec: Values, out_name: str, *, init: Any = None, **options: Any
) -> Any:
    """``out[index[i]] += values[i]`` for i in increasing position, rounded in ``out_name``.

    The host's order and bits (``out`` starts as zeros, or ``init``), in
    ``max(counts)`` vector steps of K rows each; NaN results canonical.
    """
    check_options(options)
    ops = _check_family(values)
    _check_out(ops, out_name)
    K, D, N = plan.K, spec.row_size, spec.positions
    rows = ops.astype(values.reshape(N, D), out_name)
    acc = ops.zeros(values, (K, D), out_name)
    if init is not None:
        acc = ops.astype(init.reshape(K, D), out_name)
    word = "int64" if ops.has_int64(values) else "int32"
    order = _plan_array(plan, ops, values, "order", word)
    starts = _plan_array(plan, ops, values, "starts", word)
    counts = _plan_array(plan, ops, values, "counts", word)
    steps = _max_count(plan)

    def step(t: Any, acc: Any) -> Any:
        at = ops.take(order, ops.clip(starts + t, 0, max(N - 1, 0)))
        term = ops.take(rows, at)
        return acc + ops.where((counts > t).reshape(K, 1), term, -0.0)  # x + -0.0 == x

    if N:
        acc = ops.loop(steps, step, acc)
    return _canonical(ops, acc, out_name).reshape((K, *spec.trailing))


def _canonical(ops: ArrayFamily, out: Any, out_name: str) -> Any:
    """``out`` with every NaN replaced by the canonical NaN of ``out_name``."""
    return ops.where(out != out, _canonical_nan(ops, out, out_name), out)


def fold_atomic(
    plan: Fold, values: Any, spec: Values, out_name: str, *, init: Any = None, **options: Any
) -> Any:
    """The library's float scatter-add into zeros (or ``init``) of ``out_name``: no order."""
    check_options(options)
    ops = _check_family(values)
    _check_out(ops, out_name)
    K, D = plan.K, spec.row_size
    word = "int64" if ops.has_int64(values) else "int32"
    rows = _rows(ops, _index(plan, ops, values, word), D, values, word)
    out = ops.zeros(values, (K * D,), out_name)
    if init is not None:
        out = ops.astype(init.reshape(-1), out_name)
    out = ops.scatter_add(out, rows, ops.astype(values.reshape(-1), out_name))
    return out.reshape((K, *spec.trailing))


def expand(plan: Fold, v: Any, trailing: tuple[int, ...] = ()) -> Any:
    """``v[index]`` in the index's shape (then ``trailing``), on ``v``'s device and library."""
    ops = _check_family(v)
    word = "int64" if ops.has_int64(v) else "int32"
    return ops.take(v, _index(plan, ops, v, word)).reshape(plan.shape + tuple(trailing))


# -- exact states ------------------------------------------------------------------------------
def new_state(K: int, fmt: LimbFormat, trailing: tuple[int, ...] = (), like: Any = None) -> Any:
    """A zero state ``(K,) + trailing + (L + 5,)`` int64 beside ``like``, on its device.

    A host NumPy state without ``like``, or when ``like``'s library has no
    int64 (JAX in its default 32-bit mode: its 16-bit digits are converted to
    the host layout as they arrive, :func:`add_to_state`).
    """
    if like is None:
        return host_state.new_state(K, fmt, trailing)
    ops = _check_family(like)
    if not ops.has_int64(like):
        return host_state.new_state(K, fmt, trailing)
    return ops.zeros(like, (K, *trailing, fmt.width), "int64")


def _need_int64(ops: ArrayFamily, like: Any) -> None:
    if not ops.has_int64(like):
        raise FoldTypeError(
            "an accumulator state on the device is int64: enable jax_enable_x64, or add the "
            "values to a host accumulator (plan.accumulator().add(values))"
        )


def _table(plan: Fold, values: Any, spec: Values, fmt: LimbFormat) -> tuple[Any, Words]:
    """The table of ``values`` at plan positions ``spec.start ..``: (flat table, its words)."""
    ops = _check_family(values)
    D, n = spec.row_size, spec.positions
    if spec.start == 0 and n == plan.size:
        host_index, counts = plan.index, plan.counts
    else:
        host_index = plan.index[spec.start : spec.start + n]
        counts = np.bincount(host_index, minlength=plan.K).astype(np.int64)
    bound = int(counts.max(initial=0))
    words = words_for(fmt, ops.has_int64(values), bound)
    index = ops.constant(values, host_index.astype(words.word))
    rows = _rows(ops, index, D, values, words.word)
    counts_rows = ops.constant(values, np.repeat(counts, D).astype(words.word))
    groups = [(rows, values.reshape(-1), spec.dtype)]
    return table_of(ops, values, fmt, words, plan.K * D, groups, counts_rows, bound), words


def exact_state(plan: Fold, values: Any, spec: Values, fmt: LimbFormat) -> Any:
    """The accumulator state of ``values`` on their device: ``(K,) + trailing + (L + 5,)`` int64.

    Bit for bit a host state of the same values (carried or not, it has the
    same value): it merges with host states by integer addition.
    """
    ops = _check_family(values)
    _need_int64(ops, values)
    table, _ = _table(plan, values, spec, fmt)
    return table.reshape((plan.K, *spec.trailing, fmt.width))


def to_host_state(table: np.ndarray, words: Words, fmt: LimbFormat) -> np.ndarray:
    """A table of ``w``-bit digits (host copy, rows of ``words.columns``) in the host layout."""
    t = np.asarray(table, np.int64).reshape(-1, words.columns)
    if words.digit_bits == 32:
        return t
    per = 32 // words.digit_bits
    state = np.zeros((t.shape[0], fmt.width), np.int64)
    for i in range(words.digits):  # digits are carried: each below 2^w but the top one
        state[:, i // per] += t[:, i] << (words.digit_bits * (i % per))
    state[:, fmt.limbs :] = t[:, words.digits :]
    return state


def add_to_state(
    state: Any, plan: Fold, values: Any, spec: Values, fmt: LimbFormat, **options: Any
) -> Any:
    """Add ``values`` (plan positions ``spec.start ..``) into ``state``, exactly; the new state.

    The sums are made on the values' device. A state of the same place
    (library and device) adds their table there; a state elsewhere (the host,
    another device) gets the table copied to it once, in the host layout
    (:func:`to_host_state`: exact, the digits are integers).
    """
    check_options(options)
    ops = _check_family(values)
    table, words = _table(plan, values, spec, fmt)
    shape = tuple(int(s) for s in state.shape)
    if words.digit_bits == 32 and place_of(state) == place_of(values):
        return merge_states(state, table.reshape(shape), fmt)
    if words.digit_bits != 32:  # digits below 2^w before regrouping
        table = carried_table(ops, table, words, plan.K * spec.row_size)
    host_table = to_host_state(to_numpy(table), words, fmt).reshape(shape)
    return merge_states(state, from_numpy(host_table, like=state), fmt)


def merge_states(into: Any, other: Any, fmt: LimbFormat) -> Any:
    """``into + other``, carried: two states of one plan, format and place (library, device).

    Integer addition, exact in any order. The sum is carried (every limb but
    the top one below 2^32) so that any number of adds and merges stays clear
    of int64 overflow, as the host's merge normalises. Host states merge as
    the host's.
    """
    if isinstance(into, np.ndarray):
        return host_state.merge_states(into, other, fmt)
    total = into + other
    shape = tuple(int(s) for s in total.shape)
    rows = math.prod(shape[:-1])
    carried = carried_table(_check_family(total), total.reshape(-1), words_for(fmt, True, 1), rows)
    return carried.reshape(shape)


def round_state(state: Any, fmt: LimbFormat, out_name: str) -> Any:
    """Round every element of a state ``(K,) + trailing + (L + 5,)`` once to ``out_name``.

    The result is an array of the state's library and device (a host state
    rounds as the host's, the same bits).
    """
    if isinstance(state, np.ndarray):
        return host_state.round_state(state, fmt, out_name)
    ops = _check_family(state)
    words = words_for(fmt, True, 1)
    shape = tuple(int(s) for s in state.shape[:-1])
    flat = state.reshape(-1, fmt.width)
    return round_table(ops, flat, words, fmt, out_name).reshape(shape)


def check_options(options: dict[str, Any]) -> None:
    """The portable path takes no tuning options: refuse any, by name."""
    if options:
        raise FoldError(
            f"the portable backend takes no options; got {', '.join(f'{k}=' for k in options)}"
        )


def explain_route(plan: Fold, values: Any, spec: Values, **options: Any) -> tuple[str, str]:
    """``plan.route``'s answer: one route, integer words in the array library's operations."""
    ops = _check_family(values)
    word = "int64" if ops.has_int64(values) else "int32 (16-bit digits)"
    return "words", (
        f"{spec.dtype} {'rows' if spec.trailing else 'scalars'} of the {ops.name} family on "
        f"{ops.device(values)!r}: "
        + (
            "one int64 word a value, of one unit for the whole fold where every term is a "
            "multiple of it, else of each bucket's own where its terms fit one, else "
            if narrow_applies([spec.dtype], ops.has_int64(values))
            else ""
        )
        + f"integer digits scatter-added in {word} words, carried and rounded once with the "
        "library's own operations"
    )


#: The registry's entry: any device the families' libraries run on; an accumulator's state
#: lives beside its values (on the host for a library without int64).
BACKEND = Backend.from_functions(
    globals(),
    name=NAME,
    families=FAMILIES,
    devices=("*",),
    options=dict.fromkeys((*FOLDS, "add_to_state"), ()),  # no tuning option anywhere
    init=InitRule(strategies=FOLDS, mixed_dtypes=True),  # every fold, into any float dtype
    explain=explain_route,
    priority=-100,  # asked last: the safety net on every device
)

__all__ = [
    "BACKEND",
    "FAMILIES",
    "NAME",
    "Words",
    "add_to_state",
    "carried_table",
    "exact_state",
    "expand",
    "fold_atomic",
    "fold_exact",
    "fold_ordered",
    "merge_states",
    "new_state",
    "round_state",
    "round_table",
    "segment_fold",
    "table_of",
    "to_host_state",
    "words_for",
]
