"""``bitfold train``: a tiny configuration end to end through the command line."""

from __future__ import annotations

import importlib.util
import json

import pytest

from bitfold import cli

pytest.importorskip("torch", reason="bitfold train needs PyTorch (the 'torch' extra)")
pytest.importorskip("sklearn", reason="bitfold train needs scikit-learn (the 'train' extra)")

TINY = ["train", "--epochs", "1", "--hidden", "32", "--buckets", "64", "--batch", "64"]
RUN_FIELDS = {"strategy", "run", "final_loss", "test_accuracy", "seconds_per_epoch", "digest"}


def test_tiny_training_json(tmp_path, capsys):
    out = tmp_path / "train.json"
    assert cli.main([*TINY, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert [(r["strategy"], r["run"]) for r in runs] == [
        (s, i) for s in ("exact", "ordered", "atomic", "autograd") for i in (1, 2)
    ]
    for r in runs:
        assert RUN_FIELDS <= set(r)
        assert r["digest"].startswith("sha256:") and len(r["digest"]) == 71
        assert 0.0 < r["final_loss"] < 10.0 and 0.0 <= r["test_accuracy"] <= 1.0
        assert r["seconds_per_epoch"] > 0
    summaries = result["strategies"]
    assert set(summaries) == {"exact", "ordered", "atomic", "autograd"}
    for s in summaries.values():
        assert {"bit_identical", "accuracy_difference", "max_param_difference"} <= set(s)
    for name in ("exact", "ordered"):
        assert summaries[name]["bit_identical"] is True
        assert summaries[name]["max_param_difference"] == 0.0
        a, b = (r["digest"] for r in runs if r["strategy"] == name)
        assert a == b
    exact = next(r for r in runs if r["strategy"] == "exact")
    ordered = next(r for r in runs if r["strategy"] == "ordered")
    assert exact["digest"] != ordered["digest"]  # different roundings, different bits
    assert "baseline_accuracy_difference" in result
    assert result["config"]["epochs"] == 1 and result["environment"]["threads"]["torch"] >= 1
    printed = capsys.readouterr().out
    assert "bit-identical" in printed and "exact" in printed


def test_threads_option_and_strategy_subset(tmp_path):
    out = tmp_path / "t.json"
    args = [*TINY, "--strategies", "exact", "--repeats", "3", "--threads", "1", "--json", str(out)]
    assert cli.main(args) == 0
    result = json.loads(out.read_text())
    assert result["environment"]["threads"]["torch"] == 1
    assert len(result["runs"]) == 3 and result["strategies"]["exact"]["bit_identical"] is True
    assert result["baseline_accuracy_difference"] is None


def test_json_to_stdout_is_the_json_alone(capsys):
    assert cli.main([*TINY, "--strategies", "ordered", "--json", "-"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["strategies"]["ordered"]["bit_identical"] is True
    assert "bit-identical" in captured.err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--strategies", "exact,fast"], "unknown strategy 'fast'"),
        (["--strategies", "bogus"], "choose from: exact, atomic, ordered, autograd"),
        (["--strategies", ","], "--strategies is empty"),
        (["--lr", "inf"], "--lr must be positive and finite; got inf"),
        (["--epochs", "0"], "--epochs must be a positive integer"),
        (["--seed", "-1"], "--seed must be an integer"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--json", "/nonexistent-dir/x.json"], "cannot write --json"),
        (["--record", "/proc/version/runs"], "cannot make that folder"),
    ],
)
def test_bad_options_are_refused(extra, message, capsys):
    assert cli.main([*TINY, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_cuda_without_a_gpu_is_refused(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present; the refusal applies to machines without one")
    assert cli.main([*TINY, "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("bitfold.repro.manifest") is None,
    reason="bitfold.repro.manifest is not in this build",
)
def test_record_writes_one_manifest_per_run(tmp_path):
    rec = tmp_path / "runs"
    assert cli.main([*TINY, "--strategies", "exact", "--record", str(rec)]) == 0
    files = sorted(p.name for p in rec.iterdir())
    assert files == ["digits-exact-run1.jsonl", "digits-exact-run2.jsonl"]
    lines = [[json.loads(line) for line in (rec / f).read_text().splitlines()] for f in files]
    steps = [[r for r in run if r["kind"] == "step"] for run in lines]
    assert len(steps[0]) == 23  # 1437 training images in batches of 64
    names = [name for name, _ in steps[0][0]["tensors"]]
    assert names[0].startswith("grad/") and names[-1].startswith("param/")
    assert [s["tensors"] for s in steps[0]] == [s["tensors"] for s in steps[1]]


def test_hashed_layer_model_two_steps(tmp_path):
    out = tmp_path / "seed.json"
    args = ["train", "--model", "seed", "--steps", "2", "--strategies", "exact", "--json", str(out)]
    assert cli.main(args) == 0
    result = json.loads(out.read_text())
    assert result["strategies"]["exact"]["bit_identical"] is True
    assert all(r["test_accuracy"] is None for r in result["runs"])


def test_the_digits_are_scikit_learns_without_importing_it(monkeypatch):
    """The digits come from scikit-learn's CSV without its import (0.7 s on every rank), the
    same arrays as ``load_digits``; where the file is not, scikit-learn's own loader reads them."""
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits

    from bitfold.cli import train_models

    want_X, want_y = load_digits(return_X_y=True)
    X, y = train_models._digits()
    assert X.dtype == want_X.dtype and X.tobytes() == want_X.tobytes()
    assert y.dtype == want_y.dtype and y.tobytes() == want_y.tobytes()
    code = ("import sys; from bitfold.cli import train_models as t; t._digits(); "
            "print('sklearn' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    monkeypatch.setattr(train_models.Path, "is_file", lambda self: False)  # another layout
    X, y = train_models._digits()
    assert X.tobytes() == want_X.tobytes() and np.array_equal(y, want_y)
