"""``bitfold bench``: outputs and their schema, refusals before any work, failures recorded.

No timing assertions: these tests check what the benchmark writes and
records, on tiny inputs (``--scale``), never how fast anything is. The second
half covers which cases the rows, D, K and memory sweeps visit, that every
contender folds what it claims to fold (and skips the rest with a reason), and
what the report writes for rows and dtypes. The goals judged from the JSON are
``benchmarks/bench_goals.py``'s (``tests/test_bench_goals.py``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from bitfold import cli
from bitfold.cli.bench import cases as bench_cases
from bitfold.cli.bench import command as bench
from bitfold.cli.bench import startup as bench_startup
from bitfold.cli.bench import worker as bench_worker
from bitfold.cli.bench.cases import (
    D_SWEEP_VALUES,
    ROW_SHAPES,
    SEED_K,
    SEED_N,
    SWEEPS,
    build_cases,
    make_inputs,
    round_to_bfloat16,
)
from bitfold.cli.bench.contenders import (
    CONTENDERS,
    Contender,
    Inputs,
    OutOfMemory,
    PaddedScatter,
    Runner,
)

STATUSES = {"ok", "failed", "oom", "skipped"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, str]:
    """One small run through the CLI with memory and thread workers; shared by several tests."""
    out = str(tmp_path_factory.mktemp("bench") / "out")
    argv = [
        "bench", "--quick", "--scale", "0.002", "--repeats", "2",
        "--sweeps", "seed,skew,memory", "--contenders", "bitfold,numpy",
        "--memory-limit", "0.01", "--skip", "startup", "--out", out,
    ]  # fmt: skip
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(argv)
    assert rc == 0
    with open(os.path.join(out, "results.json")) as f:
        return out, json.load(f), buf.getvalue()


def test_results_json_schema(tiny_run: tuple[str, dict, str]) -> None:
    _, res, _ = tiny_run
    assert res["schema"] == bench.SCHEMA
    for key in ("date", "command", "settings", "machine", "sweeps", "cases", "results"):
        assert key in res, key
    assert "goals" not in res  # the bench measures; benchmarks/bench_goals.py judges
    m = res["machine"]
    assert m["cpu"] and m["cpu_affinity"] >= 1 and m["libraries"]["numpy"] == np.__version__
    assert res["command"].startswith("bitfold bench --quick")
    assert res["settings"]["baseline"] == "numpy-add-at"
    names = ["numpy-add-at", "bitfold-exact", "bitfold-exact-new-plan", "bitfold-ordered",
             "bitfold-atomic", "numpy-bincount", "fixed-scatter"]  # fmt: skip
    assert res["settings"]["contenders"] == names
    # every case has exactly one row per contender
    case_ids = [c["id"] for c in res["cases"]]
    assert len(res["results"]) == len(case_ids) * len(names)
    for c in res["cases"]:
        assert {r["contender"] for r in res["results"] if r["case"] == c["id"]} == set(names)
    for r in res["results"]:
        assert r["status"] in STATUSES
        if r["status"] != "ok":
            assert r["reason"]
            continue
        seed = "seed" in next(c["sweeps"] for c in res["cases"] if c["id"] == r["case"])
        assert 1 <= r["repeats"] == len(r["times_s"]) <= (2 * bench.SEED_EXTRA if seed else 2)
        assert r["min_s"] <= r["median_s"]
        assert r["median_s"] > 0 and r["first_call_s"] > 0
        has_setup = r["contender"] in ("bitfold-exact", "bitfold-ordered", "bitfold-atomic",
                                       "fixed-scatter")  # fmt: skip
        assert (r["setup_s"] >= 0) if has_setup else (r["setup_s"] is None)
        assert r["digest"].startswith("sha256:")
        assert isinstance(r["identical_repeats"], bool)
        assert r["ratio_to_baseline"] > 0 and r["bandwidth_gb_s"] > 0
        assert r["memory_status"] == "ok" and r["peak_bytes"] >= 0
        assert r["bytes_per_element"] == pytest.approx(
            r["peak_bytes"] / next(c["n"] for c in res["cases"] if c["id"] == r["case"])
        )
        assert r["threads_compared"][0] != r["threads_compared"][1]


def test_deterministic_contenders_agree_across_threads_and_repeats(
    tiny_run: tuple[str, dict, str],
) -> None:
    _, res, _ = tiny_run
    checked = 0
    for r in res["results"]:
        if r["contender"] in ("bitfold-exact", "bitfold-ordered") and r["status"] == "ok":
            assert r["identical_repeats"] is True
            assert r["identical_threads"] is True, r["case"]
            checked += 1
    assert checked == 2 * len(res["cases"])


def test_exact_is_the_yardstick(tiny_run: tuple[str, dict, str]) -> None:
    """bitfold-exact equals the float64 reference rounded to float32, so its gap is tiny."""
    _, res, _ = tiny_run
    for r in res["results"]:
        if r["contender"] == "numpy-bincount":  # float64 sums in index order
            assert r["max_abs_diff_vs_exact"] < 1e-9
        if r["contender"] == "bitfold-exact":
            assert r["max_abs_diff_vs_exact"] < 1e-5


def test_padded_scatter_over_the_limit_is_recorded_as_oom(
    tiny_run: tuple[str, dict, str],
) -> None:
    _, res, _ = tiny_run
    hot = [r for r in res["results"] if r["contender"] == "fixed-scatter" and ",hot," in r["case"]]
    assert hot and all(r["status"] == "oom" for r in hot)
    for r in hot:
        assert "memory limit" in r["reason"]
        assert r["oom_needed_bytes"] > res["settings"]["memory_limit_bytes"]
        # ... and the rest of that case still ran
        others = [x for x in res["results"] if x["case"] == r["case"] and x is not r]
        assert all(x["status"] == "ok" for x in others)


def test_files_plots_summary_and_table(tiny_run: tuple[str, dict, str]) -> None:
    out, _, stdout = tiny_run
    for name in ("seed_bars.png", "memory_vs_skew.png"):
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(8) == PNG_MAGIC
    # sweeps not run give no plot
    assert not os.path.exists(os.path.join(out, "time_vs_n.png"))
    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    assert "generated by `bitfold bench`" in summary
    assert "## The seed configuration" in summary and "`bitfold-exact`" in summary
    assert "![seed_bars.png](seed_bars.png)" in summary
    assert "## At a glance" in summary and "- At the seed configuration (N = 6,291" in summary
    assert "- Memory: a plan plus one exact fold of " in summary and "(zipf1.3) took " in summary
    assert "goal" not in summary.lower() and "goal" not in stdout.lower()
    assert "bitfold-exact" in stdout and "N = 6,291" in stdout
    assert "At the seed configuration" in stdout  # the table ends with the run at a glance


def test_training_steps_under_exact_mode_are_timed_against_plain_torch(
    tiny_run: tuple[str, dict, str],
) -> None:
    out, res, _ = tiny_run
    steps = res["steps"]
    assert steps["status"] == "ok", steps
    assert set(steps["models"]) == {"graph", "embedding-bag"}
    for name, m in steps["models"].items():
        assert set(m["median_s"]) == {"plain", "deterministic", "exact_mode"}
        assert all(len(t) == 7 and min(t) > 0 for t in m["times_s"].values()), name
        assert m["over_plain"]["plain"] == 1.0
        assert m["over_plain"]["exact_mode"] == m["median_s"]["exact_mode"] / m["median_s"]["plain"]
    # exact_mode saw the folds of each step: forward and backward of the graph, the bag backward
    graph = steps["models"]["graph"]["exact_mode_counts"]
    assert graph == {"scatter_add": 1, "index_add": 1, "index_put": 2}, graph
    assert steps["models"]["embedding-bag"]["exact_mode_counts"] == {
        "embedding_bag": 1, "embedding_bag_backward": 1}  # fmt: skip
    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    assert "## Training steps under exact_mode\n" in summary
    assert "- A training step of the graph model under `exact_mode`: " in summary


def test_compiled_training_steps_are_timed_against_torch_compile(
    tiny_run: tuple[str, dict, str],
) -> None:
    out, res, _ = tiny_run
    compiled = res["compiled_steps"]
    assert compiled["status"] == "ok", compiled
    assert set(compiled["models"]) == {"graph", "embedding-bag"}
    for name, m in compiled["models"].items():
        assert set(m["median_s"]) == {"compiled", "exact_compiled", "exact_mode"}
        assert all(len(t) == 7 and min(t) > 0 for t in m["times_s"].values()), name
        assert m["over_compiled"]["compiled"] == 1.0
    # the pass rewrote the folds of each compiled step (forward and backward graphs)
    assert compiled["models"]["graph"]["exact_counts"]["scatter_add"] >= 1
    assert compiled["models"]["embedding-bag"]["exact_counts"] == {
        "embedding_bag": 1, "embedding_bag_backward": 1}  # fmt: skip
    with open(os.path.join(out, "summary.md")) as f:
        summary = f.read()
    assert "## Compiled training steps: bitfold.torch.compile against torch.compile" in summary
    assert "- A training step of the graph model compiled by `bitfold.torch.compile`: " in summary


def test_from_json_rewrites_summary_without_measuring(
    tiny_run: tuple[str, dict, str], tmp_path, monkeypatch
) -> None:
    out, _, _ = tiny_run
    monkeypatch.setattr(bench, "run", _no_work)
    dest = str(tmp_path / "again")
    rc = cli.main(["bench", "--from-json", os.path.join(out, "results.json"), "--out", dest])
    assert rc == 0
    with open(os.path.join(out, "summary.md")) as a, open(os.path.join(dest, "summary.md")) as b:
        measured, rewritten = a.read().splitlines(), b.read().splitlines()
    # the same summary, and one line more saying it was rewritten, by what, measuring nothing
    said = [line for line in rewritten if line not in measured]
    assert len(rewritten) == len(measured) + 1 and len(said) == 1
    assert said[0].startswith("- rewritten by `bitfold bench --from-json ")
    assert [line for line in rewritten if line != said[0]] == measured
    assert os.path.exists(os.path.join(dest, "seed_bars.png"))


def _no_work(*args, **kwargs):
    raise AssertionError("bench started measuring although the input was refused")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--contenders", "bitfold-exact,nope"], ["'nope'", "bitfold-exact", "numpy-add-at"]),
        (["--sweeps", "seed", "big"], ["'big'", "seed", "skew"]),
        (["--skip", "everything"], ["'everything'", "startup"]),
        (["--repeats", "0"], ["--repeats", "0"]),
        (["--scale", "2"], ["--scale", "2"]),
        (["--memory-limit", "-1"], ["--memory-limit"]),
        (["--memory-limit", "inf"], ["--memory-limit", "finite", "inf"]),
        (["--device", "tpu"], ["'tpu'", "cpu", "cuda"]),
    ],
)
def test_bad_input_is_refused_before_any_work(
    argv: list[str], words: list[str], tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(bench, "run", _no_work)
    out = tmp_path / "out"
    assert cli.main(["bench", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bitfold bench: error:")
    for w in words:
        assert w in err, (w, err)
    assert not out.exists()  # nothing written either


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"schema": "bitfold-bench/1"}', ["damaged or incomplete", "'machine'", "'results'"]),
        ("{not json", ["is not JSON"]),
        ("[1, 2]", ["is not a bitfold bench results file"]),
    ],
    ids=["incomplete", "not-json", "foreign"],
)
def test_a_bad_from_json_file_is_refused_by_name(text, words, tmp_path, monkeypatch,
                                                 capsys) -> None:  # fmt: skip
    monkeypatch.setattr(bench, "run", _no_work)
    path = tmp_path / "results.json"
    path.write_text(text)
    assert cli.main(["bench", "--from-json", str(path), "--skip", "plots"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bitfold bench: error: --from-json {str(path)!r}")
    assert all(w in err for w in words) and "Traceback" not in err
    assert not (tmp_path / "summary.md").exists()


def test_unwritable_output_folder_is_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(bench, "run", _no_work)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert cli.main(["bench", "--quick", "--out", str(blocker / "results")]) == 2
    err = capsys.readouterr().err
    assert "cannot write the benchmark results" in err and "a-file" in err


def test_cuda_without_a_gpu_is_refused(tmp_path, monkeypatch, capsys) -> None:
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a CUDA GPU is available here; the refusal cannot be exercised")
    except ImportError:
        pass
    monkeypatch.setattr(bench, "run", _no_work)
    assert cli.main(["bench", "--device", "cuda", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU is available" in err and "--device cpu" in err


def test_missing_matplotlib_is_refused_unless_plots_are_skipped(
    tmp_path, monkeypatch, capsys
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "matplotlib" else real(n, *a)
    )
    monkeypatch.setattr(bench, "run", _no_work)
    assert cli.main(["bench", "--out", str(tmp_path / "o")]) == 2
    assert "bitfold[plot]" in capsys.readouterr().err


def _boom(inp):
    raise RuntimeError("this contender is broken on purpose")


def _hungry(inp):
    def call():
        raise MemoryError("cannot allocate 1 EiB")

    return Runner(call)


def _flaky(inp):
    calls = []

    def call():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("third call fails")
        return np.zeros(inp.k, np.float32)

    return Runner(call)


def test_a_failing_contender_is_recorded_and_the_rest_continues(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(
        CONTENDERS, "boom", Contender("boom", "numpy", ("cpu",), "none", "raises", _boom)
    )
    monkeypatch.setitem(
        CONTENDERS, "hungry", Contender("hungry", "numpy", ("cpu",), "none", "OOM", _hungry)
    )
    monkeypatch.setitem(
        CONTENDERS, "flaky", Contender("flaky", "numpy", ("cpu",), "none", "", _flaky)
    )
    out = tmp_path / "out"
    argv = ["bench", "--quick", "--scale", "0.001", "--repeats", "4", "--sweeps", "seed",
            "--contenders", "boom,hungry,flaky,numpy-bincount",
            "--skip", "memory,threads,startup,compiled",
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    with open(out / "results.json") as f:
        rows = {r["contender"]: r for r in json.load(f)["results"]}
    assert rows["boom"]["status"] == "failed"
    assert "RuntimeError: this contender is broken on purpose" in rows["boom"]["reason"]
    assert rows["hungry"]["status"] == "oom" and "1 EiB" in rows["hungry"]["reason"]
    assert rows["flaky"]["status"] == "failed" and "third call fails" in rows["flaky"]["reason"]
    for name in ("numpy-bincount", "numpy-add-at"):
        assert rows[name]["status"] == "ok" and rows[name]["repeats"] >= 3


# -- the parts -------------------------------------------------------------------------------
def test_seed_case_is_the_seed_experiments_own_draw() -> None:
    rng = np.random.default_rng(0)
    idx = rng.integers(0, SEED_K, SEED_N)
    g = rng.normal(size=SEED_N).astype(np.float32)
    got_idx, got_g = make_inputs({"n": SEED_N, "k": SEED_K, "skew": "uniform", "dtype": "float32"})
    assert np.array_equal(got_idx, idx)
    assert np.array_equal(got_g.view(np.uint32), g.view(np.uint32))


def test_skewed_indices() -> None:
    n, k = 20_000, 1000
    hot, _ = make_inputs({"n": n, "k": k, "skew": "hot", "dtype": "float32"})
    counts = np.bincount(hot, minlength=k)
    assert counts.max() == n // 2 and hot.min() >= 0 and hot.max() < k
    top = {}
    for skew in ("uniform", "zipf1.1", "zipf1.3"):
        idx, values = make_inputs({"n": n, "k": k, "skew": skew, "dtype": "float16"})
        assert values.dtype == np.float16 and idx.dtype == np.int64
        assert idx.min() >= 0 and idx.max() < k
        top[skew] = np.bincount(idx, minlength=k).max()
    assert top["uniform"] < top["zipf1.1"] < top["zipf1.3"]


def test_cases_are_shared_between_sweeps() -> None:
    cases = build_cases(list(SWEEPS), quick=False)
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    seed = next(c for c in cases if "seed" in c.sweeps)
    assert (seed.n, seed.k, seed.skew, seed.dtype) == (SEED_N, SEED_K, "uniform", "float32")
    assert {"seed", "n", "k", "dtype"} <= set(seed.sweeps)
    memory = [c for c in cases if "memory" in c.sweeps]
    zipf = [c for c in memory if (c.n, c.k, c.skew) == (3_000_000, 100_000, "zipf1.3")]
    assert len(zipf) == 1 and "skew" in zipf[0].sweeps


def test_padded_scatter_sums_every_bucket() -> None:
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 50, 5000)
    values = rng.integers(-8, 9, 5000).astype(np.float32)  # small integers: every sum is exact
    fs = PaddedScatter(idx, 60, np.float32, 1 << 30)
    got = fs(values)
    want = np.bincount(idx, weights=values, minlength=60).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert fs.width == np.bincount(idx).max()
    with pytest.raises(OutOfMemory, match="padded buffer"):
        PaddedScatter(idx, 60, np.float32, 100)


def test_max_abs_diff_is_the_whole_arrays_slice_by_slice(monkeypatch) -> None:
    from bitfold.cli.bench import measure as bench_measure

    monkeypatch.setattr(bench_measure, "DIFF_CHUNK", 7)  # several slices and a short last one
    rng = np.random.default_rng(3)
    got = rng.normal(size=(9, 5)).astype(np.float32)
    ref = got.astype(np.float64) + rng.normal(size=(9, 5)) * 1e-3
    want = float(np.max(np.abs(got.astype(np.float64) - ref)))
    assert bench_measure.max_abs_diff(got, ref) == want
    got[8, 4] = np.nan  # in the last slice: NaN, as np.max of the whole says
    assert np.isnan(bench_measure.max_abs_diff(got, ref))
    got[8, 4], got[0, 0] = 0.0, np.inf
    assert bench_measure.max_abs_diff(got, ref) == np.inf
    assert bench_measure.max_abs_diff(got[:0], ref[:0]) == 0.0


FAKE_WORKER = r"""
import json, os, sys
spec = json.load(open(sys.argv[-1]))
for number in spec["numbers"]:
    print("@@bitfold-bench " + json.dumps({"event": "start", "job": number}), flush=True)
    if number == 1 and not os.path.exists(sys.argv[-1] + ".died"):
        open(sys.argv[-1] + ".died", "w").close()
        os._exit(3)
    print("@@bitfold-bench " + json.dumps(
        {"event": "done", "job": number, "result": {"status": "ok", "n": number}}), flush=True)
