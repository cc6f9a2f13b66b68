"""bitfold.jax: expand's gradient is the exact fold under grad, jit and vmap (CPU)."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from oracle import bucket_oracle, exact_fold_oracle, ordered_fold_reference

import bitfold

jax = pytest.importorskip("jax", reason="JAX is not installed (the 'jax' extra)")
jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed (the 'jax' extra)")
bj = pytest.importorskip("bitfold.jax", reason="bitfold.jax needs JAX")


def u32(x):
    return np.asarray(x).view(np.uint32)


def _plan(shape=(12, 9), K=7, seed=0):
    return bitfold.Fold(np.random.default_rng(seed).integers(0, K, shape), K)


def _cotangent(shape, seed=1, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _grad_of_dot(plan, C, strategy="exact", dtype=jnp.float32):
    """d/dv sum(expand(v) * C): exactly fold(C), whatever XLA does around it."""
    C = jnp.asarray(C, dtype)
    return jax.grad(lambda v: jnp.sum(bj.expand(v, plan, strategy) * C))(
        jnp.zeros(plan.K, dtype)
    )


def test_docstring_examples():
    failed, tried = doctest.testmod(bj, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failed == 0


def test_forward_is_the_gather():
    plan = _plan()
    v = jnp.arange(7.0)
    assert np.array_equal(np.asarray(bj.expand(v, plan)), plan.expand(np.arange(7.0)))


def test_gradient_is_the_exact_fold_on_adversarial_terms():
    index = np.array([[0, 1, 0], [1, 0, 2]])
    plan = bitfold.Fold(index, 3)
    C = np.array([[1.0, 3.0, 2.0**-24], [-3.0, 2.0**-80, -0.0]], np.float32)
    g = _grad_of_dot(plan, C)
    assert np.array_equal(u32(g), u32(exact_fold_oracle(index, C, 3)))
    assert float(g[0]) == 1.0 + 2.0**-23


def test_gradient_under_jit_and_of_a_real_loss():
    plan = _plan((20, 15), K=9)
    x = jnp.asarray(_cotangent((6, 20), seed=4))
    v = jnp.asarray(_cotangent(9, seed=5))

    def loss(v):
        return jnp.sum(jnp.tanh(x @ bj.expand(v, plan)) ** 2)

    def loss_w(W):
        return jnp.sum(jnp.tanh(x @ W) ** 2)

    W = jnp.asarray(plan.expand(np.asarray(v)))
    for transform in (lambda f: f, jax.jit):  # the weight gradient is computed the same way
        g = transform(jax.grad(loss))(v)
        gW = transform(jax.grad(loss_w))(W)
        assert np.array_equal(u32(g), u32(exact_fold_oracle(plan.index, np.asarray(gW), 9)))


def test_ordered_strategy_follows_its_documented_order():
    plan = _plan((30, 20), K=11)
    C = _cotangent((30, 20))
    g = jax.jit(lambda: _grad_of_dot(plan, C, "ordered"))()
    assert np.array_equal(u32(g), u32(ordered_fold_reference(plan.index, C, 11)))


def test_vmap_runs_the_fold_per_batch_element():
    plan = _plan()
    Cs = np.stack([_cotangent(plan.shape, seed=s) for s in range(3)])

    def grad_one(C):
        return jax.grad(lambda v: jnp.sum(bj.expand(v, plan) * C))(jnp.zeros(7, jnp.float32))

    for transform in (jax.vmap(grad_one), jax.jit(jax.vmap(grad_one))):
        out = np.asarray(transform(jnp.asarray(Cs)))
        assert out.shape == (3, 7)
        for s in range(3):
            assert np.array_equal(u32(out[s]), u32(exact_fold_oracle(plan.index, Cs[s], 7)))


def test_vmap_over_a_batched_parameter():
    plan = _plan()
    vs = jnp.asarray(_cotangent((4, 7), seed=9))
    grads = jax.vmap(jax.grad(lambda v: jnp.sum(bj.expand(v, plan) ** 2)))(vs)
    for b in range(4):
        gW = 2 * plan.expand(np.asarray(vs[b]))
        assert np.array_equal(u32(grads[b]), u32(exact_fold_oracle(plan.index, gW, 7)))


def test_float16_gradient_is_rounded_once():
    index = np.array([0, 0, 0, 1])
    plan = bitfold.Fold(index, 2)
    C = np.array([1.0, 2.0**-11, 2.0**-20, 5.0], np.float16)
    g = _grad_of_dot(plan, C, dtype=jnp.float16)
    assert g.dtype == jnp.float16
    want = exact_fold_oracle(index, C.astype(np.float32), 2, out="float16")
    assert np.array_equal(np.asarray(g).view(np.uint16), want.view(np.uint16))
    assert float(g[0]) == 1.0 + 2.0**-10


def test_bfloat16_gradient_is_rounded_once(monkeypatch):
    import oracle

    monkeypatch.setitem(oracle.FORMATS, "bfloat16", (8, -133, 127))
    index = np.array([0, 0, 0, 1, 1])
    plan = bitfold.Fold(index, 2)
    terms = [1.0, 2.0**-8, 2.0**-30, 3.0, 2.0**-6]
    g = _grad_of_dot(plan, np.array(terms), dtype=jnp.bfloat16)
    assert g.dtype == jnp.bfloat16
    want = [bucket_oracle(terms[:3], "bfloat16"), bucket_oracle(terms[3:], "bfloat16")]
    assert [float(x) for x in g] == want
    assert want[0] == 1.0 + 2.0**-7  # through float32 first it would tie back to 1.0


def test_fold_and_its_gradient():
    plan = _plan()
    values = jnp.asarray(_cotangent(plan.shape))
    out = jax.jit(lambda x: bj.fold(x, plan))(values)
    assert np.array_equal(u32(out), u32(exact_fold_oracle(plan.index, np.asarray(values), 7)))
    w = jnp.arange(7.0)
    g = jax.grad(lambda x: jnp.sum(bj.fold(x, plan) * w))(values)
    assert g.shape == plan.shape
    assert np.array_equal(np.asarray(g), plan.expand(np.arange(7.0, dtype=np.float32)))


def test_errors():
    plan = _plan()
    with pytest.raises(bitfold.ShapeError, match=r"\(7,\).*\(6,\)"):
        bj.expand(jnp.zeros(6), plan)
    with pytest.raises(bitfold.FoldTypeError, match="int32"):
        bj.expand(jnp.zeros(7, jnp.int32), plan)
    with pytest.raises(bitfold.FoldTypeError, match=r"bitfold\.Fold"):
        bj.expand(jnp.zeros(7), plan.index)
    with pytest.raises(bitfold.UnknownStrategyError, match="exact"):
        bj.expand(jnp.zeros(7), plan, "fast")
    with pytest.raises(bitfold.ShapeError, match="108 values"):
        bj.fold(jnp.zeros(100), plan)


def test_gpu_backend_is_refused_with_a_clear_error(monkeypatch):
    plan = _plan()
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(bitfold.DeviceError, match="CPU backend only"):
        jax.jit(lambda v: bj.expand(v, plan))(jnp.zeros(7))


def test_rows_under_jit_and_grad():
    rng = np.random.default_rng(13)
    index = rng.integers(0, 6, (4, 5))
    plan = bitfold.Fold(index, 6)
    C = rng.standard_normal((4, 5, 3)) * 2.0 ** rng.integers(-30, 30, (4, 5, 3))
    C = C.astype(np.float32)
    table = jnp.zeros((6, 3), jnp.float32)
    assert bj.expand(table, plan).shape == (4, 5, 3)
    g = jax.jit(jax.grad(lambda t: jnp.sum(bj.expand(t, plan) * C)))(table)
    want = np.stack([exact_fold_oracle(index, C[..., d], 6) for d in range(3)], axis=1)
    assert np.array_equal(u32(g), u32(want))
    folded = bj.fold(jnp.asarray(C), plan)
    assert folded.shape == (6, 3)
    assert np.array_equal(u32(folded), u32(want))
    back = jax.grad(lambda x: jnp.sum(bj.fold(x, plan) * jnp.arange(18.0).reshape(6, 3)))(C)
    assert back.shape == C.shape
    assert np.array_equal(np.asarray(back), np.arange(18.0).reshape(6, 3)[index])
