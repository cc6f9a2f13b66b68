"""Copy the generated benchmark summary into the README's performance section.

The README's numbers are never typed by hand: this script takes the
"Goals", "Issue 20 goals" (when the summary has it: runs before issue 20 do
not), "seed configuration" and "Folds of rows" sections of a ``summary.md``
written by ``bitfold bench`` and replaces the block between the README's
``<!-- bench-summary:begin -->`` and ``<!-- bench-summary:end -->`` markers.

    python benchmarks/readme_performance.py benchmarks/results/2026-12-03-cpu-2core
    python benchmarks/readme_performance.py RESULTS_DIR --check   # exit 1 if the README differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench-summary:begin -->", "<!-- bench-summary:end -->"
SECTIONS = ("## Goals", "## Issue 20 goals", "## The seed configuration", "## Folds of rows")
#: Sections taken when the summary has them (older runs were written without them).
OPTIONAL = ("## Issue 20 goals",)


def block_from_summary(summary: str, source: str) -> str:
    """The README block: the wanted sections of ``summary``, headings one level down."""
    parts = re.split(r"(?m)^(?=## )", summary)
    chosen = [p.strip() for s in SECTIONS for p in parts if p.startswith(s)]
    required = [s for s in SECTIONS if s not in OPTIONAL]
    if any(not any(p.startswith(s) for p in parts) for s in required):
        raise SystemExit(f"{source}: summary.md lacks one of the sections {tuple(required)}")
    body = "\n\n".join("#" + p for p in chosen)
    return f"{BEGIN}\n<!-- generated from {source}; do not edit by hand -->\n{body}\n{END}"


def spliced(readme: str, block: str) -> str:
    """``readme`` with its marked block replaced by ``block``."""
    start, stop = readme.find(BEGIN), readme.find(END)
    if start < 0 or stop < start:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} block")
    return readme[:start] + block + readme[stop + len(END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="a results folder written by bitfold bench")
    parser.add_argument("--check", action="store_true", help="only check the README is current")
    args = parser.parse_args(argv)
    folder = Path(args.results)
    source = folder.resolve().relative_to(ROOT).as_posix() + "/summary.md"
    block = block_from_summary((folder / "summary.md").read_text(encoding="utf-8"), source)
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text(encoding="utf-8")
    new = spliced(readme, block)
    if args.check:
        if new != readme:
            print("README.md's performance block differs from " + source, file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
