"""Exact folds stay correctly rounded under flush-to-zero and denormals-are-zero.

``torch.set_flush_denormal(True)`` (and XLA's CPU threads) make the float unit
read subnormal operands as zero and write subnormal results as zero. The
exact strategy promises the correctly rounded sum on every thread, so every
entry point is run on subnormal-heavy data with both modes on and compared
bit for bit with the Fraction oracle: in this process (the calling thread in
the modes, small inputs, no worker threads), and in a fresh process that turns
the modes on before any thread starts, so Numba's and XLA's worker threads
inherit them (inputs large enough for the parallel kernels).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import fp_mode_cases as cases
import fpmode
import numpy as np
import pytest

import bitfold
import bitfold.torch

HERE = Path(__file__).resolve().parent

needs_mxcsr = pytest.mark.skipif(
    fpmode.unsupported_reason() is not None, reason=str(fpmode.unsupported_reason())
)


def _compare(got: dict[str, list[int]], want: dict[str, list[int]]) -> None:
    wrong = {
        name: [k for k, (a, b) in enumerate(zip(got[name], want[name], strict=True)) if a != b]
        for name in want
    }
    wrong = {name: ks[:5] for name, ks in wrong.items() if ks}
    assert not wrong, f"buckets whose bits differ from the oracle (first five): {wrong}"


@needs_mxcsr
def test_the_harness_really_flushes():
    """Inside the harness a subnormal product is zero; outside it is not (so the tests can fail)."""
    assert not fpmode.flushes()
    with fpmode.flush_denormals():
        assert fpmode.flushes()
        tiny = np.array([7], np.uint32).view(np.float32)
        assert (tiny + tiny)[0] == 0.0  # what a float sum of subnormals gives in the modes
    assert not fpmode.flushes()


@needs_mxcsr
def test_the_issue_cases_under_torch_flush_denormal():
    """5,000 x 3e-39 and 7 tiny - 3 tiny, with torch's own switch, as a user would write them."""
    import torch

    many = np.full(5000, 3e-39, np.float32)  # made before the mode (its cast would flush)
    tiny = np.array([1] * 7 + [0x80000001] * 3, np.uint32).view(np.float32)
    torch.set_flush_denormal(True)
    try:
        got_many = bitfold.segment_sum(many, np.zeros(5000, np.int64), 1)
        got_tiny = bitfold.segment_sum(tiny, np.zeros(10, np.int64), 1)
        zeros = torch.zeros(10, dtype=torch.long)
        got_torch = bitfold.torch.segment_sum(torch.from_numpy(tiny), zeros, 1)
    finally:
        torch.set_flush_denormal(False)
    want_many = cases.exact_fold_oracle(np.zeros(5000, np.int64), many, 1)
    assert want_many[0] > 1e-36  # a normal number, far from zero
    assert got_many.view(np.uint32).tolist() == want_many.view(np.uint32).tolist()
    assert got_tiny.view(np.uint32).tolist() == [4]
    assert got_torch.view(torch.int32).tolist() == [4]


@needs_mxcsr
def test_every_entry_point_in_this_thread():
    data = cases.inputs(2000)
    with fpmode.flush_denormals():
        got = cases.results(data)
    _compare(got, cases.expected(data, list(got)))


@needs_mxcsr
@pytest.mark.slow
def test_every_entry_point_with_worker_threads_in_the_modes():
    """A process that sets FTZ/DAZ first: Numba's, gloo's and XLA's threads inherit them."""
    n = 300_000  # above the parallel kernels' thresholds
    proc = subprocess.run(
        [sys.executable, str(HERE / "fp_mode_cases.py"), str(n)],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got.pop("flushes at the end") == [1], "the modes were not on at the end of the run"
    for name in ("exact_all_reduce", "jax segment_sum jit", "numpy K=300000 route=sorted-stream"):
        assert name in got
    _compare(got, cases.expected(cases.inputs(n), list(got)))


def test_the_oracle_cases_are_not_trivial():
    """The data has subnormal sums and normal sums of subnormals, so a flush would show."""
    data = cases.inputs(2000)
    want = cases.expected(data, [f"numpy K={cases.KS[0]}"])[f"numpy K={cases.KS[0]}"]
    sums = np.array(want, np.uint32).view(np.float32)
    assert sums[0] > 1e-36 and sums[1] == 4 * 2.0**-149 and sums[3] == 2.0**-127
    assert math.copysign(1.0, sums[4]) < 0
