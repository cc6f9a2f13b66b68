"""Run manifests (bitfold.repro.manifest) and ``bitfold diff``."""

from __future__ import annotations

import json

import numpy as np
import pytest

import bitfold
from bitfold import cli
from bitfold.errors import FoldError, FoldTypeError
from bitfold.repro.manifest import FORMAT, VERSION, compare, read_manifest, record


def _arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "b": rng.standard_normal(3).astype(np.float32),
        "idx": rng.integers(0, 7, size=5),
    }


def _write_run(path, steps=4, change=None, names=("w", "b", "idx"), meta=None):
    """A manifest of ``steps`` steps; ``change=(step, name)`` flips one bit of that tensor."""
    base = _arrays()
    with record(path, meta) as rec:
        for s in range(steps):
            tensors = {}
            for n in names:
                a = base[n] + s if n in base else np.full(2, s, np.float32)
                if change == (s, n):
                    a = a.copy()
                    a.view(np.uint8)[0] ^= 1
                tensors[n] = a
            rec.log(s, tensors, meta={"loss": float(s) / 3})
    return path


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- writing
def test_manifest_records_tagged_header_steps_and_end(tmp_path):
    arrays = _arrays()
    with record(tmp_path / "run.jsonl", {"seed": 7}) as rec:
        rec.log(0, arrays, meta={"loss": np.float32(0.5), "lr": 1e-3})
        rec.log(1, {"b": arrays["b"], "w": arrays["w"]})
    lines = _lines(tmp_path / "run.jsonl")
    assert [r["kind"] for r in lines] == ["header", "step", "step", "end"]
    assert all(r["format"] == FORMAT and r["version"] == VERSION for r in lines)
    assert lines[0]["meta"] == {"seed": 7}
    assert lines[1]["tensors"] == [[n, bitfold.digest(a)] for n, a in arrays.items()]
    assert lines[1]["meta"] == {"loss": 0.5, "lr": 1e-3}
    # recorded order is the order given, not sorted
    assert [n for n, _ in lines[2]["tensors"]] == ["b", "w"]
    assert "meta" not in lines[2]
    end = lines[3]
    assert (end["kind"], end["records"]) == ("end", 2)
    assert end["threads"]["numba_max"] == lines[0]["env"]["threads"]["numba_max"]
    assert "error" not in end


def test_digest_is_taken_when_logged(tmp_path):
    a = np.arange(6, dtype=np.float32)
    before = bitfold.digest(a)
    with record(tmp_path / "r.jsonl") as rec:
        rec.log(0, {"a": a})
        a += 1  # in-place update after logging, as an optimizer step does
    assert _lines(tmp_path / "r.jsonl")[1]["tensors"] == [["a", before]]
    assert before != bitfold.digest(a)


def test_non_finite_metadata_is_plain_json(tmp_path):
    with record(tmp_path / "r.jsonl") as rec:
        rec.log(0, {}, meta={"loss": float("nan"), "hi": float("inf"), "lo": -np.inf})
    text = (tmp_path / "r.jsonl").read_text()
    assert "NaN," not in text and "Infinity," not in text  # no bare JSON extensions
    assert _lines(tmp_path / "r.jsonl")[1]["meta"] == {
        "loss": "NaN", "hi": "Infinity", "lo": "-Infinity"
    }


def test_exception_in_block_is_recorded_and_propagates(tmp_path):
    with pytest.raises(RuntimeError, match="boom"), record(tmp_path / "r.jsonl") as rec:
        rec.log(0, _arrays())
        raise RuntimeError("boom")
    end = _lines(tmp_path / "r.jsonl")[-1]
    assert end["kind"] == "end" and end["records"] == 1
    assert end["error"] == "RuntimeError: boom"


