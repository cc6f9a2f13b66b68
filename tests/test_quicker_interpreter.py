"""``tests/quicker_interpreter.py``: under Triton's interpreter, a kernel that calls a
``@triton.jit`` helper many times patches ``triton.language`` once a launch (as the suite's
``conftest.py`` installs it), and computes what it did before."""

from __future__ import annotations

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (make test installs it)", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("a GPU is visible: Triton compiles, its interpreter is not used",
                allow_module_level=True)  # fmt: skip

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime import interpreter  # noqa: E402


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _doubled(x_ptr, out_ptr, N: tl.constexpr, TIMES: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(TIMES):
        x = _twice(x)
    tl.store(out_ptr + offs, x)


def _patches_in_a_launch(monkeypatch, times: int) -> tuple[int, torch.Tensor]:
    count = 0
    set_attr = interpreter._LangPatchScope.set_attr

    def counted(self, obj, name, value):
        nonlocal count
        count += 1
        set_attr(self, obj, name, value)

    monkeypatch.setattr(interpreter._LangPatchScope, "set_attr", counted)
    x = torch.arange(8, dtype=torch.float32)
    out = torch.empty_like(x)
    _doubled[(1,)](x, out, N=8, TIMES=times)
    monkeypatch.undo()
    return count, out


def test_the_suite_runs_the_quicker_interpreter():
    assert getattr(interpreter._patch_lang, "once_a_launch", False)


def test_a_launch_patches_the_language_once_however_many_helper_calls(monkeypatch):
    once, out1 = _patches_in_a_launch(monkeypatch, 1)
    many, out8 = _patches_in_a_launch(monkeypatch, 8)
    assert once > 0 and many == once, (once, many)
    x = torch.arange(8, dtype=torch.float32)
    assert torch.equal(out1, 2 * x) and torch.equal(out8, 256 * x)


def test_the_language_is_restored_after_a_launch(monkeypatch):
    before = tl.arange
    _patches_in_a_launch(monkeypatch, 3)
    assert tl.arange is before
