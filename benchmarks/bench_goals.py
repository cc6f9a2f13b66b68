"""The project's performance goals, judged from a ``bitfold bench`` results.json.

``bitfold bench`` measures and reports; whether its figures meet the targets this
project set for itself is decided here, from the JSON alone (nothing is measured):

    python benchmarks/bench_goals.py RESULTS.json [--allreduce ALLREDUCE.json]
        [--json OUT.json] [--markdown]

One line per goal: its figure on every case it covers, then ``met``, ``MISSED by x%``
or ``not measured`` (with why). Exit status 0 when no goal is missed, 1 when one is,
2 when an input cannot be read. ``--json`` writes the records, ``--markdown`` prints
the lines as a Markdown list under a heading.

Every goal is a ratio of medians of two contenders measured in the same run on the
same inputs, or a memory figure, checked against a limit on every case it covers
(:data:`GOALS`); the training steps are judged per model from the ``steps`` and
``compiled_steps`` phases, the all-reduce and the data-parallel step from the JSON of
``benchmarks/allreduce.py`` (``--allreduce``; by default ``allreduce.json`` beside
RESULTS.json, or the copy an older bench wrote into its results). A goal is ``met``
when every case it covers was measured and meets the limit, missed when a measured
case misses it, and ``not measured`` when nothing (or not every case) was measured
without a miss.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Case = dict[str, Any]
Select = Callable[[dict[str, Any]], list[Case]]

#: The all-reduce goals: the exact all-reduce's time over a float32 all-reduce's, the
#: data-parallel step with GradientSum over DDP's, and the sizes judged, (processes,
#: elements), a record matching within a factor of 1.25.
ALLREDUCE_LIMIT, DP_STEP_LIMIT = 3.0, 1.3
ALLREDUCE_POINTS = ((2, 4_000_000), (2, 16_000_000), (4, 4_000_000), (4, 16_000_000))
ALLREDUCE_FILE = "allreduce.json"
#: A training step, eager under exact_mode or compiled by bitfold.torch.compile, at most
#: this many of its plain (or torch.compile) counterpart's.
STEP_LIMIT = 1.5
#: The Zipf(1.3) memory point: plan plus one exact fold under this many bytes per value.
ZIPF_MEMORY = {"n": 3_000_000, "k": 100_000, "skew": "zipf1.3"}
MEMORY_LIMIT = 48.0


class InputError(Exception):
    """An input file that cannot be read or is not what it should be."""


# -- lookups ---------------------------------------------------------------------------------
def row(res: dict[str, Any], case_id: str, contender: str) -> dict[str, Any] | None:
    """The result row of ``contender`` on a case, or None."""
    return next((r for r in res["results"] if r["case"] == case_id and r["contender"] == contender),
                None)  # fmt: skip


def sweep(*names: str) -> Select:
    """The cases any of the sweeps ``names`` visited, in the order of the run."""
    return lambda res: [c for c in res["cases"] if set(names) & set(c["sweeps"])]


def output_bytes(case: Case) -> int:
    """Bytes of a case's sums (recorded by the bench; derived for older results)."""
    if case.get("output_bytes") is not None:
        return int(case["output_bytes"])
    width = max(1, int(case.get("d") or 0))
    return int(case["k"]) * width * (8 if case["dtype"] == "float64" else 4)


def _median(r: dict[str, Any] | None) -> float | None:
    return r.get("median_s") if r and r["status"] == "ok" else None


def _why_missing(r: dict[str, Any] | None, name: str) -> str:
    if r is None:
        return f"{name} did not run"
    if r["status"] != "ok":
        return f"{name} {r['status']}: {r.get('reason') or ''}".strip()
    return f"{name} has no timed repeat"


