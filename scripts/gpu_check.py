"""GPU benchmark of ``make gpu-check``: bitfold's exact folds on the GPU, judged against the goals.

The exact folds it measures, on torch CUDA tensors (float32 values, standard normal):

* the Triton path, ``plan(values, backend="triton")`` with the plan built once;
* the numba-cuda kernels, ``plan(values, backend="cuda")``, plan built once;
* the one-shot exact fold, ``bitfold.segment_sum(values, index, K, backend="triton")``: the
  plan built in the call from a CUDA index tensor that is a new tensor (new memory) every call,
  plan and fold timed together;
* the ``ordered`` strategy on the Triton path, three folds whose bits must agree (it adds a
  bucket's values one after another: where a bucket holds more than 2^18 values, at K = 1,
  on the first 2^18 values);

and the baselines: torch's atomic ``torch.zeros(...).index_add_`` (the goals' yardstick), the
same under ``torch.use_deterministic_algorithms(True)``, ``cupyx.scatter_add`` and XLA's
``jax.ops.segment_sum`` under ``jax.jit``. Each exact result is checked bit for bit against
the CPU's exact fold. Configurations:

* ``seed``: N = 768 x 4096 = 3,145,728 values, K = 433, uniform index (the seed's defaults);
* ``K=1e6``: the seed's N into K = 10^6 buckets, uniform;
* ``rows-uniform`` / ``rows-zipf``: (N, D, K) = (262,144, 64, 50,000), index uniform / Zipf(1.3);
* ``K=1``: N = 10^8 values into one bucket.

Three times per call, in microseconds:

* ``us`` (wall): the device synchronised, then ``reps`` back-to-back calls (reps sized to
  about ``--seconds`` a trial), synchronised again; the fastest of 3 trials, divided by reps;
* ``host_us`` (host): the time until the call returns, without synchronising: after a
  synchronisation, ``host_calls`` (at most 20, few enough that the launch queue never fills
  and blocks the host) back-to-back calls timed on the host clock up to the last one's
  return, divided by their number; the median of 5 trials. It is the host's share of a
  call: a fold whose ``host_us`` is close to ``us`` is host-bound;
* ``device_us`` (device; exact folds and the atomic ``index_add_``): the ``torch.profiler``'s
  device time of up to 10 back-to-back calls, summed over every device event (kernels,
  memory copies and sets: the profiler's "Self CUDA time total") and divided by the calls:
  the time the GPU is busy for one call, whatever launched the kernels (Triton, numba, ATen).

Order: the goals' figures first (per configuration the bits, the Triton path, the one-shot
fold, ``index_add_`` and the numba kernels; then the compiled GCN training step,
``bitfold.torch.compile`` against ``torch.compile``, in the default mode and in
``mode="reduce-overhead"``), then the other baselines (``cupyx.scatter_add``, deterministic
``index_add_``, ``jax.ops.segment_sum``), CUDA-graph capture of a fold (torch and CuPy
results), and last the diagnostics (the numba kernels' other exact paths, ``torch.profiler``
tables of one exact fold, the portable backend on torch, eager and compiled, and under JAX's
``jit``, with a plan and without). Each step
runs only while the time budget (``--budget``) leaves it room.

Every step is recorded in ``steps`` as ``ok``, ``failed`` (with the error) or ``skipped``
(with the reason: a library or the triton backend missing, the time budget spent); the JSON
is written in a ``finally``, whatever fails, also when the process is stopped with SIGTERM
(``timeout``). ``assessment`` judges the goals against torch's atomic ``index_add_`` of the
same run (see :data:`GOALS`), and whether the Triton path is at least as fast as the numba
kernels at every configuration (the condition to retire them).

``--smoke`` runs the same code on tiny sizes without a GPU: the numba kernels on numba device
arrays under ``NUMBA_ENABLE_CUDASIM=1``, and, when the triton backend is registered, the
Triton path on torch CPU tensors under ``TRITON_INTERPRET=1`` (timed at the seed
configuration only); its times mean nothing and the timing goals are not judged. Exit status:
0 when every bit check that ran passed and at least one numba-kernel or Triton check ran, 1
otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave memory to torch and CuPy

#: The goals ``assessment`` judges, against torch's atomic ``index_add_`` of the same run.
GOALS = {
    "G1": "exact fold (Triton, plan built once), wall time: at most 1.0x index_add_ at every "
          "configuration, 0.1x at the seed, 0.01x at K=1",
    "G2": "host time of an eager exact fold (Triton, plan built once): at most 25 us",
    "G3": "one-shot exact fold (plan built in the call from a new CUDA index): at most 2.0x "
          "index_add_",
    "G4": "exact compiled GCN training step: at most 1.2x torch.compile's, in the default "
          "mode and in mode='reduce-overhead'",
    "G5": "every exact result the CPU's bits; ordered folds the same bits run to run; the "
          "exact compiled step's gradients the same bits for two edge orders",
}  # fmt: skip
G1_LIMITS = {"seed": 0.1, "K=1": 0.01}  # every other configuration: 1.0
HOST_US_GOAL = 25.0
ONE_SHOT_LIMIT = 2.0
COMPILED_LIMIT = 1.2
MODES = ("default", "reduce-overhead")
HOST_CALLS = 20  # back-to-back calls a host-time trial: well under the launch queue's depth
ONE_SHOT_POOL_BYTES = 3 * 2**30  # the new index tensors a one-shot trial holds at once
#: The ordered fold adds a bucket's values one after another in one lane: its run-to-run check
#: folds the first this many values where a bucket holds more (K=1: 10^8 dependent additions).
ORDERED_MAX_RUN = 2**18

TRITON = "bitfold_exact[triton,torch]"
ONE_SHOT = "bitfold_exact_one_shot[triton,torch]"
NUMBA_TORCH = "bitfold_exact[numba-kernels,torch]"
INDEX_ADD = "torch_index_add"


class Skip(Exception):
    """A step that cannot run here (a library missing, the budget spent): recorded, not failed."""


@dataclass(frozen=True)
class Config:
    name: str
    N: int
    K: int
    D: int  # 1: scalar fold
    mapping: str  # "uniform", "zipf" or "one"


FULL = [
    Config("seed", 768 * 4096, 433, 1, "uniform"),
    Config("K=1e6", 768 * 4096, 10**6, 1, "uniform"),
    Config("rows-uniform", 262_144, 50_000, 64, "uniform"),
    Config("rows-zipf", 262_144, 50_000, 64, "zipf"),
    Config("K=1", 10**8, 1, 1, "one"),
]
SMOKE = [
    Config("seed", 2048, 433, 1, "uniform"),
    Config("K=1e6", 512, 5000, 1, "uniform"),
    Config("rows-uniform", 256, 50, 4, "uniform"),
    Config("rows-zipf", 256, 50, 4, "zipf"),
    Config("K=1", 4096, 1, 1, "one"),
]


@dataclass
class Case:
    """One configuration's inputs, kept from the goals' pass to the later ones."""

    cfg: Config
    out: dict[str, Any]  # the report's entry
    idx: np.ndarray
    g: np.ndarray
    plan: Any
    want: np.ndarray | None = None
    torch_in: tuple[Any, Any] | None = None  # (index, values) as torch tensors on the device
    numba_in: Any = None  # the values the numba kernels fold (torch CUDA or numba arrays)

    @property
    def times(self) -> dict[str, Any]:
        return self.out["timings"]

    @property
    def bits(self) -> dict[str, Any]:
        return self.out["bits"]


class Check:
    """The report, the time budget and the libraries found; ``step`` runs and records one step."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + args.budget
        self.report: dict[str, Any] = {
            "smoke": args.smoke, "budget_s": args.budget, "goals": GOALS, "steps": {},
            "configs": {}, "compiled_step": {m: {"status": "not run"} for m in MODES},
            "graph_capture": {},
        }  # fmt: skip
        self.libs: dict[str, Any] = {}

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def step(self, name: str, fn: Callable[[], Any], need_s: float = 1.0) -> Any:
        entry: dict[str, Any] = {}
        self.report["steps"][name] = entry
        if self.left() < need_s:
            entry.update(status="skipped", reason=f"time budget spent ({self.args.budget} s)")
            return None
        t0 = time.perf_counter()
        try:
            value = fn()
            entry["status"] = "ok"
            return value
        except Skip as why:
            entry.update(status="skipped", reason=str(why))
        except Exception as err:  # every step is optional; record why it failed
            entry.update(status="failed", error=f"{type(err).__name__}: {err}",
                         trace=traceback.format_exc()[-3000:])  # fmt: skip
        finally:
            entry["seconds"] = round(time.perf_counter() - t0, 3)
            print(f"  {name}: {entry['status']} in {entry['seconds']:.1f} s", file=sys.stderr,
                  flush=True)  # fmt: skip
        return None

    # -- where the torch tensors live ----------------------------------------------------------
    def torch(self) -> Any:
        """torch with CUDA, or (``--smoke``) CPU torch for the Triton interpreter; else Skip."""
        torch = self.libs.get("torch") or self.libs.get("torch_cpu")
        if torch is None:
            raise Skip("torch with CUDA is not available")
        return torch

    def device(self) -> str:
        return "cuda" if "torch" in self.libs else "cpu"

    def sync(self) -> None:
        if "torch" in self.libs:
            self.libs["torch"].cuda.synchronize()

    def triton(self) -> Any:
        """torch, when the Triton path can run here; else Skip with the reason."""
        why = self.libs.get("triton_missing")
        if why:
            raise Skip(why)
        return self.torch()


