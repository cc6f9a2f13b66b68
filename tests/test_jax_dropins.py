"""The JAX drop-in ``bitfold.jax.segment_sum`` against ``jax.ops.segment_sum`` and the oracle.

A module of its own, so that a missing JAX skips these tests only (JAX is in
``REQUIRED_BACKENDS``: ``make test`` fails without it).
"""

from __future__ import annotations

import doctest
import re

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
    with pytest.raises(bitfold.IndexRangeError, match="0 <= segment_ids < num_segments = 2"):
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


# -- the rest of jax.ops.segment_sum's signature and inputs ---------------------------------------
def one_error(err):
    assert err.__cause__ is None
    assert err.__context__ is None or err.__suppress_context__


def test_jax_segment_sum_mode_clip_clips_ids_into_range_as_jax_does():
    """JAX's mode="clip" clamps each id into [0, num_segments): the sums of the clamped ids, each
    the correctly rounded sum (the oracle's bits), with concrete ids and inside jit."""
    rng = np.random.default_rng(14)
    idx = rng.integers(-3, 10, 200)
    vals = (rng.standard_normal(200) * 2.0 ** rng.integers(-30, 30, 200)).astype(np.float32)
    want = exact_fold_oracle(np.clip(idx, 0, 6), vals, 7)
    data, ids = jnp.asarray(vals), jnp.asarray(idx)
    got = bj.segment_sum(data, ids, 7, mode="clip")
    assert np.array_equal(bits(got), bits(want))
    jitted = jax.jit(lambda d, i: bj.segment_sum(d, i, 7, mode="clip"))(data, ids)
    assert np.array_equal(bits(jitted), bits(want))
    enum = jax.lax.GatherScatterMode.CLIP
    assert np.array_equal(bits(bj.segment_sum(data, ids, 7, mode=enum)), bits(want))
    ref = jax.ops.segment_sum(data, ids, 7, mode="clip")
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-30)


@pytest.mark.parametrize("mode", [None, "drop", "fill", "promise_in_bounds",
                                  jax.lax.GatherScatterMode.FILL_OR_DROP])  # fmt: skip
def test_jax_segment_sum_refuses_ids_out_of_range_in_every_other_mode(mode):
    """JAX drops an id outside [0, num_segments) (or, promised in bounds, gives any value);
    bitfold refuses it by name with concrete ids, never a silently partial sum."""
    x = jnp.ones(4)
    for bad, at in (([0, -1, 1, 1], 1), ([0, 1, 1, 2], 3)):
        with pytest.raises(bitfold.IndexRangeError) as info:
            bj.segment_sum(x, jnp.array(bad), 2, mode=mode)
        msg = str(info.value)
        assert f"segment_ids[{at}] = {bad[at]}" in msg and "< num_segments = 2" in msg
        one_error(info.value)
    assert bj.segment_sum(x, jnp.array([0, 1, 1, 0]), 2, mode=mode).tolist() == [2.0, 2.0]


def test_jax_segment_sum_takes_jaxs_hints_and_refuses_what_it_cannot_honour():
    idx, vals, K = _problem(15, n=120)
    data, ids = jnp.asarray(vals), jnp.asarray(idx)
    want = bj.segment_sum(data, ids, K)
    hinted = bj.segment_sum(data, ids, K, True, True, 16)  # sorted, unique, bucket_size: hints
    assert np.array_equal(bits(hinted), bits(want))
    assert np.array_equal(bits(bj.segment_sum(data, ids, jnp.int32(K))), bits(want))
    refusals = [
        (dict(mode="turbo"), bitfold.FoldError, "unknown mode 'turbo'"),
        (dict(bucket_size=0), bitfold.FoldError, "bucket_size must be None or a positive integer"),
        (dict(out_sharding="x"), bitfold.FoldError, "out_sharding='x' is not supported"),
        (dict(num_segments=2.0), bitfold.FoldTypeError, "num_segments must be a positive integer"),
    ]
    with pytest.raises(bitfold.FoldTypeError, match=r"num_segments is traced .* a Python int"):
        jax.jit(lambda d, i, n: bj.segment_sum(d, i, n))(data, ids, K)
    for options, error, words in refusals:
        kwargs = {"num_segments": K, **options}
        with pytest.raises(error, match=re.escape(words)) as info:
            bj.segment_sum(data, ids, **kwargs)
        one_error(info.value)


def test_jax_segment_sum_of_integer_data_is_jaxs_own_after_the_same_checks():
    """Integer sums are exact in any order: JAX's segment_sum gives them (its dtype and bits);
    bool and complex data are refused, as JAX refuses bool data."""
    data, ids = jnp.array([1, 2, 3, 4], jnp.int32), jnp.array([0, 1, 1, 0])
    got = bj.segment_sum(data, ids, 2)
    assert got.dtype == jnp.int32 and got.tolist() == [5, 5]
    with pytest.raises(bitfold.IndexRangeError, match="num_segments = 2"):
        bj.segment_sum(data, jnp.array([0, 1, 2, 0]), 2)
    for dtype in (jnp.bool_, jnp.complex64):
        with pytest.raises(bitfold.FoldTypeError, match="data must be a floating JAX array"):
            bj.segment_sum(jnp.ones(4, dtype), ids, 2)


@pytest.mark.parametrize("backend", ["host", "portable"])
def test_jax_segment_sum_of_numpy_inputs_and_of_nothing(backend):
    """NumPy data and ids are read as JAX reads them; empty data gives zeros (the host path's
    reshape of no data raised ValueError inside the callback), eagerly and under jit."""
    idx, vals, K = _problem(16, n=40, D=3)
    got = bj.segment_sum(vals, idx, K, backend=backend)
    assert isinstance(got, jax.Array)
    assert np.array_equal(bits(got), bits(bitfold.segment_sum(vals, idx, K)))
    empty, none = jnp.ones((0, 3)), jnp.zeros(0, jnp.int32)
    for out in (bj.segment_sum(empty, none, 2, backend=backend),
                jax.jit(lambda d, i: bj.segment_sum(d, i, 2, backend=backend))(empty, none)):
        assert out.shape == (2, 3) and np.array_equal(bits(out), np.zeros((2, 3), np.uint32))
    assert bj.segment_sum(jnp.ones(0), [], 2, backend=backend).tolist() == [0.0, 0.0]
