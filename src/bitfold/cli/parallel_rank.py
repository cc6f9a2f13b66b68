"""One rank of a data-parallel ``bitfold train`` run: its micro-batches, the exact sum, the steps.

:func:`run_rank` joins the gloo process group, checks that every rank was
started with the same options, builds the task (:mod:`bitfold.cli.parallel_task`),
resumes from a checkpoint when asked (rank 0 reads it and sends it to the
others, so only rank 0 needs the file), then trains step by step:

1. the step's global batch comes from the data order; its micro-batches
   (``--micro-batch`` examples each) are dealt round-robin
   (:func:`bitfold.cli.data_order.deal`);
2. this rank runs forward and backward on each of its micro-batches; with
   ``reduce="exact"`` each gradient goes into a
   :class:`bitfold.distributed.GradientSum`, and ``reduce(mean_over=batch)``
   leaves every ``.grad`` the correctly rounded mean over the global batch,
   the same bits on every rank and for every world size; with
   ``reduce="plain"`` (the baseline) the gradients accumulate in float32
   ``.grad`` and ``torch.distributed.all_reduce`` sums them over the ranks;
3. Adam steps; rank 0 saves a checkpoint every ``save_every`` steps and at
   the end (:mod:`bitfold.cli.checkpoints`).

Every collective waits at most ``timeout`` seconds: a rank that dies or
hangs makes the others raise :class:`bitfold.errors.DistributedError`.
``fault`` (``"RANK:STEP:kill"`` or ``"RANK:STEP:hang"``, the hidden option
``--fault``) makes one rank die or hang before its exact sum at one step, to
test exactly that.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..errors import DistributedError, FoldError
from . import checkpoints
from .data_order import deal
from .progress import progress_bar


@dataclass(frozen=True)
class RankJob:
    """What every rank runs (picklable: it travels to the ranks' processes)."""

    config: dict[str, Any]  # defines the run's bits; a checkpoint must match it
    steps: int  # train until this step count (a resumed run counts the saved steps)
    timeout: float
    save: str | None = None
    save_every: int | None = None
    resume: str | None = None
    fault: str | None = None
    progress: bool = True


def _fingerprint(job: RankJob) -> int:
    text = json.dumps({"config": job.config, "steps": job.steps, "resume": job.resume},
                      sort_keys=True)  # fmt: skip
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")


def _collective(what: str, job: RankJob, call: Callable[[], Any]) -> Any:
    """Run a torch.distributed collective; its failure (gloo's timeout too) is a clear error."""
    import torch.distributed as dist

    try:
        return call()
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DistributedError(
            f"{what} failed on rank {dist.get_rank()} of {dist.get_world_size()} (collectives "
            f"wait at most {job.timeout:g} s): a rank died, hung or left the group ({first})"
        ) from err


def _agree(dist: Any, torch: Any, job: RankJob) -> None:
    """Refuse to train when the ranks were started with different options (launched by hand)."""
    mine = _fingerprint(job)
    seen = torch.tensor([mine, -mine], dtype=torch.int64)
    _collective("the options check", job, lambda: dist.all_reduce(seen, op=dist.ReduceOp.MAX))
    if int(seen[0]) != mine or int(seen[1]) != -mine:
        raise DistributedError(
            f"rank {dist.get_rank()} of {dist.get_world_size()} was started with different options "
            "from another rank (model, sizes, batch, micro-batch, learning rate, seed, reduce, "
            "threads, --steps or --resume): start every rank with the same options"
        )


def _same_on_every_rank(dist: Any, torch: Any, job: RankJob, text: str) -> bool:
    """Whether every rank holds the same ``text`` (here: the final model's digest)."""
    mine = int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")
    seen = torch.tensor([mine, -mine], dtype=torch.int64)
    _collective("the digest check", job, lambda: dist.all_reduce(seen, op=dist.ReduceOp.MAX))
    return int(seen[0]) == mine and int(seen[1]) == -mine


def _parse_fault(fault: str | None) -> tuple[int, int, str] | None:
    if not fault:
        return None
    rank, step, what = fault.split(":")
    return int(rank), int(step), what


def _inject(fault: tuple[int, int, str] | None, rank: int, step: int) -> None:
    """Die or hang here when ``fault`` names this rank and step."""
    if fault is None or fault[:2] != (rank, step):
        return
    if fault[2] == "kill":
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))
    while True:  # "hang": until the launcher stops this process
        time.sleep(3600)


