"""The autograd nodes whose backward ``bitfold.torch.compile`` runs without the exact mode
(``compiled.FOLD_FREE_BACKWARD``): each one's backward, run under ``exact_mode()``, reaches no
fold (nothing counted, nothing passed), on this torch. A node that folds is seen by the same
check, and a compiled call's eager fold in the backward is still made exact."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
F = torch.nn.functional

import bitfold.torch as bt  # noqa: E402
from bitfold.torch.compiled import FOLD_FREE_BACKWARD  # noqa: E402

IDX = torch.tensor([0, 2, 0, 1])


def _leaf(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + sum(shape))
    return torch.randn(*shape, generator=g).requires_grad_()


def _x():
    return _leaf(4, 6)


def _y():
    return _leaf(4, 6, seed=1)


#: an op whose output's ``grad_fn`` is the node of that name
CASES = {
    "AddBackward0": lambda: _x() + _y(),
    "AddmmBackward0": lambda: torch.addmm(_leaf(3), _x(), _leaf(6, 3)),
    "AliasBackward0": lambda: torch.ops.aten.alias(_x()),
    "BmmBackward0": lambda: torch.bmm(_leaf(2, 3, 4), _leaf(2, 4, 5)),
    "CatBackward0": lambda: torch.cat([_x(), _y()]),
    "CloneBackward0": lambda: _x().clone(),
    "DivBackward0": lambda: _x() / _y(),
    "ExpBackward0": lambda: _x().exp(),
    "ExpandBackward0": lambda: _leaf(1, 6).expand(4, 6),
    "GeluBackward0": lambda: F.gelu(_x()),
    "IndexAddBackward0": lambda: _leaf(3, 6).index_add(0, IDX, _x()),
    "LogSoftmaxBackward0": lambda: _x().log_softmax(-1),
    "MeanBackward1": lambda: _x().mean(-1),
    "MmBackward0": lambda: _x() @ _leaf(6, 3),
    "MulBackward0": lambda: _x() * _y(),
    "MulBackward1": lambda: torch.ops.aten.mul.Scalar(_x(), 2.0),
    "NativeLayerNormBackward0": lambda: F.layer_norm(_x(), (6,), _leaf(6), _leaf(6, seed=1)),
    "NegBackward0": lambda: -_x(),
    "NllLossBackward0": lambda: F.nll_loss(_x().log_softmax(-1), torch.tensor([1, 1, 5, 1])),
    "PermuteBackward0": lambda: _leaf(2, 3, 4).permute(2, 0, 1),
    "PowBackward0": lambda: _x().pow(2),
    "ReluBackward0": lambda: _x().relu(),
    "ReshapeAliasBackward0": lambda: torch.ops.aten._reshape_alias(_x(), (24,), (1,)),
    "RsqrtBackward0": lambda: (_x() * _x() + 1).rsqrt(),
    "SafeSoftmaxBackward0": lambda: torch.ops.aten._safe_softmax(_x(), -1),
    "ScaledDotProductFlashAttentionForCpuBackward0": lambda: F.scaled_dot_product_attention(
        _leaf(1, 2, 4, 8), _leaf(1, 2, 4, 8, seed=1), _leaf(1, 2, 4, 8, seed=2), is_causal=True
    ),
    "SelectBackward0": lambda: _x()[1],
    "SigmoidBackward0": lambda: _x().sigmoid(),
    "SiluBackward0": lambda: F.silu(_x()),
    "SliceBackward0": lambda: _x()[1:3],
    "SoftmaxBackward0": lambda: _x().softmax(-1),
    "SplitBackward0": lambda: _x().split(2)[1],
    "SqueezeBackward1": lambda: _leaf(1, 6).squeeze(0),
    "StackBackward0": lambda: torch.stack([_x(), _y()]),
    "SubBackward0": lambda: _x() - _y(),
    "SumBackward1": lambda: _x().sum(-1),
    "TBackward0": lambda: _x().t(),
    "TanhBackward0": lambda: _x().tanh(),
    "ToCopyBackward0": lambda: _x().to(torch.float64),
    "TopkBackward0": lambda: _x().topk(2, -1).values,
    "TransposeBackward0": lambda: _leaf(2, 3, 4).transpose(0, 2),
    "UnsafeViewBackward0": lambda: torch.ops.aten._unsafe_view(_x(), (24,)),
    "UnsqueezeBackward0": lambda: _x().unsqueeze(0),
    "ViewBackward0": lambda: _x().view(24),
}
#: nodes whose backward folds: the check below must see them
FOLDING = {
    "IndexBackward0": lambda: _x()[IDX],
    "EmbeddingBackward0": lambda: F.embedding(IDX, _x()),
}


def _backward_under_the_mode(make):
    out = make()
    name = out.grad_fn.name()
    with bt.exact_mode() as mode:
        out.backward(torch.ones_like(out))
    return name, mode


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_fold_free_node_backward_reaches_no_fold(name):
    made, mode = _backward_under_the_mode(CASES[name])
    assert made == name
    assert not mode.counts and not mode.passed, (name, mode)


@pytest.mark.parametrize("name", sorted(FOLDING))
def test_a_node_whose_backward_folds_is_seen_and_not_listed(name):
    made, mode = _backward_under_the_mode(FOLDING[name])
    assert made == name and made not in FOLD_FREE_BACKWARD
    assert sum(mode.counts.values()) >= 1, mode


def test_every_listed_node_has_a_case():
    leaf_node = CASES["MulBackward1"]().grad_fn.next_functions[0][0].name()
    assert set(FOLD_FREE_BACKWARD) == set(CASES) | {leaf_node}


def test_a_compiled_calls_eager_fold_in_the_backward_is_exact():
    """An index taken outside Dynamo's graphs: its backward, an accumulating
    ``index_put``, is the correctly rounded sum and is counted."""

    @torch._dynamo.disable
    def take(y, idx):  # run by Python, outside Dynamo's graphs
        return y[idx]

    def f(x, idx):
        return take(x * 1.0, idx) * 2.0

    torch._dynamo.reset()
    step = bt.compile(f)
    x = torch.zeros(2, requires_grad=True)
    idx = torch.tensor([0, 0, 0, 1])
    out = step(x, idx)
    out.backward(torch.tensor([0.5, 2.0**-25, 2.0**-25, 1.0]))
    # 1 + 2^-24 + 2^-24 in one rounding (a float32 sum, in any order, gives 1.0)
    assert x.grad.tolist() == [1.0 + 2.0**-23, 2.0]
    assert step.bitfold.counts["index_put"] == 1, step.bitfold
    torch._dynamo.reset()


def test_a_call_without_eager_stretches_installs_no_fold_kernels():
    """A whole-graph compiled call never activates the exact mode: the fold kernels (which cost
    every fold op of the process a Python call once installed) stay out."""
    from bitfold.torch import mode

    mode._uninstall_kernels()
    torch._dynamo.reset()
    idx = torch.tensor([0, 0, 1])
    step = bt.compile(lambda x, v: x.index_add(0, idx, v), fullgraph=True)
    out = step(torch.zeros(2), torch.tensor([1.0, 2.0**-24, 2.0**-24]))
    assert out.tolist() == [1.0, 2.0**-24] and sum(step.bitfold.counts.values()) == 1
    assert not mode._kernels["libraries"]
    torch._dynamo.reset()


def test_with_a_sparse_tensor_every_eager_node_runs_its_backward_exactly():
    """A product with a sparse factor, run by ATen below the function layer: its node is an
    ``MmBackward0``, fold-free for dense factors, whose backward here is a sparse product (a
    fold): once the process has a sparse tensor, no node is taken as fold-free."""

    @torch._dynamo.disable
    def product(a, x):  # outside Dynamo's graphs, below the function layer
        return torch.ops.aten.mm(a, x)

    torch._dynamo.reset()
    step = bt.compile(lambda a, x: product(a, x * 1.0) * 2.0)
    a = torch.ones(3, 1).to_sparse()
    x = torch.ones(1, 1, requires_grad=True)
    step(a, x).backward(torch.tensor([[0.5], [2.0**-25], [2.0**-25]]))
    assert x.grad.item() == 1 + 2.0**-23  # one rounding; torch's sum gives 1.0
    assert step.bitfold.counts["sparse_mm"] == 2, step.bitfold  # forward and backward
    torch._dynamo.reset()


def test_the_functions_eager_stretches_run_outside_the_mode_fold_nothing_forward():
    """Each function a compiled call's eager stretch runs without activating the exact mode,
    run on dense tensors under a full mode (which sees every ATen op): nothing counted, nothing
    passed. Their backward folds (a gather's) still get the exact rules: the test above."""
    from bitfold.torch.compiled import _GATHERS_AND_ELEMENTWISE

    x, w = _leaf(4, 6), _leaf(5, 6, seed=1)
    table, idx = _leaf(10, 6, seed=2), torch.tensor([0, 2, 2, 1])
    F = torch.nn.functional
    calls = {
        torch.Tensor.__getitem__: lambda: (x[idx], x[x > 0], x[1:3, idx[:2]]),
        torch.Tensor.__eq__: lambda: x == x,
        torch.Tensor.__bool__: lambda: bool(x[0, 0] > 0),
        torch.Tensor.size: lambda: x.size(),
        torch.Tensor.stride: lambda: x.stride(),
        torch.Tensor.dim: lambda: x.dim(),
        torch.Tensor.detach: lambda: x.detach(),
        torch.Tensor.to: lambda: x.to(torch.float64),
        torch.Tensor.chunk: lambda: x.chunk(2),
        torch.Tensor.unbind: lambda: x.unbind(),
        torch.Tensor.unsqueeze: lambda: x.unsqueeze(0),
        torch.Tensor.view: lambda: x.view(6, 4),
        torch.Tensor.reshape: lambda: x.reshape(3, 8),
        torch.Tensor.mul: lambda: x.mul(x),
        torch.Tensor.add: lambda: x.add(x),
        torch.where: lambda: torch.where(x > 0, x, w[:4]),
        torch.arange: lambda: torch.arange(5),
        torch.mm: lambda: torch.mm(x, w.T),
        torch.matmul: lambda: torch.matmul(x, w.T),
        F.linear: lambda: F.linear(x, w),
        F.embedding: lambda: F.embedding(idx, table),
    }
    assert set(calls) == set(_GATHERS_AND_ELEMENTWISE)  # every one of them is run here
    for func, call in calls.items():
        with bt.exact_mode(full=True) as mode:
            call()
        assert not mode.counts and not mode.passed, (func, mode.counts, mode.passed)
