"""The wheel: every module of the package, its entry point and extras, nothing else of the repo.

The file list is read from a wheel built into a temporary folder (no
install). Installing it into a fresh virtual environment and folding from
outside the repo takes a minute or more (numpy and numba are installed): it
runs only with ``BITFOLD_TEST_WHEEL_INSTALL=1``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import bitfold

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bitfold"


def _sources() -> set[str]:
    """The package's Python files as the wheel names them (``bitfold/...``)."""
    return {
        p.relative_to(PACKAGE.parent).as_posix()
        for p in PACKAGE.rglob("*.py")
        if "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "-w", str(out), "--no-deps", "-q"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (built,) = out.glob("bitfold-*.whl")
    return built


@pytest.fixture(scope="module")
def names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_the_wheel_is_named_after_the_version(wheel):
    assert wheel.name == f"bitfold-{bitfold.__version__}-py3-none-any.whl"


def test_every_module_and_subpackage_is_in_the_wheel(names):
    in_wheel = {n for n in names if n.endswith(".py")}
    assert in_wheel == _sources()
    packages = {p.parent.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*.py")
                if "__pycache__" not in p.parts}  # fmt: skip
    assert {f"{p}/__init__.py" for p in packages} <= in_wheel
    assert {"bitfold/kernels/__init__.py", "bitfold/cli/bench/__init__.py",
            "bitfold/torch/__init__.py", "bitfold/repro/__init__.py"} <= in_wheel  # fmt: skip
    assert "bitfold/py.typed" in names
    # data files the package reads: the GPU kernels' known answers (bitfold.backends.selftest)
    assert "bitfold/backends/selftest_cases.json" in names


def test_nothing_but_the_package_and_its_metadata(names):
    dist_info = f"bitfold-{bitfold.__version__}.dist-info/"
    strays = [n for n in names if not (n.startswith(("bitfold/", dist_info)))]
    assert strays == []
    built = [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".nbi", ".nbc"))]
    assert built == []  # no compiled bytecode or numba cache from this checkout


def test_the_entry_point_and_the_metadata(wheel):
    dist_info = f"bitfold-{bitfold.__version__}.dist-info"
    with zipfile.ZipFile(wheel) as z:
        entry_points = z.read(f"{dist_info}/entry_points.txt").decode()
        metadata = z.read(f"{dist_info}/METADATA").decode()
    assert "[console_scripts]\nbitfold = bitfold.cli:main" in entry_points
    lines = metadata.splitlines()
    assert f"Version: {bitfold.__version__}" in lines
    requires = [line for line in lines if line.startswith("Requires-Dist:")]
    assert any(r.startswith("Requires-Dist: numpy") for r in requires)
    assert any(r.startswith("Requires-Dist: numba") for r in requires)
    if sys.version_info < (3, 11):
        return  # tomllib (the standard library's TOML reader) came in 3.11: the rest needs it
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]  # fmt: skip
    assert {line.split(": ", 1)[1] for line in lines if line.startswith("Provides-Extra:")} == set(
        extras)  # fmt: skip


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("BITFOLD_TEST_WHEEL_INSTALL") != "1",
    reason="installs the wheel and its dependencies into a new venv: BITFOLD_TEST_WHEEL_INSTALL=1",
)
def test_the_wheel_installs_and_folds_outside_the_repo(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python, script = venv / "bin" / "python", venv / "bin" / "bitfold"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR")}
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                             cwd=tmp_path, env=env, timeout=300, check=True)  # fmt: skip
    assert version.stdout.strip() == f"bitfold {bitfold.__version__}"
    code = (
        "import numpy as np, bitfold\n"
        "plan = bitfold.Fold(np.array([0, 2, 2, 1, 0, 2]), K=3)\n"
        "t = 2.0**-24\n"
        "out = plan(np.array([1.0, t, t, 3.0, t, 1.0], np.float32))\n"
        "print(bitfold.__file__)\n"
        "print(out.view(np.uint32).tolist())\n"
    )
    for run in ("cold", "warm"):
        fold = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                              cwd=tmp_path, env=env, timeout=900, check=True)  # fmt: skip
        where, bits = fold.stdout.splitlines()
        assert Path(where).is_relative_to(venv), where  # the installed copy, not the checkout
        assert bits == "[1065353216, 1077936128, 1065353217]"  # 1, 3 and 1 + 2^-23: exact
        said = [line for line in fold.stderr.splitlines() if line.startswith("bitfold: compiling")]
        assert bool(said) == (run == "cold"), fold.stderr  # the cache, in the venv, is warm
