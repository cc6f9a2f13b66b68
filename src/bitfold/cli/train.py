"""``bitfold train``: train a folded MLP twice per strategy and compare the two runs bit for bit.

The experiment behind the hashed layer's question "does training become
reproducible?", on a real dataset available offline: scikit-learn's bundled
digits (1,797 8x8 images, 10 classes; the ``train`` extra installs
scikit-learn). The model is ``FoldedLinear(64, hidden) -> ReLU ->
FoldedLinear(hidden, 10)`` (:class:`bitfold.torch.FoldedLinear`, hashed
index maps), trained with Adam on a fixed 80/20 split. Every strategy is
trained ``--repeats`` times (default twice) from the same seed:

* ``exact``, ``ordered``, ``atomic``: the weight gradient is folded by
  bitfold's strategy of that name (``bitfold.torch.expand``);
* ``autograd``: the baseline, plain ``v[idx]`` whose backward is PyTorch's
  own ``index_put_(accumulate=True)``; with more than one thread and at
  least 32,768 positions in a map it adds with atomics in the order the
  threads finish.

``--model seed`` trains the hashed layer's synthetic model instead
(:mod:`bitfold.cli.hashed_layer_model`: D=768, hid=4096, K=433, a fixed random batch
of 128, loss ``sum((relu(XW)-1)^2) / (2 batch)``, Adam lr 1e-3; one "epoch"
is one step, ``--steps`` of them), as one ``FoldedLinear`` trained with
``torch.optim.Adam`` through the hashed layer model's training loop.

Reported per run: final loss (mean training loss of the last epoch), test
accuracy, seconds per epoch, and the digest of the final state dict
(:func:`bitfold.digest`); per strategy: whether all runs are bit-identical,
the spread of test accuracy and the largest parameter difference.
Unless it is already set, ``OMP_WAIT_POLICY=PASSIVE`` is set before PyTorch
loads: PyTorch's spinning OpenMP workers otherwise take the cores from
bitfold's Numba kernels (about 10 ms lost per fold on 2 cores). It changes
timings only, never results. ``--json -`` writes the JSON alone to stdout
(the table to stderr).

``--record DIR`` writes one JSON-lines manifest per run
(:mod:`bitfold.repro.manifest`: the digests of every gradient, then every
parameter, at every step) for ``bitfold diff``.

With ``--world-size W`` (or ``--save DIR`` / ``--resume DIR``, or under
``torchrun``) the command trains data-parallel instead
(:mod:`bitfold.cli.parallel`): one model, fixed micro-batches dealt to W
processes, gradients summed exactly over all of them, the same digest for
every W; ``--world-size 1,2,4`` trains once per world size and compares.
Without those options nothing here changes.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DeviceError, FoldError
from . import parallel
from .hashed_layer_model import HASHED_LAYER_STEPS, HashedLayerModel, train
from .json_report import report
from .progress import progress_bar
from .torch_env import passive_openmp_before_torch
from .train_models import digits_data, digits_mlp, hashed_layer

HELP = ("train a folded MLP twice per strategy and check that the runs are bit-identical; "
        "--world-size W: data-parallel, the same bits for every W")

#: the framework's own fold, the baseline every strategy is compared with
BASELINE = "autograd"
DEFAULT_STRATEGIES = ("exact", "ordered", "atomic", BASELINE)

DIGITS_DEFAULTS = {"epochs": 40, "hidden": 512, "buckets": 1024, "batch": 32, "lr": 1e-2}
_SEED = HashedLayerModel()
SEED_DEFAULTS = {"D": _SEED.D, "hid": _SEED.hid, "K": _SEED.K, "batch": _SEED.batch,
                 "lr": _SEED.lr, "steps": HASHED_LAYER_STEPS}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``bitfold train``'s options to ``parser``."""
    d = DIGITS_DEFAULTS
    parser.add_argument(
        "--model", choices=("digits", "seed"), default="digits",
        help="digits: folded MLP on scikit-learn's digits (default); seed: the hashed layer's "
        "synthetic model",
    )
    parser.add_argument("--epochs", type=int, default=d["epochs"],
                        help=f"epochs per run, digits model (default {d['epochs']})")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"optimiser steps per run: seed model (default "
                        f"{SEED_DEFAULTS['steps']}); with --world-size, either model (default "
                        f"{parallel.DEFAULT_STEPS}; a resumed run counts the saved steps)")
    parser.add_argument("--hidden", type=int, default=d["hidden"],
                        help=f"hidden units, digits model (default {d['hidden']})")
    parser.add_argument("--buckets", type=int, default=d["buckets"],
                        help=f"shared parameters per folded layer, digits model "
                        f"(default {d['buckets']})")
    parser.add_argument("--batch", type=int, default=d["batch"],
                        help=f"batch size, digits model (default {d['batch']}); with "
                        "--world-size, the global batch of every step")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"Adam learning rate (default {d['lr']:g} for digits, "
                        f"{SEED_DEFAULTS['lr']:g} for seed)")
    parser.add_argument("--strategies", default=",".join(DEFAULT_STRATEGIES),
                        help=f"comma-separated strategies to train (default "
                        f"{','.join(DEFAULT_STRATEGIES)}; '{BASELINE}' is PyTorch's own fold)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs per strategy (default 2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: PyTorch's default)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="device to train on (default cpu)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the data split, initialisation, shuffling and hash maps")
    parser.add_argument("--json", metavar="PATH", default=None,
                        help="also write the results as JSON to PATH ('-' for stdout)")
    parser.add_argument("--record", metavar="DIR", default=None,
                        help="write a JSON-lines run manifest per run into DIR")
    dp = parser.add_argument_group(
        "data-parallel training (exact gradient sums: the same bits for every world size)")
    dp.add_argument("--world-size", metavar="W[,W...]", default=None,
                    help="train on W local processes (gloo) instead of comparing strategies; "
                    "several, like 1,2,4, train once each and compare their digests. Under "
                    "torchrun, this process is one rank (WORLD_SIZE from the environment)")
    dp.add_argument("--micro-batch", type=int, default=8,
                    help="examples per micro-batch, a divisor of the global batch (default 8); "
                    "a step's micro-batches are dealt round-robin to the ranks")
    dp.add_argument("--reduce", choices=("exact", "plain"), default="exact",
                    help="exact: bitfold.distributed.GradientSum (default); plain: float32 "
                    "torch.distributed.all_reduce, the baseline")
    dp.add_argument("--timeout", type=float, default=300.0,
                    help="seconds a rank waits for the others in a collective before the run "
                    "stops with an error (default 300)")
    dp.add_argument("--save", metavar="DIR", default=None,
                    help="write DIR/checkpoint.pt (model, optimiser, data order, random state) "
                    "at the end, atomically")
    dp.add_argument("--save-every", type=int, default=None, metavar="N",
                    help="with --save, also write the checkpoint every N steps")
    dp.add_argument("--resume", metavar="DIR", default=None,
                    help="continue the run saved in DIR (same options; any world size) up to "
                    "--steps")
    dp.add_argument("--fault", default=None, help=argparse.SUPPRESS)  # RANK:STEP:kill|hang, tests


# -- models ---------------------------------------------------------------------------------------
def _layers(torch: Any) -> tuple[Any, Any]:
    """``FoldedLinear`` and its baseline twin whose gather is plain ``v[idx]``."""
    from ..torch import FoldedLinear

    class AutogradFoldedLinear(FoldedLinear):
        """The baseline: ``v[idx]``, differentiated by PyTorch's own ``index_put_``."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.strategy = BASELINE  # shown by repr(); _gather does not use a bitfold strategy

        def _gather(self, v: Any) -> Any:
            idx = getattr(self, "_idx", None)
            if idx is None or idx.device != v.device:
                idx = torch.from_numpy(self.plan.index.astype(np.int64)).to(v.device)
                self._idx = idx
            return v[idx].reshape(self.plan.shape)

    return FoldedLinear, AutogradFoldedLinear


def _layer_kwargs(strategy: str) -> dict[str, Any]:
    return {} if strategy == BASELINE else {"strategy": strategy}


def _check_positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        val = getattr(args, name)
        if val is not None and val < 1:
            raise FoldError(f"--{name.replace('_', '-')} must be a positive integer; got {val}")


def _strategies(text: str) -> list[str]:
    """The names ``--strategies`` lists, each a bitfold strategy or the baseline; else refused."""
    from ..strategies import strategies as known

    valid = (*known(), BASELINE)
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise FoldError(f"--strategies is empty; name at least one of: {', '.join(valid)}")
    for s in names:
        if s not in valid:
            raise FoldError(
                f"--strategies: unknown strategy {s!r}; choose from: {', '.join(valid)} "
                f"('{BASELINE}' is PyTorch's own fold)"
            )
    return names


def _check_inputs(args: argparse.Namespace) -> None:
    """Refuse a bad seed, learning rate or output path before any training starts."""
    if not 0 <= args.seed < 2**31:
        raise FoldError(f"--seed must be an integer in [0, 2**31); got {args.seed}")
    if args.lr is not None and not (args.lr > 0 and math.isfinite(args.lr)):
        raise FoldError(f"--lr must be positive and finite; got {args.lr}")
    if args.json and args.json != "-":
        try:
            with open(args.json, "a", encoding="utf-8"):
                pass
        except OSError as err:
            raise FoldError(f"cannot write --json {args.json!r}: {err.strerror}") from None


# -- one run --------------------------------------------------------------------------------------
class _Recorder:
    """Opens a manifest per run when ``--record`` is given; otherwise does nothing."""

    def __init__(self, directory: str | None) -> None:
        self.directory = Path(directory) if directory else None
        self._record = None
        if self.directory is not None:
            try:
                from ..repro import manifest
            except ImportError as err:
                raise FoldError(
                    f"--record needs bitfold.repro.manifest, which this installation lacks ({err})"
                ) from None
            self._record = manifest.record
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                raise FoldError(
                    f"--record {directory!r}: cannot make that folder ({err.strerror}); "
                    "give a folder path that can be created or already is a folder"
                ) from None

    def open(self, name: str, meta: dict[str, Any]) -> Any:
        if self._record is None:
            return contextlib.nullcontext(None)
        path = self.directory / f"{name}.jsonl"
        return self._record(str(path), meta)


def _log_step(rec: Any, step: int, model: Any, loss: Any) -> None:
    """Record the model's gradients and parameters in the manifest's one order
    (:func:`bitfold.repro.manifest.model_tensors`), with the loss."""
    if rec is not None:
        rec.log_model(step, model, meta={"loss": float(loss.detach())})


def _run_digits(torch: Any, args: argparse.Namespace, data: dict[str, np.ndarray],
                strategy: str, device: Any, rec: Any, bar: Any) -> dict[str, Any]:
    FoldedLinear, Baseline = _layers(torch)
    cls = Baseline if strategy == BASELINE else FoldedLinear
    kw = _layer_kwargs(strategy)
    model = digits_mlp(torch, cls, args.hidden, args.buckets, args.seed, **kw).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    Xtr = torch.from_numpy(data["Xtr"]).to(device)
    ytr = torch.from_numpy(data["ytr"]).to(device)
    Xte = torch.from_numpy(data["Xte"]).to(device)
    shuffle = np.random.default_rng(args.seed + 1)
    n = Xtr.shape[0]
    step, epoch_seconds, last_loss = 0, [], math.nan
    for _ in range(args.epochs):
        t0 = time.perf_counter()
        perm = torch.from_numpy(shuffle.permutation(n)).to(device)
        total, batches = 0.0, 0
        for start in range(0, n, args.batch):
            sel = perm[start : start + args.batch]
            loss = torch.nn.functional.cross_entropy(model(Xtr[sel]), ytr[sel])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            _log_step(rec, step, model, loss)
            opt.step()
            total += float(loss.detach())
            batches += 1
            step += 1
        epoch_seconds.append(time.perf_counter() - t0)
        last_loss = total / batches
        bar.note(f"loss {last_loss:.4f}")
        bar.tick()
    with torch.no_grad():
        pred = model(Xte).argmax(dim=1).cpu().numpy()
    accuracy = float(np.mean(pred == data["yte"]))
    return {"model": model, "predictions": pred, "final_loss": last_loss, "test_accuracy": accuracy,
            "seconds_per_epoch": float(np.mean(epoch_seconds)), "steps": step}


def _run_seed(torch: Any, args: argparse.Namespace, strategy: str, device: Any, rec: Any,
              bar: Any) -> dict[str, Any]:
    """The hashed layer model (:mod:`.hashed_layer_model`) as one ``FoldedLinear`` (or its autograd
    twin) trained with ``torch.optim.Adam``, through the hashed layer model's one training loop."""
    spec = HashedLayerModel(lr=args.lr, seed=args.seed)
    FoldedLinear, Baseline = _layers(torch)
    cls = Baseline if strategy == BASELINE else FoldedLinear
    layer, X0 = hashed_layer(torch, cls, spec, **_layer_kwargs(strategy))
    model = layer.to(device)
    X = X0.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-8)
    losses: list[Any] = []
    seconds: list[float] = []
    clock = [time.perf_counter()]

    def gradient(v: Any, X: Any) -> Any:  # the layer's backward folds W's gradient into v
        loss = spec.loss(torch.relu(model(X)))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        _log_step(rec, len(losses), model, loss)
        losses.append(loss.detach())
        return v.grad

    def update(v: Any, grad: Any, t: int) -> Any:  # Adam on v.grad, in place
        opt.step()
        return v

    def tick() -> None:
        now = time.perf_counter()
        seconds.append(now - clock[0])
        clock[0] = now
        bar.tick()

    train(model.shared_weight, X, args.steps, gradient, update, tick)
    return {"model": model, "predictions": None, "final_loss": float(losses[-1]),
            "test_accuracy": None, "seconds_per_epoch": float(np.mean(seconds)),
            "steps": args.steps}


