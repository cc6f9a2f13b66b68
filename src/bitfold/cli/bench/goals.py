"""The goals a benchmark run is checked against, computed from ``results.json`` alone.

The seed goals: ``exact`` at most 1.0x ``np.add.at`` at the seed configuration, and
the plan plus one exact fold under 48 bytes per element above the inputs for a
Zipf(1.3) map of 3 million values into 100,000 buckets.

The fold goals (:data:`FOLD_GOALS`): each goal is a ratio of two contenders measured in
the same run on the same case (medians over the repeats), or a memory figure,
checked against a limit on every case of one sweep:

1. scalar exact fold into K >= 10^5 buckets (the ``k`` sweep): at most 1.0x
   ``torch.scatter_add_``;
2. exact folds of rows (the uniform cases of the ``rows`` sweep): at most 1.0x
   ``torch.Tensor.index_add_``, and at most 2.0x with the plan built in the call;
3. float16 and bfloat16 (the ``dtype`` sweep): at most 1.0x
   ``torch.scatter_add_`` of the same dtype; float64 at most 1.5x ``np.add.at``;
4. the seed configuration keeps its speed: at most 1.0x ``np.add.at``;
5. plan plus one exact fold at most 48 bytes per index entry above the inputs
   and the output (the ``memory`` sweep: uniform, Zipf(1.3) and hot maps, K up
   to 10^7), from the worker's peak memory.

A goal is ``met`` when every case it covers was measured and meets the limit,
``False`` when a measured case misses it, ``None`` when nothing (or not every
case) was measured without a miss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The seed configuration's speed goal and the Zipf(1.3) memory goal.
SEED_RATIO_GOAL = 1.0  # exact at most 1.0x np.add.at at the seed configuration
MEMORY_GOAL_BYTES_PER_ELEMENT = 48.0  # plan + exact fold above the inputs, Zipf(1.3) 3M -> 100k
#: The memory fold goal: plan + one exact fold above the inputs *and the output*.
MEMORY_GOAL_BYTES_PER_ENTRY = 48.0
ZIPF_MEMORY_CASE = {"n": 3_000_000, "k": 100_000, "skew": "zipf1.3"}


# -- lookups ---------------------------------------------------------------------------------
def row(res: dict[str, Any], case_id: str, contender: str) -> dict[str, Any] | None:
    """The result row of ``contender`` on a case, or None."""
    for r in res["results"]:
        if r["case"] == case_id and r["contender"] == contender:
            return r
    return None


def sweep_cases(res: dict[str, Any], sweep: str) -> list[dict[str, Any]]:
    """The case records a sweep visited, in the order of the run."""
    return [c for c in res["cases"] if sweep in c["sweeps"]]


def _median(r: dict[str, Any] | None) -> float | None:
    return r.get("median_s") if r and r["status"] == "ok" else None


def _why_missing(r: dict[str, Any] | None, name: str) -> str:
    if r is None:
        return f"{name} did not run"
    if r["status"] != "ok":
        return f"{name} {r['status']}: {r.get('reason') or ''}".strip()
    return f"{name} has no timed repeat"


def output_bytes(case: dict[str, Any]) -> int:
    """Bytes of a case's sums (recorded by the bench; derived for older results)."""
    if case.get("output_bytes") is not None:
        return int(case["output_bytes"])
    return (
        int(case["k"]) * max(1, int(case.get("d") or 0)) * (8 if case["dtype"] == "float64" else 4)
    )


# -- one goal --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Goal:
    """One checked goal: ``ours`` against ``peer`` (a ratio) or a memory figure, per case."""

    key: str
    number: int
    title: str
    limit: float
    select: Callable[[dict[str, Any]], list[dict[str, Any]]]  # results -> the cases it covers
    label: Callable[[dict[str, Any]], str]  # a case -> its name in the goal line
    ours: str = "bitfold-exact"
    peer: str | None = None  # None: a memory goal (bytes per index entry)

    @property
    def statement(self) -> str:
        if self.peer is None:
            return (f"plan + one exact fold <= {self.limit:g} bytes per index entry above the "
                    "inputs and the output")  # fmt: skip
        return f"`{self.ours}` <= {self.limit:g}x `{self.peer}`"

    def point(self, res: dict[str, Any], case: dict[str, Any]) -> dict[str, Any]:
        """The measured figure on one case, whether it meets the limit, and why it is missing."""
        mine = row(res, case["id"], self.ours)
        p: dict[str, Any] = {"case": case["id"], "label": self.label(case), "value": None,
                             "route": (mine or {}).get("route")}  # fmt: skip
        if self.peer is None:
            peak = (mine or {}).get("peak_bytes")
            if mine is None or mine["status"] != "ok" or peak is None:
                why = (mine or {}).get("memory_reason") or "no peak memory was measured"
                p["missing"] = (
                    why if mine and mine["status"] == "ok" else _why_missing(mine, self.ours)
                )
                return p
            p["peak_bytes"] = int(peak)
            p["output_bytes"] = output_bytes(case)
            p["value"] = (peak - p["output_bytes"]) / max(1, int(case["n"]))
        else:
            other = row(res, case["id"], self.peer)
            a, b = _median(mine), _median(other)
            if a is None or b is None:
                p["missing"] = _why_missing(mine, self.ours) if a is None else _why_missing(
                    other, self.peer)  # fmt: skip
                return p
            p.update(ours_ms=a * 1e3, peer_ms=b * 1e3, value=a / b)
        p["met"] = p["value"] <= self.limit
        return p

    def evaluate(self, res: dict[str, Any]) -> dict[str, Any]:
        """This goal's record in ``results.json``'s ``goals``."""
        points = [self.point(res, c) for c in self.select(res)]
        return {
            "key": self.key, "number": self.number, "title": self.title,
            "goal": self.statement, "limit": self.limit, "ours": self.ours, "peer": self.peer,
            "unit": "x" if self.peer else "B/entry", "points": points,
            **judge(points, self.limit),
        }  # fmt: skip


