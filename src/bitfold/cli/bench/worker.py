"""Measurements that need a fresh process: peak memory, and digests under another thread count.

The parent (:func:`run_jobs`) writes a JSON spec and starts
``python -m bitfold.cli.bench.worker SPEC``; the worker rebuilds each case's
inputs from its spec (:func:`bitfold.cli.bench.cases.make_inputs`), runs one job
per (case, contender) and prints one line per event. If the worker dies (a
crash, the kernel's out-of-memory killer), the job it was on is recorded as
failed or ``oom`` and a new worker takes the remaining jobs.

Modes
-----
``memory``
    Peak memory above the inputs of ``build()`` plus one ``call()``, after a
    warm-up on a small input of the same dtype and K (so compilation is not
    counted). Two gauges, the larger is reported: the ``tracemalloc`` peak
    (NumPy arrays, including those Numba allocates, which go through NumPy's
    traced allocator) and the growth of the resident set's high-water mark
    (``/proc/self/status`` VmHWM, reset through ``/proc/self/clear_refs``),
    which also sees allocators tracemalloc does not (PyTorch). glibc's
    ``mmap`` threshold is pinned low so that large blocks are fresh pages.
    On ``--device cuda`` the peak of torch's CUDA allocator is recorded too
    (``device_peak_bytes``); GPU memory from other allocators is not measured.
``digest``
    The digest of one fold, run with the thread count the parent put in the
    environment (``NUMBA_NUM_THREADS``, ``OMP_NUM_THREADS``; torch is set to
    the same count).
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

MARK = "@@bitfold-bench "
#: How the parent starts a worker (the spec file's path is appended).
WORKER_COMMAND = [sys.executable, "-m", "bitfold.cli.bench.worker"]


# -- inside the worker -------------------------------------------------------------------------
def _proc_status() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, val = line.split(":")
                out[key] = int(val.split()[0]) * 1024
    return out


def _reset_hwm() -> bool:
    """Reset the resident set's high-water mark to the current size; False where impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _pin_mmap_threshold() -> None:
    """Make glibc serve blocks >= 64 KiB with fresh mmap pages (no reuse hides growth)."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _memory_job(name: str, inp: Any) -> dict[str, Any]:
    from .contenders import CONTENDERS

    runner = CONTENDERS[name].make(inp)
    torch = sys.modules.get("torch") if inp.device == "cuda" else None
    if torch is not None:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        device_before = torch.cuda.memory_allocated()
    tracemalloc.start()
    rss_ok = _reset_hwm()
    rss0 = _proc_status().get("VmRSS", 0) if rss_ok else 0
    try:
        runner.setup()
        plan_traced = tracemalloc.get_traced_memory()[0]
        out = runner.call()
        peak_traced = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    peak_rss = max(0, _proc_status().get("VmHWM", 0) - rss0) if rss_ok else None
    del out, runner
    peak = max(peak_traced, peak_rss or 0)
    device_peak = None
    if torch is not None:  # what went through torch's CUDA allocator (not cupy's, not Numba's)
        device_peak = int(torch.cuda.max_memory_allocated() - device_before)
    return {
        "device_peak_bytes": device_peak,
        "status": "ok",
        "peak_bytes": int(peak),
        "peak_traced_bytes": int(peak_traced),
        "peak_rss_bytes": None if peak_rss is None else int(peak_rss),
        "setup_traced_bytes": int(plan_traced),
        "bytes_per_element": peak / max(1, inp.n),
        "memory_method": "max(tracemalloc peak, VmHWM growth)" if rss_ok else "tracemalloc peak",
    }


def _digest_job(name: str, inp: Any) -> dict[str, Any]:
    from ...repro.digest import digest
    from .contenders import CONTENDERS

    runner = CONTENDERS[name].make(inp)
    runner.setup()
    return {"status": "ok", "digest": digest(runner.call())}


def _emit(**event: Any) -> None:
    sys.stdout.write(MARK + json.dumps(event) + "\n")
    sys.stdout.flush()


def worker_main(spec: dict[str, Any]) -> None:
    """Run every job of ``spec`` (see the module docstring), printing one line per event."""
    from .contenders import CONTENDERS, Inputs
    from .measure import failure

    mode = spec["mode"]
    device, limit = spec["device"], int(spec["memory_limit"])
    if mode == "memory":
        _pin_mmap_threshold()
    else:
        threads = int(spec["threads"])
        libraries = {getattr(CONTENDERS.get(j["contender"]), "library", "") for j in spec["jobs"]}
        if "torch" in libraries and importlib.util.find_spec("torch") is not None:
            import torch

            torch.set_num_threads(threads)
    job_fn = _memory_job if mode == "memory" else _digest_job
    warmed: set[tuple[str, str, int]] = set()
    key, inp = None, None
    for number, job in zip(spec["numbers"], spec["jobs"], strict=True):
        _emit(event="start", job=number)
        name, case = job["contender"], job["case"]
        try:
            if key != json.dumps(case, sort_keys=True):
                inp = None
                gc.collect()
                inp = Inputs.from_spec(case, device, limit)
                key = json.dumps(case, sort_keys=True)
            assert inp is not None
            why = CONTENDERS[name].unavailable(device, inp.kind, inp.dtype)
            if why:
                result = {"status": "skipped", "reason": why}
            else:
                if mode == "memory" and (name, case["dtype"], case["k"]) not in warmed:
                    small = {**case, "n": min(int(case["n"]), 4096)}
                    _digest_job(name, Inputs.from_spec(small, device, limit))
                    warmed.add((name, case["dtype"], case["k"]))
                result = job_fn(name, inp)
        except Exception as err:
            status, reason = failure(err)
            result = {"status": status, "reason": reason}
        _emit(event="done", job=number, result=result)


# -- in the parent -----------------------------------------------------------------------------
def run_jobs(
    mode: str,
    jobs: list[dict[str, Any]],
    *,
    device: str,
    memory_limit: int,
    env: dict[str, str] | None = None,
    threads: int | None = None,
    on_done: Callable[[int, dict[str, Any]], None] | None = None,
) -> dict[int, dict[str, Any]]:
    """Run ``jobs`` (``{"case": spec, "contender": name}``) in worker processes; results by job.

    A worker that dies costs the job it was running (recorded as ``failed``,
    or ``oom`` when it was killed by SIGKILL, the out-of-memory killer's
    signal); the next worker takes the remaining jobs.
    """
    results: dict[int, dict[str, Any]] = {}
    penv = {**os.environ, **(env or {})}
    while len(results) < len(jobs):
        todo = [i for i in range(len(jobs)) if i not in results]
        spec = {
            "mode": mode,
            "device": device,
            "memory_limit": memory_limit,
            "threads": threads or 0,
            "numbers": todo,
            "jobs": [jobs[i] for i in todo],
        }
        with tempfile.TemporaryDirectory(prefix="bitfold-bench-") as tmp:
            path = os.path.join(tmp, "spec.json")
            with open(path, "w") as f:
                json.dump(spec, f)
            err_path = os.path.join(tmp, "stderr.txt")
            with open(err_path, "w") as err:
                proc = subprocess.Popen(
                    [*WORKER_COMMAND, path],
                    stdout=subprocess.PIPE,
                    stderr=err,
                    env=penv,
                    text=True,
                )
                current = None
                assert proc.stdout is not None
                for line in proc.stdout:
                    if not line.startswith(MARK):
                        continue
                    event = json.loads(line[len(MARK) :])
                    if event["event"] == "start":
                        current = event["job"]
                    else:
                        results[event["job"]] = event["result"]
                        current = None
                        if on_done:
                            on_done(event["job"], event["result"])
                rc = proc.wait()
            with open(err_path) as f:
                tail = f.read()[-400:].strip().replace("\n", " | ")
        lost = current if current is not None else next((i for i in todo if i not in results), None)
        if lost is None:
            break
        killed = rc in (-9, 137)
        results[lost] = {
            "status": "oom" if killed else "failed",
            "reason": f"the {mode} worker process died (exit status {rc})"
            + (f": {tail}" if tail else ""),
        }
        if on_done:
            on_done(lost, results[lost])
    return results


if __name__ == "__main__":
    with open(sys.argv[1]) as _f:
        _spec = json.load(_f)
    np.seterr(all="ignore")
    worker_main(_spec)
