"""A first use that compiles kernels says so on stderr, once; a warm cache says nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from numba.core import event

import bitfold
from bitfold.backends import host_routes
from bitfold.kernels import compiling

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process has said nothing yet."""
    monkeypatch.setattr(compiling, "_said", set())


def _compile_event(module: str) -> None:
    """Numba's event for a cache miss of a kernel defined in ``module`` (nothing compiles)."""
    kernel = SimpleNamespace(py_func=SimpleNamespace(__module__=module))
    with event.trigger_event("numba:compile", data={"dispatcher": kernel}):
        pass


def test_a_kernel_compilation_says_what_once_a_process(fresh, capsys):
    _compile_event("bitfold.kernels.planning")
    _compile_event("bitfold.kernels.planning")
    what, seconds = compiling.MODULES["planning"]
    assert capsys.readouterr().err == compiling.message(what, seconds) + "\n"
    assert compiling.message(what, seconds).startswith("bitfold: compiling the plan-building")


def test_other_compilations_say_nothing(fresh, capsys):
    _compile_event("my_project.kernels")  # the user's own numba functions
    _compile_event("bitfold.kernels.cuda")  # the numba-cuda kernels, compiled for a GPU
    assert capsys.readouterr().err == ""


def test_quietly_says_nothing(fresh, capsys):
    with compiling.quietly():
        _compile_event("bitfold.kernels.cpu")  # the thread pool's one-loop kernel
    assert capsys.readouterr().err == ""
    _compile_event("bitfold.kernels.cpu")
    assert capsys.readouterr().err == compiling.message(*compiling.MODULES["cpu"]) + "\n"


def test_the_outermost_first_use_names_the_compilation(fresh, capsys):
    with compiling.first_use("exact fold kernels for float32 rows", 25):
        with compiling.first_use("plan-building kernels", 1):
            _compile_event("bitfold.kernels.planning")
        _compile_event("bitfold.kernels.buckets")
    _compile_event("bitfold.kernels.planning")
    assert capsys.readouterr().err.splitlines() == [
        compiling.message("exact fold kernels for float32 rows", 25),
        compiling.message(*compiling.MODULES["planning"]),
    ]


@pytest.mark.parametrize("values", [np.ones((6, 3), np.float32), np.ones(6)])
def test_an_exact_route_names_itself(fresh, capsys, monkeypatch, values):
    plan = bitfold.Fold(np.array([0, 2, 2, 1, 0, 2]), K=3)
    route = plan.route(values).route
    capsys.readouterr()  # a cold cache's line for the plan-building kernels
    real = host_routes.get(route)

    def compiles(*args, **kwargs):
        _compile_event("bitfold.kernels.stream")
        return real.run(*args, **kwargs)

    patched = tuple(r if r.name != route else r.__class__(**{**vars(r), "run": compiles})
                    for r in host_routes.TABLE)  # fmt: skip
    monkeypatch.setattr(host_routes, "TABLE", patched)
    plan(values)
    kind = "rows" if values.ndim == 2 else "scalars"
    what = f"exact fold kernels for {values.dtype} {kind}, {route} route"
    assert capsys.readouterr().err == compiling.message(what, real.first_use_s) + "\n"


def _fold_in_a_fresh_process(cache: Path) -> str:
    code = "import numpy as np, bitfold; bitfold.Fold(np.array([0, 1, 1]), K=2)"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600, check=True)  # fmt: skip
    return done.stderr


def test_an_empty_cache_prints_the_line_and_a_warm_one_does_not(tmp_path):
    # the cheapest kernels to compile: building a plan of two buckets
    first = _fold_in_a_fresh_process(tmp_path)
    assert compiling.message(*compiling.MODULES["planning"]) in first.splitlines(), first
    assert any(tmp_path.rglob("*.nbi")), "nothing was cached"
    second = _fold_in_a_fresh_process(tmp_path)
    assert "bitfold: compiling" not in second, second


@pytest.mark.parametrize("route, D", [("buckets", 16), ("stream", 1)])
def test_read_only_and_writable_values_compile_one_kernel(route, D):
    """The caller's writeable flag is no part of a kernel's type: a fold of read-only values
    after one of writable values (and of a read-only index) compiles nothing more."""
    from bitfold.kernels import buckets, stream

    kernels = {
        # the kernels the route calls from Python (one task on this thread, or tasks in parallel);
        # its callees are compiled inside them, and not at all when they load from the cache
        "buckets": [buckets._sum_buckets, buckets._fold_tasks_parallel],
        "stream": [stream._float_range, stream._float_slots, stream._float_chunks],
    }[route]

    def compiled():
        return {(k.py_func.__name__, sig) for k in kernels for sig in k.signatures}

    rng = np.random.default_rng(3)
    index = rng.integers(0, 50, 400).astype(np.int32)
    values = rng.standard_normal((400, D) if D > 1 else 400).astype(np.float32)

    def run(v, i):
        return bitfold.Fold(i, 50)(v, route="buckets" if route == "buckets" else "float-stream")

    writable = run(values, index)
    before = compiled()
    frozen_values, frozen_index = values.copy(), index.copy()
    frozen_values.flags.writeable = frozen_index.flags.writeable = False
    again = run(frozen_values, frozen_index)
    assert compiled() == before
    assert np.asarray(again).tobytes() == np.asarray(writable).tobytes()
    assert before  # the route did run its kernel


#: A kernel module of the test's own (its cache in the test's directory) and a process that
#: imports it, says it is ready, waits for the word, calls the kernel and prints how many
#: compilations it made (Numba's ``numba:compile`` event: a miss of both caches).
KERNEL_MODULE = """
import numpy as np
from numba import njit
from bitfold.kernels.compile_lock import one_compiler_at_a_time

@njit(cache=True)
def kernel(x):
    total = 0.0
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            total += np.sin(x[i, j]) * np.cos(x[j % x.shape[0], i % x.shape[1]])
    return total

one_compiler_at_a_time(globals())
"""
RACER = """
import os, sys, time
import numpy as np
from numba.core import event
import kernel_module

misses = []
class Count(event.Listener):
    def on_start(self, ev):
        misses.append(1)
    def on_end(self, ev):
        pass
event.register("numba:compile", Count())
open(sys.argv[1] + ".ready", "w").close()
while not os.path.exists("go"):
    time.sleep(0.001)
value = kernel_module.kernel(np.ones((3, 4)))
print(len(misses), value)
"""


def test_processes_that_share_a_cache_compile_a_kernel_once(tmp_path):
    """Three processes call a new kernel at the same moment: one compiles, two load its cache."""
    (tmp_path / "kernel_module.py").write_text(KERNEL_MODULE)
    (tmp_path / "racer.py").write_text(RACER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "src")]))
    env.pop("NUMBA_CACHE_DIR", None)  # the cache beside kernel_module.py
    racers = [subprocess.Popen([sys.executable, "racer.py", str(i)], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for i in range(3)]  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while sum((tmp_path / f"{i}.ready").exists() for i in range(3)) < 3:
            assert time.monotonic() < deadline, "the racers did not start"
            time.sleep(0.05)
        (tmp_path / "go").touch()
        outs = [r.communicate(timeout=300) for r in racers]
    finally:
        for r in racers:
            r.kill()
    assert all(r.returncode == 0 for r in racers), [err[-2000:] for _, err in outs]
    misses = [int(out.split()[0]) for out, _ in outs]
    assert sorted(misses) == [0, 0, 1], misses
    assert len({out.split()[1] for out, _ in outs}) == 1
    assert list(tmp_path.glob("__pycache__/kernel_module.kernel-*.lock"))
