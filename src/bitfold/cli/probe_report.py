"""What ``bitfold probe`` prints: the four answers, and the readout in sentences.

Both are functions of the report dictionary alone (:meth:`bitfold.cli.probe.Probe.run`).
"""

from __future__ import annotations

import sys
from typing import Any

from ..repro.fingerprint import summary

#: The strategies whose bits the probe checks (question 2), in print order.
BIT_STRATEGIES = ("ordered", "exact")


def readout(rep: dict[str, Any]) -> list[str]:
    """What the numbers say, in sentences; covers the seed's cases honestly."""
    q1, q2, q3, q4 = (
        rep[k] for k in ("q1_nondeterminism", "q2_fixed_order", "q3_cost", "q4_training")
    )
    lines: list[str] = []
    noisy = {k: v for k, v in q1.items() if v["differed"]}
    fixed_ok = all(q2[s]["bit_identical"] for s in BIT_STRATEGIES) and all(
        q4[s]["bit_identical"] for s in BIT_STRATEGIES if s in q4
    )
    cost = q3["per_call"]
    base = q3["atomic_baseline"]
    exact_ratio = cost["bitfold exact"]["ratio_to_atomic"]
    exact_ms, base_ms = cost["bitfold exact"]["median_ms"], cost[base]["median_ms"]
    extra_ms = exact_ms - base_ms
    share = extra_ms / q3["forward_matmul_ms"] if q3["forward_matmul_ms"] else float("nan")
    if not fixed_ok:
        lines.append(
            "THE FIXED-ORDER FOLDS DID NOT REPRODUCE EXACTLY, which should not happen: read the "
            "numbers above before trusting either path, and please report it as a bitfold bug."
        )
    elif noisy:
        worst = max(noisy.values(), key=lambda v: v["max_difference"])
        names = ", ".join(noisy)
        lines.append(
            f"THE USUAL FOLD IS NON-DETERMINISTIC HERE: {names} gave results that differed "
            f"in up to {worst['differed']} of {worst['repeats']} repeats (largest difference "
            f"{worst['max_difference']:.3e}) — the same additions in a different order."
        )
        diverged = [k for k, v in q4.items() if not v["bit_identical"]]
        if diverged:
            lines.append(
                f"Training with {', '.join(diverged)} gave two different models from the same seed."
            )
    elif rep.get("skipped_baselines"):
        lines.append(
            "THE FOLDS MEASURED HERE WERE DETERMINISTIC, but PyTorch's were not measured "
            "(see question 1): install torch and rerun before concluding anything."
        )
    else:
        lines.append(
            "THE USUAL FOLDS WERE DETERMINISTIC IN EVERY REPEAT HERE, so there is nothing for "
            "bitfold to fix on this machine; if two runs still differ, something else varies: "
            "record both runs and compare them to find what."
        )
    if fixed_ok:
        lines.append(
            f"bitfold's exact fold (correctly rounded) and ordered fold were bit-identical in "
            f"every "
            f"repeat and in both training runs. The exact fold takes {exact_ms:.3f} ms a call: "
            f"{exact_ratio:.2f}x the usual scatter-add ({base}, {base_ms:.3f} ms), "
            f"{abs(extra_ms):.3f} ms {'more' if extra_ms >= 0 else 'less'} a training step "
            f"({abs(share):.1%} of the layer's forward matrix product)."
        )
    if rep["config"]["device"] == "cpu":
        lines.append(
            "This run used the CPU only, so it says nothing about GPU atomics, whose order "
            "changes from launch to launch; rerun with --device cuda on a machine with a GPU. "
            "The exact fold's result does not depend on the device: its digests here are the "
            "ones any backend must give for the same values."
        )
    else:
        lines.append(
            "This run folded on the GPU. The exact fold's bits do not depend on the device: "
            "the same values folded on the CPU give the same digest (bitfold's tests check it)."
        )
    return lines


