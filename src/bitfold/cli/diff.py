"""``bitfold diff A B [--json]``: the first step and tensor where two run manifests differ.

Reads both manifests (:func:`bitfold.repro.manifest.read_manifest`), compares
them (:func:`bitfold.repro.manifest.compare`) and prints the first tensor
whose digests differ, in recorded order, so the earliest cause shows first;
the run metadata and environment differences are listed too. Exit status: 0
when every recorded step and digest match (environment differences alone do
not count), 1 when they differ, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..repro.manifest import compare, read_manifest

HELP = "compare two run manifests: the first step and tensor whose digests differ"


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``bitfold diff``."""
    parser.add_argument("a", metavar="A.jsonl", help="first manifest")
    parser.add_argument("b", metavar="B.jsonl", help="second manifest")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    parser.epilog = "exit status: 0 identical, 1 different, 2 bad input"


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _short(value: Any) -> str:
    return json.dumps(value)


def _print_report(r: dict[str, Any]) -> None:
    out = sys.stdout
    print(f"A: {r['a']}  ({r['steps_a']} step records)", file=out)
    print(f"B: {r['b']}  ({r['steps_b']} step records)", file=out)
    for side in ("a", "b"):
        if not r[f"complete_{side}"]:
            print(
                f"note: {side.upper()} has no closing record: the run stopped early "
                "or the file was cut at a line end",
                file=out,
            )
        if r[f"error_{side}"]:
            print(f"note: {side.upper()}'s run ended with {r[f'error_{side}']}", file=out)
    if r["identical"]:
        print(f"the runs are identical: {r['matched_steps']} steps, "
              f"{r['matched_tensors']} tensor digests match", file=out)
    elif r["status"] == "digests differ":
        d = r["first_difference"]
        print(f"first difference: step {d['step']}, tensor {d['tensor']!r} "
              f"({d['position']} of {d['tensors_in_step']} in that step; "
              f"lines {d['line_a']} / {d['line_b']})", file=out)
        print(f"  A: {d['a']}", file=out)
        print(f"  B: {d['b']}", file=out)
        print(f"matched before it: {_n(r['matched_steps'], 'whole step')}, "
              f"{_n(r['matched_tensors'], 'tensor digest')}", file=out)
        keys = [k for k in d["meta_a"] if d["meta_b"].get(k) != d["meta_a"][k]]
        if keys:
            shown = "; ".join(
                f"{k}: A={_short(d['meta_a'][k])} B={_short(d['meta_b'].get(k))}" for k in keys
            )
            print(f"  step metadata: {shown}", file=out)
    else:
        print(r["message"], file=out)
        print(f"matched before it: {_n(r['matched_steps'], 'whole step')}, "
              f"{_n(r['matched_tensors'], 'tensor digest')}", file=out)
    for title, diffs in (("run metadata", r["meta_differences"]),
                         ("environment", r["env_differences"])):
        if diffs:
            print(f"{title} differences ({len(diffs)}):", file=out)
            for d in diffs:
                print(f"  {d['key']}: A={_short(d['a'])} B={_short(d['b'])}", file=out)
        else:
            print(f"{title} differences: none", file=out)


def main(args: argparse.Namespace) -> int:
    """``bitfold diff A B [--json]``: 0 identical, 1 different (a bad file raises FoldError)."""
    report = compare(read_manifest(args.a), read_manifest(args.b))
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_report(report)
    return 0 if report["identical"] else 1