def judge(points: list[dict[str, Any]], limit: float) -> dict[str, Any]:
    """``worst``, ``met`` and ``missed_by`` of a goal's points (each with ``value`` and ``met``):
    met when every point was measured and meets ``limit``, False when one misses it, else None."""
    values = [p["value"] for p in points if p["value"] is not None]
    worst = max(values) if values else None
    if any(p.get("met") is False for p in points):
        met: bool | None = False
    elif values and len(values) == len(points):
        met = True
    else:
        met = None
    missed_by = (worst / limit - 1) if worst is not None and met is False else None
    return {"worst": worst, "met": met, "missed_by": missed_by}


def _k_cases(res: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((c for c in sweep_cases(res, "k") if c["k"] >= 100_000), key=lambda c: c["k"])


def _uniform_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in sweep_cases(res, "rows") if c["skew"] == "uniform"]


def _dtypes(*names: str) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
    return lambda res: [c for c in sweep_cases(res, "dtype") if c["dtype"] in names]


def _seed(res: dict[str, Any]) -> list[dict[str, Any]]:
    return sweep_cases(res, "seed")[:1]


def _memory(res: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(sweep_cases(res, "memory"), key=lambda c: (c["k"], c["skew"]))


def _shape(c: dict[str, Any]) -> str:
    return f"({c['n']:,}, {c.get('d') or 1:,}, {c['k']:,})"


FOLD_GOALS: tuple[Goal, ...] = (
    Goal("k-scalar", 1, "scalar exact fold into 10^5 to 10^7 buckets", 1.0, _k_cases,
         lambda c: f"K = {c['k']:,}", peer="torch-scatter-add"),
    Goal("rows", 2, "exact fold of rows, plan built once", 1.0, _uniform_rows, _shape,
         peer="torch-index-add"),
    Goal("rows-new-plan", 2, "exact fold of rows, plan built in the same call", 2.0,
         _uniform_rows, _shape, ours="bitfold-exact-new-plan", peer="torch-index-add"),
    Goal("half", 3, "float16 and bfloat16 exact at the seed configuration", 1.0,
         _dtypes("float16", "bfloat16"), lambda c: c["dtype"], peer="torch-scatter-add"),
    Goal("float64", 3, "float64 exact at the seed configuration", 1.5, _dtypes("float64"),
         lambda c: c["dtype"], peer="numpy-add-at"),
    Goal("seed", 4, "the seed configuration keeps its speed", 1.0, _seed,
         lambda c: f"N = {c['n']:,}, K = {c['k']:,}", peer="numpy-add-at"),
    Goal("memory", 5, "memory of a plan plus one exact fold", MEMORY_GOAL_BYTES_PER_ENTRY,
         _memory, lambda c: f"{c['skew']} N = {c['n']:,} K = {c['k']:,}"),
)  # fmt: skip


# -- all goals -------------------------------------------------------------------------------
def _zipf_memory_case(res: dict[str, Any]) -> dict[str, Any] | None:
    mine = sweep_cases(res, "memory")
    want = next((c for c in mine if all(c[k] == v for k, v in ZIPF_MEMORY_CASE.items())), None)
    return want or next(iter(mine), None)


def goals(res: dict[str, Any]) -> dict[str, Any]:
    """The seed measurements (seed ratio, Zipf memory, Numba start-up) and the fold goals."""
    out: dict[str, Any] = {}
    seed = next(iter(_seed(res)), None)
    if seed is not None:
        get = lambda name: _median(row(res, seed["id"], name))  # noqa: E731
        exact, base, sa = get("bitfold-exact"), get("numpy-add-at"), get("torch-scatter-add")
        out["seed"] = {
            "case": seed["id"],
            "exact_ms": None if exact is None else exact * 1e3,
            "add_at_ms": None if base is None else base * 1e3,
            "scatter_add_ms": None if sa is None else sa * 1e3,
            "exact_vs_add_at": exact / base if exact and base else None,
            "exact_vs_scatter_add": exact / sa if exact and sa else None,
            "goal": f"exact <= {SEED_RATIO_GOAL}x np.add.at",
        }
        ratio = out["seed"]["exact_vs_add_at"]
        out["seed"]["met"] = None if ratio is None else ratio <= SEED_RATIO_GOAL
    mem = _zipf_memory_case(res)
    if mem is not None:
        r = row(res, mem["id"], "bitfold-exact")
        bpe = r.get("bytes_per_element") if r else None
        out["memory"] = {
            "case": mem["id"],
            "bytes_per_element": bpe,
            "peak_bytes": r.get("peak_bytes") if r else None,
            "goal": f"plan + exact fold < {MEMORY_GOAL_BYTES_PER_ELEMENT:g} bytes/element "
            "above the inputs",
            "met": None if bpe is None else bpe < MEMORY_GOAL_BYTES_PER_ELEMENT,
        }
    st = res.get("startup") or {}
    if st.get("status") == "ok":
        out["startup"] = {
            "cold_process_s": st["cold"]["process_s"],
            "warm_process_s": st["warm"]["process_s"],
            "cold_steps_s": st["cold"]["total_steps_s"],
            "warm_steps_s": st["warm"]["total_steps_s"],
        }
    fold_goals = [g.evaluate(res) for g in FOLD_GOALS]
    out["issue10"] = [g for g in fold_goals if g["points"]]
    for key, base, settings in (("steps", "plain", ("exact_mode", "deterministic")),
                                ("compiled_steps", "compiled", ("exact_compiled", "exact_mode"))):
        phase = res.get(key) or {}
        if phase.get("status") == "ok":
            out[key] = {
                name: {**{f"{s}_over_{base}": m[f"over_{base}"][s] for s in settings},
                       "met": m["goal_met"]}
                for name, m in phase["models"].items()
            }  # fmt: skip
    return out


# -- lines -----------------------------------------------------------------------------------
def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def _verdict(g: dict[str, Any]) -> str:
    if g["met"] is True:
        return "met"
    if g["met"] is False:
        return f"MISSED by {g['missed_by']:.0%} (worst {_figure(g['worst'], g['unit'])})"
    return "not measured on every case"


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}x" if unit == "x" else f"{value:.1f} B"


