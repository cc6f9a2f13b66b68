"""Plans in JAX's jitted folds: built once, reused for the same ids, freed when none is used.

``bitfold.jax.segment_sum`` on the host route calls bitfold's kernels through
the FFI host call (:mod:`bitfold.xla_host_call`), never ``jax.pure_callback``:
ids closed over by ``jit`` get one plan, built when the function is traced;
ids passed as an argument get a plan kept by content (:mod:`bitfold.host_plans`)
and reused only after an entry-for-entry check. Large gathers (``expand``,
the gradients) are NumPy's ``take`` into XLA's buffer there, with XLA's
bits. And a plan a jitted fold used is freed once nothing but bitfold's
registrations would hold it: a loop over 5,000 plans leaves none alive and
the registry small.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
from oracle import exact_fold_oracle
from test_dropins import bits

import bitfold
from bitfold import host_plans

jax = pytest.importorskip("jax", reason="JAX is not installed")
jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
bj = pytest.importorskip("bitfold.jax", reason="bitfold.jax needs JAX")
from bitfold import xla_host_call  # noqa: E402

pytestmark = pytest.mark.skipif(not xla_host_call.available(), reason="this JAX has no jax.ffi")

N = host_plans.MIN_POSITIONS + 3  # kept by the cache (smaller indices are planned afresh)


def _graph(seed, n=N, K=97, D=3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, K, n).astype(np.int32)
    data = (rng.standard_normal((n, D)) * 2.0 ** rng.integers(-20, 20, (n, 1))).astype(np.float32)
    return ids, data, K


def _want(ids, data, K):
    return np.stack([exact_fold_oracle(ids, data[:, d], K) for d in range(data.shape[1])], -1)


@pytest.fixture
def plans():
    bj.clear_plan_cache()
    cache = bj._PLANS
    cache.hits = cache.misses = 0
    yield cache
    bj.clear_plan_cache()


def test_the_host_route_is_the_ffi_host_call_never_pure_callback(monkeypatch, plans):
    ids, data, K = _graph(0)

    def refused(*args, **kwargs):
        raise AssertionError("segment_sum took jax.pure_callback")

    monkeypatch.setattr(jax, "pure_callback", refused)
    for f in (jax.jit(lambda d, i: bj.segment_sum(d, i, K)),
              jax.jit(lambda d: bj.segment_sum(d, jnp.asarray(ids), K))):  # fmt: skip
        args = (data, ids)[: f.__wrapped__.__code__.co_argcount]
        assert "bitfold_host_call" in str(jax.make_jaxpr(f)(*args))
        assert np.array_equal(bits(f(*args)), bits(_want(ids, data, K)))


def test_captured_ids_are_planned_once_when_the_step_is_traced(plans):
    ids, data, K = _graph(1)
    const = jnp.asarray(ids)
    w = jnp.arange(K * 3.0).reshape(K, 3)
    step = jax.jit(jax.value_and_grad(lambda d: jnp.sum(bj.segment_sum(d, const, K) * w)))
    for _ in range(3):
        _, grad = step(jnp.asarray(data))
    assert plans.misses == 1 and plans.hits == 0  # planned at the trace; the calls plan nothing
    assert np.array_equal(np.asarray(grad), np.asarray(w)[ids])
    assert np.array_equal(bits(bj.segment_sum(data, const, K)), bits(_want(ids, data, K)))


def test_ids_passed_to_jit_reuse_a_plan_only_for_the_same_ids(plans):
    ids, data, K = _graph(2)
    f = jax.jit(lambda d, i: bj.segment_sum(d, i, K))
    for _ in range(3):
        assert np.array_equal(bits(f(data, ids)), bits(_want(ids, data, K)))
    assert (plans.misses, plans.hits) == (1, 2)
    other = ids.copy()
    other[N // 2] = (other[N // 2] + 1) % K  # one id differs, in the middle: not a probe
    assert np.array_equal(bits(f(data, other)), bits(_want(other, data, K)))
    perm = np.random.default_rng(3).permutation(N)  # the same ids in another order
    assert np.array_equal(bits(f(data[perm], ids[perm])), bits(f(data, ids)))
    assert plans.misses == 3
    ids64 = ids.astype(np.int64)  # the same ids in another dtype: the same plan, same bits
    assert np.array_equal(bits(jax.jit(lambda d, i: bj.segment_sum(d, i, K))(data, ids64)),
                          bits(_want(ids, data, K)))  # fmt: skip


def test_ids_changed_in_place_are_never_folded_with_a_stale_plan(plans):
    ids, data, K = _graph(4)
    f = jax.jit(lambda d, i: bj.segment_sum(d, i, K))
    f(data, ids)
    for position in (0, N - 1, 1234):
        ids[position] = (ids[position] + 5) % K
        assert np.array_equal(bits(f(data, ids)), bits(_want(ids, data, K)))


def test_out_of_range_traced_ids_give_nan_and_are_not_kept(plans):
    ids, data, K = _graph(5)
    ids[7] = K
    got = jax.jit(lambda d, i: bj.segment_sum(d, i, K))(data, ids)
    assert np.all(bits(got) == bitfold.CANONICAL_NAN_BITS["float32"])
    assert len(plans) == 0


def test_the_cache_keeps_few_plans_and_plans_small_indices_afresh():
    cache = host_plans.HostPlans(max_plans=2)
    small = np.arange(10) % 3
    assert cache.plan(small, 3) is not cache.plan(small, 3) and len(cache) == 0
    graphs = [_graph(s)[0] for s in range(3)]
    kept = [cache.plan(g, 97) for g in graphs]
    assert len(cache) == 2 and cache.plan(graphs[2], 97) is kept[2]
    assert cache.plan(graphs[0], 97) is not kept[0]  # evicted: planned again
    assert cache.plan(graphs[1].astype(np.int64), 97) is not kept[1]
    assert cache.plan(graphs[0], 98) is not cache.plan(graphs[0], 97)  # another K, another plan
    with pytest.raises(bitfold.IndexRangeError):
        cache.plan(graphs[0], 50)
    cache.clear()
    assert len(cache) == 0


def test_plans_are_freed_when_only_bitfolds_registrations_would_hold_them():
    """5,000 plans, each used by a traced fold (every 250th by a value_and_grad step of expand
    and fold, compiled and run): none alive after the loop, the registry small throughout."""
    x = jnp.ones(20, jnp.float32)
    rng = np.random.default_rng(6)
    refs, most = [], 0
    for i in range(5000):
        plan = bitfold.Fold(rng.integers(0, 5, 20), 5)
        if i % 250 == 0:
            step = jax.jit(jax.value_and_grad(
                lambda v, plan=plan: jnp.sum(bj.fold(bj.expand(v, plan), plan) ** 2)))  # fmt: skip
            loss = step(jnp.ones(5, jnp.float32))[0]
            assert float(loss) == float(np.sum(plan.counts.astype(np.float32) ** 2))
            del step
        else:
            jax.make_jaxpr(lambda v, plan=plan: bj.fold(v, plan, backend="host"))(x)
        refs.append(weakref.ref(plan))
        del plan
        most = max(most, xla_host_call.registered())
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert most <= 10


def test_a_plan_built_inside_a_jitted_function_lives_with_its_executable():
    ids = np.arange(20) % 5
    made = []

    def f(v):
        plan = bitfold.Fold(ids, 5)
        made.append(weakref.ref(plan))
        return bj.fold(v, plan, backend="host")

    jitted = jax.jit(f)
    x = jnp.ones(20, jnp.float32)
    assert jitted(x).tolist() == [4.0] * 5
    gc.collect()
    assert made[0]() is not None  # only the compiled step holds it, and it is kept
    assert jitted(2 * x).tolist() == [8.0] * 5 and len(made) == 1
    jax.clear_caches()
    gc.collect()
    assert made[0]() is None


def test_large_gathers_on_the_host_route_are_numpys_take_with_xlas_bits():
    """expand, and the gradients of fold and segment_sum, gather at least HOST_GATHER_MIN
    elements with NumPy on the host route, straight into XLA's buffer: XLA's gather's bits."""
    rng = np.random.default_rng(7)
    index = rng.integers(0, 300, (200, 200))
    plan = bitfold.Fold(index, 300)
    assert plan.size * 2 >= bj.HOST_GATHER_MIN
    v = rng.standard_normal((300, 2)).astype(np.float32)
    host = jax.jit(lambda v: bj.expand(v, plan, backend="host"))
    assert "bitfold_host_call" in str(jax.make_jaxpr(host)(v))
    assert np.array_equal(bits(host(v)), bits(v[index]))
    both = jax.vmap(host)(np.stack([v, -v]))
    assert np.array_equal(bits(both[1]), bits(-v[index]))
    x = rng.standard_normal((200, 200, 2)).astype(np.float32)
    w = jnp.asarray(v)
    grad = jax.jit(jax.grad(lambda x: jnp.sum(bj.fold(x, plan, backend="host") * w)))(x)
    assert np.array_equal(bits(grad), bits(v[index]))
    ids = index.reshape(-1).astype(np.int32)
    flat = x.reshape(-1, 2)
    seg = jax.jit(jax.grad(lambda d, i: jnp.sum(bj.segment_sum(d, i, 300) * w)))
    assert "bitfold_host_call" in str(jax.make_jaxpr(seg)(flat, ids))
    assert np.array_equal(bits(seg(flat, ids)), bits(v[ids]))


