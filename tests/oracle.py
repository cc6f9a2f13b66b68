"""The test oracle: exact rational sums rounded directly to the target.

Independent of bitfold's kernels by construction: it shares no code with
them. A bucket's floats are summed exactly as integers over 2**1074 (every float
is an integer times a power of two no smaller than that), and rounding goes
straight from the exact rational to the target format with integer arithmetic
(never through a float64 sum and a second rounding).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

# name -> (precision bits, exponent of the smallest subnormal, largest exponent)
FORMATS = {
    "float16": (11, -24, 15),
    "float32": (24, -149, 127),
    "float64": (53, -1074, 1023),
    "bfloat16": (8, -133, 127),
}
CANONICAL_NAN = {"float16": 0x7E00, "float32": 0x7FC00000, "float64": 0x7FF8000000000000}
UINT = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}


def round_fraction(x: Fraction, out: str = "float32") -> float:
    """``x`` rounded once to nearest-even in format ``out`` (±inf beyond the range).

    Returns a Python float holding the rounded value exactly; a zero result
    carries the sign of ``x``.
    """
    return _round_ratio(x.numerator, x.denominator, out)


def _round_ratio(p: int, q: int, out: str) -> float:
    """``p / q`` (``q > 0``, not necessarily in lowest terms) rounded as :func:`round_fraction`
    rounds: integer arithmetic throughout, no float touches the value before the result."""
    precision, sub_exp, emax = FORMATS[out]
    if p == 0:
        return 0.0
    sign = -1.0 if p < 0 else 1.0
    p = abs(p)
    e = p.bit_length() - q.bit_length()  # 2**(e-1) <= p/q < 2**(e+1)
    if (p << max(-e, 0)) < (q << max(e, 0)):  # p/q < 2**e
        e -= 1
    s = max(e - precision + 1, sub_exp)  # the exponent of the last bit kept
    num, den = p << max(-s, 0), q << max(s, 0)  # p/q / 2**s = num/den
    n, r = divmod(num, den)
    if 2 * r > den or (2 * r == den and n % 2 == 1):
        n += 1
    if emax + 1 - s < 0 or n >= 1 << (emax + 1 - s):  # n * 2**s >= 2**(emax+1)
        return sign * math.inf
    return sign * math.ldexp(float(n), s) if n else math.copysign(0.0, sign)


def bucket_oracle(terms: list[float], out: str = "float32") -> float:
    """The contract's result for one bucket whose terms are ``terms`` (Python floats)."""
    if not all(map(math.isfinite, terms)):
        if any(math.isnan(t) for t in terms):
            return math.nan
        pos = any(t == math.inf for t in terms)
        neg = any(t == -math.inf for t in terms)
        if pos and neg:
            return math.nan
        return math.inf if pos else -math.inf
    # the exact sum: each float is n / 2**k (k <= 1074), so the sum is that of the integers
    # n * 2**(1074 - k), over 2**1074 (the Fraction sum, without a gcd for every term)
    scaled = 0
    for t in terms:
        n, d = float(t).as_integer_ratio()  # d = 2**k
        scaled += n << (1075 - d.bit_length())
    if scaled == 0:
        all_negzero = bool(terms) and all(t == 0 and math.copysign(1, t) < 0 for t in terms)
        return -0.0 if all_negzero else 0.0
    return _round_ratio(scaled, 1 << 1074, out)


def exact_fold_oracle(index, values, K: int, out: str = "float32") -> np.ndarray:
    """The exact fold by definition: each bucket's exact sum rounded once to ``out``.

    The sums are those of :func:`bucket_oracle` (integers over a power of two,
    the zero, NaN and Inf rules), made for all buckets at once: each finite
    value is ``M * 2**E`` (``|M| < 2**53``), ``M`` is cut into two integers
    of at most 27 bits, and NumPy adds each bucket's halves of one exponent
    in int64 (exact below 2**36 terms); Python's integers then add each
    bucket's few exponent groups. ``tests/test_oracle.py`` holds it to
    :func:`bucket_oracle`, bucket by bucket. A ``"bfloat16"`` result is
    returned as the float32 array holding it.
    """
    idx = np.asarray(index).reshape(-1).astype(np.int64)
    vals = np.asarray(values).reshape(-1).astype(np.float64)
    if idx.shape != vals.shape:
        raise ValueError(f"{idx.size} ids for {vals.size} values")
    if idx.size and (idx.min() < 0 or idx.max() >= K):
        raise ValueError(f"ids outside [0, {K})")
    res = np.zeros(K, dtype=np.float64)  # an empty bucket: bucket_oracle([]) is +0.0
    for k, value in _bucket_results(idx, vals, K, out):
        res[k] = value
    # bfloat16 results come as the float32 holding them (NumPy has no bfloat16)
    held = "float32" if out == "bfloat16" else out
    with np.errstate(over="ignore", invalid="ignore"):
        result = res.astype(held)
    nan = np.isnan(result)
    result.view(UINT[held])[nan] = CANONICAL_NAN[held]
    return result


