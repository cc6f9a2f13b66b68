"""``bitfold probe``: the seed experiment's four questions, answered on this machine.

1. Is the usual scatter (the fold everyone uses) non-deterministic here?
2. Are bitfold's ``ordered`` and ``exact`` folds bit-identical across repeats?
3. What does each fold cost per call?
4. Does a training run of the seed's folded model become reproducible?

Defaults are the seed's (D=768, hid=4096, K=433, reps=5, steps=200,
batch=128, lr=1e-3). The human report goes to stdout, progress to stderr,
and ``--json PATH`` writes every number.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..arrays import to_numpy
from ..errors import DeviceError, FoldError
from ..plan import Fold
from ..repro.digest import bits_equal, digest
from ..repro.fingerprint import fingerprint, summary
from .progress import progress_bar
from .timing import peak_bytes, time_call
from .torch_env import passive_openmp_before_torch

HELP = "answer the seed's four questions about the fold on this machine"

BIT_STRATEGIES = ("ordered", "exact")
TRAIN_STRATEGIES = ("atomic", "ordered", "exact")


@dataclass
class ProbeConfig:
    """The seed's configuration; every field is a command-line flag."""

    D: int = 768
    hid: int = 4096
    K: int = 433
    reps: int = 5
    steps: int = 200
    batch: int = 128
    lr: float = 1e-3
    seed: int = 0
    device: str = "auto"
    torch: bool = True

    def check(self) -> None:
        """Refuse sizes that make no sense before any work starts."""
        for name in ("D", "hid", "K", "reps", "batch"):
            if getattr(self, name) < 1:
                raise FoldError(f"--{name} must be at least 1; got {getattr(self, name)}")
        if self.steps < 1:
            raise FoldError(f"--steps must be at least 1; got {self.steps}")
        if not 0 <= self.seed < 2**63:
            raise FoldError(f"--seed must be an integer in [0, 2**63); got {self.seed}")
        if not self.lr > 0:
            raise FoldError(f"--lr must be positive; got {self.lr}")


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


def cuda_available() -> bool:
    """True when torch sees a CUDA device and numba-cuda is installed (checked without CUDA init
    where possible: torch is imported only if it is installed)."""
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("numba_cuda") is None:
        return False
    passive_openmp_before_torch()
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(requested: str) -> str:
    """``cpu`` or ``cuda``: ``auto`` takes the GPU when one is usable, else the CPU."""
    if requested not in ("auto", "cpu", "cuda"):
        raise FoldError(f"--device must be auto, cpu or cuda; got {requested!r}")
    if requested == "cpu":
        return "cpu"
    usable = cuda_available()
    if requested == "cuda" and not usable:
        raise DeviceError(
            "--device cuda needs a CUDA device visible to PyTorch and numba-cuda installed "
            "(pip install 'bitfold[cuda,torch]'); none is usable here — run with --device cpu"
        )
    return "cuda" if usable else "cpu"


