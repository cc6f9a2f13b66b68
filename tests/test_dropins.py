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


RANGE = "every entry of indices must satisfy -3 <= indices < len(a) = 3"


def one_error(err):
    """The refusal is one error: no cause, and no context shown (``raise ... from None``)."""
    assert err.__cause__ is None
    assert err.__context__ is None or err.__suppress_context__


@pytest.mark.parametrize(
    ("indices", "error", "words"),
    [
        (np.array([0, 3]), bitfold.IndexRangeError, ["indices[1] = 3", RANGE]),
        (np.array([0, -4]), bitfold.IndexRangeError, ["indices[1] = -4", RANGE]),
        (np.array([[0, 1], [7, 2]], np.uint8), bitfold.IndexRangeError, ["indices[1, 0] = 7"]),
        (np.array([0.0, 1.0]), bitfold.FoldTypeError, ["indices", "integers", "float64"]),
        ([[0, 1], [2]], bitfold.FoldTypeError, ["indices", "integers", "[[0, 1], [2]]"]),
        ((np.array([0]), np.array([1])), bitfold.IndexRangeError, ["too many indices", "(3,)"]),
        (np.array([True, False]), bitfold.IndexRangeError, ["do not fit a of shape (3,)"]),
    ],
)  # fmt: skip
def test_add_at_refusals(indices, error, words):
    """Every id outside [-len(a), len(a)), named with its position and the range, as NumPy refuses
    it: an index error, raised before a is touched, one error."""
    a = np.zeros(3, np.float32)
    with pytest.raises(error) as info:
        bitfold.add_at(a, indices, np.ones(2, np.float32))
    for w in words:
        assert w in str(info.value)
    one_error(info.value)
    assert a.tolist() == [0.0, 0.0, 0.0]  # untouched


def test_add_at_refuses_a_b_that_does_not_broadcast():
    with pytest.raises(bitfold.ShapeError, match=r"cannot broadcast to the shape of a\[indices\]"):
        bitfold.add_at(np.zeros((3, 2), np.float32), np.array([0, 1]), np.ones((2, 3)))
    with pytest.raises(bitfold.ShapeError, match=r"\(3,\) cannot broadcast .* = \(2,\)"):
        bitfold.add_at(np.zeros(3, np.int64), np.array([0, 1]), np.ones(3, np.int64))


# -- add_at behaves as np.add.at ------------------------------------------------------------------
def _exact_add_at(a0, indices, b):
    """The oracle: np.add.at's positions (NumPy's indexing of a flat arange), each element of a
    the correctly rounded sum of its old value and every term sent to it (Fraction sums)."""
    where = np.arange(a0.size).reshape(a0.shape)[indices]
    terms = np.broadcast_to(np.asarray(b), where.shape).reshape(-1)
    flat = a0.reshape(-1)
    out = flat.copy()
    name = a0.dtype.name
    for k in range(a0.size):
        mine = [float(t) for t in terms[where.reshape(-1) == k]]
        if mine:
            out[k] = bucket_oracle([float(flat[k]), *mine], name)
    return out.reshape(a0.shape)


@pytest.mark.parametrize(
    "indices",
    [
        np.array([0, -1, -5, 4, -1, 2]),  # negative ids count from the end, as in NumPy
        [0, -1, -1],
        -2,  # one int
        [],  # no ids: nothing changes
        np.zeros(0, np.int64),
        np.array([[0, -1], [2, 2]]),  # an index of any shape
        np.array([-5, 0], np.int8),  # narrow ids that wrap past their dtype's range
    ],
    ids=lambda i: repr(i).replace(" ", ""),
)
def test_add_at_takes_negative_ids_as_numpy_does(indices):
    rng = np.random.default_rng(11)
    a0 = (rng.standard_normal(5) * 2.0 ** rng.integers(-20, 20, 5)).astype(np.float32)
    shape = np.zeros(5)[indices].shape
    b = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(np.float32)
    got = a0.copy()
    bitfold.add_at(got, indices, b)
    assert np.array_equal(bits(got), bits(_exact_add_at(a0, indices, b)))
    ref = a0.astype(np.float64)
    np.add.at(ref, indices, b.astype(np.float64))
    np.testing.assert_allclose(got, ref, rtol=1e-6)  # the same elements as np.add.at changes


