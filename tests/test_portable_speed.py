"""benchmarks/portable_speed.py at tiny sizes: it runs, and its JSON has the shape it documents."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the benchmark times torch folds")
pytest.importorskip("jax", reason="the benchmark times JAX folds")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "portable_speed.py"


def _load():
    spec = importlib.util.spec_from_file_location("portable_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_runs_tiny_and_writes_its_json(tmp_path):
    import jax

    bench = _load()
    x64 = bool(jax.config.jax_enable_x64)
    try:
        bench.main(["--tiny", "--rounds", "1", "--out", str(tmp_path)])
    finally:
        jax.config.update("jax_enable_x64", x64)
    report = json.loads((tmp_path / "results.json").read_text())
    assert {"command", "machine", "load_before", "load_after", "rounds", "results", "goals"} <= set(
        report
    )
    cases = {(r["case"], r["library"], r.get("x64")) for r in report["results"]}
    assert cases == {("seed", "torch", None), ("rows", "torch", None)} | {
        (c, "jax", x) for c in ("seed", "rows", "gnn") for x in (False, True)
    }
    for r in report["results"]:
        assert r["baseline"] in r["ms"]
        assert set(r["ratios"]) == set(r["ms"]) - {r["baseline"]}
        assert all(v > 0 for v in r["ms"].values())
    assert set(report["goals"]) == {"1_torch_seed", "2_jax_gnn_step", "4_oracle_bits"}
    assert all({"met", "why"} == set(g) for g in report["goals"].values())
    assert report["goals"]["4_oracle_bits"]["met"]  # every result the exact fold's bits
    gnn = [r for r in report["results"] if r["case"] == "gnn"]
    assert all(all(r["same_bits_under_edge_permutation"].values()) for r in gnn)
    assert "## Goals" in (tmp_path / "summary.md").read_text()
