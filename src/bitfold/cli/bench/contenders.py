"""The contenders: every way to fold values into K buckets that bitfold's tools compare.

The one list of baselines: ``bitfold bench`` runs all of them, ``bitfold
probe`` takes its own from :data:`CONTENDERS` (``scripts/gpu_check.py`` times its own).
Each contender is a :class:`Contender` whose ``make(inputs)`` converts the
inputs to its own library and device (not timed) and returns a
:class:`Runner`: ``build()`` builds whatever depends on the index only (a
plan, a sorted order; timed as *setup*), ``call()`` folds the values once
and returns the K sums after the device has finished (timed); ``fold()`` is
the same fold without the wait, for timers that wait on their own (CUDA
events, graph capture).

Peers accumulate in the value dtype, as they do natively (``np.bincount`` in
float64); bitfold returns float32 sums for float16 and bfloat16 values.
Frameworks are imported only when a contender that needs them runs.

Each contender says which folds it serves (:attr:`Contender.kinds`: scalars,
rows of shape (N, D); :attr:`Contender.dtypes`; ``devices``); on any other
case it is recorded as skipped with the reason (:meth:`Contender.unavailable`).
bfloat16 values reach bitfold and PyTorch as torch bfloat16 tensors and JAX as
``jnp.bfloat16``; NumPy has no bfloat16, so the NumPy peers skip them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import FoldError
from ..torch_env import deterministic_algorithms

#: The value dtypes a contender may serve; bfloat16 values are held in a float32 host array.
DTYPES = ("float16", "bfloat16", "float32", "float64")
NUMPY_DTYPES = ("float16", "float32", "float64")


class OutOfMemory(MemoryError):
    """A contender would need more memory (``needed`` bytes) than the benchmark allows."""

    def __init__(self, message: str, needed: int | None = None) -> None:
        super().__init__(message)
        self.needed = needed


@dataclass
class Inputs:
    """One case's index (int64) and values on the host, and conversions shared by contenders.

    ``values`` has shape (N,) (scalars) or (N, D) (rows). ``dtype`` is the
    case's value dtype; it differs from ``values.dtype`` only for bfloat16,
    whose values are held as float32 (every one a bfloat16 number).
    """

    idx: np.ndarray
    values: np.ndarray
    k: int
    device: str = "cpu"
    memory_limit: int = 1 << 32
    dtype: str = ""
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.dtype:
            self.dtype = np.dtype(self.values.dtype).name

    @classmethod
    def from_spec(
        cls, spec: dict[str, Any], device: str = "cpu", memory_limit: int = 1 << 32
    ) -> Inputs:
        """The inputs of a case spec (:func:`bitfold.cli.bench.cases.make_inputs`)."""
        from .cases import make_inputs

        idx, values = make_inputs(spec)
        return cls(idx, values, int(spec["k"]), device, memory_limit, str(spec["dtype"]))

    @property
    def n(self) -> int:
        return int(self.idx.size)

    @property
    def kind(self) -> str:
        """``"rows"`` for values of shape (N, D), else ``"scalar"``."""
        return "rows" if self.values.ndim == 2 else "scalar"

    @property
    def trailing(self) -> tuple[int, ...]:
        """``(D,)`` for rows, ``()`` for scalars: the shape of one bucket's sum."""
        return tuple(int(x) for x in self.values.shape[1:])

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def torch(self) -> tuple[Any, Any]:
        """``(index int64, values)`` as torch tensors on the benchmark's device."""
        import torch

        def convert() -> tuple[Any, Any]:
            i, v = torch.from_numpy(self.idx), torch.from_numpy(self.values)
            if self.dtype == "bfloat16":
                v = v.to(torch.bfloat16)  # exact: every value is a bfloat16 number
            if self.device != "cpu":
                i, v = i.to(self.device), v.to(self.device)
            return i, v

        return self.cached("torch", convert)


@dataclass
class Runner:
    """``build()`` once (index-only work), then ``call()`` per fold (waits for the device).

    ``fold`` starts one fold and returns its output, which on a GPU may still
    be computing; ``call`` waits for it. ``build`` is None for contenders that
    keep nothing between calls.
    """

    fold: Callable[[], Any]
    build: Callable[[], None] | None = None
    #: Facts about this run recorded in the contender's row (bitfold: the exact route taken).
    info: dict[str, Any] = field(default_factory=dict)

    def setup(self) -> None:
        """Run ``build`` if there is one."""
        if self.build is not None:
            self.build()

    def call(self) -> Any:
        """One fold, returned once the device has finished it."""
        out = self.fold()
        wait(out)
        return out


