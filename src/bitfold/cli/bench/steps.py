"""Whole training steps under ``bitfold.torch.exact_mode()`` against the same steps in PyTorch.

Two small models whose gradients go through scatter-adds:

* ``graph``: a two-layer message-passing network on a random graph (4,000
  nodes, 40,000 edges, 32 features, 8 classes), node classification. Messages
  are gathered with ``h[src]`` and summed into their destinations with
  ``scatter_add_`` (index expanded along the features, as graph libraries
  pass it) in one layer and ``index_add_`` in the other, so the forward has
  two folds and the backward two more (``index_put`` with ``accumulate``).
* ``embedding-bag``: an ``nn.EmbeddingBag`` (50,000 x 64, mode ``"mean"``,
  bags of 30 ids, 256 bags a step) and a linear classifier: the embedding-bag
  backward is the fold.

Each model is trained with Adam in three settings, each on its own copy of the
same initial model: ``plain`` (PyTorch as it is), ``deterministic`` (the step
inside ``torch.use_deterministic_algorithms(True)``) and ``exact_mode`` (the
step inside ``bitfold.torch.exact_mode()``). A step is ``zero_grad``, the
forward, the loss, the backward and the optimiser step. The settings take
turns, one step each, in an order rotated every round (so load from elsewhere
slows them alike); the first rounds warm up (Numba compiles bitfold's kernels),
then the median of the timed rounds is reported with its ratio to ``plain``.
``exact_mode``'s counts say which folds it made exact in one step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

SETTINGS = ("plain", "deterministic", "exact_mode")
WARMUP_ROUNDS = 3


def _graph_model(torch: Any, scale: float) -> tuple[Any, Callable[[Any], Any]]:
    """A message-passing network and its loss on a fixed random graph."""
    nn = torch.nn
    gen = torch.Generator().manual_seed(0)
    nodes, edges = max(64, int(4000 * scale)), max(256, int(40_000 * scale))
    features, classes = 32, 8
    x = torch.randn(nodes, features, generator=gen)
    src = torch.randint(0, nodes, (edges,), generator=gen)
    dst = torch.randint(0, nodes, (edges,), generator=gen)
    y = torch.randint(0, classes, (nodes,), generator=gen)

    class Layer(nn.Module):
        def __init__(self, d_in: int, d_out: int, scatter: bool) -> None:
            super().__init__()
            self.own = nn.Linear(d_in, d_out)
            self.message = nn.Linear(d_in, d_out, bias=False)
            self.scatter = scatter

        def forward(self, h: Any) -> Any:
            msg = self.message(h)[src]  # backward: index_put(accumulate=True)
            agg = torch.zeros(h.shape[0], msg.shape[1], dtype=h.dtype)
            if self.scatter:  # the graph libraries' form: an index expanded along the features
                agg = agg.scatter_add_(0, dst.unsqueeze(1).expand_as(msg), msg)
            else:
                agg = agg.index_add_(0, dst, msg)
            return self.own(h) + agg

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = Layer(features, 64, scatter=True)
            self.second = Layer(64, classes, scatter=False)

        def forward(self) -> Any:
            return self.second(torch.relu(self.first(x)))

    torch.manual_seed(0)
    model = Net()
    return model, lambda m: nn.functional.cross_entropy(m(), y)


def _bag_model(torch: Any, scale: float) -> tuple[Any, Callable[[Any], Any]]:
    """An embedding-bag classifier and its loss on a fixed batch of bags."""
    nn = torch.nn
    gen = torch.Generator().manual_seed(1)
    rows, dim, bags, per_bag = max(1000, int(50_000 * scale)), 64, max(16, int(256 * scale)), 30
    ids = torch.randint(0, rows, (bags * per_bag,), generator=gen)
    offsets = torch.arange(0, bags * per_bag, per_bag)
    y = torch.randint(0, 2, (bags,), generator=gen)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag = nn.EmbeddingBag(rows, dim, mode="mean")
            self.head = nn.Linear(dim, 2)

        def forward(self) -> Any:
            return self.head(self.bag(ids, offsets))

    torch.manual_seed(1)
    model = Net()
    return model, lambda m: nn.functional.cross_entropy(m(), y)


MODELS: dict[str, tuple[str, Callable[[Any, float], tuple[Any, Callable[[Any], Any]]]]] = {
    "graph": ("message passing: 4,000 nodes, 40,000 edges, 32 -> 64 -> 8", _graph_model),
    "embedding-bag": ("EmbeddingBag 50,000 x 64 (mean, 256 bags of 30) + linear", _bag_model),
}


def exact_mode_step(loss_of: Callable[[Any], Any], model: Any, opt: Any) -> dict[str, int]:
    """One step's backward under ``exact_mode()`` and the optimiser's step: its fold counts."""
    from ...torch import exact_mode

    with exact_mode() as mode:
        loss_of(model).backward()
    opt.step()
    return dict(mode.counts)


def _stepper(torch: Any, model: Any, loss_of: Callable[[Any], Any], setting: str) -> Callable:
    """One training step of ``model`` in ``setting``; returns the exact mode's counts, if any."""
    import copy

    own = copy.deepcopy(model)
    opt = torch.optim.Adam(own.parameters(), lr=1e-3)

    def step() -> dict[str, int] | None:
        opt.zero_grad(set_to_none=True)
        if setting == "exact_mode":
            return exact_mode_step(loss_of, own, opt)
        if setting == "deterministic":
            before = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(True)
            try:
                loss_of(own).backward()
            finally:
                torch.use_deterministic_algorithms(before)
        else:
            loss_of(own).backward()
        opt.step()
        return None

    return step


