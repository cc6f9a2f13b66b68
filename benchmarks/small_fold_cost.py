"""What one small exact fold costs: microseconds (medians), plain and in ``exact_mode()``.

The folds of the tiny transformers' steps (``mode_toll.py``): an ``index_add``
of 256 rows of 32 floats into 64, an embedding gradient of an 8 x 32 batch
into a 1000 x 64 table, an ``index_put`` (accumulate) of 130 rows of 64 floats
into 256, and an ``index_add_`` of 128 rows of 64 floats into a 50,000 x 64
tensor (in place, few rows of a large target); and the drop-in
:func:`bitfold.torch.index_add` of the first. A fold's
own cost is its time in the mode less its plain time.

    PYTHONPATH=src .venv/bin/python benchmarks/small_fold_cost.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import bitfold.torch as bt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_cache import median_ms  # the benchmarks' folder, put on the path above


def median_us(f: Callable[[], object], n: int = 3000) -> float:
    """Median microseconds of ``n`` calls of ``f``, after 100 untimed ones."""
    for _ in range(100):
        f()
    return round(1e3 * median_ms(f, n), 1)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x, idx, src = torch.zeros(64, 32), torch.randint(0, 64, (256,)), torch.randn(256, 32)
    grad, ids = torch.randn(8, 32, 64), torch.randint(0, 1000, (8, 32))
    w, rows, vals = torch.zeros(256, 64), torch.randint(0, 256, (130,)), torch.randn(130, 64)
    big, few = torch.zeros(50_000, 64), torch.randint(0, 50_000, (128,))
    few_vals = torch.randn(128, 64)
    aten = torch.ops.aten
    cases: dict[str, Callable[[], object]] = {
        "index_add (64, 32) <- 256 rows": lambda: x.index_add(0, idx, src),
        "embedding_dense_backward 8 x 32 ids, 1000 x 64": lambda: aten.embedding_dense_backward(
            grad, ids, 1000, -1, False
        ),
        "_index_put_impl_ accumulate (256, 64) <- 130 rows": lambda: aten._index_put_impl_(
            w, [rows], vals, True, True
        ),
        "index_add_ (50,000, 64) <- 128 rows": lambda: big.index_add_(0, few, few_vals),
    }
    load_before = os.getloadavg()
    result: dict[str, object] = {}
    for name, f in cases.items():
        plain = median_us(f)
        with bt.exact_mode():
            mode = median_us(f)
        result[name] = {"plain_us": plain, "exact_mode_us": mode, "own_us": round(mode - plain, 1)}
    result["bt.index_add (64, 32) <- 256 rows"] = {
        "drop_in_us": median_us(lambda: bt.index_add(x, 0, idx, src))
    }
    result["load_average_1_5_15"] = {"before": load_before, "after": os.getloadavg()}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
