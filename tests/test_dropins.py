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


# -- jax.ops.segment_sum --------------------------------------------------------------------------
jax = pytest.importorskip("jax", reason="JAX is not installed")
jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
bj = pytest.importorskip("bitfold.jax", reason="bitfold.jax needs JAX")


def test_jax_segment_sum_docstring():
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(bj.segment_sum):
        runner.run(test)
    assert runner.tries > 0 and runner.failures == 0


@pytest.mark.parametrize("D", [None, 3])
def test_jax_segment_sum_matches_jax_and_the_oracle(D):
    idx, vals, K = _problem(6, D=D)
    got = bj.segment_sum(jnp.asarray(vals), jnp.asarray(idx), K)
    ref = jax.ops.segment_sum(jnp.asarray(vals), jnp.asarray(idx), K)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-30)
    assert np.array_equal(bits(got), bits(bitfold.segment_sum(vals, idx, K)))


def test_jax_segment_sum_under_jit_grad_and_vmap():
    idx, vals, K = _problem(7, n=50, D=2)
    ids = jnp.asarray(idx)
    x = jnp.asarray(vals)
    jitted = jax.jit(bj.segment_sum, static_argnums=2)(x, ids, K)
    assert np.array_equal(bits(jitted), bits(bitfold.segment_sum(vals, idx, K)))
    w = jnp.arange(K * 2.0).reshape(K, 2)
    g = jax.grad(lambda v: jnp.sum(bj.segment_sum(v, ids, K) * w))(x)
    assert np.array_equal(np.asarray(g), np.asarray(w)[idx])
    per_batch = jax.vmap(lambda v, i: bj.segment_sum(v, i, K))
    batched = per_batch(jnp.stack([x, 2 * x]), jnp.stack([ids, ids[::-1]]))
    assert batched.shape == (2, K, 2)
    assert np.array_equal(bits(batched[1]), bits(bitfold.segment_sum(2 * vals, idx[::-1], K)))


def test_jax_segment_sum_is_invariant_under_permutation():
    idx, vals, K = _problem(8, n=400)
    perm = np.random.default_rng(9).permutation(400)
    a = bj.segment_sum(jnp.asarray(vals), jnp.asarray(idx), K)
    b = bj.segment_sum(jnp.asarray(vals[perm]), jnp.asarray(idx[perm]), K)
    assert np.array_equal(bits(a), bits(b))


def test_jax_segment_sum_refusals(monkeypatch):
    x = jnp.ones(4)
    with pytest.raises(bitfold.IndexRangeError, match="0 <= index < K = 2"):
        bj.segment_sum(x, jnp.array([0, 1, 2, 1]), 2)
    with pytest.raises(bitfold.FoldError, match="pass num_segments"):
        jax.jit(lambda v, i: bj.segment_sum(v, i))(x, jnp.array([0, 1, 1, 0]))
    with pytest.raises(bitfold.FoldTypeError, match="segment_ids must be integers"):
        bj.segment_sum(x, jnp.array([0.0, 1.0, 1.0, 0.0]), 2)
    with pytest.raises(bitfold.ShapeError, match="segment_ids' shape"):
        bj.segment_sum(jnp.ones((3, 2)), jnp.array([0, 1]), 2)
    assert bj.segment_sum(x, jnp.array([0, 1, 1, 0])).tolist() == [2.0, 2.0]
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # off the CPU: the portable path
    out = jax.jit(lambda v: bj.segment_sum(v, jnp.array([0, 1, 1, 0]), 2))(x)
    assert out.tolist() == [2.0, 2.0]
    with pytest.raises(bitfold.DeviceError, match="backend='portable'"):
        jax.jit(lambda v: bj.segment_sum(v, jnp.array([0, 1, 1, 0]), 2, backend="host"))(x)