"""


def test_a_dying_worker_costs_only_its_job(tmp_path, monkeypatch) -> None:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    monkeypatch.setattr(bench_worker, "WORKER_COMMAND", [sys.executable, str(script)])
    jobs = [{"case": {}, "contender": f"c{i}"} for i in range(4)]
    seen = []
    got = bench_worker.run_jobs(
        "digest", jobs, device="cpu", memory_limit=1, on_done=lambda i, r: seen.append(i)
    )
    assert got[1]["status"] == "failed" and "exit status 3" in got[1]["reason"]
    assert [got[i] for i in (0, 2, 3)] == [{"status": "ok", "n": i} for i in (0, 2, 3)]
    assert sorted(seen) == [0, 1, 2, 3]


def test_startup_runs_cold_then_warm_in_one_fresh_cache(monkeypatch) -> None:
    script = (
        "import json, os\n"
        "d = os.environ['NUMBA_CACHE_DIR']\n"
        "empty = not os.listdir(d)\n"
        "open(os.path.join(d, 'seen'), 'a').write('x')\n"
        "print('@@startup ' + json.dumps({'cache was empty': float(empty), 'dir': len(d)}))\n"
    )
    monkeypatch.setattr(bench_startup, "SCRIPT", script)
    got = bench_startup.measure_startup()
    assert got["status"] == "ok"
    assert got["cold"]["steps_s"]["cache was empty"] == 1.0
    assert got["warm"]["steps_s"]["cache was empty"] == 0.0
    assert got["cold"]["steps_s"]["dir"] == got["warm"]["steps_s"]["dir"]
    assert got["cold"]["process_s"] > 0


def test_startup_failure_is_recorded(monkeypatch) -> None:
    monkeypatch.setattr(bench_startup, "SCRIPT", "raise SystemExit('no numba here')")
    got = bench_startup.measure_startup()
    assert got["status"] == "failed" and "exit status 1" in got["reason"]


@pytest.mark.slow
def test_real_startup_probe_reports_every_step() -> None:
    """The real probe compiles every kernel in a fresh cache (about 15 s on 2 cores)."""
    got = bench_startup.measure_startup()
    assert got["status"] == "ok", got.get("reason")
    steps = set(got["cold"]["steps_s"])
    assert {"import bitfold", "plan (K=433)", "exact float32 (K=433)"} <= steps
    assert steps == set(got["warm"]["steps_s"])


def test_numba_allocations_are_seen_by_tracemalloc() -> None:
    """The memory gauge relies on it: arrays Numba allocates go through a traced allocator."""
    import tracemalloc

    from numba import njit

    @njit
    def scratch(n):
        a = np.zeros(n)
        a[:] = 1.0
        return a.sum()

    scratch(10)
    tracemalloc.start()
    try:
        assert scratch(2_000_000) == 2_000_000.0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak >= 16_000_000


def _allocating(lib: str):
    def make(inp):
        def call():
            if lib == "torch":
                import torch

                # 64 MB that tracemalloc cannot see; above glibc's largest mmap threshold
                scratch = torch.empty(16_000_000).fill_(1.0)
            else:
                scratch = np.ones(16_000_000, np.float32)  # 64 MB
            return np.zeros(inp.k, np.float32) + float(scratch[0])

        return Runner(call)

    return make


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_memory_gauge_sees_numpy_and_torch_allocations(lib: str, monkeypatch) -> None:
    if lib == "torch":
        pytest.importorskip("torch", reason="torch is not installed")
    if not bench_worker._reset_hwm():
        pytest.skip("this system cannot reset the resident set's high-water mark")
    from bitfold.cli.bench.contenders import Inputs

    name = f"alloc-{lib}"
    monkeypatch.setitem(
        CONTENDERS, name, Contender(name, "numpy", ("cpu",), "none", "", _allocating(lib))
    )
    inp = Inputs(np.zeros(10, np.int64), np.ones(10, np.float32), 4)
    got = bench_worker._memory_job(name, inp)
    assert got["status"] == "ok"
    assert got["peak_bytes"] >= 60_000_000
    if lib == "torch":
        assert got["peak_traced_bytes"] < 1_000_000 and got["peak_rss_bytes"] >= 60_000_000
    else:
        assert got["peak_traced_bytes"] >= 64_000_000


def test_what_each_contender_needs_on_cuda(monkeypatch) -> None:
    import importlib.util

    from bitfold.cli.bench.contenders import baseline_for

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "cupy" else real(n, *a)
    )
    assert "cpu only" in CONTENDERS["numpy-add-at"].unavailable("cuda")
    assert (
        CONTENDERS["fixed-scatter"].unavailable("cuda") == "cupy is not installed (needed on cuda)"
    )
    assert CONTENDERS["fixed-scatter"].unavailable("cpu") is None
    assert "cuda only" in CONTENDERS["cupy-scatter-add"].unavailable("cpu")
    assert baseline_for("cpu") == "numpy-add-at"
    assert baseline_for("cuda") == "torch-scatter-add"  # cupy missing: torch's atomic scatter


# -- rows, K up to 10^7, bfloat16, the peers of rows ---------------------------------------
ROOT = Path(__file__).resolve().parents[1]
#: A committed full run: its cases must still be built as they were.
OLD_RESULTS = ROOT / "benchmarks" / "results" / "2026-12-04-full-cpu-2core" / "results.json"


# -- cases -----------------------------------------------------------------------------------
def test_the_cases_of_earlier_runs_keep_their_ids_and_specs() -> None:
    """Old results stay comparable: every case of a committed full run is still built as it was,
    and a scalar case's spec and id carry no row width."""
    with open(OLD_RESULTS) as f:
        old = json.load(f)["cases"]
    new = {c.id: c for c in build_cases(list(SWEEPS), quick=False)}
    assert any(c.get("d") for c in old) and any(not c.get("d") for c in old)
    for case in old:
        assert case["id"] in new, case["id"]
        spec = new[case["id"]].spec
        keys = ("n", "k", "skew", "dtype", "d") if case.get("d") else ("n", "k", "skew", "dtype")
        assert spec == {k: case[k] for k in keys}
        assert ("d" in spec) == bool(case.get("d"))


