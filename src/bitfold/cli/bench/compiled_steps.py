"""Whole training steps compiled: ``bitfold.torch.compile`` against ``torch.compile``.

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
step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .steps import exact_mode_step, phase_record, step_table, time_models

SETTINGS = ("compiled", "exact_compiled", "exact_mode")


def _stepper(torch: Any, model: Any, loss_of: Callable[[Any], Any], setting: str) -> Callable:
    """One training step of a copy of ``model`` in ``setting``; returns its fold counts, if any."""
    import copy

    from ...torch import compile as exact_compile

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
            return exact_mode_step(loss_of, run, opt)
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
    out = phase_record(torch, "warm-up rounds (they compile)", repeats, scale)
    out["models"] = time_models(
        torch, scale, repeats, _stepper, SETTINGS, base="compiled", counts_key="exact_counts",
        before=torch._dynamo.reset,
    )  # fmt: skip
    return out


def summary_lines(res: dict[str, Any] | None) -> list[str]:
    """Markdown lines for ``summary.md`` (empty when the phase did not run)."""
    return step_table(
        res, "### Compiled training steps: bitfold.torch.compile against torch.compile",
        base=("compiled", "torch.compile"),
        others=(("exact_compiled", "bitfold.torch.compile"), ("exact_mode", "eager exact_mode")),
        counts_key="exact_counts", counts_title="folds made exact (compile counts)",
        note=" The exact compiled step's folds are exact; the rest is inductor's, so its bits "
        "are not the eager step's.",
    )  # fmt: skip
