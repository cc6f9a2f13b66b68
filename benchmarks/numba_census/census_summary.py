"""Sum up a Numba compile census (``sitecustomize.py`` beside this file): JSON on stdout.

    python benchmarks/numba_census/census_summary.py CENSUS.jsonl [--top 20]

Counts only compiles at depth 0 (a callee's compile is inside its caller's),
per process and per function; ``repeated`` are signatures compiled by more
than one process (each after the first: CPU another process had already
spent, for instance two test workers reaching a kernel at once, or a copy of
the sources in another folder).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict


def summarise(rows: list[dict], top: int) -> dict:
    compiled = [r for r in rows if r["compiled"] and r["depth"] == 0]
    loaded = [r for r in rows if not r["compiled"] and r["depth"] == 0]
    seen: set[tuple[str, str]] = set()
    repeated = []
    for r in compiled:
        key = (r["function"], r["signature"])
        if key in seen:
            repeated.append(r)
        seen.add(key)

    def by(field: str, chosen: list[dict]) -> list[dict]:
        groups: dict[str, list[float]] = defaultdict(list)
        for r in chosen:
            groups[r[field]].append(r["cpu_s"])
        ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]
        return [{field: k, "compiles": len(v), "cpu_s": round(sum(v), 1)} for k, v in ranked]

    return {
        "processes": len({r["pid"] for r in rows}),
        "compiled": {"signatures": len(compiled), "distinct": len(seen),
                     "cpu_s": round(sum(r["cpu_s"] for r in compiled), 1)},
        "loaded_from_cache": {"signatures": len(loaded),
                              "cpu_s": round(sum(r["cpu_s"] for r in loaded), 1)},
        "repeated": {"signatures": len(repeated),
                     "cpu_s": round(sum(r["cpu_s"] for r in repeated), 1)},
        "by_function": by("function", compiled),
        "by_process": by("process", compiled),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("census", help="the JSON lines the census wrote")
    parser.add_argument("--top", type=int, default=20, help="functions and processes listed")
    args = parser.parse_args(argv)
    with open(args.census) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(json.dumps(summarise(rows, args.top), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