# -- libraries ------------------------------------------------------------------------------
def find_libraries(check: Check) -> None:
    """numba-cuda always; the triton backend; torch, CuPy and JAX with a GPU unless ``--smoke``
    (where torch is CPU torch, for the Triton interpreter)."""
    from numba import cuda

    check.libs["cuda"] = cuda
    versions = check.report.setdefault("versions", {})

    def torch() -> str:
        try:
            import torch
        except ImportError as err:
            raise Skip(f"torch does not import: {err}") from err
        if check.args.smoke:
            check.libs["torch_cpu"] = torch
            return f"{torch.__version__} (CPU tensors: the Triton interpreter)"
        if not torch.cuda.is_available():
            raise Skip(f"torch {torch.__version__} sees no CUDA device")
        check.libs["torch"] = torch
        return torch.__version__

    def triton() -> str:
        from bitfold.backends.registry import backend_names

        names = backend_names()
        check.report["backends"] = list(names)
        if "triton" not in names:
            check.libs["triton_missing"] = (
                f"the triton backend is not registered (backends: {', '.join(names)})"
            )
            raise Skip(check.libs["triton_missing"])
        try:
            import triton
        except ImportError as err:
            check.libs["triton_missing"] = f"triton does not import: {err}"
            raise Skip(check.libs["triton_missing"]) from err

        interp = os.environ.get("TRITON_INTERPRET") == "1"
        return f"{triton.__version__}{' (TRITON_INTERPRET=1)' if interp else ''}"

    def cupy() -> str:
        import cupy
        import cupyx  # noqa: F401

        check.libs["cupy"] = cupy
        return cupy.__version__

    def jax() -> str:
        import jax

        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if not gpus:
            raise Skip(f"jax {jax.__version__} sees no GPU: {jax.devices()}")
        check.libs["jax"] = (jax, gpus[0])
        return jax.__version__

    versions["torch"] = check.step("import torch", torch)
    if "torch" not in check.libs and "torch_cpu" not in check.libs:
        check.libs.setdefault("triton_missing", "torch is not available here")
    versions["triton"] = check.step("triton backend", triton)
    if check.args.smoke:
        return
    for name, fn in (("cupy", cupy), ("jax", jax)):
        versions[name] = check.step(f"import {name}", fn)


