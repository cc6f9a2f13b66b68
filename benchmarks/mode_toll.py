"""The toll of ``bitfold.torch.exact_mode()`` on whole training steps, against plain PyTorch.

``exact_mode()`` gives the fold ops (the rules' table) Python kernels; every
other op should run as in plain PyTorch. This times, for each model, in one
process, taking turns in rounds (so that drift in the machine's speed hits all
alike), the medians of a forward plus backward step:

* ``plain``: the eager model, with bitfold's kernels not installed;
* ``exact_mode``: the step inside ``bitfold.torch.exact_mode()``;
* ``plain_kernels_installed``: plain again, with the kernels left installed by
  an earlier mode (each fold op then makes one Python call);
* ``full_dispatch``: inside ``exact_mode(full=True)``, the mode as a
  ``TorchDispatchMode`` (every op through Python), the way it ran before;
* ``noop_dispatch``: inside a ``TorchDispatchMode`` that does nothing, the
  price of any dispatch mode.

Models: the tiny transformers of ``transformers_step.py`` (a Mixtral-style
mixture of experts with ``grouped_mm`` experts and with eager experts, and
GPT-2; 8 x 32 tokens, a causal LM loss), and the two step models of
``bitfold bench`` (``graph``: message passing with scatter-add and index_add;
``embedding-bag``), whose steps include the optimiser's.

    PYTHONPATH=src .venv/bin/python benchmarks/mode_toll.py [--rounds 7] [--calls 5]

Prints a table and writes JSON (default
``benchmarks/results/<date>-mode-toll-cpu-2core/mode_toll.json``), with the
load average before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

import bitfold.torch as bt
from bitfold.cli.bench import steps as bench_steps
from bitfold.torch import mode as mode_module

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transformers_step import MODELS, build

warnings.filterwarnings("ignore", message=".*loss_type.*")
KINDS = ("plain", "exact_mode", "plain_kernels_installed", "full_dispatch", "noop_dispatch")
GOAL = 1.10


class NoopDispatch(TorchDispatchMode):
    """A dispatch mode that runs every op as it is."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def _transformer_step(name: str) -> tuple[Callable[[], None], Callable[[], dict[str, int]]]:
    model = build(name, small=False)
    ids = torch.randint(0, 1000, (8, 32), generator=torch.Generator().manual_seed(1))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    def counts() -> dict[str, int]:
        with bt.exact_mode() as mode:
            step()
        return dict(mode.counts)

    return step, counts


def _bench_step(name: str) -> tuple[Callable[[], None], Callable[[], dict[str, int]]]:
    make = {"graph": bench_steps._graph_model, "embedding-bag": bench_steps._bag_model}[name]
    model, loss_of = make(torch, 1.0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_of(model).backward()
        opt.step()

    def counts() -> dict[str, int]:
        with bt.exact_mode() as mode:
            step()
        return dict(mode.counts)

    return step, counts


def _in(kind: str, step: Callable[[], None]) -> Callable[[], None]:
    """``step`` as ``kind`` runs it; the kernels installed or removed first, untimed."""
    context: Callable[[], Any] = {
        "plain": contextlib.nullcontext,
        "plain_kernels_installed": contextlib.nullcontext,
        "exact_mode": bt.exact_mode,
        "full_dispatch": lambda: bt.exact_mode(full=True),
        "noop_dispatch": NoopDispatch,
    }[kind]

    def run() -> None:
        with context():
            step()

    return run


def _prepare(kind: str) -> None:
    if kind == "plain":
        mode_module._uninstall_kernels()
    else:
        mode_module.install_kernels()


def measure(name: str, rounds: int, calls: int) -> dict[str, Any]:
    """Medians (ms) of each kind of step for one model, and their ratios to ``plain``."""
    step, counts = (_bench_step if name in ("graph", "embedding-bag") else _transformer_step)(name)
    folds = counts()
    runs = {kind: _in(kind, step) for kind in KINDS}
    times: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(rounds + 1):  # the first round warms up, untimed
        order = KINDS[r % len(KINDS) :] + KINDS[: r % len(KINDS)]
        for kind in order:
            _prepare(kind)
            runs[kind]()
            for _ in range(calls):
                t0 = time.perf_counter()
                runs[kind]()
                if r:
                    times[kind].append(1e3 * (time.perf_counter() - t0))
    ms = {k: statistics.median(v) for k, v in times.items()}
    return {
        "model": name,
        "ms": ms,
        "spread_ms": {k: [min(v), max(v)] for k, v in times.items()},
        "over_plain": {k: ms[k] / ms["plain"] for k in KINDS},
        "fastest_over_plain": {k: min(times[k]) / min(times["plain"]) for k in KINDS},
        "exact_mode_counts": folds,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=5, help="timed steps a kind a round")
    parser.add_argument("--models", default=",".join((*MODELS, "graph", "embedding-bag")))
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = [measure(m, args.rounds, args.calls) for m in args.models.split(",")]
    load_after = os.getloadavg()
    today = datetime.date.today().isoformat()
    result = {
        "what": "exact_mode() against plain PyTorch: forward and backward steps, ratios of medians",
        "command": "PYTHONPATH=src .venv/bin/python benchmarks/mode_toll.py"
        f" --rounds {args.rounds} --calls {args.calls}"
        + (f" --threads {args.threads}" if args.threads else ""),
        "date": today,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads",
        "load_average_1_5_15": {"before": load_before, "after": load_after},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "goal": {"exact_mode_over_plain": GOAL},
        "rows": rows,
    }
    print(f"{'model':<20}" + "".join(f"{k:>25}" for k in KINDS))
    for row in rows:
        cells = "".join(f"{row['ms'][k]:>15.2f}ms {row['over_plain'][k]:>5.2f}x" for k in KINDS)
        print(f"{row['model']:<20}{cells}")
    print(f"load average before {load_before}, after {load_after}")
    out = args.out or Path(f"benchmarks/results/{today}-mode-toll-cpu-2core/mode_toll.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
