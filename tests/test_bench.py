"""``bitfold bench``: outputs and their schema, refusals before any work, failures recorded.

No timing assertions: these tests check what the benchmark writes and
records, on tiny inputs (``--scale``), never how fast anything is.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from bitfold import cli
from bitfold.cli.bench import command as bench
from bitfold.cli.bench import startup as bench_startup
from bitfold.cli.bench import worker as bench_worker
from bitfold.cli.bench.cases import SEED_K, SEED_N, SWEEPS, build_cases, make_inputs
from bitfold.cli.bench.contenders import CONTENDERS, Contender, OutOfMemory, PaddedScatter, Runner

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
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(argv)
    assert rc == 0
    with open(os.path.join(out, "results.json")) as f:
        return out, json.load(f), buf.getvalue()


def test_results_json_schema(tiny_run: tuple[str, dict, str]) -> None:
    _, res, _ = tiny_run
    assert res["schema"] == bench.SCHEMA
    for key in ("date", "command", "settings", "machine", "sweeps", "cases", "results", "goals"):
        assert key in res, key
    m = res["machine"]
    assert m["cpu"] and m["cpu_affinity"] >= 1 and m["libraries"]["numpy"] == np.__version__
    assert res["command"].startswith("bitfold bench --quick")
    assert res["settings"]["baseline"] == "numpy-add-at"
    names = ["numpy-add-at", "bitfold-exact", "bitfold-ordered", "bitfold-atomic",
             "numpy-bincount", "fixed-scatter"]  # fmt: skip
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
        seed = r["case"] == res["goals"]["seed"]["case"]
        assert 1 <= r["repeats"] == len(r["times_s"]) <= (2 * bench.SEED_EXTRA if seed else 2)
        assert r["min_s"] <= r["median_s"]
        assert r["median_s"] > 0 and r["first_call_s"] > 0
        has_setup = r["contender"].startswith("bitfold-") or r["contender"] == "fixed-scatter"
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
    assert len(hot) == 1 and hot[0]["status"] == "oom"
    assert "memory limit" in hot[0]["reason"]
    assert hot[0]["oom_needed_bytes"] > res["settings"]["memory_limit_bytes"]
    # ... and the rest of that case still ran
    others = [r for r in res["results"] if r["case"] == hot[0]["case"] and r is not hot[0]]
    assert all(r["status"] == "ok" for r in others)


def test_files_plots_summary_and_table(tiny_run: tuple[str, dict, str]) -> None:
    out, res, stdout = tiny_run
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
    assert "Zipf(1.3) memory" in summary
    assert "bitfold-exact" in stdout and "N = 6,291" in stdout
    assert res["goals"]["memory"]["bytes_per_element"] > 0


def test_from_json_rewrites_summary_without_measuring(
    tiny_run: tuple[str, dict, str], tmp_path, monkeypatch
) -> None:
    out, _, _ = tiny_run
    monkeypatch.setattr(bench, "run", _no_work)
    dest = str(tmp_path / "again")
    rc = cli.main(["bench", "--from-json", os.path.join(out, "results.json"), "--out", dest])
    assert rc == 0
    with open(os.path.join(out, "summary.md")) as a, open(os.path.join(dest, "summary.md")) as b:
        assert a.read() == b.read()
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
            "--contenders", "boom,hungry,flaky,numpy-bincount", "--skip", "memory,threads,startup",
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
    memory = next(c for c in cases if "memory" in c.sweeps)
    assert (memory.n, memory.k, memory.skew) == (3_000_000, 100_000, "zipf1.3")
    assert "skew" in memory.sweeps


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
