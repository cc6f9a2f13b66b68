"""The one environment fingerprint (bitfold.repro.fingerprint) and the tools that write it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import bitfold
from bitfold.repro.fingerprint import fingerprint, summary


def test_environment_records_determinism_variables(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    env = fingerprint()
    assert env["env"]["OMP_NUM_THREADS"] == "3"
    assert env["env"]["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert env["env"]["PYTHONHASHSEED"] is None
    assert env["versions"]["bitfold"] == bitfold.__version__
    assert env["versions"]["numpy"] == np.__version__
    assert env["cpu_count"] == __import__("os").cpu_count()
    assert env["threads"]["numba_max"] == __import__("numba").config.NUMBA_NUM_THREADS
    from bitfold.backends.cpu_caches import last_level_cache_bytes

    assert env["last_level_cache_bytes"] == last_level_cache_bytes()  # what the routes read
    json.dumps(env, allow_nan=False)  # plain JSON


def test_fingerprint_changes_no_thread_setting():
    """Starting Numba's OpenMP pool would reset torch's thread count; the fingerprint must not."""
    code = (
        "import torch; torch.set_num_threads(1); import bitfold.repro.fingerprint as m; "
        "from numba.np.ufunc import parallel; e = m.fingerprint(); "
        "assert not parallel._is_initialized; assert 'numba' not in e['threads']; "
        "assert m.thread_settings()['numba'] is None; assert not parallel._is_initialized; "
        "print(torch.get_num_threads(), e['threads']['torch'])"
    )
    pytest.importorskip("torch", reason="torch is not installed")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "1"]


def test_fingerprint_never_imports_a_framework():
    code = (
        "import sys, bitfold.repro.fingerprint as m; e = m.fingerprint(); "
        "assert not {'torch', 'jax', 'cupy'} & set(sys.modules), sorted(sys.modules); "
        "assert 'torch' not in e['versions']; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_fingerprint_describes_torch_when_loaded():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    env = fingerprint()
    assert env["versions"]["torch"] == torch.__version__
    assert env["threads"]["torch"] == torch.get_num_threads()
    assert env["torch"]["deterministic_algorithms"] == torch.are_deterministic_algorithms_enabled()
    assert ("gpu" in env) == torch.cuda.is_available()


def test_numba_threads_reads_the_setting_without_starting_the_pool():
    code = (
        "import bitfold.repro.fingerprint as m, numba; from numba.np.ufunc import parallel; "
        "n = m.numba_threads(); assert not parallel._is_initialized; "
        "assert n == numba.config.NUMBA_NUM_THREADS; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_summary_reads_a_fingerprint_and_an_older_bench_machine_block():
    fp = fingerprint()
    s = summary(fp)
    assert s["cpu"] == fp["cpu"] and s["cores"] == fp["cpu_affinity"]
    assert s["bitfold"] == bitfold.__version__ and s["numba_threads"] >= 1
    old = {"cpu": "AMD EPYC", "cores": 2, "cores_usable": 2, "python": "3.11.7",
           "bitfold": "0.1.0", "threads": {"numba": 2, "torch": 2}, "gpu": "NVIDIA H200"}
    assert summary(old) == {"cpu": "AMD EPYC", "cores": 2, "memory_bytes": None,
                            "gpu": "NVIDIA H200", "python": "3.11.7", "bitfold": "0.1.0",
                            "numba_threads": 2, "torch_threads": 2}


def test_probe_train_and_manifests_write_the_same_fingerprint(tmp_path, capsys):
    """One fingerprint for every tool: the same keys, the same facts."""
    pytest.importorskip("torch", reason="bitfold train needs PyTorch")
    from bitfold import cli
    from bitfold.repro.manifest import read_manifest

    probe = tmp_path / "probe.json"
    tiny = ["--D", "8", "--hid", "16", "--K", "5", "--reps", "1", "--steps", "1", "--batch", "2"]
    assert cli.main(["probe", *tiny, "--json", str(probe)]) == 0
    train = tmp_path / "train.json"
    assert cli.main(["train", "--model", "seed", "--steps", "1", "--strategies", "exact",
                     "--repeats", "1", "--json", str(train), "--record", str(tmp_path)]) == 0
    capsys.readouterr()
    written = {
        "probe": json.loads(probe.read_text())["machine"],
        "train": json.loads(train.read_text())["environment"],
        "manifest": read_manifest(tmp_path / "seed-exact-run1.jsonl").env,
    }
    now = fingerprint()  # torch is loaded now, as it was in each tool
    for tool, fp in written.items():
        assert set(fp) == set(now), tool
        for key in ("cpu", "cpu_count", "cpu_affinity", "python", "versions", "env"):
            assert fp[key] == now[key], (tool, key)
        assert fp["threads"]["numba_max"] == now["threads"]["numba_max"], tool
