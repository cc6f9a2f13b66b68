"""The exact all-reduce against ``torch.distributed.all_reduce`` of float32: bytes and time.

    python benchmarks/allreduce.py --out benchmarks/results/2026-12-03-allreduce-cpu-2core.json

For each world size (local gloo processes) and gradient size, every rank
holds an ordinary float32 gradient (normal values times 1e-3, its own seed)
and the step is timed two ways, interleaved, median over the repeats:

* ``float32``: ``dist.all_reduce`` of the gradient (SUM) — what DDP does;
* ``exact``: the gradient added into a :class:`bitfold.dense.DenseSum` (kept
  between steps and reset, as :class:`bitfold.distributed.GradientSum` does),
  then :func:`bitfold.distributed.exact_all_reduce` — bounds (MAX), words
  (SUM), the signs of zero sums where they travel (MIN), and rounding every
  element once.

Each rank runs one thread (torch and Numba): the ranks share the machine's
cores, as the processes of a data-parallel job do.

Bytes are those of the messages handed to the collectives (a ring all-reduce
moves ``2 (W - 1) / W`` times them on each link, for both). Goals (issue 12):
at most 4x the bytes and 3x the time of the float32 all-reduce.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

BYTES_GOAL, TIME_GOAL = 4.0, 3.0


def _rank(rank: int, world: int, init: str, n: int, repeats: int, out: str) -> None:
    import numba
    import torch
    import torch.distributed as dist

    from bitfold.cli.launch import leave
    from bitfold.dense import DenseSum, wire_layout
    from bitfold.distributed import exact_all_reduce

    torch.set_num_threads(1)  # one thread per rank for both (the ranks share the cores)
    numba.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    g = (np.random.default_rng(rank).standard_normal(n) * 1e-3).astype(np.float32)
    times: dict[str, list[float]] = {"float32": [], "exact": []}
    kept = DenseSum((n,))  # kept between steps, as GradientSum keeps its sums

    def float_step() -> None:
        dist.all_reduce(torch.from_numpy(g.copy()))

    def exact_step() -> None:
        exact_all_reduce(kept.reset().add(g))

    for i in range(repeats + 1):
        for name, step in (("float32", float_step), ("exact", exact_step))[:: 1 - 2 * (i % 2)]:
            dist.barrier()
            t0 = time.perf_counter()
            step()
            dist.barrier()
            if i:  # the first round warms up (Numba's cache, the allocator)
                times[name].append(time.perf_counter() - t0)
    s = DenseSum((n,)).add(g)
    bounds = torch.from_numpy(s.bounds())
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    layout = wire_layout(bounds.numpy(), n, world, s.format.limbs)
    classes = np.bincount(layout.classes, minlength=4).tolist()
    if rank == 0:
        record = {
            "world": world,
            "elements": n,
            "float32_bytes": 4 * n,
            "exact_bytes": int(bounds.numel() * bounds.element_size() + layout.words * 8),
            "block_classes": dict(zip(("narrow", "wide", "wider", "full"), classes, strict=True)),
            "float32_ms": 1e3 * statistics.median(times["float32"]),
            "exact_ms": 1e3 * statistics.median(times["exact"]),
            "repeats": repeats,
        }
        with open(out, "w") as f:
            json.dump(record, f)
    dist.destroy_process_group()
    leave(0)  # no interpreter teardown: see bitfold.cli.launch.leave


def measure(world: int, n: int, repeats: int) -> dict:
    """One (world size, elements) point, measured in ``world`` spawned processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "record.json")
        mp.spawn(_rank, args=(world, f"file://{tmp}/rdv", n, repeats, out), nprocs=world)
        with open(out) as f:
            record = json.load(f)
    record["bytes_ratio"] = record["exact_bytes"] / record["float32_bytes"]
    record["time_ratio"] = record["exact_ms"] / record["float32_ms"]
    return record


def table(records: list[dict]) -> str:
    """A Markdown table of the records, with the goals."""
    lines = [
        "| processes | elements | float32 all-reduce | exact all-reduce | time | bytes | "
        "blocks narrow/wide/wider/full |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        c = r["block_classes"]
        lines.append(
            f"| {r['world']} | {r['elements']:,} | {r['float32_ms']:.1f} ms | "
            f"{r['exact_ms']:.1f} ms | {r['time_ratio']:.2f}x "
            f"({'met' if r['time_ratio'] <= TIME_GOAL else 'missed'}) | "
            f"{r['bytes_ratio']:.2f}x ({'met' if r['bytes_ratio'] <= BYTES_GOAL else 'missed'}) | "
            f"{c['narrow']}/{c['wide']}/{c['wider']}/{c['full']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 16_000_000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None, help="write the JSON here (and a .md table)")
    args = parser.parse_args(argv)
    records = []
    for world in args.worlds:
        for n in args.sizes:
            records.append(measure(world, n, args.repeats))
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    result = {
        "schema": "bitfold-allreduce/1",
        "date": dt.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "cores": os.cpu_count()},
        "goals": {"bytes_ratio_max": BYTES_GOAL, "time_ratio_max": TIME_GOAL},
        "records": records,
    }
    print(table(records))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(table(records) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