@pytest.mark.parametrize(
    "indices",
    [
        (np.array([0, 2, -1, 0]), np.array([1, -1, 0, 1])),  # a tuple of index arrays
        (slice(None), np.array([0, 0, 3])),  # a slice and an index array
        (np.array([1, 1]),),  # a tuple of one
        Ellipsis,
        np.array([[True, False, True, False]] * 3),  # a boolean mask
        np.array([True, False, True]),  # a mask of the first axis
        (),  # every element once
        (1, -1),  # one element
    ],
    ids=["tuple", "slice-and-array", "tuple-of-one", "ellipsis", "mask", "row-mask", "empty-tuple",
         "scalars"],
)  # fmt: skip
def test_add_at_takes_numpys_other_index_forms(indices):
    """Tuples, slices, ``...`` and masks index a NumPy ``a`` as they index it in np.add.at: the
    same elements change, each to the correctly rounded sum."""
    rng = np.random.default_rng(12)
    a0 = (rng.standard_normal((3, 4)) * 2.0 ** rng.integers(-20, 20, (3, 4))).astype(np.float32)
    shape = a0[indices].shape
    b = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(np.float32)
    got = a0.copy()
    bitfold.add_at(got, indices, b)
    assert np.array_equal(bits(got), bits(_exact_add_at(a0, indices, b)))
    ints = np.zeros((3, 4), np.int64)  # integer arrays: NumPy's own sums, the same elements
    want = ints.copy()
    bitfold.add_at(ints, indices, 1)
    np.add.at(want, indices, 1)
    assert ints.tolist() == want.tolist()


def test_add_at_into_a_zero_dimensional_array_and_a_view():
    a = np.array(1.0, np.float32)
    bitfold.add_at(a, (), np.float32(2.0**-24))
    assert a.item() == 1.0  # a tie, to even (one term: the sum of two)
    bitfold.add_at(a, (), np.array([2.0**-24, 2.0**-24], np.float32).sum())
    assert a.item() == 1.0 + 2.0**-23
    base = np.zeros((3, 4), np.float32)
    view = base[:, ::2]  # not contiguous: add_at writes through the view
    bitfold.add_at(view, [0, 0, -1], np.float32(1.5))
    assert base.tolist() == [[3, 0, 3, 0], [0, 0, 0, 0], [1.5, 0, 1.5, 0]]


def test_add_at_reads_b_in_the_dtype_numpy_adds_it_in():
    """A float64 b is added into a float32 a as float64 terms (NumPy's float64 loop), summed
    exactly and rounded once: the oracle's bits; np.add.at rounds after each term. A Python
    float is read in a's dtype (NumPy 2's weak scalars), a NumPy float64 scalar is not."""
    tiny = 2.0**-25 + 2.0**-50  # float32(tiny) is 2^-25: two of them make a tie at 1 + 2^-24
    a = np.ones(2, np.float32)
    bitfold.add_at(a, [0, 0], np.array([tiny, tiny]))
    want = bucket_oracle([1.0, tiny, tiny], "float32")
    assert want == 1.0 + 2.0**-23 and a[0] == want
    ref = np.ones(2, np.float32)
    np.add.at(ref, [0, 0], np.array([tiny, tiny]))
    assert ref[0] == 1.0  # NumPy: 1 + tiny rounds to 1, twice
    a = np.ones(1, np.float32)
    bitfold.add_at(a, [0], 2.0**-24 + 2.0**-60)  # a Python float: float32(x) = 2^-24, a tie
    assert a[0] == 1.0
    bitfold.add_at(a, [0], np.float64(2.0**-24 + 2.0**-60))  # float64: just above the tie
    assert a[0] == np.float32(1.0 + 2.0**-23)
    half = np.zeros(1, np.float16)
    bitfold.add_at(half, [0, 0], np.array([70000.0, -70000.0 + 1.0]))  # float64 terms: exact 1
    assert half[0] == 1.0


@pytest.mark.parametrize(
    ("a", "b", "error", "words"),
    [
        (np.zeros(3, np.float32), np.array([1 + 1j]), bitfold.FoldTypeError, ["b", "complex128"]),
        (np.zeros(3, np.float32), np.array(["x"]), bitfold.FoldTypeError, ["b", "real numbers"]),
        (np.zeros(3, np.complex64), 1.0, bitfold.FoldTypeError, ["complex64", "float32"]),
        ([0.0, 0.0, 0.0], 1.0, bitfold.FoldTypeError, ["adds into an array", "list"]),
    ],
)
def test_add_at_refuses_what_it_cannot_add_before_any_work(a, b, error, words):
    before = np.array(a).copy()
    with pytest.raises(error) as info:
        bitfold.add_at(a, [0], b)
    for w in words:
        assert w in str(info.value)
    one_error(info.value)
    assert np.array_equal(np.array(a), before)


