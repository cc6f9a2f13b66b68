"""PNG plots of ``results.json`` with matplotlib (imported only here, with the Agg backend).

* ``time_vs_n.png``: median time against N per contender, log-log;
* ``ratio_vs_k.png``: time as a multiple of the atomic baseline against K;
* ``memory_vs_skew.png``: peak memory above the inputs (bytes/element) by skew;
* ``seed_bars.png``: median time of every contender at the seed configuration;
* ``time_vs_k.png``: median time against K (scalars, up to 10^7), log-log;
* ``rows_bars.png``: median time of every contender on each fold of rows (the rows sweep's shapes);
* ``time_vs_d.png``: median time against the row width D at a fixed N x D;
* ``dtype_bars.png``: median time of every contender for each value dtype;
* ``memory_vs_k.png``: bitfold-exact's plan plus one fold, bytes per index entry above the
  inputs and the output, against K for each map of the memory sweep.

A plot whose sweep was not run is not written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from .report import cases_of, contenders_in, output_bytes, row, seed_case

_DPI = 100


#: Fixed colours so a contender looks the same in every plot; bitfold-exact is black.
COLOURS = {
    "bitfold-exact": "black",
    "bitfold-exact-new-plan": "dimgray",
    "bitfold-ordered": "tab:blue",
    "bitfold-atomic": "tab:cyan",
    "fixed-scatter": "tab:brown",
    "numpy-add-at": "tab:gray",
    "numpy-bincount": "tab:olive",
    "torch-index-add": "tab:red",
    "torch-scatter-add": "tab:orange",
    "torch-autograd": "tab:purple",
    "torch-scatter-segment-csr": "tab:pink",
    "jax-segment-sum": "tab:green",
    "torch-embedding": "indigo",
    "numpy-groupies": "yellowgreen",
    "cupy-scatter-add": "gold",
}


def _style(name: str) -> dict[str, Any]:
    """Line style of a contender: its colour, dashed for deterministic-mode variants."""
    base = name[: -len("-det")] if name.endswith("-det") else name
    return {
        "color": COLOURS.get(base, "tab:gray"),
        "linestyle": "--" if name.endswith("-det") else "-",
        "linewidth": 2.8 if name == "bitfold-exact" else 1.5,
        "marker": "o",
        "markersize": 4,
    }


def _bar_style(name: str) -> dict[str, Any]:
    """Bar style: the line colour, hatched for deterministic-mode variants."""
    colour = _style(name)["color"]
    det = name.endswith("-det")
    return {"facecolor": colour, "hatch": "///" if det else None,
            "edgecolor": "white" if det else colour}  # fmt: skip


def _save(fig: Any, path: str) -> bool:
    """Lay ``fig`` out, write it to ``path`` and close it; True (a plot was written)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return True


def _bar_slots(res: dict[str, Any], names: list[str], cases: list[dict[str, Any]],
               width: float) -> Iterator[tuple[float, str, dict[str, Any], Any]]:
    """Grouped bars: ``(x, contender, case, its row)`` for each contender in each case's group."""
    for j, name in enumerate(names):
        for i, c in enumerate(cases):
            yield i - 0.4 + (j + 0.5) * width, name, c, row(res, c["id"], name)


def _ok(r: dict[str, Any] | None, field: str) -> float | None:
    if r is None or r["status"] != "ok":
        return None
    return r.get(field)


def _lines(
    res: dict[str, Any], sweep: str, key: str, field: str, scale: float, path: str, **labels: str
) -> bool:
    import matplotlib.pyplot as plt

    cases = cases_of(res, sweep)
    if not cases:
        return False
    names = contenders_in(res)
    fig, ax = plt.subplots(figsize=(8, 5.2))
    for name in names:
        pts = [(c[key], _ok(row(res, c["id"], name), field)) for c in cases]
        pts = [(x, y * scale) for x, y in pts if y is not None]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, label=name, **_style(name))
    if labels.get("hline"):
        ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(labels["xlabel"])
    ax.set_ylabel(labels["ylabel"])
    ax.set_title(labels["title"], fontsize=10)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return _save(fig, path)


