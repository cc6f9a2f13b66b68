"""The Triton lanes' one-word path: a bucket whose certificate holds sums in one word.

A lane sums its terms in one pass and keeps their exponent bounds; where ``bit_length(terms)
+ (p_hi - p_lo) + significand bits`` is at most 53 (float32, bfloat16, float16: a float64
sum) or 62 (float64: one shifted integer a value in an int64 word) and no term is a NaN or an
infinity, the word is exact and rounded once; elsewhere the lane walks the limbs. Each case
below is compared bit for bit with the Fraction oracle on Triton's interpreter: buckets on both
sides of the certificate's edge (one binary order either side), ties, subnormal sums, -0.0,
specials, an init and every output dtype.
"""

from __future__ import annotations

import numpy as np
import pytest

# the Triton interpreter's skips and the bits helper, as the backend's own tests have them
# (importing that module skips this one too where torch or triton is missing)
import test_triton_backend

torch = test_triton_backend.torch
pytestmark = test_triton_backend.pytestmark

from oracle import bucket_oracle  # noqa: E402

import bitfold  # noqa: E402

SIGNIFICAND = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


_bits = test_triton_backend.bits


def _edge_bucket(dtype: str, terms: int, over: int) -> list[float]:
    """``terms`` values whose exponent range puts the certificate ``over`` orders past its edge
    (``over <= 0``: the word holds them; ``over > 0``: the limbs take them)."""
    width = 62 if dtype == "float64" else 53  # an int64 word, or a float64 sum
    span = width - terms.bit_length() - SIGNIFICAND[dtype] + over  # wanted p_hi - p_lo
    span = max(0, min(span, 100))
    top = 2.0 ** (span // 2)
    low = top * 2.0**-span
    out = [top * 1.5, low * 1.25] + [top * 0.75] * (terms - 2)
    if terms > 3:
        out[2] = -low  # a negative term at the lowest order
    return out


def _run(buckets: list[list[float]], dtype: str, out: str = "float32", init=None):
    index = np.concatenate([np.full(len(b), k) for k, b in enumerate(buckets)]).astype(np.int64)
    flat = [v for b in buckets for v in b]
    values = torch.tensor(flat, dtype=torch.float64).to(getattr(torch, dtype))
    plan = bitfold.Fold(index, len(buckets))
    kwargs = {} if init is None else {"init": init}
    got = plan(values, backend="triton", out_dtype=out, **kwargs)
    terms = [[float(v) for v in values[index == k].to(torch.float64)] for k in range(len(buckets))]
    if init is not None:
        terms = [[*t, float(init[k].to(torch.float64))] for k, t in enumerate(terms)]
    want = torch.tensor([bucket_oracle(t, out) for t in terms], dtype=torch.float64)
    return got, want.to(getattr(torch, out))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_buckets_either_side_of_the_certificate_edge_are_the_oracle(dtype):
    buckets = [_edge_bucket(dtype, n, over) for n in (2, 5, 17) for over in (-1, 0, 1, 2)]
    out = "float64" if dtype == "float64" else "float32"
    got, want = _run(buckets, dtype, out)
    assert torch.equal(_bits(got), _bits(want)), (got, want)


@pytest.mark.parametrize("out", ["float32", "float16", "bfloat16", "float64"])
def test_ties_subnormals_zeros_and_specials_through_the_word_path(out):
    tiny = 2.0**-149
    buckets = [
        [1.0, 2.0**-24, 2.0**-24],  # a tie that a float sum loses: 1 + 2^-23
        [1.0, 2.0**-24],  # a tie to even: 1
        [tiny, tiny, -tiny * 3],  # a subnormal sum: -tiny
        [tiny * 5, tiny * 7],  # subnormal, exact
        [-0.0, -0.0],  # every term -0.0: -0.0
        [-0.0, 0.0],  # +0.0
        [1.5, -1.5],  # zero sum: +0.0
        [],  # empty: +0.0
        [float("inf"), 1.0],
        [float("-inf"), float("inf")],  # NaN
        [float("nan"), 2.0],
        [3.0e38, 3.0e38],  # beyond float32's range: inf
        [2.0**-10, 3.0, -2.0**-12] * 3,
    ]
    got, want = _run(buckets, "float32", out)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(_bits(got)[~nan], _bits(want)[~nan]), (got, want)


def test_an_init_joins_the_word():
    buckets = [[1.0, 2.0**-24], [0.5, 0.25], [-0.0], [2.0**-30, 2.0**10]]
    init = torch.tensor([2.0**-24, -0.75, -0.0, 1.0])
    got, want = _run(buckets, "float32", "float32", init=init)
    assert torch.equal(_bits(got), _bits(want)), (got, want)


def test_random_rows_with_both_paths_in_one_program():
    rng = np.random.default_rng(4)
    K, N, D = 40, 600, 3
    index = rng.integers(0, K, N)
    index[:40] = 0  # one bucket of many terms over many orders: the limbs
    values = rng.standard_normal((N, D)) * np.exp2(rng.integers(-8, 8, (N, D)))
    values[:40] *= np.exp2(rng.integers(-60, 60, (40, D)))
    t = torch.from_numpy(values).float()
    plan = bitfold.Fold(index, K)
    got = plan(t, backend="triton")
    host = plan(t.numpy())
    assert np.array_equal(got.numpy().view(np.int32), host.view(np.int32))


def test_route_says_how_many_lanes_take_each_path():
    buckets = [_edge_bucket("float32", 5, over) for over in (-1, 0, 1, 2)] + [[1.0, 2.0]]
    index = np.concatenate([np.full(len(b), k) for k, b in enumerate(buckets)]).astype(np.int64)
    values = torch.tensor([v for b in buckets for v in b], dtype=torch.float32)
    route = bitfold.Fold(index, len(buckets)).route(values, backend="triton")
    assert "of its 5 lanes with terms, 3 sum one float64 word a value" in route.reason
    assert "and 2 the limbs" in route.reason
