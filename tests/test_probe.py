"""``bitfold probe`` on a tiny configuration: the four answers, the readout, the JSON."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from bitfold import cli
from bitfold.cli import probe
from bitfold.cli.probe_report import print_report, readout
from bitfold.repro.fingerprint import fingerprint

ROOT = Path(__file__).resolve().parents[1]

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
    assert " known answers: none to check here (the host's kernels are the reference" in text
    rep = json.loads(probe_run.read_text())
    assert rep["known_answers"]["backend"] == "host" and rep["known_answers"]["verdicts"] == []
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
    assert rep["q3_cost"]["rounds"] == 3 and all(len(row["round_ms"]) == 3 for row in cost.values())
    lo, hi = cost["bitfold exact"]["ratio_spread"]
    assert lo <= hi and rep["q3_cost"]["load"]["cores"] >= 1
    assert rep["q3_cost"]["forward_matmul_ms"] > 0
    assert any("CPU only" in line for line in rep["readout"])
    q2 = rep["q2_fixed_order"]  # every fold against the exact sum; the earlier keys are kept
    diffs = q2["differences_from_exact"]
    assert set(diffs) == {"bitfold ordered", "bitfold atomic", *rep["q1_nondeterminism"]}
    assert diffs["bitfold atomic"] == q2["exact"]["max_difference_from_atomic"]


def test_probe_training_reproduces_the_hashed_layer_model_with_exact_digests(probe_run):
    rep = json.loads(probe_run.read_text())
    # atomic (np.add.at) is sequential on the CPU: it equals ordered bit for bit
    assert rep["q4_training"]["atomic"]["digests"] == rep["q4_training"]["ordered"]["digests"]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--K", "0"], "--K must be at least 1"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--lr", "inf"], "--lr must be positive and finite; got inf"),
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


# --------------------------------------------------------------------------- the readout
USUAL = ("np.add.at", "torch autograd v[idx]", "torch index_add_", "torch scatter_add_")


def _report(noisy: tuple[str, ...] = (), parted: tuple[str, ...] = (), exact_ms: float = 2.0,
            skipped: bool = False) -> dict:  # fmt: skip
    """A hand-made probe report: ``noisy`` usual folds differed, ``parted`` training runs did."""
    q1 = {n: {"repeats": 5, "differed": 5 if n in noisy else 0,
              "distinct_results": 6 if n in noisy else 1,
              "max_difference": 2.5e-4 if n in noisy else 0.0, "note": ""}
          for n in USUAL}  # fmt: skip
    fixed = {"first_call_s": 0.01, "bit_identical": True, "repeats": 5, "differed": 0,
             "distinct_results": 1, "max_difference": 0.0, "fold_peak_bytes": 0,
             "extra_bytes": 1e6, "max_difference_from_atomic": 0.0, "digest": "sha256:" + "1" * 64}
    q2 = {"plan_build_s_first": 0.5, "plan_build_s": 0.001, "plan_bytes": 1e6,
          "ordered": dict(fixed), "exact": dict(fixed, digest="sha256:" + "2" * 64),
          "differences_from_exact": {"bitfold ordered": 6.4e-4, "bitfold atomic": 6.4e-4,
                                     **{n: 6.4e-4 for n in USUAL}}}  # fmt: skip
    per_call = {n: {"median_ms": ms, "first_call_ms": ms, "ratio_to_atomic": ms / 4.0}
                for n, ms in (("bitfold atomic", 4.0), ("bitfold ordered", 1.5),
                              ("bitfold exact", exact_ms), *((n, 4.0) for n in USUAL))}  # fmt: skip
    q4 = {n: {"bit_identical": n not in parted, "max_difference": 7e-9 if n in parted else 0.0,
              "digests": ["sha256:" + ("2" if n == "exact" else "1") * 64] * 2}
          for n in ("atomic", "ordered", "exact", "torch autograd")}  # fmt: skip
    rep = {"config": {"device": "cpu", "steps": 10}, "q1_nondeterminism": q1,
           "q2_fixed_order": q2, "q4_training": q4, "skipped_baselines": ["torch"] if skipped
           else [], "q3_cost": {"atomic_baseline": "np.add.at", "per_call": per_call,
                                "forward_matmul_ms": 5.0}}  # fmt: skip
    return rep


def test_readout_names_the_folds_that_were_identical_when_none_differed():
    head, training, *_ = readout(_report())
    assert head.startswith("NONE OF THE USUAL FOLDS GAVE DIFFERENT BITS HERE")
    assert ("HERE: np.add.at, torch autograd v[idx], torch index_add_ and torch scatter_add_ gave "
            "identical bits in all 5 repeats.") in head  # fmt: skip
    assert "two training runs of 10 steps" in training and "ended bit-identical" in training
    assert "nothing for bitfold to fix on this machine" in training


def test_readout_names_which_folds_differed_and_which_did_not():
    head, training, *_ = readout(_report(noisy=("torch autograd v[idx]",),
                                         parted=("torch autograd",)))  # fmt: skip
    assert head.startswith("SOME USUAL FOLDS GIVE DIFFERENT BITS FROM CALL TO CALL HERE")
    assert "torch autograd v[idx] (in 5 of 5 repeats, by up to 2.500e-04)" in head
    assert ("Identical bits in all 5 repeats: np.add.at, torch index_add_ and torch scatter_add_."
            in head)  # fmt: skip
    assert "ended with different weights when folding with torch autograd" in training
    assert "bit-identical with bitfold atomic, bitfold ordered and bitfold exact" in training
    head, training, *_ = readout(_report(noisy=USUAL))
    assert head.startswith("EVERY USUAL FOLD MEASURED HERE GAVE DIFFERENT BITS")
    assert "still ended bit-identical with every fold tried" in training


def test_readout_without_torch_says_what_was_not_measured():
    head = readout(_report(skipped=True))[0]
    assert head.startswith("NONE OF THE FOLDS MEASURED HERE GAVE DIFFERENT BITS")
    assert "PyTorch's were not measured" in head


def test_readout_says_why_the_exact_digest_differs_and_measures_from_the_exact_sum():
    exact = readout(_report())[2]
    assert "exact fold returns the correctly rounded sum" in exact
    assert "its digest differs by design from those of float sums" in exact
    assert "np.add.at's largest difference from the exact sum is 6.400e-04" in exact
    text = io.StringIO()
    rep = _report()
    rep.update(readout=readout(rep), machine=fingerprint(), backend="numpy (CPU)")
    rep["config"].update(D=8, hid=16, K=5, reps=5, batch=4, lr=1e-3)
    print_report(rep, text)
    out = text.getvalue()
    assert "from the atomic fold" not in out
    assert "each other fold's largest difference" in out and "the correctly rounded sum" in out
    assert "exact's digest differs from the others' by design" in out


@pytest.mark.parametrize(("exact_ms", "words"), [(2.0, "makes each step 2.000 ms shorter"),
                                                  (5.5, "adds 1.500 ms to each step")])  # fmt: skip
def test_readout_cost_in_plain_words(exact_ms, words):
    cost = readout(_report(exact_ms=exact_ms))[3]
    assert words in cost and f"the exact fold takes {exact_ms:.3f} ms a call" in cost
    assert "%" not in cost and "less a training step" not in cost


@pytest.mark.parametrize("load", [0.3, 5.2])
def test_readout_gives_the_spread_over_rounds_and_says_when_the_machine_was_busy(load):
    rep = _report(exact_ms=2.0)
    q3 = rep["q3_cost"]
    q3["rounds"] = 3
    q3["per_call"]["bitfold exact"]["ratio_spread"] = [0.35, 0.8]
    q3["load"] = {"cores": 2, "before": 0.2, "after": load}
    cost = readout(rep)[3]
    assert "from 0.35 to 0.80 times over 3 rounds in which the folds took turns" in cost
    busy = "The machine was busy (load average 5.2 on 2 cores)"
    assert (busy in cost) == (load > 1.5)
    text = io.StringIO()
    rep.update(readout=readout(rep), machine=fingerprint(), backend="numpy (CPU)")
    rep["config"].update(D=8, hid=16, K=5, reps=5, batch=4, lr=1e-3)
    print_report(rep, text)
    assert ("0.50x (0.35-0.80x)" in text.getvalue()) and ((busy in text.getvalue()) == (load > 1.5))


@pytest.mark.parametrize("case", [{}, {"noisy": USUAL, "parted": ("atomic",)}, {"skipped": True}])
def test_readout_never_uses_the_projects_jargon(case):
    for line in readout(_report(**case)):
        assert "the seed" not in line.lower() and "same seed" not in line.lower()


def test_a_measured_gpu_report_reads_in_the_same_sentences():
    """A report written before differences_from_exact existed still reads (the CUDA case)."""
    path = ROOT / "benchmarks" / "results" / "gpu-2026-12-04e-h200" / "probe_gpu.json"
    if not path.exists():
        pytest.skip("the GPU probe's results are not in this checkout")
    lines = readout(json.loads(path.read_text()))
    assert "cupyx.scatter_add (in 5 of 5 repeats" in lines[0]
    assert "folding with bitfold atomic" in lines[1]
    assert "This run folded on the GPU" in lines[-1]


def test_every_question_shows_progress(monkeypatch, capsys):
    """Each question opens a bar (on stderr, on a terminal only) and fills it."""
    bars: list[list] = []

    @contextlib.contextmanager
    def recording_bar(total, desc, enabled=True):
        bar = [desc, total, 0]
        bars.append(bar)

        class Bar:
            def tick(self, n=1):
                bar[2] += n

            def note(self, text):
                pass

        yield Bar()

    monkeypatch.setattr(probe, "progress_bar", recording_bar)
    assert cli.main(["probe", *TINY]) == 0
    assert [b[0][:3] for b in bars] == ["1/4", "2/4", "3/4", "4/4"]
    assert all(done == total > 0 for _, total, done in bars), bars
    assert capsys.readouterr().err == ""  # not a terminal: nothing on stderr
