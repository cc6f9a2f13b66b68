"""``examples/jax_fsdp.py`` on 1, 2 and 4 simulated CPU devices, both reduce-scatters.

XLA fixes its CPU device count when it starts, so each run is its own
process (the script sets ``XLA_FLAGS`` from ``--devices``). At the small
size, plain ``lax.psum_scatter`` of float partial sums gives three digests;
``bitfold.jax.psum_scatter`` one.
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
EXAMPLE = ROOT / "examples" / "jax_fsdp.py"
DEVICES = (1, 2, 4)


def _run(devices: int, reduce: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_PLATFORMS", None)
    cmd = [sys.executable, str(EXAMPLE), "--devices", str(devices), "--reduce", reduce,
           "--json", "--small"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["devices"] == devices and out["reduce"] == reduce
    return out


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, int], dict]:
    """Every (reduction, device count) run, two processes at a time."""
    keys = [(reduce, n) for reduce in ("exact", "plain") for n in DEVICES]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda k: _run(k[1], k[0]), keys))
    return dict(zip(keys, results, strict=True))


def test_the_exact_reduce_scatter_gives_one_digest_on_every_device_count(runs):
    digests = {n: runs["exact", n]["digest"] for n in DEVICES}
    assert len(set(digests.values())) == 1, digests
    for n in DEVICES:  # it trained: the loss fell
        assert runs["exact", n]["loss"] < 0.9 * runs["exact", n]["first_loss"]


def test_plain_psum_scatter_gives_a_digest_that_depends_on_the_device_count(runs):
    digests = {n: runs["plain", n]["digest"] for n in DEVICES}
    assert len(set(digests.values())) == len(DEVICES), digests
    for n in DEVICES:  # the same training, up to rounding
        assert runs["plain", n]["loss"] == pytest.approx(runs["exact", n]["loss"], rel=1e-4)