def _memory_bars(res: dict[str, Any], path: str) -> bool:
    import matplotlib.pyplot as plt

    cases = cases_of(res, "skew")
    if not cases:
        return False
    names = [
        n
        for n in contenders_in(res)
        if any(row(res, c["id"], n) and row(res, c["id"], n)["status"] != "skipped" for c in cases)
    ]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    ax.set_yscale("log")
    width = 0.8 / max(1, len(names))
    top = 0.0
    for x, name, c, r in _bar_slots(res, names, cases, width):
        y = _ok(r, "bytes_per_element")
        if y is not None:
            ax.bar(x, max(y, 0.01), width, **_bar_style(name))
        elif r is not None and r.get("oom_needed_bytes"):  # what it would have needed
            need = r["oom_needed_bytes"] / c["n"]
            ax.bar(x, need, width, facecolor="none", edgecolor=_style(name)["color"],
                   linestyle="--")  # fmt: skip
            ax.text(x, need * 1.15, f"OOM\nneeds {r['oom_needed_bytes'] / 2**30:,.0f} GiB",
                    fontsize=7, ha="center", va="bottom", color=_style(name)["color"],
                    fontweight="bold")  # fmt: skip
            top = max(top, need)
        elif r is not None and r["status"] in ("oom", "failed"):
            ax.text(x, 0.02, r["status"].upper(), rotation=90, fontsize=7, ha="center",
                    va="bottom", color=_style(name)["color"], fontweight="bold",
                    transform=ax.get_xaxis_transform())  # fmt: skip
    if top:
        ax.set_ylim(top=top * 8)  # room for the OOM labels
    handles = [plt.Rectangle((0, 0), 1, 1, **_bar_style(n)) for n in names]
    ax.legend(handles, names, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xticks(range(len(cases)), [c["skew"] for c in cases])
    ax.set_xlabel("index skew")
    ax.set_ylabel("peak memory above the inputs (bytes per element, log)")
    c0 = cases[0]
    ax.set_title(
        f"Memory against skew (N = {c0['n']:,}, K = {c0['k']:,}, {c0['dtype']}); dashed: "
        f"refused, over the {res['settings']['memory_limit_bytes'] / 2**30:g} GiB limit",
        fontsize=10,
    )
    ax.grid(True, axis="y", which="both", alpha=0.25)
    return _save(fig, path)


def _seed_bars(res: dict[str, Any], path: str) -> bool:
    import matplotlib.pyplot as plt

    seed = seed_case(res)
    if seed is None:
        return False
    rows = [r for r in res["results"] if r["case"] == seed["id"] and r["status"] != "skipped"]
    if not rows:
        return False
    rows.sort(key=lambda r: r.get("median_s") or float("inf"))
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.36 * len(rows)))
    top = max((r.get("median_s") or 0) for r in rows) * 1e3 or 1.0
    for i, r in enumerate(rows):
        ms = (r.get("median_s") or 0) * 1e3
        ax.barh(i, ms, **_bar_style(r["contender"]))
        note = (
            f"{ms:.3g} ms  ({r['ratio_to_baseline']:.2f}x)"
            if r["status"] == "ok" and r.get("ratio_to_baseline") is not None
            else r["status"]
        )
        if r.get("identical_repeats") is False or r.get("identical_threads") is False:
            note += "  (bits differ)"
        ax.text(ms + top * 0.01, i, note, va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [f"{r['contender']} [{r.get('guarantee', '')}]" for r in rows])
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.45)
    ax.set_xlabel(f"median time per fold (ms); (x) = multiple of {res['settings']['baseline']}")
    ax.set_title(
        f"Seed configuration: N = {seed['n']:,} {seed['dtype']} values, K = {seed['k']:,}",
        fontsize=10,
    )
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(True, axis="x", alpha=0.25)
    return _save(fig, path)


