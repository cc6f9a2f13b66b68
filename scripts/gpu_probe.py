"""``bitfold probe`` on the GPU, checked against the same probe on the CPU (``make gpu-check``).

Runs ``bitfold probe`` twice: with its defaults (on a machine with a CUDA GPU
and numba-cuda, the default device is the GPU) and with ``--device cpu``
(fewer training steps: it is there for the exact digest), each writing its
JSON into OUTDIR. Then checks what the probe promises:

* on the GPU run, bitfold's ``exact`` and ``ordered`` folds were bit-identical
  in every repeat (question 2) and their training runs ended bit-identical
  (question 4);
* the ``exact`` fold's digest is the CPU run's: the correctly rounded sum does
  not depend on the device (the digest of the same values, folded);
* the GPU run really folded on the GPU (its ``backend`` line names numba-cuda).

``ordered``'s digest against the CPU's, and whether the usual atomic scatter
gave different bits run to run on the GPU (question 1), are recorded, not
judged. Writes ``probe_check.json``; exit status 0 when every check passes, 1
otherwise. ``--smoke`` runs both probes on the CPU with tiny sizes (no GPU
needed; checks this script).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

#: The GPU run takes the probe's defaults (what a user gets); the CPU run, there only for the
#: exact digest (which does not depend on the steps), trains fewer steps.
GPU_ARGS: list[str] = []
CPU_ARGS = ["--steps", "20"]
SMOKE_ARGS = ["--steps", "5", "--reps", "2", "--D", "64", "--hid", "256", "--K", "33"]


def run_probe(out: Path, name: str, args: list[str], timeout: float) -> dict[str, Any]:
    """``bitfold probe ARGS --json OUT/probe_NAME.json``; its report (or why there is none)."""
    path = out / f"probe_{name}.json"
    cmd = [sys.executable, "-m", "bitfold", "probe", *args, "--json", str(path)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(),
                              timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired as err:
        out_text = err.stdout or ""
        text = out_text if isinstance(out_text, str) else out_text.decode(errors="replace")
        (out / f"probe_{name}.log").write_text(text, encoding="utf-8")
        return {"error": f"timed out after {timeout:.0f} s"}
    (out / f"probe_{name}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    if done.returncode != 0 or not path.exists():
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    return json.loads(path.read_text(encoding="utf-8"))


def judge(gpu: dict[str, Any], cpu: dict[str, Any], smoke: bool) -> dict[str, Any]:
    """Each check true or false, and the facts recorded beside them."""
    if "error" in gpu or "error" in cpu:
        return {"ran": False, "gpu_error": gpu.get("error"), "cpu_error": cpu.get("error")}
    q2g, q2c, q4g = gpu["q2_fixed_order"], cpu["q2_fixed_order"], gpu["q4_training"]
    checks = {
        "ran": True,
        "folded_on_the_gpu": "not judged (--smoke: both on the CPU)"
        if smoke
        else "numba-cuda" in str(gpu.get("backend", "")),
        "exact_bit_identical_every_repeat": bool(q2g["exact"]["bit_identical"]),
        "ordered_bit_identical_every_repeat": bool(q2g["ordered"]["bit_identical"]),
        "exact_training_runs_bit_identical": bool(q4g["exact"]["bit_identical"]),
        "ordered_training_runs_bit_identical": bool(q4g["ordered"]["bit_identical"]),
        "exact_digest_equals_the_cpu_digest": q2g["exact"]["digest"] == q2c["exact"]["digest"],
    }
    facts = {
        "backend": gpu.get("backend"),
        "ordered_digest_equals_the_cpu_digest": q2g["ordered"]["digest"]
        == q2c["ordered"]["digest"],
        "usual_fold_nondeterminism": {
            name: {k: entry.get(k) for k in ("bit_identical", "distinct_results", "max_difference")}
            for name, entry in gpu["q1_nondeterminism"].items()
            if isinstance(entry, dict)
        },
        "readout": gpu.get("readout"),
    }
    return {**checks, "passed": all(checks.values()), "facts": facts}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for the probes' JSON and logs")
    parser.add_argument("--smoke", action="store_true", help="both probes on the CPU, tiny sizes")
    parser.add_argument("--gpu-timeout", type=float, default=300.0, help="GPU probe seconds")
    parser.add_argument("--cpu-timeout", type=float, default=300.0, help="CPU probe seconds")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        gpu = run_probe(args.out, "gpu", [*SMOKE_ARGS, "--device", "cpu"], args.gpu_timeout)
        cpu = run_probe(args.out, "cpu", [*SMOKE_ARGS, "--device", "cpu", "--no-torch"],
                        args.cpu_timeout)  # fmt: skip
    else:
        gpu = run_probe(args.out, "gpu", GPU_ARGS, args.gpu_timeout)
        cpu = run_probe(args.out, "cpu", [*CPU_ARGS, "--device", "cpu", "--no-torch"],
                        args.cpu_timeout)  # fmt: skip
    verdict = judge(gpu, cpu, args.smoke)
    (args.out / "probe_check.json").write_text(json.dumps(verdict, indent=2), encoding="utf-8")
    print(json.dumps({k: v for k, v in verdict.items() if k != "facts"}, indent=2))
    return 0 if verdict.get("passed") else 1


if __name__ == "__main__":
    sys.exit(main())