# -- timing ---------------------------------------------------------------------------------
def timed(
    check: Check,
    fn: Callable[[], Any],
    sync: Callable[[], None],
    *,
    prepare: Callable[[int], None] | None = None,
    max_reps: int = 200,
) -> dict[str, Any]:
    """Wall and host microseconds a call (see the module docstring): a warm-up, then 3 wall
    trials, then 5 host trials. ``prepare(n)``, untimed, readies the inputs of the next ``n``
    calls (the one-shot fold's new index tensors).

    A call slower than a second (torch's deterministic ``index_add_`` into one bucket of 10^8
    values took 11.7 s on an H200) is timed once: that call.
    """

    def ready(n: int) -> None:
        if prepare is not None:
            prepare(n)
        sync()

    if prepare is not None:
        prepare(1)
    fn()  # the warm-up (a JAX sync needs a result to wait for: none before it)
    ready(1)
    t = time.perf_counter()
    fn()
    issued_once = time.perf_counter() - t
    sync()
    once = max(time.perf_counter() - t, 1e-6)
    if once > 1.0:
        return {"us": once * 1e6, "us_trials": [once * 1e6], "reps": 1, "note": "one call (slow)",
                "host_us": issued_once * 1e6, "host_calls": 1}  # fmt: skip
    smoke = check.args.smoke
    reps = 1 if smoke else max(1, min(max_reps, int(max(2, check.args.seconds / once))))
    trials = []
    for _ in range(1 if smoke else 3):
        ready(reps)
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        trials.append((time.perf_counter() - t) * 1e6 / reps)
    calls, host = min(reps, HOST_CALLS), []
    for _ in range(1 if smoke else 5):
        ready(calls)
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t) * 1e6 / calls)
        sync()
    return {"us": min(trials), "us_trials": trials, "reps": reps,
            "host_us": statistics.median(host), "host_us_trials": host,
            "host_calls": calls}  # fmt: skip


def device_time(
    check: Check, fn: Callable[[], Any], wall_us: float,
    prepare: Callable[[int], None] | None = None, max_calls: int = 10,
) -> dict[str, Any]:  # fmt: skip
    """``device_us``: the profiler's device time of up to 10 back-to-back calls, a call."""
    torch = check.libs.get("torch")
    if torch is None:
        return {"device_us": None, "device_note": "needs torch with a CUDA device"}
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        calls = max(1, min(10, max_calls, int(0.2e6 / max(wall_us, 1.0))))
        if prepare is not None:
            prepare(calls)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        busy = [
            e
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
        ]
        total = sum(e.self_device_time_total for e in busy)
        return {"device_us": total / calls, "device_events_per_call": len(busy) / calls,
                "device_calls": calls}  # fmt: skip
    except Exception as err:  # a measurement beside the wall time: never fail the step for it
        return {"device_us": None, "device_error": f"{type(err).__name__}: {err}"}


def _bits(a: Any) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def _equals(got: Any, want: np.ndarray | None) -> bool:
    from bitfold.arrays import to_numpy

    if want is None:
        raise Skip("no CPU result to compare with")
    return _bits(to_numpy(got)) == _bits(want)


