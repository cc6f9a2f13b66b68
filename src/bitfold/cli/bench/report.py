"""Reading ``results.json``: the stdout table, the goals of issue 3, and ``summary.md``.

Everything here is a function of the results dict alone, so the summary can
be regenerated from a saved ``results.json`` (``bitfold bench --from-json``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...repro.fingerprint import summary

#: Issue 3's goals.
SEED_RATIO_GOAL = 1.0  # exact at most 1.0x np.add.at at the seed configuration
MEMORY_GOAL_BYTES_PER_ELEMENT = 48.0  # plan + exact fold above the inputs, Zipf(1.3) 3M -> 100k

#: The sweep parameter each sweep varies (None: a single point).
VARIES = {"seed": None, "memory": None, "n": "n", "k": "k", "skew": "skew", "dtype": "dtype"}


# -- lookups ---------------------------------------------------------------------------------
def cases_of(res: dict[str, Any], sweep: str) -> list[dict[str, Any]]:
    """The cases a sweep visited, in the order of its varying parameter."""
    cases = [c for c in res["cases"] if sweep in c["sweeps"]]
    key = VARIES.get(sweep)
    if key in ("n", "k"):
        cases.sort(key=lambda c: c[key])
    return cases


def row(res: dict[str, Any], case_id: str, contender: str) -> dict[str, Any] | None:
    for r in res["results"]:
        if r["case"] == case_id and r["contender"] == contender:
            return r
    return None


def contenders_in(res: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["contender"] for r in res["results"]))


def seed_case(res: dict[str, Any]) -> dict[str, Any] | None:
    return next(iter(cases_of(res, "seed")), None)


def memory_case(res: dict[str, Any]) -> dict[str, Any] | None:
    return next(iter(cases_of(res, "memory")), None)


# -- formatting ------------------------------------------------------------------------------
def _ms(s: float | None) -> str:
    if s is None:
        return "—"
    ms = s * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:,.0f}"


def _num(x: float | None, fmt: str = "{:.2f}") -> str:
    return "—" if x is None else fmt.format(x)


def _mb(b: int | None) -> str:
    return "—" if b is None else f"{b / 1e6:.1f}"


def _yes(x: bool | None) -> str:
    return {True: "yes", False: "NO", None: "—"}[x]


def status_cell(r: dict[str, Any] | None, value: str) -> str:
    """``value`` for an ok row, else the status (``oom``, ``failed``, ``skipped``)."""
    if r is None:
        return "—"
    return value if r["status"] == "ok" else r["status"]


def case_title(c: dict[str, Any]) -> str:
    return f"N = {c['n']:,}, K = {c['k']:,}, {c['skew']}, {c['dtype']}"


# -- stdout table ----------------------------------------------------------------------------
TABLE_COLUMNS = (
    ("contender", 26),
    ("median ms", 10),
    ("x base", 7),
    ("GB/s", 6),
    ("setup ms", 9),
    ("first ms", 9),
    ("peak MB", 8),
    ("B/elem", 7),
    ("same bits rep/thr", 18),
    ("max |diff|", 10),
)


def case_table(res: dict[str, Any], case: dict[str, Any]) -> list[str]:
    """Text lines: one header, one line per contender (reasons for non-ok rows)."""
    head = "  ".join(name.rjust(w) if i else name.ljust(w) for i, (name, w) in
                     enumerate(TABLE_COLUMNS))  # fmt: skip
    lines = [f"== {case_title(case)}  [{', '.join(case['sweeps'])}]", head]
    for r in (x for x in res["results"] if x["case"] == case["id"]):
        if r["status"] != "ok":
            lines.append(f"{r['contender']:<26}  {r['status']}: {r['reason']}")
            continue
        cells = [
            _ms(r.get("median_s")),
            _num(r.get("ratio_to_baseline")),
            _num(r.get("bandwidth_gb_s"), "{:.1f}"),
            _ms(r.get("setup_s")),
            _ms(r.get("first_call_s")),
            _mb(r.get("peak_bytes")),
            _num(r.get("bytes_per_element"), "{:.1f}"),
            f"{_yes(r.get('identical_repeats'))}/{_yes(r.get('identical_threads'))}",
            _num(r.get("max_abs_diff_vs_exact"), "{:.1e}"),
        ]
        widths = [w for _, w in TABLE_COLUMNS[1:]]
        padded = (c.rjust(w) for c, w in zip(cells, widths, strict=True))
        lines.append(f"{r['contender']:<26}  " + "  ".join(padded))
    return lines


def text_table(res: dict[str, Any]) -> str:
    """The stdout table: every case, then the goals."""
    out: list[str] = []
    for case in res["cases"]:
        out.extend(case_table(res, case))
        out.append("")
    out.extend(goal_lines(goals(res)))
    return "\n".join(out)


# -- goals -----------------------------------------------------------------------------------
def goals(res: dict[str, Any]) -> dict[str, Any]:
    """Issue 3's measurements: seed ratio, Zipf memory per element, Numba cold/warm start."""
    out: dict[str, Any] = {}
    seed = seed_case(res)
    if seed is not None:
        get = lambda name: row(res, seed["id"], name)  # noqa: E731
        med = lambda r: r.get("median_s") if r and r["status"] == "ok" else None  # noqa: E731
        exact, base, sa = med(get("bitfold-exact")), med(get("numpy-add-at")), None
        sa = med(get("torch-scatter-add"))
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
    mem = memory_case(res)
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
    return out


