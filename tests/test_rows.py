"""Folds of rows and the exact routes: every output element against the Fraction oracle.

``values.shape == index.shape + trailing`` folds to ``(K,) + trailing``; each
element is the correctly rounded sum of its bucket's values at that trailing
position. The host has several routes to the same bits (``backends.host_routes.TABLE``);
each is checked here on small inputs, the large-K ones by forcing the route
or lowering the thresholds that choose it.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from oracle import FORMATS, bucket_oracle, exact_fold_oracle, ordered_fold_reference

import bitfold
from bitfold import dispatch
from bitfold.backends import host, host_routes
from bitfold.kernels import cpu

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
F32_MAX = float(np.finfo(np.float32).max)
TINY = 2.0**-149


def bits(a):
    a = np.asarray(a)
    return a.view(UINT[a.dtype.itemsize])


def rows_oracle(index, values, K, out="float32"):
    """The oracle column by column: (K,) + trailing."""
    index = np.asarray(index)
    values = np.asarray(values)
    lead = index.ndim if values.shape[: index.ndim] == index.shape else 1
    flat = values.reshape(index.size, int(np.prod(values.shape[lead:])))
    cols = [exact_fold_oracle(index, flat[:, d], K, out) for d in range(flat.shape[1])]
    return np.stack(cols, axis=1).reshape((K, *values.shape[lead:]))


def assert_bits(got, want, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (what, got.shape, want.shape)
    bad = np.argwhere(bits(got) != bits(want))
    if bad.size:
        first = tuple(bad[0])
        pytest.fail(f"{what}: {len(bad)} elements differ, first {first}: {got[first]!r} "
                    f"vs {want[first]!r}")  # fmt: skip


# -- hand tables ----------------------------------------------------------------------------------
def test_rows_of_a_hand_table():
    index = np.array([0, 2, 0, 2, 2])
    values = np.array([[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]], np.float32)
    got = bitfold.Fold(index, 3)(values)
    assert got.shape == (3, 2)
    assert got.tolist() == [[6.0, 8.0], [0.0, 0.0], [19.0, 22.0]]


def test_index_shape_or_flat_positions_then_trailing():
    rng = np.random.default_rng(0)
    index = rng.integers(0, 4, (3, 5))
    plan = bitfold.Fold(index, 4)
    values = rng.standard_normal((3, 5, 2, 3)).astype(np.float32)
    a = plan(values)
    b = plan(values.reshape(15, 2, 3))
    assert a.shape == (4, 2, 3)
    assert_bits(a, b)
    assert_bits(a, rows_oracle(index, values, 4))


# One column of each case below holds the case, the other column plain numbers.
COLUMN_CASES = {
    "double-rounding trap": [1.0, 2.0**-24, 2.0**-80],
    "nan in one column": [1.0, math.nan, 3.0],
    "inf in one column": [math.inf, 1.0, -5.0],
    "inf and -inf": [math.inf, -math.inf, 1.0],
    "subnormal sum": [TINY, TINY, 3 * TINY],
    "subnormal cancellation": [TINY, -2 * TINY, 0.0],
    "all -0.0": [-0.0, -0.0, -0.0],
    "-0.0 and +0.0": [-0.0, 0.0, -0.0],
    "cancellation": [2.0**100, 1.0, -(2.0**100)],
    "overflow": [F32_MAX, F32_MAX, 1.0],
    "wide range": [2.0**120, 2.0**-140, -(2.0**120)],
}


@pytest.mark.parametrize("case", sorted(COLUMN_CASES))
def test_special_columns(case):
    terms = COLUMN_CASES[case]
    index = np.array([1, 1, 1, 3])  # buckets 0 and 2 stay empty
    values = np.array([[t, float(i + 1)] for i, t in enumerate(terms)] + [[2.5, -1.0]], np.float32)
    got = bitfold.Fold(index, 4)(values)
    want = rows_oracle(index, values, 4)
    assert_bits(got, want, case)
    assert bits(got[[0, 2]]).tolist() == [[0, 0], [0, 0]]  # empty buckets are +0.0
    if "nan" in case or "-inf" in case:
        assert bits(got)[1, 0] == bitfold.CANONICAL_NAN_BITS["float32"]


def test_buckets_larger_than_a_chunk_go_through_the_limbs():
    """Buckets of hundreds of rows over 2^-120..2^120: float64 chunk sums are inexact."""
    rng = np.random.default_rng(1)
    n, D, K = 700, 3, 3
    index = rng.integers(0, K, n)
    values = (rng.standard_normal((n, D)) * 2.0 ** rng.integers(-120, 120, (n, D)))
    values = values.astype(np.float32)
    values[::50, 1] = -0.0
    values[3, 2] = np.inf
    assert_bits(bitfold.Fold(index, K)(values), rows_oracle(index, values, K))


@pytest.mark.parametrize("out", ["float16", "float64", "bfloat16"])
def test_rows_rounded_to_other_output_dtypes(out, monkeypatch):
    rng = np.random.default_rng(2)
    index = rng.integers(0, 5, 300)
    values = (rng.standard_normal((300, 3)) * 2.0 ** rng.integers(-20, 15, (300, 3)))
    values = values.astype(np.float32)
    got = bitfold.Fold(index, 5)(values, out_dtype=out)
    if out != "bfloat16":
        assert_bits(got, rows_oracle(index, values, 5, out))
        return
    monkeypatch.setitem(FORMATS, "bfloat16", (8, -133, 127))
    want = np.array(
        [[bucket_oracle(values[index == k, d].astype(np.float64).tolist(), "bfloat16")
          for d in range(3)] for k in range(5)], np.float32
    )  # fmt: skip
    assert got.dtype == np.float32  # NumPy has no bfloat16: float32 holding bfloat16 values
    assert_bits(got, want)
    assert not (bits(got) & 0xFFFF).any()


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_rows_of_other_value_dtypes(dtype):
    rng = np.random.default_rng(3)
    index = rng.integers(0, 6, 400)
    spread = 8 if dtype == "float16" else 300
    values = (rng.standard_normal((400, 2)) * 2.0 ** rng.integers(-spread, spread, (400, 2)))
    values = values.astype(dtype)
    out = "float64" if dtype == "float64" else "float32"
    got = bitfold.Fold(index, 6)(values)
    assert got.dtype == np.dtype(out)
    assert_bits(got, rows_oracle(index, values, 6, out))


def test_bfloat16_rows_from_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    rng = np.random.default_rng(4)
    index = rng.integers(0, 5, 200)
    wide = torch.from_numpy(rng.standard_normal((200, 4)).astype(np.float32))
    values = wide.to(torch.bfloat16)
    got = bitfold.Fold(index, 5)(values)
    assert isinstance(got, torch.Tensor) and got.shape == (5, 4) and got.dtype == torch.float32
    assert_bits(got.numpy(), rows_oracle(index, values.float().numpy(), 5))


# -- properties -----------------------------------------------------------------------------------
floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def row_problems(draw, values=floats32, max_n=50, max_d=4):
    K = draw(st.integers(1, 8))
    n = draw(st.integers(0, max_n))
    D = draw(st.integers(1, max_d))
    idx = draw(st.lists(st.integers(0, K - 1), min_size=n, max_size=n))
    vals = draw(st.lists(st.lists(values, min_size=D, max_size=D), min_size=n, max_size=n))
    return np.array(idx, np.int64), np.array(vals, np.float32).reshape(n, D), K


@given(row_problems())
def test_property_rows_equal_the_oracle(problem):
    idx, vals, K = problem
    assert_bits(bitfold.Fold(idx, K)(vals), rows_oracle(idx, vals, K))


@given(row_problems(values=finite32), st.randoms(use_true_random=False))
def test_property_rows_invariant_under_permutation(problem, rnd):
    idx, vals, K = problem
    perm = list(range(idx.size))
    rnd.shuffle(perm)
    assert_bits(bitfold.Fold(idx, K)(vals), bitfold.Fold(idx[perm], K)(vals[perm]))


@given(row_problems(), st.lists(st.integers(0, 50), max_size=4), st.randoms(use_true_random=False))
def test_property_rows_split_through_accumulators(problem, cuts, rnd):
    idx, vals, K = problem
    plan = bitfold.Fold(idx, K)
    D = vals.shape[1]
    bounds = sorted({0, idx.size, *(c for c in cuts if c <= idx.size)})
    pieces = list(itertools.pairwise(bounds))
    rnd.shuffle(pieces)
    total = plan.accumulator(trailing=(D,))
    for lo, hi in pieces:
        total += plan.accumulator(trailing=(D,)).add(vals[lo:hi], start=lo)
    assert total.state.shape == (K, D, 15)
    assert_bits(total.result(), plan(vals))
    rebuilt = bitfold.ExactAccumulator.from_state(plan, total.state.copy())
    assert rebuilt.trailing == (D,)
    assert_bits(rebuilt.result(), plan(vals))


def test_accumulator_of_float64_rows():
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 4, 90)
    vals = rng.standard_normal((90, 2)) * 2.0 ** rng.integers(-200, 200, (90, 2))
    plan = bitfold.Fold(idx, 4)
    acc = plan.accumulator("float64", trailing=(2,))
    acc.add(vals[:40], start=0).add(vals[40:], start=40)
    assert acc.state.shape == (4, 2, 72)
    assert_bits(acc.result(), rows_oracle(idx, vals, 4, "float64"))


# -- the other strategies and expand --------------------------------------------------------------
def test_ordered_rows_follow_the_documented_order():
    rng = np.random.default_rng(6)
    idx = rng.integers(0, 5, 200)
    vals = (rng.standard_normal((200, 3)) * 2.0 ** rng.integers(-30, 30, (200, 3)))
    vals = vals.astype(np.float32)
    got = bitfold.Fold(idx, 5)(vals, "ordered")
    want = np.stack([ordered_fold_reference(idx, vals[:, d], 5) for d in range(3)], axis=1)
    assert_bits(got, want)
    halves = rng.standard_normal((200, 3)).astype(np.float16)
    half = bitfold.Fold(idx, 5)(halves, "ordered", out_dtype="float16")
    want16 = np.stack(
        [ordered_fold_reference(idx, halves[:, d], 5, "float16") for d in range(3)], axis=1
    )
    assert_bits(half, want16)


def test_atomic_rows_are_close():
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 5, 200)
    vals = rng.standard_normal((200, 3)).astype(np.float32)
    ref = np.zeros((5, 3))
    np.add.at(ref, idx, vals.astype(np.float64))
    np.testing.assert_allclose(bitfold.Fold(idx, 5)(vals, "atomic"), ref, rtol=1e-5, atol=1e-5)


def test_expand_rows_is_the_gather():
    rng = np.random.default_rng(8)
    index = rng.integers(0, 6, (4, 5))
    table = rng.standard_normal((6, 3, 2)).astype(np.float32)
    got = bitfold.Fold(index, 6).expand(table)
    assert got.shape == (4, 5, 3, 2)
    np.testing.assert_array_equal(got, table[index])


# -- refusals -------------------------------------------------------------------------------------
def test_a_flat_vector_of_n_times_d_values_is_refused():
    plan = bitfold.Fold(np.arange(4) % 2, 2)
    with pytest.raises(bitfold.ShapeError, match=r"\(12,\).*ambiguous: reshape it to \(4, 3\)"):
        plan(np.ones(12, np.float32))


def test_trailing_mismatches_are_refused():
    plan = bitfold.Fold(np.arange(4) % 2, 2)
    acc = plan.accumulator(trailing=(3,))
    with pytest.raises(bitfold.ShapeError, match=r"rows of shape \(2,\).*rows of\s+shape \(3,\)"):
        acc.add(np.ones((4, 2), np.float32))
    with pytest.raises(bitfold.ShapeError, match=r"rows of shape \(\)"):
        acc.add(np.ones(2, np.float32), start=0)
    with pytest.raises(bitfold.ShapeError, match="cannot merge"):
        acc.merge(plan.accumulator(trailing=(2,)))
    with pytest.raises(bitfold.ShapeError, match=r"\(2, 3, 15\)"):
        bitfold.ExactAccumulator.from_state(plan, np.zeros((3, 3, 15), np.int64))
    with pytest.raises(bitfold.ShapeError, match=r"expand needs v of shape \(2,\)"):
        plan.expand(np.ones((3, 2), np.float32))
    with pytest.raises(bitfold.FoldTypeError, match="trailing must be a shape"):
        plan.accumulator(trailing=3)


# -- the routes -----------------------------------------------------------------------------------
ROUTE_CASES = [("float32", r) for r in ("limbs", "float-stream", "sorted-stream", "buckets")]
ROUTE_CASES += [("float16", r) for r in ("limbs", "half-stream", "sorted-stream", "buckets")]
ROUTE_CASES += [("float64", r) for r in ("limbs", "sorted-stream", "buckets")]


@pytest.mark.parametrize(("dtype", "route"), ROUTE_CASES)
@pytest.mark.parametrize("K", [1, 7, 300])
def test_every_route_gives_the_oracle_bits(dtype, route, K):
    rng = np.random.default_rng(K)
    n = 2000
    idx = rng.integers(0, K, n)
    spread = 10 if dtype == "float16" else (300 if dtype == "float64" else 60)
    vals = (rng.standard_normal(n) * 2.0 ** rng.integers(-spread, spread, n)).astype(dtype)
    vals[:7] = [-0.0, np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0]
    plan = bitfold.Fold(idx, K)
    out = "float64" if dtype == "float64" else "float32"
    for out_dtype in (None, "float16"):
        got = dispatch.fold(plan, vals, route=route, out_dtype=out_dtype)
        assert_bits(got, exact_fold_oracle(idx, vals, K, out_dtype or out), f"{route} {out_dtype}")
    zero = bitfold.Fold([0, 0, 2], 4)
    assert bits(dispatch.fold(zero, np.array([-0.0, -0.0, 0.0], dtype), route=route))[:3].tolist() \
        == [1 << (8 * np.dtype(out).itemsize - 1), 0, 0]  # fmt: skip


@pytest.mark.parametrize(("dtype", "route"), ROUTE_CASES)
def test_buckets_of_more_than_a_chunk_of_negative_zeros(dtype, route):
    """40 x -0.0 (more than one float64 chunk) is -0.0; one +0.0 among them makes +0.0."""
    n = 40
    vals = np.full(2 * n + 3, -0.0, dtype)
    vals[-1] = 0.0  # bucket 1: 40 x -0.0 and one +0.0
    idx = np.array([0] * n + [1] * n + [2, 2, 1])
    plan = bitfold.Fold(idx, 4)
    got = dispatch.fold(plan, vals, route=route)
    sign = 1 << (8 * got.dtype.itemsize - 1)
    assert bits(got).tolist() == [sign, 0, sign, 0]
    assert_bits(got, exact_fold_oracle(idx, vals, 4, got.dtype.name))
    if route == "buckets":  # and in a fold of rows
        rows = dispatch.fold(plan, np.stack([vals, vals], 1), route=route)
        assert bits(rows).tolist() == [[sign, sign], [0, 0], [sign, sign], [0, 0]]


def test_routes_are_chosen_by_shape_and_thresholds(monkeypatch):
    spec = dispatch.validate
    plan = bitfold.Fold(np.arange(50) % 10, 10)
    f32, f16, f64 = (np.ones(50, d) for d in ("float32", "float16", "float64"))
    assert host.choose_route(plan, spec(plan, f32)) == "limbs"
    assert host.choose_route(plan, spec(plan, f16)) == "half-stream"
    assert host.choose_route(plan, spec(plan, np.ones((50, 2), np.float32))) == "buckets"
    monkeypatch.setattr(host_routes, "LIMBS_MAX_K", 4)
    assert host.choose_route(plan, spec(plan, f32)) == "float-stream"
    monkeypatch.setattr(host_routes, "FLOAT_STREAM_MAX_K", 8)
    assert host.choose_route(plan, spec(plan, f32)) == "sorted-stream"
    assert host.choose_route(plan, spec(plan, f16)) == "half-stream"  # its own bound
    monkeypatch.setattr(host_routes, "HALF_STREAM_MAX_K", 8)
    assert host.choose_route(plan, spec(plan, f16)) == "sorted-stream"
    monkeypatch.setattr(host_routes, "LIMBS_FLOAT64_MAX_K", 8)
    assert host.choose_route(plan, spec(plan, f64)) == "sorted-stream"
    with pytest.raises(bitfold.FoldError, match="unknown exact route 'fast'"):
        dispatch.fold(plan, f32, route="fast")
    with pytest.raises(bitfold.FoldError, match="folds scalars only"):
        dispatch.fold(plan, np.ones((50, 2), np.float32), route="limbs")
    with pytest.raises(bitfold.FoldError, match="float16 values only; got float32"):
        dispatch.fold(plan, f32, route="half-stream")


@pytest.mark.parametrize(("dtype", "route"), [c for c in ROUTE_CASES if c[1] != "buckets"])
def test_rows_of_one_element_take_the_scalar_routes(dtype, route):
    """(N, 1) and (N, 1, 1) values are scalars: a scalar route, the scalars' bits, rows' shape."""
    rng = np.random.default_rng(6)
    K = 40
    idx = rng.integers(0, K, 700)
    vals = (rng.standard_normal(700) * np.exp2(rng.integers(-20, 20, 700))).astype(dtype)
    plan = bitfold.Fold(idx, K)
    want = exact_fold_oracle(idx, vals, K, "float64" if dtype == "float64" else "float32")
    for shape in ((700, 1), (700, 1, 1)):
        column = vals.reshape(shape)
        assert host.choose_route(plan, dispatch.validate(plan, column)) != "buckets"
        got = dispatch.fold(plan, column, route=route)
        assert got.shape == (K, *shape[1:])
        assert_bits(got.reshape(K), want, f"{route} {shape}")


@pytest.mark.parametrize("route", ["float-stream", "half-stream", "sorted-stream", "buckets"])
def test_parallel_paths_agree_with_the_oracle(route, monkeypatch):
    """Small inputs run serially; a lower threshold sends them through slots and bucket chunks."""
    monkeypatch.setattr(cpu, "PARALLEL_MIN_VALUES", 64)
    rng = np.random.default_rng(9)
    n, K = 3000, 40
    idx = rng.integers(0, K, n)
    dtype = "float16" if route == "half-stream" else "float32"
    vals = (rng.standard_normal(n) * 2.0 ** rng.integers(-10, 10, n)).astype(dtype)
    vals[::301] = np.inf
    plan = bitfold.Fold(idx, K)
    assert host_routes.stream_slots(n, K) >= 1
    assert host_routes.bucket_bounds(plan, n).size == host_routes.BUCKET_CHUNKS + 1
    assert_bits(dispatch.fold(plan, vals, route=route), exact_fold_oracle(idx, vals, K))
    rows = (rng.standard_normal((n, 5)) * 2.0 ** rng.integers(-40, 40, (n, 5))).astype(np.float32)
    assert_bits(plan(rows), rows_oracle(idx, rows, K))


THREAD_SCRIPT = """
import json, sys, numpy as np, bitfold
from bitfold import dispatch
rng = np.random.default_rng(5)
n, K, D = 60_000, int(sys.argv[1]), 8
idx = rng.integers(0, K, n)
rows = (rng.normal(size=(n, D)) * 2.0 ** rng.integers(-40, 40, (n, D))).astype(np.float32)
plan = bitfold.Fold(idx, K)
out = {"rows": bitfold.digest(plan(rows))}
for route in ("float-stream", "sorted-stream", "buckets"):
    out[route] = bitfold.digest(dispatch.fold(plan, rows[:, 0].copy(), route=route))
