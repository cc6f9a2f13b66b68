"""Every registered strategy against its reference, on hand tables and random data.

How a strategy is checked follows what its registry entry guarantees
(:class:`bitfold.strategies.Strategy`): ``exact`` bitwise against the Fraction
oracle, ``ordered`` bitwise against a plain Python loop in its documented order;
only a strategy whose guarantee is "none" (``atomic``) is compared with a
float64 sum within a tolerance. A strategy that guarantees anything else and has
no bitwise reference here fails every test that runs it.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from oracle import exact_fold_oracle, ordered_fold_reference

import bitfold

STRATEGIES = bitfold.strategies()

# (index, values, K, hand-computed sums); exactly representable, so every strategy agrees
HAND_TABLES = [
    ([0, 1, 0, 2], [1.0, 2.0, 3.0, 4.0], 3, [4.0, 2.0, 4.0]),
    ([2, 2, 2], [0.5, 0.25, -1.0], 4, [0.0, 0.0, -0.25, 0.0]),
    ([0], [-3.5], 1, [-3.5]),
    ([1, 1, 0, 0, 1], [2.0**-149, 2.0**-149, 1.0, -1.0, 2.0**100], 2, [0.0, 2.0**100]),
]


#: The bitwise reference of every strategy that guarantees bits.
BITWISE_REFERENCES = {"exact": exact_fold_oracle, "ordered": ordered_fold_reference}


def _bitwise(strategy):
    """True when ``strategy`` is checked bit for bit, False for a tolerance; a test failure
    for a strategy whose registry guarantee is not "none" and that has no bitwise reference."""
    guarantee = bitfold.get_strategy(strategy).guarantee
    if strategy in BITWISE_REFERENCES:
        return True
    if guarantee.startswith("none"):
        return False
    pytest.fail(
        f"strategy {strategy!r} guarantees {guarantee!r} but has no bitwise reference in "
        "BITWISE_REFERENCES: add one (only a guarantee of 'none' is checked with a tolerance)"
    )


def _reference(strategy, idx, vals, K, out="float32"):
    if _bitwise(strategy):
        return BITWISE_REFERENCES[strategy](idx, vals, K, out)
    ref = np.zeros(K)
    np.add.at(ref, np.asarray(idx).reshape(-1), np.asarray(vals, np.float64).reshape(-1))
    return ref


def _check(strategy, got, ref):
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    if _bitwise(strategy):
        np.testing.assert_array_equal(got.view(uint), np.asarray(ref, got.dtype).view(uint))
    else:
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * (1 + np.abs(ref).max()))


def test_every_registered_strategy_is_checked_as_its_guarantee_says():
    for name in STRATEGIES:
        guarantee = bitfold.get_strategy(name).guarantee
        assert _bitwise(name) == (not guarantee.startswith("none")), (name, guarantee)


def test_a_new_strategy_without_a_bitwise_reference_fails_the_checks(monkeypatch):
    registry = importlib.import_module("bitfold.strategies")  # bitfold.strategies: the function
    new = registry.Strategy("fastest", "same bits on every run", ("float32",))
    monkeypatch.setitem(registry._REGISTRY, "fastest", new)
    with pytest.raises(pytest.fail.Exception, match="'fastest' guarantees 'same bits"):
        _check("fastest", np.zeros(1, np.float32), np.zeros(1))
    loose = registry.Strategy("loose", "none: any order", ("float32",))
    monkeypatch.setitem(registry._REGISTRY, "loose", loose)
    assert not _bitwise("loose")  # a declared "none" is the only way to a tolerance


def test_registry_lists_exact_first_and_refuses_unknown_names():
    assert STRATEGIES[0] == "exact"
    assert {"atomic", "ordered", "exact"} <= set(STRATEGIES)
    plan = bitfold.Fold([0], 1)
    with pytest.raises(bitfold.UnknownStrategyError) as info:
        plan(np.ones(1, np.float32), "fastest")
    for name in STRATEGIES:
        assert name in str(info.value)
    assert "'fastest'" in str(info.value)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("idx", "vals", "K", "expected"), HAND_TABLES)
def test_hand_computed_tables(strategy, idx, vals, K, expected):
    plan = bitfold.Fold(idx, K)
    got = plan(np.array(vals, np.float32), strategy)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array(expected, np.float32))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(4))
def test_random_data_against_the_reference(strategy, seed):
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 40))
    n = int(rng.integers(0, 600))
    idx = rng.integers(0, K, size=n)
    scale = 2.0 ** rng.integers(-30, 30, size=n)
    vals = (rng.normal(size=n) * scale).astype(np.float32)
    got = bitfold.Fold(idx, K)(vals, strategy)
    _check(strategy, got, _reference(strategy, idx, vals, K))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(("dtype", "out"), [("float16", "float32"), ("float64", "float64")])
def test_other_value_dtypes(strategy, dtype, out):
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 5, size=300)
    vals = rng.normal(size=300).astype(dtype)
    got = bitfold.Fold(idx, 5)(vals, strategy)
    assert got.dtype == np.dtype(out)
    _check(strategy, got, _reference(strategy, idx, vals, 5, out))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_non_contiguous_and_multidimensional_values(strategy):
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 6, size=(8, 5))
    big = rng.normal(size=(8, 10)).astype(np.float32)
    vals = big[:, ::2]  # a strided view, read in C order
    assert not vals.flags.c_contiguous
    got = bitfold.Fold(idx, 6)(vals, strategy)
    _check(strategy, got, _reference(strategy, idx, np.ascontiguousarray(vals), 6))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_torch_tensors_in_torch_tensors_out(strategy):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    idx = torch.tensor([0, 1, 1, 0])
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0])
    got = bitfold.Fold(idx, 2)(vals, strategy)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert got.tolist() == [5.0, 5.0]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize(
    ("values", "error", "words"),
    [
        (np.ones(5, np.float32), bitfold.ShapeError, ["5 elements", "folds 4"]),
        (np.ones((2, 3), np.float32), bitfold.ShapeError, ["6 elements", "(2, 3)"]),
        (np.ones(4, np.int64), bitfold.FoldTypeError, ["floating point", "int64"]),
        (np.ones(4, np.complex64), bitfold.FoldTypeError, ["floating point", "complex64"]),
        (np.ones(4, bool), bitfold.FoldTypeError, ["floating point", "bool"]),
    ],
)
def test_bad_values_are_refused_by_every_strategy(strategy, values, error, words):
    plan = bitfold.Fold([0, 1, 0, 1], 2)
    with pytest.raises(error) as info:
        plan(values, strategy)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_nan_and_inf_are_not_errors(strategy):
    plan = bitfold.Fold([0, 0, 1, 1, 2], 3)
    got = plan(np.array([np.nan, 1.0, np.inf, 1.0, -np.inf], np.float32), strategy)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf


@pytest.mark.parametrize("strategy", ["exact", "ordered"])
def test_nan_results_are_the_canonical_nan(strategy):
    plan = bitfold.Fold([0, 0, 1], 2)
    got = plan(np.array([np.inf, -np.inf, np.nan], np.float32), strategy)  # x86 gives 0xFFC00000
    _check(strategy, got, _reference(strategy, [0, 0, 1], [np.inf, -np.inf, np.nan], 2))
    assert got.view(np.uint32).tolist() == [bitfold.CANONICAL_NAN_BITS["float32"]] * 2


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("order", [">", "<"])
@pytest.mark.parametrize("dtype", ["f2", "f4", "f8"])
def test_any_byte_order_gives_the_native_result(strategy, order, dtype):
    idx = np.array([0, 0, 1, 2, 1])
    vals = np.array([1.5, 2.0, -3.0, 0.25, 8.0])
    plan = bitfold.Fold(idx.astype(order + "i8"), 3)
    got = plan(vals.astype(order + dtype), strategy)
    want = bitfold.Fold(idx, 3)(vals.astype(dtype), strategy)
    assert got.tolist() == want.tolist() == [3.5, 5.0, 0.25]


def test_values_in_another_multidimensional_shape_are_refused():
    plan = bitfold.Fold(np.zeros((2, 3), np.int64), 1)
    with pytest.raises(bitfold.ShapeError, match=r"shape \(3, 2\) but the index has shape"):
        plan(np.ones((3, 2), np.float32))
    assert plan(np.ones(6, np.float32)).tolist() == [6.0]  # flat values are read in C order
    flat_plan = bitfold.Fold(np.zeros(6, np.int64), 1)
    # since folds of rows, (3, 2) for a (6,) index is neither (6,) + rows nor flat: refused
    with pytest.raises(bitfold.ShapeError, match=r"shape \(3, 2\) but the index has shape \(6,\)"):
        flat_plan(np.ones((3, 2), np.float32))
    assert flat_plan(np.ones((6, 2), np.float32)).tolist() == [[6.0, 6.0]]  # rows of 2


def test_unsupported_out_dtype_is_refused():
    plan = bitfold.Fold([0, 1], 2)
    with pytest.raises(bitfold.FoldTypeError, match="out_dtype must be one of"):
        plan(np.ones(2, np.float32), out_dtype="int32")
