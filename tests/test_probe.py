"""``bitfold probe`` on a tiny configuration: the four answers, the readout, the JSON."""

from __future__ import annotations

import json

import pytest

from bitfold import cli

TINY = ["--D", "16", "--hid", "32", "--K", "7", "--reps", "2", "--steps", "3", "--batch", "4"]


@pytest.fixture(scope="module")
def probe_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("probe") / "probe.json"
    return path


def test_probe_prints_four_answers_and_writes_json(probe_run, capsys):
    assert cli.main(["probe", *TINY, "--json", str(probe_run)]) == 0
    text = capsys.readouterr().out
    for heading in (
        "1. IS THE USUAL SCATTER",
        "2. ARE BITFOLD",
        "3. WHAT DOES IT COST",
        "4. DOES A TRAINING RUN",
        "READOUT",
    ):
        assert heading in text
    rep = json.loads(probe_run.read_text())
    assert rep["config"]["K"] == 7 and rep["config"]["steps"] == 3
    q1 = rep["q1_nondeterminism"]["np.add.at"]
    assert q1["repeats"] == 2 and q1["differed"] == 0
    for s in ("ordered", "exact"):
        assert rep["q2_fixed_order"][s]["bit_identical"] is True
        assert rep["q4_training"][s]["bit_identical"] is True
        d1, d2 = rep["q4_training"][s]["digests"]
        assert d1 == d2 and d1.startswith("sha256:")
    cost = rep["q3_cost"]["per_call"]
    assert rep["q3_cost"]["atomic_baseline"] == "np.add.at"
    assert cost["np.add.at"]["ratio_to_atomic"] == pytest.approx(1.0)
    assert {"bitfold exact", "bitfold ordered", "bitfold atomic"} <= set(cost)
    assert all(row["median_ms"] > 0 for row in cost.values())
    assert rep["q3_cost"]["forward_matmul_ms"] > 0
    assert any("CPU only" in line for line in rep["readout"])


def test_probe_training_reproduces_the_seed_model_with_exact_digests(probe_run):
    rep = json.loads(probe_run.read_text())
    # atomic (np.add.at) is sequential on the CPU: it equals ordered bit for bit
    assert rep["q4_training"]["atomic"]["digests"] == rep["q4_training"]["ordered"]["digests"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--K", "0"], "--K must be at least 1"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--seed", "-1"], "--seed must be an integer"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--device", "cuda"], "--device cuda needs a CUDA device"),
        (["--json", "/nonexistent-dir/x.json"], "cannot write --json"),
    ],
)
def test_probe_refuses_bad_input_before_any_work(args, words, capsys):
    assert cli.main(["probe", *TINY, *args]) == 2
    assert words in capsys.readouterr().err


def test_probe_without_torch_says_what_it_did_not_measure(capsys):
    assert cli.main(["probe", *TINY, "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "not measured" in out and "--no-torch" in out
    assert "PyTorch's were not measured" in out