def test_rows_d_k_and_memory_sweeps() -> None:
    full = build_cases(list(SWEEPS), quick=False)
    rows = [c for c in full if "rows" in c.sweeps]
    uniform = {(c.n, c.d, c.k) for c in rows if c.skew == "uniform"}
    assert uniform == set(ROW_SHAPES)
    assert any(c.skew == "zipf1.3" for c in rows)
    assert all(c.kind == "rows" and c.spec["d"] == c.d for c in rows)
    d = [c for c in full if "d" in c.sweeps]
    assert {c.d for c in d} >= {1, 768} and all(c.n * c.d <= D_SWEEP_VALUES for c in d)
    assert all(D_SWEEP_VALUES - c.n * c.d < c.d for c in d)  # N x D as fixed as D allows
    assert max(c.k for c in full if "k" in c.sweeps) == 10_000_000
    memory = [c for c in full if "memory" in c.sweeps]
    assert {(c.skew, c.k) for c in memory} >= {
        (s, k) for s in ("uniform", "zipf1.3", "hot") for k in (100_000, 10_000_000)
    }
    quick = build_cases(list(SWEEPS), quick=True)
    assert max(c.k for c in quick if "k" in c.sweeps) <= 1_000_000
    assert {c.dtype for c in quick if "dtype" in c.sweeps} == set(bench_cases.DTYPES)
    assert "bfloat16" in bench_cases.DTYPES