def make_inputs(cfg: Config, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if cfg.mapping == "one":
        idx = np.zeros(cfg.N, np.int64)
    elif cfg.mapping == "zipf":
        idx = np.minimum(rng.zipf(1.3, cfg.N) - 1, cfg.K - 1)
    else:
        idx = rng.integers(0, cfg.K, cfg.N)
    shape = (cfg.N,) if cfg.D == 1 else (cfg.N, cfg.D)
    return idx, rng.standard_normal(shape, dtype=np.float32)


def torch_inputs(check: Check, case: Case) -> tuple[Any, Any]:
    """The case's index and values as torch tensors where the Triton path folds them."""
    if case.torch_in is None:
        torch = check.torch()
        dev = check.device()
        case.torch_in = (torch.from_numpy(case.idx).to(dev), torch.from_numpy(case.g).to(dev))
    return case.torch_in


# -- the goals' figures, one configuration ---------------------------------------------------------
def new_case(check: Check, cfg: Config) -> Case:
    import bitfold

    out: dict[str, Any] = {"N": cfg.N, "K": cfg.K, "D": cfg.D, "index": cfg.mapping,
                           "timings": {}, "bits": {}}  # fmt: skip
    check.report["configs"][cfg.name] = out
    idx, g = make_inputs(cfg, np.random.default_rng(0))
    case = Case(cfg, out, idx, g, bitfold.Fold(idx, cfg.K))
    case.want = check.step(f"{cfg.name}: CPU exact", lambda: case.plan(g), need_s=5)
    return case


def goal_figures(check: Check, case: Case) -> None:
    """The Triton path (bits, ordered bits run to run, times), the one-shot fold, the atomic
    ``index_add_`` and the numba kernels (bits, times) at one configuration."""
    import bitfold
    from bitfold.arrays import to_numpy

    cfg, plan, times, bits = case.cfg, case.plan, case.times, case.bits
    name = cfg.name
    smoke = check.args.smoke
    # the interpreter is slow: on the smoke run the Triton path is timed at the seed only
    timed_here = not smoke or name == "seed"

    def triton_fold() -> Any:
        _, gt = torch_inputs(check, case)
        return plan(gt, backend="triton")

    def triton_bits() -> bool:
        check.triton()
        _, gt = torch_inputs(check, case)
        if not smoke:
            case.out["default_backend_for_torch_cuda"] = plan.route(gt).backend
        return _equals(triton_fold(), case.want)

    bits["triton_equals_cpu"] = check.step(f"{name}: triton bits", triton_bits, need_s=5)

    def ordered() -> bool:
        check.triton()
        ordered_plan, g, gt = plan, case.g, torch_inputs(check, case)[1]
        n = ORDERED_MAX_RUN if not smoke else 1024  # the smoke run checks the cut too, at K=1
        if int(plan.counts.max()) > n:  # K=1: 10^8 additions one after another
            ordered_plan, g, gt = bitfold.Fold(case.idx[:n], cfg.K), g[:n], gt[:n]
            case.out["triton_ordered_checked_on"] = f"the first {n:,} values"
        runs = [_bits(to_numpy(ordered_plan(gt, "ordered", backend="triton"))) for _ in range(3)]
        # recorded, not judged: the Triton ordered fold adds in the host's order
        case.out["triton_ordered_equals_cpu_ordered"] = runs[0] == _bits(ordered_plan(g, "ordered"))
        return all(r == runs[0] for r in runs)

    bits["triton_ordered_same_bits_run_to_run"] = check.step(
        f"{name}: triton ordered bits run to run", ordered, need_s=3
    )

    def triton_times() -> dict[str, Any]:
        check.triton()
        if not timed_here:
            raise Skip("smoke: the Triton interpreter is timed at the seed configuration only")
        entry = timed(check, triton_fold, check.sync)
        entry.update(device_time(check, triton_fold, entry["us"]))
        entry["equals_cpu"] = bits["triton_equals_cpu"]
        return entry

    times[TRITON] = check.step(f"{name}: {TRITON}", triton_times, need_s=3)

    def one_shot() -> dict[str, Any]:
        check.triton()
        it0, gt = torch_inputs(check, case)
        pool: list[Any] = []
        used: list[Any] = []

        def prepare(n: int) -> None:
            # n new index tensors, made while the last ones are alive: new memory every call
            new = [it0.clone() for _ in range(n)]
            used.clear()
            pool[:] = new

        def call() -> Any:
            it = pool.pop()
            used.append(it)
            return bitfold.segment_sum(gt, it, cfg.K, backend="triton")

        prepare(1)
        equal = _equals(call(), case.want)
        bits["triton_one_shot_equals_cpu"] = equal
        if not timed_here:
            return {"equals_cpu": equal, "note": "smoke: bits only"}
        most = max(1, ONE_SHOT_POOL_BYTES // max(1, it0.element_size() * it0.numel()))
        entry = timed(check, call, check.sync, prepare=prepare, max_reps=int(most))
        entry.update(device_time(check, call, entry["us"], prepare, int(most)))
        return {**entry, "equals_cpu": equal}

    times[ONE_SHOT] = check.step(f"{name}: {ONE_SHOT}", one_shot, need_s=5)
    bits.setdefault("triton_one_shot_equals_cpu", (times[ONE_SHOT] or {}).get("equals_cpu"))

    times[INDEX_ADD] = check.step(
        f"{name}: index_add_", lambda: torch_index_add(check, case, deterministic=False)
    )
    numba_figures(check, case)


def torch_index_add(check: Check, case: Case, *, deterministic: bool) -> dict[str, Any]:
    """torch's ``zeros + index_add_`` of the case, atomic or under
    ``torch.use_deterministic_algorithms``; the atomic one with its device time too."""
    torch = check.libs.get("torch")
    if torch is None:
        raise Skip("torch with CUDA is not available")
    it, gt = torch_inputs(check, case)
    shape = (case.cfg.K, *gt.shape[1:])
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:

        def call() -> Any:
            return torch.zeros(shape, device="cuda").index_add_(0, it, gt)

        entry = timed(check, call, torch.cuda.synchronize)
        if not deterministic:
            entry.update(device_time(check, call, entry["us"]))
        return entry
    finally:
        torch.use_deterministic_algorithms(before)


def numba_fold(check: Check, case: Case, **kw: Any) -> Any:
    """The numba kernels' exact fold of the case's values (forced: ``backend="cuda"``)."""
    from bitfold import dispatch

    launch = None
    if check.args.smoke:
        from bitfold.kernels import cuda as kernels

        launch = kernels.LaunchShape(32, 2)
    if case.numba_in is None:
        torch = check.libs.get("torch")
        if torch is not None:
            case.numba_in = torch_inputs(check, case)[1]
        else:
            case.numba_in = check.libs["cuda"].to_device(case.g)
    return dispatch.fold(case.plan, case.numba_in, "exact", backend="cuda", launch=launch, **kw)


def numba_key(check: Check, what: str = "bitfold_exact") -> str:
    return f"{what}[numba-kernels,{'torch' if 'torch' in check.libs else 'numba'}]"


def numba_figures(check: Check, case: Case) -> None:
    name = case.cfg.name
    cuda = check.libs["cuda"]
    case.bits["numba_equals_cpu"] = check.step(
        f"{name}: numba bits", lambda: _equals(numba_fold(check, case), case.want), 5
    )

    def numba_times() -> dict[str, Any]:
        def call() -> Any:
            return numba_fold(check, case)

        entry = timed(check, call, cuda.synchronize)
        entry.update(device_time(check, call, entry["us"]))
        return entry

    key = numba_key(check)
    case.times[key] = check.step(f"{name}: {key}", numba_times)


# -- the other baselines ------------------------------------------------------------------------
def baselines(check: Check, case: Case) -> None:
    """``cupyx.scatter_add``, deterministic ``index_add_`` and ``jax.ops.segment_sum``."""
    cfg, idx, g, times = case.cfg, case.idx, case.g, case.times
    libs, cupy = check.libs, check.libs.get("cupy")

    def cupyx_scatter_add() -> dict[str, Any]:
        if cupy is None:
            raise Skip("CuPy is not available")
        import cupyx

        ic, gc = cupy.asarray(idx), cupy.asarray(g)
        shape = (cfg.K, *g.shape[1:])

        def call() -> Any:
            o = cupy.zeros(shape, cupy.float32)
            cupyx.scatter_add(o, ic, gc)
            return o

        return timed(check, call, libs["cuda"].synchronize)

    times["cupyx_scatter_add"] = check.step(f"{cfg.name}: cupyx.scatter_add", cupyx_scatter_add)

    # into one bucket of 10^8 values it takes ~12 s a call on an H200 (two calls)
    need = 30 if cfg.N * cfg.D >= 10**8 else 10
    times["torch_index_add_deterministic"] = check.step(
        f"{cfg.name}: index_add_ deterministic",
        lambda: torch_index_add(check, case, deterministic=True), need_s=need,
    )

    def segment_sum() -> dict[str, Any]:
        if "jax" not in libs:
            raise Skip("JAX with a GPU is not available")
        jax, gpu = libs["jax"]
        ij, gj = jax.device_put(idx.astype(np.int32), gpu), jax.device_put(g, gpu)
        fn = jax.jit(lambda v, i: jax.ops.segment_sum(v, i, num_segments=cfg.K))
        holder: list[Any] = []

        def call() -> None:
            holder[:] = [fn(gj, ij)]

        return timed(check, call, lambda: holder[0].block_until_ready())

    times["jax_segment_sum"] = check.step(f"{cfg.name}: jax segment_sum", segment_sum)


# -- diagnostics --------------------------------------------------------------------------------
def diagnostics(check: Check, case: Case) -> None:
    """The numba kernels' other exact paths, profiler tables of one exact fold, the portable
    backend on torch and under JAX's ``jit``."""
    from bitfold import dispatch

    cfg, plan, g, want, times = case.cfg, case.plan, case.g, case.want, case.times
    libs, cuda = check.libs, check.libs["cuda"]
    torch, cupy = libs.get("torch"), libs.get("cupy")

    def path_timing(path: str) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            entry = timed(check, lambda: numba_fold(check, case, exact_path=path), cuda.synchronize)
            entry["equals_cpu"] = _equals(numba_fold(check, case, exact_path=path), want)
            return entry

        return go

    if cfg.D == 1 and cfg.K == 1:  # the scalar path is the shared kernel; the split buckets too
        key = numba_key(check, "bitfold_exact_buckets_split")
        times[key] = check.step(f"{cfg.name}: {key}", path_timing("buckets"))
    if cfg.D == 1 and cfg.K > 1:  # the other exact paths of scalars
        for path in ("global", "buckets"):
            key = numba_key(check, f"bitfold_exact_{path}")
            times[key] = check.step(f"{cfg.name}: {key}", path_timing(path))
    if cupy is not None and cfg.name == "seed":
        gc = cupy.asarray(g)
        key = "bitfold_exact[numba-kernels,cupy]"

        def on_cupy() -> dict[str, Any]:
            call = lambda: dispatch.fold(plan, gc, "exact", backend="cuda")  # noqa: E731
            entry = timed(check, call, cuda.synchronize)
            entry["equals_cpu"] = _equals(call(), want)
            return entry

        times[key] = check.step(f"{cfg.name}: {key}", on_cupy)

    def profile_exact() -> dict[str, Any]:
        if torch is None:
            raise Skip("needs torch with a CUDA device (not on the simulator)")
        tables: dict[str, Any] = {"numba": _profile(torch, lambda: numba_fold(check, case), 12)}
        if "triton_missing" not in libs:
            gt = torch_inputs(check, case)[1]
            tables["triton"] = _profile(torch, lambda: plan(gt, backend="triton"), 12)
        return tables

    case.out["profile_exact"] = check.step(f"{cfg.name}: profile of one exact fold",
                                           profile_exact)  # fmt: skip

    def portable() -> dict[str, Any]:
        if torch is None:
            raise Skip("torch with CUDA is not available (the portable path is timed on torch)")
        gt = torch_inputs(check, case)[1]

        def call() -> Any:
            return dispatch.fold(plan, gt, backend="portable")

        entry = timed(check, call, torch.cuda.synchronize)
        entry["equals_cpu"] = _equals(call(), want)
        return entry

    key = "bitfold_exact[portable,torch]"
    times[key] = check.step(f"{cfg.name}: {key}", portable, need_s=5)

    def portable_jax() -> dict[str, Any]:
        if "jax" not in libs:
            raise Skip("JAX with a GPU is not available")
        import bitfold.jax as bj

        jax, gpu = libs["jax"]
        ij, gj = jax.device_put(case.idx.astype(np.int32), gpu), jax.device_put(g, gpu)
        fn = jax.jit(lambda v, i: bj.segment_sum(v, i, cfg.K, backend="portable"))
        holder: list[Any] = []

        def call() -> None:
            holder[:] = [fn(gj, ij)]

        entry = timed(check, call, lambda: holder[0].block_until_ready())
        entry["equals_cpu"] = want is not None and _bits(np.asarray(holder[0])) == _bits(want)
        return entry

    key = "bitfold_exact[portable,jax]"
    need = 25 if cfg.N * cfg.D >= 10**8 else 10  # 16 s into one bucket of 10^8 values
    times[key] = check.step(f"{cfg.name}: {key}", portable_jax, need_s=need)

    def portable_jax_plan() -> dict[str, Any]:
        if "jax" not in libs:
            raise Skip("JAX with a GPU is not available")
        import bitfold.jax as bj

        jax, gpu = libs["jax"]
        gj = jax.device_put(g, gpu)
        fn = jax.jit(lambda v: bj.fold(v, plan, backend="portable"))
        holder: list[Any] = []

        def call() -> None:
            holder[:] = [fn(gj)]

        entry = timed(check, call, lambda: holder[0].block_until_ready())
        entry["equals_cpu"] = want is not None and _bits(np.asarray(holder[0])) == _bits(want)
        return entry

    key = "bitfold_exact[portable,jax,plan]"
    times[key] = check.step(f"{cfg.name}: {key}", portable_jax_plan, need_s=need)

    def portable_compiled() -> dict[str, Any]:
        if torch is None:
            raise Skip("torch with CUDA is not available (the portable path is timed on torch)")
        if cfg.name != "seed":
            raise Skip("compiled at the seed configuration only (each compile takes seconds)")
        gt = torch_inputs(check, case)[1]

        def fold(v: Any) -> Any:
            return dispatch.fold(plan, v, backend="portable")

        fold(gt)  # the plan meets the device once, eagerly
        compiled = torch.compile(fold, fullgraph=True)

        def call() -> Any:
            return compiled(gt)

        entry = timed(check, call, torch.cuda.synchronize)
        entry["equals_cpu"] = _equals(call(), want)
        return entry

    key = "bitfold_exact[portable,torch,compiled]"
    times[key] = check.step(f"{cfg.name}: {key}", portable_compiled, need_s=60)


# -- CUDA graphs --------------------------------------------------------------------------------
def _graph_problem(seed: int) -> tuple[np.random.Generator, Any, np.ndarray]:
    """A captured fold's problem: its random generator, a plan (K = 433) and 100,000 values."""
    import bitfold

    rng = np.random.default_rng(seed)
    plan = bitfold.Fold(rng.integers(0, 433, 100_000), 433)
    return rng, plan, rng.standard_normal(100_000, dtype=np.float32)


def graph_torch(check: Check) -> dict[str, Any]:
    """A fold on the default backend for torch CUDA tensors, captured and replayed."""
    from bitfold import dispatch

    torch = check.libs.get("torch")
    if torch is None:
        raise Skip("torch with CUDA is not available")
    rng, plan, host = _graph_problem(3)
    static = torch.from_numpy(host).cuda()
    backend = plan.route(static).backend
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dispatch.fold(plan, static)  # warm-up on another stream than the capture's
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dispatch.fold(plan, static)
    graph.replay()
    torch.cuda.synchronize()
    first = _bits(out.cpu().numpy()) == _bits(plan(host))
    new = rng.standard_normal(100_000, dtype=np.float32)
    static.copy_(torch.from_numpy(new))
    graph.replay()
    eager = dispatch.fold(plan, static)  # an eager fold after the replay, on the current stream
    torch.cuda.synchronize()
    second = _bits(out.cpu().numpy()) == _bits(plan(new))
    return {"backend": backend, "replay_equals_cpu": first, "replay_new_values_equals_cpu": second,
            "eager_after_replay_equals_cpu": _bits(eager.cpu().numpy()) == _bits(plan(new)),
            "works": bool(first and second)}  # fmt: skip


def graph_cupy(check: Check) -> dict[str, Any]:
    from bitfold import dispatch

    cupy = check.libs.get("cupy")
    if cupy is None:
        raise Skip("CuPy is not available")
    rng, plan, host = _graph_problem(4)
    static = cupy.asarray(host)
    backend = plan.route(static).backend
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        warm = dispatch.fold(plan, static)  # the upload and the scratch, outside the capture
    stream.synchronize()
    del warm  # its block goes back to CuPy's pool: the captured result reuses it
    stream.begin_capture()
    with stream:
        out = dispatch.fold(plan, static)
    graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    first = _bits(cupy.asnumpy(out)) == _bits(plan(host))
    new = rng.standard_normal(100_000, dtype=np.float32)
    static.set(new, stream=stream)
    graph.launch(stream)
    stream.synchronize()
    second = _bits(cupy.asnumpy(out)) == _bits(plan(new))
    return {"backend": backend, "replay_equals_cpu": first, "replay_new_values_equals_cpu": second,
            "works": bool(first and second)}  # fmt: skip


# -- the compiled training step ---------------------------------------------------------------
def compiled_step(check: Check, mode: str) -> dict[str, Any]:
    """A GCN-style message-passing training step on the GPU: ``bitfold.torch.compile`` against
    ``torch.compile`` in ``mode`` (``"default"``: no mode; ``"reduce-overhead"``: CUDA graphs),
    medians of 10 steps taking turns. The default mode also times the eager step under
    ``exact_mode()``, keeps a ``torch.profiler`` table of one step, and checks that two edge
    orders give the exact compiled step one set of gradient bits."""
    try:
        import torch
    except ImportError as err:
        raise Skip("torch is not installed") from err
    if check.args.smoke or not torch.cuda.is_available():
        raise Skip("needs torch with a CUDA device (not on the simulator)")
    import torch._dynamo

    import bitfold.torch as bt

    torch._dynamo.reset()
    for knob in ("recompile_limit", "cache_size_limit"):  # two modes, two compilers, new modules
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(64, getattr(torch._dynamo.config, knob)))
    graphs = mode == "reduce-overhead"
    kw = {"mode": mode} if graphs else {}
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    nodes, edges, feats = 20_000, 400_000, 64
    x = torch.randn(nodes, feats, device=dev, generator=gen)
    src = torch.randint(0, nodes, (edges,), device=dev, generator=gen)
    dst = torch.randint(0, nodes, (edges,), device=dev, generator=gen)
    y = torch.randint(0, 8, (nodes,), device=dev, generator=gen)

    def net() -> Any:
        torch.manual_seed(0)
        return torch.nn.ModuleDict({"msg": torch.nn.Linear(feats, feats, bias=False),
                                    "out": torch.nn.Linear(feats, 8)}).to(dev)  # fmt: skip

    def forward(m: Any, s: Any, d: Any) -> Any:
        agg = torch.zeros(nodes, feats, device=dev).index_add_(0, d, m["msg"](x)[s])
        return torch.nn.functional.cross_entropy(m["out"](torch.relu(agg)), y)

    def stepper(kind: str) -> Callable[[], None]:
        m = net()
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        fn = {"compiled": lambda: torch.compile(forward, **kw),
              "exact_compiled": lambda: bt.compile(forward, **kw),
              "exact_mode": lambda: forward}[kind]()  # fmt: skip

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            if kind == "exact_mode":
                with bt.exact_mode():
                    fn(m, src, dst).backward()
            else:
                fn(m, src, dst).backward()
            opt.step()

        return step

    kinds = ("compiled", "exact_compiled") + (() if graphs else ("exact_mode",))
    skips_before = _cudagraph_skips()
    steps = {k: stepper(k) for k in kinds}
    times: dict[str, list[float]] = {k: [] for k in steps}
    warm = 4 if graphs else 3  # warm-up rounds: they compile (and record the CUDA graphs)
    for r in range(warm + 10):
        for k, step in steps.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            if r >= warm:
                times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    out: dict[str, Any] = {
        "mode": mode, "median_ms": {k: 1e3 * v for k, v in med.items()},
        "exact_compiled_over_compiled": med["exact_compiled"] / med["compiled"],
        "sizes": {"nodes": nodes, "edges": edges, "features": feats},
    }  # fmt: skip
    if graphs:
        out["cudagraph_skips"] = _cudagraph_skips() - skips_before
        return out
    out["exact_mode_over_compiled"] = med["exact_mode"] / med["compiled"]
    out["profiles"] = {k: _profile(torch, steps[k]) for k in ("compiled", "exact_compiled")}
    perm = torch.randperm(edges, device=dev, generator=gen)
    grads = []
    for s, d in ((src, dst), (src[perm], dst[perm])):
        m = net()
        bt.compile(forward)(m, s, d).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]))
    out["gradients_equal_for_two_edge_orders"] = bool(
        torch.equal(grads[0].view(torch.int32), grads[1].view(torch.int32))
    )
    return out


