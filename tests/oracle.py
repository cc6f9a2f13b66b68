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
    """The exact fold by definition: Fraction sums per bucket, each rounded once to ``out``.

    A ``"bfloat16"`` result is returned as the float32 array holding it.
    """
    idx = np.asarray(index).reshape(-1)
    vals = np.asarray(values).reshape(-1)
    buckets: dict[int, list[float]] = {}
    for k, v in zip(idx.tolist(), vals.astype(np.float64).tolist(), strict=True):
        buckets.setdefault(k, []).append(v)
    res = np.zeros(K, dtype=np.float64)  # an empty bucket: bucket_oracle([]) is +0.0
    for k, terms in buckets.items():
        res[k] = bucket_oracle(terms, out)
    # bfloat16 results come as the float32 holding them (NumPy has no bfloat16)
    held = "float32" if out == "bfloat16" else out
    with np.errstate(over="ignore", invalid="ignore"):
        result = res.astype(held)
    nan = np.isnan(result)
    result.view(UINT[held])[nan] = CANONICAL_NAN[held]
    return result


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
