"""The GPU kernel families' known-answer test (:mod:`bitfold.backends.selftest`).

* The stored problem set: its bits are the Fraction oracle's (``tests/oracle.py``),
  the script writes exactly the stored file, and it holds what it promises (ties,
  subnormal sums, -0.0, specials, a hot bucket, a Zipf map, rows, every dtype pair).
* The machinery, on the host (no interpreter, milliseconds): the host's kernels pass
  every pair; a planted family whose fold is wrong fails with one warning naming the
  device, driver, compiler and case, and folds move to the next backend that passes;
  ``strict`` and a forced backend raise; ``off`` runs nothing; one run per device
  and pair.
* The Triton kernels in Triton's interpreter (the device ``cpu``): they pass here;
  a raising kernel warns and the fold moves on, ``strict`` and ``backend="triton"``
  raise. ``make mutants`` plants a wrong Triton kernel and checks that
  ``test_the_triton_kernels_pass_their_known_answers_here`` fails.

The numba-cuda kernels' test runs in ``tests/cuda_cases.py`` (the simulator's process).
Every test runs inside :func:`bitfold.backends.selftest.fresh`: the verdicts of the rest
of the process are left as they were.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from oracle import exact_fold_oracle

import bitfold
from bitfold.backends import host, registry, selftest
from bitfold.formats import FLOATS, OUT_DTYPES, VALUE_DTYPES

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "bitfold" / "backends" / selftest.DATA
PAIRS = [(d, o) for d in VALUE_DTYPES for o in OUT_DTYPES]


def _script():
    path = ROOT / "scripts" / "selftest_cases.py"
    spec = importlib.util.spec_from_file_location("selftest_cases", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(selftest.ENV, raising=False)
    with selftest.fresh():
        yield


def _values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Bit patterns of ``dtype`` as float64 values (bfloat16: through float32, exactly)."""
    with np.errstate(invalid="ignore"):  # signalling NaNs stay NaNs
        if dtype == "bfloat16":
            return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)
        return bits.astype(FLOATS[dtype].bits_dtype).view(dtype).astype(np.float64)


# -- the stored problem set -------------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "out"), PAIRS)
def test_the_stored_bits_are_the_oracles(dtype, out):
    for case in selftest.cases(dtype, out):
        shape = tuple(case["shape"])
        cols = shape[1] if len(shape) > 1 else 1
        values = _values(np.array(case["bits"], np.uint64), dtype).reshape(shape[0], cols)
        held = "float32" if out == "bfloat16" else out
        columns = [exact_fold_oracle(case["index"], values[:, d], case["K"], out)
                   .view(FLOATS[held].bits_dtype) for d in range(cols)]  # fmt: skip
        want = np.stack(columns, axis=1).reshape(-1).astype(np.uint64)
        if out == "bfloat16":
            want = want >> np.uint64(16)
        assert want.tolist() == case["expected"], f"{dtype} -> {out} {case['name']}"


def test_the_script_writes_the_stored_file():
    script = _script()
    assert DATA.read_text() == script.dumps(script.build()), (
        "the stored known answers differ from what scripts/selftest_cases.py writes: run it"
    )


@pytest.mark.parametrize(("dtype", "out"), PAIRS)
def test_the_problem_set_holds_what_it_promises(dtype, out):
    scalars, rows = selftest.cases(dtype, out)
    assert (scalars["name"], rows["name"]) == ("scalars", "rows")
    hot_min = json.loads(DATA.read_text())["hot_min"]
    for case in (scalars, rows):
        counts = np.bincount(case["index"], minlength=case["K"])
        assert counts.max() >= hot_min and (counts == 0).any()  # a hot bucket, an empty one
        assert len(case["bits"]) == int(np.prod(case["shape"])) == len(case["index"]) * (
            case["shape"][1] if len(case["shape"]) > 1 else 1)  # fmt: skip
    assert len(rows["shape"]) == 2 and rows["shape"][1] > 1
    f = FLOATS[dtype]
    bits = np.array(scalars["bits"], np.uint64)
    exp = (bits >> np.uint64(f.fraction_bits)) & np.uint64((1 << f.exponent_bits) - 1)
    frac = bits & np.uint64((1 << f.fraction_bits) - 1)
    sign = bits >> np.uint64(f.width - 1)
    top = (1 << f.exponent_bits) - 1
    assert ((exp == 0) & (frac != 0)).sum() >= 5, "subnormal terms"
    assert ((exp == 0) & (frac == 0) & (sign == 1)).sum() >= 3, "-0.0 terms"
    assert ((exp == top) & (frac != 0)).any() and ((exp == top) & (frac == 0)).sum() >= 4
    counts = np.bincount(scalars["index"], minlength=scalars["K"])
    assert sorted(counts, reverse=True)[:4] == sorted(counts, reverse=True)[:4] and (
        counts >= 3).sum() >= 4, "a skewed map: a hot head and a tail"  # fmt: skip
    out_bits = np.array(scalars["expected"], np.uint64)
    o = FLOATS[out]
    o_exp = (out_bits >> np.uint64(o.fraction_bits)) & np.uint64((1 << o.exponent_bits) - 1)
    assert (out_bits == np.uint64(1 << (o.width - 1))).any(), "a -0.0 result"
    assert (out_bits == np.uint64(o.canonical_nan)).any(), "the canonical NaN"
    assert ((o_exp == 0) & (out_bits != 0)).any() or dtype != out, "a subnormal result"


