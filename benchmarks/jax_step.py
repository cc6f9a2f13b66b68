"""A jitted JAX message-passing ``value_and_grad`` step: ``jax.ops.segment_sum`` against bitfold's.

One graph (20,000 nodes, 400,000 edges, D = 32, JAX's default 32-bit mode), one loss::

    loss(w, h) = sum(tanh(segment_sum(take(h @ w, src), dst, nodes)) ** 2)

timed as ``jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))`` in five variants:

* ``jax_ops``: ``jax.ops.segment_sum``, the ids constants closed over by ``jit``
  (the baseline of every ratio);
* ``jax_ops_args``: the same, ``src`` and ``dst`` arguments of the jitted step;
* ``segment_sum_captured``: ``bitfold.jax.segment_sum(m, dst, nodes)``, ids closed over
  (the plan built once, when the step is traced);
* ``segment_sum_args``: the same, ids arguments of the jitted step (a plan kept by the ids'
  content, checked against them on every call);
* ``expand_fold``: ``bitfold.jax.expand(h @ w, Fold(src))`` and ``fold(m, Fold(dst))``.

Each variant is warmed up twice (compilation and plans are not timed); then, for ``--rounds``
rounds, each variant in turn runs a block of ``--block`` consecutive steps, as a training loop
calls its step, every step timed: the turns spread the machine's drift over all of them, the
blocks keep each step's memory as its own loop would find it (a step run right after another
one finds XLA's and the plans' buffers freed or held by that other). ``ms``: the median of
every timed step of a variant (``ms_first_in_block``: of the first of each block, the step
right after another variant's); ratios of medians of this one process. Every bitfold
variant's loss is the exact sum's, so the four give the same loss bits, and so do they with
the edges permuted (asked of each, and recorded).

    PYTHONPATH=src .venv/bin/python benchmarks/jax_step.py [--rounds 7] [--block 5] [--small]
        [--out DIR]

Writes ``results.json`` (default ``benchmarks/results/<date>-jax-step-cpu-<cores>core/``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

#: nodes, edges, row width.
FULL, SMALL = (20_000, 400_000, 32), (300, 6_000, 8)
#: The goal: every bitfold.jax.segment_sum variant at most this ratio to the plain step.
GOAL = 1.2
BASELINE = "jax_ops"
VARIANTS = ("jax_ops", "jax_ops_args", "segment_sum_captured", "segment_sum_args", "expand_fold")
BITFOLD = VARIANTS[2:]


def default_out() -> Path:
    """``benchmarks/results/<today>-jax-step-cpu-<cores>core``."""
    day = datetime.date.today().isoformat()
    return Path("benchmarks/results") / f"{day}-jax-step-cpu-{os.cpu_count()}core"


def steps(nodes: int, src: np.ndarray, dst: np.ndarray) -> dict[str, Callable[..., Any]]:
    """Each variant as ``f(w, h)``: the jitted ``value_and_grad`` step's ``(loss, (dw, dh))``."""
    import jax
    import jax.numpy as jnp

    import bitfold
    import bitfold.jax as bj

    src32, dst32 = src.astype(np.int32), dst.astype(np.int32)
    jsrc, jdst = jnp.asarray(src32), jnp.asarray(dst32)

    def loss_of(segment_sum: Callable[..., Any]) -> Callable[..., Any]:
        def loss(w: Any, h: Any, s: Any, d: Any) -> Any:
            return jnp.sum(jnp.tanh(segment_sum(jnp.take(h @ w, s, axis=0), d, nodes)) ** 2)

        return loss

    def captured(segment_sum: Callable[..., Any]) -> Callable[..., Any]:
        loss = loss_of(segment_sum)
        step = jax.jit(jax.value_and_grad(lambda w, h: loss(w, h, jsrc, jdst), argnums=(0, 1)))
        return step

    def arguments(segment_sum: Callable[..., Any]) -> Callable[..., Any]:
        step = jax.jit(jax.value_and_grad(loss_of(segment_sum), argnums=(0, 1)))
        return lambda w, h: step(w, h, jsrc, jdst)

    gather, scatter = bitfold.Fold(src, nodes), bitfold.Fold(dst, nodes)

    def planned(w: Any, h: Any) -> Any:
        return jnp.sum(jnp.tanh(bj.fold(bj.expand(h @ w, gather), scatter)) ** 2)

    return {
        "jax_ops": captured(jax.ops.segment_sum),
        "jax_ops_args": arguments(jax.ops.segment_sum),
        "segment_sum_captured": captured(bj.segment_sum),
        "segment_sum_args": arguments(bj.segment_sum),
        "expand_fold": jax.jit(jax.value_and_grad(planned, argnums=(0, 1))),
    }


