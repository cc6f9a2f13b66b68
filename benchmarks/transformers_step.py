"""Training steps of tiny transformers models: exact against plain, eager and compiled.

Models are built from configs (random weights, no download): a Mixtral-style
mixture of experts with ``grouped_mm`` experts and with eager experts
(``index_add_`` combines the tokens), and GPT-2. A step is forward plus
backward of a causal LM loss on a batch of 8 x 32 tokens. For each model, in
one process, taking turns in rounds so that drift in the machine's speed hits
all alike, medians of the steps of:

* ``plain``: the eager model; ``exact_mode``: the eager model under
  ``bitfold.torch.exact_mode()``;
* ``torch.compile`` and ``bitfold.torch.compile`` (after their compile).

Ratios: ``exact_mode / plain`` and ``bitfold.torch.compile / torch.compile``.

    PYTHONPATH=src .venv/bin/python benchmarks/transformers_step.py [--rounds 5] [--small]

Prints a table and writes JSON (default
``benchmarks/results/<date>-transformers-cpu-2core/steps.json``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers

import bitfold.torch as bt

warnings.filterwarnings("ignore", message=".*loss_type.*")


def build(name: str, small: bool) -> torch.nn.Module:
    """A tiny model from a config (``small``: one layer, narrower)."""
    torch.manual_seed(0)
    layers, hidden = (1, 32) if small else (2, 64)
    if name.startswith("mixtral"):
        config = transformers.MixtralConfig(
            num_hidden_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=1000, num_local_experts=4,
            num_experts_per_tok=2, max_position_embeddings=64,
        )  # fmt: skip
        config._experts_implementation = "eager" if name.endswith("eager") else "grouped_mm"
        return transformers.MixtralForCausalLM(config)
    config = transformers.GPT2Config(n_layer=layers, n_head=4, n_embd=hidden, vocab_size=1000,
                                     n_positions=64)  # fmt: skip
    return transformers.GPT2LMHeadModel(config)


MODELS = ("mixtral-grouped_mm", "mixtral-eager", "gpt2")


def _step(call: Callable[..., Any], model: torch.nn.Module, ids: torch.Tensor) -> None:
    model.zero_grad(set_to_none=True)
    call(input_ids=ids, labels=ids).loss.backward()


def measure(name: str, rounds: int, calls: int, small: bool) -> dict[str, Any]:
    """Medians (ms) of the four kinds of step for one model, and their ratios."""
    model = build(name, small)
    ids = torch.randint(0, 1000, (8, 32), generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    compiled = {"torch.compile": torch.compile(model), "bitfold.torch.compile": bt.compile(model)}
    for step in compiled.values():  # compile (forward and backward) before timing
        _step(step, model, ids)
    kinds: dict[str, Callable[[], None]] = {
        "plain": lambda: _step(model, model, ids),
        "torch.compile": lambda: _step(compiled["torch.compile"], model, ids),
        "bitfold.torch.compile": lambda: _step(compiled["bitfold.torch.compile"], model, ids),
    }

    def exact() -> None:
        with bt.exact_mode():
            _step(model, model, ids)

    kinds["exact_mode"] = exact
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(rounds):
        for kind, fn in kinds.items():
            fn()
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                times[kind].append(1e3 * (time.perf_counter() - t0))
    ms = {k: statistics.median(v) for k, v in times.items()}
    report = compiled["bitfold.torch.compile"].bitfold
    return {
        "model": name,
        "ms": ms,
        "spread_ms": {k: [min(v), max(v)] for k, v in times.items()},
        "exact_mode_over_plain": ms["exact_mode"] / ms["plain"],
        "bitfold_compile_over_torch_compile": ms["bitfold.torch.compile"] / ms["torch.compile"],
        "compile_counts": dict(report.counts),
        "compile_passed": dict(report.passed),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="timed steps a kind a round")
    parser.add_argument("--small", action="store_true", help="one-layer models, 1 round")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rounds, calls = (1, 2) if args.small else (args.rounds, args.calls)
    rows = [measure(m, rounds, calls, args.small) for m in args.models.split(",")]
    today = datetime.date.today().isoformat()
    result = {
        "what": "tiny transformers training steps: exact against plain, eager and compiled",
        "command": "PYTHONPATH=src .venv/bin/python benchmarks/transformers_step.py"
        + (" --small" if args.small else f" --rounds {rounds} --calls {calls}"),
        "date": today,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "goals": {"exact_mode_over_plain": 1.10, "bitfold_compile_over_torch_compile": 1.2},
        "rows": rows,
    }
    for row in rows:
        print(f"{row['model']:<20} exact_mode/plain {row['exact_mode_over_plain']:.2f}x   "
              f"bitfold.compile/torch.compile {row['bitfold_compile_over_torch_compile']:.2f}x")
    out = args.out or Path(f"benchmarks/results/{today}-transformers-cpu-2core/steps.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
