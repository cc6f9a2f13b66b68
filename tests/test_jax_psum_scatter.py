"""``bitfold.jax.psum_scatter``: the Fraction oracle's bits on 1, 2 and 8 devices.

XLA fixes its CPU device count when it starts, so the device counts run in a
process of 8 devices, on meshes of the first 1, 2 and 8 (one process for
32-bit mode, one for x64: ``tests/jax_psum_scatter_check.py``, cases in
``tests/psum_scatter_cases.py``). Each device's piece is put back together
into the whole sum, which must be the oracle's bits, and the same for every
device count where the terms are (every case that sums each device's rows).
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax", reason="jax is not installed")

import jax
import jax.numpy as jnp
from oracle import exact_fold_oracle
from psum_scatter_cases import CASES, global_terms, weights
from test_jax_psum import MESHES, _env

import bitfold
import bitfold.jax as bj

CHECK = Path(__file__).with_name("jax_psum_scatter_check.py")
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


@cache
def _runs(x64: bool) -> dict[str, dict[str, list[str]]]:
    meshes = ",".join(map(str, MESHES[x64]))
    cmd = [sys.executable, str(CHECK), "8", "--meshes", meshes] + (["--x64"] if x64 else [])
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(devices: int, x64: bool = False) -> dict[str, list[str]]:
    """Every case's result bits (put together from the pieces) on a mesh of ``devices``."""
    return _runs(x64)[str(devices)]


def terms_for(name: str, devices: int) -> np.ndarray:
    """The terms case ``name`` sums on ``devices`` devices (as the check script cuts them)."""
    case = CASES[name]
    terms = global_terms(name)
    if not case.local:
        terms = terms[:devices]
    if not case.tiled:
        terms = np.take(terms, np.arange(devices), axis=1 + case.scatter)
    return terms


def oracle_hex(name: str, devices: int) -> list[str]:
    """The whole sum of the case's terms, each element rounded once (the pieces put together)."""
    case = CASES[name]
    terms = terms_for(name, devices)
    rows, size = terms.shape[0], int(np.prod(terms.shape[1:]))
    index = np.tile(np.arange(size), rows)
    want = exact_fold_oracle(index, terms.astype(np.float64).reshape(-1), size, case.dtype)
    bits = np.ascontiguousarray(want).view(UINT[np.asarray(want).dtype.itemsize])
    if case.dtype == "bfloat16" and bits.dtype == np.uint32:  # held in float32
        bits = bits >> 16
    return [format(int(b), "x") for b in bits]


@pytest.mark.slow
@pytest.mark.parametrize("devices", MESHES[False])
def test_every_piece_is_the_oracles_bits_on_any_device_count(devices):
    got = run(devices)
    for name, case in CASES.items():
        if not case.x64:
            assert got[name] == oracle_hex(name, devices), name
    assert got["float32:pmap"] == got["float32"]


@pytest.mark.slow
def test_the_same_terms_give_the_same_bits_on_every_device_count():
    """Each device sums its rows too (axis=0): the terms are the same on 1 to 8 devices."""
    runs = {devices: run(devices) for devices in MESHES[False]}
    for name, case in CASES.items():
        if case.local and case.tiled and not case.x64:
            assert len({tuple(r[name]) for r in runs.values()}) == 1, name
    assert runs[1]["float32"][0] == format(int(np.float32(1 + 2.0**-23).view(np.uint32)), "x")


@pytest.mark.slow
@pytest.mark.parametrize("devices", [1, 8])
def test_with_x64_the_words_are_int64_and_float64_is_served(devices):
    got = run(devices, x64=True)
    for name, case in CASES.items():
        if case.x64:
            assert got[name] == oracle_hex(name, devices), name
    assert got["float32-x64:pmap"] == got["float32-x64"]


@pytest.mark.slow
def test_the_gradient_is_the_transpose_of_psum_scatter():
    """An all-gather of the cotangents: every term gets its sum's cotangent, unchanged."""
    shape = global_terms("float32").shape
    want = np.tile(weights(shape[1:]).reshape(-1), shape[0])
    want_hex = [format(int(b), "x") for b in want.view(np.uint32)]
    for devices in (1, 8):
        assert run(devices)["float32:grad"] == want_hex
    assert run(8, x64=True)["float32-x64:grad"] == want_hex


def test_bad_input_is_refused_by_name_before_any_work():
    pm = lambda body, x: jax.pmap(body, axis_name="i")(x)  # noqa: E731 - one device here
    with pytest.raises(bitfold.FoldTypeError, match=r"psum_scatter .* x\['z'\]"):
        bj.psum_scatter({"w": jnp.ones(3), "z": jnp.ones(3, jnp.complex64)}, "i")
    with pytest.raises(bitfold.FoldError, match="psum_scatter over axis_name='nowhere'"):
        bj.psum_scatter(jnp.ones(3), "nowhere")
    with pytest.raises(bitfold.FoldError, match="scatter_dimension=2"):
        pm(lambda t: bj.psum_scatter(t, "i", scatter_dimension=2), jnp.ones((1, 1, 3)))
    with pytest.raises(bitfold.FoldError, match=r"tiled=False.* its size must be 1; got 3"):
        pm(lambda t: bj.psum_scatter(t, "i"), jnp.ones((1, 3)))
    with pytest.raises(bitfold.FoldError, match="axis=4"):
        pm(lambda t: bj.psum_scatter(t, "i", axis=4), jnp.ones((1, 3)))


def test_integers_go_to_lax_and_a_pytree_leaf_by_leaf():
    f = jax.pmap(lambda g: bj.psum_scatter(g, "i", axis=0, tiled=True), axis_name="i")
    tiny = 2.0**-24
    out = f({"w": jnp.array([[[1.0, 0.5], [tiny, 0.0], [tiny, 0.0]]]),
             "steps": jnp.array([[[1, 2], [3, 4]]], jnp.int32)})  # fmt: skip
    assert out["w"].tolist() == [[1 + 2 * tiny, 0.5]]
    assert out["steps"].tolist() == [[4, 6]] and out["steps"].dtype == jnp.int32
