"""``examples/jax_data_parallel.py`` on 1, 2, 4 and 8 simulated CPU devices, and plain
``lax.psum`` on 1 and 8.

XLA fixes its CPU device count when it starts, so each run is its own
process (the script sets ``XLA_FLAGS`` from ``--devices``). The size is
small, and chosen so that plain ``lax.psum`` does round differently here:
at it, every device count gives another plain digest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("jax", reason="jax is not installed")

ROOT = Path(__file__).parents[1]
EXAMPLE = ROOT / "examples" / "jax_data_parallel.py"
DEVICES = (1, 2, 4, 8)
PLAIN_DEVICES = (1, 8)  # two counts show the dependence
SIZE = ["--small"]  # 3 steps, a global batch of 128, 16 hidden units


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_PLATFORMS", None)
    return env


def _run(devices: int, reduce: str) -> dict:
    cmd = [sys.executable, str(EXAMPLE), "--devices", str(devices), "--reduce", reduce, "--json"]
    done = subprocess.run(cmd + SIZE, capture_output=True, text=True, env=_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["devices"] == devices and out["reduce"] == reduce
    return out


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, int], dict]:
    """Every (reduction, device count) run, two processes at a time."""
    keys = [("exact", n) for n in DEVICES] + [("plain", n) for n in PLAIN_DEVICES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda k: _run(k[1], k[0]), keys))
    return dict(zip(keys, results, strict=True))


def test_the_exact_sum_gives_one_digest_on_every_device_count(runs):
    digests = {n: runs["exact", n]["digest"] for n in DEVICES}
    assert len(set(digests.values())) == 1, digests
    for n in DEVICES:  # it trained: the weights moved and the loss fell
        assert runs["exact", n]["loss"] < 0.9 * runs["exact", n]["first_loss"]


def test_plain_lax_psum_gives_a_digest_that_depends_on_the_device_count(runs):
    digests = {n: runs["plain", n]["digest"] for n in PLAIN_DEVICES}
    assert len(set(digests.values())) > 1, digests
    assert runs["plain", 1]["first_loss"] == runs["exact", 1]["first_loss"]
    for n in PLAIN_DEVICES:  # the same training, up to rounding
        assert runs["plain", n]["loss"] == pytest.approx(runs["exact", n]["loss"], rel=1e-4)
