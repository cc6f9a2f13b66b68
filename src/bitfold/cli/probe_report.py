"""What ``bitfold probe`` prints: the four answers, and the readout in sentences.

Both are functions of the report dictionary alone (:meth:`bitfold.cli.probe.Probe.run`),
so a hand-made report reads the same way as a measured one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from ..repro.fingerprint import summary

#: The strategies whose bits the probe checks (question 2), in print order.
BIT_STRATEGIES = ("ordered", "exact")
#: What the readout calls the folds trained in question 4.
TRAINED_AS = {"atomic": "bitfold atomic", "ordered": "bitfold ordered", "exact": "bitfold exact"}


def _join(names: Iterable[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(names)
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _headline(rep: dict[str, Any]) -> str:
    """Which usual folds gave different bits on this machine, and which did not, by name."""
    q1 = rep["q1_nondeterminism"]
    noisy = [k for k, v in q1.items() if v["differed"]]
    steady = [k for k, v in q1.items() if not v["differed"]]
    reps = max((v["repeats"] for v in q1.values()), default=0)
    same = f"{_join(steady)} gave identical bits in all {reps} repeats"
    if noisy:
        detail = _join(
            f"{k} (in {q1[k]['differed']} of {q1[k]['repeats']} repeats, by up to "
            f"{q1[k]['max_difference']:.3e})"
            for k in noisy
        )
        if not steady:
            return (f"EVERY USUAL FOLD MEASURED HERE GAVE DIFFERENT BITS FROM CALL TO CALL: "
                    f"{detail}; the same additions, in another order.")  # fmt: skip
        return (f"SOME USUAL FOLDS GIVE DIFFERENT BITS FROM CALL TO CALL HERE. Different bits, "
                f"from the same additions in another order: {detail}. Identical bits in all "
                f"{reps} repeats: {_join(steady)}.")  # fmt: skip
    if rep.get("skipped_baselines"):
        return (f"NONE OF THE FOLDS MEASURED HERE GAVE DIFFERENT BITS ({same}), but PyTorch's "
                "were not measured (see question 1): install torch and rerun before concluding "
                "anything.")  # fmt: skip
    return f"NONE OF THE USUAL FOLDS GAVE DIFFERENT BITS HERE: {same}."


def _training(rep: dict[str, Any]) -> str:
    """What the two training runs of each fold say about training on this machine."""
    q4 = rep["q4_training"]
    steps = rep["config"]["steps"]
    parted = {TRAINED_AS.get(k, k): v for k, v in q4.items() if not v["bit_identical"]}
    whole = [TRAINED_AS.get(k, k) for k, v in q4.items() if v["bit_identical"]]
    runs = f"two training runs of {steps} steps from the same starting weights and data"
    if parted:
        worst = max(v["max_difference"] for v in parted.values())
        tail = f", and bit-identical with {_join(whole)}" if whole else ""
        return (f"For training here this means: {runs} ended with different weights when "
                f"folding with {_join(parted)} (by up to {worst:.3e}){tail}.")  # fmt: skip
    if any(v["differed"] for v in rep["q1_nondeterminism"].values()):
        return (f"For training here: {runs} still ended bit-identical with every fold tried "
                f"({_join(whole)}); the folds that differ above can make longer runs "
                "part.")  # fmt: skip
    return (f"For training here this means: {runs} ended bit-identical with every fold tried "
            f"({_join(whole)}), so there is nothing for bitfold to fix on this machine at these "
            "sizes. If two of your runs still differ, something else varies: record both "
            "(bitfold.record) and compare them with bitfold diff.")  # fmt: skip


def _exact_sum(rep: dict[str, Any]) -> str:
    """Why the exact fold's digest differs from the float sums', and by how much here."""
    base = rep["q3_cost"]["atomic_baseline"]
    diffs = rep["q2_fixed_order"].get("differences_from_exact", {})
    sizes = ""
    if base in diffs:
        sizes = f" Here {base}'s largest difference from the exact sum is {diffs[base]:.3e}"
        if "bitfold ordered" in diffs:
            sizes += f", bitfold ordered's {diffs['bitfold ordered']:.3e}"
        sizes += "."
    return (
        "bitfold's exact fold returns the correctly rounded sum (each bucket's total as if "
        "added without rounding, then rounded once), so its digest differs by design from "
        "those of float sums, which round after every addition: bitfold's atomic and ordered "
        f"folds, and every usual fold above.{sizes} Both fixed folds, exact and ordered, gave "
        "the same bits in every repeat and in both training runs."
    )


def _cost(rep: dict[str, Any]) -> str:
    """The exact fold's time a call and a training step, against the usual scatter-add."""
    q3 = rep["q3_cost"]
    base = q3["atomic_baseline"]
    exact_ms = q3["per_call"]["bitfold exact"]["median_ms"]
    base_ms = q3["per_call"][base]["median_ms"]
    ratio = q3["per_call"]["bitfold exact"]["ratio_to_atomic"]
    spread = q3["per_call"]["bitfold exact"].get("ratio_spread")
    extra = exact_ms - base_ms
    step = (f"adds {extra:.3f} ms to each step" if extra >= 0
            else f"makes each step {-extra:.3f} ms shorter")  # fmt: skip
    varied = ""
    if spread:
        varied = (f" (from {spread[0]:.2f} to {spread[1]:.2f} times over {q3['rounds']} rounds "
                  "in which the folds took turns)")  # fmt: skip
    return (
        f"Cost: the exact fold takes {exact_ms:.3f} ms a call, {ratio:.2f} times the "
        f"{base_ms:.3f} ms of {base}, the usual scatter-add here{varied}. A training step "
        f"folds its gradient once, so the exact fold {step}; for scale, the layer's forward "
        f"matrix product takes {q3['forward_matmul_ms']:.3f} ms.{_busy(q3)}"
    )


