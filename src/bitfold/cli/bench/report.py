"""Reading ``results.json``: the stdout table and ``summary.md``.

Everything here is a function of the results dict alone, so the summary can
be regenerated from a saved ``results.json`` (``bitfold bench --from-json``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...repro.fingerprint import summary
from .compiled_steps import summary_lines as compiled_summary
from .load import summary_lines as load_summary
from .steps import summary_lines as steps_summary

#: The sweep parameter each sweep varies (None: several parameters, or a single point).
VARIES = {"seed": None, "memory": None, "rows": None, "xla-rows": None, "oneshot": None,
          "n": "n", "k": "k", "skew": "skew", "dtype": "dtype", "d": "d"}  # fmt: skip
#: Sweeps whose cases are another sweep's: their table is that sweep's (``rows``).
SAME_CASES = {"rows": ("rows", "xla-rows")}


# -- lookups ---------------------------------------------------------------------------------
def cases_of(res: dict[str, Any], sweep: str) -> list[dict[str, Any]]:
    """The cases a sweep visited, in the order of its varying parameter."""
    names = set(SAME_CASES.get(sweep, (sweep,)))
    cases = [c for c in res["cases"] if names & set(c["sweeps"])]
    key = VARIES.get(sweep)
    if key in ("n", "k", "d"):
        cases.sort(key=lambda c: c.get(key) or 0)
    return cases


def row(res: dict[str, Any], case_id: str, contender: str) -> dict[str, Any] | None:
    """The result row of ``contender`` on a case, or None."""
    for r in res["results"]:
        if r["case"] == case_id and r["contender"] == contender:
            return r
    return None


def output_bytes(case: dict[str, Any]) -> int:
    """Bytes of a case's sums (recorded by the bench; derived for older results)."""
    if case.get("output_bytes") is not None:
        return int(case["output_bytes"])
    return (
        int(case["k"]) * max(1, int(case.get("d") or 0)) * (8 if case["dtype"] == "float64" else 4)
    )


def contenders_in(res: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["contender"] for r in res["results"]))


def seed_case(res: dict[str, Any]) -> dict[str, Any] | None:
    return next(iter(cases_of(res, "seed")), None)


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
    rows = f", D = {c['d']:,}" if c.get("d") else ""
    return f"N = {c['n']:,}{rows}, K = {c['k']:,}, {c['skew']}, {c['dtype']}"


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
    """The stdout table: every case, then the run at a glance."""
    out: list[str] = []
    for case in res["cases"]:
        out.extend(case_table(res, case))
        out.append("")
    out.extend(glance_lines(res))
    return "\n".join(out)


# -- at a glance -----------------------------------------------------------------------------
#: The memory sweep's headline map: Zipf(1.3) into 100,000 buckets (3 million values).
MEMORY_CASE = {"k": 100_000, "skew": "zipf1.3"}


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    if not (a and b and a["status"] == b["status"] == "ok"):
        return None
    return a["median_s"] / b["median_s"] if a.get("median_s") and b.get("median_s") else None


def _seed_line(res: dict[str, Any], seed: dict[str, Any]) -> str:
    exact = row(res, seed["id"], "bitfold-exact")
    where = f"At the seed configuration ({case_title(seed)})"
    if exact is None:
        return f"{where}, `bitfold-exact` did not run."
    if exact["status"] != "ok":
        return f"{where}, `bitfold-exact` {exact['status']}: {exact.get('reason') or ''}".strip()
    peers = dict.fromkeys((res["settings"]["baseline"], "numpy-add-at", "torch-scatter-add"))
    ratios = [f"{x:.2f}x `{p}`" for p in peers if (x := _ratio(exact, row(res, seed["id"], p)))]
    time = f"`bitfold-exact` took {_ms(exact.get('median_s'))} ms a fold"
    bits = (("identical_repeats", "the same bits on every repeat"),
            ("identical_threads", "under another thread count"))  # fmt: skip
    same = [f"{what}: {_yes(exact[key])}" for key, what in bits if exact.get(key) is not None]
    ratio = f" ({', '.join(ratios)})" if ratios else ""
    return f"{where}, {time}{ratio}" + (f"; {', '.join(same)}." if same else ".")


