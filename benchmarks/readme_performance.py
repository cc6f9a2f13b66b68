"""Copy the generated benchmark summary into the documentation's performance page.

The page's numbers are never typed by hand: this script takes the goal sections, the
seed configuration, the folds of rows, the training steps and the plots of a
``summary.md`` written by ``bitfold bench`` and replaces the block between the
``<!-- bench-summary:begin -->`` and ``<!-- bench-summary:end -->`` markers of
``docs/performance.md``. Headings go one level down, the plots are linked where they are
committed (``../benchmarks/results/<run>/<plot>.png``), and the labels naming the tickets
that set a goal are left out (the goals say what they measure).

    python benchmarks/readme_performance.py benchmarks/results/2026-12-03-cpu-2core
    python benchmarks/readme_performance.py RESULTS_DIR --check   # exit 1 if the page differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench-summary:begin -->", "<!-- bench-summary:end -->"
#: (heading pattern, required): the sections taken, in this order
SECTIONS = (
    # goals: written by the bench of 2026-12-04 and before (benchmarks/bench_goals.py judges
    # them now, from a run's results.json)
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


def block_from_summary(summary: str, source: str) -> str:
    """The page's block: the wanted sections of ``summary``, headings one level down.

    Plots are linked relative to ``docs/`` at the folder of ``source``.
    """
    parts = [p.strip() for p in re.split(r"(?m)^(?=## )", summary)]
    chosen = []
    for pattern, required in SECTIONS:
        found = [p for p in parts if re.match(pattern, p.split("\n", 1)[0])]
        if required and not found:
            raise SystemExit(f"{source}: summary.md has no section matching {pattern!r}")
        chosen += [p for p in found if p not in chosen]
    folder = source.rsplit("/", 1)[0]
    body = "\n\n".join("#" + p for p in chosen)
    body = re.sub(r"!\[([^\]]*)\]\(([\w.-]+\.png)\)", rf"![\1](../{folder}/\2)", body)
    return f"{BEGIN}\n<!-- generated from {source}; do not edit by hand -->\n{body}\n{END}"


def spliced(page: str, block: str) -> str:
    """``page`` with its marked block replaced by ``block``."""
    start, stop = page.find(BEGIN), page.find(END)
    if start < 0 or stop < start:
        raise SystemExit(f"{PAGE.relative_to(ROOT)} has no {BEGIN} ... {END} block")
    return page[:start] + block + page[stop + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results folder written by bitfold bench")
    parser.add_argument("--check", action="store_true", help="only check the page is current")
    args = parser.parse_args(argv)
    folder = Path(args.results)
    source = folder.resolve().relative_to(ROOT).as_posix() + "/summary.md"
    summary = (folder / "summary.md").read_text(encoding="utf-8")
    block = without_tickets(block_from_summary(summary, source))
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