@dataclass(frozen=True)
class Contender:
    """A named fold implementation and what it promises about the bits of its result."""

    name: str
    library: str  # the import it needs ("bitfold" needs nothing extra)
    devices: tuple[str, ...]
    guarantee: str  # "exact", "fixed order", "deterministic mode" or "none"
    description: str
    make: Callable[[Inputs], Runner]
    cuda_library: str | None = None  # what it imports on cuda, when not ``library``
    label: str = ""  # the short name reports print (``bitfold probe``); the name when empty
    kinds: tuple[str, ...] = ("scalar",)  # the folds it serves: "scalar" (N,), "rows" (N, D)
    dtypes: tuple[str, ...] = NUMPY_DTYPES  # the value dtypes it serves
    #: (kind or dtype, why it is not served), for the reports' skip reasons.
    not_served: tuple[tuple[str, str], ...] = ()

    @property
    def title(self) -> str:
        """:attr:`label`, or the name when there is none."""
        return self.label or self.name

    def unavailable(
        self, device: str, kind: str = "scalar", dtype: str | None = None
    ) -> str | None:
        """Why this contender cannot fold ``kind`` (scalars, rows) of ``dtype`` values on
        ``device`` here, or None when it can."""
        if device not in self.devices and not (device != "cpu" and "*" in self.devices):
            places = [d if d != "*" else "any torch device" for d in self.devices]
            return f"runs on {' or '.join(places)} only, not on {device}"
        notes = dict(self.not_served)
        if kind not in self.kinds:
            why = f" ({notes[kind]})" if kind in notes else ""
            served = " and ".join({"scalar": "scalars", "rows": "rows"}[k] for k in self.kinds)
            return f"folds {served} only, not {'rows' if kind == 'rows' else 'scalars'}{why}"
        if dtype is not None and dtype not in self.dtypes:
            why = f" ({notes[dtype]})" if dtype in notes else ""
            return f"takes {', '.join(self.dtypes)} values, not {dtype}{why}"
        lib = (self.cuda_library or self.library) if device != "cpu" else self.library
        if lib != "bitfold" and importlib.util.find_spec(lib) is None:
            return f"{lib} is not installed" + (f" (needed on {device})" if device != "cpu" else "")
        return None


# -- bitfold ---------------------------------------------------------------------------------
def _bitfold_values(inp: Inputs) -> Any:
    """What a user would pass: torch tensors off the CPU and for bfloat16, else the NumPy
    array."""
    return inp.torch()[1] if inp.device != "cpu" or inp.dtype == "bfloat16" else inp.values


def exact_route(plan: Any, values: Any) -> str | None:
    """The host route ``plan(values)`` takes for an exact fold, from ``plan.route`` (None off
    the host: the GPU's path needs the device's limits, read by the fold itself)."""
    if getattr(getattr(values, "device", None), "type", "cpu") != "cpu":
        return None
    return plan.route(values).route


def _bitfold(strategy: str) -> Callable[[Inputs], Runner]:
    def make(inp: Inputs) -> Runner:
        from ...plan import Fold

        values = _bitfold_values(inp)
        state: dict[str, Any] = {}
        runner = Runner(lambda: state["plan"](values, strategy))

        def build() -> None:
            state["plan"] = Fold(inp.idx, inp.k)
            if strategy == "exact":
                runner.info["route"] = exact_route(state["plan"], values)

        runner.build = build
        return runner

    return make


def _bitfold_new_plan(inp: Inputs) -> Runner:
    """The one-shot fold, the plan built inside every call: ``bitfold.segment_sum(values, idx,
    K)``, the public entry point for it (ids that change each step: a one-shot fold)."""
    from ...functions import segment_sum

    values = _bitfold_values(inp)
    return Runner(lambda: segment_sum(values, inp.idx, inp.k))


# -- the original script's padded layout -----------------------------------------------------------
class PaddedScatter:
    """The hashed layer experiment's ``FixedScatter``, rewritten: a fixed order, no races.

    Built once: a stable sort of the index and a ``K x (largest bucket)``
    buffer. Each call assigns every value to its own slot (bucket row, rank
    within the bucket) and sums the rows with the array library's reduction.
    The buffer grows with the largest bucket, so skewed maps explode; a
    buffer above ``limit`` bytes raises :class:`OutOfMemory` instead.
    """

    def __init__(self, idx: np.ndarray, k: int, dtype: Any, limit: int, xp: Any = np) -> None:
        counts = np.bincount(idx, minlength=k)
        self.k, self.width = k, int(counts.max()) if idx.size else 0
        need = k * self.width * np.dtype(dtype).itemsize
        if need > limit:
            raise OutOfMemory(
                f"the padded buffer K x largest bucket = {k:,} x {self.width:,} "
                f"{np.dtype(dtype).name} needs {need / 2**30:.1f} GiB, over the "
                f"benchmark's memory limit of {limit / 2**30:.1f} GiB",
                needed=need,
            )
        order = np.argsort(idx, kind="stable")
        first = np.cumsum(counts) - counts
        rank = np.arange(idx.size) - np.repeat(first, counts)
        self.order = xp.asarray(order)
        self.slot = xp.asarray(idx[order] * self.width + rank)
        self.buf = xp.zeros(k * self.width, dtype)

    def __call__(self, g: Any) -> Any:
        self.buf[:] = 0
        self.buf[self.slot] = g[self.order]
        return self.buf.reshape(self.k, self.width).sum(1)