def _memory_line(res: dict[str, Any]) -> str | None:
    cases = cases_of(res, "memory")
    want = (c for c in cases if all(c[k] == v for k, v in MEMORY_CASE.items()))
    case = next(want, None) or next(iter(cases), None)
    r = None if case is None else row(res, case["id"], "bitfold-exact")
    if r is None or r["status"] != "ok" or r.get("peak_bytes") is None:
        return None
    entry = (r["peak_bytes"] - output_bytes(case)) / max(1, case["n"])
    return (f"Memory: a plan plus one exact fold of {case['n']:,} values into {case['k']:,} "
            f"buckets ({case['skew']}) took {_num(r.get('bytes_per_element'), '{:.1f}')} bytes "
            f"per value above the inputs ({entry:.1f} above the inputs and the output), peak "
            "in a fresh process.")  # fmt: skip


def glance_lines(res: dict[str, Any]) -> list[str]:
    """The run in a few plain sentences: the seed configuration, memory, Numba's start-up and
    the training steps, each from the results alone."""
    out = []
    seed = seed_case(res)
    if seed is not None:
        out.append(_seed_line(res, seed))
    memory = _memory_line(res)
    if memory:
        out.append(memory)
    st = res.get("startup") or {}
    if st.get("status") == "ok":
        out.append(f"Numba start-up: a fresh process took {st['cold']['process_s']:.1f} s with an "
                   f"empty cache, {st['warm']['process_s']:.1f} s with the cache the first one "
                   "wrote.")  # fmt: skip
    sentences = (
        ("steps", "over_plain", "A training step of the {name} model under `exact_mode`: "
         "{exact_mode:.2f}x the plain step (under `torch.use_deterministic_algorithms`: "
         "{deterministic:.2f}x)."),
        ("compiled_steps", "over_compiled", "A training step of the {name} model compiled by "
         "`bitfold.torch.compile`: {exact_compiled:.2f}x the `torch.compile` step (eager under "
         "`exact_mode`: {exact_mode:.2f}x)."),
    )  # fmt: skip
    for section, over, sentence in sentences:
        phase = res.get(section) or {}
        if phase.get("status") == "ok":
            out += [sentence.format(name=name, **m[over]) for name, m in phase["models"].items()]
    return out


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


#: (sweep, section title, what each cell shows), in the order of summary.md.
SWEEP_TABLES = (
    ("rows", "Folds of rows: median time (ms)", "median"),
    ("oneshot", "One-shot folds, the plan built in the call: median time (ms)", "median"),
    ("d", "Median time (ms) against the row width D (N x D fixed)", "median"),
    ("n", "Median time (ms) against N", "median"),
    ("k", "Median time (ms) against K", "median"),
    ("k", "Time as a multiple of `{base}` against K", "ratio"),
    ("dtype", "Median time (ms) against the value dtype", "median"),
    ("skew", "Peak memory above the inputs (bytes/element) against skew", "memory"),
    ("memory", "Plan plus one fold: peak memory above the inputs and the output "
               "(bytes per index entry)", "entry"),
)  # fmt: skip


def _column(case: dict[str, Any], sweep: str) -> str:
    """A case's column heading in its sweep's table."""
    if sweep == "rows" or (sweep == "oneshot" and case.get("d")):
        return f"{case['n']:,} x {case['d']:,} → {case['k']:,} {case['skew']}"
    if sweep == "oneshot":
        return f"N = {case['n']:,}, K = {case['k']:,}"
    if sweep == "memory":
        return f"{case['skew']} K = {case['k']:,}"
    return _point(case, VARIES.get(sweep))