def _resume(dist: Any, torch: Any, job: RankJob, rank: int) -> dict[str, Any]:
    """Rank 0 reads and checks the checkpoint and broadcasts it (or its refusal) to every rank."""
    box: list[Any] = [None]
    if rank == 0:
        try:
            box[0] = checkpoints.resume_state(torch, job.resume, job.config, job.steps)
        except FoldError as err:
            box[0] = str(err)
    _collective("the checkpoint broadcast", job, lambda: dist.broadcast_object_list(box, src=0))
    if isinstance(box[0], str):
        raise FoldError(box[0] if rank == 0 else f"rank 0 could not resume: {box[0]}")
    return box[0]


def _plain_reduce(dist: Any, torch: Any, params: list[Any], job: RankJob) -> None:
    """The baseline: float32 ``.grad`` summed by ``all_reduce``, then divided by the batch."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grad = p.grad
        _collective("the plain all-reduce", job, lambda g=grad: dist.all_reduce(g))
        grad.div_(job.config["batch"])


def _checkpoint(torch: Any, job: RankJob, task: Any, opt: Any, step: int, world_size: int) -> str:
    """Rank 0's checkpoint after ``step`` steps: model, optimiser, data order, random state."""
    from ..repro.digest import digest

    sd = task.model.state_dict()
    return str(checkpoints.save(torch, job.save, {
        "config": job.config, "step": step, "world_size": world_size, "model": sd,
        "optimizer": opt.state_dict(), "data": task.order.state_dict(),
        "torch_rng": torch.get_rng_state(), "digest": digest(sd),
    }))  # fmt: skip


def run_rank(rank: int, world_size: int, init_method: str, job: RankJob) -> dict[str, Any]:
    """Train this rank's share of every step; return its digest (and rank 0's readout)."""
    import torch
    import torch.distributed as dist

    from ..distributed import GradientSum
    from ..repro.digest import digest
    from .parallel_task import build

    cfg = job.config
    torch.set_num_threads(int(cfg["threads"]))
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=job.timeout))  # fmt: skip
    _agree(dist, torch, job)
    task = build(torch, cfg)
    params = list(task.model.parameters())
    opt = torch.optim.Adam(params, lr=cfg["lr"])
    start = 0
    if job.resume:
        state = _resume(dist, torch, job, rank)
        task.model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        task.order.load_state_dict(state["data"])
        torch.set_rng_state(state["torch_rng"])
        start = int(state["step"])
    exact = GradientSum(params, timeout=job.timeout) if cfg["reduce"] == "exact" else None
    micro = int(cfg["micro_batch"])
    mine = deal(cfg["batch"] // micro, world_size, rank)
    fault = _parse_fault(job.fault)
    saving = bool(job.save) and rank == 0
    saved, saved_at = None, None
    t0 = time.perf_counter()
    with progress_bar(job.steps - start, f"world size {world_size}",
                      enabled=job.progress and rank == 0) as bar:  # fmt: skip
        for step in range(start, job.steps):
            examples = torch.from_numpy(task.order.step(step))
            for m in mine:
                task.loss(examples[m * micro : (m + 1) * micro]).backward()
                if exact is not None:
                    exact.add()
            _inject(fault, rank, step)
            if exact is not None:
                exact.reduce(mean_over=cfg["batch"])
            else:
                _plain_reduce(dist, torch, params, job)
            opt.step()
            opt.zero_grad(set_to_none=True)
            bar.tick()
            if saving and job.save_every and (step + 1) % job.save_every == 0:
                saved, saved_at = _checkpoint(torch, job, task, opt, step + 1, world_size), step + 1
    seconds = time.perf_counter() - t0
    if saving and saved_at != job.steps:
        saved = _checkpoint(torch, job, task, opt, job.steps, world_size)
    final = digest(task.model.state_dict())
    result: dict[str, Any] = {
        "rank": rank, "world_size": world_size, "digest": final,
        "ranks_agree": _same_on_every_rank(dist, torch, job, final),
        "start_step": start, "steps": job.steps, "micro_batches_per_step": len(mine),
        "seconds_per_step": seconds / max(job.steps - start, 1),
    }  # fmt: skip
    if rank == 0:
        result.update(task.readout(), checkpoint=saved)
    dist.destroy_process_group()
    return result
