"""Run the GPU kernel cases (``tests/cuda_cases.py``) in a subprocess: simulator or real GPU.

``numba.cuda`` is the simulator or the real CUDA target for a whole process,
fixed when it is first imported; the compile check in this test session
needs the real one. So the kernel cases run in a fresh interpreter:

* by default (CI, no GPU) with ``NUMBA_ENABLE_CUDASIM=1``;
* with ``BITFOLD_CUDA_DEVICE=1`` (``scripts/gpu_check.sh``) on the real GPU.

Each run must pass, must run at least a handful of cases, and may skip a case
only for the reasons listed in ``ALLOWED_SKIPS`` (a case that needs a real GPU
while on the simulator; an optional array library that is not installed), so
a broken install cannot turn the whole suite into skips. Without numba-cuda
the runs are skipped, unless ``BITFOLD_REQUIRE_CUDA=1`` makes that a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("cuda_cases.py")
DEVICE = os.environ.get("BITFOLD_CUDA_DEVICE") == "1"
REQUIRED = os.environ.get("BITFOLD_REQUIRE_CUDA") == "1"
HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
ALLOWED_SKIPS = ("needs a real CUDA device", "is needed for")
#: cases of tests/cuda_cases.py that must run (not skip) on the simulator, in one process:
#: a second interpreter would import numba-cuda, torch and bitfold again for nothing
MIN_RAN = 100


@pytest.mark.slow
def test_gpu_kernel_cases(tmp_path):
    mode = "the real GPU" if DEVICE else "the simulator"
    if not HAVE_NUMBA_CUDA:
        if REQUIRED:
            pytest.fail("BITFOLD_REQUIRE_CUDA=1 but numba-cuda is not installed")
        pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')")
    env = dict(os.environ)
    if DEVICE:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
    else:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    report = tmp_path / "cases.xml"
    cmd = [sys.executable, "-m", "pytest", str(CASES), "-q", "-p", "no:cacheprovider",
           "-o", "addopts=", "-rs", f"--junitxml={report}"]  # fmt: skip
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=900, cwd=CASES.parent.parent
    )
    out = proc.stdout[-8000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, f"GPU kernel cases failed on {mode}:\n{out}"
    suite = next(ET.parse(report).getroot().iter("testsuite"))
    ran = 0
    for case in suite.iter("testcase"):
        skip = case.find("skipped")
        if skip is None:
            ran += 1
            continue
        reason = skip.get("message") or ""
        assert any(a in reason for a in ALLOWED_SKIPS), (
            f"{case.get('name')} was skipped on {mode}: {reason}\n{out}"
        )
    assert ran >= MIN_RAN, f"only {ran} GPU kernel cases ran on {mode}:\n{out}"


def test_import_bitfold_does_not_import_numba_cuda():
    code = (
        "import sys, bitfold, bitfold.backends.cuda, bitfold.kernels.ieee; "
        "bad = sorted(m for m in sys.modules if m.startswith(('numba.cuda', 'numba_cuda', "
        "'torch', 'cupy'))); print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: Runs a script (argv[2], its arguments after it) with the simulator's zero fills small and its
#: blocks run as greenlets (tests/quicker_simulator.py, from the folder argv[1]): unshaped fills
#: took most of the smoke run at K = 5000.
QUICKER_SIMULATOR = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
from quicker_simulator import quicker_simulator
quicker_simulator()
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_the_gpu_benchmark_script_runs_on_the_simulator(tmp_path):
    """``scripts/gpu_check.py --smoke``: every step of ``make gpu-check`` runs, bits checked.

    On the simulator (and Triton's interpreter, where the triton backend is registered) the
    times mean nothing; what is checked is that the script that will run once on a lent device
    completes, writes its JSON, and finds every exact result equal to the CPU's (its exit status
    says so); without the triton backend its steps are skipped with the reason.
    """
    if not HAVE_NUMBA_CUDA:
        if REQUIRED:
            pytest.fail("BITFOLD_REQUIRE_CUDA=1 but numba-cuda is not installed")
        pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')")
    script = CASES.parent.parent / "scripts" / "gpu_check.py"
    out = tmp_path / "gpu_bench.json"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", QUICKER_SIMULATOR, str(CASES.parent), str(script),
                           "--smoke", "--out", str(out)], env=env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    report = json.loads(out.read_text())
    configs = report["configs"]
    assert sorted(configs) == ["K=1", "K=1e6", "rows-uniform", "rows-zipf", "seed"], configs
    assert all(c["bits"]["numba_equals_cpu"] is True for c in configs.values()), configs
    split = configs["K=1"]["timings"]["bitfold_exact_buckets_split[numba-kernels,numba]"]
    assert split["equals_cpu"] is True, split
    statuses = {v["status"] for v in report["steps"].values()}
    assert "failed" not in statuses, report["steps"]
    # the portable path is timed on torch CUDA and JAX GPU arrays: skipped, by name, here
    for key in ("bitfold_exact[portable,torch]", "bitfold_exact[portable,jax]",
                "bitfold_exact[portable,jax,plan]", "bitfold_exact[portable,torch,compiled]"):
        assert configs["seed"]["timings"][key] is None
        assert report["steps"][f"seed: {key}"]["status"] == "skipped"
    assessment = report["assessment"]
    assert assessment["graph_capture_works"]["torch"] == "not measured"
    assert assessment["portable_path"]["seed"]["jax_plan_over_segment_sum"] == "not measured"
    for mode in ("default", "reduce-overhead"):  # needs torch with a CUDA device
        assert report["compiled_step"][mode]["status"] == "skipped"
        assert assessment["G4_compiled_step"]["per_mode"][mode]["met"] == "not measured"
    for goal in ("G1_exact_plan_built_once", "G2_host_time", "G3_one_shot", "G4_compiled_step"):
        assert assessment[goal]["met"].startswith("not judged"), assessment[goal]
    # the Triton path under TRITON_INTERPRET=1 on CPU tensors, or skipped with the reason
    if "triton" in report["backends"]:
        for name, c in configs.items():
            for key in ("triton_equals_cpu", "triton_one_shot_equals_cpu",
                        "triton_ordered_same_bits_run_to_run"):  # fmt: skip
                assert c["bits"][key] is True, (name, key, report["steps"])
        assert configs["seed"]["timings"]["bitfold_exact[triton,torch]"]["equals_cpu"] is True
        assert assessment["G5_bits"]["met"] is True, assessment["G5_bits"]
    else:
        step = report["steps"]["seed: triton bits"]
        assert step["status"] == "skipped" and "not registered" in step["reason"], step


def test_the_gpu_check_writes_its_json_when_a_step_fails(tmp_path):
    """A failure outside any step's guard (here: no numba at all) still leaves the JSON."""
    script = CASES.parent.parent / "scripts" / "gpu_check.py"
    out = tmp_path / "gpu_bench.json"
    code = (
        "import sys, runpy; sys.modules['numba'] = None; "
        f"sys.argv = ['gpu_check.py', '--smoke', '--out', {str(out)!r}]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"))  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    step = report["steps"]["import numba-cuda and the libraries"]
    assert step["status"] == "failed" and "numba" in step["error"], step
