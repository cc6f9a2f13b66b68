"""Every row of the fold rules' table through ``bitfold.torch.compile``: made exact or reported.

A fold in a compiled function must be exact (counted in ``.bitfold.counts``) or
listed in ``.bitfold.passed``, never neither; where it is exact it gives the
bits ``exact_mode()`` gives, forward and backward. Dynamo cannot trace sparse
tensors, so a function that touches one runs outside any graph: those rows show
that the compiled call's own guard sees what Dynamo runs itself. Each case runs
in ``exact_mode()`` too, to show that it exercises its row.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")

import torch.nn.functional as F  # noqa: E402

import bitfold  # noqa: E402
import bitfold.torch as bt  # noqa: E402
from bitfold.torch import rules  # noqa: E402

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

K, N, D = 5, 24, 3


def wide(shape, seed, dtype=torch.float32):
    """Values over many binary orders, both signs, with 1 + tiny + tiny first: order matters."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.tensor(2.0).pow(torch.randint(-24, 4, shape, generator=gen))
    sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
    out = (torch.rand(shape, generator=gen) * scale * sign).to(dtype)
    flat = out.view(-1)
    if flat.numel() >= 3:
        flat[:3] = torch.tensor([1.0, 2.0**-24, 2.0**-24], dtype=dtype)
    return out


IDX = torch.tensor([0, 0, 0, *([1, 2, 3, 4, 2, 0] * 4)][:N])
ROWS = IDX[:, None].expand(N, D)
OFFSETS = torch.tensor([0, 5, 5, 17])


def _coo(uncoalesced=True):
    """A 4 x 6 COO matrix whose first coordinate repeats 3 times (1, tiny, tiny)."""
    rows = torch.tensor([0, 0, 0, 1, 2, 3, 3, 1, 2])
    cols = torch.tensor([1, 1, 1, 0, 5, 2, 4, 3, 5])
    A = torch.sparse_coo_tensor(torch.stack([rows, cols]), wide((9,), 7), (4, 6))
    return A if uncoalesced else A.coalesce()


def _grad(*leaves):
    """Leaves that need a gradient (fresh copies)."""
    return [x.detach().clone().requires_grad_() for x in leaves]


# -- one case a row: name -> (build the inputs, the function) ----------------------------------
# A case's function returns (outputs, leaves): each output's gradient (``wide`` values) is taken
# into the leaves, so that backward folds run too.
def _x_src():
    return wide((K, D), 1), wide((N, D), 2)