def test_out_of_range_traced_ids_give_the_gradient_jnp_take_gives():
    """A NaN sum forward; backward, a negative id counts from the end and a too large one is a
    NaN row, on both paths, as jnp.take gathers."""
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 300, 40_000).astype(np.int32)
    ids[[3, 5, 7]] = [-1, 300, -301]
    data = rng.standard_normal((40_000, 2)).astype(np.float32)
    w = jnp.asarray(rng.standard_normal((300, 2)).astype(np.float32))
    want = np.asarray(jnp.take(w, jnp.asarray(ids), axis=0))
    for path in bj.PATHS:
        seg = jax.jit(
            jax.grad(lambda d, i, p=path: jnp.sum(bj.segment_sum(d, i, 300, backend=p) * w))
        )
        assert np.array_equal(bits(seg(data, ids)), bits(want))


@pytest.mark.parametrize("cores", [1, 2, 3, 8])
def test_large_host_gathers_are_cut_into_slices_with_the_same_result(monkeypatch, cores):
    monkeypatch.setattr(bj.os, "cpu_count", lambda: cores)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1000, 3)).astype(np.float32)
    index = rng.integers(0, 1000, bj.TAKE_PARALLEL_MIN // 3 + 5).astype(np.uint16)
    out = np.full((index.size, 3), np.nan, np.float32)
    bj._take_into(index, x, out)
    assert np.array_equal(bits(out), bits(x[index]))
