"""The rows and xla-rows sweeps of ``bitfold bench``, end to end at a small size.

The real sweeps fold up to 10^6 rows into up to 10^6 buckets (minutes, GBs);
here the same kinds of cases (uniform and Zipf(1.3), narrow and wide rows)
run small, with the staged path's threshold lowered so that ``bitfold-exact``
takes it, against ``torch-index-add`` and ``jax-segment-sum``. What is checked
is what a run records, never how fast anything is: every contender ran, the
exact fold gave the same bits on every repeat, and those bits are the gather
path's, which the oracle tests pin (tests/test_rows_staged.py).
"""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

import bitfold
from bitfold import cli
from bitfold.backends import host_routes
from bitfold.cli.bench.cases import SWEEPS, make_inputs
from bitfold.kernels import buckets
from bitfold.repro.digest import digest

pytest.importorskip("jax")
pytest.importorskip("torch")

SMALL = [(20_000, 2_000, "uniform", "float32", 16), (20_000, 2_000, "zipf1.3", "float32", 16),
         (3_000, 500, "uniform", "float32", 96)]  # fmt: skip


def test_rows_and_xla_rows_sweeps_run_small(tmp_path, monkeypatch) -> None:
    for name in ("rows", "xla-rows"):
        monkeypatch.setitem(SWEEPS, name, (f"small {name}", SMALL, SMALL))
    monkeypatch.setattr(host_routes, "STAGED_MIN_VALUES", 1 << 12)
    monkeypatch.setattr(host_routes, "GATHERED_MAX_CACHE_SHARE", 0.0)  # staged, whatever the L3
    staged = []
    real = buckets.fold_staged
    monkeypatch.setattr(buckets, "fold_staged", lambda *a: staged.append(real(*a)) or staged[-1])
    out = tmp_path / "out"
    argv = ["bench", "--repeats", "3", "--sweeps", "rows,xla-rows",
            "--contenders", "bitfold-exact,torch-index-add,jax-segment-sum",
            "--skip", "memory,threads,startup,steps,compiled,plots", "--out", str(out)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(argv) == 0
    assert staged and all(staged)  # every call of bitfold-exact took the staged path
    res = json.loads((out / "results.json").read_text())
    cases = {c["id"]: c for c in res["cases"]}
    assert len(cases) == len(SMALL)
    assert all(set(c["sweeps"]) == {"rows", "xla-rows"} for c in cases.values())
    by = {(r["case"], r["contender"]): r for r in res["results"]}
    for case_id, case in cases.items():
        for name in ("bitfold-exact", "torch-index-add", "jax-segment-sum"):
            assert by[case_id, name]["status"] == "ok", (case_id, name, by[case_id, name])
        exact = by[case_id, "bitfold-exact"]
        assert exact["route"] == "buckets" and exact["identical_repeats"] is True
        idx, values = make_inputs(case)
        monkeypatch.setattr(host_routes, "STAGED_MIN_VALUES", 1 << 62)  # the gather path
        gathered = bitfold.Fold(idx, case["k"])(values)
        monkeypatch.setattr(host_routes, "STAGED_MIN_VALUES", 1 << 12)
        assert exact["digest"] == digest(gathered), case_id
        assert np.isfinite(exact["max_abs_diff_vs_exact"])
    summary = (out / "summary.md").read_text()
    assert "## Folds of rows: median time (ms)" in summary
    assert "jax-segment-sum" in summary