def _cell(r: dict[str, Any] | None, case: dict[str, Any], metric: str) -> str:
    if r is None:
        return "—"
    if metric == "median":
        v = _ms(r.get("median_s"))
    elif metric == "ratio":
        v = _num(r.get("ratio_to_baseline"))
    elif metric == "memory":
        v = _num(r.get("bytes_per_element"), "{:.1f}")
    else:  # bytes per index entry above the inputs and the output
        peak = r.get("peak_bytes")
        v = "—" if peak is None else f"{(peak - output_bytes(case)) / max(1, case['n']):.1f}"
    return status_cell(r, v)


def _sweep_table(
    res: dict[str, Any], sweep: str, cases: list[dict[str, Any]], title: str, metric: str
) -> list[str]:
    """One summary.md section: a contender per line, a case per column, and the exact routes."""
    about = next((res["sweeps"][n] for n in SAME_CASES.get(sweep, (sweep,)) if n in res["sweeps"]),
                 "")  # fmt: skip
    out = [f"## {title}", "", about, ""]
    rows = []
    for contender in contenders_in(res):
        cells = [_cell(row(res, c["id"], contender), c, metric) for c in cases]
        if any(x not in ("skipped", "—") for x in cells):
            rows.append([f"`{contender}`", *cells])
    key = VARIES.get(sweep)
    out += _md_table([key or "case", *(_column(c, sweep) for c in cases)], rows)
    routes = [(row(res, c["id"], "bitfold-exact") or {}).get("route") for c in cases]
    if any(routes) and metric != "ratio":
        out += ["", "`bitfold-exact` took the exact route: "
                + ", ".join(f"{_column(c, sweep)}: {r or '—'}"
                            for c, r in zip(cases, routes, strict=True))]  # fmt: skip
    return [*out, ""]


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
        *[f"- rewritten by `{by}` (measured nothing)" for by in [res.get("rewritten_by")] if by],
        f"- machine: {facts['cpu']}, {facts['cores']} usable cores"
        + (f", {facts['memory_bytes'] / 2**30:.0f} GiB RAM" if facts["memory_bytes"] else "")
        + (f", GPU {facts['gpu']}" if facts["gpu"] else ""),
        f"- software: Python {facts['python']}, bitfold {facts['bitfold']}, {libs}",
        f"- threads: Numba {facts['numba_threads']}, PyTorch {facts['torch_threads'] or '—'}",
        f"- load average (1, 5, 15 min) at start {m.get('load_average_at_start') or '—'}, "
        f"at end {m.get('load_average') or '—'} (other work competing for the cores)",
        f"- timing: median of up to {s['repeats']} repeats after a first call (3x as many at "
        f"the seed configuration; at least {s.get('min_repeats', 3)} unless a contender "
        "failed), interleaved across contenders; ratios against "
        f"`{base}` in the same run; bandwidth counts N values + N int32 indices read and K sums "
        "written; peak memory is above the inputs, setup plus one call, in a fresh process",
        "",
    ]
    glance = glance_lines(res)
    if glance:
        out += ["## At a glance", "", *(f"- {line}" for line in glance), ""]
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
    for sweep, title, metric in SWEEP_TABLES:
        cases = cases_of(res, sweep)
        if cases:
            out += _sweep_table(res, sweep, cases, title.format(base=base), metric)
    out += load_summary(res.get("load"))
    out += [line.replace("### ", "## ", 1) for line in steps_summary(res.get("steps"))]
    out += [line.replace("### ", "## ", 1) for line in compiled_summary(res.get("compiled_steps"))]
    skipped = sorted(
        {(r["contender"], r["reason"]) for r in res["results"] if r["status"] == "skipped"}
    )
    if skipped:
        out += ["## Not run here", ""] + [f"- `{n}`: {why}" for n, why in skipped] + [""]
    if plots:
        out += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(out)
