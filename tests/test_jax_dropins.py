"""The JAX drop-in ``bitfold.jax.segment_sum`` against ``jax.ops.segment_sum`` and the oracle.

A module of its own, so that a missing JAX skips these tests only (JAX is in
``REQUIRED_BACKENDS``: ``make test`` fails without it).
"""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from oracle import exact_fold_oracle
from test_dropins import _problem, bits

import bitfold

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
    cols = [vals] if D is None else [vals[:, d] for d in range(D)]
    want = np.stack([exact_fold_oracle(idx, c, K) for c in cols], -1).reshape(ref.shape)
    assert np.array_equal(bits(got), bits(want))


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