def goal_lines(g: dict[str, Any]) -> list[str]:
    lines = []
    met = {True: "met", False: "NOT met", None: "not measured"}
    if "seed" in g:
        s = g["seed"]
        lines.append(
            f"seed configuration: exact {_num(s['exact_ms'], '{:.2f}')} ms, np.add.at "
            f"{_num(s['add_at_ms'], '{:.2f}')} ms ({_num(s['exact_vs_add_at'])}x; goal "
            f"<= {SEED_RATIO_GOAL}x: {met[s['met']]}), torch scatter_add_ "
            f"{_num(s['scatter_add_ms'], '{:.2f}')} ms ({_num(s['exact_vs_scatter_add'])}x)"
        )
    if "memory" in g:
        m = g["memory"]
        lines.append(
            f"Zipf(1.3) memory: plan + exact fold {_num(m['bytes_per_element'], '{:.1f}')} "
            f"bytes/element above the inputs (goal < {MEMORY_GOAL_BYTES_PER_ELEMENT:g}: "
            f"{met[m['met']]})"
        )
    if "startup" in g:
        s = g["startup"]
        lines.append(
            f"Numba start-up: cold {s['cold_process_s']:.1f} s, warm (cached) "
            f"{s['warm_process_s']:.1f} s per fresh process"
        )
    return lines


# -- summary.md ------------------------------------------------------------------------------
def _md_table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    header = list(header)
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def _point(case: dict[str, Any], key: str | None) -> str:
    if key in ("n", "k"):
        return f"{case[key]:,}"
    return str(case[key]) if key else case["id"]


def summary_markdown(res: dict[str, Any], plots: list[str]) -> str:
    """``summary.md``: generated from the results alone; never edit it by hand."""
    m = res["machine"]
    facts = summary(m)
    s = res["settings"]
    libs = ", ".join(f"{k} {v}" for k, v in m["libraries"].items() if v)
    base = s["baseline"]
    out = [
        "<!-- generated by `bitfold bench` from results.json; do not edit by hand -->",
        f"# bitfold bench — {res['date'][:10]}, {s['device']}",
        "",
        f"- command: `{res['command']}`",
        f"- machine: {facts['cpu']}, {facts['cores']} usable cores"
        + (f", {facts['memory_bytes'] / 2**30:.0f} GiB RAM" if facts["memory_bytes"] else "")
        + (f", GPU {facts['gpu']}" if facts["gpu"] else ""),
        f"- software: Python {facts['python']}, bitfold {facts['bitfold']}, {libs}",
        f"- threads: Numba {facts['numba_threads']}, PyTorch {facts['torch_threads'] or '—'}",
        f"- load average (1, 5, 15 min) at start {m.get('load_average_at_start') or '—'}, "
        f"at end {m.get('load_average') or '—'} (other work competing for the cores)",
        f"- timing: median of up to {s['repeats']} repeats after a first call (3x as many at "
        "the seed configuration), interleaved across contenders; ratios against "
        f"`{base}` in the same run; bandwidth counts N values + N int32 indices read and K sums "
        "written; peak memory is above the inputs, setup plus one call, in a fresh process",
        "",
    ]
    g = goals(res)
    if g:
        out += ["## Goals (issue 3)", ""] + [f"- {line}" for line in goal_lines(g)] + [""]
    seed = seed_case(res)
    if seed is not None:
        out += [f"## The seed configuration ({case_title(seed)})", ""]
        rows = []
        for name in contenders_in(res):
            r = row(res, seed["id"], name)
            if r is None:
                continue
            if r["status"] != "ok":
                rows.append([f"`{name}`", r.get("guarantee", ""), r["status"], "", "", "", "",
                             "", r.get("reason") or ""])  # fmt: skip
                continue
            rows.append(
                [
                    f"`{name}`",
                    r.get("guarantee", ""),
                    _ms(r.get("median_s")),
                    _num(r.get("ratio_to_baseline")),
                    _num(r.get("bandwidth_gb_s"), "{:.1f}"),
                    _ms(r.get("setup_s")),
                    _num(r.get("bytes_per_element"), "{:.1f}"),
                    f"{_yes(r.get('identical_repeats'))} / {_yes(r.get('identical_threads'))}",
                    _num(r.get("max_abs_diff_vs_exact"), "{:.1e}"),
                ]
            )
        out += _md_table(
            ["contender", "guarantee", "median ms", f"x {base}", "GB/s", "setup ms",
             "peak B/elem", "same bits: repeats / threads", "max abs diff vs exact"],
            rows,
        )  # fmt: skip
        out.append("")
    for sweep, (title, metric) in {
        "n": ("Median time (ms) against N", "median"),
        "k": (f"Time as a multiple of `{base}` against K", "ratio"),
        "skew": ("Peak memory above the inputs (bytes/element) against skew", "memory"),
        "dtype": ("Median time (ms) against the value dtype", "median"),
    }.items():
        cases = cases_of(res, sweep)
        if not cases:
            continue
        key = VARIES[sweep]
        out += [f"## {title}", "", f"{res['sweeps'].get(sweep, '')}", ""]
        rows = []
        for name in contenders_in(res):
            cells = []
            for c in cases:
                r = row(res, c["id"], name)
                if metric == "median":
                    v = _ms(r.get("median_s")) if r else "—"
                elif metric == "ratio":
                    v = _num(r.get("ratio_to_baseline")) if r else "—"
                else:
                    v = _num(r.get("bytes_per_element"), "{:.1f}") if r else "—"
                cells.append(status_cell(r, v))
            if any(x not in ("skipped", "—") for x in cells):
                rows.append([f"`{name}`", *cells])
        out += [*_md_table([key or "case", *(_point(c, key) for c in cases)], rows), ""]
    skipped = sorted(
        {(r["contender"], r["reason"]) for r in res["results"] if r["status"] == "skipped"}
    )
    if skipped:
        out += ["## Not run here", ""] + [f"- `{n}`: {why}" for n, why in skipped] + [""]
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(out)
