"""Numba start-up cost: a fresh process with an empty cache (cold) against a cached one (warm).

Both runs execute :data:`SCRIPT` in a new interpreter with ``NUMBA_CACHE_DIR``
pointing at the same new, empty folder: the first run compiles every kernel
and writes the cache, the second loads it. The script times ``import
bitfold`` and the first call of each step below on small inputs; the parent
also times the whole process (interpreter start included).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from ...errors import FoldError

#: Timed in order in a fresh process; each is the first call of its kernels.
SCRIPT = r"""
import json, time
t = time.perf_counter()
import numpy as np
import bitfold
steps = {"import bitfold": time.perf_counter() - t}
rng = np.random.default_rng(0)
idx = rng.integers(0, 433, 10_000)
v32 = rng.normal(size=10_000).astype(np.float32)
def step(name, fn):
    t = time.perf_counter()
    out = fn()
    steps[name] = time.perf_counter() - t
    return out
plan = step("plan (K=433)", lambda: bitfold.Fold(idx, 433))
step("exact float32 (K=433)", lambda: plan(v32, "exact"))
step("ordered float32", lambda: plan(v32, "ordered"))
step("exact float64", lambda: plan(v32.astype(np.float64), "exact"))
big = bitfold.Fold(rng.integers(0, 100_000, 10_000), 100_000)
step("exact float32 (K=100,000)", lambda: big(v32, "exact"))
print("@@startup " + json.dumps(steps))
"""


def _run(cache_dir: str, timeout: float) -> dict[str, Any]:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    wall = time.perf_counter() - t0
    line = next((s for s in proc.stdout.splitlines() if s.startswith("@@startup ")), None)
    if proc.returncode != 0 or line is None:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise FoldError(f"the start-up probe failed (exit status {proc.returncode}): {tail[0]}")
    steps = json.loads(line[len("@@startup ") :])
    return {"process_s": wall, "steps_s": steps, "total_steps_s": sum(steps.values())}


def measure_startup(timeout: float = 300.0) -> dict[str, Any]:
    """``{"cold": ..., "warm": ..., "method": ...}`` (see the module docstring)."""
    try:
        with tempfile.TemporaryDirectory(prefix="bitfold-numba-cache-") as cache:
            cold = _run(cache, timeout)
            warm = _run(cache, timeout)
    except (FoldError, subprocess.TimeoutExpired, OSError) as err:
        return {"status": "failed", "reason": f"{type(err).__name__}: {err}"}
    return {
        "status": "ok",
        "cold": cold,
        "warm": warm,
        "method": "two fresh processes sharing a new NUMBA_CACHE_DIR: the first compiles "
        "and fills it (cold), the second loads it (warm)",
    }