def _group_bars(
    res: dict[str, Any], sweep: str, label: Any, path: str, title: str, xlabel: str
) -> bool:
    """Median time of every contender (bars) on each case of ``sweep`` (groups), log scale."""
    import matplotlib.pyplot as plt

    cases = cases_of(res, sweep)
    if not cases:
        return False
    names = [n for n in contenders_in(res)
             if any(_ok(row(res, c["id"], n), "median_s") for c in cases)]  # fmt: skip
    if not names:
        return False
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(cases) + 3), 5.2))
    ax.set_yscale("log")
    width = 0.8 / len(names)
    for x, name, _c, r in _bar_slots(res, names, cases, width):
        y = _ok(r, "median_s")
        if y is not None:
            ax.bar(x, y * 1e3, width, **_bar_style(name))
        elif r is not None and r["status"] != "skipped":
            ax.text(x, 0.02, r["status"].upper(), rotation=90, fontsize=6, ha="center",
                    va="bottom", color=_style(name)["color"],
                    transform=ax.get_xaxis_transform())  # fmt: skip
    handles = [plt.Rectangle((0, 0), 1, 1, **_bar_style(n)) for n in names]
    ax.legend(handles, names, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_xticks(range(len(cases)), [label(c) for c in cases], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("median time per fold (ms, log)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", which="both", alpha=0.25)
    return _save(fig, path)


def _memory_vs_k(res: dict[str, Any], path: str) -> bool:
    """bitfold-exact's bytes per index entry above inputs and output, against K, per map."""
    import matplotlib.pyplot as plt

    cases = cases_of(res, "memory")
    pts: dict[str, list[tuple[int, float]]] = {}
    for c in cases:
        peak = _ok(row(res, c["id"], "bitfold-exact"), "peak_bytes")
        if peak is not None:
            pts.setdefault(c["skew"], []).append((c["k"], (peak - output_bytes(c)) / c["n"]))
    if not pts:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for skew, xy in pts.items():
        xs, ys = zip(*sorted(xy), strict=True)
        ax.plot(xs, ys, marker="o", label=skew)
    ax.set_xscale("log")
    ax.set_ylim(bottom=0, top=max(y for xy in pts.values() for _, y in xy) * 1.2)
    ax.set_xlabel("K (buckets, log)")
    ax.set_ylabel("bytes per index entry above inputs and output")
    ax.set_title(f"bitfold-exact: plan + one fold, N = {cases[0]['n']:,} {cases[0]['dtype']}",
                 fontsize=10)  # fmt: skip
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=8)
    return _save(fig, path)


def write_plots(res: dict[str, Any], out_dir: str) -> list[str]:
    """Write every plot whose data is present; returns the file names written."""
    import matplotlib

    matplotlib.use("Agg")
    base = res["settings"]["baseline"]
    written = []
    jobs = {
        "time_vs_n.png": lambda p: _lines(
            res, "n", "n", "median_s", 1e3, p,
            xlabel="N (values folded, log)", ylabel="median time per fold (ms, log)",
            title=res["sweeps"].get("n", ""),
        ),
        "ratio_vs_k.png": lambda p: _lines(
            res, "k", "k", "ratio_to_baseline", 1.0, p, hline="1",
            xlabel="K (buckets, log)", ylabel=f"time / time of {base} (log; below 1 is faster)",
            title="Time relative to the atomic baseline: " + res["sweeps"].get("k", ""),
        ),
        "memory_vs_skew.png": lambda p: _memory_bars(res, p),
        "seed_bars.png": lambda p: _seed_bars(res, p),
        "time_vs_k.png": lambda p: _lines(
            res, "k", "k", "median_s", 1e3, p,
            xlabel="K (buckets, log)", ylabel="median time per fold (ms, log)",
            title=res["sweeps"].get("k", ""),
        ),
        "rows_bars.png": lambda p: _group_bars(
            res, "rows", lambda c: f"{c['n']:,} x {c['d']}\n→ {c['k']:,}\n{c['skew']}", p,
            "Folds of rows (N x D values into K rows of D)", "(N x D) → K, index map",
        ),
        "time_vs_d.png": lambda p: _lines(
            res, "d", "d", "median_s", 1e3, p,
            xlabel="row width D (log; N x D fixed)", ylabel="median time per fold (ms, log)",
            title=res["sweeps"].get("d", ""),
        ),
        "dtype_bars.png": lambda p: _group_bars(
            res, "dtype", lambda c: c["dtype"], p, res["sweeps"].get("dtype", ""), "value dtype",
        ),
        "memory_vs_k.png": lambda p: _memory_vs_k(res, p),
    }  # fmt: skip
    for name, fn in jobs.items():
        if fn(os.path.join(out_dir, name)):
            written.append(name)
    return written