def time_in_turns(
    steps: dict[str, Callable[[], Any]], repeats: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Times of every setting's step, taking turns (module docstring); and the last counts seen.

    A step returns the counts of the folds it made exact, or None.
    """
    times: dict[str, list[float]] = {s: [] for s in steps}
    counts: dict[str, int] = {}
    order = list(steps)
    for r in range(WARMUP_ROUNDS + repeats):
        for setting in order:
            t0 = time.perf_counter()
            seen = steps[setting]()
            elapsed = time.perf_counter() - t0
            if r >= WARMUP_ROUNDS:
                times[setting].append(elapsed)
            if seen is not None:
                counts = seen
        order = order[1:] + order[:1]
    return times, counts


def measure_steps(*, repeats: int = 15, scale: float = 1.0) -> dict[str, Any]:
    """Step times of every model in every setting (see the module docstring)."""
    try:
        import torch
    except ImportError:
        return {"status": "skipped", "reason": "torch is not installed"}
    out = phase_record(torch, "warm-up rounds", repeats, scale)
    out["models"] = time_models(torch, scale, repeats, _stepper, SETTINGS, base="plain",
                                counts_key="exact_mode_counts")  # fmt: skip
    return out


def phase_record(torch: Any, warmup: str, repeats: int, scale: float) -> dict:
    """The head of a step phase's result: its method and environment."""
    return {
        "status": "ok",
        "method": "settings take turns one step each, order rotated every round; "
        f"{WARMUP_ROUNDS} {warmup}, then the median of {repeats} timed rounds",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "scale": scale,
        "models": {},
    }


def time_models(
    torch: Any,
    scale: float,
    repeats: int,
    stepper: Callable[..., Callable[[], Any]],
    settings: tuple[str, ...],
    *,
    base: str,
    counts_key: str,
    before: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Every model of :data:`MODELS` stepped in every setting, taking turns: medians, the
    ratio of each setting to ``base`` (``over_<base>``) and the fold counts. ``before()``
    runs before each model."""
    models: dict[str, Any] = {}
    for name, (description, build) in MODELS.items():
        model, loss_of = build(torch, scale)
        if before is not None:
            before()
        steps = {s: stepper(torch, model, loss_of, s) for s in settings}
        times, counts = time_in_turns(steps, repeats)
        medians = {s: statistics.median(t) for s, t in times.items()}
        ratios = {s: medians[s] / medians[base] for s in settings}
        models[name] = {
            "description": description, "median_s": medians, "times_s": times,
            f"over_{base}": ratios, counts_key: counts,
        }  # fmt: skip
    return models


def summary_lines(steps: dict[str, Any] | None) -> list[str]:
    """Markdown lines for ``summary.md`` (empty when the phase did not run)."""
    return step_table(
        steps, "### Training steps under exact_mode", base=("plain", "plain"),
        others=(("deterministic", "deterministic"), ("exact_mode", "exact_mode")),
        counts_key="exact_mode_counts", counts_title="folds made exact per step",
    )  # fmt: skip


def step_table(
    res: dict[str, Any] | None,
    title: str,
    *,
    base: tuple[str, str],
    others: tuple[tuple[str, str], ...],
    counts_key: str,
    counts_title: str,
    note: str = "",
) -> list[str]:
    """``summary.md`` lines of a step phase: a row a model, the ``base`` setting's time, then
    every other setting's time and its ratio to the base (``(setting, column title)``)."""
    if not res:
        return []
    if res.get("status") != "ok":
        return [title, "", f"skipped: {res.get('reason', 'unknown')}", ""]
    heads = " | ".join(f"{head} ms (x {base[1]})" for _, head in others)
    lines = [
        title,
        "",
        f"{res['method'][0].upper()}{res['method'][1:]}; torch {res['torch']}, "
        f"{res['threads']} threads.{note}",
        "",
        f"| model | {base[1]} ms | {heads} | {counts_title} |",
        "|---|---|" + "---|" * len(others) + "---|",
    ]
    for name, m in res["models"].items():
        med, ratio = m["median_s"], m[f"over_{base[0]}"]
        folds = ", ".join(f"{k} {v}" for k, v in sorted(m[counts_key].items())) or "none"
        cells = " | ".join(f"{1e3 * med[s]:.2f} ({ratio[s]:.2f}x)" for s, _ in others)
        lines.append(f"| {name}: {m['description']} | {1e3 * med[base[0]]:.2f} | {cells} | "
                     f"{folds} |")  # fmt: skip
    lines.append("")
    return lines