out["half"] = bitfold.digest(plan(rows[:, 1].astype(np.float16)))
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("K", [300, 50_000])
def test_same_bits_for_every_thread_count(K):
    digests = []
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads)
        out = subprocess.run([sys.executable, "-c", THREAD_SCRIPT, str(K)], env=env,
                             capture_output=True, text=True, check=True)  # fmt: skip
        digests.append(json.loads(out.stdout))
    assert digests[0] == digests[1]
    routes = digests[0]
    assert routes["float-stream"] == routes["sorted-stream"] == routes["buckets"]


# -- folds into an existing array (init) -----------------------------------------------------------
@pytest.mark.parametrize("D", [1, 3])
@pytest.mark.parametrize("n", [0, 10, 200])
def test_folding_into_an_existing_array_rounds_once(D, n):
    rng = np.random.default_rng(n + D)
    K = 6
    idx = rng.integers(0, K, n)
    vals = (rng.standard_normal((n, D)) * 2.0 ** rng.integers(-40, 40, (n, D))).astype(np.float32)
    init = (rng.standard_normal((K, D)) * 2.0 ** rng.integers(-40, 40, (K, D))).astype(np.float32)
    init[0, 0], init[1, D - 1], init[2, 0] = np.nan, -0.0, 2.0**100
    plan = bitfold.Fold(idx, K)
    got = dispatch.fold(plan, vals, init=init)
    for k in range(K):
        for d in range(D):
            terms = [float(init[k, d]), *(float(x) for x in vals[idx == k, d])]
            want = np.float32(bucket_oracle(terms))
            if np.isnan(want):
                want = np.array(bitfold.CANONICAL_NAN_BITS["float32"], np.uint32).view(np.float32)
            assert bits(got[k, d]) == bits(want), (k, d, terms)
    ordered = init.copy()  # the documented order: from init, position after position
    for i, k in enumerate(idx.tolist()):
        ordered[k] = ordered[k] + vals[i]
    ordered.view(np.uint32)[np.isnan(ordered)] = bitfold.CANONICAL_NAN_BITS["float32"]
    assert_bits(dispatch.fold(plan, vals, "ordered", init=init), ordered)
    ref = init.astype(np.float64)  # atomic promises no order: within float rounding
    np.add.at(ref, idx, vals.astype(np.float64))
    other = dispatch.fold(plan, vals, "atomic", init=init)
    finite = np.isfinite(ref)
    np.testing.assert_allclose(other[finite], ref[finite], rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("D", [1, 5])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("route", ["auto", "buckets"])
def test_a_bucket_without_rows_keeps_its_old_value_bit_for_bit(dtype, route, D):
    """Into an existing array, a bucket no row (or value, ``D == 1``) reaches is its old value:
    subnormals, -0.0 and infinities as they were, any NaN the canonical one (as the oracle
    rounds one term)."""
    rng = np.random.default_rng(7)
    K, n = 40, 30
    idx = rng.integers(0, 10, n)  # buckets 10 .. 39 get no row
    vals = rng.standard_normal((n, D)).astype(dtype)
    init = rng.standard_normal((K, D)).astype(dtype)
    u = UINT[init.itemsize]
    top = np.dtype(u).type(1 << (8 * init.itemsize - 1))
    exp = np.dtype(u).type(0x7F800000 if dtype == "float32" else 0x7FF0000000000000)
    specials = [exp | 0x123, exp | 0x400 | top, exp + 1, top, 1, top | 5, exp, exp | top, 0]
    for j, raw in enumerate(specials):
        bits(init)[12 + j, j % D] = raw  # in buckets without rows
        bits(init)[j, (j + 1) % D] = raw  # and in buckets with rows
    plan = bitfold.Fold(idx, K)
    if D == 1:
        vals, init = vals[:, 0], init[:, 0]
    got = dispatch.fold(plan, vals, init=init, **({} if route == "auto" else {"route": route}))
    got, vals, init = got.reshape(K, D), vals.reshape(n, D), init.reshape(K, D)
    every = np.concatenate([idx, np.arange(K)])
    for d in range(D):
        terms = np.concatenate([vals[:, d], init[:, d]])
        assert_bits(got[:, d], exact_fold_oracle(every, terms, K, dtype))
    assert bits(got)[12, 0] == bitfold.CANONICAL_NAN_BITS[dtype]


def test_init_is_checked():
    plan = bitfold.Fold([0, 1, 1], 2)
    with pytest.raises(bitfold.ShapeError, match=r"init of shape \(K,\) \+ trailing = \(2,\)"):
        dispatch.fold(plan, np.ones(3, np.float32), init=np.zeros(3, np.float32))
    with pytest.raises(bitfold.FoldTypeError, match="int64"):
        dispatch.fold(plan, np.ones(3, np.float32), init=np.zeros(2, np.int64))
    assert dispatch.fold(plan, np.ones(3, np.float32), init=np.ones(2)).dtype == np.float64
