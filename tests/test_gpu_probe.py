"""scripts/gpu_probe.py, the probe step of ``make gpu-check``: its checks, run here on the CPU."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_probe.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_probe  # noqa: E402  (the script's folder, put on the path above)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe")
    src = str(SCRIPT.parents[1] / "src")
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke", str(out)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": src},
                          timeout=600)  # fmt: skip
    return out, done


def test_the_smoke_run_passes_and_writes_both_probes(smoke):
    out, done = smoke
    assert done.returncode == 0, done.stdout + done.stderr
    verdict = json.loads((out / "probe_check.json").read_text())
    assert verdict["passed"] is True and verdict["exact_digest_equals_the_cpu_digest"] is True
    for name in ("gpu", "cpu"):
        assert json.loads((out / f"probe_{name}.json").read_text())["q2_fixed_order"]["exact"]


def test_a_digest_or_a_repeat_that_differs_fails_the_check(smoke):
    out, _ = smoke
    gpu = json.loads((out / "probe_gpu.json").read_text())
    cpu = json.loads((out / "probe_cpu.json").read_text())
    assert gpu_probe.judge(gpu, cpu, smoke=False)["folded_on_the_gpu"] is False  # the CPU's line
    other = copy.deepcopy(cpu)
    other["q2_fixed_order"]["exact"]["digest"] = "sha256:" + "0" * 64
    assert gpu_probe.judge(gpu, other, smoke=True)["passed"] is False
    unstable = copy.deepcopy(gpu)
    unstable["q4_training"]["exact"]["bit_identical"] = False
    assert gpu_probe.judge(unstable, cpu, smoke=True)["passed"] is False
    assert gpu_probe.judge({"error": "exit 1"}, cpu, smoke=True)["ran"] is False


def test_the_benchmark_exit_judges_every_bit_check_that_ran():
    """gpu_check.py's exit status: every measured ``equals_cpu`` counts, time-skipped ones don't,
    and at least one numba-kernel check must have run."""
    import gpu_check

    def report(numba, **timings):
        return {"configs": {"seed": {"bits": {"numba_equals_cpu": numba}, "timings": timings}}}

    ok = {"us": 1.0, "equals_cpu": True}
    assert gpu_check.bits_pass(report(True, global_path=ok, skipped=None))
    assert not gpu_check.bits_pass(report(True, buckets={"us": 1.0, "equals_cpu": False}))
    assert not gpu_check.bits_pass(report(False, global_path=ok))
    assert not gpu_check.bits_pass(report(None, global_path=ok)), "no numba-kernel check ran"
    both = report(True)
    both["configs"]["K=1"] = {"bits": {"numba_equals_cpu": None}, "timings": {"x": ok}}
    assert gpu_check.bits_pass(both), "a configuration skipped for time is not a failure"