def _label(c: Case) -> str:
    """A case in a goal line: its sizes, then its map and dtype where they are not the usual."""
    if c.get("d"):  # rows: the map always named
        label = f"rows ({c['n']:,}, {c['d']:,}, {c['k']:,}) {c['skew']}"
    else:
        label = f"N = {c['n']:,}, K = {c['k']:,}" + (
            "" if c["skew"] == "uniform" else f", {c['skew']}")  # fmt: skip
    return label + ("" if c.get("dtype", "float32") == "float32" else f", {c['dtype']}")


def judge(points: list[dict[str, Any]], limit: float) -> dict[str, Any]:
    """``worst``, ``met`` and ``missed_by`` of a goal's points (each with ``value`` and
    ``met``): met when every point was measured and meets ``limit``, False when one misses
    it, else None."""
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


def _record(key: str, statement: str, limit: float, unit: str, points: list[dict[str, Any]],
            missing: str) -> dict[str, Any]:  # fmt: skip
    """A goal's record; with no point at all, one "every case" point saying what is missing."""
    points = points or [{"case": None, "label": "every case", "value": None, "missing": missing}]
    return {"key": key, "goal": statement, "limit": limit, "unit": unit, "points": points,
            **judge(points, limit)}  # fmt: skip


# -- goals on the cases of a run -------------------------------------------------------------
@dataclass(frozen=True)
class Goal:
    """``ours`` at most ``limit`` times ``peer`` (a ratio of medians) on every case ``select``
    returns; with no peer, a memory goal: peak bytes per index entry above the inputs and the
    output (``per="entry"``) or above the inputs only (``per="value"``)."""

    key: str
    what: str
    limit: float
    select: Select
    sweeps: str  # what to run to measure it
    ours: str = "bitfold-exact"
    peer: str | None = None
    per: str = "entry"

    @property
    def statement(self) -> str:
        if self.peer is not None:
            return f"{self.what}: `{self.ours}` <= {self.limit:g}x `{self.peer}`"
        above = "the inputs and the output" if self.per == "entry" else "the inputs"
        return (f"{self.what}: plan + one exact fold <= {self.limit:g} bytes per index entry "
                f"above {above}")  # fmt: skip

    def point(self, res: dict[str, Any], case: Case) -> dict[str, Any]:
        mine = row(res, case["id"], self.ours)
        p: dict[str, Any] = {"case": case["id"], "label": _label(case), "value": None,
                             "route": (mine or {}).get("route")}  # fmt: skip
        if self.peer is None:
            peak = (mine or {}).get("peak_bytes")
            if mine is None or mine["status"] != "ok" or peak is None:
                ok = mine is not None and mine["status"] == "ok"
                p["missing"] = ((mine or {}).get("memory_reason") or "no peak memory was measured"
                                if ok else _why_missing(mine, self.ours))  # fmt: skip
                return p
            above = output_bytes(case) if self.per == "entry" else 0
            p["value"] = (int(peak) - above) / max(1, int(case["n"]))
        else:
            other = row(res, case["id"], self.peer)
            a, b = _median(mine), _median(other)
            if a is None or b is None:
                p["missing"] = (_why_missing(mine, self.ours) if a is None
                                else _why_missing(other, self.peer))  # fmt: skip
                return p
            p.update(ours_ms=a * 1e3, peer_ms=b * 1e3, value=a / b)
        p["met"] = p["value"] <= self.limit
        return p

    def evaluate(self, res: dict[str, Any]) -> dict[str, Any]:
        points = [self.point(res, c) for c in self.select(res)]
        record = _record(self.key, self.statement, self.limit, "x" if self.peer else "B",
                         points, f"run the `{self.sweeps}` sweep")  # fmt: skip
        return {**record, "ours": self.ours, "peer": self.peer}


def _large_k(res: dict[str, Any]) -> list[Case]:
    cases = (c for c in sweep("k")(res) if c["k"] >= 100_000 and not c.get("d"))
    return sorted(cases, key=lambda c: c["k"])


def _uniform_rows(res: dict[str, Any]) -> list[Case]:
    return [c for c in sweep("rows")(res) if c["skew"] == "uniform"]


