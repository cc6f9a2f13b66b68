"""``tests/quicker_simulator.py``'s blocks as greenlets keep the simulator's rules: barriers,
each thread's indices and lane, barrier counts, threads that end before a barrier, and an error
that names its thread; all in the launching thread.

numba-cuda's simulator is chosen for a whole process when ``numba.cuda`` is first imported,
so the kernels run in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

KERNELS = r"""
import json, sys, threading
import numpy as np
sys.path.insert(0, sys.argv[1])
from quicker_simulator import blocks_as_greenlets
blocks_as_greenlets()
from numba import cuda, int64

N = 8  # threads a block (x), 2 in y

@cuda.jit
def neighbours(out):
    # each thread reads the value its neighbour wrote before the barrier: wrong without it
    sm = cuda.shared.array(16, int64)
    t = cuda.threadIdx.x + N * cuda.threadIdx.y
    sm[t] = 100 * cuda.blockIdx.x + t
    cuda.syncthreads()
    out[cuda.blockIdx.x, t] = sm[(t + 1) % 16]
    cuda.syncthreads()
    sm[t] = -1

@cuda.jit
def indices(out, idents):
    t = cuda.threadIdx.x + N * cuda.threadIdx.y
    b = cuda.blockIdx.x
    out[b, t, 0] = cuda.threadIdx.x
    out[b, t, 1] = cuda.threadIdx.y
    out[b, t, 2] = b
    out[b, t, 3] = cuda.laneid
    out[b, t, 4] = cuda.syncthreads_count(t % 3 == 0)
    idents[b, t] = threading.get_ident()

@cuda.jit
def early_exit(out):
    # threads 0..3 end before the barrier: the others are released without them
    sm = cuda.shared.array(16, int64)
    t = cuda.threadIdx.x + N * cuda.threadIdx.y
    if t < 4:
        return
    sm[t] = t
    cuda.syncthreads()
    out[t] = sm[4 + (t - 3) % 12]

@cuda.jit
def fails(out):
    t = cuda.threadIdx.x + N * cuda.threadIdx.y
    if cuda.blockIdx.x == 1 and t == 5:
        out[99] = 1  # out of range
    else:
        out[t] = 1

result = {}
out = np.zeros((3, 16), np.int64)
neighbours[3, (N, 2)](out)
result["neighbours"] = out.tolist()
out = np.zeros((2, 16, 5), np.int64)
idents = np.zeros((2, 16), np.int64)
indices[2, (N, 2)](out, idents)
result["indices"] = out.tolist()
result["one_thread"] = bool((idents == threading.get_ident()).all())
out = np.zeros(16, np.int64)
early_exit[1, (N, 2)](out)
result["early_exit"] = out.tolist()
try:
    fails[2, (N, 2)](np.zeros(16, np.int64))
    result["error"] = None
except Exception as e:
    result["error"] = str(e)
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def ran() -> dict:
    pytest.importorskip("numba_cuda", reason="numba-cuda is not installed")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", KERNELS, str(TESTS)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_barrier_waits_for_every_thread_of_the_block(ran):
    want = [[100 * b + (t + 1) % 16 for t in range(16)] for b in range(3)]
    assert ran["neighbours"] == want


def test_each_simulated_thread_has_its_own_indices_lane_and_barrier_count(ran):
    for b in range(2):
        for t in range(16):
            x, y = t % 8, t // 8
            assert ran["indices"][b][t] == [x, y, b, t % 32, 6], (b, t)  # 6 of 16: t % 3 == 0


def test_every_simulated_thread_runs_in_the_launching_thread(ran):
    assert ran["one_thread"] is True


def test_threads_that_end_before_a_barrier_do_not_hold_it(ran):
    assert ran["early_exit"] == [0] * 4 + [4 + (t - 3) % 12 for t in range(4, 16)]


def test_an_error_names_its_thread_and_block(ran):
    assert ran["error"] is not None and "tid=[5, 0, 0] ctaid=[1, 0, 0]" in ran["error"]
