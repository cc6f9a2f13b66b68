"""Which calls a compiled function's function mode lets run as they are, before anything else
(``bitfold.torch.compiled._plain_call``): never a call it routes or must run in the exact
mode, whoever calls it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
bt = pytest.importorskip("bitfold.torch", reason="bitfold.torch needs PyTorch")
from bitfold.torch import compiled, mode  # noqa: E402  (after the importorskip above)


@pytest.fixture
def no_sparse_yet(monkeypatch):
    monkeypatch.setitem(mode._kernels, "sparse_seen", False)


def test_routed_calls_never_run_as_they_are(no_sparse_yet):
    for generated in (False, True):
        for eager in (False, True):
            assert not compiled._plain_call(torch.bincount, generated, eager)
            assert not compiled._plain_call(torch.Tensor.bincount, generated, eager)


def test_private_calls_run_as_they_are_and_public_ones_once_the_call_went_eager(no_sparse_yet):
    assert compiled._plain_call(torch.Tensor._is_view, False, False)  # AOTAutograd's wrappers
    assert compiled._plain_call(torch.ops.aten.mm.default, False, False)  # an ATen overload
    gather = torch.Tensor.__getitem__
    assert not compiled._plain_call(gather, False, False)  # the first public call: the handler
    assert compiled._plain_call(gather, False, True)
    assert not compiled._plain_call(torch.Tensor.index_add_, False, True)  # folds: the mode
    assert compiled._plain_call(torch.Tensor.index_add_, True, False)  # inductor's own call


def test_once_a_sparse_tensor_exists_every_eager_call_goes_to_the_handler(monkeypatch):
    monkeypatch.setitem(mode._kernels, "sparse_seen", True)
    assert not compiled._plain_call(torch.Tensor._is_view, False, True)
    assert not compiled._plain_call(torch.Tensor.__getitem__, False, True)
    assert compiled._plain_call(torch.ops.aten.mm.default, True, True)  # inductor's own call


class _EveryCallRouted(dict):
    """Every function routed: each call takes the handler's way, as before the fast path."""

    def __getitem__(self, func):
        return (True, True, True)


def _eager_stretch(between=lambda y: y):
    """``(f, w, idx)``: ``f(w, idx)`` runs a gather and an ``index_add_`` eagerly inside a
    compiled call (``between`` applied to the gathered rows)."""
    torch._dynamo.reset()

    @torch._dynamo.disable
    def experts(x, idx):  # run eagerly inside the compiled call
        y = between(x[idx] * 3)  # a gather: its backward folds
        return torch.zeros(6, 3).index_add_(0, idx, y)

    def f(w, idx):
        return experts(w * 2, idx).pow(2).sum()

    g = torch.Generator().manual_seed(3)
    w = (torch.randn(6, 3, generator=g) * 2.0 ** torch.randint(-20, 20, (6, 3), generator=g))
    return f, w.requires_grad_(True), torch.tensor([0, 5, 0, 2, 5, 5, 1, 0])


def _eager_stretch_step():
    f, w, idx = _eager_stretch()
    step = bt.compile(f)
    for _ in range(2):
        w.grad = None
        step(w, idx).backward()
    return w.grad.clone(), dict(step.bitfold.counts)


def test_an_eager_stretch_folds_the_same_with_and_without_the_fast_path(monkeypatch):
    """A gather and an ``index_add_`` run eagerly in a compiled call: the same counts and the
    same gradient bits whether its calls take the fast path or the handler's way."""
    fast, fast_counts = _eager_stretch_step()
    monkeypatch.setattr(compiled, "_CALL_KINDS", _EveryCallRouted())
    slow, slow_counts = _eager_stretch_step()
    assert fast_counts == slow_counts and fast_counts.get("index_add", 0) >= 2
    assert fast_counts.get("index_put", 0) >= 2  # x[idx]'s backward, each step
    assert torch.equal(fast.view(torch.int32), slow.view(torch.int32))


class _Boom(torch.autograd.Function):
    """The identity, whose backward raises while ``armed``."""

    armed = True

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if _Boom.armed:
            raise RuntimeError("boom")
        return grad


def test_an_eager_backward_that_raised_leaves_no_mode_behind_the_next_call():
    """An eager node's backward raises between its exact mode's entry and exit: no mode is
    left active, and the next call's backward is exact."""
    f, w, idx = _eager_stretch(_Boom.apply)  # x[idx]'s backward folds, after _Boom's
    step = bt.compile(f)
    _Boom.armed = True
    with pytest.raises(RuntimeError, match="boom"):
        step(w, idx).backward()
    assert mode.active_modes() == ()  # autograd restores the thread's modes
    _Boom.armed = False
    try:
        w.grad = None
        step(w, idx).backward()
    finally:
        _Boom.armed = True
    assert mode.active_modes() == ()
    with bt.exact_mode():  # the same step, op by op, in one exact mode
        w2 = w.detach().clone().requires_grad_(True)
        _Boom.armed = False
        try:
            f(w2, idx).backward()
        finally:
            _Boom.armed = True
    assert torch.equal(w.grad.view(torch.int32), w2.grad.view(torch.int32))
    assert step.bitfold.counts.get("index_put", 0) >= 1
