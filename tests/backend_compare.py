"""Every registered backend x strategy x dtype against the oracle and the host, pair by pair.

Not collected by pytest (the name does not match ``test_*.py``):
``tests/test_backends.py`` calls :func:`compare` for each name in
``bitfold.backend_names()``, in its own process for backends that need one
(CUDA: the numba-cuda simulator, ``NUMBA_ENABLE_CUDASIM=1``). Run directly,
``python tests/backend_compare.py NAME`` prints the problems as JSON.

``exact`` must equal the Fraction oracle bit for bit, ``ordered`` the
documented order bit for bit, and both the host's result; ``atomic`` the
float64 sum within a tolerance. ``init=`` follows the backend's declared
:class:`~bitfold.backends.registry.InitRule`: taken where it says (the
oracle with init as one more term), refused with the declared errors where
it does not. A backend registered without a way here to place values on it
(:data:`PLACE`) fails, so a new backend is tested the moment it is registered.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from oracle import UINT, exact_fold_oracle, ordered_fold_reference

import bitfold
from bitfold import dispatch
from bitfold.arrays import to_numpy
from bitfold.backends.registry import get_backend


def _to_cuda(a: np.ndarray) -> Any:
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))


def _to_torch(a: np.ndarray) -> Any:
    import torch

    return torch.from_numpy(np.ascontiguousarray(a))


def _cuda_options() -> dict[str, Any]:
    from bitfold.kernels.cuda import LaunchShape

    return {"launch": LaunchShape(32, 3)}  # several blocks, tiny on the simulator


#: backend name -> how a test puts a NumPy array where that backend folds it
PLACE: dict[str, Callable[[np.ndarray], Any]] = {
    "host": lambda a: a, "cuda": _to_cuda, "portable": _to_torch,
}
#: backend name -> options for its folds in these (tiny) cases (``backend=`` forces one that
#: the values' family and device would not choose: the portable path on CPU tensors)
OPTIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "cuda": _cuda_options, "portable": lambda: {"backend": "portable"},
}
#: backend name -> environment its cases run in (a fresh process), if not this one
ENVIRONMENT: dict[str, dict[str, str]] = {"cuda": {"NUMBA_ENABLE_CUDASIM": "1"}}

DTYPES = ("float16", "float32", "float64")
STRATEGIES = ("exact", "ordered", "atomic")


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _data(dtype: str, seed: int, n: int = 180, K: int = 7, D: int = 1):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, K, n)
    spread = 8 if dtype == "float16" else 40
    shape = (n,) if D == 1 else (n, D)
    vals = (rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread, shape)).astype(dtype)
    flat = vals.reshape(-1)
    flat[:5] = [-0.0, 1.0, np.inf, 3.0, -0.0]
    return idx, vals, K


def _out(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def compare(name: str) -> list[str]:
    """The problems of backend ``name`` (empty when every case agrees)."""
    if name not in PLACE:
        return [f"backend {name!r} is registered but tests/backend_compare.py cannot place "
                "values on it: add it to PLACE"]  # fmt: skip
    backend = get_backend(name)
    place, options = PLACE[name], OPTIONS.get(name, dict)()
    problems: list[str] = []

    def fold(plan, vals, strategy, **kw):
        got = dispatch.fold(plan, place(vals), strategy, **options, **kw)
        chosen = dispatch.backend_for(place(vals), backend=options.get("backend"))
        assert chosen is backend, "the values went to another backend"
        return np.asarray(to_numpy(got))

    for dtype in DTYPES:
        for D in (1, 3):
            idx, vals, K = _data(dtype, seed=DTYPES.index(dtype) + D, D=D)
            plan = bitfold.Fold(idx, K)
            out = _out(dtype)
            for strategy in STRATEGIES:
                what = f"{name} {strategy} {dtype} rows of {D}"
                got = fold(plan, vals, strategy)
                host = np.asarray(dispatch.fold(plan, vals, strategy))
                if got.dtype != np.dtype(out) or got.shape != host.shape:
                    problems.append(f"{what}: {got.dtype} {got.shape}, want {out} {host.shape}")
                    continue
                cols = vals.reshape(len(idx), -1)
                for d in range(cols.shape[1]):
                    col = got.reshape(K, -1)[:, d]
                    if strategy == "exact":
                        want = exact_fold_oracle(idx, cols[:, d], K, out)
                    elif strategy == "ordered":
                        want = ordered_fold_reference(idx, cols[:, d], K, out)
                    else:
                        want = np.zeros(K)
                        np.add.at(want, idx, cols[:, d].astype(np.float64))
                        if not np.allclose(col, want, rtol=1e-2, atol=1e-3, equal_nan=True):
                            problems.append(f"{what}: atomic column {d} off the float64 sum")
                        continue
                    if not np.array_equal(_bits(col), want.view(UINT[out])):
                        problems.append(f"{what}: column {d} differs from the oracle")
                if strategy != "atomic" and not np.array_equal(_bits(got), _bits(host)):
                    problems.append(f"{what}: differs from the host bit for bit")
    problems += _init_rule(name, fold)
    return problems


def _init_rule(name: str, fold) -> list[str]:
    """``init=`` taken or refused as the backend's InitRule declares."""
    rule = get_backend(name).init
    problems = []
    idx, vals, K = _data("float32", seed=9)
    plan = bitfold.Fold(idx, K)
    init = np.linspace(-3.0, 3.0, K).astype(np.float32)
    for strategy in STRATEGIES:
        try:
            got = fold(plan, vals, strategy, init=PLACE[name](init))
        except bitfold.FoldError as e:
            if strategy in rule.strategies:
                problems.append(f"{name} {strategy} init refused, but declared taken: {e}")
            continue
        if strategy not in rule.strategies:
            problems.append(f"{name} {strategy} init taken, but declared refused")
        elif strategy == "exact":
            want = exact_fold_oracle(np.r_[np.arange(K), idx], np.r_[init, vals], K)
            if not np.array_equal(_bits(got), want.view(np.uint32)):
                problems.append(f"{name} exact init differs from the oracle")
    wide = PLACE[name](init.astype(np.float64))
    try:
        got = fold(plan, vals, "exact", init=wide)
        if not rule.mixed_dtypes:
            problems.append(f"{name}: float64 init of float32 values taken, declared refused")
        want = exact_fold_oracle(np.r_[np.arange(K), idx], np.r_[init.astype(np.float64), vals],
                                 K, "float64")  # fmt: skip
        if not np.array_equal(_bits(got), want.view(np.uint64)):
            problems.append(f"{name} exact float64 init differs from the oracle")
    except bitfold.FoldTypeError as e:
        if rule.mixed_dtypes:
            problems.append(f"{name}: float64 init refused, declared taken: {e}")
    return problems


if __name__ == "__main__":
    print(json.dumps(compare(sys.argv[1])))