def test_a_case_of_rows_has_its_own_id_and_sizes() -> None:
    c = bench_cases.Case(1000, 50, "uniform", "float32", d=8)
    s = bench_cases.Case(1000, 50, "uniform", "float32")
    assert c.id == "n=1000,d=8,k=50,uniform,float32" and s.id == "n=1000,k=50,uniform,float32"
    assert c.output_bytes == 50 * 8 * 4 and s.output_bytes == 50 * 4
    assert c.min_bytes == 1000 * (8 * 4 + 4) + 50 * 8 * 4
    assert bench_cases.Case(10, 5, "uniform", "bfloat16").value_itemsize == 2
    assert bench_cases.Case(10, 5, "uniform", "float64", d=3).output_bytes == 5 * 3 * 8


def test_rows_share_the_scalar_index_draw() -> None:
    spec = {"n": 5000, "k": 300, "skew": "zipf1.3", "dtype": "float32"}
    idx, v = make_inputs(spec)
    idx_rows, rows = make_inputs({**spec, "d": 7})
    assert np.array_equal(idx, idx_rows)
    assert v.shape == (5000,) and rows.shape == (5000, 7) and rows.dtype == np.float32


def test_bfloat16_values_are_bfloat16_numbers_held_in_float32() -> None:
    spec = {"n": 4000, "k": 10, "skew": "uniform", "dtype": "bfloat16"}
    _, v = make_inputs(spec)
    _, v32 = make_inputs({**spec, "dtype": "float32"})
    assert v.dtype == np.float32
    assert not np.any(v.view(np.uint32) & 0xFFFF)  # only bfloat16's 8 bits of precision
    assert np.all(np.abs(v - v32) <= np.abs(v32) * 2.0**-8)
    # to nearest, ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    halves = np.array([1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-8)], np.float32)
    want = np.array([1.0, 1 + 2**-6, 1 + 2**-7, -1.0], np.float32)
    assert np.array_equal(round_to_bfloat16(halves), want)
    torch = pytest.importorskip("torch")
    same = torch.from_numpy(v32).to(torch.bfloat16).float().numpy()
    assert np.array_equal(round_to_bfloat16(v32).view(np.uint32), same.view(np.uint32))


