"""scripts/gpu_check.py, the benchmark of ``make gpu-check``: its timing and its judgement of the
goals, checked here without a GPU on made-up figures, and its smoke run without the triton
backend (the run with it is ``tests/test_cuda_sim.py``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"
sys.path.insert(0, str(SCRIPT.parent))
import gpu_check  # noqa: E402  (the script's folder, put on the path above)

NAMES = [c.name for c in gpu_check.FULL]


def _entry(us, host_us=5.0, **more):
    return {"us": us, "host_us": host_us, "device_us": us / 2, **more}


def _report(triton, index_add, one_shot=None, numba=None, smoke=False, host_us=5.0):
    """A full run's report with the given wall times (microseconds) at every configuration."""
    configs = {}
    for name in NAMES:
        timings = {
            gpu_check.TRITON: _entry(triton[name], host_us, equals_cpu=True),
            gpu_check.ONE_SHOT: _entry((one_shot or index_add)[name], equals_cpu=True),
            gpu_check.INDEX_ADD: _entry(index_add[name]),
            gpu_check.NUMBA_TORCH: _entry((numba or triton)[name]),
        }
        bits = {"triton_equals_cpu": True, "triton_one_shot_equals_cpu": True,
                "triton_ordered_same_bits_run_to_run": True, "numba_equals_cpu": True}  # fmt: skip
        configs[name] = {"timings": timings, "bits": bits}
    step = {"median_ms": {"compiled": 1.0, "exact_compiled": 1.1},
            "exact_compiled_over_compiled": 1.1}  # fmt: skip
    return {"smoke": smoke, "configs": configs,
            "compiled_step": {"default": {**step, "gradients_equal_for_two_edge_orders": True},
                              "reduce-overhead": dict(step)},
            "graph_capture": {"torch": {"works": True}, "cupy": None}}  # fmt: skip


BASE = dict.fromkeys(NAMES, 1000.0)


def test_every_goal_met_is_judged_met():
    fast = {name: 1.0 for name in NAMES}  # 0.001x index_add_: within every G1 limit
    a = gpu_check.assess(_report(fast, BASE))
    for goal in ("G1_exact_plan_built_once", "G2_host_time", "G3_one_shot", "G4_compiled_step",
                 "G5_bits"):  # fmt: skip
        assert a[goal]["met"] is True, (goal, a[goal])
        assert a[goal]["goal"]
    assert a["all_goals_met"] is True
    assert a["G1_exact_plan_built_once"]["per_config"]["seed"]["over_index_add"] == 0.001
    assert a["triton_at_least_numba_speed"]["met"] is True
    assert a["graph_capture_works"] == {"torch": True, "cupy": "not measured"}
    json.dumps(a)  # the report is written as JSON


def test_g1_limits_are_tighter_at_the_seed_and_at_k1():
    # 0.5x index_add_ everywhere: within 1.0x, but not 0.1x at the seed nor 0.01x at K=1
    a = gpu_check.assess(_report(dict.fromkeys(NAMES, 500.0), BASE))
    per = a["G1_exact_plan_built_once"]["per_config"]
    assert per["seed"]["limit"] == 0.1 and per["seed"]["met"] is False
    assert per["K=1"]["limit"] == 0.01 and per["K=1"]["met"] is False
    assert per["K=1e6"]["limit"] == 1.0 and per["K=1e6"]["met"] is True
    assert a["G1_exact_plan_built_once"]["met"] is False
    assert a["all_goals_met"] is False


