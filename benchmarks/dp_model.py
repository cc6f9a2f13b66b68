"""A model, on paper, of the exact data-parallel steps on N GPUs against DDP's and FSDP's.

    python benchmarks/dp_model.py ALLREDUCE_JSON [--params 1e9] [--compute-ms 0] [--json OUT]

``ALLREDUCE_JSON`` is the ``allreduce.json`` that ``make gpu-check`` writes
(``scripts/gpu_allreduce.py``); its one-process step gives the two measured inputs:

* the exact all-reduce's own work per element (making the words, reading the
  sums back): ``(exact_us - float32_all_reduce_us) / elements`` in a
  one-process group, where no byte travels to a peer;
* the bytes an element takes on the wire (int64 words and block bounds) for
  ordinary gradient values, at 8 and 64 ranks.

The step of ``P`` float32 parameters on ``N`` GPUs, as NCCL's ring all-reduce
moves ``2 (N - 1) / N`` times the buffer over each GPU's link at its bus
bandwidth ``B``:

* DDP: ``compute + 2 (N-1)/N · 4 P / B``;
* exact: ``compute + work · P + 2 (N-1)/N · wire · P / B``.

The sharded step (FSDP2, ``fully_shard``) gathers the parameters and
reduce-scatters the gradient; NCCL's ring moves ``(N - 1) / N`` times the
buffer for each. The exact reduce-scatter sends the all-reduce's words (the
same encoding, reduce-scattered) and its own work is taken as the
all-reduce's, an upper bound (it decodes one shard, not the whole buffer):

* FSDP: ``compute + (N-1)/N · 4 P / B`` (gather) ``+ (N-1)/N · 4 P / B`` (reduce-scatter);
* exact FSDP: ``compute + (N-1)/N · 4 P / B + work · P + (N-1)/N · wire · P / B``.

None overlaps its communication with the backward pass here, which favours
none; ``--compute-ms`` is the step's own compute (0: the communication-
bound worst case, an upper bound of the ratio). The clusters: 8 GPUs over
NVLink (400 GB/s bus bandwidth) and 64 GPUs over 400 Gb/s InfiniBand (50 GB/s).
The goal judged: the exact step at most 1.3x DDP's on 8 GPUs for 1 billion
parameters (the sharded step is reported beside it, unjudged). Inputs that were
not measured give "not yet measured".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: (name, GPUs, bus bandwidth in bytes a second, the rank count whose wire bytes apply)
CLUSTERS = (
    ("8 GPUs, NVLink", 8, 400e9, "8"),
    ("64 GPUs, InfiniBand 400 Gb/s", 64, 50e9, "64"),
)
GOAL = 1.3


def inputs(report: dict[str, Any]) -> dict[str, Any] | None:
    """The measured inputs of the model from ``allreduce.json``, or None when not measured."""
    step = report.get("steps", {}).get("one_process", {})
    if step.get("status") != "ok" or report.get("smoke"):
        return None
    work = (step["exact_us"] - step["float32_all_reduce_us"]) * 1e-6 / step["elements"]
    return {"work_s_per_element": max(work, 0.0), "wire": step["wire_bytes_per_element"]}


def ring_s(nbytes: float, gpus: int, bus: float) -> float:
    """NCCL's ring all-reduce of ``nbytes`` over ``gpus`` at bus bandwidth ``bus``, seconds."""
    return 2 * (gpus - 1) / gpus * nbytes / bus


def shard_s(nbytes: float, gpus: int, bus: float) -> float:
    """NCCL's ring reduce-scatter (or all-gather) of ``nbytes`` over ``gpus``, seconds."""
    return (gpus - 1) / gpus * nbytes / bus


def predict_sharded(measured: dict[str, Any], params: float,
                    compute_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """Each cluster's FSDP and exact FSDP step times (ms) and their ratio."""
    rows = []
    for name, gpus, bus, ranks in CLUSTERS:
        gather = shard_s(4 * params, gpus, bus)
        fsdp = compute_s + gather + shard_s(4 * params, gpus, bus)
        wire = measured["wire"][ranks]
        exact = (compute_s + gather + measured["work_s_per_element"] * params
                 + shard_s(wire * params, gpus, bus))  # fmt: skip
        rows.append({"cluster": name, "gpus": gpus, "bus_bytes_per_s": bus,
                     "wire_bytes_per_element": wire, "fsdp_ms": fsdp * 1e3,
                     "exact_ms": exact * 1e3, "ratio": exact / fsdp})  # fmt: skip
    return rows


def predict(measured: dict[str, Any], params: float, compute_s: float) -> list[dict[str, Any]]:
    """Each cluster's DDP and exact step times (ms), their ratio and the goal's verdict."""
    rows = []
    for name, gpus, bus, ranks in CLUSTERS:
        ddp = compute_s + ring_s(4 * params, gpus, bus)
        wire = measured["wire"][ranks]
        exact = compute_s + measured["work_s_per_element"] * params + ring_s(wire * params,
                                                                            gpus, bus)  # fmt: skip
        row = {"cluster": name, "gpus": gpus, "bus_bytes_per_s": bus,
               "wire_bytes_per_element": wire, "ddp_ms": ddp * 1e3, "exact_ms": exact * 1e3,
               "ratio": exact / ddp}  # fmt: skip
        if gpus == 8 and params == 1e9:
            row["goal"], row["met"] = GOAL, exact / ddp <= GOAL
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("allreduce_json", type=Path)
    parser.add_argument("--params", type=float, default=1e9)
    parser.add_argument("--compute-ms", type=float, default=0.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    measured = inputs(json.loads(args.allreduce_json.read_text()))
    if measured is None:
        why = ("the all-reduce JSON has no measured one-process step (a smoke run, or the "
               "step did not run on a GPU)")
        result: dict[str, Any] = {"status": "not yet measured", "why": why}
        print("not yet measured: " + result["why"])
    else:
        rows = predict(measured, args.params, args.compute_ms * 1e-3)
        sharded = predict_sharded(measured, args.params, args.compute_ms * 1e-3)
        result = {"status": "predicted", "inputs": measured, "params": args.params,
                  "compute_ms": args.compute_ms, "clusters": rows,
                  "sharded": sharded}  # fmt: skip
        for r in rows:
            met = {True: "met", False: "MISSED"}.get(r.get("met"))
            verdict = f"  (goal <= {GOAL}x: {met})" if met else ""
            print(f"{r['cluster']}: DDP {r['ddp_ms']:.1f} ms, exact {r['exact_ms']:.1f} ms, "
                  f"{r['ratio']:.2f}x{verdict}")  # fmt: skip
        for r in sharded:
            print(f"{r['cluster']}, sharded: FSDP {r['fsdp_ms']:.1f} ms, exact "
                  f"{r['exact_ms']:.1f} ms, {r['ratio']:.2f}x")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