# -- contenders ------------------------------------------------------------------------------
SERVED = [("scalar", "float32"), ("rows", "float32"), ("scalar", "bfloat16"),
          ("rows", "float64"), ("scalar", "float16")]  # fmt: skip
_TOL = {"float16": 0.05, "bfloat16": 2.0, "float32": 1e-4, "float64": 1e-10}


@pytest.mark.parametrize(("kind", "dtype"), SERVED)
@pytest.mark.parametrize("name", list(CONTENDERS))
def test_every_contender_folds_what_it_serves_and_says_why_not(
    name: str, kind: str, dtype: str
) -> None:
    c = CONTENDERS[name]
    spec = {"n": 600, "k": 40, "skew": "zipf1.3", "dtype": dtype, **({"d": 3} if kind == "rows"
                                                                        else {})}  # fmt: skip
    inp = Inputs.from_spec(spec)
    assert (inp.kind, inp.dtype) == (kind, dtype)
    why = c.unavailable("cpu", kind, dtype)
    served = "cpu" in c.devices and kind in c.kinds and dtype in c.dtypes
    if not served:
        assert why, f"{name} neither serves {kind} {dtype} nor says why"
        if "cpu" not in c.devices:
            assert "not on cpu" in why
        elif kind not in c.kinds:
            assert ("not rows" if kind == "rows" else "not scalars") in why
        else:
            assert f"not {dtype}" in why
        return
    if why:  # served, but its library is missing here
        assert "not installed" in why
        pytest.skip(why)
    runner = c.make(inp)
    runner.setup()
    from bitfold.arrays import to_numpy

    got = to_numpy(runner.call()).astype(np.float64)
    want = np.zeros((40, *inp.trailing))
    np.add.at(want, inp.idx, inp.values.astype(np.float64))
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= _TOL[dtype], name
    if name == "bitfold-exact":
        from bitfold.backends.host import ROUTES

        assert runner.info["route"] in ROUTES
        assert (runner.info["route"] == "buckets") == (kind == "rows")