def _padded(inp: Inputs) -> Runner:
    if inp.device == "cuda":
        import cupy as xp
    else:
        xp = np
    values = (
        inp.cached("cupy-values", lambda: xp.asarray(inp.values)) if xp is not np else (inp.values)
    )
    state: dict[str, Any] = {}

    def build() -> None:
        state["fs"] = PaddedScatter(inp.idx, inp.k, inp.values.dtype, inp.memory_limit, xp)

    return Runner(lambda: state["fs"](values), build)


# -- numpy -----------------------------------------------------------------------------------
def _add_at(inp: Inputs) -> Runner:
    shape = (inp.k, *inp.trailing)

    def call() -> np.ndarray:
        out = np.zeros(shape, inp.values.dtype)
        np.add.at(out, inp.idx, inp.values)
        return out

    return Runner(call)


def _groupies(inp: Inputs) -> Runner:
    """numpy-groupies' Numba ``aggregate(idx, values, func="sum", size=K)``; axis 0 for rows."""
    from numpy_groupies.aggregate_numba import aggregate

    axis = {"axis": 0} if inp.kind == "rows" else {}
    return Runner(lambda: aggregate(inp.idx, inp.values, func="sum", size=inp.k, **axis))


def _bincount(inp: Inputs) -> Runner:
    return Runner(lambda: np.bincount(inp.idx, weights=inp.values, minlength=inp.k))


# -- torch -----------------------------------------------------------------------------------
def _torch(op: str, deterministic: bool) -> Callable[[Inputs], Runner]:
    def make(inp: Inputs) -> Runner:
        import torch

        idx, values = inp.torch()
        shape = (inp.k, *inp.trailing)
        zeros = lambda: torch.zeros(shape, dtype=values.dtype, device=values.device)  # noqa: E731
        if op == "index_add":
            fold = lambda: zeros().index_add_(0, idx, values)  # noqa: E731
        elif op == "scatter_add" and inp.kind == "rows":  # what graph libraries do: expand
            fold = lambda: zeros().scatter_add_(0, idx[:, None].expand_as(values), values)  # noqa: E731
        elif op == "scatter_add":
            fold = lambda: zeros().scatter_add_(0, idx, values)  # noqa: E731
        elif op == "embedding":  # forward and backward: the weight gradient of emb(idx)
            emb = torch.nn.Embedding(*shape, dtype=values.dtype, device=values.device)

            def fold() -> Any:
                return torch.autograd.grad(emb(idx), emb.weight, values)[0]

        else:  # the autograd gradient of v[idx]; the forward gather is the input, not timed
            v = torch.zeros(inp.k, dtype=values.dtype, device=values.device, requires_grad=True)
            with deterministic_algorithms(torch, deterministic):
                w = v[idx]

            def fold() -> Any:
                return torch.autograd.grad(w, v, values, retain_graph=True)[0]

        if torch.are_deterministic_algorithms_enabled() == deterministic:
            return Runner(fold)  # already in that mode (every block restores it): no switching

        def call() -> Any:
            with deterministic_algorithms(torch, deterministic):
                return fold()

        return Runner(call)

    return make


def _segment_csr(inp: Inputs) -> Runner:
    import torch
    from torch_scatter import segment_csr

    idx, values = inp.torch()
    state: dict[str, Any] = {}

    def build() -> None:
        state["order"] = torch.argsort(idx, stable=True)
        indptr = torch.zeros(inp.k + 1, dtype=torch.int64, device=idx.device)
        torch.cumsum(torch.bincount(idx, minlength=inp.k), 0, out=indptr[1:])
        state["indptr"] = indptr

    return Runner(lambda: segment_csr(values[state["order"]], state["indptr"], reduce="sum"), build)