def test_plain_object_close_is_idempotent_and_final(tmp_path):
    rec = record(tmp_path / "r.jsonl")
    rec.log(0, {"x": np.zeros(2)})
    rec.close()
    rec.close()
    assert rec.closed
    with pytest.raises(FoldError, match="closed"):
        rec.log(1, {"x": np.zeros(2)})
    assert [r["kind"] for r in _lines(tmp_path / "r.jsonl")] == ["header", "step", "end"]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda r: r.log(1.5, {}), FoldTypeError, "step must be an int"),
        (lambda r: r.log(True, {}), FoldTypeError, "step must be an int"),
        (lambda r: r.log(0, [np.zeros(1)]), FoldTypeError, "mapping"),
        (lambda r: r.log(0, {1: np.zeros(1)}), FoldTypeError, "names must be strings"),
        (lambda r: r.log(0, {"a": np.zeros(1)}, meta={"m": object()}), FoldTypeError, "JSON"),
        (lambda r: r.log(0, {"a": np.zeros(1)}, meta={"m": np.zeros(3)}), FoldTypeError, "JSON"),
    ],
)
def test_log_refuses_bad_arguments(tmp_path, call, error, match):
    with record(tmp_path / "r.jsonl") as rec:
        with pytest.raises(error, match=match):
            call(rec)
        rec.log(0, {"a": np.zeros(1)})  # the recorder still works afterwards
    assert [r["kind"] for r in _lines(tmp_path / "r.jsonl")] == ["header", "step", "end"]


def test_numpy_integer_step_is_accepted(tmp_path):
    with record(tmp_path / "r.jsonl") as rec:
        rec.log(np.int64(5), {"a": np.zeros(1)})
    assert _lines(tmp_path / "r.jsonl")[1]["step"] == 5


def test_background_mode_writes_the_same_manifest(tmp_path):
    arrays = _arrays()
    paths = []
    for background in (False, True):
        a = {n: v.copy() for n, v in arrays.items()}
        path = tmp_path / f"bg{background}.jsonl"
        with record(path, background=background) as rec:
            for s in range(6):
                rec.log(s, a, meta={"s": s})
                for v in a.values():
                    v += 1  # in place, right after the call: the copy must already be taken
        paths.append(path)
    sync, bg = (_lines(p) for p in paths)
    assert len(sync) == len(bg) == 8
    assert sync[1:-1] == bg[1:-1]
    assert sync[1]["tensors"] == [[n, bitfold.digest(v)] for n, v in arrays.items()]


def test_background_worker_error_is_raised_and_recorded(tmp_path, monkeypatch):
    import bitfold.repro.manifest as manifest

    real = manifest.digest

    def failing(x):
        if getattr(x, "size", 0) == 3:
            raise FoldTypeError("cannot digest this one")
        return real(x)

    monkeypatch.setattr(manifest, "digest", failing)
    rec = record(tmp_path / "r.jsonl", background=True)
    rec.log(0, {"ok": np.zeros(2)})
    rec.log(1, {"bad": np.zeros(3)})
    with pytest.raises(FoldTypeError, match="cannot digest this one"):
        for s in range(2, 6):  # surfaces at a later log, or at close
            rec.log(s, {"ok": np.zeros(2)})
        rec.close()
    rec.close()
    lines = _lines(tmp_path / "r.jsonl")
    steps = [r["step"] for r in lines if r["kind"] == "step"]
    assert steps[0] == 0 and 1 not in steps
    assert lines[-1]["records"] == len(steps)
    assert "FoldTypeError in the background worker: cannot digest this one" in lines[-1]["error"]

    # an exception of the with-block itself wins over the worker's
    with pytest.raises(KeyError, match="mine"), record(tmp_path / "s.jsonl", background=True) as r:
        r.log(0, {"bad": np.zeros(3)})
        raise KeyError("mine")
    assert _lines(tmp_path / "s.jsonl")[-1]["error"] == "KeyError: 'mine'"


# --------------------------------------------------------------------------- diff
def _diff(a, b, *extra):
    return cli.main(["diff", str(a), str(b), *extra])


def test_identical_runs_exit_zero(tmp_path, capsys):
    a = _write_run(tmp_path / "a.jsonl")
    b = _write_run(tmp_path / "b.jsonl")
    assert _diff(a, b) == 0
    out = capsys.readouterr().out
    assert "identical: 4 steps, 12 tensor digests" in out
    assert "environment differences: none" in out


