"""``bitfold bench`` for issue 20: its goals from a results dict, the load helper, its sweeps.

No timing assertions: the goals are judged on synthetic medians, and the end-to-end
run checks what is written, not how fast anything was.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bitfold import FoldError, cli
from bitfold.cli.bench import cases as bench_cases
from bitfold.cli.bench import command as bench
from bitfold.cli.bench import load as bench_load
from bitfold.cli.bench import measure as bench_measure
from bitfold.cli.bench.goals import goals
from bitfold.cli.bench.sweep_goals import (
    allreduce_goals,
    kept_goal,
    read_allreduce,
    sweep_goal_lines,
    sweep_goals,
)

ROOT = Path(__file__).resolve().parents[1]


# -- synthetic results -----------------------------------------------------------------------
def _case(n: int, k: int, sweeps: list[str], *, d: int = 0, skew: str = "uniform") -> dict:
    c = bench_cases.Case(n, k, skew, "float32", d, tuple(sweeps))
    return {"id": c.id, **c.spec, "d": d, "sweeps": sweeps, "output_bytes": c.output_bytes}


def _ok(case: dict, name: str, ms: float) -> dict:
    return {"case": case["id"], "contender": name, "status": "ok", "median_s": ms / 1e3}


ALLREDUCE = {
    "machine": "test", "date": "2026-12-04",
    "allreduce": [
        {"processes": 2, "elements": 4_194_304, "float32_ms": 10.0, "exact_ms": 25.0,
         "time_ratio": 2.5, "bytes_ratio": 2.0},
        {"processes": 2, "elements": 16_777_216, "float32_ms": 40.0, "exact_ms": 140.0,
         "time_ratio": 3.5, "bytes_ratio": 2.0},
        {"processes": 4, "elements": 4_194_304, "float32_ms": 20.0, "exact_ms": 40.0,
         "time_ratio": 2.0, "bytes_ratio": 2.0},
        {"processes": 4, "elements": 1_000_000, "float32_ms": 5.0, "exact_ms": 50.0,
         "time_ratio": 10.0, "bytes_ratio": 2.0},  # not one of the goal's sizes
    ],
    "step": [{"processes": 2, "parameters": 1_000_000, "ddp_ms": 100.0,
              "gradientsum_ms": 120.0, "ratio": 1.2}],
}  # fmt: skip


def _results() -> dict:
    seed = _case(bench_cases.SEED_N, bench_cases.SEED_K, ["seed", "oneshot"])
    k5 = _case(bench_cases.SEED_N, 100_000, ["oneshot"])  # not in the k sweep: no goal 3
    rows = _case(1000, 50_000, ["oneshot", "rows"], d=64)
    zipf = _case(1000, 50_000, ["xla-rows"], d=64, skew="zipf1.3")
    load_case = {**_case(bench_cases.SEED_N, bench_cases.SEED_K, ["load"])}
    results = [
        _ok(seed, "bitfold-exact-new-plan", 5.0), _ok(seed, "torch-index-add", 10.0),
        _ok(k5, "bitfold-exact-new-plan", 12.0), _ok(k5, "torch-index-add", 10.0),
        {"case": rows["id"], "contender": "bitfold-exact-new-plan", "status": "failed",
         "reason": "RuntimeError: boom"},
        _ok(rows, "torch-index-add", 10.0),
        _ok(rows, "bitfold-exact", 9.0), _ok(rows, "jax-segment-sum", 10.0),
        _ok(zipf, "bitfold-exact", 20.0), _ok(zipf, "jax-segment-sum", 10.0),
        _ok(seed, "bitfold-ordered", 9.0), _ok(seed, "numpy-add-at", 10.0),
        _ok(seed, "bitfold-exact", 6.0),
    ]  # fmt: skip
    load = {"status": "ok", "case": load_case, "busy": {"cpu_share": 0.99},
            "results": [_ok(load_case, "bitfold-exact", 8.0),
                        _ok(load_case, "numpy-add-at", 10.0)]}  # fmt: skip
    return {"cases": [seed, k5, rows, zipf], "results": results, "load": load,
            "allreduce": {"source": "ar.json", **ALLREDUCE}}  # fmt: skip


def _by_key(res: dict) -> dict[str, dict]:
    return {g["key"]: g for g in sweep_goals(res, goals(res))}


def test_sweep_goals_are_judged_case_by_case() -> None:
    got = _by_key(_results())
    one = got["oneshot"]
    assert [p["value"] for p in one["points"][:2]] == pytest.approx([0.5, 1.2])
    assert [p.get("met") for p in one["points"]] == [True, False, None]
    assert "bitfold-exact-new-plan failed" in one["points"][2]["missing"]
    assert one["met"] is False and one["missed_by"] == pytest.approx(0.2)
    xla = got["xla-rows"]  # the rows sweep's cases and xla-rows' own
    assert [p["value"] for p in xla["points"]] == pytest.approx([0.9, 2.0])
    assert xla["met"] is False and xla["missed_by"] == pytest.approx(1.0)
    large = got["large-k"]
    assert large["met"] is None and "the `k` sweep did not run" in large["points"][0]["missing"]
    assert got["ordered"]["met"] is True and got["ordered"]["worst"] == pytest.approx(0.9)
    exact = got["exact-seed"]  # 0.6x against a limit of 0.5x
    assert exact["met"] is False and exact["missed_by"] == pytest.approx(0.2)
    assert got["load"]["met"] is True and got["load"]["worst"] == pytest.approx(0.8)


def test_a_goal_whose_cases_are_absent_is_not_measured() -> None:
    res = {"cases": [], "results": []}
    got = _by_key(res)
    for key in ("oneshot", "xla-rows", "large-k", "ordered", "exact-seed", "load",
                "allreduce", "dp-step", "kept"):  # fmt: skip
        assert got[key]["met"] is None, key
    lines = sweep_goal_lines(sweep_goals(res, goals(res)))
    assert len(lines) == 9
    assert all(line.endswith(("not measured on every case", "not measured on every goal"))
               for line in lines)  # fmt: skip
    assert "the `load` sweep did not run" in lines[5]
    assert "pass --allreduce-json" in lines[6]


def test_goal_6_from_the_allreduce_json() -> None:
    ar, step = allreduce_goals({"source": "ar.json", **ALLREDUCE})
    assert [p["label"] for p in ar["points"]] == [
        "2 processes, 4M elements", "2 processes, 16M elements", "4 processes, 4M elements",
        "4 processes, 16M elements"]  # fmt: skip
    assert [p.get("met") for p in ar["points"]] == [True, False, True, None]
    assert ar["points"][3]["missing"] == "not in the all-reduce results"
    assert ar["met"] is False and ar["missed_by"] == pytest.approx(3.5 / 3 - 1)
    assert ar["points"][0]["bytes_ratio"] == 2.0
    assert step["met"] is True and step["points"][0]["value"] == pytest.approx(1.2)
    slow = {**ALLREDUCE, "step": [{"processes": 4, "parameters": 10, "ddp_ms": 10.0,
                                   "gradientsum_ms": 14.0}]}  # fmt: skip
    step = allreduce_goals(slow)[1]  # the ratio from the times when none is recorded
    assert step["met"] is False and step["worst"] == pytest.approx(1.4)
    line = sweep_goal_lines([ar])[0]
    assert "2 processes, 16M elements: 3.50x (140 vs 40 ms) ✗" in line
    assert line.endswith("MISSED by 17% (worst 3.50x)")


def test_read_allreduce_takes_the_old_records_and_refuses_other_files(tmp_path) -> None:
    old = ROOT / "benchmarks" / "results" / "2026-12-03-allreduce-cpu-2core.json"
    data = read_allreduce(str(old))
    assert data["source"] == str(old) and {r["processes"] for r in data["allreduce"]} == {2, 4}
    assert allreduce_goals(data)[0]["points"][1]["value"] is not None  # 2 processes, 16M
    bad = tmp_path / "bad.json"
    bad.write_text('{"something": 1}')
    with pytest.raises(FoldError, match="no 'allreduce' or 'step' list"):
        read_allreduce(str(bad))
    with pytest.raises(FoldError, match="cannot read"):
        read_allreduce(str(tmp_path / "missing.json"))


def test_a_bad_allreduce_json_is_refused_before_any_work(tmp_path, monkeypatch, capsys) -> None:
    def no_work(*args, **kwargs):
        raise AssertionError("bench started measuring although the input was refused")

    monkeypatch.setattr(bench, "run", no_work)
    argv = ["bench", "--allreduce-json", str(tmp_path / "nope.json"), "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "cannot read the all-reduce results" in capsys.readouterr().err


def test_goal_7_is_the_earlier_verdicts() -> None:
    earlier = {
        "issue10": [{"key": k, "met": True, "worst": 0.5, "unit": "x"}
                    for k in ("rows", "rows-new-plan", "half", "float64", "seed")]
        + [{"key": "memory", "met": True, "worst": 30.0, "unit": "B/entry"}],
        "steps": {"graph": {"met": True}}, "compiled_steps": {"graph": {"met": True}},
    }  # fmt: skip
    assert kept_goal(earlier)["met"] is True
    earlier["issue10"][2]["met"] = False  # half lost
    kept = kept_goal(earlier)
    assert kept["met"] is False
    line = sweep_goal_lines([kept])[0]
    assert "issue 10 goal 3, float16 and bfloat16: MISSED (worst 0.50x)" in line
    assert "memory per entry: met (worst 30.0 B)" in line and line.endswith("→ MISSED")
    del earlier["steps"]
    earlier["issue10"][2]["met"] = True
    assert kept_goal(earlier)["met"] is None  # the steps were not measured


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
def test_the_goal_sweeps_run_end_to_end(tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "allreduce.json").write_text(json.dumps(ALLREDUCE))  # found in the output folder
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
    got = {g["key"]: g for g in res["goals"]["issue20"]}
    assert all(p["value"] is not None for p in got["oneshot"]["points"])
    assert all(p["value"] is not None for p in got["xla-rows"]["points"])
    assert got["load"]["points"][0]["value"] is not None
    assert got["large-k"]["met"] is None  # the k sweep did not run
    assert got["allreduce"]["met"] is False  # the folder's allreduce.json: 3.5x at 2 x 16M
    assert res["allreduce"]["source"].endswith("allreduce.json")
    summary = (out / "summary.md").read_text()
    assert "## Issue 20 goals" in summary and "## Under load" in summary
    assert "## One-shot folds" in summary and "## Folds of rows" in summary
    assert "- goal 1, one-shot bitfold.segment_sum" in summary
    assert "issue 20, goal 5," in text.getvalue()
    # the README's block takes the issue 20 section
    spec = importlib.util.spec_from_file_location(
        "readme_performance", ROOT / "benchmarks" / "readme_performance.py")  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    block = module.block_from_summary(summary, "x/summary.md")
    assert "### Issue 20 goals" in block and block.index("### Goals") < block.index("### Issue 20")
    # --from-json with another all-reduce file judges goal 6 again, measuring nothing
    better = tmp_path / "better.json"
    better.write_text(json.dumps({"allreduce": [
        {"processes": p, "elements": n, "float32_ms": 10.0, "exact_ms": 20.0}
        for p in (2, 4) for n in (4_000_000, 16_000_000)]}))  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["bench", "--from-json", str(out / "results.json"), "--allreduce-json",
                         str(better), "--skip", "plots"]) == 0  # fmt: skip
    again = (out / "summary.md").read_text()
    assert "exact all-reduce <= 3x a float32 all_reduce" in again
    line = next(x for x in again.splitlines() if "exact all-reduce <=" in x)
    assert line.endswith("→ met") and "better.json" in line
    rewritten = next(x for x in again.splitlines() if x.startswith("- rewritten by"))
    assert f"--from-json {out / 'results.json'} --allreduce-json {better}" in rewritten
    assert "rewritten by" not in summary  # a measured run says nothing of the kind
