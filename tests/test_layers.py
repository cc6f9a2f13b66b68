"""The import layers: tools -> adapters -> engine -> backends -> kernels, never back, no cycles.

The contracts live in ``pyproject.toml`` (``[tool.importlinter]``) and are
checked by import-linter, which reads every import statement, those inside
functions (lazy imports) included. A second check walks the whole module
graph with grimp and refuses any cycle at all, a package and its own
submodules included.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the 'test' extra)")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    return env


def test_import_linter_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    cmd = [str(lint)] if lint.exists() else [sys.executable, "-m", "importlinter.cli"]
    proc = subprocess.run(
        [*cmd, "--no-cache"], cwd=ROOT, env=_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "BROKEN" not in proc.stdout and "KEPT" in proc.stdout


def _strongly_connected(graph) -> list[list[str]]:
    """Tarjan's algorithm over the module graph; components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(m: str) -> None:
        nonlocal counter
        index[m] = low[m] = counter
        counter += 1
        stack.append(m)
        on_stack.add(m)
        for n in graph.find_modules_directly_imported_by(m):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in on_stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            comp = []
            while True:
                n = stack.pop()
                on_stack.discard(n)
                comp.append(n)
                if n == m:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return found


def test_no_import_cycle_anywhere(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    graph = grimp.build_graph("bitfold", exclude_type_checking_imports=True, cache_dir=None)
    assert len(graph.modules) > 10
    assert _strongly_connected(graph) == []


def test_no_module_imports_the_package_root(monkeypatch):
    """``from .. import X`` resolving to ``bitfold/__init__.py`` would loop through the root."""
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    graph = grimp.build_graph("bitfold", exclude_type_checking_imports=True, cache_dir=None)
    assert sorted(graph.find_modules_that_directly_import("bitfold")) == []


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    """The check above can fail: a package whose two modules import each other lazily."""
    pkg = tmp_path / "cyclic_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclic_pkg", cache_dir=None)
    assert _strongly_connected(graph) == [["cyclic_pkg.a", "cyclic_pkg.b"]]


def test_no_type_checking_import_points_up_to_the_plan(monkeypatch):
    """Below ``bitfold.plan`` the plan is read through ``bitfold.plan_view.PlanView``.

    The contracts above skip type-checking imports; this walk counts them, so an
    annotation cannot name ``Fold`` from a module the plan itself imports.
    """
    monkeypatch.syspath_prepend(str(ROOT / "src"))
    graph = grimp.build_graph("bitfold", exclude_type_checking_imports=False, cache_dir=None)
    below = {"bitfold.dispatch", "bitfold.exact", "bitfold.strategies", "bitfold.validate",
             "bitfold.arrays", "bitfold.formats", "bitfold.errors", "bitfold.plan_view"}
    below |= {m for m in graph.modules if m.startswith(("bitfold.backends.", "bitfold.kernels."))}
    importers = graph.find_modules_that_directly_import("bitfold.plan")
    assert sorted(importers & below) == []
    assert graph.find_modules_directly_imported_by("bitfold.plan_view") & graph.modules == set()
