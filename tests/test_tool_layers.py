"""Where the tools sit: ``import bitfold`` loads none, imports point down, no cycles.

The tools are ``bitfold.cli`` (one module per command, ``bench/`` a package)
and ``bitfold.repro`` (digests, checkpoints, manifests, the fingerprint). The
import graph is read from the source (every ``import``, lazy ones inside
functions included), so a rule broken only on some code path still fails.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import bitfold

SRC = Path(bitfold.__file__).resolve().parent
TOOLS = ("bitfold.cli", "bitfold.repro")


def _module_name(path: Path) -> str:
    parts = ["bitfold", *path.relative_to(SRC).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _is_tool(name: str) -> bool:
    return any(name == t or name.startswith(t + ".") for t in TOOLS)


def _imports(name: str) -> set[str]:
    """The bitfold modules (and ``bitfold`` itself) that module ``name`` imports anywhere."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "bitfold")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "bitfold":
                continue
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            found.update(subs or [target])
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def test_import_bitfold_loads_no_tool_and_no_argparse():
    code = (
        "import sys, bitfold; "
        "print(' '.join(sorted(m for m in sys.modules if m == 'argparse' "
        "or m.startswith(('bitfold.cli', 'bitfold.repro')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_tool_names_of_the_root_load_on_first_use():
    code = (
        "import sys, bitfold; from bitfold import digest; "
        "import bitfold.repro.digest as d, bitfold.repro.manifest as m; "
        "assert digest is d.digest and bitfold.bits_equal is d.bits_equal; "
        "assert bitfold.record is m.record and 'record' in dir(bitfold); "
        "assert 'argparse' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        bitfold.nonesuch  # noqa: B018


def test_engine_modules_import_no_tool():
    for name, targets in GRAPH.items():
        if _is_tool(name) or name in ("bitfold", "bitfold.__main__"):
            continue
        assert not [t for t in targets if _is_tool(t)], f"{name} imports a tool"


def test_tools_never_import_from_the_package_root():
    """``from .. import X`` resolving to bitfold/__init__.py would cycle through the root."""
    for name, targets in GRAPH.items():
        if _is_tool(name):
            assert "bitfold" not in targets, f"{name} imports from the root package"


def test_repro_never_imports_the_command_line():
    for name, targets in GRAPH.items():
        if name.startswith("bitfold.repro"):
            assert not [t for t in targets if t.startswith("bitfold.cli")], name


def test_no_import_cycle_among_the_tools():
    tools = {n: {t for t in ts if _is_tool(t) and t != n} for n, ts in GRAPH.items() if _is_tool(n)}
    # a package's __init__ is imported with each of its modules: not an edge worth a cycle
    edges = {n: {t for t in ts if not n.startswith(t + ".")} for n, ts in tools.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])


def test_the_probe_backends_do_not_import_the_probe():
    assert "bitfold.cli.probe" not in GRAPH["bitfold.cli.probe_devices"]
    assert "bitfold.cli.probe_devices" in GRAPH["bitfold.cli.probe"]
