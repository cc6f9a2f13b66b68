"""The performance page's numbers are the generated benchmark summary, not typed by hand."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "readme_performance", ROOT / "benchmarks" / "readme_performance.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_performance_block_matches_the_committed_summary():
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- generated from (\S+)/summary\.md(?: \(goals: [^)]*?"
                      r"(?: --allreduce (\S+))?\))?; do not edit", page)  # fmt: skip
    assert found, "docs/performance.md has no generated performance block"
    args = [str(ROOT / found.group(1)), "--check"]
    if found.group(2):
        args += ["--allreduce", str(ROOT / found.group(2))]
    assert _script().main(args) == 0
    # the README keeps no copy of it
    assert "bench-summary:begin" not in (ROOT / "README.md").read_text(encoding="utf-8")


SUMMARY = """# bitfold bench

- machine: a test

## Goals

Issue 10's goals (1 to 5) are ratios.

- goal 1, x: met
- issue 11, a training step: 0.84x (goal <= 1.5x: met)

## Issue 20 goals

- goal 7, the earlier goals stay met — issue 10 goal 2, rows: met

## The seed configuration (N = 8)

| a |

## Folds of rows: median time (ms)

| b |

## Memory

left out

## Training steps under exact_mode (issue 11)

| c |

## Plots

![seed_bars.png](seed_bars.png)
"""


def test_block_takes_the_sections_links_the_plots_and_drops_ticket_labels():
    script = _script()
    block = script.block_from_summary(SUMMARY, "benchmarks/results/run/summary.md")
    headings = re.findall(r"^### (.*)$", block, re.M)
    assert headings == ["Goals", "Issue 20 goals", "The seed configuration (N = 8)",
                        "Folds of rows: median time (ms)", "Training steps under exact_mode "
                        "(issue 11)", "Plots"]  # fmt: skip
    assert "left out" not in block
    assert "![seed_bars.png](../benchmarks/results/run/seed_bars.png)" in block
    clean = script.without_tickets(block)
    assert not re.search(r"(?i)\bissue", clean)
    assert "### Sweep goals" in clean and "- a training step: 0.84x" in clean
    assert "the earlier goals stay met — rows: met" in clean
    with pytest.raises(SystemExit, match="names a ticket"):
        script.without_tickets("- see issue #3 and issue 4")


def test_a_summary_without_a_required_section_is_refused():
    with pytest.raises(SystemExit, match="Folds of rows"):
        _script().block_from_summary(SUMMARY.replace("## Folds of rows", "## Rows"), "x/summary.md")


def test_goals_judged_apart_take_the_place_of_the_summary_s_own():
    script = _script()
    today = SUMMARY.replace("## Goals", "## At a glance").replace("## Issue 20 goals\n", "")
    goals = "## Goals\n\n- seed: 0.46x → met\n"
    block = script.block_from_summary(today, "r/summary.md", goals, "goals: x")
    headings = re.findall(r"^### (.*)$", block, re.M)
    assert headings[:2] == ["At a glance", "Goals"] and "- seed: 0.46x → met" in block
    assert "<!-- generated from r/summary.md (goals: x); do not edit by hand -->" in block
    # a summary with goal sections of its own keeps them
    old = script.block_from_summary(SUMMARY, "r/summary.md", goals)
    assert "- seed: 0.46x" not in old and "### Issue 20 goals" in old

