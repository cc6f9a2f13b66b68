"""``bitfold train --world-size W``: data-parallel training whose bits do not depend on W.

The model (digits or ``--model seed``) trains for ``--steps`` optimiser
steps; each step's global batch (``--batch``; the hashed layer model's fixed 128
rows) is cut into micro-batches of ``--micro-batch`` examples, dealt
round-robin to the W processes (:mod:`bitfold.cli.parallel_rank`), and
their gradients are summed exactly over every process
(:class:`bitfold.distributed.GradientSum`): the digest of the final model is
the same for every world size. ``--reduce plain`` sums float32 gradients
with ``torch.distributed.all_reduce`` instead (the baseline).

``--world-size 1,2,4`` trains once per world size, one after the other, and
compares the digests; each run starts its processes on this machine
(:mod:`bitfold.cli.launch`). Under ``torchrun`` (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` set) this process is one rank of the run
and rank 0 prints the readout. ``--save DIR`` writes a checkpoint
(:mod:`bitfold.cli.checkpoints`) at the end and every ``--save-every``
steps; ``--resume DIR`` continues it, on any world size, to ``--steps``.
``--timeout`` bounds every collective: a rank that dies or hangs stops the
run with an error, exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from ..errors import FoldError
from .checkpoints import resume_state
from .data_order import micro_batch_shares
from .hashed_layer_model import HashedLayerModel
from .json_report import report
from .launch import leave, run_local, torchrun_rank
from .parallel_rank import RankJob, run_rank

#: ``--steps`` when it is not given, for either model.
DEFAULT_STEPS = 100
REDUCE_NAMES = {"exact": "exact gradient sums (bitfold.distributed.GradientSum)",
                "plain": "plain float32 torch.distributed.all_reduce"}  # fmt: skip


def requested(args: argparse.Namespace) -> bool:
    """Whether this ``bitfold train`` is a data-parallel run rather than the strategy comparison."""
    return bool(args.world_size or args.save or args.resume) or torchrun_rank() is not None


def _world_sizes(text: str | None, launched: tuple[int, int] | None) -> list[int]:
    sizes: list[int] = []
    for part in (text or "").split(","):
        if not part.strip():
            continue
        try:
            sizes.append(int(part))
        except ValueError:
            raise FoldError(f"--world-size takes positive integers, like 2 or 1,2,4; got {text!r}"
                            ) from None  # fmt: skip
    if any(w < 1 for w in sizes):
        raise FoldError(f"--world-size takes positive integers, like 2 or 1,2,4; got {text!r}")
    if launched is not None:
        if sizes and sizes != [launched[1]]:
            raise FoldError(
                f"--world-size {text} disagrees with WORLD_SIZE={launched[1]} set by the launcher "
                "(torchrun): give the total number of processes, or leave --world-size out"
            )
        return [launched[1]]
    return sizes or [1]


def _config(args: argparse.Namespace) -> dict[str, Any]:
    """The settings that define the run's bits (a checkpoint must match them)."""
    cfg: dict[str, Any] = {"model": args.model, "lr": args.lr, "seed": args.seed,
                           "micro_batch": args.micro_batch, "reduce": args.reduce,
                           "threads": args.threads or 1}  # fmt: skip
    if args.model == "digits":
        cfg.update(hidden=args.hidden, buckets=args.buckets, batch=args.batch)
    else:
        s = HashedLayerModel()
        cfg.update(D=s.D, hid=s.hid, K=s.K, batch=s.batch)
    if cfg["batch"] % args.micro_batch:
        which = "--batch" if args.model == "digits" else "the hashed layer model's batch"
        raise FoldError(
            f"the global batch ({which}, {cfg['batch']}) must be a multiple of --micro-batch "
            f"{args.micro_batch}"
        )
    if args.model == "digits" and cfg["batch"] > 1437:
        raise FoldError(f"--batch {cfg['batch']} is more than the 1437 training images")
    return cfg


def _check(args: argparse.Namespace, worlds: list[int]) -> None:
    if args.device != "cpu":
        raise FoldError("--world-size trains on the CPU (gloo); use --device cpu")
    if args.record:
        raise FoldError("--record belongs to the strategy comparison; leave it out with "
                        "--world-size, --save or --resume")  # fmt: skip
    if not 0 < args.timeout < float("inf"):
        raise FoldError(
            f"--timeout must be a positive finite number of seconds; got {args.timeout}"
        )
    if args.save and len(worlds) > 1:
        raise FoldError("--save takes one --world-size (the checkpoint of one run)")
    if args.fault:
        parts = args.fault.split(":")
        if len(parts) != 3 or not all(p.isdigit() for p in parts[:2]) or parts[2] not in (
                "kill", "hang"):
            raise FoldError(f"--fault takes RANK:STEP:kill or RANK:STEP:hang; got {args.fault!r}")


def _description(cfg: dict[str, Any]) -> str:
    if cfg["model"] == "digits":
        return (f"scikit-learn digits (1437 train / 360 test), MLP 64-{cfg['hidden']}-10 of "
                f"FoldedLinear layers with {cfg['buckets']} buckets each")  # fmt: skip
    return (f"hashed layer model (D={cfg['D']}, hid={cfg['hid']}, K={cfg['K']}, batch "
            f"{cfg['batch']})")  # fmt: skip


