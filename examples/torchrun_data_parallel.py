"""Exact data-parallel training with torchrun: the same model on 1, 2 or 4 processes.

Each step's global batch is cut into micro-batches of a fixed size, dealt
round-robin to the processes. A micro-batch's gradient has the same bits
whichever process computes it (one thread each), so what decides whether the
world size changes the model is how those gradients are summed:

* ``--reduce exact`` (the default): ``bitfold.distributed.GradientSum`` adds
  each micro-batch's gradient exactly, sums the processes' sums with an exact
  all-reduce and rounds once: the same parameter digest on 1, 2 or 4
  processes (and on any other number);
* ``--reduce plain``: ``.grad`` accumulated in float32, then
  ``torch.distributed.all_reduce``: the float sums are grouped by process
  (``((g0 + g1) + g2) + g3`` on one, ``(g0 + g2) + (g1 + g3)`` on two), so the
  digest changes with the world size;
* ``--reduce ddp``: ``DistributedDataParallel`` with
  ``bitfold.distributed.exact_allreduce_hook``, the usual DDP step: each
  process runs its share of the batch in one forward with a mean loss, and
  the hook averages the processes' gradients exactly (one rounding). Each
  share's gradient is a float sum over its examples, so the digest depends
  on how the batch is split: with one micro-batch a process (4 processes
  here) and a power-of-two micro-batch size it is the ``--reduce exact``
  digest; otherwise use ``GradientSum`` for the same bits on any world size.

``--reduce exact,plain,ddp`` trains once each way, from the same start.
The model has a hashed layer (``bitfold.torch.FoldedLinear``): its shared
weights are folded locally and reduced like any other gradient.

Run (gloo on the CPU; only rank 0 prints)::

    torchrun --nproc_per_node=2 examples/torchrun_data_parallel.py
    torchrun --nproc_per_node=4 examples/torchrun_data_parallel.py
    python examples/torchrun_data_parallel.py                     # one process
    torchrun --nproc_per_node=2 examples/torchrun_data_parallel.py --reduce exact,plain
    torchrun --nproc_per_node=4 examples/torchrun_data_parallel.py --reduce exact,plain,ddp

and compare the ``digest`` lines. ``--small`` trains a smaller model for fewer
steps. Needs ``torch`` with ``torch.distributed`` (gloo).
"""

from __future__ import annotations

import argparse
import os
import socket
import time

# One thread a process for bitfold's kernels too (Numba's pool): the processes fill the cores,
# and a pool of threads competing for them costs more than it gives. The bits do not change.
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import torch
import torch.distributed as dist

import bitfold
from bitfold.cli.launch import leave
from bitfold.distributed import GradientSum, exact_allreduce_hook
from bitfold.torch import FoldedLinear


def join_group() -> tuple[int, int]:
    """Join torchrun's process group; run as a group of one when started without torchrun."""
    if "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial parameters on every rank
    return torch.nn.Sequential(
        torch.nn.Linear(args.features, args.hidden), torch.nn.Tanh(),
        FoldedLinear(args.hidden, args.hidden, buckets=args.buckets, seed=1), torch.nn.ReLU(),
        torch.nn.Linear(args.hidden, args.classes),
    )


def micro_batches(args: argparse.Namespace, step: int):
    """The step's micro-batches, the same on every rank (each rank uses its own)."""
    g = torch.Generator().manual_seed(1000 + step)
    n = args.micro_batches * args.micro_batch
    x = torch.randn(n, args.features, generator=g)
    y = torch.randint(0, args.classes, (n,), generator=g)
    return list(zip(x.split(args.micro_batch), y.split(args.micro_batch), strict=True))


SIZES = {"full": {"steps": 20, "hidden": 256, "buckets": 2048},
         "small": {"steps": 10, "hidden": 32, "buckets": 100}}


def train(args: argparse.Namespace, reduce: str, rank: int, world: int) -> tuple[str, float]:
    """Train from the same start with one way of summing the gradients: the parameters' digest
    and the time of a step after the first (which compiles bitfold's kernels on first use)."""
    model = make_model(args)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = args.micro_batches * args.micro_batch
    if reduce == "exact":
        grads = GradientSum(model.parameters(), timeout=120)
    elif reduce == "ddp":
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(None, exact_allreduce_hook)
    warm = time.perf_counter()
    for step in range(args.steps):
        if step == 1:
            warm = time.perf_counter()
        mine = micro_batches(args, step)[rank::world]  # round-robin: micro-batch m to rank m % W
        opt.zero_grad()
        if reduce == "ddp":  # the usual DDP step: this rank's share in one forward, a mean loss
            x, y = torch.cat([x for x, _ in mine]), torch.cat([y for _, y in mine])
            torch.nn.functional.cross_entropy(ddp(x), y).backward()  # the hook averages
        else:
            for x, y in mine:
                torch.nn.functional.cross_entropy(model(x), y, reduction="sum").backward()
                if reduce == "exact":
                    grads.add()  # exact running sum of .grad; .grad is cleared
        if reduce == "exact":
            grads.reduce(mean_over=batch)  # exact sum over every rank, divided by B once
        elif reduce == "plain":
            for prm in model.parameters():  # .grad summed in float32, micro-batch by micro-batch
                if prm.grad is None:  # a rank without micro-batches this step
                    prm.grad = torch.zeros_like(prm)
                dist.all_reduce(prm.grad)
                prm.grad /= batch
        opt.step()
    per_step = (time.perf_counter() - warm) / max(args.steps - 1, 1)
    return bitfold.digest(model.state_dict()), per_step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reduce", default="exact",
                   help="exact, plain or ddp, or several separated by commas (default: exact)")
    p.add_argument("--small", action="store_true", help="a smaller model, fewer steps (the tests)")
    p.add_argument("--steps", type=int, help="default 20 (--small: 10)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches a step")
    p.add_argument("--micro-batch", type=int, default=16, help="examples a micro-batch")
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, help="default 256 (--small: 32)")
    p.add_argument("--buckets", type=int, help="shared weights of the hashed layer (default "
                   "2048; --small: 100)")
    p.add_argument("--classes", type=int, default=10)
    args = p.parse_args()
    for name, value in SIZES["small" if args.small else "full"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    modes = args.reduce.split(",")
    for mode in modes:
        if mode not in ("exact", "plain", "ddp"):
            p.error(f"--reduce takes exact, plain or ddp (or a list of them); got {mode!r}")

    torch.set_num_threads(1)  # the thread count can change a micro-batch's bits: fix it
    rank, world = join_group()
    if "ddp" in modes and args.micro_batches % world:
        p.error(f"--reduce ddp gives every process an equal share: --micro-batches "
                f"({args.micro_batches}) must be a multiple of the {world} processes")
    if rank == 0:
        print(f"world size {world}: {args.steps} steps of {args.micro_batches} micro-batches x "
              f"{args.micro_batch} examples")
    for mode in modes:
        digest, per_step = train(args, mode, rank, world)
        if rank == 0:
            print(f"--reduce {mode:<6} digest {digest}  ({per_step * 1e3:.1f} ms a step after "
                  "the first)")
    dist.destroy_process_group()
    leave(0)  # no interpreter teardown: a gloo thread can abort it after all the work is done


if __name__ == "__main__":
    main()