def _cudagraph_skips() -> int:
    """How many times inductor has declined CUDA graphs in this process (-1: unknown)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"].get("cudagraph_skips", 0))
    except Exception:
        return -1


def _profile(torch: Any, step: Callable[[], Any], rows: int = 15) -> dict[str, str]:
    """Where one call's time goes: ``torch.profiler`` tables by device and by CPU time (text)."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        table = prof.key_averages()
        return {by: table.table(sort_by=by, row_limit=rows)
                for by in ("self_cuda_time_total", "self_cpu_time_total")}  # fmt: skip
    except Exception as err:  # a diagnosis only: never fail the measurement
        return {"error": f"{type(err).__name__}: {err}"}


# -- the goals --------------------------------------------------------------------------------
def _verdict(items: list[Any], expected: int) -> Any:
    """False if any item is False; True if all ``expected`` items are True; else not measured."""
    if any(v is False for v in items):
        return False
    done = sum(v is True for v in items)
    return True if done == expected else f"not measured ({done} of {expected} judged)"


def _us(entry: Any, key: str = "us") -> float | None:
    return entry.get(key) if isinstance(entry, dict) and entry.get(key) is not None else None


def assess(report: dict[str, Any]) -> dict[str, Any]:
    """Each goal (:data:`GOALS`) per configuration or mode with its figures, and its verdict:
    True, False, or why it cannot be judged."""
    configs = report["configs"]
    smoke = report.get("smoke")
    n = len(FULL)  # every configuration, measured or not
    no_times = "not judged (smoke: times mean nothing)"

    def judged(met: bool) -> Any:
        return no_times if smoke else met

    def ratio_goal(goal: str, key: str, limit_of: Callable[[str], float]) -> dict[str, Any]:
        per: dict[str, Any] = {}
        for name, cfg in configs.items():
            exact, base = _us(cfg["timings"].get(key)), _us(cfg["timings"].get(INDEX_ADD))
            if exact is None or base is None:
                per[name] = {"met": "not measured"}
                continue
            over, limit = exact / base, limit_of(name)
            per[name] = {"exact_us": exact, "index_add_us": base, "over_index_add": over,
                         "limit": limit, "met": judged(over <= limit)}  # fmt: skip
        met = no_times if smoke else _verdict([p["met"] for p in per.values()], n)
        return {"goal": GOALS[goal], "met": met, "per_config": per}

    g1 = ratio_goal("G1", TRITON, lambda name: G1_LIMITS.get(name, 1.0))
    g3 = ratio_goal("G3", ONE_SHOT, lambda name: ONE_SHOT_LIMIT)

    host: dict[str, Any] = {}
    for name, cfg in configs.items():
        entry = cfg["timings"].get(TRITON)
        us = _us(entry, "host_us")
        host[name] = {"met": "not measured"} if us is None else {
            "host_us": us, "wall_us": entry.get("us"), "device_us": entry.get("device_us"),
            "one_shot_host_us": _us(cfg["timings"].get(ONE_SHOT), "host_us"),
            "met": judged(us <= HOST_US_GOAL)}  # fmt: skip
    g2 = {"goal": GOALS["G2"], "limit_us": HOST_US_GOAL,
          "met": no_times if smoke else _verdict([h["met"] for h in host.values()], n),
          "per_config": host}  # fmt: skip

    modes: dict[str, Any] = {}
    for mode in MODES:
        step = (report.get("compiled_step") or {}).get(mode) or {}
        over = step.get("exact_compiled_over_compiled")
        modes[mode] = {"met": "not measured"} if over is None else {
            "median_ms": step.get("median_ms"), "exact_compiled_over_compiled": over,
            "limit": COMPILED_LIMIT, "met": judged(over <= COMPILED_LIMIT)}  # fmt: skip
    g4 = {
        "goal": GOALS["G4"],
        "per_mode": modes,
        "met": no_times if smoke else _verdict([m["met"] for m in modes.values()], len(MODES)),
    }

    per_bits: dict[str, Any] = {}
    for name, cfg in configs.items():
        b = cfg["bits"]
        checks = {
            k: b.get(k)
            for k in (
                "triton_equals_cpu",
                "triton_one_shot_equals_cpu",
                "triton_ordered_same_bits_run_to_run",
                "numba_equals_cpu",
            )
        }
        others = {k: t.get("equals_cpu") for k, t in cfg["timings"].items()
                  if isinstance(t, dict) and k not in (TRITON, ONE_SHOT)}  # fmt: skip
        checks.update({f"{k}: equals_cpu": v for k, v in others.items() if isinstance(v, bool)})
        per_bits[name] = {k: ("not measured" if v is None else v) for k, v in checks.items()}
    grads = ((report.get("compiled_step") or {}).get("default") or {}).get(
        "gradients_equal_for_two_edge_orders"
    )
    expected = [b[k] for b in per_bits.values() for k in ("triton_equals_cpu",
                "triton_one_shot_equals_cpu", "triton_ordered_same_bits_run_to_run",
                "numba_equals_cpu")]  # fmt: skip
    extra = [v for b in per_bits.values() for k, v in b.items() if k.endswith(": equals_cpu")]
    verdict = _verdict(expected + ([grads] if not smoke else []),
                       4 * n + (0 if smoke else 1))  # fmt: skip
    if any(v is False for v in extra):
        verdict = False
    g5 = {"goal": GOALS["G5"], "met": verdict, "per_config": per_bits,
          "compiled_step_gradients_equal_for_two_edge_orders":
              "not measured" if grads is None else grads}  # fmt: skip

    retire: dict[str, Any] = {}
    for name, cfg in configs.items():
        tri = _us(cfg["timings"].get(TRITON))
        nb = next((_us(v) for k, v in cfg["timings"].items()
                   if k.startswith("bitfold_exact[numba-kernels") and _us(v)), None)  # fmt: skip
        retire[name] = (
            {"met": "not measured"}
            if tri is None or nb is None
            else {
                "triton_us": tri,
                "numba_us": nb,
                "triton_over_numba": tri / nb,
                "met": judged(tri <= nb),
            }
        )
    faster = {"goal": "the Triton path at least the numba kernels' speed (wall time) at every "
                      "configuration: the condition to retire the numba kernels",
              "met": no_times if smoke else _verdict([r["met"] for r in retire.values()], n),
              "per_config": retire}  # fmt: skip

    goals = {"G1_exact_plan_built_once": g1, "G2_host_time": g2, "G3_one_shot": g3,
             "G4_compiled_step": g4, "G5_bits": g5}  # fmt: skip
    verdicts = [g["met"] for g in goals.values()]
    overall = (
        False
        if any(v is False for v in verdicts)
        else (True if all(v is True for v in verdicts) else "not all measured")
    )
    graphs = {lib: (g or {}).get("works", "not measured")
              for lib, g in (report.get("graph_capture") or {}).items()}  # fmt: skip
    return {"baseline": "torch.zeros(...).index_add_ (atomic), same run", **goals,
            "all_goals_met": overall, "triton_at_least_numba_speed": faster,
            "graph_capture_works": graphs, "portable_path": portable_ratios(report)}  # fmt: skip