#: every finite float64 is M * 2**E with |M| < 2**53 and E >= -_LOWEST (a subnormal's M is
#: smaller); sums are kept as integers over 2**_LOWEST
_LOWEST = 1126
_HALF = 26  # M = hi * 2**_HALF + lo, 0 <= lo < 2**_HALF
_EXPONENT_BITS = 12  # E + _LOWEST < 2**_EXPONENT_BITS: a group's key is id and exponent


def _scaled_sums(idx: np.ndarray, vals: np.ndarray) -> dict[int, int]:
    """``{k: the exact sum of bucket k's finite values times 2**_LOWEST}`` (buckets with a
    non-zero finite value), each value's integer mantissa added at its exponent."""
    live = np.isfinite(vals) & (vals != 0)
    if not live.any():
        return {}
    mantissa, exponent = np.frexp(vals[live])  # 0.5 <= |mantissa| < 1
    M = np.ldexp(mantissa, 53).astype(np.int64)  # exact: an integer below 2**53
    key = (idx[live] << _EXPONENT_BITS) + (exponent.astype(np.int64) - 53 + _LOWEST)
    order = np.argsort(key, kind="stable")
    key, M = key[order], M[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    hi = np.add.reduceat(M >> _HALF, starts)
    lo = np.add.reduceat(M & ((1 << _HALF) - 1), starts)
    scaled: dict[int, int] = {}
    low_bits = (1 << _EXPONENT_BITS) - 1
    for group, h, low in zip(key[starts].tolist(), hi.tolist(), lo.tolist(), strict=True):
        k = group >> _EXPONENT_BITS
        scaled[k] = scaled.get(k, 0) + (((h << _HALF) + low) << (group & low_bits))
    return scaled


def _bucket_results(idx: np.ndarray, vals: np.ndarray, K: int, out: str):
    """``(k, bucket k's result as a Python float)`` for every bucket with terms."""
    def flags(mask: np.ndarray) -> np.ndarray:
        return np.bincount(idx[mask], minlength=K)

    count, negzero = flags(np.ones(idx.size, bool)), flags((vals == 0) & np.signbit(vals))
    nan, pos, neg = flags(np.isnan(vals)), flags(vals == np.inf), flags(vals == -np.inf)
    scaled = _scaled_sums(idx, vals)
    for k in np.flatnonzero(count).tolist():
        if nan[k] or (pos[k] and neg[k]):
            yield k, math.nan
        elif pos[k] or neg[k]:
            yield k, math.inf if pos[k] else -math.inf
        elif scaled.get(k, 0) == 0:
            yield k, -0.0 if negzero[k] == count[k] else 0.0
        else:
            yield k, _round_ratio(scaled[k], 1 << _LOWEST, out)


def ordered_fold_reference(index, values, K: int, out: str = "float32") -> np.ndarray:
    """The documented ``ordered`` order, as a plain Python loop with NumPy scalars."""
    dt = np.dtype(out).type
    acc = [dt(0.0) for _ in range(K)]
    for k, v in zip(
        np.asarray(index).reshape(-1).tolist(), np.asarray(values).reshape(-1), strict=True
    ):
        acc[k] = dt(acc[k] + dt(v))
    result = np.array(acc, dtype=out)
    result.view(UINT[out])[np.isnan(result)] = CANONICAL_NAN[out]  # documented: canonical NaN
    return result


def boundary_buckets(out: str) -> list[list[float]]:
    """float64 terms whose exact sums sit on, just below and just above the points where
    rounding to ``out`` changes: ties, the subnormal floor, the overflow threshold."""
    precision, sub_exp, emax = FORMATS[out]
    ulp = 2.0 ** (1 - precision)  # of 1.0
    half, tiny = ulp / 2, 2.0**-1000  # tiny: far below any output's precision, exact in float64
    top = (2 - ulp) * 2.0**emax  # the largest finite value
    top_half = 2.0 ** (emax - precision)  # half an ulp of it
    smallest = 2.0**sub_exp
    return [
        [1.0, half], [1.0, half, tiny], [1.0, half, -tiny], [1.0 + ulp, half],
        [-1.0, -half, -tiny], [-1.0 - ulp, -half], [3.0, -2.0, half, -half, half],
        [smallest / 2], [smallest / 2, tiny], [-smallest / 2], [-smallest / 2, -tiny],
        [smallest * 1.5], [smallest * 2.5], [smallest, -smallest / 2, -tiny],
        [top, top_half], [top, top_half, -tiny], [-top, -top_half, tiny],
        [2.0**emax, 2.0**emax, -top], [1e300, -1e300, half], [1e300, -(2.0**-1074)],
        [-0.0, -0.0], [-0.0, 0.0], [],
    ]  # fmt: skip