def test_a_read_only_target_is_refused_before_any_work(monkeypatch):
    """The complaint: NumPy's error after the whole fold. Now a bitfold error at once: no plan is
    built and nothing is folded (both are made to fail if reached), and a is unchanged."""
    import bitfold.functions as functions

    def reached(*args, **kwargs):
        raise AssertionError("add_at did work before refusing a read-only target")

    monkeypatch.setattr(functions, "Fold", reached)
    monkeypatch.setattr(functions.dispatch, "fold", reached)
    for dtype in (np.float32, np.int64):
        a = np.arange(3, dtype=dtype)
        a.flags.writeable = False
        with pytest.raises(bitfold.FoldError, match=r"a is read-only .* a\.copy\(\)") as info:
            bitfold.add_at(a, np.zeros(1_000_000, np.int64), 1.0)
        one_error(info.value)
        assert a.tolist() == [0, 1, 2]


def test_add_at_refuses_unknown_options_and_extra_arguments():
    a = np.zeros(3, np.float32)
    with pytest.raises(bitfold.errors.UnknownOptionError, match=r"add_at\(\) takes no option "
                       r"turbo=; valid options: a=, indices=, b=") as info:  # fmt: skip
        bitfold.add_at(a, [0], 1.0, turbo=True)
    assert isinstance(info.value, bitfold.FoldError) and isinstance(info.value, TypeError)
    with pytest.raises(bitfold.FoldTypeError, match=r"at most 3 positional arguments"):
        bitfold.add_at(a, [0], 1.0, "sum")
    assert a.tolist() == [0.0, 0.0, 0.0]


def test_add_at_on_torch_tensors_refuses_what_torch_cannot_change_in_place():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    leaf = torch.zeros(3, requires_grad=True)
    with pytest.raises(bitfold.FoldError, match="requires grad") as info:
        bitfold.add_at(leaf, [0], 1.0)
    one_error(info.value)
    with torch.no_grad():
        bitfold.add_at(leaf, [0, -1], 1.0)  # as torch: in place under no_grad
    assert leaf.tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(bitfold.FoldTypeError, match=r"first axis; got a tuple of 2"):
        bitfold.add_at(torch.zeros(3, 2), (torch.tensor([0]), torch.tensor([1])), 1.0)
    ints = torch.zeros(3, dtype=torch.int64)  # integers: torch's own index_add_, after the checks
    bitfold.add_at(ints, torch.tensor([0, -1, 0]), torch.tensor([1, 2, 3]))
    assert ints.tolist() == [4, 0, 2]
    with pytest.raises(bitfold.IndexRangeError, match=r"indices\[0\] = 3 .* < len\(a\) = 3"):
        bitfold.add_at(ints, torch.tensor([3]), torch.tensor([1]))
    assert ints.tolist() == [4, 0, 2]


def test_add_at_refuses_a_jax_array_which_cannot_change_in_place():
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    with pytest.raises(bitfold.FoldTypeError, match=r"a is a jax\.Array, which cannot change in "
                       r"place.*bitfold\.jax\.segment_sum") as info:  # fmt: skip
        bitfold.add_at(jnp.zeros(3), [0], 1.0)
    one_error(info.value)


# -- segment_sum's options ------------------------------------------------------------------------
def test_segment_sum_takes_a_plan_calls_options_and_refuses_others():
    idx, vals, K = _problem(21, n=100)
    want = bitfold.segment_sum(vals, idx, K)
    for route in ("limbs", "sorted-stream", "buckets"):
        assert np.array_equal(bits(bitfold.segment_sum(vals, idx, K, route=route)), bits(want))
    with pytest.raises(bitfold.errors.UnknownOptionError) as info:
        bitfold.segment_sum(vals, idx, K, turbo=1)
    for word in ("turbo=", "route=", "kernel=", "carry_every=", "out_dtype=", "backend="):
        assert word in str(info.value)
    one_error(info.value)
