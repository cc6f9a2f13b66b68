"""Timing the contenders of one case in this process: setup, first call, median of repeats.

The repeats are interleaved: round r times one call of every contender still
running, so a burst of other work on the machine slows all of them alike and
the ratio to the baseline stays fair. The order of a round is rotated by one
each round, so that no contender always runs right after the same one: a slow
contender that churns memory (``np.add.at`` of rows allocates and frees a
(K, D) table in hundreds of milliseconds) slows whichever call comes next, and
measured on 2 cores that cost up to 7x on the one contender that always
followed it. A contender leaves the rounds once it
has ``min_repeats`` and its first call plus repeats have used ``budget_s``.

The record of a contender is a plain dict (one row of ``results.json``):

* ``status``: ``ok``, ``failed`` (an exception; ``reason`` says which),
  ``oom`` (out of memory or over the benchmark's memory limit) or ``skipped``
  (library or device not available here);
* ``setup_s``: building what depends on the index only (a plan, a sort);
  None for contenders that keep nothing between calls;
* ``route`` (``bitfold-exact`` on the host): the exact route ``plan(values)``
  takes, from :meth:`bitfold.Fold.route`;
* ``first_call_s``: the first fold of this case, which includes any
  compilation not yet done in this process (Numba, XLA);
* ``times_s``, ``median_s`` and ``min_s``: the timed repeats after the first
  call (garbage collector off), ``repeats`` of them;
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
from collections.abc import Callable
from typing import Any

import numpy as np

from ...arrays import to_numpy
from ...repro.digest import digest
from .contenders import CONTENDERS, Inputs, OutOfMemory


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
    from ...plan import Fold

    return Fold(inp.idx, inp.k)(inp.values, "exact", out_dtype="float64")


#: Elements a slice of :func:`max_abs_diff` compares (8 MiB of float64).
DIFF_CHUNK = 1 << 20


def max_abs_diff(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest ``|got - ref|`` in float64 (NaN if any is NaN), a slice at a time: no
    float64 copies of a (K, D) result, which at K = 10^6 cost more than the fold."""
    with np.errstate(invalid="ignore", over="ignore"):
        if got.shape != ref.shape:  # broadcast, or refused, as whole arrays are
            return float(np.max(np.abs(got.astype(np.float64) - ref), initial=0.0))
        flat_got, flat_ref = got.reshape(-1), ref.reshape(-1)
        scratch = np.empty(min(flat_ref.size, DIFF_CHUNK), np.float64)
        worst = np.float64(0.0)
        for i in range(0, flat_ref.size, DIFF_CHUNK):
            part = scratch[: min(DIFF_CHUNK, flat_ref.size - i)]
            np.subtract(flat_got[i : i + DIFF_CHUNK], flat_ref[i : i + DIFF_CHUNK], out=part,
                        dtype=np.float64)  # fmt: skip
            worst = np.maximum(worst, np.max(np.abs(part, out=part), initial=0.0))
        return float(worst)


def _start(name: str, inp: Inputs, ref: np.ndarray | None) -> tuple[dict[str, Any], Any]:
    """Make, set up and call a contender once: its row, and its runner (None if it stopped)."""
    row: dict[str, Any] = {"contender": name, "status": "ok", "reason": None}
    c = CONTENDERS[name]
    why = c.unavailable(inp.device, inp.kind, inp.dtype)
    if why:
        return {**row, "status": "skipped", "reason": why}, None
    try:
        runner = c.make(inp)
        t0 = time.perf_counter()
        runner.setup()
        row["setup_s"] = None if runner.build is None else time.perf_counter() - t0
        row.update(runner.info)
        t0 = time.perf_counter()
        first = runner.call()
        row["first_call_s"] = time.perf_counter() - t0
        row["digest"] = digest(first)
        if ref is not None:
            row["max_abs_diff_vs_exact"] = max_abs_diff(to_numpy(first), ref)
        row.update(times_s=[], identical_repeats=True)
        return row, runner
    except Exception as err:  # a failing contender is recorded; the sweep goes on
        _fail(row, err)
        return row, None


def _fail(row: dict[str, Any], err: Exception) -> None:
    row["status"], row["reason"] = failure(err)
    if isinstance(err, OutOfMemory) and err.needed:
        row["oom_needed_bytes"] = int(err.needed)


def measure_case(
    names: list[str],
    inp: Inputs,
    *,
    repeats: int,
    budget_s: float,
    ref: np.ndarray | None = None,
    min_repeats: int = 3,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Time every contender in ``names`` on ``inp``; rows in the order of ``names``.

    See the module docstring for the rounds and the fields. ``on_row`` is
    called with each contender's row once its first call is done.
    """
    rows, running = [], {}
    for name in names:
        row, runner = _start(name, inp, ref)
        rows.append(row)
        if runner is not None:
            running[name] = (row, runner)
        if on_row:
            on_row(row)
    floor = min(min_repeats, repeats)
    gc.disable()  # no collection pauses inside the timed rounds
    try:
        for r in range(repeats):
            order = list(running.items())
            shift = r % len(order) if order else 0
            for name, (row, runner) in order[shift:] + order[:shift]:
                try:
                    t0 = time.perf_counter()
                    out = runner.call()
                    dt = time.perf_counter() - t0
                except Exception as err:
                    _fail(row, err)
                    del running[name]
                    continue
                row["times_s"].append(dt)
                if digest(out) != row["digest"]:
                    row["identical_repeats"] = False
                del out
                spent = row["first_call_s"] + sum(row["times_s"])
                if len(row["times_s"]) >= floor and spent > budget_s:
                    del running[name]
            if not running:
                break
    finally:
        gc.enable()
    for row in rows:
        if row["status"] == "ok":
            times = row["times_s"]
            row["repeats"] = len(times)
            row["median_s"] = statistics.median(times) if times else None
            row["min_s"] = min(times) if times else None
    return rows
