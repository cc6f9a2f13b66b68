"""The XLA FFI host call: a Python function on XLA's own buffers, inside ``jit`` and ``vmap``.

``bitfold.jax``'s host route folds through it; these check the call itself:
the result written where XLA reads it, read-only input views, one
registration for equal calls, ``vmap`` one element at a time, empty arrays,
and an exception raised by the jitted call with its message (never an
unwritten output).
"""

from __future__ import annotations

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


def test_equal_calls_share_one_registration_and_vmap_runs_each_element():
    out = jax.ShapeDtypeStruct((3,), jnp.float32)
    before = len(xla_host_call._CALLS)
    call = jax.jit(lambda v: xla_host_call.host_call(_sums, v, out, ("sums", "vmap")))
    xs = np.random.default_rng(0).standard_normal((5, 7, 3)).astype(np.float32)
    got = np.asarray(jax.vmap(call)(jnp.asarray(xs)))
    again = np.asarray(jax.vmap(call)(jnp.asarray(xs * 2)))
    assert got.tolist() == (xs.sum(axis=1) * 2).tolist()
    assert again.tolist() == ((xs * 2).sum(axis=1) * 2).tolist()
    assert len(xla_host_call._CALLS) == before + 1


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
