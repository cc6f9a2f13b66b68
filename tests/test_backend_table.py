"""The table of ``tests/backend_compare.py`` run against each backend that runs in this process:
one test a backend and problem, each bit for bit against the host and the Fraction oracle.

``host`` checks the table itself (NumPy values, against the oracle); ``portable`` folds CPU
tensors forced onto the portable path (``backend="portable"``); ``triton`` folds torch tensors
with ``backend="triton"``: on a GPU when torch sees one, else CPU tensors in Triton's
interpreter (``TRITON_INTERPRET=1``, set by ``conftest.py`` before Triton loads). A backend
that needs a process of its own (numba-cuda's simulator) runs the same table through
``tests/test_backends.py``. A new backend is one ``Target`` in ``backend_compare.TARGETS`` and
its name in :data:`IN_PROCESS`.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest
from backend_compare import TARGETS, held, run_problem, skip_reason, table

import bitfold
from bitfold.backends import registry

#: the backends whose table runs in this process; the slow ones (an interpreter) marked slow
IN_PROCESS = (
    "host",
    "portable",
    pytest.param("triton", marks=pytest.mark.slow),
)
PROBLEMS = {p.name: p for p in table()}


def unavailable(name: str) -> str | None:
    """Why backend ``name``'s table cannot run here (a clear skip reason), or None."""
    if TARGETS[name].torch and importlib.util.find_spec("torch") is None:
        return f"the {name} backend's table folds torch tensors; torch is not installed"
    if name == "triton" and importlib.util.find_spec("triton") is None:
        return "Triton is not installed (it ships with torch's CUDA and ROCm wheels)"
    if name not in registry.backend_names():
        return f"no backend named {name!r} is registered"
    device = TARGETS[name].device()
    if not registry.get_backend(name).serves("torch" if TARGETS[name].torch else "numpy", device):
        return (f"the {name} backend cannot run on {device!r} here (for Triton without a GPU: "
                "TRITON_INTERPRET=1 runs its interpreter)")  # fmt: skip
    return None


@pytest.mark.parametrize("problem", list(PROBLEMS))
@pytest.mark.parametrize("name", IN_PROCESS)
def test_the_backend_agrees_with_the_oracle_and_the_host(name, problem):
    why = unavailable(name) or skip_reason(name, PROBLEMS[problem])
    if why:
        pytest.skip(why)
    assert run_problem(name, PROBLEMS[problem]) == []


def test_every_registered_backend_has_a_target():
    """A backend registered without a way for the table to reach it fails here."""
    missing = [n for n in registry.backend_names() if n not in TARGETS]
    assert missing == [], f"add a Target to tests/backend_compare.py for {missing}"


def test_the_table_covers_what_it_promises():
    """Every dtype, rows, out_dtype, init, hot buckets and accumulators are in the table."""
    problems = list(PROBLEMS.values())
    assert {p.dtype for p in problems} == {"float16", "bfloat16", "float32", "float64"}
    assert any(p.values.ndim == 2 for p in problems)
    assert {p.out for p in problems} >= {"float16", "bfloat16", "float32", "float64"}
    assert any(p.init is not None and p.init_dtype != p.dtype for p in problems)
    assert any(p.K == 1 and p.values.size >= 10000 for p in problems)
    assert any(p.accumulate and p.values.ndim == 2 for p in problems)
    assert all(p.values.size <= 20000 for p in problems)
    for p in problems:  # every value is exactly one of its dtype (so the oracle sees the input)
        assert np.array_equal(held(p.values, p.dtype), p.values, equal_nan=True), p.name


@pytest.fixture
def wrong_backend(monkeypatch):
    """A backend whose exact fold is off by one ulp in bucket 0: the table must see it."""
    torch = pytest.importorskip("torch")
    portable = registry.get_backend("portable")

    def exact(plan, values, spec, out_name, **options):
        out = portable.fold("exact")(plan, values, spec, out_name, **options)
        if out.numel() and out.dtype == torch.float32:
            out.view(-1).view(torch.int32)[0] ^= 1
        return out

    wrong = dataclasses.replace(portable, name="fake-wrong", devices=("cpu",), priority=-1000,
                                folds={**portable.folds, "exact": exact})  # fmt: skip
    registry.register(wrong)
    monkeypatch.setitem(TARGETS, "fake-wrong", dataclasses.replace(
        TARGETS["portable"], options=lambda: {"backend": "fake-wrong"}))  # fmt: skip
    yield "fake-wrong"
    registry.unregister("fake-wrong")


def test_the_table_catches_a_backend_one_ulp_off(wrong_backend):
    found = run_problem(wrong_backend, PROBLEMS["scalars float32"])
    assert any("differs from the oracle" in f for f in found), found
    assert any("differs from the host" in f for f in found), found
    assert run_problem(wrong_backend, PROBLEMS["scalars float64"]) == []  # float64: untouched
    assert bitfold.backend_names()[-1] == wrong_backend
