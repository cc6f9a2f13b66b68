"""A table of problems every backend is compared on, bit for bit, with the host and the oracle.

Not collected by pytest (the name does not match ``test_*.py``):
``tests/test_backend_table.py`` runs each problem of :func:`table` against
each backend that runs in the test process (one test per backend and
problem), and ``tests/test_backends.py`` runs :func:`compare` in a process of
its own for backends that need one (CUDA: the numba-cuda simulator,
``NUMBA_ENABLE_CUDASIM=1``). Run directly, ``python tests/backend_compare.py
NAME`` prints the problems found as JSON.

A problem is data (:class:`Problem`): an index, values of one dtype (held as
the float64 values they are exactly), K, and optionally ``out_dtype=`` and
``init=``. Each is folded on the backend and on the host, and:

* ``exact`` must equal the Fraction oracle (``tests/oracle.py``) bit for bit,
  column by column, and the host's result;
* ``ordered`` must equal the host's ``ordered`` bit for bit (and the oracle's
  documented order where the output is the default dtype and nothing is
  added into);
* ``atomic`` must have the host's shape and dtype (its bits depend on the
  order its atomics finish);
* ``init=`` is taken where the backend's :class:`~bitfold.backends.registry.InitRule`
  says (then compared as above, the oracle with init as one more term a
  bucket) and refused with a :class:`bitfold.FoldError` where it does not;
* for problems marked ``accumulate``, the accumulator
  (:class:`bitfold.ExactAccumulator`, ``plan.accumulator(backend=NAME)``):
  added in pieces, two merged, rounded (to ``out_dtype`` too), its state moved
  to the host and a host state moved to the backend: the same bits each way.

There are no tolerances anywhere. Problems stay small (at most ~20,000 values)
because an interpreter may run them (Triton's runs ~10^6 values a second);
a backend's :attr:`Target.scale` shrinks them further (the numba-cuda
simulator). A new backend is one :class:`Target` in :data:`TARGETS`: how the
table places a NumPy array where the backend folds it, which options force
and tune it, whether it takes torch tensors (bfloat16 values), and the
environment of its own process if it needs one. A backend registered without
a target fails :func:`compare`, so it is tested the moment it is registered.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from oracle import FORMATS, boundary_buckets, exact_fold_oracle, ordered_fold_reference

import bitfold
from bitfold import dispatch
from bitfold.arrays import from_numpy, to_numpy
from bitfold.backends.registry import get_backend
from bitfold.formats import dtype_name, limb_format_for, resolve_out_dtype

STRATEGIES = ("exact", "ordered", "atomic")
DTYPES = ("float16", "bfloat16", "float32", "float64")


# -- where each backend's values live -------------------------------------------------------------
def _torch() -> Any:
    import torch

    return torch


def _as_torch(a: Any, device: str = "cpu") -> Any:
    """A NumPy array (or a CPU tensor: bfloat16 values) as a torch tensor on ``device``."""
    torch = _torch()
    t = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device)


def _to_numba_cuda(a: np.ndarray) -> Any:
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))


def _cuda_options() -> dict[str, Any]:
    from bitfold.kernels.cuda import LaunchShape

    return {"launch": LaunchShape(32, 3)}  # several blocks, tiny on the simulator


def gpu_or_cpu() -> str:
    """``"cuda"`` when torch sees a GPU (ROCm's too), else ``"cpu"`` (Triton's interpreter)."""
    return "cuda" if _torch().cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Target:
    """How the table reaches one backend.

    ``put``: a NumPy array (or a CPU tensor, for bfloat16 values) placed where
    the backend folds it; ``device``: the device type ``put`` places values on
    (called when a test runs); ``options``: keywords of every fold and
    accumulator (``backend=`` forces a backend the values would not choose);
    ``torch``: the backend takes torch tensors here, so bfloat16 values are
    tested (the host reference then folds CPU tensors too); ``environment``:
    variables of a fresh process the comparison must run in; ``scale``: a
    factor on every problem's size (a slow simulator).
    """

    put: Callable[[Any], Any]
    device: Callable[[], str] = lambda: "cpu"
    options: Callable[[], dict[str, Any]] = dict
    torch: bool = False
    environment: Mapping[str, str] = field(default_factory=dict)
    scale: float = 1.0


#: backend name -> how the table reaches it. A new backend: one entry here.
TARGETS: dict[str, Target] = {
    "host": Target(put=lambda a: a),
    "cuda": Target(
        put=_to_numba_cuda,
        device=lambda: "cuda",
        options=_cuda_options,
        environment={"NUMBA_ENABLE_CUDASIM": "1"},
        scale=0.1,
    ),
    "portable": Target(put=_as_torch, options=lambda: {"backend": "portable"}, torch=True),
    "triton": Target(
        put=lambda a: _as_torch(a, gpu_or_cpu()),
        device=gpu_or_cpu,
        options=lambda: {"backend": "triton"},
        torch=True,
    ),
}
#: backend name -> the environment of the process its comparison runs in, if not this one
ENVIRONMENT: dict[str, dict[str, str]] = {
    n: dict(t.environment) for n, t in TARGETS.items() if t.environment
}


# -- the problems ---------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Problem:
    """One fold to compare: ``values`` (float64, each exactly a value of ``dtype``) by ``index``.

    ``values`` has shape ``(N,)`` or ``(N, D)`` (rows); ``init`` (exactly values of
    ``init_dtype``) has shape ``(K,)`` or ``(K, D)``. ``strategies``: the folds run;
    ``accumulate``: the accumulator checks run too.
    """

    name: str
    index: np.ndarray
    values: np.ndarray
    K: int
    dtype: str
    out: str | None = None
    init: np.ndarray | None = None
    init_dtype: str | None = None
    strategies: tuple[str, ...] = STRATEGIES
    accumulate: bool = False

    @property
    def needs_torch(self) -> bool:
        """True when NumPy cannot hold the values or init (bfloat16)."""
        return "bfloat16" in (self.dtype, self.init_dtype)


def _bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bfloat16 (nearest even, through float32), as float64."""
    x = np.asarray(x, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        u = x.reshape(-1).astype(np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = (u & 0xFFFFFFFF).astype(np.uint32).view(np.float32).astype(np.float64)
    out[np.isnan(x.reshape(-1))] = np.nan
    return out.reshape(x.shape)


def held(x: Any, dtype: str) -> np.ndarray:
    """``x`` rounded to ``dtype``, as the float64 values it then holds exactly."""
    x = np.asarray(x, np.float64)
    if dtype == "bfloat16":
        return _bf16(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(dtype).astype(np.float64)


def typed(x: np.ndarray, dtype: str) -> Any:
    """Held float64 values as an array of ``dtype``: NumPy, or a CPU tensor for bfloat16."""
    if dtype == "bfloat16":
        torch = _torch()
        return torch.from_numpy(np.ascontiguousarray(x, np.float64)).to(torch.bfloat16)
    return np.ascontiguousarray(x).astype(dtype)


def _limits(dtype: str) -> tuple[float, float, float]:
    """``(largest finite, smallest subnormal, ulp of 1.0)`` of ``dtype``."""
    precision, sub_exp, emax = FORMATS[dtype]
    return (2 - 2.0 ** (1 - precision)) * 2.0**emax, 2.0**sub_exp, 2.0 ** (1 - precision)


SPREAD = {"float16": 8, "bfloat16": 60, "float32": 40, "float64": 300}


def _wide(rng: np.random.Generator, shape: Any, dtype: str, spread: int | None = None):
    """Normal values scaled over 2^(±spread), held in ``dtype``: many limbs, cancellation."""
    s = SPREAD[dtype] if spread is None else spread
    return held(rng.standard_normal(shape) * 2.0 ** rng.integers(-s, s, shape), dtype)


def _from_buckets(name: str, buckets: list[list[float]], dtype: str, seed: int, **kw) -> Problem:
    """A problem whose bucket k holds the terms ``buckets[k]`` (those ``dtype`` holds exactly),
    interleaved in a random order."""
    kept = [b for b in buckets if all(held(t, dtype) == t or math.isnan(t) for t in b)]
    idx = np.array([k for k, b in enumerate(kept) for _ in b], np.int64)
    vals = np.array([t for b in kept for t in b], np.float64)
    perm = np.random.default_rng(seed).permutation(idx.size)
    return Problem(name, idx[perm], vals[perm], len(kept), dtype, **kw)


def special_buckets(dtype: str) -> list[list[float]]:
    """NaN, infinities, signed zeros, empty buckets, overflow, ties and cancellation in
    ``dtype`` (for its default output)."""
    top, smallest, _ = _limits(dtype)
    out = resolve_out_dtype(dtype)
    half = 2.0 ** -FORMATS[out][0]  # half an ulp of 1.0 in the output
    nan, inf = math.nan, math.inf
    return [
        [1.0, nan, 2.0], [inf, -inf], [inf, 1.0, 5.0], [-inf, -5.0], [inf, nan], [nan],
        [-0.0, -0.0, -0.0], [-0.0], [-0.0, 0.0], [0.0], [1.5, -1.5, -0.0], [], [],
        [2.0**10, -(2.0**10), -smallest, smallest], [top, top], [-top, -top, 2.0],
        [top, -top, smallest], [1.0, half], [1.0 + 2 * half, half], [1.0, half, smallest],
        [-1.0, -half], [3.0, -2.0, half, -half, half], [smallest, smallest, -smallest],
        [], [2.0, -0.0],
    ]  # fmt: skip


def subnormal_values(rng: np.random.Generator, n: int, dtype: str) -> np.ndarray:
    """Small multiples of ``dtype``'s subnormal steps, mixed signs, a few normals among them."""
    _, smallest, _ = _limits(dtype)
    v = rng.integers(-9, 10, n) * smallest * 2.0 ** rng.integers(0, 14, n)
    v[::17] = rng.standard_normal(v[::17].size) * smallest * 2.0**30
    return held(v, dtype)




def _n(n: int, scale: float) -> int:
    return max(32, int(n * scale))


@functools.cache
def table(scale: float = 1.0) -> tuple[Problem, ...]:
    """Every problem, sizes times ``scale`` (names do not depend on it)."""
    rng = np.random.default_rng(20240611)
    P: list[Problem] = []
    for dtype in DTYPES:
        n, K = _n(2000, scale), 37
        idx, vals = rng.integers(0, K, n), _wide(rng, n, dtype)
        vals[:6] = [-0.0, 1.0, math.inf, 3.0, -0.0, -math.inf]
        P.append(Problem(f"scalars {dtype}", idx, vals, K, dtype, accumulate=True))
        n = _n(600, scale)
        P.append(Problem(f"rows {dtype}", rng.integers(0, 7, n), _wide(rng, (n, 3), dtype), 7,
                         dtype, accumulate=dtype in ("float32", "float64")))  # fmt: skip
        P.append(_from_buckets(f"specials {dtype}", special_buckets(dtype), dtype, seed=1))
        n = _n(1500, scale)
        P.append(Problem(f"subnormals {dtype}", rng.integers(0, 13, n),
                         subnormal_values(rng, n, dtype), 13, dtype))  # fmt: skip
    # out_dtype: float64 values rounded once to a narrower output, at the rounding boundaries
    for out in ("float16", "bfloat16", "float32"):
        P.append(_from_buckets(f"float64 to {out} at the boundaries", boundary_buckets(out),
                               "float64", seed=len(out), out=out,
                               strategies=("exact",)))  # fmt: skip
    for dtype, out in [("float32", "float16"), ("float32", "bfloat16"), ("float32", "float64"),
                       ("float16", "float16"), ("bfloat16", "bfloat16"), ("float64", "float32")]:
        n, K = _n(2000, scale), 31
        idx, vals = rng.integers(0, K, n), _wide(rng, n, dtype, spread=12)
        idx[:5], vals[:5] = [0, 0, 1, 2, 3], held([6e4, 6e4, 2.0**-30, -0.0, 7e4], dtype)
        P.append(Problem(f"{dtype} to {out}", idx, vals, K, dtype, out=out,
                         strategies=("exact",), accumulate=dtype == "float32"))  # fmt: skip
    # hot buckets: K = 1, one bucket holding most positions, rows with a hot bucket. ``ordered``
    # walks a bucket in order, one position after another: it runs on the smaller ones only
    fast = ("exact", "atomic")
    n = _n(20000, scale)
    vals = _wide(rng, n, "float32", spread=20)
    vals[: n // 3] = np.abs(vals[: n // 3])  # long runs of one sign
    vals[5:9] = [-0.0, -0.0, 0.0, -0.0]
    P.append(Problem("one bucket float32", np.zeros(n, np.int64), vals, 1, "float32",
                     strategies=fast, accumulate=True))  # fmt: skip
    n = _n(2000, scale)
    P.append(Problem("one bucket float32, ordered too", np.zeros(n, np.int64),
                     _wide(rng, n, "float32", spread=20), 1, "float32"))  # fmt: skip
    P.append(Problem("one bucket float64", np.zeros(n, np.int64), _wide(rng, n, "float64"), 1,
                     "float64"))  # fmt: skip
    P.append(Problem("all -0.0 in one bucket", np.zeros(n, np.int64), np.full(n, -0.0), 1,
                     "float32"))  # fmt: skip
    n, K = _n(20000, scale), 64
    idx = np.where(rng.random(n) < 0.85, 5, rng.integers(0, K, n))
    P.append(Problem("a hot bucket among 64", idx, _wide(rng, n, "float32"), K, "float32",
                     strategies=fast))  # fmt: skip
    n = _n(3000, scale)
    idx = np.where(rng.random(n) < 0.9, 0, rng.integers(0, 3, n))
    P.append(Problem("a hot bucket of rows", idx, _wide(rng, (n, 2), "bfloat16"), 3, "bfloat16"))
    # Zipf-like maps: a few huge buckets, many tiny and many empty ones
    for dtype, n, K, ways in [("float32", 20000, 300, fast), ("float64", 3000, 120, STRATEGIES),
                              ("float16", 4000, 50, STRATEGIES)]:  # fmt: skip
        n = _n(n, scale)
        idx = np.minimum(rng.zipf(1.2, n) - 1, K - 1)
        P.append(Problem(f"zipf {dtype}", idx, _wide(rng, n, dtype, spread=20), K, dtype,
                         strategies=ways))  # fmt: skip
    n = _n(300, scale)
    P.append(Problem("many empty buckets", rng.integers(0, 3000, n), _wide(rng, n, "float32"),
                     3000, "float32"))  # fmt: skip
    P.append(Problem("no values", np.zeros(0, np.int64), np.zeros(0), 4, "float32"))
    # init=: taken or refused as each backend's InitRule declares
    n, K = _n(180, scale), 7
    idx, vals = rng.integers(0, K, n), _wide(rng, n, "float32")
    init32 = held(np.linspace(-3.0, 3.0, K), "float32")
    P.append(Problem("init float32", idx, vals, K, "float32", init=init32, init_dtype="float32"))
    P.append(Problem("init float64 into float32 values", idx, vals, K, "float32",
                     init=init32 + 2.0**-40, init_dtype="float64"))  # fmt: skip
    P.append(Problem("init float32 of float16 values", idx, held(vals, "float16"), K, "float16",
                     init=init32, init_dtype="float32"))  # fmt: skip
    rows = _wide(rng, (n, 3), "float64")
    P.append(Problem("init rows float64", idx, rows, K, "float64",
                     init=_wide(rng, (K, 3), "float64"), init_dtype="float64"))  # fmt: skip
    P.append(Problem("init bfloat16", idx, held(vals, "bfloat16"), K, "bfloat16",
                     init=held(init32, "bfloat16"), init_dtype="bfloat16"))  # fmt: skip
    zeros = np.array([0, 0, 1, 2, 3, 3], np.int64)
    P.append(Problem("init specials", zeros, np.array([-0.0, -0.0, 0.0, 1.0, math.nan, 1.0]), 6,
                     "float32", init=np.array([-0.0, -0.0, math.inf, -math.inf, 1.0, -0.0]),
                     init_dtype="float32"))  # fmt: skip
    names = [p.name for p in P]
    assert len(set(names)) == len(names), "problem names must be unique"
    return tuple(P)


def problem_names() -> tuple[str, ...]:
    """The names of the problems of :func:`table`, in order."""
    return tuple(p.name for p in table())


# -- comparing ------------------------------------------------------------------------------------
def _bits(a: Any) -> np.ndarray:
    """The bit patterns of a result (any library; bfloat16 as the float32 holding it)."""
    a = np.asarray(to_numpy(a) if not isinstance(a, np.ndarray) else a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def _columns(x: np.ndarray) -> np.ndarray:
    """Values of shape ``(N,)`` or ``(N, D)`` as ``(N, D)`` columns."""
    return x if x.ndim > 1 else x[:, None]


_ORACLES: dict[tuple[int, str], np.ndarray] = {}


def _oracle(p: Problem, out: str) -> np.ndarray:
    """The oracle's result, shape ``(K,) + trailing`` (bfloat16 as the float32 holding it);
    computed once a problem and output."""
    key = (id(p), out)
    if key not in _ORACLES:
        cols, got = _columns(p.values), []
        for d in range(cols.shape[1]):
            idx, vals = p.index, cols[:, d]
            if p.init is not None:
                idx, vals = np.r_[idx, np.arange(p.K)], np.r_[vals, _columns(p.init)[:, d]]
            got.append(exact_fold_oracle(idx, vals, p.K, out))
        _ORACLES[key] = np.stack(got, axis=1).reshape((p.K, *p.values.shape[1:]))
    return _ORACLES[key]


def _ordered_reference(p: Problem, out: str) -> np.ndarray | None:
    """The documented ``ordered`` order (into zeros, in ``out``; NumPy has no bfloat16)."""
    if p.init is not None or out == "bfloat16":
        return None
    cols = _columns(p.values)
    got = [ordered_fold_reference(p.index, cols[:, d], p.K, out) for d in range(cols.shape[1])]
    return np.stack(got, axis=1).reshape((p.K, *p.values.shape[1:]))


def out_name(p: Problem) -> str:
    """The dtype of ``p``'s result: ``out_dtype``, else init's, else the values' default."""
    if p.out is None and p.init is not None:
        return p.init_dtype or p.dtype
    return resolve_out_dtype(p.dtype, p.out)


def skip_reason(name: str, p: Problem) -> str | None:
    """Why ``p`` does not apply to backend ``name`` here, or None."""
    if p.needs_torch and not TARGETS[name].torch:
        return f"bfloat16 values need torch tensors, which the table does not give {name}"
    return None


def run_problem(name: str, p: Problem) -> list[str]:
    """The disagreements of backend ``name`` on problem ``p`` (empty when every check agrees).

    The caller checks :func:`skip_reason` first; an exception inside a fold is a problem.
    """
    target, backend = TARGETS[name], get_backend(name)
    options = target.options()
    to_host = _as_torch if target.torch else (lambda a: a)  # the host folds the same library
    plan = bitfold.Fold(p.index, p.K)
    vals = typed(p.values, p.dtype)
    placed, host_vals = target.put(vals), to_host(vals)
    problems: list[str] = []
    chosen = dispatch.backend_for(placed, backend=options.get("backend"))
    if chosen is not backend:
        return [f"{name} {p.name}: the values went to the {chosen.name} backend"]
    for strategy in p.strategies:
        what = f"{name} {strategy} {p.name}"
        kw: dict[str, Any] = {"out_dtype": p.out}
        host_kw = dict(kw)
        declared = True  # the backend declares this fold taken
        if p.init is not None:
            rule = backend.init
            declared = strategy in rule.strategies and (
                rule.mixed_dtypes or p.init_dtype == p.dtype
            )
            init = typed(p.init, p.init_dtype or p.dtype)
            kw["init"], host_kw["init"] = target.put(init), to_host(init)
        try:  # the host takes every init; a strategy may refuse an output dtype everywhere
            want = dispatch.fold(plan, host_vals, strategy, **host_kw)
        except bitfold.FoldError:
            want, declared = None, False
        try:
            got = dispatch.fold(plan, placed, strategy, **options, **kw)
        except bitfold.FoldError as e:
            if declared:
                problems.append(f"{what}: refused, but declared taken: {type(e).__name__}: {e}")
            continue
        except Exception as e:  # a crash is a finding too
            problems.append(f"{what}: raised {type(e).__name__}: {e}")
            continue
        if not declared or want is None:
            problems.append(f"{what}: taken, but refused by the host or the backend's InitRule")
            continue
        if dtype_name(got) != dtype_name(want) or tuple(got.shape) != tuple(want.shape):
            problems.append(f"{what}: {dtype_name(got)} {tuple(got.shape)}, want "
                            f"{dtype_name(want)} {tuple(want.shape)}")  # fmt: skip
            continue
        if strategy == "atomic":
            continue  # the order atomics finish in decides its bits
        if not np.array_equal(_bits(got), _bits(want)):
            problems.append(f"{what}: differs from the host bit for bit" + _first(got, want))
        if strategy == "exact":
            oracle = _oracle(p, out_name(p))
            if not np.array_equal(_bits(got), _bits(oracle)):
                problems.append(f"{what}: differs from the oracle" + _first(got, oracle))
        else:
            ref = _ordered_reference(p, out_name(p))
            if ref is not None and not np.array_equal(_bits(got), _bits(ref)):
                problems.append(f"{what}: differs from the documented order" + _first(got, ref))
    if p.accumulate:
        problems += _accumulator(name, p, plan, vals)
    return problems


def _first(got: Any, want: Any) -> str:
    """Where two results first differ, for a message."""
    g, w = _bits(got).reshape(-1), _bits(want).reshape(-1)
    if g.shape != w.shape:
        return f" (shapes {g.shape} and {w.shape})"
    bad = np.flatnonzero(g != w)
    return f" ({bad.size} elements, first at flat {bad[0]}: {g[bad[0]]:#x}, want {w[bad[0]]:#x})"


def _accumulator(name: str, p: Problem, plan: bitfold.Fold, vals: Any) -> list[str]:
    """Adds in pieces, a merge, rounding (to ``p.out`` too), and states moved between the host
    and the backend: every way, the oracle's bits."""
    target, backend = TARGETS[name], get_backend(name)
    options = target.options()
    trailing = tuple(p.values.shape[1:])
    out = out_name(p)
    oracle = _bits(_oracle(p, out))
    cut = len(p.index) * 2 // 5
    head, tail = target.put(vals[:cut]), target.put(vals[cut:])
    what = f"{name} accumulator {p.name}"
    problems: list[str] = []

    def new() -> bitfold.ExactAccumulator:
        return plan.accumulator(p.dtype, trailing=trailing, **options)

    def check(label: str, result: Any) -> None:
        if not np.array_equal(_bits(result), oracle):
            problems.append(f"{what}: {label} differs from the oracle" + _first(result, oracle))

    try:
        acc = new().add(head, start=0).add(tail, start=cut)
        if acc.backend != name:
            problems.append(f"{what}: the state is kept by the {acc.backend} backend")
        check("added in two pieces", acc.result(p.out))
        a, b = new().add(head, start=0), new().add(tail, start=cut)
        check("two merged", a.merge(b).result(p.out))
        check("its state moved to the host", bitfold.ExactAccumulator.from_state(
            plan, a.state, p.dtype).result(p.out))  # fmt: skip
        host_tail = plan.accumulator(p.dtype, trailing=trailing).add(vals[cut:], start=cut)
        c = new().add(head, start=0).merge(host_tail)
        check("a host state merged in", c.result(p.out))
        if c.backend != name:
            problems.append(f"{what}: a host state merged in moved the state to {c.backend}")
        host_all = plan.accumulator(p.dtype, trailing=trailing).add(vals)
        moved = from_numpy(np.array(host_all.state), like=head)  # the host state, copied there
        rounded = backend.round_state(moved, limb_format_for(p.dtype), out)
        check("a host state rounded by the backend", rounded)
        for narrow in ("float16", "bfloat16") if p.out is None else ():  # rounded once to these
            want = _bits(_oracle(p, narrow))
            if not np.array_equal(_bits(acc.result(narrow)), want):
                problems.append(f"{what}: result({narrow!r}) differs from the oracle")
    except Exception as e:  # a crash is a finding too
        problems.append(f"{what}: raised {type(e).__name__}: {e}")
    return problems


def compare(name: str) -> list[str]:
    """The disagreements of backend ``name`` over the whole table (empty when all agree)."""
    if name not in TARGETS:
        return [f"backend {name!r} is registered but tests/backend_compare.py cannot place "
                "values on it: add a Target to TARGETS"]  # fmt: skip
    problems: list[str] = []
    for p in table(TARGETS[name].scale):
        if skip_reason(name, p) is None:
            problems += run_problem(name, p)
    return problems


__all__ = [
    "ENVIRONMENT",
    "TARGETS",
    "Problem",
    "Target",
    "compare",
    "out_name",
    "problem_names",
    "run_problem",
    "skip_reason",
    "table",
]


if __name__ == "__main__":
    if sys.argv[1] == "cuda" and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        from quicker_simulator import quicker_simulator

        quicker_simulator()  # one Python thread per element otherwise
    print(json.dumps(compare(sys.argv[1])))
