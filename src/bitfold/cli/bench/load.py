"""The seed configuration timed while one extra busy process loads the machine.

:func:`busy_process` starts a child process that spins a pure-Python loop (one
core's worth of work, wherever the scheduler puts it) and kills it on the way
out of the ``with`` block, whatever happens inside; the child also stops on
its own once its parent is gone, so that a bench killed outright leaves no
spinner behind. :func:`measure_load` times ``bitfold-exact`` and
``np.add.at`` on the seed configuration inside it, interleaved as in the case
loop (:func:`bitfold.cli.bench.measure.measure_case`), and records how much
CPU the child took (from ``/proc``, where there is one).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The child: says it is running, then spins until killed or orphaned (argv[1]: the parent).
BUSY_LOOP = """
import os, sys
parent = int(sys.argv[1])
sys.stdout.write("ready\\n")
sys.stdout.flush()
while os.getppid() == parent:
    for _ in range(200_000):
        pass
"""
#: What the load phase times: bitfold's exact fold and the CPU's atomic baseline.
LOAD_CONTENDERS = ("numpy-add-at", "bitfold-exact")
#: The child spins this long before the timing starts, so that its load is already there.
SETTLE_S = 0.5
#: A CPU share is reported only over at least this long (``/proc`` counts in clock ticks).
SHARE_MIN_WALL_S = 1.0


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds of process ``pid`` so far, from ``/proc`` (None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def busy_process(settle_s: float = 0.0) -> Iterator[dict[str, Any]]:
    """One extra busy process for the duration of the block; always killed (and reaped) after.

    The block starts once the child runs, plus ``settle_s`` seconds.
    Yields a dict that holds ``pid`` and, once the block is left, ``wall_s``
    (how long the block ran), ``cpu_s`` (the CPU the child took meanwhile; None without
    ``/proc``) and
    ``returncode``.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", BUSY_LOOP, str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    info: dict[str, Any] = {"pid": child.pid, "what": "a pure-Python busy loop in a child process"}
    t0, cpu0 = time.perf_counter(), None
    try:
        assert child.stdout is not None
        child.stdout.readline()  # it is running (or already dead: then the line is empty)
        time.sleep(settle_s)
        t0, cpu0 = time.perf_counter(), cpu_seconds(child.pid)
        yield info
    finally:
        info["wall_s"] = time.perf_counter() - t0
        cpu = cpu_seconds(child.pid)
        info["cpu_s"] = None if cpu is None or cpu0 is None else cpu - cpu0
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
        info["returncode"] = child.returncode


def measure_load(
    *,
    device: str,
    quick: bool,
    scale: float,
    repeats: int,
    budget_s: float,
    min_repeats: int,
    memory_limit: int,
) -> dict[str, Any]:
    """The ``load`` phase's record: the seed case's rows timed under :func:`busy_process`."""
    from ...repro.fingerprint import load_average
    from .cases import build_cases
    from .contenders import Inputs
    from .measure import measure_case

    if device != "cpu":
        return {"status": "skipped", "reason": f"the load phase compares with np.add.at on the "
                f"CPU; not run on {device}"}  # fmt: skip
    case = build_cases(["seed"], quick=quick, scale=scale)[0]
    inp = Inputs.from_spec(case.spec, device, memory_limit)
    before = load_average()
    with busy_process(SETTLE_S) as busy:
        rows = measure_case(list(LOAD_CONTENDERS), inp, repeats=repeats, budget_s=budget_s,
                            min_repeats=min_repeats)  # fmt: skip
        during = load_average()
    for r in rows:
        r["case"] = case.id
    if busy.get("cpu_s") is not None and busy["wall_s"] >= SHARE_MIN_WALL_S:
        busy["cpu_share"] = busy["cpu_s"] / busy["wall_s"]
    return {
        "status": "ok",
        "case": {"id": case.id, **case.spec, "d": case.d, "sweeps": ["load"]},
        "busy": busy,
        "load_average_before": before,
        "load_average_during": during,
        "results": rows,
    }


def summary_lines(load: dict[str, Any] | None) -> list[str]:
    """``summary.md``'s section on the ``load`` phase (empty when it did not run)."""
    if not load:
        return []
    title = "## Under load: one extra busy process"
    if load.get("status") != "ok":
        return [title, "", f"skipped: {load.get('reason', 'unknown')}", ""]
    busy = load.get("busy") or {}
    share = busy.get("cpu_share")
    took = "" if share is None else f", which took {share:.0%} of a core"
    lines = [title, "", f"{load['case']['id']}, timed while {busy.get('what', 'a busy process')} "
             f"ran{took}; load average before {load.get('load_average_before') or '—'}, during "
             f"{load.get('load_average_during') or '—'}.", "",
             "| contender | median ms | repeats |", "|---|---|---|"]  # fmt: skip
    for r in load["results"]:
        ms = "—" if r.get("median_s") is None else f"{r['median_s'] * 1e3:.3g}"
        cell = ms if r["status"] == "ok" else f"{r['status']}: {r.get('reason')}"
        lines.append(f"| `{r['contender']}` | {cell} | {r.get('repeats', '—')} |")
    return [*lines, ""]
