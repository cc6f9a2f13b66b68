"""The exact reduce-scatter against a float32 ``dist.reduce_scatter_tensor``.

    python benchmarks/reduce_scatter.py --repeats 21 --out DIR/run1.json

For each world size (local gloo processes) and gradient size, every rank
holds an ordinary float32 gradient (normal values times 1e-3, its own seed)
and two steps are timed, alternating, in the same processes, median over the
repeats (the first round warms up):

* ``float32``: ``dist.reduce_scatter_tensor`` of the gradient into this
  rank's shard (SUM) — what FSDP does with the gradients;
* ``exact``: :func:`bitfold.distributed.exact_reduce_scatter` of the tensor —
  one all-reduce (MAX) of the metadata check and every shard's block bounds
  (after the warm-up call: the group's previous call had the same size), one
  ``reduce_scatter_tensor`` of the int64 words (SUM), this rank's shard
  rounded once.

Each rank runs one thread (torch and Numba): the ranks share the machine's
cores, as the processes of a data-parallel job do. Bytes are those of the
messages handed to the collectives (``bytes_ratio``, the goal's measure); a
ring moves ``(W - 1) / W`` times a reduce-scatter's and ``2 (W - 1) / W``
times an all-reduce's on each link, which ``wire_ratio`` counts. The goals:
the exact reduce-scatter at most 3x the time of the float32 one and 1.45x its
bytes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import CLASSES, _leave, _spawn, _timed, _verdict

BYTES_GOAL, TIME_GOAL = 1.45, 3.0


def _rank(rank: int, world: int, init: str, n: int, repeats: int, out: str) -> None:
    import numba
    import torch
    import torch.distributed as dist

    from bitfold.dense import BLOCK, DenseSum, array_bounds
    from bitfold.distributed import _META, _shard_layouts, exact_reduce_scatter
    from bitfold.kernels import dense as wire

    torch.set_num_threads(1)  # one thread per rank for both (the ranks share the cores)
    numba.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    g = torch.from_numpy(
        (np.random.default_rng(rank).standard_normal(n) * 1e-3).astype(np.float32)
    )
    shard = torch.empty(n // world)
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)  # torch 2.13
    medians = _timed({
        "float32": lambda: scatter(shard, g),
        "exact": lambda: exact_reduce_scatter(shard, g),
    }, repeats, dist)  # fmt: skip
    m = n // world
    flat = g.numpy()
    bounds = torch.from_numpy(np.concatenate([array_bounds(flat[r * m : (r + 1) * m])
                                              for r in range(world)]))  # fmt: skip
    dist.all_reduce(bounds, op=dist.ReduceOp.MAX)
    layouts = _shard_layouts(bounds.numpy(), m, world, world, DenseSum(1).format.limbs)
    width = max(layout.words + layout.sign_elements().size for layout in layouts)
    codes = {name: getattr(wire, name.upper()) for name in CLASSES}
    counts = np.bincount(np.concatenate([layout.classes for layout in layouts]),
                         minlength=max(codes.values()) + 1)  # fmt: skip
    if rank == 0:
        meta = world * _META * 8
        bounds_bytes = bounds.numel() * bounds.element_size()
        words_bytes = world * width * 8
        ring = (world - 1) / world
        record = {
            "processes": world,
            "elements": n,
            "block": BLOCK,
            "float32_bytes": 4 * n,
            "exact_bytes": int(meta + bounds_bytes + words_bytes),
            "exact_bytes_parts": {
                "metadata": meta,
                "bounds": int(bounds_bytes),
                "words": int(words_bytes),
            },
            "float32_wire_bytes": ring * 4 * n,
            "exact_wire_bytes": 2 * ring * (meta + bounds_bytes) + ring * words_bytes,
            "block_classes": {name: int(counts[code]) for name, code in codes.items()},
            "float32_ms": 1e3 * medians["float32"],
            "exact_ms": 1e3 * medians["exact"],
            "repeats": repeats,
        }
        with open(out, "w") as f:
            json.dump(record, f)
    dist.destroy_process_group()
    _leave()


def measure(world: int, n: int, repeats: int) -> dict:
    """One (world size, elements) point, measured in ``world`` spawned processes."""
    record = _spawn(_rank, world, n, repeats)
    record["bytes_ratio"] = record["exact_bytes"] / record["float32_bytes"]
    record["wire_ratio"] = record["exact_wire_bytes"] / record["float32_wire_bytes"]
    record["time_ratio"] = record["exact_ms"] / record["float32_ms"]
    return record


def table(records: list[dict]) -> str:
    """A Markdown table of the records, with the goals."""
    lines = [
        "| processes | elements | float32 reduce-scatter | exact reduce-scatter | time | "
        "bytes | ring wire bytes | blocks " + "/".join(CLASSES) + " |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        c = r["block_classes"]
        lines.append(
            f"| {r['processes']} | {r['elements']:,} | {r['float32_ms']:.1f} ms | "
            f"{r['exact_ms']:.1f} ms | {_verdict(r['time_ratio'], TIME_GOAL)} | "
            f"{_verdict(r['bytes_ratio'], BYTES_GOAL)} | {r['wire_ratio']:.2f}x | "
            + "/".join(str(c.get(name, 0)) for name in CLASSES) + " |"
        )
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_000_000, 16_000_000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None, help="write the JSON here, and a .md table")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    records = []
    for world in args.worlds:
        for n in args.sizes:
            records.append(measure(world, n, args.repeats))
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    result = {
        "schema": "bitfold-reducescatter/1",
        "date": dt.date.today().isoformat(),
        "commit": _commit(),
        "command": "python benchmarks/reduce_scatter.py " + " ".join(argv or sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cores": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "goals": {"bytes_ratio_max": BYTES_GOAL, "time_ratio_max": TIME_GOAL},
        "reduce_scatter": records,
    }
    print(table(records))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(table(records) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
