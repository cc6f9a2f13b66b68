"""What a small exact fold costs inside a training step, where the caches are cold.

``small_fold_cost.py`` times one fold called again and again: everything it
touches stays in the caches. Inside a step, the model's other ops evict them
between two folds. This measures both ways, one torch thread, in one process:

* ``in_step``: Mixtral with eager experts (``transformers_step.py``), forward and
  backward under ``exact_mode()``; the time spent in the mode's fold handler
  (``ExactMode._fold``, which calls the exact kernels), per step and per fold;
* ``evicted``: an ``index_add_`` of 128 rows of 64 floats into 256, each call
  after an 8 MB write and a 256 x 256 matmul, and ``hot``: the same call in a
  tight loop; each plain (no bitfold kernel), with the kernels installed but
  no mode, and inside ``exact_mode()``.

    PYTHONPATH=src .venv/bin/python benchmarks/fold_in_step.py [--steps 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import bitfold.torch as bt
from bitfold.torch import mode as mode_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transformers_step import build

warnings.filterwarnings("ignore", message=".*loss_type.*")


def in_step(steps: int) -> dict[str, Any]:
    """Milliseconds a step in the fold handler, and microseconds a fold (medians of steps)."""
    model = build("mixtral-eager", small=False)
    ids = torch.randint(0, 1000, (8, 32), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    spent = [0.0, 0]
    handler = mode_module.ExactMode._fold

    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return handler(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += 1

    for _ in range(3):  # compile and warm up
        with bt.exact_mode():
            step()
    mode_module.ExactMode._fold = timed
    per_step, folds, step_ms = [], 0, []
    try:
        for _ in range(steps):
            spent[0], spent[1] = 0.0, 0
            t0 = time.perf_counter()
            with bt.exact_mode():
                step()
            step_ms.append(1e3 * (time.perf_counter() - t0))
            per_step.append(1e3 * spent[0])
            folds = spent[1]
    finally:
        mode_module.ExactMode._fold = handler
    return {
        "model": "mixtral-eager (transformers_step.py), batch 8 x 32, forward and backward",
        "folds_a_step": folds,
        "step_ms": round(statistics.median(step_ms), 2),
        "fold_handler_ms_a_step": round(statistics.median(per_step), 2),
        "us_a_fold": round(1e3 * statistics.median(per_step) / max(folds, 1), 1),
    }


def _median_us(call: Callable[[], Any], before: Callable[[], Any] | None, n: int) -> float:
    times = []
    for _ in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return round(1e6 * statistics.median(times), 1)


def one_fold(n: int) -> dict[str, dict[str, float]]:
    """Microseconds of one ``index_add_``, with the caches evicted before each call and hot."""
    g = torch.Generator().manual_seed(0)
    dest = torch.zeros(256, 64)
    index = torch.randint(0, 256, (128,), generator=g)
    rows = torch.randn(128, 64, generator=g)
    junk, square = torch.randn(2_000_000), torch.randn(256, 256)

    def evict() -> None:
        junk.mul_(1.0)
        torch.mm(square, square)

    def call() -> None:
        dest.index_add_(0, index, rows)

    out: dict[str, dict[str, float]] = {}
    for kind in ("plain", "kernels_installed", "exact_mode"):
        if kind == "plain":
            mode_module._uninstall_kernels()
        else:
            mode_module.install_kernels()
        with bt.exact_mode() if kind == "exact_mode" else contextlib.nullcontext():
            for _ in range(200):
                call()
            out[kind] = {"evicted_us": _median_us(call, evict, n),
                         "hot_us": _median_us(call, None, 10 * n)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = {
        "what": "a small exact fold's cost inside a step (cold caches) and alone (hot), one thread",
        "command": " ".join(["PYTHONPATH=src python benchmarks/fold_in_step.py",
                             *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "load_before": os.getloadavg(),
        "in_step": in_step(args.steps),
        "index_add_128_rows_into_256x64": one_fold(args.calls),
        "load_after": os.getloadavg(),
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