def _one_rank(rank: int, world_size: int, job: RankJob) -> dict[str, Any]:
    """This process as one rank of a torchrun launch; a failure ends the process at once.

    After a failed collective the process group is broken, and tearing it down at exit may hang
    or abort; so the error is printed here and the process leaves with status 2 right away.
    """
    try:
        return run_rank(rank, world_size, "env://", job)
    except FoldError as err:
        print(f"bitfold train: error: rank {rank} of {world_size}: {err}", file=sys.stderr)
        leave(2)


def _summary(results: list[dict[str, Any]], cfg: dict[str, Any],
             seconds: float | None) -> dict[str, Any]:
    """One world size's row: rank 0's readout, every rank's share, whether the ranks agree."""
    results = sorted(results, key=lambda r: r["rank"])
    head = results[0]
    world = head["world_size"]
    return {
        "world_size": world, "digest": head["digest"],
        "ranks_agree": all(r["ranks_agree"] for r in results),
        "micro_batches_per_rank": micro_batch_shares(cfg["batch"] // cfg["micro_batch"], world),
        "final_loss": head["final_loss"], "test_accuracy": head["test_accuracy"],
        "seconds_per_step": head["seconds_per_step"], "seconds": seconds,
        "start_step": head["start_step"], "steps": head["steps"], "checkpoint": head["checkpoint"],
    }  # fmt: skip


def _print(result: dict[str, Any], out: Any) -> None:
    cfg, runs = result["config"], result["runs"]

    def emit(*a: Any) -> None:
        print(*a, file=out)

    sizes = ", ".join(str(r["world_size"]) for r in runs)
    emit(f"bitfold train: model {cfg['model']}, data-parallel on {sizes} process(es) (gloo), "
         f"{REDUCE_NAMES[cfg['reduce']]}")  # fmt: skip
    emit(f"  {cfg['description']}")
    start = runs[0]["start_step"]
    resumed = f" (resumed at step {start} from {cfg['resume']})" if cfg["resume"] else ""
    emit(f"  {cfg['steps']} steps{resumed}, global batch {cfg['batch']} = "
         f"{cfg['batch'] // cfg['micro_batch']} micro-batches of {cfg['micro_batch']}, Adam lr "
         f"{cfg['lr']:g}, seed {cfg['seed']}, {cfg['threads']} thread(s) per rank, torch "
         f"{result['environment']['versions'].get('torch')}")  # fmt: skip
    emit()
    emit(f"  {'world size':>10}  {'micro-batches per rank':>22}  {'final loss':>12}  "
         f"{'test acc':>8}  {'s/step':>6}  model digest")  # fmt: skip
    for r in runs:
        acc = "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
        share = "+".join(map(str, r["micro_batches_per_rank"]))
        share = share if len(share) <= 22 else share[:19] + "..."
        agree = "" if r["ranks_agree"] else "  (ranks disagree!)"
        emit(f"  {r['world_size']:>10}  {share:>22}  {r['final_loss']:>12.9g}  {acc:>8}  "
             f"{r['seconds_per_step']:>6.3f}  {r['digest']}{agree}")  # fmt: skip
    emit()
    n = result["distinct_digests"]
    if len(runs) > 1:
        emit(f"  one digest for every world size: {'yes' if n == 1 else 'NO'} ({n} distinct of "
             f"{len(runs)} runs)")  # fmt: skip
    if runs[-1]["checkpoint"]:
        emit(f"  checkpoint at step {cfg['steps']}: {runs[-1]['checkpoint']}")
        emit("  (model digest: bitfold.digest of the model's state dict; `bitfold digest --model "
             "CHECKPOINT` prints it, plain `bitfold digest` hashes every tensor in the file)")


def main(args: argparse.Namespace) -> int:
    """Train on every ``--world-size`` (or as one rank under torchrun); print the readout."""
    from .._version import __version__
    from ..repro.fingerprint import fingerprint

    try:
        import torch.distributed as dist
    except ImportError:
        raise FoldError("bitfold train needs PyTorch (pip install 'bitfold[torch]')") from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise FoldError("--world-size needs torch.distributed with the gloo backend, which this "
                        "PyTorch build lacks")  # fmt: skip
    launched = torchrun_rank()
    worlds = _world_sizes(args.world_size, launched)
    _check(args, worlds)
    if args.lr is None:
        args.lr = 1e-2 if args.model == "digits" else HashedLayerModel().lr
    cfg = _config(args)
    steps = args.steps or DEFAULT_STEPS
    job = RankJob(config=cfg, steps=steps, timeout=float(args.timeout), save=args.save,
                  save_every=args.save_every, resume=args.resume, fault=args.fault)  # fmt: skip
    if args.resume and launched is None:  # refuse a wrong checkpoint before starting processes
        import torch

        resume_state(torch, args.resume, cfg, steps)
    runs = []
    if launched is not None:
        result = _one_rank(launched[0], launched[1], job)
        if launched[0] != 0:
            leave(0)  # this process was one rank: see launch.leave
        runs.append(_summary([result], cfg, None))
    else:
        for world in worlds:
            t0 = time.perf_counter()
            results = run_local(run_rank, world, job, float(args.timeout))
            runs.append(_summary(results, cfg, time.perf_counter() - t0))
    digests = {r["digest"] for r in runs}
    result = {
        "bitfold": __version__, "environment": fingerprint(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "config": {**cfg, "description": _description(cfg), "steps": steps,
                   "world_sizes": worlds, "timeout": float(args.timeout), "save": args.save,
                   "resume": args.resume, "launcher": "torchrun" if launched else "local"},
        "runs": runs, "distinct_digests": len(digests), "identical": len(digests) == 1,
    }  # fmt: skip
    report(result, _print, args.json)
    if launched is not None:
        leave(0)
    return 0