def test_host_time_one_shot_compiled_step_and_retiring_numba_are_judged_apart():
    fast = {name: 1.0 for name in NAMES}
    slow_one_shot = {**BASE, "rows-zipf": 2500.0}  # 2.5x index_add_ at one configuration
    numba = {**fast, "K=1": 0.5}  # the numba kernels faster at one configuration
    report = _report(fast, BASE, one_shot=slow_one_shot, numba=numba, host_us=30.0)
    report["compiled_step"]["reduce-overhead"]["exact_compiled_over_compiled"] = 1.5
    a = gpu_check.assess(report)
    assert a["G1_exact_plan_built_once"]["met"] is True
    assert a["G2_host_time"]["met"] is False
    assert a["G2_host_time"]["per_config"]["seed"]["host_us"] == 30.0
    assert a["G3_one_shot"]["met"] is False
    assert a["G3_one_shot"]["per_config"]["rows-zipf"]["over_index_add"] == 2.5
    assert a["G3_one_shot"]["per_config"]["seed"]["met"] is True
    g4 = a["G4_compiled_step"]
    assert g4["per_mode"]["default"]["met"] is True
    assert g4["per_mode"]["reduce-overhead"]["met"] is False and g4["met"] is False
    retire = a["triton_at_least_numba_speed"]
    assert retire["met"] is False and retire["per_config"]["K=1"]["triton_over_numba"] == 2.0


def test_a_missing_figure_is_not_measured_and_a_wrong_bit_fails():
    report = _report(dict.fromkeys(NAMES, 1.0), BASE)
    report["configs"]["K=1"]["timings"][gpu_check.TRITON] = None  # skipped for time
    del report["compiled_step"]["reduce-overhead"]["exact_compiled_over_compiled"]
    a = gpu_check.assess(report)
    assert a["G1_exact_plan_built_once"]["met"].startswith("not measured")
    assert a["G1_exact_plan_built_once"]["per_config"]["K=1"] == {"met": "not measured"}
    assert a["G4_compiled_step"]["met"].startswith("not measured")
    assert a["all_goals_met"] == "not all measured"
    assert gpu_check.bits_pass(report)
    report["configs"]["seed"]["bits"]["triton_ordered_same_bits_run_to_run"] = False
    a = gpu_check.assess(report)
    assert a["G5_bits"]["met"] is False and a["all_goals_met"] is False
    assert not gpu_check.bits_pass(report)


def test_a_wrong_result_off_the_goals_paths_fails_the_bits_too():
    report = _report(dict.fromkeys(NAMES, 1.0), BASE)
    report["configs"]["seed"]["timings"]["bitfold_exact[portable,torch]"] = _entry(
        9.0, equals_cpu=False
    )
    assert gpu_check.assess(report)["G5_bits"]["met"] is False
    assert not gpu_check.bits_pass(report)
    report = _report(dict.fromkeys(NAMES, 1.0), BASE)
    report["compiled_step"]["default"]["gradients_equal_for_two_edge_orders"] = False
    assert gpu_check.assess(report)["G5_bits"]["met"] is False
    assert not gpu_check.bits_pass(report)


def test_the_smoke_run_judges_bits_but_no_times():
    a = gpu_check.assess(_report(dict.fromkeys(NAMES, 9e5), BASE, smoke=True))
    for goal in ("G1_exact_plan_built_once", "G2_host_time", "G3_one_shot", "G4_compiled_step",
                 "triton_at_least_numba_speed"):  # fmt: skip
        assert a[goal]["met"].startswith("not judged"), a[goal]
    assert a["G2_host_time"]["per_config"]["seed"]["met"].startswith("not judged")
    assert a["G5_bits"]["met"] is True


def test_bits_pass_needs_a_numba_or_triton_check():
    report = _report(dict.fromkeys(NAMES, 1.0), BASE)
    for c in report["configs"].values():
        c["bits"]["numba_equals_cpu"] = None
    assert gpu_check.bits_pass(report), "the Triton checks alone are enough"
    for c in report["configs"].values():
        c["bits"]["triton_equals_cpu"] = None
    assert not gpu_check.bits_pass(report)


def _check(smoke=False, seconds=0.001):
    args = argparse.Namespace(smoke=smoke, budget=10.0, seconds=seconds)
    return gpu_check.Check(args)