# -- the machinery, on the host ---------------------------------------------------------------
def _host_place(bits: np.ndarray, dtype: str, values) -> object:
    if dtype == "bfloat16":  # NumPy arrays of ml_dtypes' bfloat16 (the host reads them)
        import ml_dtypes

        return bits.view(ml_dtypes.bfloat16)
    return bits.view(dtype)


def _about(values) -> dict[str, str]:
    return {"device": "a planted device", "driver": "planted driver 1.0",
            "compiler": "planted compiler 2.0"}  # fmt: skip


HOOKS = selftest.KnownAnswers(
    family="planted", device=lambda values: "cpu", place=_host_place, about=_about,
    options={"scalars": ({}, {"route": "limbs"}), "rows": ({"route": "buckets"},)},
)  # fmt: skip


def _wrong_exact(plan, values, spec, out_name, **options):
    """The host's exact fold, the lowest bit of a scalar fold's last result flipped."""
    out = host.BACKEND.fold("exact")(plan, values, spec, out_name, **options)
    if not spec.trailing:
        flat = out.reshape(-1)
        flat.view(f"u{flat.itemsize}")[-1] ^= 1
    return out


@pytest.fixture
def planted():
    """Two planted kernel families ahead of the host for NumPy arrays: ``wrong`` (its exact
    fold flips a bit of the scalars fold) asked first, ``right`` (the host's folds) next."""
    wrong = dataclasses.replace(host.BACKEND, name="wrong", priority=1000, known_answers=HOOKS,
                                folds={**host.BACKEND.folds, "exact": _wrong_exact})  # fmt: skip
    right = dataclasses.replace(host.BACKEND, name="right", priority=900, known_answers=HOOKS)
    for b in (wrong, right):
        registry.register(b)
    try:
        yield wrong, right
    finally:
        for b in (wrong, right):
            registry.unregister(b.name)


@pytest.mark.parametrize("dtype", VALUE_DTYPES)
def test_the_host_kernels_give_every_stored_answer(dtype):
    right = dataclasses.replace(host.BACKEND, known_answers=HOOKS)
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    verdict = selftest.check(right, None, [(dtype, o) for o in OUT_DTYPES], bitfold.Fold)
    assert verdict.passed, verdict.failure
    assert verdict.checked == [f"{dtype} -> {o}" for o in OUT_DTYPES]


def test_a_wrong_family_warns_once_and_folds_move_to_the_next_that_passes(planted):
    plan = bitfold.Fold(np.array([0, 1, 1, 2]), 3)
    v = np.array([1.0, 1.0, 2.0**-23, 3.0], np.float32)
    with pytest.warns(bitfold.SelfTestWarning) as caught:
        assert plan.route(v).backend == "right"
    (w,) = caught
    text = str(w.message)
    for words in ("known-answer test failed for the planted kernels on cpu", "a planted device",
                  "planted driver 1.0", "planted compiler 2.0", "case 'scalars'",
                  "float32 values -> float32", "1 of 33 results differ; bucket 32 gave",
                  "move to the next backend"):  # fmt: skip
        assert words in text, text
    assert w.filename == __file__, "the warning points at the caller"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        got = plan(v)
        plan(v.astype(np.float64))  # another dtype: the family failed on the device, whole
    assert got.tolist() == [1.0, 1.0 + 2.0**-23, 3.0]
    assert [(x.backend, x.passed) for x in selftest.verdicts()] == [("wrong", False),
                                                                     ("right", True)]  # fmt: skip
    assert selftest.verdict("right", "cpu").checked == ["float32 -> float32", "float64 -> float64"]


