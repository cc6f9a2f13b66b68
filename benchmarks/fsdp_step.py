"""An FSDP2 training step with the exact reduction against the plain FSDP2 step.

    python benchmarks/fsdp_step.py --repeats 11 --out DIR/fsdp_step.json

For each world size (local gloo processes, one thread each), two copies of the
same model live in the same processes, each under
``torch.distributed.fsdp.fully_shard`` (every layer and the root): ``plain``
reduces its gradients with FSDP2's float reduce-scatter, ``exact`` with
:func:`bitfold.distributed.exact_fsdp`. A step is forward, a mean-squared
loss, backward (which runs the reduction), an SGD update and ``zero_grad``;
the two steps alternate, order flipped every round, medians over the repeats
after a warm-up round. The model: ``--layers`` linear layers of ``--width``
with GELUs between (4.2 million parameters by default), a batch of
``--batch`` rows a rank. The goal: the exact step at most 2.0x the plain one.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from allreduce import _leave, _spawn, _timed, _verdict
from reduce_scatter import _commit

GOAL = 2.0


def _model(torch, width: int, layers: int):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    blocks = []
    for _ in range(layers):
        blocks += [torch.nn.Linear(width, width), torch.nn.GELU()]
    model = torch.nn.Sequential(*blocks)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def _rank(rank: int, world: int, init: str, width: int, layers: int, batch: int,
          repeats: int, out: str) -> None:  # fmt: skip
    import numba
    import torch
    import torch.distributed as dist

    from bitfold.distributed import exact_fsdp

    torch.set_num_threads(1)  # one thread per rank for both (the ranks share the cores)
    numba.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    plain, exact = _model(torch, width, layers), _model(torch, width, layers)
    exact_fsdp(exact, mean_over=batch * world)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)
    optimisers = {name: torch.optim.SGD(m.parameters(), lr=1e-3)
                  for name, m in (("plain", plain), ("exact", exact))}  # fmt: skip

    def step(name: str, model) -> None:
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimisers[name].step()
        optimisers[name].zero_grad(set_to_none=True)

    medians = _timed({"plain": lambda: step("plain", plain),
                      "exact": lambda: step("exact", exact)}, repeats, dist)  # fmt: skip
    if rank == 0:
        record = {
            "processes": world,
            "parameters": sum(p.numel() for p in plain.parameters()),
            "width": width,
            "layers": layers,
            "batch_per_rank": batch,
            "plain_ms": 1e3 * medians["plain"],
            "exact_ms": 1e3 * medians["exact"],
            "repeats": repeats,
        }
        with open(out, "w") as f:
            json.dump(record, f)
    dist.destroy_process_group()
    _leave()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--out", default=None, help="write the JSON here, and a .md table")
    args = parser.parse_args(argv)
    for name in ("width", "layers", "batch", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1; got {getattr(args, name)}")
    if any(w < 1 for w in args.worlds):
        parser.error(f"--worlds must be at least 1; got {args.worlds}")
    load_before = os.getloadavg()
    records = []
    for world in args.worlds:
        r = _spawn(_rank, world, args.width, args.layers, args.batch, args.repeats)
        r["time_ratio"] = r["exact_ms"] / r["plain_ms"]
        records.append(r)
    lines = ["| processes | parameters | plain FSDP2 step | exact_fsdp step | ratio |",
             "|---|---|---|---|---|"]  # fmt: skip
    for r in records:
        lines.append(f"| {r['processes']} | {r['parameters']:,} | {r['plain_ms']:.1f} ms | "
                     f"{r['exact_ms']:.1f} ms | {_verdict(r['time_ratio'], GOAL)} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        report = {
            "schema": "bitfold-fsdp-step/1",
            "date": dt.date.today().isoformat(),
            "commit": _commit(),
            "command": "python benchmarks/fsdp_step.py " + " ".join(argv or sys.argv[1:]),
            "machine": {"platform": platform.platform(), "cores": os.cpu_count(),
                        "load_before": load_before, "load_after": os.getloadavg()},
            "goal_time_ratio_max": GOAL,
            "steps": records,
        }  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