def test_timed_measures_wall_and_bounded_host_trials_with_new_inputs_each_call():
    calls, prepared, synced = [], [], []
    pool = []

    def prepare(n):
        prepared.append(n)
        pool[:] = [object() for _ in range(n)]

    def fn():
        calls.append(pool.pop())  # fails if a call had no input of its own

    entry = gpu_check.timed(_check(seconds=0.05), fn, lambda: synced.append(1), prepare=prepare,
                            max_reps=30)  # fmt: skip
    assert entry["reps"] == 30, entry  # capped by max_reps (the calls take ~1 us)
    assert entry["host_calls"] == gpu_check.HOST_CALLS
    assert len(entry["us_trials"]) == 3 and len(entry["host_us_trials"]) == 5
    assert prepared == [1, 1, 30, 30, 30] + [gpu_check.HOST_CALLS] * 5
    assert len(calls) == sum(prepared) and len(set(map(id, calls))) > 1
    assert entry["us"] == min(entry["us_trials"])


def test_device_time_without_cuda_says_so():
    out = gpu_check.device_time(_check(), lambda: None, 10.0)
    assert out["device_us"] is None and "CUDA" in out["device_note"]


@pytest.mark.slow
def test_the_smoke_run_without_the_triton_backend_skips_its_steps(tmp_path):
    """With no triton backend registered, every Triton step is skipped with the reason and the
    run still passes on the numba kernels (one configuration, for time)."""
    pytest.importorskip("numba_cuda")
    out = tmp_path / "gpu_bench.json"
    code = (  # the simulator made quicker as test_cuda_sim.py's runs make it
        f"import sys; sys.path[:0] = [{str(SCRIPT.parent)!r}, {str(Path(__file__).parent)!r}]; "
        "from quicker_simulator import quicker_simulator; quicker_simulator(); "
        "from bitfold.backends import registry; registry.unregister('triton'); "
        "import gpu_check; del gpu_check.SMOKE[1:]; "
        f"sys.exit(gpu_check.main(['--smoke', '--out', {str(out)!r}]))"
    )
    src = str(SCRIPT.parents[1] / "src")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": src}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert "triton" not in report["backends"]
    steps = report["steps"]
    assert steps["triton backend"]["status"] == "skipped"
    for name in ("seed: triton bits", "seed: triton ordered bits run to run",
                 f"seed: {gpu_check.TRITON}", f"seed: {gpu_check.ONE_SHOT}"):  # fmt: skip
        assert steps[name]["status"] == "skipped", (name, steps[name])
        assert "not registered" in steps[name]["reason"]
    assert "failed" not in {s["status"] for s in steps.values()}, steps
    assert report["configs"]["seed"]["bits"]["numba_equals_cpu"] is True
    assert report["assessment"]["G5_bits"]["met"].startswith("not measured")


#: Runs a script (argv[2], its arguments after it) with Triton's interpreter patching
#: triton.language once a launch (tests/quicker_interpreter.py, from the folder argv[1]), as in
#: the suite's own processes: the bits step's smoke run took 29.7 s without, 21.1 s with.
QUICKER_INTERPRETER = """
import os, runpy, sys
sys.path.insert(0, sys.argv[1])
if os.environ.get("TRITON_INTERPRET") == "1":
    from quicker_interpreter import quicker_interpreter
    quicker_interpreter()
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_bits_step_runs_every_dtype_and_init_and_says_what_it_skipped(tmp_path):
    """scripts/gpu_bits.py --smoke: every dtype with and without init in Triton's interpreter,
    the host's bits; the device-only cases skipped with their reason."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    out = tmp_path / "gpu_bits.json"
    env = {**os.environ, "PYTHONPATH": str(SCRIPT.parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", QUICKER_INTERPRETER, str(Path(__file__).parent),
                           str(SCRIPT.parent / "gpu_bits.py"), str(out), "--smoke"],
                          capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    cases = report["cases"]
    for dtype in ("float32", "float16", "bfloat16", "float64"):
        for init in (False, True):
            assert cases[f"{dtype}, init={init}"]["ok"] is True
    for name in ("torch stream", "cupy stream", "hot buckets in a CUDA graph", "cuda:1"):
        assert "--smoke" in cases[name]["skipped"]
    assert report["all_bits_equal"] is True
    assert set(report["one_word_share"]) == {"float32", "float16", "bfloat16", "float64"}
    assert all(0 <= share <= 1 for share in report["one_word_share"].values())
