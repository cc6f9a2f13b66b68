"""Shared test set-up: Triton's interpreter without a GPU, the oracle on the path, hypothesis
profiles, compiler caches in the checkout, and the grouping of tests for pytest-xdist."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gpu_visible() -> bool:
    """Whether a CUDA or ROCm GPU is visible here, judged by device files (no torch import, no
    driver initialised before the tests fork)."""
    hidden = ("", "-1")
    nvidia = bool(glob.glob("/dev/nvidia[0-9]*"))
    rocm = os.path.exists("/dev/kfd")
    return (nvidia and os.environ.get("CUDA_VISIBLE_DEVICES") not in hidden) or (
        rocm and os.environ.get("HIP_VISIBLE_DEVICES") not in hidden
    )


# Before anything imports Triton: without a GPU its kernels run in its CPU interpreter, so the
# triton backend's table (tests/test_backend_table.py) folds CPU tensors with the same kernels.
if not _gpu_visible():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The workers and the processes their tests start share the cores; OpenMP's threads (torch's and
# Numba's) spin after each parallel loop by default, on a core another process is waiting for.
# Waiting passively gave a whole `make test` about a tenth of its time back on 2 cores (no result
# depends on it: the exact sums are the same bits for any thread schedule).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Compiled kernels are cached in the checkout (.cache/, git-ignored), one directory that every
# xdist worker and every subprocess of a test shares, so that a kernel is compiled once and a
# second run finds it: Triton's builds (tests/test_triton_compile.py), inductor's
# (torch.compile) and XLA's (every jitted JAX program, however short its compilation).
# Numba's kernels already are: `cache=True` keeps them next to the sources
# (src/bitfold/**/__pycache__); NUMBA_CACHE_DIR stays unset, as scripts/mutants.py copies those
# caches with the sources (tests/test_mutants.py) and tests that want a cold cache set their own.
CACHE = ROOT / ".cache"
os.environ.setdefault("TRITON_CACHE_DIR", str(CACHE / "triton"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(CACHE / "inductor"))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(CACHE / "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402  (after the environment Triton reads when imported)
from hypothesis import HealthCheck, settings  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))

# Triton's interpreter, where the kernels run on CPU tensors: triton.language patched once a
# launch, not again at every call of a helper (tests/quicker_interpreter.py).
if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None:
    from quicker_interpreter import quicker_interpreter

    quicker_interpreter()

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(autouse=True)
def _jax_in_its_default_mode():
    """Every test starts with JAX (when loaded) in its default 32-bit mode, and leaves it so:
    a test that turns ``jax_enable_x64`` on (the bench's float64 contender does) must not
    change what later tests of the same process see."""
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", False)
    yield
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", False)



#: The test files that take longest on 2 cores (most of a minute or more each, seconds from a
#: cold run of `make test`), sent to the xdist workers first, longest first: a long file taken
#: last would leave the other worker idle at the end (`--no-loadscope-reorder` in the Makefile
#: keeps this order; xdist would otherwise send the files with the most tests first). Every
#: other file follows in its usual order; the tests of each file keep theirs.
SLOWEST_FIRST = (
    "test_train_parallel.py",
    "test_jax_adapter.py",
    "test_bench.py",
    "test_dropins.py",
    "test_backend_table.py",
    "test_cuda_sim.py",
    "test_torch_one_answer.py",
    "test_cuda_compile.py",
    "test_torch_compile.py",
    "test_mutants.py",
    "test_torch_compile_coverage.py",
    "test_docs.py",
    "test_jax_psum_scatter.py",
    "test_jax_psum.py",
    "test_transformers_models.py",
    "test_examples.py",
    "test_dense_device.py",
    "test_distributed.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of :data:`SLOWEST_FIRST` first, in its order (a stable sort: each file's tests
    keep their order)."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
