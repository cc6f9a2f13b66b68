"""The exact fold: the adversarial table, oracle properties, invariances and the accumulator."""

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
from oracle import exact_fold_oracle

import bitfold
from bitfold.exact import ExactAccumulator

F32_MAX = float(np.finfo(np.float32).max)
TINY = 2.0**-149
KERNELS = ("binned", "limbs")


def exact_with(kernel, idx, vals, K, out=None, carry_every=None):
    plan = bitfold.Fold(idx, K)
    acc = ExactAccumulator(
        plan, np.asarray(vals).dtype.name, kernel=kernel, carry_every=carry_every
    )
    return acc.add(vals).result(out)


def u32(x):
    return np.asarray(x, np.float32).view(np.uint32)


# One bucket each: (name, terms, expected float32 result)
ADVERSARIAL = [
    ("double-rounding trap", [1.0, 2.0**-24, 2.0**-80], 1.0 + 2.0**-23),
    ("tie to even stays", [1.0, 2.0**-24], 1.0),
    ("tie to even goes up", [1.0 + 2.0**-23, 2.0**-24], 1.0 + 2.0**-22),
    ("tie below even", [-1.0, -(2.0**-24)], -1.0),
    ("massive cancellation", [2.0**100, 1.0, -(2.0**100)], 1.0),
    ("cancellation to a subnormal", [F32_MAX, TINY, -F32_MAX], TINY),
    ("all subnormal", [TINY, TINY, 3 * TINY], 5 * TINY),
    ("subnormal cancellation", [TINY, -2 * TINY], -TINY),
    ("subnormal to normal", [2.0**-126 - TINY, TINY], 2.0**-126),
    ("overflow at the boundary", [F32_MAX, 2.0**103], math.inf),
    ("a hair below the boundary", [F32_MAX, 2.0**103 - 2.0**80], F32_MAX),
    ("negative overflow", [-F32_MAX, -F32_MAX], -math.inf),
    ("overflow then back", [F32_MAX, F32_MAX, -F32_MAX], F32_MAX),
    ("-0.0 alone", [-0.0], -0.0),
    ("-0.0 twice", [-0.0, -0.0], -0.0),
    ("-0.0 and +0.0", [-0.0, 0.0], 0.0),
    ("x and -x", [-1.5, 1.5], 0.0),
    ("-0.0 and a cancelling pair", [-0.0, 1.0, -1.0], 0.0),
    ("nan", [math.nan, 1.0], math.nan),
    ("+inf", [math.inf, 1.0, -F32_MAX], math.inf),
    ("-inf", [-math.inf, -math.inf, F32_MAX], -math.inf),
    ("+inf and -inf", [math.inf, -math.inf], math.nan),
    ("nan and inf", [math.inf, math.nan], math.nan),
    ("empty", [], 0.0),
]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    ("name", "terms", "expected"), ADVERSARIAL, ids=[a[0] for a in ADVERSARIAL]
)
def test_adversarial_table(kernel, name, terms, expected):
    K = 2  # bucket 1 holds the terms, bucket 0 stays empty
    idx = np.ones(len(terms), np.int64)
    vals = np.array(terms, np.float32)
    got = exact_with(kernel, idx, vals, K)
    oracle = exact_fold_oracle(idx, vals, K)
    want = np.array([0.0, expected], np.float32)
    want.view(np.uint32)[np.isnan(want)] = bitfold.CANONICAL_NAN_BITS["float32"]
    np.testing.assert_array_equal(oracle.view(np.uint32), want.view(np.uint32))  # the table
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_fsum_then_cast_would_be_wrong():
    """The trap the oracle avoids: math.fsum then float32 rounds twice."""
    terms = [1.0, 2.0**-24, 2.0**-80]
    assert np.float32(math.fsum(terms)) == np.float32(1.0)
    assert bitfold.Fold([0, 0, 0], 1)(np.array(terms, np.float32))[0] == np.float32(1 + 2.0**-23)


