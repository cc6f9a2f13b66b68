"""The exact all-reduce against a float32 ``dist.all_reduce``, and a data-parallel step.

    python benchmarks/allreduce.py --repeats 21 --step-repeats 21 --out DIR/run1.json

**All-reduce.** For each world size (local gloo processes) and gradient size,
every rank holds an ordinary float32 gradient (normal values times 1e-3, its
own seed) and three steps are timed, alternating, in the same processes,
median over the repeats:

* ``float32``: ``dist.all_reduce`` of the gradient (SUM, on a copy: it works
  in place) — what DDP does;
* ``exact``: :func:`bitfold.distributed.exact_all_reduce` of the tensor — its
  bounds and words read from the array's bits, bounds (MAX), words (SUM), the
  signs of zero sums only where they travel (MIN), every element rounded once;
* ``exact sum``: the gradient added into a :class:`bitfold.dense.DenseSum`
  (kept between steps and reset, as :class:`bitfold.distributed.GradientSum`
  does), then ``exact_all_reduce`` of the sum.

**Step.** A data-parallel training step of an MLP on 2 processes:
forward, backward and the gradients' all-reduce, with
``DistributedDataParallel`` (float all-reduce of buckets, overlapped with the
backward, averaged) against :class:`bitfold.distributed.GradientSum`
(``add`` after the backward, ``reduce(mean_over=world)``: exact), alternating.
Two more steps show where the time goes: ``compute`` (forward and backward,
no communication: the floor of any step) and ``DistributedDataParallel`` with
:func:`bitfold.distributed.exact_allreduce_hook` (each bucket's exact mean,
reduced when DDP hands it over).

Each rank runs one thread (torch and Numba): the ranks share the machine's
cores, as the processes of a data-parallel job do. Bytes are those of the
messages handed to the collectives (a ring all-reduce moves ``2 (W - 1) / W``
times them on each link, for both). The tables mark the project's goals: the exact
all-reduce at most 3x the time of the float32 one and 4x its bytes, and the step with
``GradientSum`` at most 1.3x the DDP step (``benchmarks/bench_goals.py --allreduce``
judges the JSON).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

BYTES_GOAL, TIME_GOAL, STEP_GOAL = 4.0, 3.0, 1.3
WIDTHS = (1024, 2048, 2048, 1024)  # the step's MLP: 8.4M parameters
#: The wire's block classes, narrowest first (bitfold.dense): the table counts each.
CLASSES = ("half", "thirds", "narrow", "wide", "wider", "full")
BATCH = 64


def _timed(steps: dict, repeats: int, dist) -> dict[str, float]:
    """Median seconds of each step, the steps alternating (order flipped every round)."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for i in range(repeats + 1):
        order = list(steps.items())[:: 1 - 2 * (i % 2)]
        for name, step in order:
            dist.barrier()
            t0 = time.perf_counter()
            step()
            dist.barrier()
            if i:  # the first round warms up (Numba's cache, the allocator)
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def _leave() -> None:
    """End a rank whose record is written, skipping the interpreter's teardown: a normal exit
    can abort when a gloo worker thread of torch releases its last collective then."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _rank(rank: int, world: int, init: str, n: int, repeats: int, out: str) -> None:
    import numba
    import torch
    import torch.distributed as dist

    from bitfold.dense import DenseSum, wire_layout
    from bitfold.distributed import exact_all_reduce

    torch.set_num_threads(1)  # one thread per rank for both (the ranks share the cores)
    numba.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    g = torch.from_numpy(
        (np.random.default_rng(rank).standard_normal(n) * 1e-3).astype(np.float32)
    )
    kept = DenseSum((n,))  # kept between steps, as GradientSum keeps its sums
    medians = _timed({
        "float32": lambda: dist.all_reduce(g.clone()),
        "exact": lambda: exact_all_reduce(g),
        "exact_sum": lambda: exact_all_reduce(kept.reset().add(g.numpy())),
    }, repeats, dist)  # fmt: skip
    s = DenseSum((n,)).add(g.numpy())
    bounds = torch.from_numpy(s.bounds())
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    layout = wire_layout(bounds.numpy(), n, world, s.format.limbs)
    from bitfold.kernels import dense as wire

    # the classes this tree has (an A/B against older code runs this script on older trees)
    codes = {name: getattr(wire, name.upper()) for name in CLASSES if hasattr(wire, name.upper())}
    counts = np.bincount(layout.classes, minlength=max(codes.values()) + 1)
    if rank == 0:
        record = {
            "processes": world,
            "elements": n,
            "float32_bytes": 4 * n,
            "exact_bytes": int(bounds.numel() * bounds.element_size() + layout.words * 8),
            "block_classes": {name: int(counts[code]) for name, code in codes.items()},
            "float32_ms": 1e3 * medians["float32"],
            "exact_ms": 1e3 * medians["exact"],
            "exact_sum_ms": 1e3 * medians["exact_sum"],
            "repeats": repeats,
        }
        with open(out, "w") as f:
            json.dump(record, f)
    dist.destroy_process_group()
    _leave()


def _mlp():
    import torch

    torch.manual_seed(0)
    layers: list = []
    for a, b in itertools.pairwise(WIDTHS):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _step_rank(rank: int, world: int, init: str, repeats: int, out: str) -> None:
    os.environ["NUMBA_NUM_THREADS"] = "1"  # every thread of the rank, DDP's hook thread too
    import numba
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from bitfold.distributed import GradientSum, exact_allreduce_hook

    torch.set_num_threads(1)
    numba.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, WIDTHS[0], generator=gen)
    y = torch.randn(BATCH, WIDTHS[-1], generator=gen)
    ddp = DistributedDataParallel(_mlp())
    hooked = DistributedDataParallel(_mlp())
    hooked.register_comm_hook(None, exact_allreduce_hook)
    plain = _mlp()
    gs = GradientSum(plain.parameters(), timeout=120)

    def ddp_step(model=ddp) -> None:
        model.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()

    def compute_step() -> None:
        plain.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(plain(x), y).backward()

    def exact_step() -> None:
        torch.nn.functional.mse_loss(plain(x), y).backward()
        gs.add().reduce(mean_over=world)
        plain.zero_grad(set_to_none=True)

    medians = _timed({"ddp": ddp_step, "gradientsum": exact_step, "compute": compute_step,
                      "ddp_exact_hook": lambda: ddp_step(hooked)}, repeats, dist)  # fmt: skip
    if rank == 0:
        record = {
            "processes": world,
            "parameters": sum(p.numel() for p in plain.parameters()),
            "layers": list(WIDTHS),
            "batch": BATCH,
            "ddp_ms": 1e3 * medians["ddp"],
            "gradientsum_ms": 1e3 * medians["gradientsum"],
            "compute_ms": 1e3 * medians["compute"],
            "ddp_exact_hook_ms": 1e3 * medians["ddp_exact_hook"],
            "repeats": repeats,
        }
        record["ratio"] = record["gradientsum_ms"] / record["ddp_ms"]
        with open(out, "w") as f:
            json.dump(record, f)
    dist.destroy_process_group()
    _leave()


def _spawn(fn, world: int, *args) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "record.json")
        mp.spawn(fn, args=(world, f"file://{tmp}/rdv", *args, out), nprocs=world)
        with open(out) as f:
            return json.load(f)


def measure(world: int, n: int, repeats: int) -> dict:
    """One (world size, elements) point, measured in ``world`` spawned processes."""
    record = _spawn(_rank, world, n, repeats)
    record["bytes_ratio"] = record["exact_bytes"] / record["float32_bytes"]
    record["time_ratio"] = record["exact_ms"] / record["float32_ms"]
    record["sum_time_ratio"] = record["exact_sum_ms"] / record["float32_ms"]
    return record


def measure_step(world: int, repeats: int) -> dict:
    """The data-parallel step, DDP against GradientSum, in ``world`` spawned processes."""
    return _spawn(_step_rank, world, repeats)


def _verdict(ratio: float, goal: float) -> str:
    return f"{ratio:.2f}x ({'met' if ratio <= goal else 'missed'})"


def table(records: list[dict], steps: list[dict] | None = None) -> str:
    """Markdown tables of the records, with the goals."""
    lines = [
        "| processes | elements | float32 all-reduce | exact all-reduce | time | bytes | "
        "exact, through a DenseSum | time | blocks " + "/".join(CLASSES) + " |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        c = r["block_classes"]
        lines.append(
            f"| {r['processes']} | {r['elements']:,} | {r['float32_ms']:.1f} ms | "
            f"{r['exact_ms']:.1f} ms | {_verdict(r['time_ratio'], TIME_GOAL)} | "
            f"{_verdict(r['bytes_ratio'], BYTES_GOAL)} | {r['exact_sum_ms']:.1f} ms | "
            f"{r['sum_time_ratio']:.2f}x | "
            + "/".join(str(c.get(name, 0)) for name in CLASSES) + " |"
        )
    if steps:
        lines += [
            "",
            "| processes | parameters | batch | DDP step | GradientSum step | ratio | "
            "compute only | DDP with exact_allreduce_hook |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in steps:
            extra = " — | — |"  # results written before these two were measured
            if "compute_ms" in r:
                extra = (f" {r['compute_ms']:.1f} ms | {r['ddp_exact_hook_ms']:.1f} ms "
                         f"({r['ddp_exact_hook_ms'] / r['ddp_ms']:.2f}x) |")  # fmt: skip
            lines.append(
                f"| {r['processes']} | {r['parameters']:,} | {r['batch']} | {r['ddp_ms']:.1f} ms"
                f" | {r['gradientsum_ms']:.1f} ms | {_verdict(r['ratio'], STEP_GOAL)} |{extra}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_000_000, 16_000_000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--step-worlds", type=int, nargs="*", default=[2],
                        help="world sizes of the data-parallel step (none: skip it)")
    parser.add_argument("--step-repeats", type=int, default=9)
    parser.add_argument("--json", default=None, help="write the JSON here")
    parser.add_argument("--out", default=None, help="write the JSON here, and a .md table")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    records, steps = [], []
    for world in args.worlds:
        for n in args.sizes:
            records.append(measure(world, n, args.repeats))
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    for world in args.step_worlds:
        steps.append(measure_step(world, args.step_repeats))
        print(json.dumps(steps[-1]), file=sys.stderr, flush=True)
    result = {
        "schema": "bitfold-allreduce/2",
        "date": dt.date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "cores": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "goals": {
            "bytes_ratio_max": BYTES_GOAL,
            "time_ratio_max": TIME_GOAL,
            "step_ratio_max": STEP_GOAL,
        },
        "allreduce": records,
        "step": steps,
    }
    print(table(records, steps))
    for path in {args.json, args.out} - {None}:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
    if args.out:
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(table(records, steps) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
