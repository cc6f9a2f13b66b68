"""``benchmarks/dp_model.py``: the data-parallel step on N GPUs predicted from measured inputs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

MODEL = Path(__file__).resolve().parents[1] / "benchmarks" / "dp_model.py"
spec = importlib.util.spec_from_file_location("dp_model", MODEL)
dp_model = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dp_model)


def report(smoke: bool = False) -> dict:
    return {"smoke": smoke, "steps": {"one_process": {
        "status": "ok", "elements": 10**8, "exact_us": 60_000.0, "float32_all_reduce_us": 10_000.0,
        "wire_bytes_per_element": {"2": 5.0, "8": 5.5, "64": 8.0}}}}  # fmt: skip


def test_the_prediction_is_the_ring_model_of_the_measured_inputs(tmp_path):
    src, out = tmp_path / "allreduce.json", tmp_path / "model.json"
    src.write_text(json.dumps(report()))
    assert dp_model.main([str(src), "--params", "1e9", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    work = 50_000.0 * 1e-6 / 10**8  # the exact all-reduce's own work, seconds an element
    eight = result["clusters"][0]
    ddp = 2 * 7 / 8 * 4e9 / 400e9
    exact = work * 1e9 + 2 * 7 / 8 * 5.5e9 / 400e9
    assert eight["ddp_ms"] == ddp * 1e3 and eight["exact_ms"] == exact * 1e3
    assert eight["ratio"] == exact / ddp and eight["met"] is (exact / ddp <= 1.3)
    assert result["clusters"][1]["wire_bytes_per_element"] == 8.0
    assert "met" not in result["clusters"][1]  # the goal is judged on 8 GPUs only


def test_the_sharded_step_is_the_ring_model_of_gather_and_reduce_scatter(tmp_path):
    src, out = tmp_path / "allreduce.json", tmp_path / "model.json"
    src.write_text(json.dumps(report()))
    dp_model.main([str(src), "--params", "1e9", "--json", str(out)])
    result = json.loads(out.read_text())
    eight = result["sharded"][0]
    work = 50_000.0 * 1e-6 / 10**8
    gather = 7 / 8 * 4e9 / 400e9
    fsdp = gather + 7 / 8 * 4e9 / 400e9
    exact = gather + work * 1e9 + 7 / 8 * 5.5e9 / 400e9
    assert eight["fsdp_ms"] == fsdp * 1e3 and eight["exact_ms"] == exact * 1e3
    # the gather costs both the same: the sharded ratio is DDP's diluted
    assert 1 < eight["ratio"] < result["clusters"][0]["ratio"]
    assert result["sharded"][1]["wire_bytes_per_element"] == 8.0


def test_compute_time_lowers_the_ratio():
    measured = dp_model.inputs(report())
    idle = dp_model.predict(measured, 1e9, 0.0)[0]["ratio"]
    busy = dp_model.predict(measured, 1e9, 0.5)[0]["ratio"]
    assert 1 < busy < idle


def test_a_smoke_run_is_not_yet_measured(tmp_path, capsys):
    src, out = tmp_path / "allreduce.json", tmp_path / "model.json"
    src.write_text(json.dumps(report(smoke=True)))
    dp_model.main([str(src), "--json", str(out)])
    assert json.loads(out.read_text())["status"] == "not yet measured"
    assert "not yet measured" in capsys.readouterr().out