def test_the_numpy_peers_skip_bfloat16_and_the_rows_peers_are_there() -> None:
    for name in ("numpy-add-at", "numpy-bincount", "fixed-scatter", "numpy-groupies"):
        assert "NumPy has no bfloat16" in CONTENDERS[name].unavailable("cpu", "scalar", "bfloat16")
    for name in ("torch-index-add", "torch-index-add-det", "torch-scatter-add", "torch-embedding",
                 "numpy-add-at", "jax-segment-sum", "numpy-groupies", "bitfold-exact",
                 "bitfold-exact-new-plan"):  # fmt: skip
        assert "rows" in CONTENDERS[name].kinds, name
    assert "an embedding looks up rows" in CONTENDERS["torch-embedding"].unavailable("cpu")
    assert "1-d weights" in CONTENDERS["numpy-bincount"].unavailable("cpu", "rows", "float32")


def test_the_plan_in_the_call_contender_builds_nothing_ahead() -> None:
    inp = Inputs.from_spec({"n": 300, "k": 20, "skew": "uniform", "dtype": "float32", "d": 2})
    runner = CONTENDERS["bitfold-exact-new-plan"].make(inp)
    assert runner.build is None
    first, second = runner.call(), runner.call()
    assert np.array_equal(first.view(np.uint32), second.view(np.uint32))


