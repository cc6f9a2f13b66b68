"""Timing one contender on one case, in this process: setup, first call, median of repeats.

The record of a run is a plain dict (one row of ``results.json``):

* ``status``: ``ok``, ``failed`` (an exception; ``reason`` says which),
  ``oom`` (out of memory or over the benchmark's memory limit) or ``skipped``
  (library or device not available here);
* ``setup_s``: building what depends on the index only (a plan, a sort);
  None for contenders that keep nothing between calls;
* ``first_call_s``: the first fold of this case, which includes any
  compilation not yet done in this process (Numba, XLA);
* ``times_s`` and ``median_s``: the timed repeats after the first call
  (garbage collector off), ``repeats`` of them;
* ``digest`` of the first result and ``identical_repeats``: whether every
  repeat returned the same bits as the first call;
* ``oom_needed_bytes``: what a contender refused for the memory limit would need;
* ``max_abs_diff_vs_exact``: largest difference from the correctly rounded
  float64 sums (bitfold ``exact`` with ``out_dtype=float64``).
"""

from __future__ import annotations

import gc
import statistics
import time
import traceback
from typing import Any

import numpy as np

from .arrays import to_numpy
from .bench_contenders import CONTENDERS, Inputs, OutOfMemory
from .digest import digest


def failure(err: BaseException) -> tuple[str, str]:
    """``(status, reason)`` for an exception raised by a contender."""
    name = type(err).__name__
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    oom = isinstance(err, MemoryError | OutOfMemory) or "out of memory" in str(err).lower()
    if not text:
        frame = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
        text = f"at {frame[0].filename}:{frame[0].lineno}" if frame else ""
    return ("oom" if oom else "failed"), f"{name}: {text}"[:300]


def reference(inp: Inputs) -> np.ndarray:
    """The correctly rounded float64 sums of the case (the yardstick for accuracy)."""
    from .plan import Fold

    return Fold(inp.idx, inp.k)(inp.values, "exact", out_dtype="float64")


def measure(
    name: str,
    inp: Inputs,
    *,
    repeats: int,
    budget_s: float,
    ref: np.ndarray | None = None,
    min_repeats: int = 3,
) -> dict[str, Any]:
    """Time contender ``name`` on ``inp`` (see the module docstring for the fields).

    Stops repeating once the first call plus the repeats have used
    ``budget_s`` seconds and at least ``min(min_repeats, repeats)`` repeats ran.
    """
    row: dict[str, Any] = {"contender": name, "status": "ok", "reason": None}
    c = CONTENDERS[name]
    why = c.unavailable(inp.device)
    if why:
        return {**row, "status": "skipped", "reason": why}
    try:
        runner = c.make(inp)
        t0 = time.perf_counter()
        runner.setup()
        row["setup_s"] = None if runner.build is None else time.perf_counter() - t0
        t0 = time.perf_counter()
        first = runner.call()
        row["first_call_s"] = time.perf_counter() - t0
        row["digest"] = digest(first)
        if ref is not None:
            got = to_numpy(first).astype(np.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                row["max_abs_diff_vs_exact"] = float(np.max(np.abs(got - ref), initial=0.0))
        del first
        times: list[float] = []
        same = True
        floor = min(min_repeats, repeats)
        spent = row["first_call_s"]
        gc.disable()  # no collection pauses inside the timed repeats
        try:
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = runner.call()
                dt = time.perf_counter() - t0
                times.append(dt)
                spent += dt
                same = same and digest(out) == row["digest"]
                if len(times) >= floor and spent > budget_s:
                    break
        finally:
            gc.enable()
        row.update(
            times_s=times,
            repeats=len(times),
            median_s=statistics.median(times) if times else None,
            identical_repeats=same,
        )
    except Exception as err:  # a failing contender is recorded; the sweep goes on
        row["status"], row["reason"] = failure(err)
        if isinstance(err, OutOfMemory) and err.needed:
            row["oom_needed_bytes"] = int(err.needed)
    return row
