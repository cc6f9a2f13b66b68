"""Copy a benchmark run's generated summary into the documentation's performance page.

The page's numbers are never typed by hand: this script takes the sections of a
``summary.md`` written by ``bitfold bench`` (the run at a glance, the seed configuration,
the folds of rows, the training steps and the plots) and the run's goals, judged from its
``results.json`` by ``benchmarks/bench_goals.py`` (or, in a summary written by an older
bench, the goal sections it carries), and replaces the block between the
``<!-- bench-summary:begin -->`` and ``<!-- bench-summary:end -->`` markers of
``docs/performance.md``. Headings go one level down, the plots are linked where they are
committed (``../benchmarks/results/<run>/<plot>.png``), and the labels naming the tickets
that set a goal are left out (the goals say what they measure).

    python benchmarks/readme_performance.py RESULTS_DIR [--allreduce ALLREDUCE.json]
    python benchmarks/readme_performance.py RESULTS_DIR --check   # exit 1 if the page differs
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench-summary:begin -->", "<!-- bench-summary:end -->"
#: (heading pattern, required): the sections taken, in this order
GOALS = ROOT / "benchmarks" / "bench_goals.py"
SECTIONS = (
    (r"## At a glance$", False),
    # goal sections: in summaries of the bench of 2026-12-04 and before; today
    # benchmarks/bench_goals.py judges the goals from results.json
    (r"## Goals$", False),
    (r"## (?!Goals$).*\bgoals$", False),
    (r"## The seed configuration\b", True),
    (r"## Folds of rows\b", True),
    (r"## Training steps\b", False),
    (r"## Compiled training steps\b", False),
    (r"## Plots$", False),
)
#: ticket labels of older summaries -> what is left without them
TICKETS = (
    (re.compile(r" \([Ii]ssue \d+(?:, goal \d+)?\)"), ""),
    (re.compile(r"\b[Ii]ssue \d+(?:,? goal \d+)?, "), ""),
    (re.compile(r"^(#+ )[Ii]ssue \d+ goals$", re.M), r"\1Sweep goals"),
    (re.compile(r"\b[Ii]ssue \d+'s goals"), "The fold goals"),
)
LEFT_TICKET = re.compile(r"\b[Ii]ssues? \d+")


def without_tickets(text: str) -> str:
    """``text`` without the ticket labels; one left in an unknown form is an error."""
    for pattern, replacement in TICKETS:
        text = pattern.sub(replacement, text)
    left = LEFT_TICKET.search(text)
    if left:
        line = text[text.rfind("\n", 0, left.start()) + 1 : text.find("\n", left.end())]
        raise SystemExit(f"summary.md names a ticket in a form this script does not drop: {line}")
    return text


def block_from_summary(summary: str, source: str, goals: str = "", note: str = "") -> str:
    """The page's block: the wanted sections of ``summary``, headings one level down.

    ``goals`` (a ``## Goals`` section) goes after the run at a glance when the summary
    has no goal section of its own; ``note`` is added to the marker line. Plots are
    linked relative to ``docs/`` at the folder of ``source``.
    """
    parts = [p.strip() for p in re.split(r"(?m)^(?=## )", summary)]
    if goals and not any(re.match(r"## .*\b[Gg]oals$", p.split("\n", 1)[0]) for p in parts):
        parts.append(goals.strip())
    chosen = []
    for pattern, required in SECTIONS:
        found = [p for p in parts if re.match(pattern, p.split("\n", 1)[0])]
        if required and not found:
            raise SystemExit(f"{source}: summary.md has no section matching {pattern!r}")
        chosen += [p for p in found if p not in chosen]
    folder = source.rsplit("/", 1)[0]
    body = "\n\n".join("#" + p for p in chosen)
    body = re.sub(r"!\[([^\]]*)\]\(([\w.-]+\.png)\)", rf"![\1](../{folder}/\2)", body)
    note = f" ({note})" if note else ""
    return f"{BEGIN}\n<!-- generated from {source}{note}; do not edit by hand -->\n{body}\n{END}"


def judged_goals(results: str, allreduce: str | None) -> str:
    """``benchmarks/bench_goals.py``'s Markdown goal list for ``results`` (repo-relative)."""
    command = [sys.executable, str(GOALS), results, "--markdown"]
    if allreduce:
        command += ["--allreduce", allreduce]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if out.returncode not in (0, 1):  # 1: a goal is missed, which the list says
        raise SystemExit(f"bench_goals.py failed on {results}: {out.stderr.strip()}")
    return out.stdout


def spliced(page: str, block: str) -> str:
    """``page`` with its marked block replaced by ``block``."""
    start, stop = page.find(BEGIN), page.find(END)
    if start < 0 or stop < start:
        raise SystemExit(f"{PAGE.relative_to(ROOT)} has no {BEGIN} ... {END} block")
    return page[:start] + block + page[stop + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results folder written by bitfold bench")
    parser.add_argument("--allreduce", metavar="JSON", default=None,
                        help="benchmarks/allreduce.py's results, judged with the run's goals")
    parser.add_argument("--check", action="store_true", help="only check the page is current")
    args = parser.parse_args(argv)
    folder = Path(args.results).resolve()
    run = folder.relative_to(ROOT).as_posix()
    source = run + "/summary.md"
    summary = (folder / "summary.md").read_text(encoding="utf-8")
    goals, note = "", ""
    if (folder / "results.json").is_file() and GOALS.is_file():
        allreduce = args.allreduce and Path(args.allreduce).resolve().relative_to(ROOT).as_posix()
        goals = judged_goals(run + "/results.json", allreduce)
        note = "goals: benchmarks/bench_goals.py"
        note += f" --allreduce {allreduce}" if allreduce else ""
    block = without_tickets(block_from_summary(summary, source, goals, note))
    page = PAGE.read_text(encoding="utf-8")
    new = spliced(page, block)
    if args.check:
        if new != page:
            print(f"{PAGE.relative_to(ROOT)}'s performance block differs from {source}",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
