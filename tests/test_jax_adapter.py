"""bitfold.jax: expand's gradient is the exact fold under grad, jit and vmap, on both paths.

Every gradient test runs twice: through the host callback and through the
portable path (XLA operations only), with the same expected bits. JAX's
64-bit mode runs in a subprocess (tests/jax_x64_check.py).
"""

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


PATHS = bj.PATHS


def _grad_of_dot(plan, C, strategy="exact", dtype=jnp.float32, backend=None):
    """d/dv sum(expand(v) * C): exactly fold(C), whatever XLA does around it."""
    C = jnp.asarray(C, dtype)
    return jax.grad(lambda v: jnp.sum(bj.expand(v, plan, strategy, backend=backend) * C))(
        jnp.zeros(plan.K, dtype)
    )


def test_docstring_examples():
    failed, tried = doctest.testmod(bj, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failed == 0


def test_forward_is_the_gather():
    plan = _plan()
    v = jnp.arange(7.0)
    assert np.array_equal(np.asarray(bj.expand(v, plan)), plan.expand(np.arange(7.0)))


@pytest.mark.parametrize("backend", PATHS)
def test_gradient_is_the_exact_fold_on_adversarial_terms(backend):
    index = np.array([[0, 1, 0], [1, 0, 2]])
    plan = bitfold.Fold(index, 3)
    C = np.array([[1.0, 3.0, 2.0**-24], [-3.0, 2.0**-80, -0.0]], np.float32)
    g = _grad_of_dot(plan, C, backend=backend)
    assert np.array_equal(u32(g), u32(exact_fold_oracle(index, C, 3)))
    assert float(g[0]) == 1.0 + 2.0**-23


@pytest.mark.parametrize("backend", PATHS)
def test_gradient_under_jit_and_of_a_real_loss(backend):
    plan = _plan((20, 15), K=9)
    x = jnp.asarray(_cotangent((6, 20), seed=4))
    v = jnp.asarray(_cotangent(9, seed=5))

    def loss(v):
        return jnp.sum(jnp.tanh(x @ bj.expand(v, plan, backend=backend)) ** 2)

    def loss_w(W):
        return jnp.sum(jnp.tanh(x @ W) ** 2)

    W = jnp.asarray(plan.expand(np.asarray(v)))
    for transform in (lambda f: f, jax.jit):  # the weight gradient is computed the same way
        g = transform(jax.grad(loss))(v)
        gW = transform(jax.grad(loss_w))(W)
        assert np.array_equal(u32(g), u32(exact_fold_oracle(plan.index, np.asarray(gW), 9)))


@pytest.mark.parametrize("backend", PATHS)
def test_ordered_strategy_follows_its_documented_order(backend):
    plan = _plan((30, 20), K=11)
    C = _cotangent((30, 20))
    g = jax.jit(lambda: _grad_of_dot(plan, C, "ordered", backend=backend))()
    assert np.array_equal(u32(g), u32(ordered_fold_reference(plan.index, C, 11)))


@pytest.mark.parametrize("backend", PATHS)
def test_vmap_runs_the_fold_per_batch_element(backend):
    plan = _plan()
    Cs = np.stack([_cotangent(plan.shape, seed=s) for s in range(3)])

    def grad_one(C):
        return jax.grad(lambda v: jnp.sum(bj.expand(v, plan, backend=backend) * C))(
            jnp.zeros(7, jnp.float32)
        )

    for transform in (jax.vmap(grad_one), jax.jit(jax.vmap(grad_one))):
        out = np.asarray(transform(jnp.asarray(Cs)))
        assert out.shape == (3, 7)
        for s in range(3):
            assert np.array_equal(u32(out[s]), u32(exact_fold_oracle(plan.index, Cs[s], 7)))


@pytest.mark.parametrize("backend", PATHS)
def test_vmap_over_a_batched_parameter(backend):
    plan = _plan()  # the batch of 3 of the test above: the eager fold's operations compile once
    vs = jnp.asarray(_cotangent((3, 7), seed=9))
    grads = jax.vmap(jax.grad(lambda v: jnp.sum(bj.expand(v, plan, backend=backend) ** 2)))(vs)
    for b in range(3):
        gW = 2 * plan.expand(np.asarray(vs[b]))
        assert np.array_equal(u32(grads[b]), u32(exact_fold_oracle(plan.index, gW, 7)))


@pytest.mark.parametrize("backend", PATHS)
def test_float16_gradient_is_rounded_once(backend):
    index = np.array([0, 0, 0, 1])
    plan = bitfold.Fold(index, 2)
    C = np.array([1.0, 2.0**-11, 2.0**-20, 5.0], np.float16)
    g = _grad_of_dot(plan, C, dtype=jnp.float16, backend=backend)
    assert g.dtype == jnp.float16
    want = exact_fold_oracle(index, C.astype(np.float32), 2, out="float16")
    assert np.array_equal(np.asarray(g).view(np.uint16), want.view(np.uint16))
    assert float(g[0]) == 1.0 + 2.0**-10


@pytest.mark.parametrize("backend", PATHS)
def test_bfloat16_gradient_is_rounded_once(monkeypatch, backend):
    import oracle

    monkeypatch.setitem(oracle.FORMATS, "bfloat16", (8, -133, 127))
    index = np.array([0, 0, 0, 1, 1])
    plan = bitfold.Fold(index, 2)
    terms = [1.0, 2.0**-8, 2.0**-30, 3.0, 2.0**-6]
    g = _grad_of_dot(plan, np.array(terms), dtype=jnp.bfloat16, backend=backend)
    assert g.dtype == jnp.bfloat16
    want = [bucket_oracle(terms[:3], "bfloat16"), bucket_oracle(terms[3:], "bfloat16")]
    assert [float(x) for x in g] == want
    assert want[0] == 1.0 + 2.0**-7  # through float32 first it would tie back to 1.0


@pytest.mark.parametrize("backend", PATHS)
def test_fold_and_its_gradient(backend):
    plan = _plan()
    values = jnp.asarray(_cotangent(plan.shape))
    out = jax.jit(lambda x: bj.fold(x, plan, backend=backend))(values)
    assert np.array_equal(u32(out), u32(exact_fold_oracle(plan.index, np.asarray(values), 7)))
    w = jnp.arange(7.0)
    g = jax.grad(lambda x: jnp.sum(bj.fold(x, plan, backend=backend) * w))(values)
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


def test_a_non_cpu_backend_takes_the_portable_path(monkeypatch):
    plan = _plan()
    C = _cotangent(plan.shape, seed=3)
    calls = []
    real = bj._portable_fold
    monkeypatch.setattr(bj, "_portable_fold", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")  # what a tracer reports there
    g = jax.jit(lambda v: jax.grad(lambda v: jnp.sum(bj.expand(v, plan) * C))(v))(jnp.zeros(7))
    assert calls and np.array_equal(u32(g), u32(exact_fold_oracle(plan.index, C, 7)))
    with pytest.raises(bitfold.DeviceError, match="backend='portable'"):
        jax.jit(lambda v: bj.expand(v, plan, backend="host"))(jnp.zeros(7))
    with pytest.raises(bitfold.FoldError, match="'auto', 'host' or 'portable'"):
        bj.expand(jnp.zeros(7), plan, backend="tpu")


@pytest.mark.parametrize("backend", PATHS)
def test_rows_under_jit_and_grad(backend):
    rng = np.random.default_rng(13)
    index = rng.integers(0, 6, (4, 5))
    plan = bitfold.Fold(index, 6)
    C = rng.standard_normal((4, 5, 3)) * 2.0 ** rng.integers(-30, 30, (4, 5, 3))
    C = C.astype(np.float32)
    table = jnp.zeros((6, 3), jnp.float32)
    assert bj.expand(table, plan, backend=backend).shape == (4, 5, 3)
    g = jax.jit(jax.grad(lambda t: jnp.sum(bj.expand(t, plan, backend=backend) * C)))(table)
    want = np.stack([exact_fold_oracle(index, C[..., d], 6) for d in range(3)], axis=1)
    assert np.array_equal(u32(g), u32(want))
    folded = bj.fold(jnp.asarray(C), plan, backend=backend)
    assert folded.shape == (6, 3)
    assert np.array_equal(u32(folded), u32(want))
    back = jax.grad(
        lambda x: jnp.sum(bj.fold(x, plan, backend=backend) * jnp.arange(18.0).reshape(6, 3))
    )(C)
    assert back.shape == C.shape
    assert np.array_equal(np.asarray(back), np.arange(18.0).reshape(6, 3)[index])


# -- segment_sum on both paths, out-of-range ids, float64 without x64, the x64 mode ------------
@pytest.mark.parametrize("backend", PATHS)
def test_segment_sum_under_jit_vmap_and_grad(backend):
    rng = np.random.default_rng(21)
    ids = rng.integers(0, 5, 40)
    data = (rng.standard_normal((40, 3)) * 2.0 ** rng.integers(-40, 40, (40, 3))).astype(np.float32)
    data[3, 1], data[7, 0] = np.nan, -0.0
    want = np.stack([exact_fold_oracle(ids, data[:, d], 5) for d in range(3)], axis=1)
    f = jax.jit(lambda d, i: bj.segment_sum(d, i, 5, backend=backend))
    assert np.array_equal(u32(f(jnp.asarray(data), jnp.asarray(ids))), u32(want))
    batch = jnp.asarray(np.stack([data, -data]))  # jitted: one compilation, not one an operation
    out = jax.jit(jax.vmap(lambda d: bj.segment_sum(d, ids, 5, backend=backend)))(batch)
    assert np.array_equal(u32(out[0]), u32(want))
    g = jax.jit(jax.grad(lambda d: jnp.sum(bj.segment_sum(d, ids, 5, backend=backend) ** 2)))(
        jnp.asarray(np.nan_to_num(data))
    )
    assert g.shape == data.shape


@pytest.mark.parametrize("backend", PATHS)
def test_out_of_range_ids_never_pass_silently(backend):
    data = jnp.asarray(np.arange(4.0, dtype=np.float32))
    bad = jnp.asarray(np.array([0, 1, 5, 1]))
    with pytest.raises(bitfold.IndexRangeError, match="5"):  # concrete ids: refused, by name
        bj.segment_sum(data, bad, 3, backend=backend)
    for ids in (bad, jnp.asarray(np.array([0, -1, 2, 1]))):  # inside jit: every sum poisoned
        out = jax.jit(lambda d, i: bj.segment_sum(d, i, 3, backend=backend))(data, ids)
        assert out.shape == (3,)
        assert (u32(out) == bitfold.CANONICAL_NAN_BITS["float32"]).all()
    good = jax.jit(lambda d, i: bj.segment_sum(d, i, 3, backend=backend))(
        data, jnp.asarray(np.array([0, 1, 2, 1]))
    )
    assert np.asarray(good).tolist() == [0.0, 4.0, 2.0]


def test_float64_sums_need_x64_on_the_portable_path():
    assert not jax.config.jax_enable_x64  # the default mode of this process
    plan = _plan()
    with pytest.raises(bitfold.FoldTypeError, match="jax_enable_x64"):
        bj.fold(jnp.zeros(plan.shape, jnp.float32), plan, out_dtype="float64", backend="portable")


def test_hot_buckets_take_narrow_digits_in_32_bit_mode():
    rng = np.random.default_rng(5)
    n = (1 << 13) + 100  # more terms in one bucket than 16-bit digits absorb
    values = (rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)).astype(np.float32)
    plan = bitfold.Fold(np.zeros(n, np.int64), 1)
    out = jax.jit(lambda x: bj.fold(x, plan, backend="portable"))(jnp.asarray(values))
    assert np.array_equal(u32(out), u32(exact_fold_oracle(plan.index, values, 1)))


def test_x64_mode_in_a_subprocess():
    import os
    import subprocess
    import sys
    from pathlib import Path

    from mesh_runs import xla_flags

    here = Path(__file__).resolve().parent
    # one device, XLA's CPU code at LLVM level 0: the script judges bits (mesh_runs.xla_flags)
    env = dict(os.environ, JAX_ENABLE_X64="1", JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1))
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent / "src"), str(here)])
    proc = subprocess.run(
        [sys.executable, str(here / "jax_x64_check.py")], env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "x64 ok" in proc.stdout
