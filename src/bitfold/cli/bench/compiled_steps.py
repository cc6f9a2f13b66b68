"""Whole training steps compiled: ``bitfold.torch.compile`` against ``torch.compile`` (issue 18).

The two models of :mod:`bitfold.cli.bench.steps` (message passing, an
embedding bag), each trained with Adam in three settings, each on its own copy
of the same initial model:

* ``compiled``: the model compiled by ``torch.compile`` (inductor's folds,
  atomics on the CPU: not order-free);
* ``exact_compiled``: the model compiled by ``bitfold.torch.compile``: every
  fold of the forward and backward graphs exact (correctly rounded, the same
  bits for any order of its terms), everything else inductor's;
* ``exact_mode``: the eager step inside ``bitfold.torch.exact_mode()``.

The settings take turns as in :mod:`~bitfold.cli.bench.steps` (the first
rounds compile and warm up); the ratios are of medians, to the ``compiled``
step. Goal: ``exact_compiled`` at most :data:`GOAL_RATIO` x ``compiled`` on
the CPU (1.2x on a GPU, when measured there).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from .steps import MODELS, WARMUP_ROUNDS, time_in_turns

#: The issue's goal on the CPU: an exact compiled step costs at most this many compiled steps.
GOAL_RATIO = 1.5
SETTINGS = ("compiled", "exact_compiled", "exact_mode")


def _stepper(torch: Any, model: Any, loss_of: Callable[[Any], Any], setting: str) -> Callable:
    """One training step of a copy of ``model`` in ``setting``; returns its fold counts, if any."""
    import copy

    from ...torch import compile as exact_compile
    from ...torch import exact_mode

    own = copy.deepcopy(model)
    opt = torch.optim.Adam(own.parameters(), lr=1e-3)
    if setting == "compiled":
        run = torch.compile(own)
    elif setting == "exact_compiled":
        run = exact_compile(own)
    else:
        run = own

    def step() -> dict[str, int] | None:
        opt.zero_grad(set_to_none=True)
        if setting == "exact_mode":
            with exact_mode() as mode:
                loss_of(run).backward()
            opt.step()
            return dict(mode.counts)
        loss_of(run).backward()
        opt.step()
        return dict(run.bitfold.counts) if setting == "exact_compiled" else None

    return step


def measure_compiled_steps(*, repeats: int = 15, scale: float = 1.0) -> dict[str, Any]:
    """Step times of every model compiled plainly and exactly, and eager under exact_mode."""
    try:
        import torch
    except ImportError:
        return {"status": "skipped", "reason": "torch is not installed"}
    out: dict[str, Any] = {
        "status": "ok",
        "goal": f"bitfold.torch.compile step <= {GOAL_RATIO}x the torch.compile step",
        "method": "settings take turns one step each, order rotated every round; "
        f"{WARMUP_ROUNDS} warm-up rounds (they compile), then the median of {repeats} timed "
        "rounds",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "scale": scale,
        "models": {},
    }
    for name, (description, build) in MODELS.items():
        model, loss_of = build(torch, scale)
        torch._dynamo.reset()
        steps = {s: _stepper(torch, model, loss_of, s) for s in SETTINGS}
        times, counts = time_in_turns(steps, repeats)
        medians = {s: statistics.median(t) for s, t in times.items()}
        base = medians["compiled"]
        entry: dict[str, Any] = {
            "description": description,
            "median_s": medians,
            "times_s": times,
            "over_compiled": {s: medians[s] / base for s in SETTINGS},
            "exact_counts": counts,
        }
        entry["goal_met"] = entry["over_compiled"]["exact_compiled"] <= GOAL_RATIO
        out["models"][name] = entry
    return out


def summary_lines(res: dict[str, Any] | None) -> list[str]:
    """Markdown lines for ``summary.md`` (empty when the phase did not run)."""
    if not res:
        return []
    title = "### Compiled training steps: bitfold.torch.compile against torch.compile (issue 18)"
    if res.get("status") != "ok":
        return [title, "", f"skipped: {res.get('reason', 'unknown')}", ""]
    lines = [
        title,
        "",
        f"Goal: {res['goal']}. {res['method']}; torch {res['torch']}, {res['threads']} threads. "
        "The exact compiled step's folds are exact; the rest is inductor's, so its bits are "
        "not the eager step's.",
        "",
        "| model | torch.compile ms | bitfold.torch.compile ms (x) | eager exact_mode ms (x) "
        "| goal | folds made exact (compile counts) |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in res["models"].items():
        med, ratio = m["median_s"], m["over_compiled"]
        folds = ", ".join(f"{k} {v}" for k, v in sorted(m["exact_counts"].items())) or "none"
        lines.append(
            f"| {name}: {m['description']} | {1e3 * med['compiled']:.2f} | "
            f"{1e3 * med['exact_compiled']:.2f} ({ratio['exact_compiled']:.2f}x) | "
            f"{1e3 * med['exact_mode']:.2f} ({ratio['exact_mode']:.2f}x) | "
            f"{'met' if m['goal_met'] else 'missed'} | {folds} |"
        )
    lines.append("")
    return lines