def goal_line(g: dict[str, Any]) -> str:
    """One Markdown line: the goal, its figure on every case, and whether it is met."""
    parts = []
    for p in g["points"]:
        if p["value"] is None:
            parts.append(f"{p['label']}: not measured ({p.get('missing', '')})")
            continue
        extra = f" ({p['ours_ms']:.3g} vs {p['peer_ms']:.3g} ms)" if "ours_ms" in p else ""
        flag = "" if p["met"] else " ✗"
        parts.append(f"{p['label']}: {_figure(p['value'], g['unit'])}{extra}{flag}")
    return (f"goal {g['number']}, {g['title']}: {g['goal']} — {'; '.join(parts)} → "
            f"{_verdict(g)}")  # fmt: skip


def goal_lines(g: dict[str, Any]) -> list[str]:
    """The goals as text lines: the fold goals, then the seed goals and the start-up times."""
    lines = [goal_line(x) for x in g.get("issue10", [])]
    met = {True: "met", False: "NOT met", None: "not measured"}
    if "seed" in g:
        s = g["seed"]
        lines.append(
            f"seed configuration: exact {_num(s['exact_ms'])} ms, np.add.at "
            f"{_num(s['add_at_ms'])} ms ({_num(s['exact_vs_add_at'])}x; goal "
            f"<= {SEED_RATIO_GOAL}x: {met[s['met']]}), torch scatter_add_ "
            f"{_num(s['scatter_add_ms'])} ms ({_num(s['exact_vs_scatter_add'])}x)"
        )
    if "memory" in g:
        m = g["memory"]
        lines.append(
            f"Zipf(1.3) memory: plan + exact fold {_num(m['bytes_per_element'], '{:.1f}')}"
            f" bytes/element above the inputs (goal < {MEMORY_GOAL_BYTES_PER_ELEMENT:g}: "
            f"{met[m['met']]})"
        )
    if "startup" in g:
        s = g["startup"]
        lines.append(
            f"Numba start-up: cold {s['cold_process_s']:.1f} s, warm (cached) "
            f"{s['warm_process_s']:.1f} s per fresh process"
        )
    for name, s in g.get("steps", {}).items():
        lines.append(
            f"issue 11, a training step of the {name} model under exact_mode: "
            f"{s['exact_mode_over_plain']:.2f}x the plain step (goal <= 1.5x: "
            f"{met[s['met']]}); deterministic PyTorch {s['deterministic_over_plain']:.2f}x"
        )
    for name, s in g.get("compiled_steps", {}).items():
        lines.append(
            f"issue 18, a compiled training step of the {name} model by bitfold.torch.compile: "
            f"{s['exact_compiled_over_compiled']:.2f}x the torch.compile step (goal <= 1.5x: "
            f"{met[s['met']]}); the eager exact_mode step {s['exact_mode_over_compiled']:.2f}x"
        )
    return lines