def _busy(q3: dict[str, Any]) -> str:
    """A sentence when other work loaded the machine while the costs were measured."""
    load = q3.get("load") or {}
    cores = load.get("cores") or 1
    seen = [x for x in (load.get("before"), load.get("after")) if x is not None]
    if not seen or max(seen) <= 0.75 * cores:
        return ""
    return (f" The machine was busy (load average {max(seen):.1f} on {cores} cores): "
            "other work shared the cores, so these times and ratios can move by several "
            "times between runs; rerun on a quiet machine to compare.")  # fmt: skip


def _device(rep: dict[str, Any]) -> str:
    """What the device this run used can and cannot say."""
    if rep["config"]["device"] == "cpu":
        return (
            "This run used the CPU only, so it says nothing about GPU atomics, whose order "
            "changes from launch to launch; rerun with --device cuda on a machine with a GPU. "
            "The exact fold's result does not depend on the device: its digests here are the "
            "ones any backend must give for the same values."
        )
    return (
        "This run folded on the GPU. The exact fold's bits do not depend on the device: "
        "the same values folded on the CPU give the same digest (bitfold's tests check it)."
    )


def readout(rep: dict[str, Any]) -> list[str]:
    """What the numbers say, in plain sentences: the headline first."""
    q2, q4 = rep["q2_fixed_order"], rep["q4_training"]
    fixed_ok = all(q2[s]["bit_identical"] for s in BIT_STRATEGIES) and all(
        q4[s]["bit_identical"] for s in BIT_STRATEGIES if s in q4
    )
    if not fixed_ok:
        return [
            "THE FIXED-ORDER FOLDS DID NOT REPRODUCE EXACTLY, which should not happen: read the "
            "numbers above before trusting either path, and please report it as a bitfold bug.",
            _device(rep),
        ]
    return [_headline(rep), _training(rep), _exact_sum(rep), _cost(rep), _device(rep)]


def _fmt_ms(x: float) -> str:
    return f"{x:9.3f} ms"


def _print_question1(rep: dict[str, Any], p: Any) -> None:
    p("\n 1. IS THE USUAL SCATTER NON-DETERMINISTIC HERE?\n")
    for name, r in rep["q1_nondeterminism"].items():
        verdict = (
            f"{r['differed']} of {r['repeats']} repeats differed from the first call "
            f"({r['distinct_results']} distinct results in {r['repeats'] + 1} calls, "
            f"largest difference {r['max_difference']:.3e})"
            if r["differed"]
            else f"all {r['repeats']} repeats identical"
        )
        p(f" {name:>24s}: {verdict}")
        if r.get("note"):
            p(f" {'':>24s}  ({r['note']})")
    for line in rep.get("skipped_baselines", []):
        p(f" {'not measured':>24s}: {line}")