def test_non_canonical_nans_become_the_canonical_one():
    payloads = np.array([0x7FC12345, 0xFFC00000, 0x7F800001], np.uint32).view(np.float32)
    got = bitfold.Fold([0, 1, 2], 3)(payloads)
    assert got.view(np.uint32).tolist() == [0x7FC00000] * 3


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("K", [1, 64])
def test_k_equals_one_and_k_equals_n(kernel, K):
    rng = np.random.default_rng(K)
    n = 64
    idx = np.zeros(n, np.int64) if K == 1 else rng.permutation(n)
    vals = (rng.normal(size=n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32)
    got = exact_with(kernel, idx, vals, K)
    np.testing.assert_array_equal(
        got.view(np.uint32), exact_fold_oracle(idx, vals, K).view(np.uint32)
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_carries_are_normalised_before_a_limb_overflows(kernel):
    """A tiny carry threshold forces many normalisations; the sum must not change."""
    idx = np.zeros(3000, np.int64)
    vals = np.full(3000, F32_MAX, np.float32)
    vals[1500:] = -F32_MAX
    vals[-1] = 2.0**-149  # 1500 MAX - 1499 MAX + tiny: MAX + tiny rounds to MAX
    for every in (1, 7, 1000):
        got = exact_with(kernel, idx, vals, 1, carry_every=every)
        assert got.view(np.uint32)[0] == np.float32(F32_MAX).view(np.uint32)
        got = exact_with(kernel, idx[:-1], vals[:-1], 1, carry_every=every)
        assert got.view(np.uint32)[0] == np.float32(F32_MAX).view(np.uint32)
        got = exact_with(kernel, idx[1:], vals[1:], 1, carry_every=every)  # 1499 MAX - 1499 MAX
        assert got.view(np.uint32)[0] == np.float32(2.0**-149).view(np.uint32)
    big = exact_with(kernel, idx[:2000], np.full(2000, F32_MAX, np.float32), 1, carry_every=3)
    assert big[0] == np.inf


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("every", [1, 7])
def test_a_limb_that_would_overflow_is_carried_in_time(kernel, every):
    """A limb preloaded 2^36 below int64's limit overflows after 16 additions unless carried.

    The state starts as a valid representation of zero whose limb 3 is
    2^63 - 2^36 (limb 4 compensates); each value adds nearly 2^32 to limb 3,
    so a kernel that skipped its carry normalisation would wrap around and
    give a wrong sum. With a carry every ``every`` values it gives the oracle.
    """
    value = np.array([(105 << 23) | 0x7FFFFF], np.uint32).view(np.float32)[0]  # M·2^8 in limb 3
    n = 100
    vals = np.full(n, value, np.float32)
    plan = bitfold.Fold(np.zeros(n, np.int64), 1)
    fmt_width = ExactAccumulator(plan, "float32").format.width
    state = np.zeros((1, fmt_width), np.int64)
    state[0, 3] = (1 << 63) - (1 << 36)
    state[0, 4] = -((1 << 31) - (1 << 4))  # (2^63 - 2^36)·2^96 == (2^31 - 2^4)·2^128
    acc = ExactAccumulator.from_state(plan, state)
    assert acc.result().view(np.uint32)[0] == 0  # the preloaded state is zero
    acc.options.update(kernel=kernel, carry_every=every)
    got = acc.add(vals).result()
    want = exact_fold_oracle(np.zeros(n, np.int64), vals, 1)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


# --------------------------------------------------------------------------- properties
floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def fold_problems(draw, values=floats32, max_n=120, dtype=np.float32):
    K = draw(st.integers(1, 12))
    n = draw(st.integers(0, max_n))
    idx = draw(st.lists(st.integers(0, K - 1), min_size=n, max_size=n))
    vals = draw(st.lists(values, min_size=n, max_size=n))
    return np.array(idx, np.int64), np.array(vals, dtype), K


@given(fold_problems(), st.sampled_from(KERNELS))
def test_property_equals_the_fraction_oracle(problem, kernel):
    idx, vals, K = problem
    got = exact_with(kernel, idx, vals, K)
    np.testing.assert_array_equal(
        got.view(np.uint32), exact_fold_oracle(idx, vals, K).view(np.uint32)
    )


@given(fold_problems(values=finite32), st.randoms(use_true_random=False))
def test_property_invariant_under_permutation(problem, rnd):
    idx, vals, K = problem
    perm = list(range(idx.size))
    rnd.shuffle(perm)
    a = bitfold.Fold(idx, K)(vals)
    b = bitfold.Fold(idx[perm], K)(vals[perm])
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


@given(
    fold_problems(), st.lists(st.integers(0, 120), max_size=5), st.randoms(use_true_random=False)
)
def test_property_invariant_under_splitting_and_merging(problem, cuts, rnd):
    idx, vals, K = problem
    plan = bitfold.Fold(idx, K)
    bounds = sorted({0, idx.size, *(c for c in cuts if c <= idx.size)})
    pieces = list(itertools.pairwise(bounds))
    rnd.shuffle(pieces)
    accs = []
    for lo, hi in pieces:
        acc = plan.accumulator()
        acc.add(vals[lo:hi], start=lo)
        accs.append(acc)
    total = plan.accumulator()
    for acc in accs:
        total += acc
    np.testing.assert_array_equal(total.result().view(np.uint32), plan(vals).view(np.uint32))


@given(fold_problems(values=st.floats(), max_n=60, dtype=np.float64))
def test_property_float64_values(problem):
    idx, vals, K = problem
    got = bitfold.Fold(idx, K)(vals)
    assert got.dtype == np.float64
    want = exact_fold_oracle(idx, vals, K, "float64")
    np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


@given(fold_problems(values=st.integers(0, 0xFFFF), dtype=np.uint16))
def test_property_float16_values_rounded_once_to_float16_or_float32(problem):
    idx, bit_patterns, K = problem
    vals = bit_patterns.view(np.float16)  # every float16, NaN payloads included
    plan = bitfold.Fold(idx, K)
    for out, uint in (("float16", np.uint16), ("float32", np.uint32)):
        got = plan(vals, out_dtype=out)
        assert got.dtype == np.dtype(out)
        np.testing.assert_array_equal(
            got.view(uint), exact_fold_oracle(idx, vals, K, out).view(uint)
        )


def test_float16_sum_is_rounded_once_not_twice():
    # 2048 + 1 + 2^-10: float16 ulp at 2048 is 2; a float32 sum then a cast ties to 2048
    vals = np.array([2048.0, 1.0, 2.0**-10], np.float16)
    assert np.float16(np.float32(2049.0)) == np.float16(2048.0)
    assert bitfold.Fold([0, 0, 0], 1)(vals, out_dtype="float16")[0] == np.float16(2050.0)


def test_bfloat16_values_and_output():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    vals = torch.tensor([1.0, 2.0**-8, 2.0**-20], dtype=torch.bfloat16)
    plan = bitfold.Fold([0, 0, 0], 1)
    assert plan(vals).dtype == torch.float32
    assert plan(vals)[0].item() == 1.0 + 2.0**-8 + 2.0**-20
    # bfloat16 keeps 8 bits: 1 + 2^-8 + tiny rounds up to 1 + 2^-7 (not down to 1)
    assert plan(vals, out_dtype=torch.bfloat16)[0].item() == 1.0 + 2.0**-7


# --------------------------------------------------------------------------- threads
THREAD_SCRIPT = """
import json, sys, numpy as np, bitfold
rng = np.random.default_rng(5)
n, K = 300_000, int(sys.argv[1])
idx = rng.integers(0, K, n)
vals = (rng.normal(size=n) * 2.0 ** rng.integers(-40, 40, n)).astype(np.float32)
plan = bitfold.Fold(idx, K)
print(json.dumps({s: bitfold.digest(plan(vals, s)) for s in ("exact", "ordered")}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("K", [433, 100_000])
def test_same_bits_for_every_thread_count(K):
    digests = []
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads)
        out = subprocess.run(
            [sys.executable, "-c", THREAD_SCRIPT, str(K)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        digests.append(json.loads(out.stdout))
    assert digests[0] == digests[1]


# --------------------------------------------------------------------------- the accumulator
def test_state_round_trip_and_all_reduce_style_merge():
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 9, 500)
    vals = rng.normal(size=500).astype(np.float32)
    plan = bitfold.Fold(idx, 9)
    parts = [plan.accumulator().add(vals[i : i + 100], start=i) for i in range(0, 500, 100)]
    summed = sum(
        (p.state for p in parts), np.zeros_like(parts[0].state)
    )  # what SUM all-reduce does
    rebuilt = ExactAccumulator.from_state(plan, summed)
    np.testing.assert_array_equal(rebuilt.result().view(np.uint32), plan(vals).view(np.uint32))
    assert rebuilt.state.shape == (9, 15) and rebuilt.state.dtype == np.int64
    with pytest.raises(ValueError):
        rebuilt.state[0, 0] = 1  # read-only view


def test_accumulating_many_steps_equals_the_exact_sum_of_all():
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 5, 50)
    steps = [rng.normal(size=50).astype(np.float32) for _ in range(6)]
    plan = bitfold.Fold(idx, 5)
    acc = plan.accumulator()
    for s in steps:
        acc.add(s)
    want = exact_fold_oracle(np.tile(idx, 6), np.concatenate(steps), 5)
    np.testing.assert_array_equal(acc.result().view(np.uint32), want.view(np.uint32))


def test_accumulator_refusals():
    plan = bitfold.Fold([0, 1, 1], 2)
    other = bitfold.Fold([1, 1, 0], 2)
    acc = plan.accumulator()
    with pytest.raises(bitfold.FoldError, match="different plans"):
        acc.merge(other.accumulator())
    with pytest.raises(bitfold.FoldTypeError, match="f64"):
        acc.merge(plan.accumulator("float64"))
    with pytest.raises(bitfold.ShapeError, match=r"\(2, 15\)"):
        ExactAccumulator.from_state(plan, np.zeros((3, 15), np.int64))
    with pytest.raises(bitfold.FoldTypeError, match="int64"):
        ExactAccumulator.from_state(plan, np.zeros((2, 15), np.float64))
    with pytest.raises(bitfold.ShapeError, match="do not fit"):
        acc.add(np.ones(2, np.float32), start=2)
    with pytest.raises(bitfold.FoldTypeError, match="float64"):
        acc.add(np.ones(3, np.float64))
    with pytest.raises(bitfold.FoldTypeError, match="no exact accumulator"):
        plan.accumulator("int32")
    with pytest.raises(bitfold.FoldTypeError, match="needs a value dtype"):
        plan.accumulator(None)


def test_accumulator_dtype_may_be_numpy_or_torch():
    plan = bitfold.Fold([0, 0], 1)
    assert plan.accumulator(np.float64).format.name == "f64"
    torch = pytest.importorskip("torch", reason="torch is not installed")
    acc = plan.accumulator(torch.float32).add(torch.tensor([1.0, 2.0]))
    assert acc.result().tolist() == [3.0]


def test_merging_a_copy_of_the_same_map_is_allowed():
    a = bitfold.Fold(np.array([0, 1, 1]), 2)
    b = bitfold.Fold(np.array([0, 1, 1], np.int32), 2)
    vals = np.array([1.0, 2.0, 3.0], np.float32)
    acc = a.accumulator().add(vals).merge(b.accumulator().add(vals))
    assert acc.result().tolist() == [2.0, 10.0]


@pytest.mark.parametrize("kernel", KERNELS)
def test_parallel_and_serial_paths_agree_with_the_oracle(kernel, monkeypatch):
    """Small inputs run serially; lower thresholds send them through the parallel kernels."""
    from bitfold.backends import host_state
    from bitfold.kernels import cpu

    rng = np.random.default_rng(11)
    idx = rng.integers(0, 37, 2000)
    vals = (rng.normal(size=2000) * 2.0 ** rng.integers(-60, 60, 2000)).astype(np.float32)
    vals[::97] = -0.0
    vals[5] = np.inf
    want = exact_fold_oracle(idx, vals, 37).view(np.uint32)
    serial = exact_with(kernel, idx, vals, 37)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_VALUES", 64)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_BUCKETS", 4)
    monkeypatch.setattr(host_state, "SLOT_BYTES_PER_VALUE", 64)
    assert host_state.slots_for(2000, 37, 8 * 14) > 1
    parallel = exact_with(kernel, idx, vals, 37)
    np.testing.assert_array_equal(serial.view(np.uint32), want)
    np.testing.assert_array_equal(parallel.view(np.uint32), want)
    plan = bitfold.Fold(idx, 37)
    v = rng.normal(size=37).astype(np.float32)
    np.testing.assert_array_equal(plan.expand(v), v[idx])
