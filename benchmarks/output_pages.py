"""Call-by-call times of a large fold of rows: the slow calls come from the output's pages.

    python benchmarks/output_pages.py --out benchmarks/results/2026-12-03-pages-cpu-2core.json

A plan built once folds rows of ``(N, D) = (262,144, 64)`` into ``K = 10^6``
sums: a fresh 256 MB output every call. Each configuration runs in a fresh
process, and every call is timed (no warm-up dropped), because the point is
the first calls:

* ``bitfold``: NumPy's default, which advises transparent huge pages for
  large arrays; a call whose output needs the kernel to assemble huge pages
  (compaction) is slow, later calls reuse them;
* ``bitfold-4k-pages``: ``NUMPY_MADVISE_HUGEPAGE=0``, every call faults in
  4 KB pages;
* ``torch-index-add``: ``torch.zeros(K, D).index_add_(0, index, values)``.

The kernel's own time is the same in all bitfold runs; what moves is the cost
of the output's memory.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys

N, D, K = 262_144, 64, 1_000_000

_CHILD = """
import json, sys, time
import numpy as np
rng = np.random.default_rng(0)
idx = rng.integers(0, {K}, {N})
vals = rng.standard_normal(({N}, {D})).astype(np.float32)
times = []
if sys.argv[1] == "torch":
    import torch
    torch.set_num_threads(2)
    ti, tv = torch.from_numpy(idx), torch.from_numpy(vals)
    run = lambda: torch.zeros({K}, {D}).index_add_(0, ti, tv)
else:
    import bitfold
    plan = bitfold.Fold(idx, {K})
    bitfold.Fold(idx[:4096] % 1000, 1000)(vals[:4096])  # loads the compiled kernels
    run = lambda: plan(vals)
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    out = run()
    times.append(1e3 * (time.perf_counter() - t0))
    del out
print(json.dumps(times))
"""


def calls(kind: str, repeats: int, env: dict[str, str]) -> list[float]:
    """Milliseconds of each call in a fresh process."""
    code = _CHILD.format(N=N, D=D, K=K)
    done = subprocess.run([sys.executable, "-c", code, kind, str(repeats)], env=env,
                          capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    runs = {
        "bitfold": calls("bitfold", args.repeats, base),
        "bitfold-4k-pages": calls("bitfold", args.repeats, {**base, "NUMPY_MADVISE_HUGEPAGE": "0"}),
        "torch-index-add": calls("torch", args.repeats, base),
    }
    summary = {name: {"calls_ms": [round(t, 1) for t in ts], "median_ms": statistics.median(ts),
                      "median_last_half_ms": statistics.median(ts[len(ts) // 2:])}
               for name, ts in runs.items()}  # fmt: skip
    for name, s in summary.items():
        print(f"{name:>18}: median {s['median_ms']:7.1f} ms, last half "
              f"{s['median_last_half_ms']:7.1f} ms; calls {s['calls_ms']}")
    if args.out:
        result = {
            "schema": "bitfold-output-pages/1", "date": dt.date.today().isoformat(),
            "machine": {"platform": platform.platform(), "cores": os.cpu_count()},
            "shape": {"N": N, "D": D, "K": K}, "runs": summary,
        }  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