# -- comparison and report ------------------------------------------------------------------------
def _max_param_difference(torch: Any, a: Any, b: Any) -> float:
    sa, sb = a.state_dict(), b.state_dict()
    diff = 0.0
    for name in sa:
        d = (sa[name].double() - sb[name].double()).abs().max()
        diff = max(diff, float(d))
    return diff


def _summary(torch: Any, strategy: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    digests = [r["digest"] for r in runs]
    accs = [r["test_accuracy"] for r in runs if r["test_accuracy"] is not None]
    models = [r.pop("model") for r in runs]
    preds = [r.pop("predictions") for r in runs]
    differing = None
    if preds[0] is not None:
        differing = max((int(np.sum(p != preds[0])) for p in preds[1:]), default=0)
    return {
        "strategy": strategy,
        "runs": len(runs),
        "bit_identical": len(set(digests)) == 1,
        "distinct_digests": len(set(digests)),
        "accuracy_difference": (max(accs) - min(accs)) if accs else None,
        "test_predictions_differing": differing,
        "max_param_difference": max(
            (_max_param_difference(torch, models[0], m) for m in models[1:]), default=0.0
        ),
    }


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _print_report(result: dict[str, Any], file: Any = None) -> None:
    cfg = result["config"]
    out = file or sys.stdout

    def emit(*a: Any) -> None:
        print(*a, file=out)

    emit(f"bitfold train: model {cfg['model']}, {cfg['description']}")
    env = result["environment"]
    emit(f"  torch {env['versions']['torch']}, {env['threads']['torch']} thread(s), "
         f"device {cfg['device']}, seed {cfg['seed']}, "
         f"OMP_WAIT_POLICY={result['omp_wait_policy']}")
    emit()
    emit(f"  {'strategy':<9} {'run':>3} {'final loss':>12} {'test acc':>9} {'s/epoch':>8}  "
         "model digest")  # fmt: skip
    for r in result["runs"]:
        if "skipped" in r:
            emit(f"  {r['strategy']:<9} {'':>3} skipped: {r['skipped']}")
            continue
        emit(f"  {r['strategy']:<9} {r['run']:>3} {r['final_loss']:>12.9g} "
             f"{_fmt(r['test_accuracy'], '9.4f'):>9} {r['seconds_per_epoch']:>8.3f}  "
             f"{r['digest'][:23]}...")
    emit()
    emit(f"  {'strategy':<9} {'bit-identical':>13} {'acc. difference':>16} "
         f"{'predictions differing':>22} {'max |param diff|':>17}")
    for s in result["strategies"].values():
        emit(f"  {s['strategy']:<9} {'yes' if s['bit_identical'] else 'NO':>13} "
             f"{_fmt(s['accuracy_difference'], '16.4f'):>16} "
             f"{_fmt(s['test_predictions_differing'], 'd'):>22} "
             f"{s['max_param_difference']:>17.3e}")
    base = result.get("baseline_accuracy_difference")
    if BASELINE in result["strategies"]:
        emit()
        emit(f"  baseline ({BASELINE}, PyTorch's own fold): runs bit-identical: "
             f"{result['strategies'][BASELINE]['bit_identical']}; accuracy difference "
             f"between runs: {_fmt(base, '.4f')}")


def main(args: argparse.Namespace) -> int:
    """Train every strategy ``--repeats`` times; print (and optionally save) the comparison."""
    _check_positive(args, "epochs", "steps", "hidden", "buckets", "batch", "repeats", "threads",
                    "micro_batch", "save_every")
    _check_inputs(args)
    strategies = _strategies(args.strategies)
    # PyTorch's OpenMP workers spin after every parallel region; on a small machine they take
    # the cores from bitfold's Numba kernels (about 10 ms lost per fold on 2 cores). Passive
    # waiting changes no result, only the time; an explicit setting is kept.
    passive_openmp_before_torch()
    if parallel.requested(args):
        return parallel.main(args)
    if args.steps is None:
        args.steps = SEED_DEFAULTS["steps"]
    try:
        import torch
    except ImportError:
        raise FoldError("bitfold train needs PyTorch (pip install 'bitfold[torch]')") from None
    threads_before = torch.get_num_threads()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        return _main(torch, args, strategies)
    finally:
        torch.set_num_threads(threads_before)  # cli.main may be called from a longer program


def _main(torch: Any, args: argparse.Namespace, strategies: list[str]) -> int:
    from .._version import __version__
    from ..repro.digest import digest
    from ..repro.fingerprint import fingerprint

    if args.device == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda: PyTorch sees no CUDA device here; use --device cpu")
    device = torch.device(args.device)
    if args.lr is None:
        args.lr = DIGITS_DEFAULTS["lr"] if args.model == "digits" else SEED_DEFAULTS["lr"]
    recorder = _Recorder(args.record)

    if args.model == "digits":
        data = digits_data(args.seed)
        description = (
            f"scikit-learn digits ({len(data['ytr'])} train / {len(data['yte'])} test), "
            f"MLP 64-{args.hidden}-10 of FoldedLinear layers with {args.buckets} buckets each, "
            f"{args.epochs} epochs, batch {args.batch}, Adam lr {args.lr}"
        )
        length = args.epochs
    else:
        c = SEED_DEFAULTS
        description = (
            f"hashed layer model (D={c['D']}, hid={c['hid']}, K={c['K']}, batch "
            f"{c['batch']}), {args.steps} steps (one step per 'epoch'), Adam lr {args.lr}"
        )
        length = args.steps
    config = {
        "model": args.model, "description": description, "device": args.device,
        "seed": args.seed, "repeats": args.repeats, "strategies": strategies, "lr": args.lr,
    }
    if args.model == "digits":
        config.update(epochs=args.epochs, hidden=args.hidden, buckets=args.buckets,
                      batch=args.batch)
    else:
        config.update(steps=args.steps, **{k: v for k, v in SEED_DEFAULTS.items()
                                           if k not in ("steps", "lr")})

    runs: list[dict[str, Any]] = []
    summaries: dict[str, Any] = {}
    for strategy in strategies:
        done: list[dict[str, Any]] = []
        for r in range(1, args.repeats + 1):
            meta = {"command": "bitfold train", "strategy": strategy, "run": r, **config}
            try:
                with (
                    progress_bar(length, f"{strategy} run {r}/{args.repeats}") as bar,
                    recorder.open(f"{args.model}-{strategy}-run{r}", meta) as rec,
                ):
                    if args.model == "digits":
                        out = _run_digits(torch, args, data, strategy, device, rec, bar)
                    else:
                        out = _run_seed(torch, args, strategy, device, rec, bar)
            except DeviceError as err:
                runs.append({"strategy": strategy, "run": r, "skipped": str(err)})
                break
            out.update(strategy=strategy, run=r, digest=digest(out["model"].state_dict()))
            if args.record:
                out["manifest"] = str(Path(args.record) / f"{args.model}-{strategy}-run{r}.jsonl")
            done.append(out)
        if done:
            summaries[strategy] = _summary(torch, strategy, done)
            runs.extend(done)

    result = {
        "bitfold": __version__,
        "environment": fingerprint(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "config": config,
        "runs": runs,
        "strategies": summaries,
        "baseline_accuracy_difference": (
            summaries[BASELINE]["accuracy_difference"] if BASELINE in summaries else None
        ),
    }
    report(result, _print_report, args.json)
    return 0
