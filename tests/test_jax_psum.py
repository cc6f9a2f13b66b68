"""``bitfold.jax.psum``: the Fraction oracle's bits on 1, 2 and 8 devices and on 2 processes.

XLA fixes its CPU device count when it starts, so the device counts run in a
process of 8 devices, on meshes of the first 1, 2 and 8 (one process for
32-bit mode, one for x64: ``tests/jax_psum_check.py``, cases in
``tests/psum_cases.py``); the two-process run joins a ``jax.distributed`` group over JAX's CPU
collectives on this machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax", reason="jax is not installed")

import jax
import jax.numpy as jnp
from oracle import bucket_oracle, exact_fold_oracle
from psum_cases import CASES, global_terms

import bitfold
import bitfold.jax as bj

CHECK = Path(__file__).with_name("jax_psum_check.py")
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                         env.get("PYTHONPATH", "")])  # fmt: skip
    env.pop("XLA_FLAGS", None)
    return env


#: The device counts each mode runs on, all in one process of 8 devices.
MESHES = {False: (1, 2, 8), True: (1, 8)}  # one device, the fewest and the most to split


@cache
def _runs(x64: bool) -> dict[str, dict[str, list[str]]]:
    meshes = ",".join(map(str, MESHES[x64]))
    cmd = [sys.executable, str(CHECK), "8", "--meshes", meshes] + (["--x64"] if x64 else [])
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(devices: int, x64: bool = False) -> dict[str, list[str]]:
    """Every case's result bits on a mesh of ``devices`` devices."""
    return _runs(x64)[str(devices)]


def oracle_hex(name: str, devices: int) -> list[str]:
    case = CASES[name]
    terms = global_terms(name)
    if not case.local_axis:
        terms = terms[:devices]
    rows, cols = terms.shape
    index = np.tile(np.arange(cols), rows)
    want = exact_fold_oracle(index, terms.astype(np.float64).reshape(-1), cols, case.dtype)
    width = 2 if case.dtype in ("float16", "bfloat16") else np.dtype(case.dtype).itemsize
    bits = np.ascontiguousarray(want).view(UINT[np.asarray(want).dtype.itemsize])
    if case.dtype == "bfloat16" and bits.dtype == np.uint32:  # held in float32
        bits = bits >> 16
    assert bits.dtype.itemsize in (width, 4, 8)
    return [format(int(b), "x") for b in bits]


@pytest.mark.parametrize("devices", MESHES[False])
def test_every_case_is_the_oracles_bits_on_any_device_count(devices):
    got = run(devices)
    for name, case in CASES.items():
        if not case.x64:
            assert got[name] == oracle_hex(name, devices), name


@pytest.mark.parametrize("devices", [1, 8])
def test_with_x64_the_words_are_int64_and_float64_is_served(devices):
    got = run(devices, x64=True)
    for name, case in CASES.items():
        if case.x64:
            assert got[name] == oracle_hex(name, devices), name


def test_the_gradient_is_the_transpose_of_psum():
    """Under shard_map a cotangent every device holds passes to each device's terms unchanged."""
    weights = np.linspace(0.1, 3.7, global_terms("float32").shape[1], dtype=np.float32)
    want = np.tile(weights, (global_terms("float32").shape[0], 1))
    for devices in (1, 8):
        assert run(devices)["float32:grad"] == [format(int(b), "x") for b in
                                                want.view(np.uint32).reshape(-1)]  # fmt: skip


def test_two_processes_of_four_devices_give_the_bits_of_one_process_of_eight():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    base = [sys.executable, str(CHECK), "4", "--processes", "2", "--port", str(port)]
    peer = subprocess.Popen([*base, "--process", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=_env())  # fmt: skip
    try:
        done = subprocess.run([*base, "--process", "0"], capture_output=True, text=True,
                              env=_env(), timeout=300)  # fmt: skip
        peer_err = peer.communicate(timeout=120)[1]
    finally:
        peer.kill()
    assert done.returncode == 0 and peer.returncode == 0, done.stderr[-2000:] + peer_err[-2000:]
    two = json.loads(done.stdout.strip().splitlines()[-1])["8"]
    one = run(8)
    assert two.keys() == one.keys()
    for name in one:
        assert two[name] == one[name], name


def test_bad_input_is_refused_by_name_before_any_work():
    with pytest.raises(bitfold.FoldTypeError, match="complex64"):
        bj.psum({"w": jnp.ones(3), "z": jnp.ones(3, jnp.complex64)}, "i")
    with pytest.raises(bitfold.FoldError, match="axis=5"):
        bj.psum(jnp.ones((2, 3)), "i", axis=5)
    with pytest.raises(bitfold.FoldError, match="twice"):
        bj.psum(jnp.ones((2, 3)), "i", axis=(0, -2))
    with pytest.raises(bitfold.FoldError, match="no mapped axis"):
        bj.psum(jnp.ones(3), "nowhere")


def test_a_pytree_of_gradients_sums_leaf_by_leaf():
    f = jax.pmap(lambda g: bj.psum(g, "i", axis=0), axis_name="i")
    tiny = 2.0**-24
    grads = {"w": jnp.array([[[1.0, 1.0], [tiny, tiny], [tiny, tiny], [tiny, tiny]]]),
             "steps": jnp.array([[1, 2, 3]], jnp.int32), "h": [jnp.array([[0.5, -0.5]])]}
    out = f(grads)
    assert out["w"].tolist() == [[bucket_oracle([1.0, tiny, tiny, tiny])] * 2]
    assert out["steps"].tolist() == [6] and out["steps"].dtype == jnp.int32
    assert out["h"][0].tolist() == [0.0]


def test_one_device_pmap_in_this_process():
    f = jax.pmap(lambda x: bj.psum(x, "i", axis=0), axis_name="i")
    x = jnp.array([[1.0, 2.0**-24, 2.0**-24, 2.0**-24]], jnp.float32)
    assert f(x).tolist() == [bucket_oracle(x[0].tolist())] == [1.000000238418579]  # not 1.0


def test_docstring_example():
    import doctest

    import bitfold.jax_psum as module

    failed, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert tried >= 2 and failed == 0
