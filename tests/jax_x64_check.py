"""Run by tests/test_jax_adapter.py in a subprocess with JAX_ENABLE_X64=1.

Both paths of bitfold.jax give the oracle's bits for float64 and float32
values (int64 words on the portable path), under jit, grad and vmap; a
portable accumulator state equals the host's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from oracle import exact_fold_oracle

import bitfold
import bitfold.jax as bj
from bitfold.backends.portable import states
from bitfold.validate import check_values

assert jax.config.jax_enable_x64, "run with JAX_ENABLE_X64=1"
rng = np.random.default_rng(64)
index = rng.integers(0, 9, (30, 7))
plan = bitfold.Fold(index, 9)
for dtype, bits in ((np.float64, np.uint64), (np.float32, np.uint32)):
    C = (rng.standard_normal((30, 7)) * 2.0 ** rng.integers(-300, 300, (30, 7))).astype(dtype)
    C[0, 0], C[1, 1], C[2, 2] = -0.0, np.inf, 2.0**-1074 if dtype == np.float64 else 2.0**-149
    want = exact_fold_oracle(index, C, 9, np.dtype(dtype).name).view(bits)
    cot = jnp.asarray(C)
    for backend in bj.PATHS:

        def loss(v, b=backend, c=cot):
            return jnp.sum(bj.expand(v, plan, backend=b) * c)

        g = jax.jit(jax.grad(loss))(jnp.zeros(9, dtype))
        assert g.dtype == dtype, (g.dtype, dtype)
        assert np.array_equal(np.asarray(g).view(bits), want), (backend, dtype)
        out = jax.jit(jax.vmap(lambda c, b=backend: bj.fold(c, plan, backend=b)))(cot[None])
        assert np.array_equal(np.asarray(out[0]).view(bits), want), (backend, dtype)
        seg = jax.jit(lambda d, i, b=backend: bj.segment_sum(d, i, 9, backend=b))(
            jnp.asarray(C.reshape(-1)), jnp.asarray(index.reshape(-1))
        )
        assert np.array_equal(np.asarray(seg).view(bits), want), (backend, dtype)
    # the device state of JAX values is the host accumulator's state
    x = jnp.asarray(C)
    spec = check_values(plan.shape, x.shape, x.dtype)
    fmt = bitfold.formats.limb_format_for(spec.dtype)
    state = np.asarray(states.exact_state(plan, x, spec, fmt))
    host = plan.accumulator(np.dtype(dtype).name).add(C)
    merged = bitfold.ExactAccumulator.from_state(plan, state, np.dtype(dtype).name).merge(host)
    doubled = exact_fold_oracle(
        np.concatenate([index.reshape(-1)] * 2), np.concatenate([C.reshape(-1)] * 2), 9,
        np.dtype(dtype).name,
    )  # fmt: skip
    assert np.array_equal(np.asarray(merged.result()).view(bits), doubled.view(bits))
print("x64 ok")
