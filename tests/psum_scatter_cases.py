"""The cases of ``bitfold.jax.psum_scatter``'s tests: each case's terms, the same for any device
count.

``global_terms(name)`` is a case's global array, cut between the devices along
its first axis: with ``local`` each device sums its block of rows too
(``axis=0``: every row is a term of every device count), else each device
holds one row (only the first ``devices`` rows take part). ``scatter`` is the
dimension of the sum that is cut into the devices' pieces; an untiled case
keeps ``devices`` of the 8 slices of that dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class Case:
    dtype: str
    shape: tuple[int, ...]  # the global terms: (rows, ...) of a sum of shape[1:]
    scatter: int = 0  # scatter_dimension, of the sum
    tiled: bool = True
    local: bool = True  # each device's rows summed too (axis=0), else one row a device
    x64: bool = False
    grad: bool = False


CASES: dict[str, Case] = {
    "float32": Case("float32", (64, 16, 3), grad=True),
    "float32-dim1": Case("float32", (64, 3, 8), scatter=1),
    "float32-untiled": Case("float32", (64, 8, 5), tiled=False),
    "float32-one-row-a-device": Case("float32", (8, 24), local=False),
    "float32-specials": Case("float32", (64, 8, 6)),
    "float16": Case("float16", (64, 8, 6)),
    "bfloat16": Case("bfloat16", (64, 8, 6)),
    "float32-x64": Case("float32", (64, 16, 3), x64=True, grad=True),
    "float64-x64": Case("float64", (64, 8, 6), x64=True),
}


def global_terms(name: str) -> np.ndarray:
    """The global terms of case ``name`` (deterministic)."""
    case = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name) + 50)
    spread = {"float16": 6, "bfloat16": 40, "float32": 40, "float64": 300}[case.dtype]
    v = rng.standard_normal(case.shape) * np.exp2(rng.integers(-spread, spread, case.shape))
    if name == "float32-specials":
        v[:, 0, 0] = 2.0**-149  # subnormal terms
        v[:, 1, :] = -0.0  # every term -0.0: the sums are -0.0
        v[3, 2, 0] = np.inf
        v[5, 3, 1], v[9, 3, 1] = np.inf, -np.inf  # both: NaN
        v[7, 4, 2] = np.nan
        v[:, 5, 3] = np.where(np.arange(case.shape[0]) % 2 == 0, 2.0**100, -(2.0**100))
        v[0, 5, 3] = 1.0  # cancels to exactly 1.0
    if case.local:  # 1 + 2^-24 + 2^-24 (rows 0, 40, 63): float sums give 1.0, exact 1 + 2^-23
        v[0].flat[0], v[40].flat[0], v[63].flat[0] = 1.0, 2.0**-24, 2.0**-24
        v[1:40].flat[0 :: v[0].size] = 0.0
        v[41:63].flat[0 :: v[0].size] = 0.0
    dtype = ml_dtypes.bfloat16 if case.dtype == "bfloat16" else np.dtype(case.dtype)
    with np.errstate(over="ignore"):
        return v.astype(dtype)


def weights(shape: tuple[int, ...]) -> np.ndarray:
    """The gradient cases' cotangent weights (float32, exact on the host and in JAX)."""
    return (np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32) / 8).reshape(shape)
