"""The NumPy and JAX drop-ins: ``add_at``, ``segment_sum`` and ``bitfold.jax.segment_sum``.

Each agrees with the function it replaces to within float rounding and, unlike
it, gives the same bits for any order of the contributions; its result is the
oracle's (every element the correctly rounded sum of its terms).
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from oracle import bucket_oracle, exact_fold_oracle

import bitfold
import bitfold.functions

UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(a):
    a = np.asarray(a)
    return a.view(UINT[a.dtype.itemsize])


def _problem(seed, n=300, K=7, D=None, dtype=np.float32):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, K, n)
    shape = (n,) if D is None else (n, D)
    spread = 8 if dtype == np.float16 else 30
    vals = (rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread, shape)).astype(dtype)
    return idx, vals, K


def test_docstring_examples():
    result = doctest.testmod(bitfold.functions)
    assert result.attempted > 0 and result.failed == 0


# -- segment_sum ----------------------------------------------------------------------------------
@pytest.mark.parametrize("D", [None, 3])
def test_segment_sum_is_the_exact_fold(D):
    idx, vals, K = _problem(1, D=D)
    got = bitfold.segment_sum(vals, idx, K)
    want = np.stack([exact_fold_oracle(idx, vals.reshape(len(idx), -1)[:, d], K)
                     for d in range(1 if D is None else D)], axis=1).reshape(got.shape)  # fmt: skip
    assert np.array_equal(bits(got), bits(want))
    perm = np.random.default_rng(2).permutation(len(idx))
    assert np.array_equal(bits(bitfold.segment_sum(vals[perm], idx[perm], K)), bits(got))
    assert bitfold.segment_sum(vals, idx, K, "ordered").shape == got.shape


def _one_shot_problem(seed, n, K):
    """Values that need every part of the float stream: a bucket whose float64 sum is not exact
    (redone through the order), -0.0 buckets, an infinity, subnormal terms, empty buckets."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, K - 1, n)  # bucket K-1 stays empty
    vals = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(np.float32)
    idx[:3], vals[:3] = K - 2, [2.0**100, 1.0, -(2.0**100)]  # its only terms: exact sum 1.0,
    # float64's 0.0
    vals[3:6] = -0.0
    idx[3:6] = K - 3  # -0.0 only
    idx[6:8], vals[6:8] = K - 4, [-0.0, 0.0]
    idx[8] = K - 4  # -0.0, +0.0 and one more term
    vals[10] = np.inf
    vals[20:22] = np.float32(2.0**-140) * np.float32([1, -3])
    return idx, vals


