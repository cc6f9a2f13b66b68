"""The XLA FFI host call: a Python function on XLA's own buffers, inside ``jit`` and ``vmap``.

``bitfold.jax``'s host route folds through it; these check the call itself:
the result written where XLA reads it, read-only input views (one or
several inputs), one registration for equal calls, ``vmap`` one element at
a time, empty arrays, an exception raised by the jitted call with its
message (never an unwritten output), and the registrations' lifetimes: held
while a computation that calls them may run, freed after.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="the host call is JAX's")
jnp = pytest.importorskip("jax.numpy")

from bitfold import xla_host_call  # noqa: E402

pytestmark = pytest.mark.skipif(not xla_host_call.available(), reason="this JAX has no jax.ffi")


def _sums(x: np.ndarray) -> np.ndarray:
    assert not x.flags.writeable  # XLA's input buffer: read, never written
    return x.sum(axis=0) * 2


def test_a_jitted_host_call_returns_the_functions_result():
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    out = jax.ShapeDtypeStruct((4,), jnp.float32)
    f = jax.jit(lambda v: xla_host_call.host_call(_sums, v + 1, out, ("sums",)) - 1)
    got = np.asarray(f(jnp.asarray(x)))
    assert got.tolist() == ((x + 1).sum(0) * 2 - 1).tolist()


def _registered(*identity):
    return [c for c in list(xla_host_call._CALLS.values()) if c.identity == identity]


def test_equal_calls_share_one_registration_and_vmap_runs_each_element():
    out = jax.ShapeDtypeStruct((3,), jnp.float32)
    call = jax.jit(lambda v: xla_host_call.host_call(_sums, v, out, ("sums", "vmap")))
    xs = np.random.default_rng(0).standard_normal((5, 7, 3)).astype(np.float32)
    got = np.asarray(jax.vmap(call)(jnp.asarray(xs)))
    again = np.asarray(jax.vmap(call)(jnp.asarray(xs * 2)))
    assert got.tolist() == (xs.sum(axis=1) * 2).tolist()
    assert again.tolist() == ((xs * 2).sum(axis=1) * 2).tolist()
    assert len(_registered("sums", "vmap")) == 1


def test_empty_input_and_output():
    out = jax.ShapeDtypeStruct((0,), jnp.float32)
    f = jax.jit(lambda v: xla_host_call.host_call(lambda a: a.sum(0), v, out, ("empty",)))
    assert np.asarray(f(jnp.zeros((3, 0), jnp.float32))).shape == (0,)


def test_an_exception_in_the_function_is_raised_by_the_jitted_call():
    def broken(a: np.ndarray) -> np.ndarray:
        raise ValueError("no sums today")

    out = jax.ShapeDtypeStruct((2,), jnp.float32)
    f = jax.jit(lambda v: xla_host_call.host_call(broken, v, out, ("broken",)))
    with pytest.raises(Exception, match="bitfold host call: ValueError: no sums today"):
        np.asarray(f(jnp.ones((3, 2), jnp.float32)))


def test_several_inputs_each_read_where_it_lies_and_vmap_of_some():
    def weighted(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        assert not x.flags.writeable and not w.flags.writeable
        return (x * w[:, None]).sum(axis=0)

    out = jax.ShapeDtypeStruct((3,), jnp.float32)
    f = jax.jit(lambda x, w: xla_host_call.host_call(weighted, (x, w), out, ("weighted",)))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    w = rng.standard_normal(4).astype(np.float32)
    assert np.array_equal(np.asarray(f(x, w)), (x * w[:, None]).sum(axis=0))
    xs = np.stack([x, 2 * x, -x])
    got = np.asarray(jax.vmap(f, in_axes=(0, None))(xs, w))  # the weights unbatched
    assert np.array_equal(got, (xs * w[None, :, None]).sum(axis=1))


def test_outside_jit_the_function_is_called_directly_and_nothing_stays_registered():
    out = jax.ShapeDtypeStruct((3,), jnp.float32)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = xla_host_call.host_call(_sums, jnp.asarray(x), out, ("sums", "eager"))
    assert isinstance(got, jax.Array) and got.tolist() == (x.sum(axis=0) * 2).tolist()
    gc.collect()
    assert _registered("sums", "eager") == []


def test_a_registration_lives_while_a_computation_that_calls_it_may_run():
    """The runtime executable holds its registrations: a jitted function dropped at once after
    its call still finds its host function when it runs; dropped and done, none is left."""

    def late(v):  # a loop of XLA's first (a fraction of a second), then the host call
        v = jax.lax.fori_loop(0, 300_000, lambda i, a: a * 0.5 + 1.0, v)
        return xla_host_call.host_call(_sums, v, out, ("sums", "late"))

    out = jax.ShapeDtypeStruct((3,), jnp.float32)
    x = jnp.ones((5, 3), jnp.float32)
    t0 = time.perf_counter()
    result = jax.jit(late)(x)
    gc.collect()  # the jitted function and its Python executable are gone, the call still to run
    dispatched = time.perf_counter() - t0
    assert result.tolist() == [20.0, 20.0, 20.0]  # the loop's fixed point 2, summed, doubled
    assert time.perf_counter() - t0 > dispatched  # it ran after the collection
    del result, late  # JAX's trace cache keeps its jaxpr (and the registration) while late lives
    gc.collect()
    assert _registered("sums", "late") == []


def test_a_registration_held_by_a_kept_function_is_freed_with_it_and_with_clear_caches():
    out = jax.ShapeDtypeStruct((3,), jnp.float32)
    f = jax.jit(lambda v: xla_host_call.host_call(_sums, v, out, ("sums", "kept")))
    x = jnp.ones((2, 3), jnp.float32)
    f(x).block_until_ready()
    gc.collect()
    assert len(_registered("sums", "kept")) == 1
    assert f(x).tolist() == [4.0, 4.0, 4.0]  # the cached executable, its registration alive
    jax.clear_caches()
    gc.collect()
    assert _registered("sums", "kept") == []
    assert f(x).tolist() == [4.0, 4.0, 4.0]  # traced again: registered again
    del f
    gc.collect()
    assert _registered("sums", "kept") == []
