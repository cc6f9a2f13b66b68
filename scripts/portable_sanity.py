"""The portable path's CPU cost at the seed configuration, next to torch's scatter_add_.

A sanity figure only (the portable path's target is a GPU):
N = 3,145,728 float32 values, K = 433 buckets, a uniform random index.
Prints the median of ``--repeats`` timed calls (after warm-up) of: the host
path, the portable path in eager torch, the portable path under
``torch.compile(fullgraph=True)`` (with ``--compile``), and
``torch.Tensor.scatter_add_`` into zeros; and checks that both exact paths
give the same bits.

    PYTHONPATH=src python scripts/portable_sanity.py [--compile]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

import bitfold
from bitfold import dispatch


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=3_145_728)
    parser.add_argument("--k", type=int, default=433)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    index = rng.integers(0, args.k, args.n)
    values = torch.from_numpy(rng.standard_normal(args.n).astype(np.float32))
    plan = bitfold.Fold(index, args.k)
    idx = torch.from_numpy(index)

    def portable():
        return dispatch.fold(plan, values, backend="portable")

    def scatter():
        return torch.zeros(args.k).scatter_add_(0, idx, values)

    rows = {
        "torch scatter_add_": _median_ms(scatter, args.repeats),
        "bitfold host exact": _median_ms(lambda: plan(values), args.repeats),
        "bitfold portable exact (eager torch)": _median_ms(portable, args.repeats),
    }
    assert torch.equal(portable().view(torch.int32), plan(values).view(torch.int32))
    if args.compile:
        compiled = torch.compile(portable, fullgraph=True)
        assert torch.equal(compiled().view(torch.int32), plan(values).view(torch.int32))
        rows["bitfold portable exact (torch.compile)"] = _median_ms(compiled, args.repeats)
    base = rows["torch scatter_add_"]
    print(f"N = {args.n:,}, K = {args.k}, float32, {torch.get_num_threads()} threads")
    for name, ms in rows.items():
        print(f"  {name:42s} {ms:9.2f} ms  {ms / base:6.1f}x scatter_add_")


if __name__ == "__main__":
    main()
