"""Packaging promises: light import, entry points, docstring examples, installed backends.

The README's and the documentation's code blocks run in tests/test_docs.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bitfold

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "jax", "cupy", "matplotlib", "numba.cuda", "numba_cuda", "tqdm")


def test_import_bitfold_loads_no_framework():
    code = f"import sys, bitfold; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_import_bitfold_torch_loads_no_compiler():
    """Dynamo and Inductor (about a second of start-up) load with ``bitfold.torch.compile`` or the
    first ``exact_mode()``, not with the import: a process that only folds or sums never pays."""
    pytest.importorskip("torch", reason="torch is not installed")
    compiler = ("torch._dynamo", "torch._inductor", "triton")
    code = (f"import sys, bitfold.torch as bt, bitfold.distributed; "
            f"print([m for m in {compiler!r} if m in sys.modules]); "
            f"bt.compile; print('torch._dynamo' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]  # the name still resolves, loading the compiler


def test_plan_key_carries_torchs_constant_mark():
    """``plan_key`` is marked as ``torch.compiler.assume_constant_result`` marks a function (set
    by hand, to keep Dynamo out of the import): the same attributes as torch sets today."""
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from bitfold.torch import ops

    marked = torch.compiler.assume_constant_result(lambda plan: 0)
    assert vars(marked) and vars(marked).items() <= vars(ops.plan_key).items()


def test_public_names():
    for name in ("Fold", "strategies", "digest", "bits_equal", "FoldError", "ExactAccumulator"):
        assert name in bitfold.__all__ and hasattr(bitfold, name)
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", bitfold.__version__)


def test_python_m_bitfold_and_console_script():
    out = subprocess.run(
        [sys.executable, "-m", "bitfold", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"bitfold {bitfold.__version__}"
    out = subprocess.run(
        [sys.executable, "-m", "bitfold", "--help"], capture_output=True, text=True, check=True
    )
    assert "probe" in out.stdout


def test_docstring_examples():
    import doctest

    import bitfold.exact
    import bitfold.plan

    for module in (bitfold.plan, bitfold.exact):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0


def test_requested_backends_are_installed():
    """`make test` asks for the backends the test extras install; a broken install fails here."""
    wanted = [b for b in os.environ.get("BITFOLD_REQUIRE_BACKENDS", "").split(",") if b]
    if not wanted:
        pytest.skip("BITFOLD_REQUIRE_BACKENDS is not set (make test sets it)")
    for backend in wanted:
        assert importlib.util.find_spec(backend) is not None, f"{backend} requested but missing"
        __import__(backend)


def test_folding_keeps_the_torch_thread_count():
    """Numba's OpenMP pool must not reset what torch.set_num_threads chose."""
    pytest.importorskip("torch", reason="torch is not installed")
    code = (
        "import torch, numpy as np, bitfold\n"
        "torch.set_num_threads(1)\n"
        "p = bitfold.Fold(np.arange(1000) % 7, 7)\n"
        "p(np.ones(1000, np.float32)); p.expand(np.ones(7, np.float32))\n"
        "print(torch.get_num_threads())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


#: Optional modules the suite may skip without: they exist only on a machine with a GPU.
DEVICE_ONLY = {"cupy": "CuPy needs a CUDA device; tests/cuda_cases.py's device cases use it"}


def test_every_optional_module_of_the_suite_is_required_by_make_test():
    """A module a test skips without is in the Makefile's REQUIRED_BACKENDS (or device-only),
    so that ``make test`` fails when the test extras did not install it, never skips quietly."""
    tests = Path(__file__).resolve().parent
    makefile = (tests.parent / "Makefile").read_text()
    required = set(re.search(r"^REQUIRED_BACKENDS := (.*)$", makefile, re.M).group(1).split(","))
    skipped_without = set()
    for path in tests.glob("*.py"):
        for name in re.findall(r'importorskip\(\s*"([A-Za-z_][\w.]*)"', path.read_text()):
            top = name.split(".")[0]
            if top != "bitfold":
                skipped_without.add(top)
    assert "torch" in skipped_without and "grimp" in skipped_without  # the scan finds them
    missing = skipped_without - required - set(DEVICE_ONLY)
    assert not missing, f"tests skip without {sorted(missing)}: add them to REQUIRED_BACKENDS"


def test_the_slowest_files_sent_first_exist_and_make_test_keeps_their_order():
    """Each file conftest.py sends to the workers first is a test file here (a renamed file
    would silently fall back to its usual place), and `make test` keeps that order."""
    from conftest import SLOWEST_FIRST

    tests = Path(__file__).resolve().parent
    missing = [name for name in SLOWEST_FIRST if not (tests / name).is_file()]
    assert not missing, f"SLOWEST_FIRST names files that are not in tests/: {missing}"
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST)
    makefile = (tests.parent / "Makefile").read_text()
    assert re.search(r"^XDIST \?=.*--dist loadfile --no-loadscope-reorder", makefile, re.M)
