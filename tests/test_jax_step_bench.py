"""benchmarks/jax_step.py with ``--small``: it runs, its JSON has the fields it documents, and
every bitfold variant of the step gives the same loss bits, the edges permuted too."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="the benchmark times JAX steps")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "jax_step.py"


def _load():
    spec = importlib.util.spec_from_file_location("jax_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_step_benchmark_runs_small_and_writes_its_json(tmp_path):
    bench = _load()
    assert bench.default_out().name.endswith("-jax-step-cpu-" + str(bench.os.cpu_count()) + "core")
    bench.main(["--small", "--rounds", "2", "--block", "2", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "results.json").read_text())
    fields = {"command", "machine", "jax", "load_before", "load_after", "nodes", "edges", "d",
              "rounds", "block", "x64", "baseline", "ms", "ms_first_in_block", "ms_samples",
              "ratios", "ratios_to_jax_ops_args", "loss_bits", "loss_bits_edges_permuted",
              "same_loss_bits", "goal"}  # fmt: skip
    assert fields <= set(report)
    assert (report["nodes"], report["edges"], report["d"]) == bench.SMALL
    assert report["baseline"] == "jax_ops" and set(report["ms"]) == set(bench.VARIANTS)
    assert all(len(report["ms_samples"][k]) == 4 and report["ms"][k] > 0 for k in bench.VARIANTS)
    assert set(report["ratios"]) == set(bench.VARIANTS) - {"jax_ops"}
    for k, ratio in report["ratios"].items():
        assert ratio == round(report["ms"][k] / report["ms"]["jax_ops"], 3)
    assert set(report["goal"]) == {"ratio_at_most", "variants", "met"}
    assert report["goal"]["variants"] == ["segment_sum_captured", "segment_sum_args"]
    # the exact sums: one loss, bit for bit, in every bitfold variant and under the permutation
    bits = {report["loss_bits"][k] for k in bench.BITFOLD}
    assert len(bits) == 1 and set(report["loss_bits_edges_permuted"].values()) == bits
    assert set(report["loss_bits_edges_permuted"]) == set(bench.BITFOLD)
    assert report["same_loss_bits"] is True