def _fmt_ms(x: float) -> str:
    return f"{x:9.3f} ms"


def print_report(rep: dict[str, Any], out: Any = None) -> None:
    """The human report: four answers, then the readout."""
    out = out or sys.stdout

    def p(s: str = "") -> None:
        print(s, file=out)

    cfg = rep["config"]
    bar = "=" * 78
    p(bar)
    p("CAN THE FOLD BE MADE BIT-REPRODUCIBLE, AND WHAT DOES IT COST?   (bitfold probe)")
    p(bar)
    mach = summary(rep["machine"])
    p(
        f" backend: {rep['backend']}; {mach['cpu']}, {mach['cores']} cores, "
        f"numba threads {mach['numba_threads']}"
        + (f", torch threads {mach['torch_threads']}" if mach["torch_threads"] else "")
    )
    p(" " + "  ".join(f"{k}={cfg[k]}" for k in ("D", "hid", "K", "reps", "steps", "batch", "lr")))
    p(bar)
    p("\n 1. IS THE USUAL SCATTER NON-DETERMINISTIC HERE?\n")
    for name, r in rep["q1_nondeterminism"].items():
        verdict = (
            (
                f"{r['differed']} of {r['repeats']} repeats differed from the first call "
                f"({r['distinct_results']} distinct results in {r['repeats'] + 1} calls, "
                "largest difference "
                f"{r['max_difference']:.3e})"
            )
            if r["differed"]
            else (f"all {r['repeats']} repeats identical")
        )
        p(f" {name:>24s}: {verdict}")
        if r.get("note"):
            p(f" {'':>24s}  ({r['note']})")
    for line in rep.get("skipped_baselines", []):
        p(f" {'not measured':>24s}: {line}")
    q2 = rep["q2_fixed_order"]
    p("\n 2. ARE BITFOLD'S FIXED FOLDS BIT-IDENTICAL?\n")
    p(
        f" plan built once in {q2['plan_build_s'] * 1e3:.1f} ms "
        f"(first build {q2['plan_build_s_first'] * 1e3:.0f} ms, with compilation); "
        f"it holds {q2['plan_bytes'] / 1e6:.1f} MB"
    )
    for s in BIT_STRATEGIES:
        r = q2[s]
        p(
            f" {s:>8s}: first call {r['first_call_s'] * 1e3:.0f} ms (compiling or loading the "
            "kernel cache, once per process)"
        )
        p(
            f" {'':>8s}  bit-identical across {r['repeats']} repeats: {r['bit_identical']}; "
            f"extra memory {r['extra_bytes'] / 1e6:.1f} MB; "
            f"largest difference from the atomic fold {r['max_difference_from_atomic']:.3e}"
        )
    q3 = rep["q3_cost"]
    p(f"\n 3. WHAT DOES IT COST?   (median per call; ratio to {q3['atomic_baseline']})\n")
    for name, r in q3["per_call"].items():
        p(
            f" {name:>24s} {_fmt_ms(r['median_ms'])}  {r['ratio_to_atomic']:6.2f}x"
            f"   (first call {r['first_call_ms']:.1f} ms)"
        )
    p(f" {'one forward matmul':>24s} {_fmt_ms(q3['forward_matmul_ms'])}  (for scale)")
    p("\n 4. DOES A TRAINING RUN BECOME REPRODUCIBLE?\n")
    for name, r in rep["q4_training"].items():
        extra = "" if r["bit_identical"] else f" (max difference {r['max_difference']:.3e})"
        p(
            f" {name:>16s}: two runs of {cfg['steps']} steps bit-identical: "
            f"{r['bit_identical']}{extra}"
        )
        p(f" {'':>16s}  digests {r['digests'][0][:23]}…  {r['digests'][1][:23]}…")
    p("\n" + bar)
    p(" READOUT")
    p(bar)
    for line in rep["readout"]:
        p(" " + line)
