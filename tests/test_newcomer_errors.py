"""Errors newcomers met: each bad input gets one clear bitfold error, before any work.

Every test names the input, the error class and what its message must say:
the bad value and what is allowed (or the fix). "Before any work" is checked
by replacing the expensive function with one that fails the test when called.
"""

from __future__ import annotations

import pytest

from bitfold.errors import DistributedError, FoldError, FoldTypeError


def _no_chain(err: BaseException) -> None:
    """One error, not printed after another: no cause, and any context suppressed."""
    assert err.__cause__ is None
    assert err.__suppress_context__ or err.__context__ is None


def _forbid(monkeypatch: pytest.MonkeyPatch, module: object, *names: str) -> None:
    """Replace ``module``'s functions ``names`` with ones that fail the test when called."""
    for name in names:

        def called(*args: object, _name: str = name, **kwargs: object) -> None:
            pytest.fail(f"{_name} ran: the bad input was not refused before any work")

        monkeypatch.setattr(module, name, called)


# -- torch.distributed -----------------------------------------------------------------------


def _distributed():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
    return torch, pytest.importorskip("bitfold.distributed", reason="needs torch")


def test_exact_all_reduce_without_a_process_group_is_refused_before_any_work(monkeypatch):
    torch, bd = _distributed()
    assert not torch.distributed.is_initialized()
    _forbid(monkeypatch, bd, "to_numpy", "array_bounds", "_all_reduce_array",
            "_all_reduce_on_device")  # fmt: skip
    _forbid(monkeypatch, bd.dense_device, "widened", "array_bounds")
    for words in (None, "host", "device"):
        with pytest.raises(DistributedError, match="init_process_group") as err:
            bd.exact_all_reduce(torch.ones(1000), words=words)
        assert "no" in str(err.value) and "initialised" in str(err.value)
        _no_chain(err.value)
    s = bd.DenseSum((3,), "float32").add(torch.ones(3))
    _forbid(monkeypatch, bd, "_exchange")
    with pytest.raises(DistributedError, match="init_process_group"):
        bd.exact_all_reduce(s)


def test_gradient_sum_of_no_parameters_is_refused_by_name(monkeypatch):
    torch, bd = _distributed()
    monkeypatch.setattr(bd.dist, "is_initialized", lambda: True)  # even with a group
    for empty in ([], (), iter([])):
        with pytest.raises(FoldError, match="no parameters: params is empty") as err:
            bd.GradientSum(empty)
        assert "model.parameters()" in str(err.value)
    model = torch.nn.Linear(2, 2)
    params = model.parameters()
    list(params)  # read once already, as an optimizer does
    with pytest.raises(FoldError, match="read once"):
        bd.GradientSum(params)


def test_gradient_sum_of_a_module_says_to_pass_its_parameters():
    torch, bd = _distributed()
    with pytest.raises(FoldTypeError, match=r"not the module: pass model\.parameters\(\)") as e:
        bd.GradientSum(torch.nn.Linear(2, 2))
    assert "Linear" in str(e.value)
    _no_chain(e.value)
    with pytest.raises(FoldTypeError, match=r"one tensor of shape \(2, 3\)"):
        bd.GradientSum(torch.nn.Parameter(torch.ones(2, 3)))
    with pytest.raises(FoldTypeError, match=r"iterable of parameters.* got int") as e:
        bd.GradientSum(3)
    _no_chain(e.value)