def portable_ratios(report: dict[str, Any]) -> dict[str, Any]:
    """The portable path against each library's own scatter, per configuration: JAX ``jit``
    (a plan's fold, and ``segment_sum`` without one) over ``jax.ops.segment_sum`` (goal: at
    most 2x), torch compiled (seed only) and eager over ``index_add_`` (compiled: at most 3x).
    Reported beside the goals above, not counted in ``all_goals_met``."""
    pairs = {"jax_plan_over_segment_sum": ("bitfold_exact[portable,jax,plan]", "jax_segment_sum"),
             "jax_segment_sum_over_segment_sum": ("bitfold_exact[portable,jax]",
                                                  "jax_segment_sum"),
             "torch_compiled_over_index_add": ("bitfold_exact[portable,torch,compiled]",
                                               INDEX_ADD),
             "torch_eager_over_index_add": ("bitfold_exact[portable,torch]",
                                            INDEX_ADD)}  # fmt: skip
    out: dict[str, Any] = {}
    for name, cfg in report["configs"].items():
        row = {}
        for label, (key, base) in pairs.items():
            a, b = _us(cfg["timings"].get(key)), _us(cfg["timings"].get(base))
            row[label] = "not measured" if a is None or b is None else round(a / b, 2)
        out[name] = row
    return out