def test_strict_raises_instead_and_a_forced_backend_always_raises(planted, monkeypatch):
    plan = bitfold.Fold(np.array([0, 1, 1, 2]), 3)
    v = np.ones(4, np.float32)
    monkeypatch.setenv(selftest.ENV, "strict")
    with pytest.raises(bitfold.SelfTestError, match=r"planted kernels on cpu.*=strict"):
        plan(v)
    with pytest.raises(bitfold.SelfTestError, match="planted kernels"):  # the verdict is kept
        plan.accumulator().add(v)
    monkeypatch.setenv(selftest.ENV, "on")  # the failure, not warned yet, is warned now
    with pytest.warns(bitfold.SelfTestWarning, match="planted kernels on cpu"):
        assert plan.route(v).backend == "right"
    with pytest.raises(bitfold.SelfTestError, match=r"asked for by name.*leave backend= out"):
        plan(v, backend="wrong")
    assert isinstance(bitfold.SelfTestError("x"), bitfold.DeviceError)


def test_off_runs_no_test_and_every_backend_serves_as_registered(planted, monkeypatch):
    monkeypatch.setenv(selftest.ENV, "off")
    plan = bitfold.Fold(np.array([0, 1, 1, 2]), 3)
    assert plan.route(np.ones(4, np.float32)).backend == "wrong"
    assert selftest.verdicts() == ()
    monkeypatch.setenv(selftest.ENV, "sometimes")
    with pytest.raises(bitfold.FoldError, match="BITFOLD_SELFTEST must be one of on, strict, off"):
        plan(np.ones(4, np.float32))


def test_each_device_and_pair_runs_once(planted, monkeypatch):
    right = planted[1]
    registry.unregister("wrong")
    plan = bitfold.Fold(np.array([0, 1, 1, 2]), 3)
    plan(np.ones(4, np.float32))
    runs = []
    real = selftest._first_failure
    monkeypatch.setattr(selftest, "_first_failure", lambda *a: runs.append(a[3:5]) or real(*a))
    for _ in range(3):
        plan(np.ones(4, np.float32))
        plan(np.ones(4, np.float16), out_dtype="float16")
    plan.accumulator("float32").add(np.ones(4, np.float16))  # float16 -> float32: a new pair
    assert runs == [("float16", "float16"), ("float16", "float32")]
    checked = selftest.verdict("right", "cpu").checked
    assert checked == ["float32 -> float32", "float16 -> float16", "float16 -> float32"]
    other = dataclasses.replace(HOOKS, device=lambda values: "elsewhere:1")
    registry.unregister("right")
    registry.register(dataclasses.replace(right, known_answers=other))
    plan(np.ones(4, np.float32))  # another device: its own verdict
    assert runs[-1] == ("float32", "float32")
    assert {x.device for x in selftest.verdicts()} == {"cpu", "elsewhere:1"}


def test_a_missing_data_file_is_an_error_not_a_failed_family(planted, monkeypatch):
    monkeypatch.setattr(selftest, "_CACHE", None)
    monkeypatch.setattr(selftest, "DATA", "no_such_cases.json")
    with pytest.raises(FileNotFoundError, match=r"no_such_cases\.json"):
        bitfold.Fold(np.array([0, 1]), 2)(np.ones(2, np.float32))
    assert all(v.passed for v in selftest.verdicts())


def test_a_verdict_reads_as_one_line_and_as_data(planted):
    wrong, right = planted
    verdict = selftest.check(right, None, [("float32", "float32")], bitfold.Fold)
    assert verdict.line().startswith("the planted kernels (right backend) on cpu: passed")
    data = verdict.as_dict()
    assert data["passed"] is True and data["checked"] == ["float32 -> float32"]
    assert data["about"]["compiler"] == "planted compiler 2.0"
    failed = selftest.check(wrong, None, [("float32", "float32")], bitfold.Fold)
    assert "FAILED, case 'scalars'" in failed.line() and not failed.passed
    with pytest.raises(bitfold.FoldError, match="the host backend has no known-answer test"):
        selftest.check(host.BACKEND, None, [("float32", "float32")], bitfold.Fold)