def test_first_difference_in_recorded_order(tmp_path, capsys):
    a = _write_run(tmp_path / "a.jsonl")
    # step 2 differs in "b" (2nd recorded) and, from step 3 on, in "w" too
    b = _write_run(tmp_path / "b.jsonl", change=(2, "b"))
    assert _diff(a, b, "--json") == 1
    r = json.loads(capsys.readouterr().out)
    assert r["status"] == "digests differ" and r["identical"] is False
    d = r["first_difference"]
    assert (d["step"], d["tensor"], d["position"], d["tensors_in_step"]) == (2, "b", 2, 3)
    assert d["a"] != d["b"]
    assert (r["matched_steps"], r["matched_tensors"]) == (2, 2 * 3 + 1)
    assert d["line_a"] == d["line_b"] == 4  # header, steps 0, 1, then step 2

    assert _diff(a, b) == 1
    out = capsys.readouterr().out
    assert "first difference: step 2, tensor 'b' (2 of 3 in that step" in out
    assert "matched before it: 2 whole steps, 7 tensor digests" in out


def test_environment_differences_are_listed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    a = _write_run(tmp_path / "a.jsonl", meta={"seed": 0})
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    b = _write_run(tmp_path / "b.jsonl", meta={"seed": 1})
    assert _diff(a, b, "--json") == 0  # same digests: identical, whatever the environment
    r = json.loads(capsys.readouterr().out)
    assert {"key": "env.OMP_NUM_THREADS", "a": "1", "b": "2"} in r["env_differences"]
    assert r["meta_differences"] == [{"key": "seed", "a": 0, "b": 1}]
    assert _diff(a, b) == 0
    assert 'env.OMP_NUM_THREADS: A="1" B="2"' in capsys.readouterr().out


def test_different_models_get_a_clear_statement(tmp_path, capsys):
    a = _write_run(tmp_path / "a.jsonl", names=("w", "b", "extra_a"))
    b = _write_run(tmp_path / "b.jsonl", names=("w", "extra_b", "b"))
    assert _diff(a, b) == 1
    out = capsys.readouterr().out
    assert "the manifests record different tensors at step 0: only in A: extra_a; " \
        "only in B: extra_b" in out
    r = compare(read_manifest(a), read_manifest(b))
    assert (r["only_in_a"], r["only_in_b"]) == (["extra_a"], ["extra_b"])


def test_different_lengths_and_steps(tmp_path):
    a = _write_run(tmp_path / "a.jsonl", steps=4)
    b = _write_run(tmp_path / "b.jsonl", steps=2)
    r = compare(read_manifest(a), read_manifest(b))
    assert r["status"] == "different lengths" and r["matched_steps"] == 2
    assert "the 2 common ones are identical" in r["message"]
    c = tmp_path / "c.jsonl"
    with record(c) as rec:
        rec.log(0, {n: v for n, v in _arrays().items()})
        rec.log(5, {n: v + 1 for n, v in _arrays().items()})
    r = compare(read_manifest(a), read_manifest(c))
    assert r["status"] == "different steps" and "step 1 in A" in r["message"]


def test_run_without_closing_record_is_noted(tmp_path, capsys):
    a = _write_run(tmp_path / "a.jsonl")
    b = tmp_path / "b.jsonl"
    b.write_text("".join(a.read_text().splitlines(keepends=True)[:-1]))  # drop the end record
    assert _diff(a, b) == 0
    assert "B has no closing record" in capsys.readouterr().out