def ratios(report: dict[str, Any]) -> None:
    """Each bitfold timing's ratio to the atomic ``index_add_`` and to ``cupyx.scatter_add``."""
    for cfg in report["configs"].values():
        t = cfg["timings"]
        for base in (INDEX_ADD, "cupyx_scatter_add"):
            b = _us(t.get(base))
            for key, entry in t.items():
                if key.startswith("bitfold") and b and _us(entry):
                    entry[f"over_{base}"] = entry["us"] / b


def environment(check: Check) -> dict[str, Any]:
    env: dict[str, Any] = {"simulator": os.environ.get("NUMBA_ENABLE_CUDASIM") == "1",
                           "triton_interpret": os.environ.get("TRITON_INTERPRET") == "1",
                           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "python": sys.version.split()[0]}  # fmt: skip
    try:
        from bitfold.kernels import cuda as kernels

        cuda = check.libs.get("cuda")
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        lim = kernels.device_limits(dev)
        env["device"] = {"name": name, "compute_capability": list(dev.compute_capability),
                         "sms": lim.sms, "threads_per_sm": lim.threads_per_sm,
                         "shared_per_block": lim.shared_per_block}  # fmt: skip
    except Exception as err:
        env["device_error"] = f"{type(err).__name__}: {err}"
    return env