def _dtypes(*names: str) -> Select:
    return lambda res: [c for c in sweep("dtype")(res) if c["dtype"] in names]


def _seed(res: dict[str, Any]) -> list[Case]:
    return sweep("seed")(res)[:1]


def _memory(res: dict[str, Any]) -> list[Case]:
    return sorted(sweep("memory")(res), key=lambda c: (c["k"], c["skew"]))


def _zipf_memory(res: dict[str, Any]) -> list[Case]:
    return [c for c in sweep("memory")(res) if all(c[k] == v for k, v in ZIPF_MEMORY.items())]


def _under_load(res: dict[str, Any]) -> dict[str, Any]:
    """The ``load`` phase as a run of its own: its one case and its rows."""
    load = res.get("load") or {}
    if load.get("status") != "ok":
        return {"cases": [], "results": []}
    return {"cases": [load["case"]], "results": load["results"]}


GOALS: tuple[Goal, ...] = (
    Goal("seed", "the seed configuration", 1.0, _seed, "seed", peer="numpy-add-at"),
    Goal("seed-strict", "the seed configuration, twice as fast", 0.5, _seed, "seed",
         peer="numpy-add-at"),
    Goal("seed-ordered", "ordered at the seed configuration", 1.0, _seed, "seed",
         ours="bitfold-ordered", peer="numpy-add-at"),
    Goal("large-k", "scalars into 10^5 to 10^7 buckets", 1.0, _large_k, "k",
         peer="torch-scatter-add"),
    Goal("rows", "rows, plan built once", 1.0, _uniform_rows, "rows", peer="torch-index-add"),
    Goal("rows-new-plan", "rows, plan built in the call", 2.0, _uniform_rows, "rows",
         ours="bitfold-exact-new-plan", peer="torch-index-add"),
    Goal("rows-xla", "rows, plan built once, against XLA", 1.0, sweep("rows", "xla-rows"),
         "xla-rows", peer="jax-segment-sum"),
    Goal("oneshot", "one-shot bitfold.segment_sum", 1.0, sweep("oneshot"), "oneshot",
         ours="bitfold-exact-new-plan", peer="torch-index-add"),
    Goal("half", "float16 and bfloat16", 1.0, _dtypes("float16", "bfloat16"), "dtype",
         peer="torch-scatter-add"),
    Goal("float64", "float64", 1.5, _dtypes("float64"), "dtype", peer="numpy-add-at"),
    Goal("memory", "memory", MEMORY_LIMIT, _memory, "memory"),
    Goal("memory-zipf", "memory of a Zipf(1.3) map, 3M values into 100,000 buckets",
         MEMORY_LIMIT, _zipf_memory, "memory", per="value"),
)  # fmt: skip
#: Judged on the ``load`` phase's own case and rows.
LOAD_GOAL = Goal("load", "the seed configuration with one extra busy process", 1.0,
                 sweep("load"), "load", peer="numpy-add-at")  # fmt: skip


# -- the training steps ----------------------------------------------------------------------
def step_goal(res: dict[str, Any], phase: str) -> dict[str, Any]:
    """A step phase per model: the exact step's time over its counterpart's."""
    setting, base, what = {
        "steps": ("exact_mode", "plain", "a training step under exact_mode"),
        "compiled_steps": ("exact_compiled", "compiled",
                           "a training step compiled by bitfold.torch.compile"),
    }[phase]  # fmt: skip
    record = res.get(phase) or {}
    points = []
    for name, m in (record.get("models") or {}).items() if record.get("status") == "ok" else ():
        value = m[f"over_{base}"][setting]
        ms = {k: m["median_s"][k] * 1e3 for k in (setting, base)}
        points.append({"case": None, "label": f"{name} model", "value": value,
                       "ours_ms": ms[setting], "peer_ms": ms[base], "met": value <= STEP_LIMIT})
    why = f"the `{phase}` phase " + (f"was {record['status']}" if record else "did not run")
    peer = "torch.compile" if base == "compiled" else base
    statement = f"{what}: <= {STEP_LIMIT:g}x the {peer} step"
    return _record(phase.replace("_", "-"), statement, STEP_LIMIT, "x", points, why)


