"""``exact_mode()`` coverage (issue 19 part 2): segment_reduce, sparse @ dense, range errors, PyG.

Every result is compared bit for bit with the ``fractions.Fraction`` oracle
(the exact real value, rounded once), on values where a float sum rounds
differently (``1 + 2^-24 + 2^-24``), and each test shows that plain torch
gets such a case wrong, so that it can fail.
"""

from __future__ import annotations

import contextlib
import warnings
from fractions import Fraction

import pytest
from oracle import CANONICAL_NAN, round_fraction

import bitfold

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
bt = pytest.importorskip("bitfold.torch", reason="bitfold.torch needs PyTorch")

warnings.filterwarnings("ignore", message=".*[Ss]parse.*")

NAME = {torch.float32: "float32", torch.float64: "float64"}
INT = {4: torch.int32, 8: torch.int64}
TINY = {torch.float32: 2.0**-24, torch.float64: 2.0**-53}  # half an ulp of 1


def bits(t):
    return t.detach().contiguous().view(INT[t.element_size()])


def assert_bits(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    assert torch.equal(bits(got), bits(want)), (got, want)


def exact(fractions, dtype):
    """The correctly rounded value of a sum of Fractions, as a 0-d tensor of ``dtype``."""
    total = sum(fractions, Fraction(0))
    return torch.tensor(round_fraction(total, NAME[dtype]), dtype=torch.float64).to(dtype)


def F(t):
    return Fraction(float(t))


# -- segment_reduce -------------------------------------------------------------------------------
def _segment_case(dtype, axis):
    """Data whose first segment is 1, tiny, tiny (a float sum gives 1), with an empty segment."""
    tiny = TINY[dtype]
    g = torch.Generator().manual_seed(3)
    first = torch.tensor([1.0, tiny, tiny], dtype=torch.float64)
    rest = torch.randn(4, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(-20, 20, (4,))
    column = torch.cat([first, rest]).to(dtype)  # 7 elements along axis
    lengths = torch.tensor([3, 0, 2, 2])
    data = torch.stack([column, column.flip(0) * 3, column * -1], dim=1)  # (7, 3)
    if axis == 1:  # two batches of segments: lengths (2, S), data (2, 7, 3)
        data = torch.stack([data, data * 0.5])
        lengths = torch.stack([lengths, torch.tensor([0, 3, 4, 0])])
    return data, lengths


def _segment_oracle(data, lengths, axis, reduce, initial):
    dtype = data.dtype
    batches = data.reshape(-1, *data.shape[axis:]) if axis else data.unsqueeze(0)
    lens = lengths.reshape(-1, lengths.shape[-1])
    out = []
    for b in range(batches.shape[0]):
        start, rows = 0, []
        for n in lens[b].tolist():
            seg = batches[b, start : start + n]
            start += n
            cols = []
            for j in range(seg.shape[1]):
                terms = [F(x) for x in seg[:, j]] + ([Fraction(initial)] if initial else [])
                total = exact(terms, dtype)
                if reduce == "mean":
                    if n:
                        total = exact([F(total) / n], dtype)
                    elif initial is None:
                        total = torch.tensor(float("nan"), dtype=dtype)
                cols.append(total)
            rows.append(torch.stack(cols))
        out.append(torch.stack(rows))
    result = torch.stack(out)
    return result.reshape(*data.shape[:axis], lens.shape[1], *data.shape[axis + 1 :])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("by", ["lengths", "offsets"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("initial", [None, 0.5])
def test_segment_reduce_is_the_oracle(dtype, reduce, by, axis, initial):
    data, lengths = _segment_case(dtype, axis)
    kwargs = {"axis": axis, "initial": initial}
    if by == "lengths":
        kwargs["lengths"] = lengths
    else:
        kwargs["offsets"] = torch.nn.functional.pad(lengths.cumsum(-1), (1, 0))
    want = _segment_oracle(data, lengths, axis, reduce, initial)
    with bt.exact_mode() as mode:
        got = torch.segment_reduce(data, reduce, **kwargs)
    assert mode.counts["segment_reduce"] == 1
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    if nan.any():  # an empty mean without initial: torch's NaN, the canonical pattern
        assert (bits(got)[nan] == CANONICAL_NAN[NAME[dtype]]).all()
    assert_bits(torch.where(nan, 0, got), torch.where(nan, 0, want))
    plain = torch.segment_reduce(data, reduce, **kwargs)  # left to right: 1 + tiny + tiny == 1
    assert not torch.equal(bits(torch.where(nan, 0, plain)), bits(torch.where(nan, 0, want)))


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_segment_reduce_backward_is_a_gather(reduce):
    data, lengths = _segment_case(torch.float32, 0)
    data = data.clone().requires_grad_()
    grad = torch.randn(4, 3, generator=torch.Generator().manual_seed(5))
    with bt.exact_mode():
        torch.segment_reduce(data, reduce, lengths=lengths, initial=0.25).backward(grad)
    seg = torch.repeat_interleave(torch.arange(4), lengths)
    want = grad[seg]
    if reduce == "mean":  # one division each, correctly rounded: the Fraction oracle
        want = torch.stack(
            [
                torch.stack([exact([F(g) / int(lengths[s])], torch.float32) for g in grad[s]])
                for s in seg.tolist()
            ]
        )
    assert_bits(data.grad, want)


def test_segment_reduce_leaves_max_integer_and_bad_arguments_to_torch():
    data = torch.tensor([1.0, 5.0, 2.0])
    with bt.exact_mode() as mode:
        assert torch.segment_reduce(data, "max", lengths=torch.tensor([2, 1])).tolist() == [5, 2]
        with pytest.raises(RuntimeError):  # lengths that do not cover the data: torch's error
            torch.segment_reduce(data, "sum", lengths=torch.tensor([1, 1]))
        got = torch.segment_reduce(data, "sum", lengths=torch.tensor([1, 1]), unsafe=True)
    assert got.tolist() == [1.0, 5.0] and mode.counts["segment_reduce"] == 1
    assert not mode.passed


# -- sparse @ dense -------------------------------------------------------------------------------
def _sparse_case(dtype, layout, seed=1):
    """A 3x4 matrix and X (4x2): row 0 of A @ X is 1 + tiny + tiny (plus inexact products)."""
    tiny = TINY[dtype]
    rows = torch.tensor([0, 0, 0, 1, 2, 2, 0])
    cols = torch.tensor([0, 1, 2, 3, 0, 3, 3])
    g = torch.Generator().manual_seed(seed)
    odd = 1 + 2.0**-20 if dtype == torch.float32 else 1 + 2.0**-30  # products need two terms
    vals = torch.tensor([1.0, tiny, tiny, odd, odd, -3.0, 0.0], dtype=torch.float64)
    vals[-1] = float(torch.randn(1, generator=g)) * 2.0**-60
    X = torch.tensor([[1.0, odd], [1.0, 3.0], [1.0, -odd], [odd, 0.75]], dtype=torch.float64)
    vals, X = vals.to(dtype), X.to(dtype)
    if layout == "coo":
        return rows, cols, vals, X
    order = torch.argsort(rows * 4 + cols, stable=True)  # compressed layouts store sorted entries
    return rows[order], cols[order], vals[order], X


def _make(rows, cols, vals, shape, layout):
    A = torch.sparse_coo_tensor(torch.stack([rows, cols]), vals, shape)
    if layout == "csr":
        return A.to_sparse_csr()
    if layout == "csc":
        return A.to_sparse_csc()
    return A


def _mm_oracle(rows, cols, vals, X, M, C=None, beta=1.0, alpha=1.0):
    dtype = X.dtype
    out = torch.empty(M, X.shape[1], dtype=dtype)
    for i in range(M):
        for j in range(X.shape[1]):
            terms = [
                Fraction(alpha) * F(v) * F(X[c, j])
                for r, c, v in zip(rows.tolist(), cols.tolist(), vals, strict=True)
                if r == i
            ]
            if C is not None and beta != 0:
                terms.append(Fraction(beta) * F(C[i, j]))
            out[i, j] = exact(terms, dtype)
    return out


def _sampled_oracle(rows, cols, G, X, alpha=1.0, base=None):
    """Entry e: ``base[e] + alpha * sum_j G[rows[e], j] * X[cols[e], j]``, rounded once."""
    out = []
    for e, (r, c) in enumerate(zip(rows.tolist(), cols.tolist(), strict=True)):
        terms = [Fraction(alpha) * F(G[r, j]) * F(X[c, j]) for j in range(G.shape[1])]
        out.append(exact(terms + ([F(base[e])] if base is not None else []), G.dtype))
    return torch.stack(out)


PRODUCTS = {
    "matmul": lambda A, X: A @ X,
    "mm": lambda A, X: torch.mm(A, X),
    "sparse.mm": lambda A, X: torch.sparse.mm(A, X),
    "Tensor.mm": lambda A, X: A.mm(X),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
@pytest.mark.parametrize("call", sorted(PRODUCTS))
def test_sparse_left_products_and_both_gradients_are_the_oracle(dtype, layout, call):
    rows, cols, vals, X = _sparse_case(dtype, layout)
    v = vals.clone().requires_grad_()
    Xg = X.clone().requires_grad_()
    G = torch.tensor([[1.0, 3.0], [-2.0, 1.5], [0.5, 1.0]], dtype=dtype)
    G[0, 1] = TINY[dtype]  # the sampled product of entry (0, 0): 1 * 1 + tiny * odd
    with bt.exact_mode() as mode:
        A = _make(rows, cols, v, (3, 4), layout)
        out = PRODUCTS[call](A, Xg)
        out.backward(G)
    assert mode.counts["sparse_mm"] >= 1 and not mode.passed
    assert_bits(out, _mm_oracle(rows, cols, vals, X, 3))
    assert_bits(Xg.grad, _mm_oracle(cols, rows, vals, G, 4))  # A^T @ G
    assert_bits(v.grad, _sampled_oracle(rows, cols, G, X))
    plain = PRODUCTS[call](_make(rows, cols, vals, (3, 4), layout), X)
    assert plain[0, 0] == 1 and out[0, 0] > 1  # torch's float sum loses the two halves


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["coo", "csr", "csc"])
def test_sparse_right_products_and_both_gradients_are_the_oracle(dtype, layout):
    rows, cols, vals, X = _sparse_case(dtype, layout)
    v = vals.clone().requires_grad_()
    Y = X.t().contiguous().requires_grad_()  # (2, 4) @ A^T-shaped (4, 3)
    G = torch.tensor([[1.0, -2.0, 0.5], [TINY[dtype], 1.5, 1.0]], dtype=dtype)
    with bt.exact_mode() as mode:
        A = _make(cols, rows, v, (4, 3), layout)  # A[k, i]: the left case transposed
        out = Y @ A
        out.backward(G)
    assert mode.counts["sparse_mm"] == 1 and not mode.passed
    assert_bits(out, _mm_oracle(rows, cols, vals, X, 3).t())
    assert_bits(Y.grad, _mm_oracle(cols, rows, vals, G.t(), 4).t())
    assert_bits(v.grad, _sampled_oracle(rows, cols, G.t(), X))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("beta, alpha", [(1.0, 1.0), (0.5, 2.0), (0.1, 0.3), (0.0, 3.0)])
def test_sparse_addmm_rounds_beta_c_plus_alpha_product_once(dtype, layout, beta, alpha):
    rows, cols, vals, X = _sparse_case(dtype, layout)
    C = torch.tensor([[TINY[dtype], 1.0], [3.0, -1.0], [0.1, 7.0]], dtype=dtype)
    if beta == 0:
        C[1, 1] = float("nan")  # ignored, as torch ignores it
    v, Cg = vals.clone().requires_grad_(), C.clone().requires_grad_()
    G = torch.ones(3, 2, dtype=dtype)
    with bt.exact_mode() as mode:
        A = _make(rows, cols, v, (3, 4), layout)
        out = torch.addmm(Cg, A, X, beta=beta, alpha=alpha)
        out.backward(G)
    assert mode.counts["sparse_mm"] == 1
    rounded = [torch.tensor(s, dtype=torch.float64).to(dtype).item() for s in (beta, alpha)]
    want = _mm_oracle(rows, cols, vals, X, 3, C, *rounded)
    assert_bits(out, want)
    assert_bits(v.grad, _sampled_oracle(rows, cols, G, X, rounded[1]))
    assert_bits(Cg.grad, G * beta)
    plain = torch.addmm(C, _make(rows, cols, vals, (3, 4), layout), X, beta=beta, alpha=alpha)
    assert beta == 0 or not torch.equal(bits(plain), bits(want))


def test_sparse_products_at_the_aten_level_are_exact_too():
    """Calls the function layer does not see (torch.ops) still get exact forwards."""
    rows, cols, vals, X = _sparse_case(torch.float32, "csr")
    A = _make(rows, cols, vals, (3, 4), "csr")
    want = _mm_oracle(rows, cols, vals, X, 3)
    with bt.exact_mode() as mode:
        assert_bits(torch.ops.aten.mm(A, X), want)
        assert_bits(torch.ops.aten._sparse_addmm(torch.zeros(3, 2), A, X), want)
        assert_bits(torch.ops.aten._sparse_mm_reduce_impl(A, X, "sum")[0], want)
        mean = torch.sparse.mm(A, X, "mean")
        G = torch.tensor([[1.0, TINY[torch.float32]], [1.0, 1.0], [1.0, 1.0]])
        sampled = torch.sparse.sampled_addmm(A, G, X.t().contiguous())
    counts = torch.bincount(rows, minlength=3).clamp(min=1).view(-1, 1)
    assert_bits(mean, want / counts)
    assert_bits(sampled.values(), _sampled_oracle(*_csr_entries(A), G, X, base=A.values()))
    assert mode.counts["sparse_mm"] == 4 and mode.counts["sparse_sampled_addmm"] == 1


def _csr_entries(A):
    rows = torch.repeat_interleave(torch.arange(A.shape[0]), A.crow_indices().diff())
    return rows, A.col_indices()


def test_coalescing_duplicates_is_exact_and_sparse_at_sparse_is_recorded():
    tiny = TINY[torch.float32]
    i = torch.tensor([[0, 1, 0, 0], [2, 0, 2, 2]])
    v = torch.tensor([1.0, 3.0, tiny, tiny])
    A = torch.sparse_coo_tensor(i, v, (2, 3))
    with bt.exact_mode() as mode:
        c, csr = A.coalesce(), A.to_sparse_csr()
        A @ A.t()  # sparse @ sparse: a sparse result, left to torch and recorded
    want = 1 + 2 * tiny
    assert c.values().tolist() == [want, 3.0] and csr.values().tolist() == [want, 3.0]
    assert A.coalesce().values()[0] == 1  # torch's own sum of the duplicates
    assert mode.counts["coalesce"] == 2
    assert any("sparse @ sparse" in k for k in mode.passed)
    with pytest.raises(bitfold.FoldError, match="sparse @ sparse"):
        with bt.exact_mode(strict=True):
            A @ A.t()


# -- IndexRangeError ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [5, -5])
def test_index_put_out_of_range_names_the_id_and_the_size(bad):
    x = torch.zeros(3, 2)
    with bt.exact_mode():
        with pytest.raises(bitfold.IndexRangeError, match=rf"= {bad} .*input\.shape\[0\] = 3"):
            x.index_put_((torch.tensor([0, bad]),), torch.ones(2, 2), accumulate=True)
        with pytest.raises(bitfold.IndexRangeError, match=rf"= {bad} .*input\.shape\[0\] = 3"):
            torch.ops.aten._unsafe_index_put(x, [torch.tensor([bad])], torch.ones(1, 2), True)
        with pytest.raises(bitfold.IndexRangeError, match=r"= 3 .*input\.shape\[0\] = 3"):
            x.index_put_((torch.tensor([0, 3]), torch.tensor([1, 1])), torch.ones(2), True)
        with pytest.raises(bitfold.IndexRangeError, match=r"= 6 .*input\.numel\(\) = 6"):
            x.put_(torch.tensor([6]), torch.ones(1), accumulate=True)  # put: flat positions
        with pytest.raises(bitfold.IndexRangeError, match=r"\[1, 0\] = 3 .*input\.shape\[0\] = 3"):
            x.scatter_add_(0, torch.tensor([[0, 1], [3, 1]]), torch.ones(2, 2))
        with pytest.raises(bitfold.IndexRangeError, match=r"\[0, 1\] = 2 .*input\.shape\[1\] = 2"):
            x.scatter_add_(1, torch.tensor([[0, 2]]), torch.ones(1, 2))  # element by element
    with pytest.raises(IndexError):  # torch's own error outside the mode
        x.index_put_((torch.tensor([0, bad]),), torch.ones(2, 2), accumulate=True)


def test_the_backward_of_an_index_into_a_table_checks_its_ids():
    """A backward that folds into ``w[idx]`` refuses ids beyond the table (a stale index)."""
    w = torch.zeros(3, 2, requires_grad=True)
    idx = torch.tensor([0, 2])
    with bt.exact_mode():
        out = w[idx]
        grad = torch.ones_like(out)
        torch.autograd.grad(out, w, grad)  # fine
        with pytest.raises(bitfold.IndexRangeError, match=r"= 3 .*input\.shape\[0\] = 3"):
            # the same fold that w[idx]'s backward runs, with an id one past the table
            torch.ops.aten.index_put(torch.zeros(3, 2), [torch.tensor([0, 3])], grad, True)


def test_bitfold_embeddings_refuse_an_id_beyond_the_table():
    table = r"input < weight\.shape\[0\] = 10"  # the bound as the caller knows it
    with pytest.raises(bitfold.IndexRangeError, match=r"input\[1\] = 10 .*" + table):
        bt.Embedding(10, 4)(torch.tensor([1, 10]))
    with pytest.raises(bitfold.IndexRangeError, match=r"= -1 .*" + table):
        bt.Embedding(10, 4)(torch.tensor([[-1, 2]]))
    with pytest.raises(bitfold.IndexRangeError, match=r"= 12 .*" + table):
        bt.EmbeddingBag(10, 4, mode="sum")(torch.tensor([1, 12, 3]), torch.tensor([0, 2]))
    with pytest.raises(bitfold.IndexRangeError, match=r"= 10 .*" + table):
        bt.embedding(torch.tensor([10]), torch.zeros(10, 2))


# -- torch_geometric ------------------------------------------------------------------------------
def _graph(n=8, seed=0):
    """A random graph plus the edge 1 -> 0 three times, weighted 1, 2^-24, 2^-24.

    Node 0 gets no other edge. Summed in that order the three weights give 1;
    in the reverse order 1 + 2^-23: a float fold of node 0's degree and
    messages (or of the repeated coordinate, when a sparse adjacency is
    coalesced) depends on the edge order.
    """
    g = torch.Generator().manual_seed(seed)
    src = torch.cat([torch.tensor([1, 1, 1]), torch.randint(0, n, (3 * n,), generator=g)])
    dst = torch.cat([torch.tensor([0, 0, 0]), torch.randint(1, n, (3 * n,), generator=g)])
    x = torch.randn(n, 5, generator=g) * 2.0 ** torch.randint(-8, 8, (n, 1), generator=g)
    weight = torch.rand(src.numel(), generator=g) + 0.5
    weight[:3] = torch.tensor([1.0, 2.0**-24, 2.0**-24])
    return x, torch.stack([src, dst]), weight


def _gcn_step(kind, order, exact, deterministic=False):
    """One SGD step of a GCNConv: the digest of its output, parameters and their gradients."""
    from torch_geometric import EdgeIndex
    from torch_geometric.nn import GCNConv

    x, edges, weight = _graph()
    edges, weight = edges[:, order], weight[order]
    n = x.shape[0]
    torch.manual_seed(0)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        conv = GCNConv(5, 4, normalize=kind == "edge_index", add_self_loops=False)
        mode = bt.exact_mode() if exact else None
        with mode if mode is not None else contextlib.nullcontext():
            args: tuple = (x, edges, weight)
            if kind in ("coo", "csr"):  # built inside the mode: coalescing sums the duplicates
                adj = torch.sparse_coo_tensor(edges.flip(0), weight, (n, n))
                args = (x, adj if kind == "coo" else adj.to_sparse_csr())
            elif kind == "segment":  # PyG's deterministic path: sorted EdgeIndex -> segment_reduce
                conv.fuse = False
                sort = torch.argsort(edges[1], stable=True)
                index = EdgeIndex(edges[:, sort], sparse_size=(n, n), sort_order="col")
                args = (x, index, weight[sort])
            out = conv(*args)
            (out**2).sum().backward()  # the forward's bits reach the gradients
            with torch.no_grad():
                for p in conv.parameters():
                    p -= 0.125 * p.grad
        tensors = [out.detach()] + [t.detach() for p in conv.parameters() for t in (p, p.grad)]
        return bitfold.digest({str(i): t for i, t in enumerate(tensors)}), mode
    finally:
        torch.use_deterministic_algorithms(previous)


@pytest.mark.parametrize("kind", ["edge_index", "coo", "csr", "segment"])
def test_gcn_conv_step_has_one_digest_for_any_edge_order_under_exact_mode(kind):
    pytest.importorskip("torch_geometric", reason="torch_geometric is not installed")
    n_edges = _graph()[1].shape[1]
    shuffled = torch.randperm(n_edges - 3, generator=torch.Generator().manual_seed(9)) + 3
    orders = [torch.arange(n_edges), torch.cat([shuffled, torch.tensor([2, 1, 0])])]
    exact = [_gcn_step(kind, o, True, deterministic=kind == "segment") for o in orders]
    again = _gcn_step(kind, orders[1], True, deterministic=kind == "segment")
    assert exact[0][0] == exact[1][0] == again[0]
    mode = exact[0][1]
    assert not mode.passed, mode.passed
    expected = {"edge_index": "scatter_add", "coo": "sparse_mm", "csr": "sparse_mm",
                "segment": "segment_reduce"}[kind]  # fmt: skip
    assert mode.counts[expected] >= 1, mode.counts
    plain = [_gcn_step(kind, o, False, deterministic=kind == "segment")[0] for o in orders]
    assert plain[0] != plain[1]  # plain torch: the edge order changes the bits


def test_a_module_traced_outside_the_mode_folds_exactly_inside_it():
    """The documented way around torch.jit.trace's check: trace outside, run inside."""

    class Messages(torch.nn.Module):
        def forward(self, x, dst):
            return torch.zeros(1, x.shape[1]).index_add(0, dst, x)

    x = torch.tensor([[1.0], [2.0**-24], [2.0**-24]])
    dst = torch.zeros(3, dtype=torch.int64)
    traced = torch.jit.trace(Messages(), (x, dst))
    assert traced(x, dst).item() == 1.0  # torch's sum: 1 + 2^-24 rounds to 1, twice
    with bt.exact_mode() as mode:
        got = traced(x, dst)
    assert got.item() == round_fraction(Fraction(1) + Fraction(2, 2**24), "float32")
    assert mode.counts["index_add"] == 1


def test_exact_mode_and_compile_refuse_unknown_options_by_name():
    with pytest.raises(bitfold.FoldError, match=r"exact_mode\(\) takes no option turbo=.*strict="):
        bt.exact_mode(turbo=1)
    with pytest.raises(bitfold.FoldError, match=r"positional"):
        bt.exact_mode(True)
    with pytest.raises(
        bitfold.FoldError, match=r"compile\(\) takes no option turbo=.*fullgraph=.*strict="
    ) as info:
        bt.compile(lambda x: x, turbo=1)
    assert info.value.__cause__ is None and info.value.__context__ is None
    assert bt.compile(lambda x: x + 1, name="kept", recompile_limit=2) is not None  # torch's own