# --------------------------------------------------------------------------- bad files
def _bad(tmp_path, name, text):
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def test_truncated_manifest_names_file_and_line(tmp_path, capsys):
    good = _write_run(tmp_path / "a.jsonl")
    text = good.read_bytes()
    cut = _bad(tmp_path, "cut.jsonl", text[: text.index(b'"kind":"step"', 2000) + 40])
    with pytest.raises(FoldError, match=r"cut\.jsonl, line \d+: not valid JSON \(the line has no "
                       r"end: the file is truncated\)"):
        read_manifest(cut)
    assert _diff(good, cut) == 2
    assert "cut.jsonl, line" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", r"empty file"),
        ('{"a": 1}\n', r"line 1: not a bitfold manifest record .* foreign JSON"),
        ("[1, 2]\n", r"line 1: not a bitfold manifest record"),
        ("not json at all\n", r"line 1: not valid JSON"),
        ('{"format": "bitfold-manifest", "version": 2, "kind": "header", "env": {}}\n',
         r"line 1: manifest version 2; this bitfold reads version 1"),
        ('{"format": "bitfold-manifest", "version": 1, "kind": "step", "step": 0, "tensors": []}\n',
         r"line 1: the first record must be the header"),
    ],
)
def test_malformed_or_foreign_files_are_refused(tmp_path, text, match):
    with pytest.raises(FoldError, match=match):
        read_manifest(_bad(tmp_path, "bad.jsonl", text))


@pytest.mark.parametrize(
    ("record_text", "match"),
    [
        ('"step": "3", "tensors": []', r"line 2: \"step\" must be an integer"),
        ('"step": 0, "tensors": {"a": "b"}', r"line 2: \"tensors\" must be a list"),
        ('"step": 0, "tensors": [["a", "md5:00"]]', r"line 2: bad tensor entry"),
        ('"step": 0, "tensors": [["a", "sha256:' + "0" * 64 + '"], ["a", "sha256:' + "1" * 64
         + '"]]', r"line 2: tensor 'a' appears twice"),
    ],
)
def test_malformed_step_records_name_the_line(tmp_path, record_text, match):
    header = _write_run(tmp_path / "a.jsonl").read_text().splitlines()[0]
    step = '{"format": "bitfold-manifest", "version": 1, "kind": "step", ' + record_text + "}"
    with pytest.raises(FoldError, match=match):
        read_manifest(_bad(tmp_path, "bad.jsonl", header + "\n" + step + "\n"))


def test_missing_file_exits_two(tmp_path, capsys):
    a = _write_run(tmp_path / "a.jsonl")
    assert _diff(a, tmp_path / "nope.jsonl") == 2
    assert "nope.jsonl: cannot read the manifest" in capsys.readouterr().err


# --------------------------------------------------------------------------- PyTorch
@pytest.fixture
def torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def _mlp(torch):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def test_log_model_records_gradients_in_forward_order_then_parameters(tmp_path, torch):
    model = _mlp(torch)
    model(torch.ones(3, 5)).sum().backward()
    with record(tmp_path / "r.jsonl") as rec:
        rec.log_model(0, model)
    got = _lines(tmp_path / "r.jsonl")[1]["tensors"]
    names = ["0.weight", "0.bias", "2.weight", "2.bias"]
    params = dict(model.named_parameters())
    expected = [[f"grad/{n}", bitfold.digest(params[n].grad)] for n in names]
    expected += [[f"param/{n}", bitfold.digest(params[n])] for n in names]
    assert got == expected


def test_train_logging_and_log_model_write_the_same_tensors_in_the_same_order(tmp_path, torch):
    """One tensor order whatever tool writes the manifest, so diff names the same tensor."""
    from bitfold.cli.train import _log_step

    model = _mlp(torch)
    loss = model(torch.ones(3, 5)).sum()
    loss.backward()
    with record(tmp_path / "train.jsonl") as rec:
        _log_step(rec, 0, model, loss)
    with record(tmp_path / "user.jsonl") as rec:
        rec.log_model(0, model, meta={"loss": float(loss.detach())})
    by_train = read_manifest(tmp_path / "train.jsonl").steps[0]
    by_user = read_manifest(tmp_path / "user.jsonl").steps[0]
    assert by_train.tensors == by_user.tensors
    assert [n for n, _ in by_train.tensors] == [
        "grad/0.weight", "grad/0.bias", "grad/2.weight", "grad/2.bias",
        "param/0.weight", "param/0.bias", "param/2.weight", "param/2.bias",
    ]