CASES = {
    "scatter_add": lambda: (lambda x, s: ([x.scatter_add(0, ROWS, s)], [x, s]), _grad(*_x_src())),
    "scatter": lambda: (lambda x, s: ([x.scatter(0, ROWS, s, reduce="add")], []), _x_src()),
    "scatter_reduce": lambda: (
        lambda x, s: ([x.scatter_reduce(0, ROWS, s, "mean")], [x, s]), _grad(*_x_src())),
    "index_add": lambda: (lambda x, s: ([x.index_add(0, IDX, s)], [x, s]), _grad(*_x_src())),
    "index_reduce": lambda: (lambda x, s: ([x.index_reduce(0, IDX, s, "mean")], []), _x_src()),
    "index_put": lambda: (lambda w: ([w[IDX]], [w]), _grad(wide((K, D), 3))),
    "_unsafe_masked_index_put_accumulate": lambda: (
        lambda w: ([F.embedding(IDX, w)], [w]), _grad(wide((K, D), 4))),
    "put": lambda: (lambda w: ([w.take(IDX)], [w]), _grad(wide((K,), 5))),
    "embedding_dense_backward": lambda: (
        lambda w: ([F.embedding(IDX, w, padding_idx=4)], [w]), _grad(wide((K, D), 6))),
    "_embedding_bag_backward": lambda: (
        lambda w: ([F.embedding_bag(IDX, w, OFFSETS, mode="mean")], [w]), _grad(wide((K, D), 8))),
    "_embedding_bag": lambda: (
        lambda w: ([F.embedding_bag(IDX, w, OFFSETS, mode="sum")], []), (wide((K, D), 9),)),
    "_embedding_bag_forward_only": lambda: (
        lambda w: ([F.embedding_bag(IDX, w, OFFSETS, mode="sum")], []), (wide((K, D), 9),)),
    "max_pool2d_with_indices_backward": lambda: (
        lambda x: ([F.max_pool2d(x, 3, stride=1)], [x]), _grad(wide((1, 1, 5, 5), 10))),
    "max_pool3d_with_indices_backward": lambda: (
        lambda x: ([F.max_pool3d(x, 2, stride=1)], [x]), _grad(wide((1, 1, 3, 3, 3), 11))),
    "grid_sampler_2d_backward": lambda: (
        lambda x, g: ([F.grid_sample(x, g, align_corners=False)], [x]),
        (*_grad(wide((1, 1, 4, 4), 12)), torch.rand(1, 3, 3, 2) * 2 - 1)),
    "bincount": lambda: (lambda i, w: ([torch.bincount(i, w, K)], []), (IDX, wide((N,), 13))),
    "histogram": lambda: (
        lambda x, w: ([torch.histogram(x, 4, range=(-1.0, 1.0), weight=w)[0]], []),
        (torch.linspace(-0.9, 0.9, N), wide((N,), 14))),
    "_histogramdd_from_bin_cts": lambda: (
        lambda x, w: ([torch.histogramdd(x, [2, 3], range=[-1.0, 1.0, -1.0, 1.0],
                                         weight=w)[0]], []),
        (torch.rand(N, 2) * 1.8 - 0.9, wide((N,), 15))),
    "_coalesce": lambda: (lambda A: ([A.coalesce().to_dense()], []), (_coo(),)),
    "_to_sparse_csr": lambda: (lambda A: ([A.to_sparse_csr().values()], []), (_coo(),)),
    "_to_sparse_csc": lambda: (lambda A: ([A.to_sparse_csc().values()], []), (_coo(),)),
    "_to_sparse": lambda: (
        lambda A: ([A.to_sparse(layout=torch.sparse_csr).values()], []), (_coo(),)),
    "_to_dense": lambda: (lambda A: ([A.to_dense()], []), (_coo(),)),
    "_sparse_sum": lambda: (
        lambda A: ([torch.sparse.sum(A, dim=1).to_dense()], []), (_coo(),)),
    "segment_reduce": lambda: (
        lambda s: ([torch.segment_reduce(s, "sum", lengths=torch.tensor([3, 0, 9, 12]))], [s]),
        _grad(wide((N, D), 16))),
    "mm": lambda: (lambda A, x: ([torch.mm(A, x)], [x]), (_coo(False), *_grad(wide((6, D), 17)))),
    "addmm": lambda: (
        lambda C, A, x: ([torch.addmm(C, A, x, beta=0.5)], [x]),
        (wide((4, D), 18), _coo(False), *_grad(wide((6, D), 17)))),
    "mv": lambda: (lambda A, x: ([torch.mv(A, x)], [x]),
                   (_coo(False).to_sparse_csr(), *_grad(wide((6,), 23)))),
    "addmv": lambda: (
        lambda b, A, x: ([torch.addmv(b, A, x, beta=0.5)], [x]),
        (wide((4,), 24), _coo(False).to_sparse_csr(), *_grad(wide((6,), 25)))),
    "_sparse_mm": lambda: (
        lambda A, x: ([torch.sparse.mm(A, x)], [x]), (_coo(False), *_grad(wide((6, D), 19)))),
    "_sparse_mm_reduce_impl": lambda: (
        lambda A, x: ([torch.sparse.mm(A, x, "sum")], [x]),
        (_coo(False).to_sparse_csr(), *_grad(wide((6, D), 20)))),
    "sparse_sampled_addmm": lambda: (
        lambda S, a, b: ([torch.sparse.sampled_addmm(S, a, b).values()], []),
        (_coo(False).to_sparse_csr(), wide((4, 8), 21), wide((8, 6), 22))),
}
#: cases whose function needs no gradient recorded (the forward-only overloads)
NO_GRAD = {"_embedding_bag_forward_only"}
#: a weighted bincount's output length depends on the ids: only ``fullgraph=True`` keeps its exact
#: op in the graph (elsewhere Dynamo runs it after a graph break, exact but not counted)
FULLGRAPH = {"bincount"}


def row_name(rule: rules.Rule) -> str:
    """A row's name: its first ATen overload packet."""
    return rule.ops[0]._qualified_op_name.split("::")[-1]


def test_every_row_has_a_case():
    names = {row_name(rule) for rule in rules.RULES}
    assert names == set(CASES), (names - set(CASES), set(CASES) - names)


