"""Plans in JAX's jitted folds: freed when no computation that calls them is left.

A plan a jitted fold used is freed once nothing but bitfold's registrations
would hold it: a loop over 5,000 plans leaves none alive and the registry
small; a plan only a compiled step holds lives as long as that step.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import bitfold

jax = pytest.importorskip("jax", reason="JAX is not installed")
jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
bj = pytest.importorskip("bitfold.jax", reason="bitfold.jax needs JAX")
from bitfold import xla_host_call  # noqa: E402

pytestmark = pytest.mark.skipif(not xla_host_call.available(), reason="this JAX has no jax.ffi")


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