# -- report ----------------------------------------------------------------------------------
TINY = {
    "rows": ("tiny rows", [(300, 2000, "uniform", "float32", 16)],
             [(300, 2000, "uniform", "float32", 16)]),
    "dtype": ("tiny dtypes", [(2000, 50, "uniform", d) for d in ("float32", "bfloat16")],
              [(2000, 50, "uniform", d) for d in ("float32", "bfloat16")]),
}  # fmt: skip


def test_report_of_rows_and_dtypes(tmp_path, monkeypatch) -> None:
    for name, sweep in TINY.items():
        monkeypatch.setitem(SWEEPS, name, sweep)
    out = tmp_path / "out"
    argv = ["bench", "--quick", "--repeats", "2", "--sweeps", "rows,dtype",
            "--contenders", "bitfold-exact,bitfold-exact-new-plan,torch-index-add,"
            "torch-scatter-add,numpy-bincount", "--skip", "memory,threads,startup,steps,compiled",
            "--out", str(out)]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(argv) == 0
    with open(out / "results.json") as f:
        res = json.load(f)
    rows_case = next(c for c in res["cases"] if "rows" in c["sweeps"])
    assert rows_case["d"] == 16 and rows_case["kind"] == "rows"
    assert rows_case["output_bytes"] == 2000 * 16 * 4
    by = {(r["case"], r["contender"]): r for r in res["results"]}
    assert by[rows_case["id"], "bitfold-exact"]["route"] == "buckets"
    assert by[rows_case["id"], "numpy-bincount"]["status"] == "skipped"
    bf16 = next(c for c in res["cases"] if c["dtype"] == "bfloat16")
    assert by[bf16["id"], "numpy-add-at"]["status"] == "skipped"  # the baseline, too
    assert by[bf16["id"], "bitfold-exact"]["status"] == "ok"
    assert by[bf16["id"], "bitfold-exact"]["max_abs_diff_vs_exact"] < 1e-4
    summary = (out / "summary.md").read_text()
    assert "## Folds of rows: median time (ms)" in summary
    assert "300 x 16 → 2,000 uniform" in summary
    assert "`bitfold-exact` took the exact route: 300 x 16 → 2,000 uniform: buckets" in summary
    assert "not bfloat16 (NumPy has no bfloat16)" in summary  # the skip is visible
    for png in ("rows_bars.png", "dtype_bars.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
        assert f"![{png}]({png})" in summary
    assert not os.path.exists(out / "time_vs_k.png")  # the k sweep did not run
