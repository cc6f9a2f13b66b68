"""The README's performance numbers are the generated benchmark summary, not typed by hand."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "readme_performance", ROOT / "benchmarks" / "readme_performance.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_block_matches_the_committed_summary():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- generated from (\S+)/summary\.md", readme)
    assert found, "the README has no generated performance block"
    assert _script().main([str(ROOT / found.group(1)), "--check"]) == 0