# -- the all-reduce --------------------------------------------------------------------------
def read_json(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``, or an InputError naming the file and the fault."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise InputError(f"cannot read the {what} {str(path)!r}: {err.strerror or err}") from None
    except ValueError as err:
        raise InputError(f"cannot read the {what} {str(path)!r}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise InputError(f"{str(path)!r} is not the {what}: not a JSON object")
    return data


def read_allreduce(path: str | Path) -> dict[str, Any]:
    """``benchmarks/allreduce.py``'s JSON: ``allreduce`` records (``processes``,
    ``elements``, ``float32_ms``, ``exact_ms``, ``time_ratio``, ``bytes_ratio``) and ``step``
    records (``processes``, ``parameters``, ``ddp_ms``, ``gradientsum_ms``, ``ratio``)."""
    data = read_json(path, "all-reduce results")
    if not any(isinstance(data.get(k), list) for k in ("allreduce", "step")):
        raise InputError(f"{str(path)!r} is not benchmarks/allreduce.py's JSON: it has no "
                         "'allreduce' or 'step' list")  # fmt: skip
    return {"source": str(path), **data}


def _ratio(r: dict[str, Any], key: str, ours: str, peer: str) -> float | None:
    if r.get(key) is not None:
        return float(r[key])
    if r.get(ours) is not None and r.get(peer):
        return float(r[ours]) / float(r[peer])
    return None


def _point(label: str, r: dict[str, Any] | None, value: float | None, ours: str, peer: str,
           limit: float, missing: str) -> dict[str, Any]:  # fmt: skip
    p: dict[str, Any] = {"case": None, "label": label, "value": value}
    if r is None or value is None:
        p["missing"] = missing
        return p
    if r.get(ours) is not None and r.get(peer) is not None:
        p.update(ours_ms=float(r[ours]), peer_ms=float(r[peer]))
    p["met"] = value <= limit
    return p


def _close(n: float, target: int) -> bool:
    return n > 0 and abs(math.log(n / target)) < math.log(1.25)


def allreduce_goals(data: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The all-reduce's two records: its time against a float32 all-reduce, and the
    data-parallel step with GradientSum against DDP's."""
    none = "no all-reduce results (pass --allreduce, or put allreduce.json beside the results)"
    rows = (data or {}).get("allreduce") or []
    points = []
    for procs, n in ALLREDUCE_POINTS:
        r = next((x for x in rows if x.get("processes") == procs
                  and _close(float(x.get("elements") or 0), n)), None)  # fmt: skip
        value = None if r is None else _ratio(r, "time_ratio", "exact_ms", "float32_ms")
        p = _point(f"{procs} processes, {n / 1e6:g}M elements", r, value, "exact_ms",
                   "float32_ms", ALLREDUCE_LIMIT,
                   none if data is None else "not in the all-reduce results")  # fmt: skip
        if r is not None and r.get("bytes_ratio") is not None:
            p["bytes_ratio"] = float(r["bytes_ratio"])
        points.append(p)
    steps = [_point(f"{s.get('processes')} processes, {int(s.get('parameters') or 0):,} "
                    "parameters", s, _ratio(s, "ratio", "gradientsum_ms", "ddp_ms"),
                    "gradientsum_ms", "ddp_ms", DP_STEP_LIMIT, "no ratio recorded")
             for s in (data or {}).get("step") or []]  # fmt: skip
    source = f" ({data['source']})" if data and data.get("source") else ""
    return [
        _record("allreduce", f"exact all-reduce, 2 and 4 gloo processes{source}: <= "
                f"{ALLREDUCE_LIMIT:g}x a float32 all_reduce", ALLREDUCE_LIMIT, "x", points, none),
        _record("dp-step", f"data-parallel step{source}: GradientSum <= {DP_STEP_LIMIT:g}x the "
                "DDP step", DP_STEP_LIMIT, "x", steps,
                none if data is None else "no data-parallel step in the results"),
    ]  # fmt: skip


# -- all goals -------------------------------------------------------------------------------
def goals(res: dict[str, Any], allreduce: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every goal's record, in order, from a results dict and the all-reduce's (or None)."""
    records = [g.evaluate(res) for g in GOALS]
    load = LOAD_GOAL.evaluate(_under_load(res))
    records += [{**load, "busy": (res.get("load") or {}).get("busy")}]
    records += [step_goal(res, "steps"), step_goal(res, "compiled_steps")]
    return records + allreduce_goals(allreduce)


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:.2f}x" if unit == "x" else f"{value:.1f} B"


def _verdict(g: dict[str, Any]) -> str:
    if g["met"] is True:
        return "met"
    if g["met"] is False:
        return f"MISSED by {g['missed_by']:.0%} (worst {_figure(g['worst'], g['unit'])})"
    return "not measured on every case"


def goal_line(g: dict[str, Any]) -> str:
    """One line: the goal, its figure on every case, and whether it is met."""
    parts = []
    for p in g["points"]:
        if p["value"] is None:
            parts.append(f"{p['label']}: not measured ({p.get('missing', '')})")
            continue
        extra = f" ({p['ours_ms']:.3g} vs {p['peer_ms']:.3g} ms)" if "ours_ms" in p else ""
        parts.append(f"{p['label']}: {_figure(p['value'], g['unit'])}{extra}"
                     + ("" if p["met"] else " ✗"))  # fmt: skip
    return f"{g['key']}, {g['goal']} — {'; '.join(parts)} → {_verdict(g)}"


def find_allreduce(path: str | None, results: Path, res: dict[str, Any]) -> dict[str, Any] | None:
    """The all-reduce results: ``path`` if given, else :data:`ALLREDUCE_FILE` beside the
    results, else the copy that results.json files of older benches carry (``allreduce``),
    else None."""
    if path:
        return read_allreduce(path)
    beside = results.parent / ALLREDUCE_FILE
    return read_allreduce(beside) if beside.is_file() else res.get("allreduce")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results.json written by bitfold bench")
    parser.add_argument("--allreduce", metavar="JSON", default=None,
                        help="benchmarks/allreduce.py's JSON (default: allreduce.json beside "
                        "the results, if there)")  # fmt: skip
    parser.add_argument("--json", metavar="OUT", default=None, help="write the records here")
    parser.add_argument("--markdown", action="store_true", help="a Markdown list under a heading")
    args = parser.parse_args(argv)
    try:
        res = read_json(args.results, "bench results")
        if not all(isinstance(res.get(k), list) for k in ("cases", "results")):
            raise InputError(f"{args.results!r} is not a bitfold bench results.json (no "
                             "'cases' and 'results' lists)")  # fmt: skip
        allreduce = find_allreduce(args.allreduce, Path(args.results), res)
    except InputError as err:
        print(f"bench_goals: {err}", file=sys.stderr)
        return 2
    records = goals(res, allreduce)
    lines = [goal_line(g) for g in records]
    if args.markdown:
        lines = ["## Goals", "", f"Judged by `benchmarks/bench_goals.py` from {args.results}: "
                 "ratios of medians measured in one run on the same inputs (the all-reduce from "
                 "its own results); ✗ marks a case that misses its goal.", "",
                 *(f"- {line}" for line in lines)]  # fmt: skip
    print("\n".join(lines))
    missed = any(g["met"] is False for g in records)
    if args.json:
        verdicts = [g["met"] for g in records]
        overall = False if missed else (True if all(verdicts) else None)
        summary = {"results": args.results, "allreduce": (allreduce or {}).get("source"),
                   "met": overall, "goals": records}  # fmt: skip
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