def timed(fns: dict[str, Callable[[], Any]], rounds: int, block: int) -> dict[str, list[float]]:
    """Milliseconds of every call of each of ``fns`` (each warmed up twice): ``rounds`` turns,
    ``block`` consecutive calls of one at each turn."""
    import jax

    for fn in fns.values():
        jax.block_until_ready(fn())
        jax.block_until_ready(fn())
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(block):
                t0 = time.perf_counter()
                jax.block_until_ready(fn())
                samples[name].append(1e3 * (time.perf_counter() - t0))
    return samples


def loss_bits(out: Any) -> str:
    """The loss's float32 bits, in hex."""
    return f"{int(np.asarray(out[0], np.float32).view(np.uint32)):08x}"


def run(nodes: int, edges: int, d: int, rounds: int, block: int) -> dict[str, Any]:
    """Time the variants on one graph; the loss bits of each, then with the edges permuted."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, nodes, edges), rng.integers(0, nodes, edges)
    h = jnp.asarray(rng.normal(size=(nodes, d)).astype(np.float32))
    w = jnp.asarray((rng.normal(size=(d, d)) / np.sqrt(d)).astype(np.float32))
    fns = steps(nodes, src, dst)
    samples = timed({k: (lambda f=f: f(w, h)) for k, f in fns.items()}, rounds, block)
    ms = {k: round(statistics.median(v), 3) for k, v in samples.items()}
    first = {k: round(statistics.median(v[::block]), 3) for k, v in samples.items()}
    bits = {k: loss_bits(f(w, h)) for k, f in fns.items()}
    perm = rng.permutation(edges)
    permuted = steps(nodes, src[perm], dst[perm])
    bits_permuted = {k: loss_bits(permuted[k](w, h)) for k in BITFOLD}
    ratios = {k: round(ms[k] / ms[BASELINE], 3) for k in VARIANTS if k != BASELINE}
    ratios_to_args = {k: round(ms[k] / ms["jax_ops_args"], 3) for k in ("segment_sum_args",)}
    drop_ins = ("segment_sum_captured", "segment_sum_args")
    same = len({bits[k] for k in BITFOLD} | set(bits_permuted.values())) == 1
    return {
        "nodes": nodes, "edges": edges, "d": d, "rounds": rounds, "block": block,
        "x64": bool(jax.config.jax_enable_x64), "baseline": BASELINE,
        "ms": ms, "ms_first_in_block": first,
        "ms_samples": {k: [round(x, 3) for x in v] for k, v in samples.items()},
        "ratios": ratios, "ratios_to_jax_ops_args": ratios_to_args,
        "loss_bits": bits, "loss_bits_edges_permuted": bits_permuted,
        "same_loss_bits": same,
        "goal": {"ratio_at_most": GOAL, "variants": list(drop_ins),
                 "met": all(ratios[k] <= GOAL for k in drop_ins) and same},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=int, default=5, help="consecutive steps a turn")
    ap.add_argument("--small", action="store_true", help="a small graph: a smoke test")
    ap.add_argument("--out", type=Path, default=None, help="default: " + str(default_out()))
    args = ap.parse_args(argv)
    import jax

    nodes, edges, d = SMALL if args.small else FULL
    load_before = os.getloadavg()
    result = run(nodes, edges, d, args.rounds, args.block)
    report = {
        "command": " ".join(["python", "benchmarks/jax_step.py", *(argv or sys.argv[1:])]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "jax": jax.__version__, "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()], **result,
    }  # fmt: skip
    out = args.out or default_out()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("ms", "ratios", "same_loss_bits", "goal")}))
    return report


if __name__ == "__main__":
    main()
