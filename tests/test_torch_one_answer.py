"""One answer whatever the path: the same messages summed through every API give the same bits.

A graph layer can send ``w * x[src]`` into ``dst`` through an ``edge_index`` fold
(``index_add``, ``scatter_add``, ``scatter_reduce``), a ``torch_sparse`` product, a
``torch.sparse`` matrix (COO, CSR, CSC; ``mm``, ``addmm``, ``mv``, ``addmv``, the reduce
kernel), sorted
segments (``segment_reduce``) or an embedding bag with per-sample weights. Under
``exact_mode()`` and ``bitfold.torch.compile`` every path gives the Fraction oracle's
rounding of the sum of the **rounded** products (each ``w * x`` rounded to float32, as torch
computes it), one rounding; means are those sums divided once by the count. The exact dot
product is there by name (``exact_mode(products="exact")``) and differs.
"""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")

import torch.nn.functional as F  # noqa: E402
import torch_oracle as to  # noqa: E402

import bitfold  # noqa: E402
import bitfold.torch as bt  # noqa: E402
from bitfold.torch import extension_ops  # noqa: E402

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

NODES, EDGES, FEATURES = 16, 120, 4


def _graph():
    """Edges sorted by ``dst`` (the compressed layouts and segments need that order), weights and
    features over 40 binary orders: the sums of rounded and of exact products differ."""
    gen = torch.Generator().manual_seed(11)
    pairs = torch.randperm(NODES * NODES, generator=gen)  # distinct (dst, src): no entry merges
    pairs = pairs[pairs // NODES != 3][:EDGES].sort().values  # node 3 gets no edge
    dst, src = pairs // NODES, pairs % NODES

    def wide(shape):
        scale = torch.tensor(2.0).pow(torch.randint(-20, 20, shape, generator=gen))
        return (torch.rand(shape, generator=gen) + 0.5) * scale * (
            torch.randint(0, 2, shape, generator=gen) * 2 - 1)  # fmt: skip

    return src, dst, wide((EDGES,)), wide((NODES, FEATURES))


SRC, DST, W, X = _graph()
COUNTS = torch.bincount(DST, minlength=NODES)


def _messages():
    return W.view(-1, 1) * X[SRC]  # each product rounded to float32: torch's own rounding


def _want(mean=False):
    out = to.fold_into(torch.zeros(NODES, FEATURES), to.positions_of(torch.zeros(NODES,
                       FEATURES))[DST], _messages(), start=None)  # fmt: skip
    if mean:
        out = to.divided(out, COUNTS.clamp(min=1).view(-1, 1).float())
    return out


def _matrix(layout):
    A = torch.sparse_coo_tensor(torch.stack([DST, SRC]), W, (NODES, NODES)).coalesce()
    return {"coo": A, "csr": A.to_sparse_csr(), "csc": A.to_sparse_csc()}[layout]


def _rows():
    return DST.view(-1, 1).expand(EDGES, FEATURES)


# -- every path: name -> (function of x, is a mean) ---------------------------------------------
PATHS = {
    "index_add": (lambda x: torch.zeros(NODES, FEATURES).index_add(
        0, DST, W.view(-1, 1) * x[SRC]), False),
    "scatter_add": (lambda x: torch.zeros(NODES, FEATURES).scatter_add(
        0, _rows(), W.view(-1, 1) * x[SRC]), False),
    "scatter_reduce sum": (lambda x: torch.zeros(NODES, FEATURES).scatter_reduce(
        0, _rows(), W.view(-1, 1) * x[SRC], "sum", include_self=False), False),
    "scatter_reduce mean": (lambda x: torch.zeros(NODES, FEATURES).scatter_reduce(
        0, _rows(), W.view(-1, 1) * x[SRC], "mean", include_self=False), True),
    "segment_reduce sum": (lambda x: torch.segment_reduce(
        W.view(-1, 1) * x[SRC], "sum", lengths=COUNTS), False),
    "segment_reduce mean": (lambda x: torch.nan_to_num(torch.segment_reduce(
        W.view(-1, 1) * x[SRC], "mean", lengths=COUNTS)), True),
    "embedding_bag per_sample_weights": (lambda x: F.embedding_bag(
        SRC, x, torch.cat([torch.zeros(1, dtype=torch.int64), COUNTS.cumsum(0)[:-1]]),
        mode="sum", per_sample_weights=W), False),
    "torch_sparse spmm_sum": (lambda x: extension_ops.spmm_sum(
        None, torch.cat([torch.zeros(1, dtype=torch.int64), COUNTS.cumsum(0)]), SRC, W, None,
        None, x), False),
    "torch_sparse spmm_mean": (lambda x: extension_ops.spmm_mean(
        None, torch.cat([torch.zeros(1, dtype=torch.int64), COUNTS.cumsum(0)]), SRC, W, None,
        None, None, x), True),
    **{f"sparse.mm {layout}": ((lambda x, layout=layout: torch.sparse.mm(_matrix(layout), x)),
                               False) for layout in ("coo", "csr", "csc")},
    **{f"addmm {layout}": ((lambda x, layout=layout: torch.addmm(
        torch.zeros(NODES, FEATURES), _matrix(layout), x)), False) for layout in ("coo", "csr")},
    **{f"mv {layout}": ((lambda x, layout=layout: torch.stack([torch.mv(
        _matrix(layout), x[:, j]) for j in range(FEATURES)], 1)), False)
       for layout in ("coo", "csr", "csc")},
    "addmv csr": (lambda x: torch.stack([torch.addmv(torch.zeros(NODES), _matrix("csr"),
                                                     x[:, j]) for j in range(FEATURES)], 1),
                  False),
    "sparse.mm csr mean": (lambda x: torch.sparse.mm(_matrix("csr"), x, "mean"), True),
    "_sparse_mm_reduce_impl csr": (lambda x: torch.ops.aten._sparse_mm_reduce_impl(
        _matrix("csr"), x, "sum")[0], False),
}  # fmt: skip


def _bits(t):
    return t.detach().contiguous().view(torch.int32)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_gives_the_sum_of_the_rounded_products_in_exact_mode(path):
    fn, mean = PATHS[path]
    with bt.exact_mode(strict=True) as mode:
        got = fn(X)
    assert sum(mode.counts.values()) >= 1, path
    assert torch.equal(_bits(got), _bits(_want(mean))), path


@pytest.mark.parametrize("path", sorted(PATHS))
def test_every_path_gives_the_same_bits_under_compile(path):
    torch._dynamo.reset()
    fn, mean = PATHS[path]
    compiled = bt.compile(fn)
    got = compiled(X)
    assert sum(compiled.bitfold.counts.values()) >= 1 and not compiled.bitfold.passed, path
    assert torch.equal(_bits(got), _bits(_want(mean))), path
    torch._dynamo.reset()


def test_the_exact_dot_product_is_there_by_name_and_differs():
    A = _matrix("csr")
    with bt.exact_mode(products="exact"):
        exact = torch.sparse.mm(A, X)
    terms = W.double().view(-1, 1) * X.double()[SRC]  # each product exact in float64
    target = torch.zeros(NODES, FEATURES)
    want = to.fold_into(target, to.positions_of(target)[DST], terms, start=None)  # one rounding
    assert torch.equal(_bits(exact), _bits(want))
    assert not torch.equal(_bits(exact), _bits(_want()))  # other bits than the rule's
    with pytest.raises(bitfold.FoldError, match=r"products=.*rounded, exact.*'fused'"):
        bt.exact_mode(products="fused")


def test_embedding_backward_is_index_add_of_the_gradient_rows():
    table = X.clone().requires_grad_()
    G = _messages()
    with bt.exact_mode(strict=True):
        F.embedding(SRC, table).backward(G)
        by_index_add = torch.zeros(NODES, FEATURES).index_add(0, SRC, G)
    assert torch.equal(_bits(table.grad), _bits(by_index_add))


def test_pyg_message_passing_gives_one_answer_by_edge_index_and_by_sparse_matrix():
    """PyG's ``WLConvContinuous`` aggregates ``w * x_j`` by its ``edge_index`` (a scatter) or
    by a sparse adjacency (``torch.sparse.mm``); in the mode both give the same bits, for 300
    graphs of PyG's own test's shape (4 sources, 2 targets, random weights)."""
    pyg = pytest.importorskip("torch_geometric", reason="the test extras install torch_geometric")
    conv = pyg.nn.WLConvContinuous()
    edge_index = torch.tensor([[0, 1, 2, 3, 0, 2], [0, 0, 1, 1, 1, 0]])
    differ = 0
    for seed in range(300):
        gen = torch.Generator().manual_seed(seed)
        x1, x2 = torch.randn(4, 8, generator=gen), torch.randn(2, 8, generator=gen)
        weight = torch.randn(edge_index.size(1), generator=gen)
        adj_t = torch.sparse_coo_tensor(edge_index.flip(0), weight, (2, 4)).to_sparse_csr()
        with bt.exact_mode(strict=True):
            by_edges = conv.propagate(edge_index, x=(x1, x2), edge_weight=weight, size=(4, 2))
            by_matrix = conv.propagate(adj_t, x=(x1, x2), edge_weight=None)
        differ += not torch.equal(_bits(by_edges), _bits(by_matrix))
    assert differ == 0