def run(check: Check) -> None:
    check.step("import numba-cuda and the libraries", lambda: find_libraries(check), 0)
    cases: list[Case] = []
    # 1. the goals' figures: bits and times of the exact folds against the atomic index_add_
    for cfg in SMOKE if check.args.smoke else FULL:

        def goals(c: Config = cfg) -> None:
            case = new_case(check, c)
            cases.append(case)
            goal_figures(check, case)

        check.step(cfg.name, goals, need_s=5)
    # 2. the compiled training step, both modes
    for mode in MODES:
        name = "compiled step" + ("" if mode == "default" else f" [{mode}]")
        measured = check.step(name, lambda m=mode: compiled_step(check, m), need_s=45)
        check.report["compiled_step"][mode] = measured or dict(check.report["steps"][name])
    # 3. the other baselines
    for case in cases:
        check.step(f"{case.cfg.name}: baselines", lambda c=case: baselines(check, c), need_s=3)
    # 4. CUDA-graph capture
    check.report["graph_capture"]["torch"] = check.step("graph: torch", lambda: graph_torch(check))
    check.report["graph_capture"]["cupy"] = check.step("graph: cupy", lambda: graph_cupy(check))
    # 5. diagnostics
    for case in cases:
        check.step(f"{case.cfg.name}: diagnostics", lambda c=case: diagnostics(check, c), 5)
    cases.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--budget", type=float, default=170.0, help="seconds for every step")
    parser.add_argument("--seconds", type=float, default=0.15, help="seconds a timed trial")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, no GPU: the numba-cuda simulator and the Triton "
                             "interpreter (checks the script)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:  # before triton is first imported: it reads this once
        os.environ.setdefault("TRITON_INTERPRET", "1")
    check = Check(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # `timeout`: still write the JSON
    try:
        run(check)
    finally:
        report = check.report
        try:
            ratios(report)
            report["assessment"] = assess(report)
            report["environment"] = environment(check)
        except Exception as err:  # the JSON is written whatever fails
            report["report_error"] = f"{type(err).__name__}: {err}"
        report["seconds"] = round(time.perf_counter() - check.t0, 2)
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, default=str)
        print(f"wrote {args.out} in {report['seconds']:.0f} s", file=sys.stderr)
    print(json.dumps(report.get("assessment", {}), indent=2, default=str))
    return 0 if bits_pass(report) else 1


def bits_pass(report: dict[str, Any]) -> bool:
    """Every bit check that ran equals the CPU's (or, for ``ordered``, the run before), and at
    least one numba-kernel or Triton check ran; a check skipped for time is not a failure."""
    configs = report["configs"].values()
    bits = [v for c in configs for v in c["bits"].values()]
    paths = [t.get("equals_cpu") for c in configs for t in c["timings"].values() if t]
    grads = ((report.get("compiled_step") or {}).get("default") or {}).get(
        "gradients_equal_for_two_edge_orders"
    )
    ran = [b for b in [*bits, *paths, grads] if isinstance(b, bool)]
    main = [c["bits"].get(k) for c in configs for k in ("numba_equals_cpu", "triton_equals_cpu")]
    return any(b is True for b in main) and all(ran)


if __name__ == "__main__":
    sys.exit(main())
