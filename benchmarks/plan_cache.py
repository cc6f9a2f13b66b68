"""The torch adapter's plan cache: one exact fold by an index met again, with and without it.

For each shape, ``bitfold.torch.folds.fold_rows(index, values, K)`` (the fold
every exact op of the adapter makes) is timed with the cache on (plans kept
after the second meeting of an index, reused after the check) and off (a
plan built every call), the two taking turns in rounds so that drift in the
machine's speed hits both; medians over the rounds. The check alone
(``Fold.same_index``) is timed too. Ratios are ``on / off`` in the same run.

    PYTHONPATH=src .venv/bin/python benchmarks/plan_cache.py [--rounds 5] [--out FILE]

Prints a table and writes JSON (default
``benchmarks/results/2026-12-04-plancache-cpu-2core/fold_rows.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import bitfold
from bitfold.torch import plan_cache
from bitfold.torch.folds import fold_rows

#: (positions, row width, buckets): the bench's rows shapes and the seed's scalar shapes
SHAPES = [(400_000, 64, 20_000), (262_144, 64, 50_000), (3_145_728, 1, 433),
          (3_145_728, 1, 1_000_000)]  # fmt: skip
DEFAULT_OUT = Path("benchmarks/results/2026-12-04-plancache-cpu-2core/fold_rows.json")


def median_ms(fn: Callable[[], Any], calls: int = 11) -> float:
    """Median milliseconds of ``calls`` calls of ``fn`` after two warm-up calls (the second
    meeting of an index keeps its plan)."""
    fn()
    fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def measure(n: int, d: int, k: int, rounds: int) -> dict[str, Any]:
    """Cache on and off taking turns for one shape; the check alone."""
    gen = torch.Generator().manual_seed(n + k)
    idx = torch.randint(0, k, (n,), generator=gen)
    vals = torch.randn((n, d) if d > 1 else (n,), generator=gen)
    cache = plan_cache.PLANS
    res: dict[str, list[float]] = {"on": [], "off": []}
    try:
        for _ in range(rounds):
            for mode in ("on", "off"):
                cache.max_plans = plan_cache.MAX_PLANS if mode == "on" else 0
                cache.clear()
                res[mode].append(median_ms(lambda: fold_rows(idx, vals, k)))
    finally:
        cache.max_plans = plan_cache.MAX_PLANS
        cache.clear()
    plan = bitfold.Fold(idx, k)
    on, off = statistics.median(res["on"]), statistics.median(res["off"])
    return {"N": n, "D": d, "K": k, "on_ms": on, "off_ms": off, "on_over_off": on / off,
            "rounds": res, "check_ms": median_ms(lambda: plan.same_index(idx.numpy()))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="turns of on and off a shape")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    args = parser.parse_args(argv)
    rows = [measure(n, d, k, args.rounds) for n, d, k in SHAPES]
    print(f"{'N':>9} {'D':>3} {'K':>9} {'off ms':>8} {'on ms':>8} {'on/off':>7} {'check ms':>9}")
    for r in rows:
        print(f"{r['N']:>9,} {r['D']:>3} {r['K']:>9,} {r['off_ms']:>8.2f} {r['on_ms']:>8.2f} "
              f"{r['on_over_off']:>6.2f}x {r['check_ms']:>9.2f}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    args.out.write_text(json.dumps({"meta": meta, "shapes": rows}, indent=2), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