def test_bitfold_probe_reports_the_verdict(planted, monkeypatch):
    from bitfold.cli.probe_devices import CpuDevice, known_answers
    from bitfold.cli.probe_report import known_answers_lines

    with pytest.warns(bitfold.SelfTestWarning, match="planted kernels on cpu"):
        answers = known_answers(np.zeros(1, np.float32))
    assert answers["mode"] == "on" and answers["backend"] == "right"
    failed, passed = known_answers_lines(answers)
    assert failed.startswith("known answers: the planted kernels on cpu (a planted device) FAILED")
    assert failed.endswith("the right backend folds instead")
    assert passed.startswith("known answers: the planted kernels on cpu (a planted device) passed "
                             "(float32 -> float32; ")  # fmt: skip
    here = CpuDevice(None).known_answers()
    assert known_answers_lines(here) == [
        "known answers: none to check here (the host's kernels are the reference that the GPU "
        "kernels are checked against)"]  # fmt: skip
    monkeypatch.setenv(selftest.ENV, "off")
    assert known_answers_lines(known_answers(np.zeros(1, np.float32))) == [
        "known answers: not checked (BITFOLD_SELFTEST=off)"]  # fmt: skip
    assert known_answers_lines(None) == []  # a report made before the test existed


# -- the Triton kernels, in Triton's interpreter ------------------------------------------------
def _triton():
    pytest.importorskip("torch")
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (make test installs it)")
    from bitfold.backends import triton as triton_backend

    if not triton_backend.interpreting():
        pytest.skip("TRITON_INTERPRET=1 is not set (conftest sets it without a GPU)")
    return triton_backend


@pytest.mark.slow  # 5-15 s in the interpreter, float64's 67 limbs most of it
def test_the_triton_kernels_pass_their_known_answers_here():
    """Every dtype's usual pairs (the default output, and the values' own narrow dtype)."""
    import torch

    triton_backend = _triton()
    pairs = [("float32", "float32"), ("float16", "float16"), ("bfloat16", "float32"),
             ("float64", "float64")]  # fmt: skip
    verdict = selftest.check(triton_backend.BACKEND, torch.zeros(1), pairs, bitfold.Fold)
    assert verdict.passed, verdict.failure
    assert verdict.device == "cpu" and "interpreter" in verdict.about["device"]
    assert verdict.about["compiler"].startswith("Triton ")


class _Raising:
    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            raise RuntimeError("a planted kernel error")

        return launch


@pytest.fixture
def triton_raising(monkeypatch):
    """The Triton backend asked first for CPU tensors, its lanes kernel raising."""
    triton_backend = _triton()
    from bitfold.kernels import triton as kernels

    monkeypatch.setattr(kernels, "lanes_kernel", _Raising())
    first = dataclasses.replace(registry.get_backend("triton"), priority=1000)
    monkeypatch.setitem(registry._REGISTRY, "triton", first)
    return triton_backend


def test_a_raising_triton_kernel_warns_and_the_fold_moves_on(triton_raising):
    import torch

    plan = bitfold.Fold(np.array([0, 1, 1, 2]), 3)
    v = torch.tensor([1.0, 1.0, 2.0**-23, 3.0])
    with pytest.warns(bitfold.SelfTestWarning) as caught:
        got = plan(v)
    (w,) = caught
    text = str(w.message)
    for words in ("the Triton kernels on cpu", "interpreter", "driver none", "compiler Triton ",
                  "case 'scalars' (float32 values -> float32, hot_min=8, chunk=10): raised "
                  "RuntimeError: a planted kernel error"):  # fmt: skip
        assert words in text, text
    assert got.tolist() == [1.0, 1.0 + 2.0**-23, 3.0]
    assert plan.route(v).backend == "host"  # the next backend that passes (no test: a reference)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan(v)


def test_a_raising_triton_kernel_raises_when_strict_or_forced(triton_raising, monkeypatch):
    import torch

    plan = bitfold.Fold(np.array([0, 1, 1, 2]), 3)
    v = torch.ones(4)
    with pytest.raises(bitfold.SelfTestError, match=r"Triton kernels on cpu.*asked for by name"):
        plan(v, backend="triton")
    selftest.reset()
    monkeypatch.setenv(selftest.ENV, "strict")
    with pytest.raises(bitfold.SelfTestError, match=r"planted kernel error.*strict"):
        plan(v)