def repeat_outcome(make: Callable[[], Any], reps: int) -> dict[str, Any]:
    """Run ``make`` once plus ``reps`` times; count repeats whose bits differ from the first."""
    first = np.array(to_numpy(make()), copy=True)
    diffs = []
    seen = {digest(first)}
    for _ in range(reps):
        r = np.array(to_numpy(make()), copy=True)
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
    """Holds the data shared by the four questions and answers them in turn."""

    def __init__(self, cfg: ProbeConfig, show_progress: bool = True) -> None:
        cfg.check()
        self.cfg = cfg
        self.device = "cpu"
        self.show_progress = show_progress
        self.torch = _torch_or_none(cfg.torch)
        rng = np.random.default_rng(cfg.seed)
        n = cfg.D * cfg.hid
        self.idx = rng.integers(0, cfg.K, n)
        self.g = rng.normal(size=n).astype(np.float32)
        self.matmul_x = rng.normal(size=(cfg.batch, cfg.D)).astype(np.float32)
        self.matmul_w = rng.normal(size=(cfg.D, cfg.hid)).astype(np.float32)
        self.plan: Fold | None = None
        self.values: Any = self.g  # what the bitfold strategies fold (a device array on GPU)
        self.sync: Callable[[], None] | None = None
        self.atomic_baseline = "np.add.at"

    def skipped_baselines(self) -> list[str]:
        """Baselines this run could not measure, with the reason."""
        if self.torch is not None:
            return []
        why = "--no-torch" if not self.cfg.torch else "torch is not installed"
        return [
            f"PyTorch's folds (autograd of v[idx], index_add_, scatter_add_): {why}; they are "
            "the ones that are non-deterministic on a multi-core CPU "
            "(pip install 'bitfold[torch]')"
        ]

    def describe_backend(self) -> str:
        """One line naming where the folds ran."""
        return "numpy + numba (CPU)" + (" and torch (CPU)" if self.torch else "")

    def baseline_note(self, name: str) -> str:
        """Why a baseline is or is not expected to be deterministic here."""
        if name == "np.add.at":
            return "sequential on the CPU, so deterministic by construction"
        threads = self.torch.get_num_threads() if self.torch is not None else None
        return f"CPU, {threads} threads"

    def fold_memory(self, fn: Callable[[], Any]) -> int:
        """Peak bytes a fold allocates above its inputs."""
        return peak_bytes(fn)[1]

    def forward_matmul(self) -> Callable[[], Any]:
        """One forward matmul of the seed's model, for scale."""
        x, w = self.matmul_x, self.matmul_w
        return lambda: x @ w

    # -- baselines -----------------------------------------------------------------
    def baselines(self) -> dict[str, Callable[[], Any]]:
        """The usual folds available here, as zero-argument callables returning NumPy arrays."""
        K, idx, g = self.cfg.K, self.idx, self.g

        def np_add_at() -> np.ndarray:
            out = np.zeros(K, np.float32)
            np.add.at(out, idx, g)
            return out

        found: dict[str, Callable[[], Any]] = {"np.add.at": np_add_at}
        torch = self.torch
        if torch is not None:
            ti = torch.from_numpy(idx)
            tg = torch.from_numpy(g)

            def autograd_fold() -> np.ndarray:
                v = torch.zeros(K, requires_grad=True)
                (grad,) = torch.autograd.grad(v[ti], v, grad_outputs=tg)
                return grad.numpy()

            found["torch autograd v[idx]"] = autograd_fold
            found["torch index_add_"] = lambda: torch.zeros(K).index_add_(0, ti, tg).numpy()
            found["torch scatter_add_"] = lambda: torch.zeros(K).scatter_add_(0, ti, tg).numpy()
        return found

    def question1(self) -> dict[str, Any]:
        """Non-determinism of each usual fold, over ``reps`` repeats."""
        out: dict[str, Any] = {}
        for name, fn in self.baselines().items():
            res = repeat_outcome(fn, self.cfg.reps)
            res.pop("result")
            res["note"] = self.baseline_note(name)
            out[name] = res
        return out

    # -- bitfold -----------------------------------------------------------------------
    def question2(self) -> dict[str, Any]:
        """Plan preparation, repeat identity, memory and distance from the atomic result."""
        cold = time_call(lambda: Fold(self.idx, self.cfg.K), repeats=1)
        plan, _ = peak_bytes(lambda: Fold(self.idx, self.cfg.K))
        self.plan = plan
        atomic = to_numpy(plan(self.values, "atomic"))
        out: dict[str, Any] = {
            "plan_build_s_first": cold.first_s,
            "plan_build_s": plan.build_seconds,
            "plan_bytes": plan.nbytes,
        }
        for name in BIT_STRATEGIES:
            # the first call compiles (or loads Numba's on-disk cache): timed apart from the rest
            first = time_call(lambda name=name: plan(self.values, name), repeats=1, sync=self.sync)
            res = repeat_outcome(lambda name=name: plan(self.values, name), self.cfg.reps)
            result = res.pop("result")
            fold_peak = self.fold_memory(lambda name=name: plan(self.values, name))
            out[name] = {
                "first_call_s": first.first_s,
                "bit_identical": res["differed"] == 0,
                **res,
                "fold_peak_bytes": fold_peak,
                "extra_bytes": plan.nbytes + fold_peak,
                "max_difference_from_atomic": _max_abs_diff(result, atomic),
                "digest": digest(result),
            }
        return out

    def question3(self) -> dict[str, Any]:
        """Median cost per call of every strategy and baseline, and a matmul for scale."""
        assert self.plan is not None
        plan, g = self.plan, self.values
        contenders: dict[str, Callable[[], Any]] = {
            f"bitfold {name}": (lambda name=name: plan(g, name))
            for name in ("atomic", *BIT_STRATEGIES)
        }
        contenders.update(self.baselines())
        rows: dict[str, Any] = {}
        for name, fn in contenders.items():
            t = time_call(fn, repeats=max(5, self.cfg.reps), sync=self.sync)
            rows[name] = {"median_ms": t.median_s * 1e3, "first_call_ms": t.first_s * 1e3}
        base = rows[self.atomic_baseline]["median_ms"]
        for row in rows.values():
            row["ratio_to_atomic"] = row["median_ms"] / base if base else float("nan")
        matmul = time_call(self.forward_matmul(), repeats=max(5, self.cfg.reps), sync=self.sync)
        return {
            "atomic_baseline": self.atomic_baseline,
            "per_call": rows,
            "forward_matmul_ms": matmul.median_s * 1e3,
        }

    # -- training --------------------------------------------------------------------
    def _train_numpy(self, strategy: str, tick: Callable[[], None]) -> np.ndarray:
        cfg, plan = self.cfg, self.plan
        assert plan is not None
        r = np.random.default_rng(cfg.seed)
        v = r.normal(0, 0.05, cfg.K).astype(np.float32)
        m = np.zeros_like(v)
        vv = np.zeros_like(v)
        X = r.normal(size=(cfg.batch, cfg.D)).astype(np.float32)
        for t in range(1, cfg.steps + 1):
            W = plan.expand(v).reshape(cfg.D, cfg.hid)
            h = np.maximum(X @ W, 0)
            d = (h - 1.0) / cfg.batch
            gW = X.T @ (d * (h > 0))
            gr = plan(gW, strategy)
            v, m, vv = _adam(v, m, vv, gr, t, cfg.lr, np.sqrt)
            tick()
        return v

    def _train_torch(self, tick: Callable[[], None]) -> np.ndarray:
        torch, cfg = self.torch, self.cfg
        r = np.random.default_rng(cfg.seed)
        v = torch.from_numpy(r.normal(0, 0.05, cfg.K).astype(np.float32)).requires_grad_()
        X = torch.from_numpy(r.normal(size=(cfg.batch, cfg.D)).astype(np.float32))
        idx = torch.from_numpy(self.idx)
        m = torch.zeros_like(v)
        vv = torch.zeros_like(v)
        for t in range(1, cfg.steps + 1):
            W = v[idx].reshape(cfg.D, cfg.hid)
            h = torch.relu(X @ W)
            loss = ((h - 1.0) ** 2).sum() / (2 * cfg.batch)
            (gr,) = torch.autograd.grad(loss, v)
            with torch.no_grad():
                new_v, m, vv = _adam(v.detach(), m, vv, gr, t, cfg.lr, torch.sqrt)
            v = new_v.requires_grad_()
            tick()
        return v.detach().numpy()

    def training_runs(self) -> list[tuple[str, Callable[[Callable[[], None]], Any]]]:
        """(name, train(tick) -> final v) for every fold the training question compares."""
        runs: list[tuple[str, Callable[[Callable[[], None]], Any]]] = [
            (s, lambda tick, s=s: self._train_numpy(s, tick)) for s in TRAIN_STRATEGIES
        ]
        if self.torch is not None:
            runs.append(("torch autograd", self._train_torch))
        return runs

    def question4(self) -> dict[str, Any]:
        """The seed's folded model trained twice per fold: identical or not, and digests."""
        runs = self.training_runs()
        total = 2 * len(runs) * self.cfg.steps
        out: dict[str, Any] = {}
        with progress_bar(total, "training", enabled=self.show_progress) as bar:
            for name, train in runs:
                r1 = to_numpy(train(bar.tick))
                r2 = to_numpy(train(bar.tick))
                same = bits_equal(r1, r2)
                out[name] = {
                    "bit_identical": same,
                    "max_difference": 0.0 if same else _max_abs_diff(r1, r2),
                    "digests": [digest(r1), digest(r2)],
                }
        return out

    def run(self) -> dict[str, Any]:
        """All four questions and the readout, as one JSON-ready dictionary."""
        if self.torch is not None:
            self.torch.set_grad_enabled(True)
        report: dict[str, Any] = {
            "tool": "bitfold probe",
            "config": asdict(self.cfg) | {"device": self.device},
            "machine": fingerprint(),
            "backend": self.describe_backend(),
            "skipped_baselines": self.skipped_baselines(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        }
        report["q1_nondeterminism"] = self.question1()
        report["q2_fixed_order"] = self.question2()
        report["q3_cost"] = self.question3()
        report["q4_training"] = self.question4()
        report["readout"] = readout(report)
        return report


def _adam(v: Any, m: Any, vv: Any, gr: Any, t: int, lr: float, sqrt: Callable) -> tuple:
    """The seed's Adam step (beta1 0.9, beta2 0.999, eps 1e-8), same formula for NumPy and torch."""
    m = 0.9 * m + 0.1 * gr
    vv = 0.999 * vv + 0.001 * gr * gr
    v = v - lr * (m / (1 - 0.9**t)) / (sqrt(vv / (1 - 0.999**t)) + 1e-8)
    return v, m, vv


# --------------------------------------------------------------------------- words
def readout(rep: dict[str, Any]) -> list[str]:
    """What the numbers say, in sentences; covers the seed's cases honestly."""
    q1, q2, q3, q4 = (
        rep[k] for k in ("q1_nondeterminism", "q2_fixed_order", "q3_cost", "q4_training")
    )
    lines: list[str] = []
    noisy = {k: v for k, v in q1.items() if v["differed"]}
    fixed_ok = all(q2[s]["bit_identical"] for s in BIT_STRATEGIES) and all(
        q4[s]["bit_identical"] for s in BIT_STRATEGIES if s in q4
    )
    cost = q3["per_call"]
    base = q3["atomic_baseline"]
    exact_ratio = cost["bitfold exact"]["ratio_to_atomic"]
    extra_ms = cost["bitfold exact"]["median_ms"] - cost[base]["median_ms"]
    share = extra_ms / q3["forward_matmul_ms"] if q3["forward_matmul_ms"] else float("nan")
    if not fixed_ok:
        lines.append(
            "THE FIXED-ORDER FOLDS DID NOT REPRODUCE EXACTLY, which should not happen: read the "
            "numbers above before trusting either path, and please report it as a bitfold bug."
        )
    elif noisy:
        worst = max(noisy.values(), key=lambda v: v["max_difference"])
        names = ", ".join(noisy)
        lines.append(
            f"THE USUAL FOLD IS NON-DETERMINISTIC HERE: {names} gave results that differed "
            f"in up to {worst['differed']} of {worst['repeats']} repeats (largest difference "
            f"{worst['max_difference']:.3e}) — the same additions in a different order."
        )
        diverged = [k for k, v in q4.items() if not v["bit_identical"]]
        if diverged:
            lines.append(
                f"Training with {', '.join(diverged)} gave two different models from the same seed."
            )
    elif rep.get("skipped_baselines"):
        lines.append(
            "THE FOLDS MEASURED HERE WERE DETERMINISTIC, but PyTorch's were not measured "
            "(see question 1): install torch and rerun before concluding anything."
        )
    else:
        lines.append(
            "THE USUAL FOLDS WERE DETERMINISTIC IN EVERY REPEAT HERE, so there is nothing for "
            "bitfold to fix on this machine; if two runs still differ, something else varies: "
            "record both runs and compare them to find what."
        )
    if fixed_ok:
        lines.append(
            f"bitfold's exact fold (correctly rounded) and ordered fold were bit-identical in "
            f"every "
            f"repeat and in both training runs. exact costs {exact_ratio:.2f}x {base} per call "
            f"({extra_ms:+.3f} ms, {share:+.1%} of one forward matmul)."
        )
    if rep["config"]["device"] == "cpu":
        lines.append(
            "This run used the CPU only, so it says nothing about GPU atomics, whose order "
            "changes from launch to launch; rerun with --device cuda on a machine with a GPU. "
            "The exact fold's result does not depend on the device: its digests here are the "
            "ones any backend must give for the same values."
        )
    else:
        lines.append(
            "This run folded on the GPU. The exact fold's bits do not depend on the device: "
            "the same values folded on the CPU give the same digest (bitfold's tests check it)."
        )
    return lines


def _fmt_ms(x: float) -> str:
    return f"{x:9.3f} ms"


def print_report(rep: dict[str, Any], out: Any = None) -> None:
    """The human report: four answers, then the readout."""
    out = out or sys.stdout

    def p(s: str = "") -> None:
        print(s, file=out)

    cfg = rep["config"]
    bar = "=" * 78
    p(bar)
    p("CAN THE FOLD BE MADE BIT-REPRODUCIBLE, AND WHAT DOES IT COST?   (bitfold probe)")
    p(bar)
    mach = summary(rep["machine"])
    p(
        f" backend: {rep['backend']}; {mach['cpu']}, {mach['cores']} cores, "
        f"numba threads {mach['numba_threads']}"
        + (f", torch threads {mach['torch_threads']}" if mach["torch_threads"] else "")
    )
    p(" " + "  ".join(f"{k}={cfg[k]}" for k in ("D", "hid", "K", "reps", "steps", "batch", "lr")))
    p(bar)
    p("\n 1. IS THE USUAL SCATTER NON-DETERMINISTIC HERE?\n")
    for name, r in rep["q1_nondeterminism"].items():
        verdict = (
            (
                f"{r['differed']} of {r['repeats']} repeats differed from the first call "
                f"({r['distinct_results']} distinct results in {r['repeats'] + 1} calls, "
                "largest difference "
                f"{r['max_difference']:.3e})"
            )
            if r["differed"]
            else (f"all {r['repeats']} repeats identical")
        )
        p(f" {name:>24s}: {verdict}")
        if r.get("note"):
            p(f" {'':>24s}  ({r['note']})")
    for line in rep.get("skipped_baselines", []):
        p(f" {'not measured':>24s}: {line}")
    q2 = rep["q2_fixed_order"]
    p("\n 2. ARE BITFOLD'S FIXED FOLDS BIT-IDENTICAL?\n")
    p(
        f" plan built once in {q2['plan_build_s'] * 1e3:.1f} ms "
        f"(first build {q2['plan_build_s_first'] * 1e3:.0f} ms, with compilation); "
        f"it holds {q2['plan_bytes'] / 1e6:.1f} MB"
    )
    for s in BIT_STRATEGIES:
        r = q2[s]
        p(
            f" {s:>8s}: first call {r['first_call_s'] * 1e3:.0f} ms (compiling or loading the "
            "kernel cache, once per process)"
        )
        p(
            f" {'':>8s}  bit-identical across {r['repeats']} repeats: {r['bit_identical']}; "
            f"extra memory {r['extra_bytes'] / 1e6:.1f} MB; "
            f"largest difference from the atomic fold {r['max_difference_from_atomic']:.3e}"
        )
    q3 = rep["q3_cost"]
    p(f"\n 3. WHAT DOES IT COST?   (median per call; ratio to {q3['atomic_baseline']})\n")
    for name, r in q3["per_call"].items():
        p(
            f" {name:>24s} {_fmt_ms(r['median_ms'])}  {r['ratio_to_atomic']:6.2f}x"
            f"   (first call {r['first_call_ms']:.1f} ms)"
        )
    p(f" {'one forward matmul':>24s} {_fmt_ms(q3['forward_matmul_ms'])}  (for scale)")
    p("\n 4. DOES A TRAINING RUN BECOME REPRODUCIBLE?\n")
    for name, r in rep["q4_training"].items():
        extra = "" if r["bit_identical"] else f" (max difference {r['max_difference']:.3e})"
        p(
            f" {name:>16s}: two runs of {cfg['steps']} steps bit-identical: "
            f"{r['bit_identical']}{extra}"
        )
        p(f" {'':>16s}  digests {r['digests'][0][:23]}…  {r['digests'][1][:23]}…")
    p("\n" + bar)
    p(" READOUT")
    p(bar)
    for line in rep["readout"]:
        p(" " + line)


class _Encoder(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        if isinstance(o, np.generic):
            return o.item()
        return super().default(o)


# --------------------------------------------------------------------------- CLI
def configure(parser: argparse.ArgumentParser) -> None:
    """Flags: the seed's configuration, --json, --device."""
    d = ProbeConfig()
    for name in ("D", "hid", "K", "reps", "steps", "batch"):
        parser.add_argument(
            f"--{name}", type=int, default=getattr(d, name), help=f"default {getattr(d, name)}"
        )
    parser.add_argument("--lr", type=float, default=d.lr, help=f"default {d.lr}")
    parser.add_argument("--seed", type=int, default=d.seed, help="random seed (default 0)")
    parser.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="where to fold (default auto: CPU unless a GPU path is available)",
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
    if resolve_device(cfg.device) == "cuda":
        from .probe_cuda import CudaProbe

        rep = CudaProbe(cfg).run()
    else:
        rep = Probe(cfg).run()
    print_report(rep)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rep, fh, indent=2, cls=_Encoder)
        print(f"\n wrote {args.json}")
    return 0
