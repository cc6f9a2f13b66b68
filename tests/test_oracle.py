"""The oracle's whole-array fold (``exact_fold_oracle``) against its bucket-by-bucket definition
(``bucket_oracle``: each term's exact integer, summed and rounded once), bit for bit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from oracle import CANONICAL_NAN, UINT, bucket_oracle, exact_fold_oracle


def _by_bucket(index: np.ndarray, values: np.ndarray, K: int, out: str) -> np.ndarray:
    terms: list[list[float]] = [[] for _ in range(K)]
    for k, v in zip(index.tolist(), values.astype(np.float64).tolist(), strict=True):
        terms[k].append(v)
    held = "float32" if out == "bfloat16" else out
    with np.errstate(over="ignore", invalid="ignore"):
        result = np.array([bucket_oracle(t, out) for t in terms]).astype(held)
    result.view(UINT[held])[np.isnan(result)] = CANONICAL_NAN[held]
    return result


def _hard_values(rng: np.random.Generator, n: int) -> np.ndarray:
    """Exponents from the subnormals to the largest, both signs, exact cancellations."""
    values = rng.standard_normal(n) * np.exp2(rng.integers(-1074, 1000, n).astype(np.float64))
    values[: n // 8] = np.exp2(rng.integers(-1074, -1022, n // 8).astype(np.float64))  # subnormal
    values[n // 8 : n // 4] = -values[: n // 8]  # each cancels one above
    return values


@pytest.mark.parametrize("out", ["float16", "bfloat16", "float32", "float64"])
def test_the_whole_array_fold_is_each_buckets_oracle(out):
    rng = np.random.default_rng(7)
    K, n = 40, 6000
    values = np.concatenate([_hard_values(rng, n), rng.standard_normal(n).astype(np.float32)])
    index = rng.integers(0, K - 8, values.size)
    specials = {K - 8: [math.nan, 1.0], K - 7: [math.inf, -math.inf], K - 6: [math.inf, 2.0],
                K - 5: [-math.inf, 1e300], K - 4: [-0.0, -0.0], K - 3: [-0.0, 0.0],
                K - 2: [1e300, -1e300]}  # fmt: skip
    for k, terms in specials.items():  # bucket K - 1 stays empty
        index = np.concatenate([index, [k] * len(terms)])
        values = np.concatenate([values, terms])
    got = exact_fold_oracle(index, values, K, out)
    want = _by_bucket(index, values, K, out)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(UINT[got.dtype.name]), want.view(UINT[want.dtype.name]))


def test_a_bucket_of_many_large_mantissas_does_not_overflow():
    """2**18 terms whose integers are just below 2**53 at one exponent: halves' sums of 2**45."""
    values = np.full(1 << 18, np.nextafter(2.0, 0.0))  # mantissa 2**53 - 1
    values[::2] = -np.nextafter(1.0, 0.0) / 3
    index = np.zeros(values.size, np.int64)
    got = exact_fold_oracle(index, values, 1, "float64")
    want = _by_bucket(index, values, 1, "float64")
    assert got.view(np.uint64)[0] == want.view(np.uint64)[0]


def test_ids_outside_the_buckets_are_refused():
    with pytest.raises(ValueError, match="outside"):
        exact_fold_oracle(np.array([0, 3]), np.ones(2), 3)
    with pytest.raises(ValueError, match="outside"):
        exact_fold_oracle(np.array([-1]), np.ones(1), 3)