def test_train_record_lists_the_tensors_of_log_model_for_the_same_model(tmp_path, torch):
    """``bitfold train --record`` and ``rec.log_model`` on the model it trains: same names, same
    order."""
    pytest.importorskip("sklearn", reason="bitfold train needs scikit-learn")
    from bitfold.torch import FoldedLinear

    assert cli.main(["train", "--epochs", "1", "--hidden", "8", "--buckets", "16",
                     "--batch", "512", "--strategies", "exact", "--repeats", "1",
                     "--record", str(tmp_path)]) == 0
    written = read_manifest(tmp_path / "digits-exact-run1.jsonl").steps[0].tensors
    model = torch.nn.Sequential(FoldedLinear(64, 8, 16, seed=0), torch.nn.ReLU(),
                                FoldedLinear(8, 10, 16, seed=1))
    model(torch.ones(2, 64)).sum().backward()
    with record(tmp_path / "user.jsonl") as rec:
        rec.log_model(0, model)
    assert [n for n, _ in written] == [
        n for n, _ in read_manifest(tmp_path / "user.jsonl").steps[0].tensors
    ]


@pytest.mark.parametrize("thing", [{"w": np.zeros(2)}, np.zeros(3), None])
def test_log_model_refuses_what_is_not_a_module(tmp_path, thing):
    with record(tmp_path / "r.jsonl") as rec:
        with pytest.raises(FoldTypeError, match=r"model must be a torch\.nn\.Module") as err:
            rec.log_model(0, thing)
    assert type(thing).__qualname__ in str(err.value)
    assert "rec.log(step, tensors)" in str(err.value)


def test_watch_records_module_outputs_before_the_logged_tensors(tmp_path, torch):
    model = _mlp(torch)
    x = torch.ones(3, 5)
    with record(tmp_path / "r.jsonl") as rec:
        rec.watch(model)
        h = model[0](x)
        out = model(x)
        rec.log(0, {"loss": out.sum()})
        rec.unwatch()
        model(x)
        rec.log(1, {"loss": out.sum()})
    steps = _lines(tmp_path / "r.jsonl")[1:3]
    assert steps[0]["tensors"] == [
        ["out/0", bitfold.digest(h)],        # the direct call of model[0]
        ["out/0#2", bitfold.digest(h)],      # the same layer inside model(x)
        ["out/1", bitfold.digest(torch.relu(h))],
        ["out/2", bitfold.digest(out)],
        ["loss", bitfold.digest(out.sum())],
    ]
    assert [n for n, _ in steps[1]["tensors"]] == ["loss"]  # hooks removed


def test_watch_unknown_submodule_is_refused(tmp_path, torch):
    with record(tmp_path / "r.jsonl") as rec, pytest.raises(FoldError, match="no submodule named"):
        rec.watch(_mlp(torch), names=["5"])


def test_diff_names_the_first_gradient_that_differs(tmp_path, torch, capsys):
    """Two training runs that part in one gradient: diff names that gradient, not a parameter."""

    def train(path, perturb_step=None):
        model = _mlp(torch)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(1)
        with record(path) as rec:
            for step in range(5):
                x = torch.randn(8, 5, generator=gen)
                opt.zero_grad()
                loss = model(x).square().mean()
                loss.backward()
                if step == perturb_step:  # one ulp in one gradient, as a racing scatter gives
                    g = model[0].weight.grad
                    g.view(torch.int32)[0, 0] += 1
                opt.step()
                rec.log_model(step, model, meta={"loss": loss.item()})
        return path

    a = train(tmp_path / "a.jsonl")
    b = train(tmp_path / "b.jsonl", perturb_step=2)
    assert _diff(a, b, "--json") == 1
    d = json.loads(capsys.readouterr().out)["first_difference"]
    assert (d["step"], d["tensor"]) == (2, "grad/0.weight")


def test_record_into_a_folder_is_refused_clearly(tmp_path):
    with pytest.raises(bitfold.FoldError, match="cannot write the manifest"):
        bitfold.record(str(tmp_path))