@pytest.mark.parametrize(
    ("n", "K", "index_dtype"),
    [(n, K, dtype) for n, K in ((3_000, 70_000), (300_000, 70_000), (300_000, 300_000))
     for dtype in (np.int64, np.int32)]
    + [(300_000, 600_000, np.int64), (1_200_000, 1_100_000, np.int32)],
)  # fmt: skip
def test_one_shot_segment_sum_checks_its_index_as_it_folds(n, K, index_dtype):
    """Past 2^16 buckets a one-shot fold reads the caller's index in the float stream, checking
    each entry as it adds its value (no pass that checks and copies it first; past 2^19 buckets
    too, where a plan kept for many folds groups its values first, and past 2^20 up to one
    bucket a value, where it sorts them): the oracle's bits, on one thread and on several; an
    entry outside [0, K) is refused with the plan's own error, naming the first bad position,
    wherever it lies in the stream's chunks."""
    import numba

    from bitfold.plan import one_shot

    idx, vals = _one_shot_problem(n, n, K)
    idx = idx.astype(index_dtype)
    plan = one_shot(idx, K)
    assert plan.unchecked_index is not None and np.shares_memory(plan.unchecked_index, idx)
    assert plan.once and plan.route(vals).route == "float-stream"
    kept = bitfold.Fold(idx, K)  # a plan kept for many folds groups its values past 2^19 buckets
    assert not kept.once
    kept_route = ("float-stream" if K <= 1 << 19 else "partitioned-stream" if K <= 1 << 20
                  else "sorted-stream")  # fmt: skip
    assert kept.route(vals).route == kept_route
    want = exact_fold_oracle(idx, vals, K, "float32").view(np.uint32)
    plain = np.random.default_rng(1).standard_normal(n).astype(np.float32)  # sums all exact
    assert np.array_equal(plan(plain).view(np.uint32), kept(plain).view(np.uint32))
    assert plan.unchecked_index is not None  # no bucket redone: nothing checked the index
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            assert np.array_equal(bitfold.segment_sum(vals, idx, K).view(np.uint32), want)
            for bad_value, places in ((K, (n // 2 + 5,)), (-1, (7,)), (K, (n // 3, n - 1)),
                                      (-1, (n - 2,))):  # fmt: skip
                bad = idx.copy()
                bad[list(places)] = bad_value
                with pytest.raises(bitfold.IndexRangeError) as got:  # no bucket to redo: the
                    bitfold.segment_sum(plain, bad, K)  # stream's own check refuses it
                with pytest.raises(bitfold.IndexRangeError) as checked:
                    bitfold.Fold(bad, K)
                assert str(got.value) == str(checked.value)
                assert got.value.position == min(places)
    finally:
        numba.set_num_threads(before)
    assert plan(vals).view(np.uint32).tolist() == want.tolist()  # a bucket redone: checked
    assert plan.unchecked_index is None and plan.index.dtype == np.int32
    assert np.array_equal(plan.index, idx)


def test_one_shot_plans_of_few_buckets_check_at_once():
    """Up to 2^16 buckets the check also counts the buckets and makes the 2-byte copy the
    stream reads fastest: a one-shot plan checks its entries at once, as Fold does."""
    from bitfold.plan import one_shot

    idx = np.array([0, 3, 65_535])
    plan = one_shot(idx, 65_536)
    assert plan.unchecked_index is None and plan.index.dtype == np.uint16
    assert one_shot(idx, 65_537).unchecked_index is not None
    with pytest.raises(bitfold.IndexRangeError, match=r"= 65536 \(flat position 2\)"):
        one_shot(idx + 1, 65_536)


# -- add_at ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("D", [None, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_add_at_rounds_old_value_and_rows_once(D, dtype):
    idx, vals, K = _problem(3, n=200, D=D, dtype=dtype)
    rng = np.random.default_rng(4)
    a0 = (rng.standard_normal((K,) if D is None else (K, D)) * 2.0**10).astype(dtype)
    a = a0.copy()
    bitfold.add_at(a, idx, vals)
    flat_a, flat_v = a0.reshape(K, -1), vals.reshape(len(idx), -1)
    for k in range(K):
        for d in range(flat_a.shape[1]):
            terms = [float(flat_a[k, d]), *(float(x) for x in flat_v[idx == k, d])]
            want = np.array(bucket_oracle(terms, np.dtype(dtype).name), dtype)
            assert bits(a.reshape(K, -1)[k, d]) == bits(want), (k, d)
    ref = a0.astype(np.float64)
    np.add.at(ref, idx, vals.astype(np.float64))
    np.testing.assert_allclose(a, ref, rtol=2e-3 if dtype == np.float16 else 1e-6)


def test_add_at_is_invariant_under_permutation_where_np_add_at_is_not():
    rng = np.random.default_rng(5)
    idx = np.zeros(2000, np.int64)
    vals = (rng.standard_normal(2000) * 2.0 ** rng.integers(-20, 20, 2000)).astype(np.float32)
    digests, numpy_digests = set(), set()
    for seed in range(4):
        perm = np.random.default_rng(seed).permutation(2000)
        a, b = np.zeros(1, np.float32), np.zeros(1, np.float32)
        bitfold.add_at(a, idx[perm], vals[perm])
        np.add.at(b, idx[perm], vals[perm])
        digests.add(bitfold.digest(a))
        numpy_digests.add(bitfold.digest(b))
    assert len(digests) == 1
    assert len(numpy_digests) > 1  # np.add.at rounds after every addition


def test_add_at_broadcasts_b_and_keeps_integer_arrays_to_numpy():
    a = np.zeros((3, 2), np.float32)
    bitfold.add_at(a, np.array([1, 1, 2]), 0.5)
    assert a.tolist() == [[0, 0], [1, 1], [0.5, 0.5]]
    ints = np.zeros(3, np.int64)
    bitfold.add_at(ints, [0, 0, 2], [1, 2, 3])
    assert ints.tolist() == [3, 0, 3]


def test_add_at_on_torch_tensors_in_place():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    t = torch.zeros(4, 2)
    bitfold.add_at(t, torch.tensor([3, 3, 0]), torch.ones(3, 2))
    assert t.tolist() == [[1, 1], [0, 0], [0, 0], [2, 2]]


@pytest.mark.parametrize(
    ("indices", "error", "words"),
    [
        (slice(0, 2), bitfold.FoldTypeError, ["integer index array", "slice"]),
        ((np.array([0]), np.array([1])), bitfold.FoldTypeError, ["tuple of 2"]),
        (np.array([True, False, True]), bitfold.FoldTypeError, ["boolean mask"]),
        (np.array([0, -1]), bitfold.IndexRangeError, ["-1", "0 <= index < len(a) = 3"]),
        (np.array([0, 3]), bitfold.IndexRangeError, ["= 3"]),
        (np.array([0.0, 1.0]), bitfold.FoldTypeError, ["integers"]),
    ],
)
def test_add_at_refusals(indices, error, words):
    a = np.zeros(3, np.float32)
    with pytest.raises(error) as info:
        bitfold.add_at(a, indices, np.ones(2, np.float32))
    for w in words:
        assert w in str(info.value)
    assert a.tolist() == [0.0, 0.0, 0.0]  # untouched


def test_add_at_refuses_a_b_that_does_not_broadcast():
    with pytest.raises(bitfold.ShapeError, match=r"cannot broadcast to indices.shape"):
        bitfold.add_at(np.zeros((3, 2), np.float32), np.array([0, 1]), np.ones((2, 3)))
