#!/usr/bin/env python3
"""What the GPU kernels' known-answer test costs a process, per device and dtype pair.

    python scripts/selftest_cost.py [--device cpu|cuda] [--pairs float32:float32 ...] [--json PATH]

For each Triton (and, on a GPU, numba-cuda) pair it runs the test twice
(:func:`bitfold.backends.selftest.check`): the first run compiles the kernels
(or loads Triton's cache), the second is the cost a process pays after
compilation. It also counts the kernel launches a pair makes (Triton) and times
the test's own host work — reading the stored cases, planning, placing the
values, reading the results back and comparing — by running the same problem
set through the host backend's kernels (microseconds of folding), so that what
remains is the device's (or the interpreter's) kernel time.

Without a GPU, ``--device cpu`` runs the Triton kernels in Triton's interpreter
(``TRITON_INTERPRET=1`` is set here), which executes every Triton operation of
every program in Python: it measures the interpreter, not a device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PAIRS = ("float32:float32", "float16:float16", "bfloat16:float32", "float64:float64")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: Triton's interpreter (default); cuda: the current GPU")
    parser.add_argument("--pairs", nargs="*", default=list(DEFAULT_PAIRS),
                        help="value:output dtype pairs (default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    return parser.parse_args(argv)  # fmt: skip


def _launches(kernels: Any) -> dict[str, int]:
    """Count each Triton kernel's launches (the module's kernels wrapped in counters)."""
    counts: dict[str, int] = {}
    for name in ("lanes_kernel", "hot_kernel", "round_rows_kernel"):
        real = getattr(kernels, name)

        class Counted:
            def __init__(self, name: str, real: Any) -> None:
                self.name, self.real = name, real

            def __getitem__(self, grid: Any) -> Any:
                counts[self.name] = counts.get(self.name, 0) + 1
                return self.real[grid]

        setattr(kernels, name, Counted(name, real))
    return counts


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    import torch

    import bitfold
    from bitfold.backends import host, registry, selftest
    from bitfold.kernels import triton as kernels

    pairs = [tuple(p.split(":")) for p in args.pairs]
    like = torch.zeros(1, device=args.device)
    families = [registry.get_backend("triton")]
    if args.device == "cuda" and registry.get_backend("cuda").can_run("cuda"):
        families.append(registry.get_backend("cuda"))
    counts = _launches(kernels)
    rows: list[dict[str, Any]] = []
    for backend in families:
        for dtype, out in pairs:
            counts.clear()
            first = selftest.check(backend, like, [(dtype, out)], bitfold.Fold)
            launched = dict(counts)
            again = selftest.check(backend, like, [(dtype, out)], bitfold.Fold)
            rows.append({"family": first.family, "device": first.device,
                         "pair": f"{dtype} -> {out}", "passed": first.passed and again.passed,
                         "first_ms": first.seconds * 1e3,
                         "after_compilation_ms": again.seconds * 1e3,
                         "launches": launched if backend.name == "triton" else None})  # fmt: skip
    # the test's own host work: the same problem set folded by the host's kernels
    hooks = selftest.KnownAnswers(
        family="host", device=lambda v: "cpu", about=lambda v: {},
        place=lambda bits, dtype, v: (torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16)
                                      if dtype == "bfloat16" else bits.view(dtype)),
        options={"scalars": ({},), "rows": ({},)},
    )  # fmt: skip
    reference = dataclasses.replace(host.BACKEND, known_answers=hooks)
    machinery = {}
    for dtype, out in pairs:
        selftest.check(reference, None, [(dtype, out)], bitfold.Fold)  # plans made, kernels warm
        start = time.perf_counter()
        selftest.check(reference, None, [(dtype, out)], bitfold.Fold)
        machinery[f"{dtype} -> {out}"] = (time.perf_counter() - start) * 1e3
    print(f"known-answer test on {args.device} ({like.device}); about: {first.about}")
    print(f"{'family':>10} {'pair':>22} {'passed':>6} {'first':>10} {'after':>10} {'host work':>10}"
          "  launches")  # fmt: skip
    for r in rows:
        print(f"{r['family']:>10} {r['pair']:>22} {r['passed']!s:>6} {r['first_ms']:8.1f}ms "
              f"{r['after_compilation_ms']:8.1f}ms {machinery[r['pair']]:8.2f}ms  "
              f"{r['launches'] or ''}")  # fmt: skip
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    print(f"load average {load}, {os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "rows": rows,
                                               "host_work_ms": machinery, "load": load},
                                              indent=2) + "\n")  # fmt: skip
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
