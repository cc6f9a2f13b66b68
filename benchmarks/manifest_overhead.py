"""Overhead per training step of recording a run manifest (bitfold.record).

A 2-layer MLP (1000 -> 1000 -> 10, about 1.01 M float32 parameters) trains
with SGD on random data (batch 64). Each step is timed

* ``plain``: no manifest;
* ``log_model``: ``rec.log_model(step, model)``, every gradient and
  parameter digested (about 2 M values, 8 MB hashed per step);
* ``params_only``: ``rec.log_model(step, model, grads=False)``;
* ``log_model_background``: the same as ``log_model`` with
  ``record(..., background=True)``: copies are taken at the call and hashed
  by a worker thread, which pays when torch leaves a core free.

The configurations alternate step by step so that drift in the machine's
speed hits all of them alike; medians are reported, once per torch thread
count (default: 1 and all cores). The ``log_model`` call is also timed
alone (wall and CPU time), which other work on the machine disturbs least.

    .venv/bin/python benchmarks/manifest_overhead.py [--steps 60] [--threads 1 2]

Prints a table and writes benchmarks/results/manifest_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import bitfold
from bitfold.repro.fingerprint import fingerprint
from bitfold.repro.manifest import record

RESULTS = Path(__file__).resolve().parent / "results" / "manifest_overhead.json"
CONFIGS = ("plain", "log_model", "params_only", "log_model_background")


def _model(inputs: int, hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10)
    )


def measure(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Step times of every configuration and the ``log_model`` call alone, at ``threads``."""
    torch.set_num_threads(threads)
    model = _model(args.inputs, args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.inputs)
    y = torch.randint(0, 10, (args.batch,))
    loss_fn = torch.nn.CrossEntropyLoss()

    times: dict[str, list[float]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        recs = {
            "log_model": record(Path(tmp) / "sync.jsonl"),
            "params_only": record(Path(tmp) / "params.jsonl"),
            "log_model_background": record(Path(tmp) / "bg.jsonl", background=True),
        }
        for i in range(args.warmup + args.steps):
            for c in CONFIGS:
                t0 = time.perf_counter()
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                meta = {"loss": loss.item()}
                if c != "plain":
                    recs[c].log_model(i, model, grads=c != "params_only", meta=meta)
                if i >= args.warmup:
                    times[c].append(time.perf_counter() - t0)
        for rec in recs.values():
            rec.close()
        lines = (Path(tmp) / "sync.jsonl").read_bytes().splitlines(keepends=True)
        steps = [ln for ln in lines if b'"kind":"step"' in ln]
        bytes_per_step = sum(map(len, steps)) / len(steps)

        alone = record(Path(tmp) / "alone.jsonl")
        walls, cpus = [], []
        for i in range(args.warmup + args.steps):
            w0, c0 = time.perf_counter(), time.process_time()
            alone.log_model(i, model)
            if i >= args.warmup:
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
        alone.close()

    med = {c: statistics.median(v) for c, v in times.items()}
    return {
        "torch_threads": threads,
        "median_step_ms": {c: round(v * 1e3, 3) for c, v in med.items()},
        "overhead_ms": {c: round((med[c] - med["plain"]) * 1e3, 3) for c in CONFIGS[1:]},
        "overhead_percent": {
            c: round(100 * (med[c] - med["plain"]) / med["plain"], 1) for c in CONFIGS[1:]
        },
        "log_model_call_alone_ms": {
            "wall_median": round(statistics.median(walls) * 1e3, 3),
            "wall_min": round(min(walls) * 1e3, 3),
            "cpu_median": round(statistics.median(cpus) * 1e3, 3),
        },
        "manifest_bytes_per_step": round(bytes_per_step),
        "load_average_after": [round(v, 2) for v in os.getloadavg()],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="timed steps per configuration")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--inputs", type=int, default=1000)
    ap.add_argument("--hidden", type=int, default=1000)
    ap.add_argument("--threads", type=int, nargs="+", default=None,
                    help="torch thread counts to measure (default: 1 and all cores)")
    ap.add_argument("--json", type=Path, default=RESULTS, help="where to write the results")
    args = ap.parse_args()
    thread_counts = args.threads or sorted({1, os.cpu_count() or 1})

    n_params = sum(p.numel() for p in _model(args.inputs, args.hidden).parameters())
    flat = torch.randn(n_params)
    bitfold.digest(flat)
    t0 = time.perf_counter()
    for _ in range(20):
        bitfold.digest(flat)
    digest_s = (time.perf_counter() - t0) / 20

    model_name = f"MLP {args.inputs}->{args.hidden}->10"
    print(f"{model_name} ({n_params:,} parameters), batch {args.batch}, {args.steps} steps")
    print(f"bitfold.digest of {n_params:,} float32: {digest_s * 1e3:.2f} ms "
          f"({n_params * 4 / digest_s / 1e6:.0f} MB/s)")
    runs = []
    for threads in thread_counts:
        r = measure(args, threads)
        runs.append(r)
        print(f"\ntorch threads {threads} (load average after: {r['load_average_after']})")
        print(f"{'configuration':<22}{'median ms/step':>16}{'overhead ms':>14}{'overhead':>10}")
        for c in CONFIGS:
            extra = ("", "") if c == "plain" else (
                f"{r['overhead_ms'][c]:.2f}", f"{r['overhead_percent'][c]:.0f}%")
            print(f"{c:<22}{r['median_step_ms'][c]:>16.2f}{extra[0]:>14}{extra[1]:>10}")
        a = r["log_model_call_alone_ms"]
        print(f"log_model call alone ({2 * n_params:,} values): median {a['wall_median']:.2f} ms "
              f"wall (min {a['wall_min']:.2f}), {a['cpu_median']:.2f} ms CPU; "
              f"manifest {r['manifest_bytes_per_step']} bytes/step")

    result = {
        "benchmark": "manifest_overhead",
        "command": "python benchmarks/manifest_overhead.py "
        + f"--steps {args.steps} --threads {' '.join(map(str, thread_counts))}",
        "model": model_name,
        "parameters": n_params,
        "batch": args.batch,
        "steps": args.steps,
        "digest_ms_per_model_size_float32": round(digest_s * 1e3, 3),
        "digest_MB_per_s": round(n_params * 4 / digest_s / 1e6, 1),
        "runs": runs,
        "machine": fingerprint(),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
