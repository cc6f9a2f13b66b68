"""``bitfold probe``: the hashed layer experiment's four questions, answered on this machine.

1. Is the usual scatter (the fold everyone uses) non-deterministic here?
2. Are bitfold's ``ordered`` and ``exact`` folds bit-identical across repeats?
3. What does each fold cost per call?
4. Does a training run of the hashed layer's folded model become reproducible?

Defaults are the hashed layer's (D=768, hid=4096, K=433, reps=5, steps=200,
batch=128, lr=1e-3). The human report goes to stdout, progress to stderr,
and ``--json PATH`` writes every number.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..arrays import to_numpy
from ..errors import FoldError
from ..plan import Fold
from ..repro.digest import bits_equal, digest
from ..repro.fingerprint import fingerprint
from .bench.contenders import CONTENDERS, Contender, Inputs, baseline_for, resolve
from .devices import offered_devices, resolve_device
from .hashed_layer_model import (
    HASHED_LAYER_STEPS,
    HashedLayerAdam,
    HashedLayerModel,
    autograd_gradient,
    folded_gradient,
    train,
)
from .probe_devices import CpuDevice, CudaDevice, TorchDevice
from .probe_report import BIT_STRATEGIES, print_report, readout
from .progress import progress_bar
from .timing import machine_load, peak_bytes, time_call
from .torch_env import passive_openmp_before_torch

#: rounds in which question 3's folds take turns (their ratios' spread is reported)
COST_ROUNDS = 3

HELP = (
    "check on this machine: (1) does the usual scatter-add give different bits run to run, "
    "(2) does bitfold give the same bits every time, (3) what does that cost, (4) do two "
    "training runs from one seed end bit-identical"
)
#: What each size flag means (the folded layer of the user's original experiment).
FLAG_MEANINGS = {
    "D": "inputs of the folded layer",
    "hid": "outputs of the folded layer (its weight has D x hid entries)",
    "K": "shared parameters the D x hid weights are folded into (the buckets of the fold)",
    "reps": "repeats of each fold timed and compared",
    "steps": "steps of each training run",
    "batch": "examples a training step",
}

TRAIN_STRATEGIES = ("atomic", "ordered", "exact")
#: The usual folds questions 1 and 3 measure, per device: names in the benchmark's contender
#: table. The device's atomic baseline (``baseline_for``) is added when missing and runs first;
#: ``*``: any other device torch folds on.
BASELINES = {
    "cpu": ("numpy-add-at", "torch-autograd", "torch-index-add", "torch-scatter-add"),
    "cuda": ("cupy-scatter-add", "torch-index-add", "torch-index-add-det", "torch-autograd"),
    "*": ("torch-scatter-add", "torch-index-add", "torch-autograd"),
}


@dataclass
class ProbeConfig:
    """The hashed layer's configuration; every field is a command-line flag."""

    D: int = HashedLayerModel.D
    hid: int = HashedLayerModel.hid
    K: int = HashedLayerModel.K
    reps: int = 5
    steps: int = HASHED_LAYER_STEPS
    batch: int = HashedLayerModel.batch
    lr: float = HashedLayerModel.lr
    seed: int = HashedLayerModel.seed
    device: str = "auto"
    torch: bool = True

    def model(self) -> HashedLayerModel:
        """The hashed layer model these settings describe."""
        return HashedLayerModel(self.D, self.hid, self.K, self.batch, self.lr, self.seed)

    def check(self) -> None:
        """Refuse sizes that make no sense before any work starts."""
        for name in ("D", "hid", "K", "reps", "batch"):
            if getattr(self, name) < 1:
                raise FoldError(f"--{name} must be at least 1; got {getattr(self, name)}")
        if self.steps < 1:
            raise FoldError(f"--steps must be at least 1; got {self.steps}")
        if not 0 <= self.seed < 2**63:
            raise FoldError(f"--seed must be an integer in [0, 2**63); got {self.seed}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise FoldError(f"--lr must be positive and finite; got {self.lr}")


# --------------------------------------------------------------------------- helpers
def _max_abs_diff(a: Any, b: Any) -> float:
    x = np.asarray(a, np.float64)
    y = np.asarray(b, np.float64)
    return float(np.nanmax(np.abs(x - y))) if x.size else 0.0


def _torch_or_none(wanted: bool) -> Any:
    """torch, imported with passive OpenMP waiting unless the user chose otherwise.

    PyTorch's wheel carries its own OpenMP runtime, whose idle workers spin
    for a while after every operation and would take the cores from the
    Numba kernels measured next; ``OMP_WAIT_POLICY=PASSIVE`` puts them to
    sleep instead. It only changes timings, never results.
    """
    if not wanted or importlib.util.find_spec("torch") is None:
        return None
    passive_openmp_before_torch()
    import torch

    return torch


def make_device(name: str, with_torch: bool) -> CpuDevice | TorchDevice:
    """The backend object of ``name`` (a device type from :func:`resolve_device`)."""
    if name == "cuda":
        return CudaDevice(_torch_or_none(True))
    if name != "cpu":
        return TorchDevice(_torch_or_none(True), name)
    return CpuDevice(_torch_or_none(with_torch))


def _no_tick(n: int = 1) -> None:
    """A progress callback that shows nothing."""


def repeat_outcome(
    make: Callable[[], Any], reps: int, tick: Callable[[], None] = _no_tick
) -> dict[str, Any]:
    """Run ``make`` once plus ``reps`` times; count repeats whose bits differ from the first.

    ``tick`` is called after every call (``reps + 1`` times), for a progress bar.
    """
    first = np.array(to_numpy(make()), copy=True)
    tick()
    diffs = []
    seen = {digest(first)}
    for _ in range(reps):
        r = np.array(to_numpy(make()), copy=True)
        tick()
        seen.add(digest(r))
        diffs.append(0.0 if bits_equal(first, r) else _max_abs_diff(first, r))
    differed = sum(1 for d in diffs if d or np.isnan(d))
    return {
        "repeats": reps,
        "differed": differed,
        "distinct_results": len(seen),
        "max_difference": max(diffs) if diffs else 0.0,
        "result": first,
    }


# --------------------------------------------------------------------------- the questions
class Probe:
    """Holds the data shared by the four questions and answers them in turn on ``device``."""

    def __init__(self, cfg: ProbeConfig, device: Any, show_progress: bool = True) -> None:
        cfg.check()
        self.cfg = cfg
        self.dev = device
        self.show_progress = show_progress
        self.model = cfg.model()
        rng = np.random.default_rng(cfg.seed)
        self.idx = self.model.index(rng)  # the hashed layer's map; the test gradient is drawn next
        self.g = rng.normal(size=self.idx.size).astype(np.float32)
        self.matmul_x = rng.normal(size=(cfg.batch, cfg.D)).astype(np.float32)
        self.matmul_w = rng.normal(size=(cfg.D, cfg.hid)).astype(np.float32)
        self.plan: Fold | None = None
        self.values: Any = device.array(self.g)  # what the bitfold strategies fold
        self.inputs = Inputs(self.idx, self.g, cfg.K, device.name)  # what the baselines fold
        self.atomic_baseline = CONTENDERS[baseline_for(device.name)].title
        self.usual_results: dict[str, np.ndarray] = {}  # question 1's first result of each

    def _chosen_baselines(self) -> list[Contender]:
        """The contenders questions 1 and 3 run here, the device's atomic baseline first."""
        base = baseline_for(self.dev.name)
        chosen = []
        for name in resolve(list(BASELINES.get(self.dev.name, BASELINES["*"])), self.dev.name):
            c = CONTENDERS[name]
            if c.unavailable(self.dev.name) is not None:
                continue
            if c.library == "torch" and not self.cfg.torch and name != base:
                continue
            chosen.append(c)
        return chosen

    def skipped_baselines(self) -> list[str]:
        """Baselines this run could not measure, with the reason."""
        if self.cfg.torch and self.dev.torch is not None:
            return []
        why = "--no-torch" if not self.cfg.torch else "torch is not installed"
        return [
            f"PyTorch's folds (autograd of v[idx], index_add_, scatter_add_): {why}; they are "
            "the ones that are non-deterministic on a multi-core CPU "
            "(pip install 'bitfold[torch]')"
        ]

    def baselines(self) -> dict[str, Callable[[], Any]]:
        """The usual folds measured here (label -> one fold that waits for the device)."""
        found: dict[str, Callable[[], Any]] = {}
        for c in self._chosen_baselines():
            runner = c.make(self.inputs)
            runner.setup()
            found[c.title] = runner.call
        return found

    def _bar(self, total: int, desc: str) -> Any:
        """A progress bar on stderr for one question (shown only on a terminal)."""
        return progress_bar(total, desc, enabled=self.show_progress)

    def question1(self) -> dict[str, Any]:
        """Non-determinism of each usual fold, over ``reps`` repeats."""
        out: dict[str, Any] = {}
        chosen = self._chosen_baselines()
        notes = {c.title: self.dev.baseline_note(c) for c in chosen}
        with self._bar(len(chosen) * (self.cfg.reps + 1), "1/4 the usual folds") as bar:
            for name, fn in self.baselines().items():
                bar.note(name)
                res = repeat_outcome(fn, self.cfg.reps, bar.tick)
                self.usual_results[name] = res.pop("result")
                res["note"] = notes[name]
                out[name] = res
        return out

    # -- bitfold -----------------------------------------------------------------------
    def question2(self) -> dict[str, Any]:
        """Plan preparation, repeat identity, memory, and every fold's distance from the exact
        sum (``differences_from_exact``: bitfold's folds and question 1's usual folds)."""
        steps = 3 + len(BIT_STRATEGIES) * (self.cfg.reps + 3)
        with self._bar(steps, "2/4 bitfold's folds") as bar:
            bar.note("building the plan")
            cold = time_call(lambda: Fold(self.idx, self.cfg.K), repeats=1)
            bar.tick()
            plan, _ = peak_bytes(lambda: Fold(self.idx, self.cfg.K))
            self.plan = plan
            bar.tick()
            atomic = to_numpy(plan(self.values, "atomic"))
            bar.tick()
            out: dict[str, Any] = {
                "plan_build_s_first": cold.first_s,
                "plan_build_s": plan.build_seconds,
                "plan_bytes": plan.nbytes,
            }
            results = {"atomic": atomic}
            for name in BIT_STRATEGIES:
                bar.note(name)
                out[name], results[name] = self._bit_strategy(name, atomic, bar.tick)
        out["differences_from_exact"] = self._differences_from_exact(results)
        return out

    def _bit_strategy(self, name: str, atomic: Any, tick: Callable[[], None]) -> tuple[dict, Any]:
        """One fixed fold of question 2: first call, repeats, memory, digest; and its result."""
        plan, sync = self.plan, self.dev.sync
        assert plan is not None
        # the first call compiles (or loads Numba's on-disk cache): timed apart from the rest
        first = time_call(lambda: plan(self.values, name), repeats=1, sync=sync)
        tick()
        res = repeat_outcome(lambda: plan(self.values, name), self.cfg.reps, tick)
        result = res.pop("result")
        fold_peak = self.dev.fold_memory(lambda: plan(self.values, name))
        tick()
        return {
            "first_call_s": first.first_s,
            "bit_identical": res["differed"] == 0,
            **res,
            "fold_peak_bytes": fold_peak,
            "extra_bytes": plan.nbytes + fold_peak,
            "max_difference_from_atomic": _max_abs_diff(result, atomic),
            "digest": digest(result),
        }, result

    def _differences_from_exact(self, results: dict[str, Any]) -> dict[str, float]:
        """The largest difference of each fold's result from the exact (correctly rounded) sum."""
        exact = results["exact"]
        out = {f"bitfold {s}": _max_abs_diff(results[s], exact) for s in ("ordered", "atomic")}
        out.update({name: _max_abs_diff(r, exact) for name, r in self.usual_results.items()})
        return out

    def question3(self) -> dict[str, Any]:
        """Median cost per call of every strategy and baseline, and a matmul for scale."""
        assert self.plan is not None
        plan, g, sync = self.plan, self.values, self.dev.sync
        contenders: dict[str, Callable[[], Any]] = {
            f"bitfold {name}": (lambda name=name: plan(g, name))
            for name in ("atomic", *BIT_STRATEGIES)
        }
        contenders.update(self.baselines())
        rows: dict[str, Any] = {}
        repeats = max(5, self.cfg.reps)
        load_before = machine_load()
        # the contenders take turns, COST_ROUNDS rounds: drift in the machine's speed hits all,
        # and the ratios' spread over the rounds says how far to trust them
        rounds: dict[str, list[float]] = {name: [] for name in contenders}
        with self._bar(len(contenders) * COST_ROUNDS + 1, "3/4 the cost of each fold") as bar:
            for r in range(COST_ROUNDS):
                for name, fn in contenders.items():
                    bar.note(name)
                    t = time_call(fn, repeats=repeats, sync=sync)
                    rounds[name].append(t.median_s * 1e3)
                    if r == 0:
                        rows[name] = {"first_call_ms": t.first_s * 1e3}
                    bar.tick()
            bar.note("a forward matrix product, for scale")
            x, w = self.dev.array(self.matmul_x), self.dev.array(self.matmul_w)
            matmul = time_call(lambda: x @ w, repeats=repeats, sync=sync)
            bar.tick()
        base_rounds = rounds[self.atomic_baseline]
        base = statistics.median(base_rounds)
        for name, row in rows.items():
            row["median_ms"] = statistics.median(rounds[name])
            row["round_ms"] = rounds[name]
            row["ratio_to_atomic"] = row["median_ms"] / base if base else float("nan")
            ratios = [t / b for t, b in zip(rounds[name], base_rounds, strict=True) if b]
            row["ratio_spread"] = [min(ratios), max(ratios)] if ratios else [float("nan")] * 2
        return {
            "atomic_baseline": self.atomic_baseline,
            "per_call": rows,
            "rounds": COST_ROUNDS,
            "forward_matmul_ms": matmul.median_s * 1e3,
            "load": {"cores": os.cpu_count(), "before": load_before, "after": machine_load()},
        }

    # -- training --------------------------------------------------------------------
    def training_runs(self) -> list[tuple[str, Callable[[Callable[[], None]], Any]]]:
        """(name, train(tick) -> final v) for every fold the training question compares.

        All of them are :func:`bitfold.cli.hashed_layer_model.train` of the hashed layer model:
        with each bitfold strategy folding the gradient, and with PyTorch's
        autograd of ``v[idx]``.
        """
        model, steps, dev = self.model, self.cfg.steps, self.dev
        v0, X = model.start()

        def bitfold_run(strategy: str, tick: Callable[[], None]) -> Any:
            assert self.plan is not None
            grad = folded_gradient(model, self.plan, strategy, dev.array(self.idx))
            return train(dev.array(v0), dev.array(X), steps, grad, HashedLayerAdam(model.lr), tick)

        def autograd_run(tick: Callable[[], None]) -> Any:
            grad = autograd_gradient(model, dev.tensor(self.idx))
            adam = HashedLayerAdam(model.lr)
            return train(dev.tensor(v0), dev.tensor(X), steps, grad, adam, tick)

        runs: list[tuple[str, Callable[[Callable[[], None]], Any]]] = [
            (s, lambda tick, s=s: bitfold_run(s, tick)) for s in TRAIN_STRATEGIES
        ]
        if self.cfg.torch and dev.torch is not None:
            runs.append(("torch autograd", autograd_run))
        return runs

    def question4(self) -> dict[str, Any]:
        """The hashed layer's folded model trained twice per fold: identical or not, and digests."""
        runs = self.training_runs()
        total = 2 * len(runs) * self.cfg.steps
        out: dict[str, Any] = {}
        with self._bar(total, "4/4 training twice with each fold") as bar:
            for name, run in runs:
                bar.note(name)
                r1 = to_numpy(run(bar.tick))
                r2 = to_numpy(run(bar.tick))
                same = bits_equal(r1, r2)
                out[name] = {
                    "bit_identical": same,
                    "max_difference": 0.0 if same else _max_abs_diff(r1, r2),
                    "digests": [digest(r1), digest(r2)],
                }
        return out

    def run(self) -> dict[str, Any]:
        """All four questions and the readout, as one JSON-ready dictionary."""
        if self.dev.torch is not None:
            self.dev.torch.set_grad_enabled(True)
        answers = self.dev.known_answers()  # before any fold: it may choose the kernels
        report: dict[str, Any] = {
            "tool": "bitfold probe",
            "config": asdict(self.cfg) | {"device": self.dev.name},
            "machine": fingerprint(),
            "backend": self.dev.describe(answers["backend"]),
            "known_answers": answers,
            "skipped_baselines": self.skipped_baselines(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        }
        report["q1_nondeterminism"] = self.question1()
        report["q2_fixed_order"] = self.question2()
        report["q3_cost"] = self.question3()
        report["q4_training"] = self.question4()
        report["readout"] = readout(report)
        return report


class _Encoder(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        if isinstance(o, np.generic):
            return o.item()
        return super().default(o)


# --------------------------------------------------------------------------- CLI
def configure(parser: argparse.ArgumentParser) -> None:
    """Flags: the hashed layer's configuration, --json, --device."""
    d = ProbeConfig()
    for name, meaning in FLAG_MEANINGS.items():
        parser.add_argument(
            f"--{name}", type=int, default=getattr(d, name),
            help=f"{meaning} (default {getattr(d, name)})",
        )  # fmt: skip
    lr_help = f"learning rate of the training runs (default {d.lr})"
    parser.add_argument("--lr", type=float, default=d.lr, help=lr_help)
    parser.add_argument("--seed", type=int, default=d.seed, help="random seed (default 0)")
    parser.add_argument(
        "--device",
        default="auto",
        metavar="{" + ",".join(("auto", *offered_devices())) + "}",
        help="where to fold: a device some backend folds on (default auto: CPU unless a GPU "
        "path is available)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write every number to PATH as JSON")
    parser.add_argument(
        "--no-torch",
        action="store_true",
        help="leave torch's baselines out even when torch is installed",
    )


def main(args: argparse.Namespace) -> int:
    """Run the probe, print the report, optionally write JSON."""
    cfg = ProbeConfig(
        D=args.D,
        hid=args.hid,
        K=args.K,
        reps=args.reps,
        steps=args.steps,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        device=args.device,
        torch=not args.no_torch,
    )
    if args.json:
        try:
            with open(args.json, "a", encoding="utf-8"):
                pass
        except OSError as err:
            raise FoldError(f"cannot write --json {args.json!r}: {err.strerror}") from None
    cfg.check()
    rep = Probe(cfg, make_device(resolve_device(cfg.device), cfg.torch)).run()
    print_report(rep)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rep, fh, indent=2, cls=_Encoder)
        print(f"\n wrote {args.json}")
    return 0
