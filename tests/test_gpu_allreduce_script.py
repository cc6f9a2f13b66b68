"""``scripts/gpu_allreduce.py``, a step of ``make gpu-check``, in its smoke mode (gloo, CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_allreduce.py"


def test_smoke_run_gives_the_cpus_bits_and_every_figure(tmp_path):
    out = tmp_path / "allreduce.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--smoke", "--budget", "120"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    steps = report["steps"]
    assert {s["status"] for s in steps.values()} == {"ok"}, steps
    assert steps["one_process"]["equals_input"] is True
    assert steps["one_process"]["host_words_equal_input"] is True
    assert steps["one_process"]["device_encode_decode_us"] > 0
    assert steps["two_processes"]["each_rank_equals_cpu"] == [True, True]
    assert steps["two_processes"]["mixed_host_and_device_words_equal_cpu"] == [True, True]
    assert steps["one_process"]["reduce_scatter_equals_input"] is True
    assert steps["one_process"]["exact_reduce_scatter_us"] > 0
    assert steps["two_processes"]["reduce_scatter_shard_equals_cpu"] == [True, True]
    assert steps["two_processes"]["reduce_scatter_mixed_words_equal_cpu"] == [True, True]
    step = steps["gradient_sum_step"]
    assert step["ratio"] == step["gradient_sum_step_us"] / step["ddp_step_us"]
    assert report["bits_equal_cpu"] is True


def test_a_spent_budget_skips_steps_and_still_writes_the_json(tmp_path):
    out = tmp_path / "allreduce.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(out), "--smoke", "--budget", "0"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads(out.read_text())["steps"]
    assert [s["status"] for s in steps.values()] == ["skipped"] * 3