# -- jax -------------------------------------------------------------------------------------
def _jax_segment_sum(inp: Inputs) -> Runner:
    # XLA would otherwise take 75% of the GPU's memory from the other contenders
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    if inp.values.dtype == np.float64:
        jax.config.update("jax_enable_x64", True)
    dev = jax.devices("gpu" if inp.device == "cuda" else "cpu")[0]
    host = inp.values.astype(jax.numpy.bfloat16) if inp.dtype == "bfloat16" else inp.values
    data = jax.device_put(host, dev)  # rows: segment_sum keeps the trailing dimension
    seg = jax.device_put(inp.idx.astype(np.int32), dev)
    fold = jax.jit(lambda d, s: jax.ops.segment_sum(d, s, num_segments=inp.k))
    return Runner(lambda: fold(data, seg))


# -- cupy ------------------------------------------------------------------------------------
def _cupy_scatter_add(inp: Inputs) -> Runner:
    import cupy
    import cupyx

    idx = inp.cached("cupy-idx", lambda: cupy.asarray(inp.idx))
    values = inp.cached("cupy-values", lambda: cupy.asarray(inp.values))

    def fold() -> Any:
        out = cupy.zeros(inp.k, values.dtype)
        cupyx.scatter_add(out, idx, values)
        return out

    return Runner(fold)


def wait(out: Any) -> None:
    """Wait until ``out`` is computed (GPU work and JAX dispatch are asynchronous)."""
    mod = type(out).__module__.split(".", 1)[0]
    if mod == "torch":
        if out.device.type != "cpu":  # torch.cuda, torch.xpu, torch.mps, ...
            getattr(sys.modules["torch"], out.device.type).synchronize()
    elif mod == "cupy":
        sys.modules["cupy"].cuda.Device().synchronize()
    elif callable(getattr(out, "block_until_ready", None)):  # jax
        out.block_until_ready()


_BOTH = ("cpu", "cuda")
#: the CPU and every device torch tensors live on (bitfold's folds and torch's own)
_TORCH = ("cpu", "cuda", "*")
_DET = "deterministic mode"
_ALL = ("scalar", "rows")
_NO_BF16 = ("bfloat16", "NumPy has no bfloat16")
_ROWS_PEER = ("rows", "the bench times it on scalars; torch-embedding is the peer for rows")


def _deterministic(op: str, **fields: Any) -> Contender:
    """torch's in-place ``<op>_`` under use_deterministic_algorithms(True): ``torch-<op>-det``,
    the underscores of ``op`` written as hyphens (``index_add``: ``torch-index-add-det``)."""
    name = op.replace("_", "-")
    return Contender(f"torch-{name}-det", "torch", _TORCH, _DET,
                     f"{op}_ under use_deterministic_algorithms(True)", _torch(op, True),
                     label=f"torch {op}_ deterministic", **fields)  # fmt: skip


CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in [
        Contender("bitfold-exact", "bitfold", _TORCH, "exact",
                  "bitfold.Fold(idx, K)(values, 'exact')", _bitfold("exact"),
                  cuda_library="torch", label="bitfold exact", kinds=_ALL, dtypes=DTYPES),
        Contender("bitfold-exact-new-plan", "bitfold", _TORCH, "exact",
                  "bitfold.segment_sum(values, idx, K): the plan built in every call",
                  _bitfold_new_plan,
                  cuda_library="torch", label="bitfold exact, plan in the call", kinds=_ALL,
                  dtypes=DTYPES),
        Contender("bitfold-ordered", "bitfold", _TORCH, "fixed order",
                  "bitfold.Fold(idx, K)(values, 'ordered')", _bitfold("ordered"),
                  cuda_library="torch", label="bitfold ordered", kinds=_ALL, dtypes=DTYPES),
        Contender("bitfold-atomic", "bitfold", _TORCH, "none",
                  "bitfold.Fold(idx, K)(values, 'atomic')", _bitfold("atomic"),
                  cuda_library="torch", label="bitfold atomic", kinds=_ALL, dtypes=DTYPES),
        Contender("fixed-scatter", "numpy", _BOTH, "fixed order",
                  "the original script's FixedScatter: K x largest-bucket padded buffer", _padded,
                  cuda_library="cupy", label="seed FixedScatter",
                  not_served=(("rows", "the padded layout is for scalars"), _NO_BF16)),
        Contender("numpy-add-at", "numpy", ("cpu",), "none",
                  "np.add.at(zeros((K,) + trailing), idx, values)", _add_at, label="np.add.at",
                  kinds=_ALL, not_served=(_NO_BF16,)),
        Contender("numpy-bincount", "numpy", ("cpu",), "none",
                  "np.bincount(idx, weights=values) (float64 sums)", _bincount,
                  label="np.bincount",
                  not_served=(("rows", "np.bincount takes 1-d weights"), _NO_BF16)),
        Contender("numpy-groupies", "numpy_groupies", ("cpu",), "none",
                  "numpy_groupies.aggregate_numba.aggregate(idx, values, func='sum', size=K) "
                  "(axis=0 for rows)", _groupies, label="numpy-groupies numba",
                  kinds=_ALL, not_served=(_NO_BF16,)),
        Contender("torch-index-add", "torch", _TORCH, "none",
                  "zeros((K,) + trailing).index_add_(0, idx, values)",
                  _torch("index_add", False), label="torch index_add_", kinds=_ALL,
                  dtypes=DTYPES),
        _deterministic("index_add", kinds=_ALL, dtypes=DTYPES),
        Contender("torch-scatter-add", "torch", _TORCH, "none",
                  "zeros((K,) + trailing).scatter_add_(0, idx (expanded along D for rows), "
                  "values)", _torch("scatter_add", False), label="torch scatter_add_",
                  kinds=_ALL, dtypes=DTYPES),
        _deterministic("scatter_add", kinds=_ALL, dtypes=DTYPES),
        Contender("torch-embedding", "torch", _TORCH, "none",
                  "nn.Embedding(K, D): forward emb(idx) and backward of an (N, D) output "
                  "gradient to the weight gradient", _torch("embedding", False),
                  label="torch nn.Embedding fwd+bwd", kinds=("rows",), dtypes=DTYPES,
                  not_served=(("scalar", "an embedding looks up rows"),)),
        Contender("torch-autograd", "torch", _TORCH, "none",
                  "autograd gradient of v[idx] (index_put_ accumulate)",
                  _torch("autograd", False), label="torch autograd v[idx]", dtypes=DTYPES,
                  not_served=(_ROWS_PEER,)),
        Contender("torch-autograd-det", "torch", _TORCH, _DET,
                  "autograd gradient of v[idx] under use_deterministic_algorithms(True)",
                  _torch("autograd", True), label="torch autograd v[idx] deterministic",
                  dtypes=DTYPES, not_served=(_ROWS_PEER,)),
        Contender("torch-scatter-segment-csr", "torch_scatter", _BOTH, "fixed order",
                  "torch_scatter.segment_csr(values[order], indptr)", _segment_csr,
                  label="torch_scatter segment_csr", kinds=_ALL, dtypes=DTYPES),
        Contender("jax-segment-sum", "jax", _BOTH, "none",
                  "jax.jit(jax.ops.segment_sum)(values, idx, K) (trailing dimensions kept)",
                  _jax_segment_sum, label="jax segment_sum", kinds=_ALL, dtypes=DTYPES),
        Contender("cupy-scatter-add", "cupy", ("cuda",), "none",
                  "cupyx.scatter_add(zeros(K), idx, values)", _cupy_scatter_add,
                  label="cupyx.scatter_add", not_served=(("bfloat16", "CuPy has no bfloat16"),)),
    ]
}  # fmt: skip

#: Contender groups accepted by ``--contenders`` besides single names.
GROUPS: dict[str, tuple[str, ...]] = {
    "all": tuple(CONTENDERS),
    "bitfold": tuple(n for n in CONTENDERS if n.startswith("bitfold-")),
    "numpy": ("numpy-add-at", "numpy-bincount", "fixed-scatter"),
    "torch": tuple(n for n in CONTENDERS if n.startswith("torch-")),
}

#: The atomic baseline of each device; ratios are taken against it and it always runs
#: (``*``: any other device torch tensors live on).
BASELINES = {"cpu": "numpy-add-at", "cuda": "cupy-scatter-add", "*": "torch-scatter-add"}


def baseline_for(device: str) -> str:
    """The atomic scatter every other contender is compared with on ``device``."""
    if device == "cuda" and importlib.util.find_spec("cupy") is None:
        return "torch-scatter-add"
    return BASELINES.get(device, BASELINES["*"])


def resolve(names: list[str], device: str) -> list[str]:
    """Expand group names, refuse unknown ones, add the device's baseline; keep the order."""
    chosen: list[str] = []
    for name in names:
        if name in GROUPS:
            chosen.extend(GROUPS[name])
        elif name in CONTENDERS:
            chosen.append(name)
        else:
            raise FoldError(
                f"unknown contender {name!r}; choose from: {', '.join(CONTENDERS)} "
                f"(or a group: {', '.join(GROUPS)})"
            )
    base = baseline_for(device)
    out = [base] + [n for n in dict.fromkeys(chosen) if n != base]
    return out
