"""The cases of ``bitfold.jax.psum``'s tests: each case's terms, the same for any device count.

``global_terms(name)`` is the global array of a case, cut between the devices
along its first axis (its 8 or 64 rows divide between 1, 2, 4 and 8 devices);
a case without ``local_axis`` gives each device one row, so only the first
``devices`` rows take part.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class Case:
    dtype: str
    x64: bool = False
    local_axis: bool = True  # psum(t, "i", axis=0) of (rows / devices, C) blocks, else psum(t[0])
    grad: bool = False


CASES: dict[str, Case] = {
    "float32": Case("float32", grad=True),
    "float32-elementwise": Case("float32", local_axis=False),
    "float32-specials": Case("float32"),
    "float16": Case("float16"),
    "bfloat16": Case("bfloat16"),
    "float32-x64": Case("float32", x64=True, grad=True),
    "float64-x64": Case("float64", x64=True),
}


def global_terms(name: str) -> np.ndarray:
    """The global array of case ``name`` (deterministic)."""
    case = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name) + 1)
    rows = 64 if case.local_axis else 8
    shape = (rows, 6)
    spread = {"float16": 6, "bfloat16": 40, "float32": 40, "float64": 300}[case.dtype]
    v = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, shape))
    if name == "float32-specials":
        v[:, 0] = 2.0**-149  # subnormal terms
        v[:, 1] = -0.0  # every term -0.0: the sum is -0.0
        v[3, 2] = np.inf
        v[5, 3], v[9, 3] = np.inf, -np.inf  # both: NaN
        v[7, 4] = np.nan
        v[:, 5] = np.where(np.arange(rows) % 2 == 0, 2.0**100, -(2.0**100))
        v[0, 5] = 1.0  # cancels to exactly 1.0
    dtype = ml_dtypes.bfloat16 if case.dtype == "bfloat16" else np.dtype(case.dtype)
    with np.errstate(over="ignore"):
        return v.astype(dtype)
