"""``bitfold bench``'s ``load`` phase and the one-shot and rows-against-XLA sweeps.

The busy process is always killed and reaped; the sweeps run end to end on tiny
inputs, and ``benchmarks/bench_goals.py`` judges what they wrote. No timing
assertions: what is written is checked, not how fast anything was.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bitfold import cli
from bitfold.cli.bench import cases as bench_cases
from bitfold.cli.bench import load as bench_load
from bitfold.cli.bench import measure as bench_measure

ROOT = Path(__file__).resolve().parents[1]


# -- the load helper -------------------------------------------------------------------------
def _gone(pid: int) -> bool:
    """True once ``pid`` has exited (gone, or a zombie waiting for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_the_busy_process_spins_and_is_always_killed() -> None:
    with bench_load.busy_process() as busy:
        assert not _gone(busy["pid"])
        time.sleep(0.3)
    assert _gone(busy["pid"]) and busy["returncode"] is not None
    assert busy["cpu_s"] > 0  # it did load the machine
    with pytest.raises(KeyError), bench_load.busy_process() as busy:
        raise KeyError("inside the block")
    assert _gone(busy["pid"])


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_the_load_phase_kills_its_child_when_the_timing_fails(monkeypatch) -> None:
    started: list[subprocess.Popen] = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            started.append(self)

    def boom(*args, **kwargs):
        raise RuntimeError("the timing failed")

    monkeypatch.setattr(bench_load.subprocess, "Popen", Recorded)
    monkeypatch.setattr(bench_measure, "measure_case", boom)
    monkeypatch.setattr(bench_load, "SETTLE_S", 0.0)
    with pytest.raises(RuntimeError, match="the timing failed"):
        bench_load.measure_load(device="cpu", quick=True, scale=0.001, repeats=1, budget_s=0.1,
                                min_repeats=1, memory_limit=1 << 30)  # fmt: skip
    assert len(started) == 1 and started[0].returncode is not None
    assert _gone(started[0].pid)


ORPHAN = """
import sys
from bitfold.cli.bench.load import busy_process
with busy_process() as busy:
    print(busy["pid"], flush=True)
    import os
    os._exit(0)  # the parent dies without leaving the block
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_an_orphaned_busy_process_stops_by_itself() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True,
                         env=env, timeout=60, check=True)  # fmt: skip
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid)


# -- end to end ------------------------------------------------------------------------------
def _bench_goals():
    from test_bench_goals import _script

    return _script()


def test_the_oneshot_xla_and_load_sweeps_run_end_to_end(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    argv = ["bench", "--quick", "--scale", "0.002", "--repeats", "2",
            "--sweeps", "seed,oneshot,xla-rows,load", "--contenders",
            "bitfold-exact,bitfold-exact-new-plan,torch-index-add,jax-segment-sum",
            "--skip", "memory,threads,startup,steps,compiled,plots", "--out", str(out)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()) as text:
        assert cli.main(argv) == 0
    res = json.loads((out / "results.json").read_text())
    oneshot = [c for c in res["cases"] if "oneshot" in c["sweeps"]]
    xla = [c for c in res["cases"] if "xla-rows" in c["sweeps"]]
    assert len(oneshot) == 4 and len(xla) == 5 and set(res["sweeps"]) == {
        "seed", "oneshot", "xla-rows", "load"}  # fmt: skip
    assert len(res["cases"]) == 4 + 5 - 1  # oneshot shares its rows shape with xla-rows
    assert {c["k"] for c in oneshot} == {bench_cases.SEED_K, 100_000, 1_000_000, 50_000}
    load = res["load"]
    assert load["status"] == "ok" and load["busy"]["returncode"] is not None
    assert {r["contender"]: r["status"] for r in load["results"]} == {
        "numpy-add-at": "ok", "bitfold-exact": "ok"}  # fmt: skip
    assert _gone(load["busy"]["pid"])
    assert "goals" not in res and "allreduce" not in res  # the bench measures; it judges nothing
    summary = (out / "summary.md").read_text()
    assert "## Under load: one extra busy process" in summary
    assert "## One-shot folds" in summary and "## Folds of rows" in summary
    assert "## At a glance" in summary and "- At the seed configuration (N = " in summary
    assert "goal" not in summary.lower() and "goal" not in text.getvalue().lower()
    # the goals are judged from the JSON by the script in benchmarks/
    bg = _bench_goals()
    (out / "allreduce.json").write_text(json.dumps({"allreduce": [
        {"processes": p, "elements": n, "float32_ms": 10.0, "exact_ms": 20.0}
        for p in (2, 4) for n in (4_000_000, 16_000_000)]}))  # fmt: skip
    bg.main([str(out / "results.json")])
    got = {line.split(",")[0]: line for line in capsys.readouterr().out.splitlines()}
    for key in ("oneshot", "rows-xla", "load"):
        assert "not measured" not in got[key], got[key]
    assert "run the `k` sweep" in got["large-k"]
    assert got["allreduce"].endswith("→ met")  # from the allreduce.json beside the results