def _run(fn, inputs, name):
    with torch.no_grad() if name in NO_GRAD else torch.enable_grad():
        outs, leaves = fn(*inputs)
    grads = []
    if leaves:
        weights = [wide(o.shape, 30 + i) for i, o in enumerate(outs)]
        grads = torch.autograd.grad(outs, leaves, weights)
    return [o.detach() for o in outs], list(grads)


def _kind(name: str) -> str:
    (rule,) = [r for r in rules.RULES if row_name(r) == name]
    return rule.kind


def _same(a, b):
    if a.layout != torch.strided:
        a, b = a.to_dense(), b.to_dense()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.int32), b.contiguous().view(torch.int32)
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_row_is_counted_or_passed_under_compile(name):
    torch._dynamo.reset()
    fn, inputs = CASES[name]()
    kind = _kind(name)
    with bt.exact_mode() as mode:
        want_out, want_grad = _run(fn, inputs, name)
    assert mode.counts[kind] or any(k.startswith(kind) for k in mode.passed), (mode, name)
    compiled = bt.compile(fn, fullgraph=name in FULLGRAPH)
    got_out, got_grad = _run(compiled, inputs, name)
    report = compiled.bitfold
    # inductor decomposes some folds into others (index_add into index_put): any kind counts
    passed = [k for k in report.passed if k.startswith(kind)]
    assert sum(report.counts.values()) or passed, (name, report)
    if not passed:  # exact: the mode's bits, forward and backward
        assert all(_same(g, w) for g, w in zip(got_out, want_out, strict=True)), name
        assert all(_same(g, w) for g, w in zip(got_grad, want_grad, strict=True)), name
    torch._dynamo.reset()


def _spmm_data(layout):
    """A 7 x 50 matrix of 400 weights over 40 binary orders: float sums depend on their order."""
    gen = torch.Generator().manual_seed(42)
    coords = torch.stack([torch.randint(0, 7, (400,), generator=gen),
                          torch.randint(0, 50, (400,), generator=gen)])  # fmt: skip
    A = torch.sparse_coo_tensor(coords, wide((400,), 43), (7, 50)).coalesce()
    A = {"coo": A, "csr": A.to_sparse_csr()}[layout]
    return A, wide((50, 8), 40), wide((7, 8), 41)


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("how", ["closure", "argument", "module"])
def test_sparse_products_are_exact_under_compile(layout, how):
    """``torch.sparse.mm`` runs outside Dynamo's graphs: still exact, counted, forward and back."""
    torch._dynamo.reset()
    A, x0, g = _spmm_data(layout)

    class Layer(torch.nn.Module):
        def forward(self, A, x):
            return torch.sparse.mm(A, x) * 2

    def by_argument(A, x):
        return torch.sparse.mm(A, x) * 2

    def run(fn):
        x = x0.clone().requires_grad_()
        y = fn(x) if how == "closure" else fn(A, x)
        (dx,) = torch.autograd.grad(y, x, g)
        return y.detach(), dx

    eager = {"closure": lambda x: torch.sparse.mm(A, x) * 2, "argument": by_argument,
             "module": Layer()}[how]  # fmt: skip
    with bt.exact_mode():
        want = run(eager)
    compiled = bt.compile(eager)
    got = run(compiled)
    assert all(_same(a, b) for a, b in zip(got, want, strict=True))
    assert compiled.bitfold.counts["sparse_mm"] == 1  # one exact product (its backward inside)
    assert not compiled.bitfold.passed
    plain = run(torch.compile(eager))
    assert not all(_same(a, b) for a, b in zip(plain, want, strict=True))  # plain torch differs
    torch._dynamo.reset()


def test_strict_refuses_what_runs_outside_the_graphs_and_cannot_be_exact():
    """A fold Dynamo runs itself and bitfold cannot make exact is refused by strict=True."""
    torch._dynamo.reset()
    A = _coo(False).to(torch.complex64)
    x = torch.randn(6, 2, dtype=torch.complex64)
    fn = bt.compile(lambda A, x: torch.sparse.mm(A, x), strict=True)
    with pytest.raises(bitfold.FoldError, match="strict=True"):
        fn(A, x)
    lenient = bt.compile(lambda A, x: torch.sparse.mm(A, x))
    lenient(A, x)
    assert any(k.startswith("sparse_mm") for k in lenient.bitfold.passed)
    torch._dynamo.reset()