def _print_question2(rep: dict[str, Any], p: Any) -> None:
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
            f"extra memory {r['extra_bytes'] / 1e6:.1f} MB"
        )
    diffs = q2.get("differences_from_exact")
    if diffs:
        p("\n the exact fold is the correctly rounded sum; each other fold's largest difference")
        p(" from it (float sums round after every addition, so theirs is not zero):")
        for name, d in diffs.items():
            p(f" {name:>24s}  {d:.3e}")


def _print_question3(rep: dict[str, Any], p: Any) -> None:
    q3 = rep["q3_cost"]
    p(f"\n 3. WHAT DOES IT COST?   (median per call; ratio to {q3['atomic_baseline']})\n")
    for name, r in q3["per_call"].items():
        lo, hi = r.get("ratio_spread", (r["ratio_to_atomic"],) * 2)
        p(
            f" {name:>24s} {_fmt_ms(r['median_ms'])}  {r['ratio_to_atomic']:6.2f}x"
            f" ({lo:.2f}-{hi:.2f}x)   (first call {r['first_call_ms']:.1f} ms)"
        )
    p(f" (ratios: median over {q3.get('rounds', 1)} rounds in which the folds took turns, "
      "and their spread)")  # fmt: skip
    busy = _busy(q3)
    if busy:
        p(" " + busy.strip())
    p(f" {'one forward matmul':>24s} {_fmt_ms(q3['forward_matmul_ms'])}  (for scale)")


def _print_question4(rep: dict[str, Any], p: Any) -> None:
    p("\n 4. DOES A TRAINING RUN BECOME REPRODUCIBLE?\n")
    q4 = rep["q4_training"]
    for name, r in q4.items():
        extra = "" if r["bit_identical"] else f" (max difference {r['max_difference']:.3e})"
        p(
            f" {name:>16s}: two runs of {rep['config']['steps']} steps bit-identical: "
            f"{r['bit_identical']}{extra}"
        )
        p(f" {'':>16s}  digests {r['digests'][0][:23]}…  {r['digests'][1][:23]}…")
    exact = q4.get("exact", {}).get("digests", [None])[0]
    if exact and any(r["digests"][0] != exact for r in q4.values()):
        p(" (exact's digest differs from the others' by design: it is the correctly rounded")
        p("  sum, and they are float sums)")


def known_answers_lines(answers: dict[str, Any] | None) -> list[str]:
    """The GPU kernels' known-answer test, as the report's header says it (nothing for a
    report made before the test existed)."""
    if not answers:
        return []
    if answers["mode"] == "off":
        return ["known answers: not checked (BITFOLD_SELFTEST=off)"]
    if not answers["verdicts"]:
        return ["known answers: none to check here (the host's kernels are the reference "
                "that the GPU kernels are checked against)"]  # fmt: skip
    lines = []
    for v in answers["verdicts"]:
        where = f"the {v['family']} kernels on {v['device']} ({v['about'].get('device', '?')})"
        if v["passed"]:
            lines.append(f"known answers: {where} passed ({', '.join(v['checked'])}; "
                         f"{v['seconds'] * 1e3:.1f} ms)")  # fmt: skip
        else:
            lines.append(f"known answers: {where} FAILED, {v['failure']}; the "
                         f"{answers['backend']} backend folds instead")  # fmt: skip
    return lines


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
    for line in known_answers_lines(rep.get("known_answers")):
        p(" " + line)
    p(" " + "  ".join(f"{k}={cfg[k]}" for k in ("D", "hid", "K", "reps", "steps", "batch", "lr")))
    p(bar)
    _print_question1(rep, p)
    _print_question2(rep, p)
    _print_question3(rep, p)
    _print_question4(rep, p)
    p("\n" + bar)
    p(" READOUT")
    p(bar)
    for line in rep["readout"]:
        p(" " + line)
