"""PyTorch drop-ins (issue 11): ``exact_mode()``, the functions and the embedding modules.

Each drop-in is compared with the torch function it replaces (values close,
same shapes and dtypes) and with the oracle (every element the correctly
rounded sum of its terms, bit for bit), and is shown to give the same bits
for any order of the contributions, where torch's own op does not.
"""

from __future__ import annotations

import contextlib
import doctest

import numpy as np
import oracle
import pytest
import torch_oracle as to
from oracle import exact_fold_oracle

import bitfold

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
bt = pytest.importorskip("bitfold.torch", reason="bitfold.torch needs PyTorch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
NAME = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
        torch.float64: "float64"}  # fmt: skip
TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-5, torch.float64: 1e-12}
INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


@pytest.fixture(autouse=True)
def _bfloat16_oracle(monkeypatch):
    monkeypatch.setitem(oracle.FORMATS, "bfloat16", (8, -133, 127))


def bits(t):
    return t.detach().contiguous().view(INT[t.element_size()])


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def close(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    tol = TOL.get(want.dtype, 0)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


def spread(shape, dtype, seed, wide=20):
    """Values over many binary orders, so that the order of additions changes float sums."""
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.float16:
        wide = min(wide, 6)
    scale = 2.0 ** torch.randint(-wide, wide + 1, shape, generator=g).double()
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def test_docstring_examples():
    for module in (bt, bt.ops, bt.functional, bt.layers, bt.mode):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# -- functions ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize(("dim", "alpha"), [(0, 1), (1, 2.5), (-1, -0.75)])
def test_index_add_is_torch_within_rounding_and_the_oracle_exactly(dtype, dim, alpha):
    x = spread((6, 5, 4), dtype, 1)
    n = 9
    d = dim % 3
    index = torch.randint(0, x.shape[d], (n,), generator=torch.Generator().manual_seed(2))
    src_shape = list(x.shape)
    src_shape[d] = n
    source = spread(tuple(src_shape), dtype, 3)
    got = bt.index_add(x, dim, index, source, alpha=alpha)
    close(got, torch.index_add(x, dim, index, source, alpha=alpha))
    assert same_bits(got, to.index_add(x, dim, index, source, alpha=alpha))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("kind", ["expanded", "random", "smaller", "dim1"])
def test_scatter_add_is_torch_within_rounding_and_the_oracle_exactly(dtype, kind):
    g = torch.Generator().manual_seed(4)
    x = spread((5, 6), dtype, 5)
    dim = 0
    if kind == "expanded":  # graph libraries: one target node per edge, expanded over features
        index = torch.randint(0, 5, (12,), generator=g)[:, None].expand(12, 6)
        src = spread((12, 6), dtype, 6)
    elif kind == "random":
        index = torch.randint(0, 5, (12, 6), generator=g)
        src = spread((12, 6), dtype, 6)
    elif kind == "smaller":  # index smaller than src and than input outside dim
        index = torch.randint(0, 5, (7, 4), generator=g)
        src = spread((12, 6), dtype, 6)
    else:
        dim = 1
        index = torch.randint(0, 6, (5, 1), generator=g).expand(5, 9)
        src = spread((5, 9), dtype, 6)
    got = bt.scatter_add(x, dim, index, src)
    close(got, torch.scatter_add(x, dim, index, src))
    assert same_bits(got, to.scatter_add(x, dim, index, src))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("trailing", [(), (3,), (2, 2)])
def test_segment_sum_is_torch_within_rounding_and_the_oracle_exactly(dtype, trailing):
    index = torch.randint(0, 6, (4, 10), generator=torch.Generator().manual_seed(7))
    values = spread((4, 10, *trailing), dtype, 8)
    got = bt.segment_sum(values, index, 6)
    rows = values.reshape(40, -1)
    zeros = torch.zeros(6, rows.shape[1], dtype=dtype)
    close(got, zeros.index_add(0, index.reshape(-1), rows).reshape(6, *trailing))
    targets = index.reshape(-1, 1) * rows.shape[1] + torch.arange(rows.shape[1])
    assert same_bits(got, to.fold_into(zeros, targets, rows, start=None).reshape(got.shape))


def test_segment_sum_keeps_negative_zero_and_empty_buckets():
    got = bt.segment_sum(torch.tensor([-0.0, -0.0, 1.0]), torch.tensor([0, 0, 2]), 3)
    assert [str(v) for v in got.tolist()] == ["-0.0", "0.0", "1.0"]


def _orders(n, count=4, seed=11):
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n, generator=g) for _ in range(count)]


def test_functions_give_the_same_bits_for_any_order_where_torch_does_not():
    x = spread((7, 5), torch.float32, 12)
    index = torch.randint(0, 7, (400,), generator=torch.Generator().manual_seed(13))
    src = spread((400, 5), torch.float32, 14, wide=30)
    ours = {"index_add": [], "scatter_add": [], "segment_sum": []}
    theirs = {"index_add": [], "scatter_add": []}
    for perm in _orders(400):
        i, s = index[perm], src[perm]
        e = i[:, None].expand(400, 5)
        ours["index_add"].append(bt.index_add(x, 0, i, s, alpha=3.0))
        ours["scatter_add"].append(bt.scatter_add(x, 0, e, s))
        ours["segment_sum"].append(bt.segment_sum(s, i, 7))
        theirs["index_add"].append(torch.index_add(x, 0, i, s, alpha=3.0))
        theirs["scatter_add"].append(torch.scatter_add(x, 0, e, s))
    for results in ours.values():
        assert all(same_bits(r, results[0]) for r in results)
    for results in theirs.values():  # the order of the additions shows in torch's bits
        assert not all(same_bits(r, results[0]) for r in results)


def test_integer_tensors_go_to_torch():
    x = torch.arange(12).view(4, 3)
    i = torch.tensor([0, 3, 3])
    src = torch.arange(9).view(3, 3)
    assert torch.equal(bt.index_add(x, 0, i, src, alpha=2), torch.index_add(x, 0, i, src, alpha=2))
    e = i[:, None].expand(3, 3)
    assert torch.equal(bt.scatter_add(x, 0, e, src), torch.scatter_add(x, 0, e, src))
    assert bt.segment_sum(src, i, 4).tolist() == [[0, 1, 2], [0, 0, 0], [0, 0, 0], [9, 11, 13]]


def test_gradients_of_the_functions():
    g = torch.Generator().manual_seed(15)
    f64 = {"dtype": torch.float64, "requires_grad": True}
    x, source = torch.randn(5, 3, **f64), torch.randn(5, 4, **f64)
    index = torch.tensor([2, 0, 2])
    assert torch.autograd.gradcheck(lambda a, b: bt.index_add(a, 1, index, b[:, :3], alpha=1.5),
                                    (x, source))  # fmt: skip
    assert torch.autograd.gradgradcheck(lambda a, b: bt.index_add(a, 0, index, b[:3, :3]) ** 2,
                                        (x, source))  # fmt: skip
    src = torch.randn(6, 4, **f64)
    small = torch.randint(0, 5, (4, 2), generator=g)  # smaller than src: the rest gets zeros
    assert torch.autograd.gradcheck(lambda a, b: bt.scatter_add(a, 0, small, b[:, :3]), (x, src))
    values = torch.randn(8, 2, **f64)
    ids = torch.randint(0, 4, (8,), generator=g)
    assert torch.autograd.gradcheck(lambda v: bt.segment_sum(v, ids, 4), (values,))
    assert torch.autograd.gradgradcheck(lambda v: bt.segment_sum(v, ids, 4) ** 2, (values,))
    table = torch.randn(6, 3, **f64)
    tokens = torch.tensor([[1, 0, 5], [5, 5, 2]])
    # (padding_idx and scale_grad_by_freq change the gradient on purpose: tested against torch)
    assert torch.autograd.gradcheck(lambda w: bt.embedding(tokens, w), (table,))
    psw = torch.randn(6, **f64)
    flat, offsets = torch.tensor([1, 0, 5, 5, 2, 3]), torch.tensor([0, 2, 2])
    assert torch.autograd.gradcheck(
        lambda w, p: bt.embedding_bag(flat, w, offsets, mode="sum", per_sample_weights=p),
        (table, psw))  # fmt: skip
    assert torch.autograd.gradcheck(
        lambda w: bt.embedding_bag(tokens, w, mode="mean", padding_idx=0), (table,)
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_of_the_index_operators(dtype):
    g = torch.Generator().manual_seed(16)

    def t(*shape):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_()

    def ids(high, *shape):
        return torch.randint(0, high, shape, generator=g)

    ops = torch.ops.bitfold
    cases = [
        (ops.embedding.default, (t(5, 3), ids(5, 2, 4), 1, True)),
        (ops.segment_sum.default, (t(6, 3), ids(4, 6), 4)),
        (ops.index_add.default, (t(4, 3), 1, torch.tensor([0, 2, 2]), t(4, 3), 1.5)),
        (ops.scatter_add.default, (t(4, 3), 0, ids(4, 2, 3), t(5, 3))),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_functions_and_modules_under_torch_compile_match_eager():
    torch.manual_seed(0)
    emb, bag = bt.Embedding(10, 4, padding_idx=0), bt.EmbeddingBag(10, 4, mode="mean")

    def step(tokens, x, idx, src, dst):
        h = emb(tokens).square().sum() + bag(tokens).square().sum()
        y = bt.index_add(x, 0, idx, src, alpha=2.0).square().sum()
        z = bt.scatter_add(x, 0, dst, src).square().sum()
        return h + y + z + bt.segment_sum(src, idx, 7).square().sum()

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 10, (3, 5), generator=g)
    x = torch.randn(7, 4, generator=g).requires_grad_()
    src = torch.randn(6, 4, generator=g).requires_grad_()
    idx = torch.randint(0, 7, (6,), generator=g)
    params = (x, src, emb.weight, bag.weight)
    results = []
    # aot_eager traces through dynamo and AOT autograd like inductor, without C++ code generation
    for fn in (step, torch.compile(step, fullgraph=True, backend="aot_eager")):
        for p in params:
            p.grad = None
        out = fn(tokens, x, idx, src, idx[:, None].expand(6, 4))
        out.backward()
        results.append([out.detach(), *[p.grad.clone() for p in params]])
    assert all(same_bits(a, b) for a, b in zip(*results, strict=True))


def test_functions_on_empty_zero_dim_and_non_contiguous_tensors():
    x = spread((3, 2), torch.float32, 17)
    none = torch.zeros(0, dtype=torch.int64)
    assert same_bits(bt.index_add(x, 0, none, torch.zeros(0, 2)), x)
    assert same_bits(bt.scatter_add(x, 0, none.view(0, 2), torch.zeros(0, 2)), x)
    assert same_bits(bt.segment_sum(torch.zeros(0, 2), none, 3), torch.zeros(3, 2))
    s = torch.tensor(1.0)
    assert bt.index_add(s, 0, torch.tensor([0]), torch.tensor(2.0)).item() == 3.0
    assert bt.scatter_add(s, 0, torch.tensor(0), torch.tensor(2.0)).item() == 3.0
    xt, src = spread((4, 6), torch.float32, 18).t(), spread((4, 5), torch.float32, 19).t()
    i = torch.tensor([0, 3, 3, 1, 5])
    assert same_bits(bt.index_add(xt, 0, i, src), to.index_add(xt, 0, i, src))
    e = torch.randint(0, 4, (4, 5), generator=torch.Generator().manual_seed(20)).t()
    assert same_bits(bt.scatter_add(xt, 1, e, src), to.scatter_add(xt, 1, e, src))
    with pytest.raises(bitfold.IndexRangeError, match=r"index\[0, 1\] = 7 .*input\.shape\[1\] = 4"):
        bt.scatter_add(xt, 1, e.clone().index_fill_(1, torch.tensor([1]), 7), src)


def test_function_refusals():
    x, i = torch.zeros(4, 3), torch.tensor([0, 1])
    with pytest.raises(bitfold.FoldTypeError, match="complex64"):
        bt.index_add(x.to(torch.complex64), 0, i, torch.zeros(2, 3, dtype=torch.complex64))
    with pytest.raises(bitfold.FoldTypeError, match="integers"):
        bt.index_add(x, 0, i.float(), torch.zeros(2, 3))
    with pytest.raises(bitfold.FoldTypeError, match="float64"):
        bt.index_add(x, 0, i, torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(bitfold.ShapeError, match="index_add: source has 3 entries along dim 0"):
        bt.index_add(x, 0, i, torch.zeros(3, 3))
    with pytest.raises(bitfold.ShapeError, match="dimension 1: 2 != 3"):
        bt.index_add(x, 0, i, torch.zeros(2, 2))
    with pytest.raises(bitfold.DeviceError, match="meta"):
        bt.index_add(x.to("meta"), 0, i, torch.zeros(2, 3, device="meta"))
    with pytest.raises(bitfold.IndexRangeError):
        bt.index_add(x, 0, torch.tensor([0, 4]), torch.zeros(2, 3))
    with pytest.raises(bitfold.ShapeError, match="scatter_add: index of shape"):
        bt.scatter_add(x, 0, torch.zeros(2, 4, dtype=torch.int64), torch.zeros(2, 3))
    with pytest.raises(bitfold.ShapeError, match="same number of dimensions"):
        bt.scatter_add(x, 0, i, torch.zeros(2, 3))
    with pytest.raises(bitfold.ShapeError, match=r"index_add: dim 2 is out of range .* 2 dim"):
        bt.index_add(x, 2, i, torch.zeros(2, 3))
    with pytest.raises(bitfold.ShapeError, match="scatter_add: dim -3 is out of range"):
        bt.scatter_add(x, -3, torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3))
    with pytest.raises(bitfold.FoldError, match="K must be a positive integer"):
        bt.segment_sum(torch.zeros(2), i, 0)
    with pytest.raises(bitfold.ShapeError, match=r"index\.shape \+ trailing"):
        bt.segment_sum(torch.zeros(3), i, 2)
    with pytest.raises(bitfold.IndexRangeError):
        bt.segment_sum(torch.zeros(2), torch.tensor([0, -1]), 2)


# -- modules --------------------------------------------------------------------------------------
def _twins(cls, ours, *args, **kwargs):
    """A torch module and ours with the same weights (through the state dict)."""
    torch.manual_seed(0)
    theirs = cls(*args, **kwargs)
    mine = ours(*args, **kwargs)
    mine.load_state_dict(theirs.state_dict())
    return theirs, mine


@pytest.mark.parametrize("options", [{}, {"padding_idx": 2}, {"padding_idx": -1},
                                     {"scale_grad_by_freq": True, "padding_idx": 0},
                                     {"max_norm": 1.0}])  # fmt: skip
def test_embedding_is_nn_embedding_with_an_exact_gradient(options):
    theirs, mine = _twins(nn.Embedding, bt.Embedding, 9, 4, **options)
    assert isinstance(mine, nn.Embedding) and mine.padding_idx == theirs.padding_idx
    tokens = torch.randint(0, 9, (6, 7), generator=torch.Generator().manual_seed(1))
    grad = spread((6, 7, 4), torch.float32, 2)
    outs = []
    for m in (theirs, mine):
        out = m(tokens)
        (out * grad).sum().backward()
        outs.append(out)
    close(outs[1], outs[0])
    close(mine.weight.grad, theirs.weight.grad)
    close(mine.weight.detach(), theirs.weight.detach())  # max_norm renormalised both alike
    # the gradient is the oracle's: per column, the exact sum of the (scaled) rows of each id
    ids = tokens.reshape(-1)
    rows = grad.reshape(-1, 4).double()
    if options.get("scale_grad_by_freq"):
        rows = (grad.reshape(-1, 4) / torch.bincount(ids, minlength=9)[ids, None].float()).double()
    if mine.padding_idx is not None:
        rows[ids == mine.padding_idx] = 0
    want = np.stack([exact_fold_oracle(ids.numpy(), rows[:, c].numpy(), 9) for c in range(4)], 1)
    assert same_bits(mine.weight.grad, torch.from_numpy(want))


def test_embedding_from_pretrained_state_dicts_and_refusals():
    table = torch.randn(5, 3)
    mine = bt.Embedding.from_pretrained(table, padding_idx=1)
    assert type(mine) is bt.Embedding and not mine.weight.requires_grad
    assert torch.equal(mine(torch.tensor([4, 1])), table[[4, 1]])
    theirs = nn.Embedding(5, 3)
    theirs.load_state_dict(mine.state_dict())  # both ways, strict
    mine.load_state_dict(nn.Embedding(5, 3).state_dict())
    assert set(mine.state_dict()) == set(theirs.state_dict()) == {"weight"}
    assert repr(mine).startswith("Embedding(5, 3")
    with pytest.raises(bitfold.FoldError, match="sparse=True"):
        bt.Embedding(5, 3, sparse=True)
    with pytest.raises(bitfold.FoldError, match="sparse=True"):
        bt.Embedding.from_pretrained(table, sparse=True)
    with pytest.raises(bitfold.ShapeError, match="padding_idx 7"):
        bt.embedding(torch.tensor([0]), table, padding_idx=7)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_embedding_in_other_dtypes(dtype):
    theirs, mine = _twins(nn.Embedding, bt.Embedding, 6, 3, dtype=dtype)
    tokens = torch.randint(0, 6, (20,), generator=torch.Generator().manual_seed(3))
    grad = spread((20, 3), dtype, 4)
    for m in (theirs, mine):
        (m(tokens) * grad).sum().backward()
    assert mine.weight.grad.dtype == dtype
    assert same_bits(mine.weight.grad, to.embedding_weight_grad(grad, tokens, 6))
    close(theirs.weight.grad, mine.weight.grad)  # torch's own sums, within rounding


BAG_CASES = [
    {"mode": "sum", "offsets": True},
    {"mode": "mean", "offsets": True},
    {"mode": "sum", "offsets": False},
    {"mode": "mean", "offsets": False, "padding_idx": 3},
    {"mode": "sum", "offsets": True, "per_sample_weights": True},
    {"mode": "sum", "offsets": True, "per_sample_weights": True, "padding_idx": 0},
    {"mode": "mean", "offsets": True, "include_last_offset": True, "padding_idx": 1},
    {"mode": "sum", "offsets": True, "max_norm": 1.0},
]


@pytest.mark.parametrize(
    "case", BAG_CASES, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items())
)
def test_embedding_bag_is_nn_embedding_bag_with_exact_sums(case):
    case = dict(case)
    with_offsets, with_psw = case.pop("offsets"), case.pop("per_sample_weights", False)
    theirs, mine = _twins(nn.EmbeddingBag, bt.EmbeddingBag, 8, 5, **case)
    assert isinstance(mine, nn.EmbeddingBag)
    g = torch.Generator().manual_seed(5)
    if with_offsets:
        ids = torch.randint(0, 8, (20,), generator=g)
        offsets = torch.tensor([0, 3, 3, 9, 14])  # an empty bag included
        if case.get("include_last_offset"):
            offsets = torch.cat([offsets, torch.tensor([20])])
        args = (ids, offsets)
    else:
        ids = torch.randint(0, 8, (5, 4), generator=g)
        args = (ids,)
    psw = spread(tuple(ids.shape), torch.float32, 6).requires_grad_() if with_psw else None
    grad = spread((5, 5), torch.float32, 7)
    outs, psw_grads = [], []
    for m in (theirs, mine):
        out = m(*args, per_sample_weights=psw)
        (out * grad).sum().backward()
        outs.append(out)
        if psw is not None:
            psw_grads.append(psw.grad.clone())
            psw.grad = None
    close(outs[1], outs[0])  # torch's module computes the same thing, its own way
    close(mine.weight.grad, theirs.weight.grad)
    assert same_bits(mine.weight.detach(), theirs.weight.detach())  # max_norm: torch's renorm
    # the sums and the weight gradient are the oracle's, bit for bit (from the renormed weights)
    options = {k: v for k, v in case.items() if k != "max_norm"}
    weight = mine.weight.detach()
    psw_arg = None if psw is None else psw.detach()
    want_out = to.embedding_bag(ids, weight, *args[1:], per_sample_weights=psw_arg, **options)
    assert same_bits(outs[1], want_out)
    want_grad = to.embedding_bag_weight_grad(grad, ids, weight, *args[1:],
                                             per_sample_weights=psw_arg, **options)  # fmt: skip
    assert same_bits(mine.weight.grad, want_grad)
    if psw is not None:  # a dot product of a gradient row and a weight row: no fold, no bits
        close(psw_grads[1], psw_grads[0])


def test_embedding_bag_sums_and_gradient_do_not_depend_on_the_order():
    torch.manual_seed(0)
    bag = bt.EmbeddingBag(6, 3, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(spread((6, 3), torch.float32, 8, wide=30))
    g = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 6, (40, 10), generator=g)
    grad = spread((40, 3), torch.float32, 10, wide=30)
    results = []
    for perm in _orders(40):
        within = torch.argsort(torch.rand(40, 10, generator=g), dim=1)  # and inside each bag
        bag.zero_grad()
        out = bag(ids[perm].gather(1, within))
        (out * grad[perm]).sum().backward()
        results.append((out[torch.argsort(perm)].detach(), bag.weight.grad.clone()))
    for out, wgrad in results:
        assert same_bits(out, results[0][0]) and same_bits(wgrad, results[0][1])


def test_embedding_bag_from_pretrained_state_dicts_and_refusals():
    table = torch.randn(5, 3)
    mine = bt.EmbeddingBag.from_pretrained(table, freeze=False, mode="sum")
    assert type(mine) is bt.EmbeddingBag and mine.weight.requires_grad
    nn.EmbeddingBag(5, 3).load_state_dict(mine.state_dict())
    mine.load_state_dict(nn.EmbeddingBag(5, 3).state_dict())
    with pytest.raises(bitfold.FoldError, match=r"mode 'max'.*exact_mode"):
        bt.EmbeddingBag(5, 3, mode="max")
    with pytest.raises(bitfold.FoldError, match="sparse=True"):
        bt.EmbeddingBag(5, 3, sparse=True)
    bag = bt.EmbeddingBag(5, 3)  # mode mean
    ids = torch.tensor([0, 1, 2])
    with pytest.raises(bitfold.FoldError, match="per_sample_weights need mode='sum'"):
        bag(ids, torch.tensor([0]), per_sample_weights=torch.ones(3))
    with pytest.raises(bitfold.ShapeError, match=r"offsets\[0\] must be 0"):
        bag(ids, torch.tensor([1]))
    with pytest.raises(bitfold.ShapeError, match="offsets must be None"):
        bag(ids.view(1, 3), torch.tensor([0]))
    with pytest.raises(bitfold.ShapeError, match="needs 1-D offsets"):
        bag(ids)
    bag.mode = "max"  # changed after construction
    with pytest.raises(bitfold.FoldError, match="mode 'max'"):
        bag(ids.view(1, 3))


# -- exact_mode -----------------------------------------------------------------------------------
def _x(*shape, seed=20, dtype=torch.float32):
    return spread(shape, dtype, seed)


class T:
    """A floating tensor argument of a mode case, made by the test that runs it: spread values
    (:func:`_x`) against torch, adversarial ones (:func:`_adversarial`) against the oracle, in
    the test's dtype unless the case names one."""

    def __init__(self, *shape, seed=20, dtype=None):
        self.shape, self.seed, self.dtype = shape, seed, dtype

    def make(self, maker, dtype):
        return maker(*self.shape, seed=self.seed, dtype=self.dtype or dtype)


def _made(args, maker, dtype=torch.float32):
    return [a.make(maker, dtype) if isinstance(a, T) else a for a in args]


def _into_new_out(op):
    return lambda *args, **kwargs: op(*args, **kwargs, out=torch.empty(0, dtype=args[0].dtype))


I3 = torch.tensor([0, 2, 2, 4, 0, 2])
E3 = I3[:, None].expand(6, 3)
SCATTER = (T(5, 3), 0, E3, T(6, 3, seed=21))
INDEX = (T(5, 3), 0, I3, T(6, 3, seed=21))
Tensor = torch.Tensor

MODE_CASES = {
    # name: (kind counted, op run inside and outside the mode, its oracle (same arguments),
    #        positional arguments (T: a float tensor the test makes), keyword arguments)
    "scatter_add": ("scatter_add", Tensor.scatter_add, to.scatter_add, SCATTER, {}),
    "scatter_add_": ("scatter_add", Tensor.scatter_add_, to.scatter_add, (T(5, 3), 1, torch.randint(
        0, 3, (5, 4), generator=torch.Generator().manual_seed(1)), T(5, 4, seed=21)), {}),
    "scatter_add.out": ("scatter_add", _into_new_out(torch.scatter_add), to.scatter_add, SCATTER,
                        {}),
    "scatter_ add": ("scatter_add", Tensor.scatter_, to.scatter, SCATTER, {"reduce": "add"}),
    "scatter_ add value": ("scatter_add", Tensor.scatter_, to.scatter, (T(5, 3), 0, E3, 0.25),
                           {"reduce": "add"}),
    "scatter_reduce sum": ("scatter_reduce", Tensor.scatter_reduce, to.scatter_reduce,
                           (*SCATTER, "sum"), {"include_self": False}),
    "scatter_reduce_ mean": ("scatter_reduce", Tensor.scatter_reduce_, to.scatter_reduce,
                             (*SCATTER, "mean"), {}),
    "scatter_reduce mean excl": ("scatter_reduce", Tensor.scatter_reduce, to.scatter_reduce,
                                 (*SCATTER, "mean"), {"include_self": False}),
    "index_add": ("index_add", Tensor.index_add, to.index_add, INDEX, {"alpha": 2}),
    "index_add_": ("index_add", Tensor.index_add_, to.index_add,
                   (T(3, 5), 1, I3, T(3, 6, seed=21)), {}),
    "index_reduce mean incl": ("index_reduce", Tensor.index_reduce, to.index_reduce,
                               (*INDEX, "mean"), {}),
    "scatter_reduce sum incl": ("scatter_reduce", Tensor.scatter_reduce, to.scatter_reduce,
                                (*SCATTER, "sum"), {}),
    "index_reduce_ mean": ("index_reduce", Tensor.index_reduce_, to.index_reduce,
                           (*INDEX, "mean"), {"include_self": False}),
    "index_put": ("index_put", Tensor.index_put, to.index_put, (T(5, 3), (I3,), T(6, 3, seed=21)),
                  {"accumulate": True}),
    "index_put_ 2 indices": ("index_put", Tensor.index_put_, to.index_put, (T(5, 3), (
        I3, torch.tensor([1, 1, 1, 0, 2, -1])), T(6, seed=21)), {"accumulate": True}),
    "index_put broadcast": ("index_put", Tensor.index_put_, to.index_put,
                            (T(5, 3), (I3,), T(3, seed=21)), {"accumulate": True}),
    "put_": ("put", Tensor.put_, to.put, (T(5, 3), torch.tensor([1, 14, 1, -1]), T(4, seed=21)),
             {"accumulate": True}),
    "bincount": ("bincount", torch.bincount, to.bincount, (I3, T(6, seed=21)), {"minlength": 7}),
    "bincount f16": ("bincount", torch.bincount, to.bincount,
                     (I3, T(6, seed=21, dtype=torch.float16)), {}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MODE_CASES))
def test_mode_forward_ops_match_torch_and_are_counted(name):
    kind, op, _, args, kwargs = MODE_CASES[name]
    with bt.exact_mode() as mode:
        got = op(*_made(args, _x), **kwargs)
    close(got, op(*_made(args, _x), **kwargs))
    assert mode.counts == {kind: 1} and not mode.passed


def _grad_of(table_shape, forward, seed=30, dtype=torch.float32):
    table = spread(table_shape, dtype, seed).requires_grad_()
    out = forward(table)
    (out * spread(tuple(out.shape), dtype, seed + 1)).sum().backward()
    return table.grad


def _gathered(forward):
    """A gather's case: ``forward`` and its gradient's oracle, each output-gradient element
    summed into the table element ``forward`` read it from (``forward`` of the positions)."""
    def oracle(table, upstream):
        return to.fold_into(torch.zeros_like(table), forward(to.positions_of(table)), upstream)

    return forward, oracle


def _embedding(tokens, **options):
    return (lambda w: F.embedding(tokens, w, **options),
            lambda w, up: to.embedding_weight_grad(up, tokens, w.shape[0], **options))


def _bag(ids, offsets, **options):
    def given(w):  # per-sample weights in the table's dtype
        psw = options.get("per_sample_weights")
        return options if psw is None else {**options, "per_sample_weights": psw.to(w.dtype)}

    return (lambda w: F.embedding_bag(ids, w, offsets, **given(w)),
            lambda w, up: to.embedding_bag_weight_grad(up, ids, w, offsets, **given(w)))


#: ids of a table of 6 rows, about four times each: sums of several terms a row
TOKENS = torch.randint(0, 6, (3, 8), generator=torch.Generator().manual_seed(3))
FLAT, OFFSETS = TOKENS[:2].reshape(-1), torch.tensor([0, 5, 5, 12])  # an empty bag included
PSW = _x(16, seed=40)
BACKWARD_CASES = {
    # name: (kind counted, table shape, (forward of the table, oracle(table, output gradient)))
    "x[idx]": ("index_put", (6, 3), _gathered(lambda w: w[TOKENS])),
    "x[idx, j]": ("index_put", (6, 3), _gathered(lambda w: w[TOKENS, 1])),
    "x[:, idx]": ("index_put", (3, 6), _gathered(lambda w: w[:, TOKENS])),
    "x[mask]": ("index_put", (6, 3), _gathered(lambda w: w[torch.arange(18).view(6, 3) % 4 == 1])),
    "gather": ("scatter_add", (6, 3), _gathered(lambda w: w.gather(1, TOKENS.T[:6] % 3))),
    "index_select": ("index_add", (6, 3), _gathered(lambda w: w.index_select(0, TOKENS.view(-1)))),
    "take": ("put", (6, 3), _gathered(lambda w: w.take(TOKENS * 3))),
    "embedding": ("embedding_dense_backward", (6, 3), _embedding(TOKENS)),
    "embedding padding freq": ("embedding_dense_backward", (6, 3), _embedding(
        TOKENS, padding_idx=5, scale_grad_by_freq=True)),
    "bag sum": ("embedding_bag_backward", (6, 3), _bag(FLAT, OFFSETS, mode="sum")),
    "bag mean padding": ("embedding_bag_backward", (6, 3), _bag(
        FLAT, OFFSETS, mode="mean", padding_idx=0)),
    "bag max": ("embedding_bag_backward", (6, 3), _bag(FLAT, OFFSETS, mode="max")),
    "bag psw": ("embedding_bag_backward", (6, 3), _bag(
        FLAT, OFFSETS, mode="sum", per_sample_weights=PSW)),
    "bag 2-D last offset": ("embedding_bag_backward", (6, 3), _bag(
        FLAT, torch.tensor([0, 7, 16]), mode="mean", include_last_offset=True)),
    "bag freq, one id a row": ("embedding_bag_backward", (6, 3), _bag(
        torch.tensor([1, 0, 5, 3]), torch.tensor([0, 2]), mode="sum", scale_grad_by_freq=True)),
}  # fmt: skip


#: Cases where the mode follows torch's documentation rather than torch 2.13's CPU kernel (the
#: mode's docstring): each term divided by its own id's frequency; ids after the last offset in
#: no bag. Only the oracle says what they give.
DOCUMENTED_BACKWARD_CASES = {
    "bag mean freq": ("embedding_bag_backward", (6, 3), _bag(
        FLAT, OFFSETS, mode="mean", scale_grad_by_freq=True)),
    "bag ids after the last offset": ("embedding_bag_backward", (6, 3), _bag(
        FLAT, torch.tensor([0, 7, 12]), mode="sum", include_last_offset=True)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(BACKWARD_CASES))
def test_mode_backward_ops_match_torch_and_are_counted(name):
    kind, shape, (forward, _) = BACKWARD_CASES[name]
    with bt.exact_mode() as mode:
        got = _grad_of(shape, forward)
    close(got, _grad_of(shape, forward))
    assert mode.counts[kind] == 1 and not mode.passed  # (and the forward's, if it folds)


def test_mode_embedding_bag_frequency_scaling_follows_the_documentation():
    """torch 2.13's CPU kernel divides by another id's count (pytorch/pytorch#190063)."""
    table = torch.zeros(6, 1, requires_grad=True)
    with bt.exact_mode():
        F.embedding_bag(FLAT, table, torch.tensor([0, 2, 2]), mode="sum",
                        scale_grad_by_freq=True).sum().backward()  # fmt: skip
    counts = torch.bincount(FLAT, minlength=6).float()
    want = torch.where(counts > 0, torch.ones(6), torch.zeros(6))  # each id: count * (1 / count)
    assert table.grad.view(-1).tolist() == want.tolist()


def test_ids_after_the_last_offset_belong_to_no_bag():
    """torch 2.13's CPU backward gives their rows values (uninitialised memory); ours: zeros."""
    ids, offsets = torch.tensor([1, 0, 5, 4, 3]), torch.tensor([0, 2, 3])
    table = torch.ones(6, 1, requires_grad=True)
    with bt.exact_mode():
        F.embedding_bag(ids, table, offsets, mode="sum", include_last_offset=True).sum().backward()
    assert table.grad.view(-1).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    table.grad = None
    out = bt.embedding_bag(ids, table, offsets, mode="sum", include_last_offset=True)
    out.sum().backward()
    assert out.view(-1).tolist() == [2.0, 1.0]
    assert table.grad.view(-1).tolist() == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_mode_results_are_the_oracle_and_do_not_depend_on_the_order():
    """The backward of ``w[ids]`` (index_put) and the forward index_add, for permuted data."""
    ids = torch.randint(0, 7, (300,), generator=torch.Generator().manual_seed(50))
    grads = spread((300, 4), torch.float32, 51, wide=30)
    init = spread((7, 4), torch.float32, 52)
    ours, theirs = [], []
    for perm in _orders(300):
        for exact, store in ((True, ours), (False, theirs)):
            w = torch.zeros(7, 4, requires_grad=True)
            with bt.exact_mode() if exact else contextlib.nullcontext():
                (w[ids[perm]] * grads[perm]).sum().backward()
                added = init.index_add(0, ids[perm], grads[perm])
            store.append((w.grad, added))
    want = np.stack([exact_fold_oracle(ids.numpy(), grads[:, c].numpy(), 7) for c in range(4)], 1)
    assert same_bits(ours[0][0], torch.from_numpy(want))
    assert same_bits(ours[0][1], to.index_add(init, 0, ids, grads))
    for g, a in ours:
        assert same_bits(g, ours[0][0]) and same_bits(a, ours[0][1])
    assert not all(same_bits(a, theirs[0][1]) for _, a in theirs)


def test_mode_leaves_integer_folds_and_other_ops_untouched():
    i = torch.tensor([0, 1, 1])
    with bt.exact_mode() as mode:
        ints = torch.zeros(3, dtype=torch.int64).index_add(0, i, torch.tensor([1, 2, 3]))
        written = torch.zeros(3).index_put((i,), torch.ones(3))  # no accumulate: a write
        total = torch.ones(4).sum()
        amax = torch.zeros(3).scatter_reduce(0, i, torch.ones(3), "amax")
        counts = torch.bincount(i)
    assert ints.tolist() == [1, 5, 0] and written.tolist() == [1, 1, 0] and total.item() == 4
    assert amax.tolist() == [1, 1, 0] and counts.tolist() == [1, 2]
    assert not mode.counts and not mode.passed


def test_mode_records_what_it_cannot_make_exact_and_strict_refuses_it():
    i = torch.tensor([0, 1, 1])
    c = torch.ones(3, dtype=torch.complex64)
    with bt.exact_mode() as mode:
        out = torch.zeros(3, dtype=torch.complex64).index_add(0, i, c)
        prod = torch.ones(3).scatter_reduce(0, i, torch.full((3,), 2.0), "prod")
    assert out.tolist() == [1, 2, 0] and prod.tolist() == [2, 4, 1]
    assert not mode.counts
    assert set(mode.passed) == {
        "index_add: complex64: bitfold folds float16 .. float64 only",
        "scatter_reduce: reduce='prod': a product, not a sum",
    }
    with pytest.raises(bitfold.FoldError, match=r"strict=True.*complex64"):
        with bt.exact_mode(strict=True):
            torch.zeros(3, dtype=torch.complex64).index_add(0, i, c)
    table = torch.zeros(4, 2, requires_grad=True)
    ids = torch.tensor([1, 1, 1])
    weight = torch.tensor([1.0, 2.0**-24, 2.0**-24]).view(3, 1)
    with bt.exact_mode() as mode:
        (F.embedding(ids, table, sparse=True) * weight).sum().backward()
        summed = table.grad.coalesce()  # the sparse gradient's duplicates, summed exactly
    assert summed.values()[0].tolist() == [1 + 2.0**-23] * 2 and mode.counts["coalesce"] == 1
    assert table.grad.coalesce().values()[0].tolist() == [1.0, 1.0]  # torch's own sum


def test_mode_under_torch_compile_runs_eagerly_or_refuses():
    ids = torch.tensor([0, 2, 2, 4])

    def loss(w):
        return (w[ids] * 2).square().sum()

    w = torch.randn(5, 3, requires_grad=True)
    compiled = torch.compile(loss, backend="aot_eager")
    with bt.exact_mode() as mode:  # Dynamo compiles nothing under a dispatch mode: op by op
        compiled(w).backward()
    assert mode.counts == {"index_put": 1}

    def loss2(w):
        return (w[ids] * 2).square().sum()

    with pytest.raises(RuntimeError, match="dispatch mode"):  # fullgraph: torch refuses
        with bt.exact_mode():
            torch.compile(loss2, fullgraph=True, backend="aot_eager")(w)
    other = torch.compile(lambda v: (v[ids] * 3).sum(), backend="aot_eager")
    out = other(w)  # compiled and run outside the mode: its backward is a compiled graph
    with pytest.raises(bitfold.FoldError, match="compiled outside the mode"):
        with bt.exact_mode():
            out.backward()


# -- training: the same digest for any order of the data ------------------------------------------
class MessagePassing(nn.Module):
    """Two graph layers: nodes transformed, messages gathered along edges and summed at targets."""

    def __init__(self, d_in, d_hid, d_out, ops=torch):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(d_in, d_hid), nn.Linear(d_hid, d_out)
        self.ops = ops  # torch, or bitfold.torch for the drop-ins

    def gather(self, h, ids, second=False):
        if self.ops is not torch:
            return bt.embedding(ids, h)  # a gather whose gradient is the exact fold
        return h.index_select(0, ids) if second else h[ids]

    def forward(self, x, src, dst, weight):
        h = self.lin1(x)
        m = self.gather(h, src) * weight[:, None]
        h = self.ops.scatter_add(torch.zeros_like(h), 0, dst[:, None].expand_as(m), m).relu()
        h = self.lin2(h)
        m = self.gather(h, src, second=True) * weight[:, None]
        return self.ops.index_add(torch.zeros_like(h), 0, dst, m)


def _train_graph(order, exact, ops=torch, steps=6):
    g = torch.Generator().manual_seed(1)
    n, e = 60, 600
    x, y = torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    src, dst = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    weight = torch.rand(e, generator=g)
    src, dst, weight = src[order], dst[order], weight[order]
    torch.manual_seed(0)
    model = MessagePassing(8, 16, 3, ops)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        with bt.exact_mode() if exact else contextlib.nullcontext():
            F.cross_entropy(model(x, src, dst, weight), y).backward()
        opt.step()
    return bitfold.digest(model.state_dict())


class Recommender(nn.Module):
    """A user's bag of features against an item: embedding tables and a dot product."""

    def __init__(self, users, items, dim, nn_module=nn):
        super().__init__()
        self.user = nn_module.EmbeddingBag(users, dim, mode="mean")
        self.item = nn_module.Embedding(items, dim, padding_idx=0)
        self.bias = nn_module.Embedding(items, 1)

    def forward(self, features, item):
        return (self.user(features) * self.item(item)).sum(-1) + self.bias(item).squeeze(-1)


def _train_recommender(order, exact, nn_module=nn, steps=6):
    g = torch.Generator().manual_seed(2)
    features, item = (
        torch.randint(0, 40, (256, 4), generator=g),
        torch.randint(0, 30, (256,), generator=g),
    )
    label = torch.randint(0, 2, (256,), generator=g).float()
    features, item, label = features[order], item[order], label[order]
    torch.manual_seed(0)
    model = Recommender(40, 30, 8, nn_module)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        with bt.exact_mode() if exact else contextlib.nullcontext():
            F.binary_cross_entropy_with_logits(model(features, item), label,
                                               reduction="sum").backward()  # fmt: skip
        opt.step()
    return bitfold.digest(model.state_dict())


@pytest.mark.parametrize("train", [_train_graph, _train_recommender])
def test_training_in_two_data_orders_ends_with_one_digest_under_exact_mode(train):
    n = 600 if train is _train_graph else 256
    first, second = torch.arange(n), torch.randperm(n, generator=torch.Generator().manual_seed(5))
    assert train(first, exact=True) == train(second, exact=True)
    assert train(first, exact=False) != train(second, exact=False)  # plain torch: order shows


def test_training_with_the_drop_ins_needs_no_mode():
    first, second = (
        torch.arange(600),
        torch.randperm(600, generator=torch.Generator().manual_seed(5)),
    )
    assert _train_graph(first, False, bt) == _train_graph(second, False, bt)
    first, second = (
        torch.arange(256),
        torch.randperm(256, generator=torch.Generator().manual_seed(5)),
    )
    assert _train_recommender(first, False, bt) == _train_recommender(second, False, bt)


# -- exact_mode against the correctly rounded sum, bit for bit ------------------------------------
#: Terms of 25 significant bits at most, all multiples of 2^-25 below 2, whose float32 sums
#: round differently in different orders (1 + 2^-24 + 2^-24 is 1 + 2^-23 exactly rounded, 1.0
#: left to right). Even seeds (the tensors added into, the tables) draw large terms, odd seeds
#: (the terms, the output gradients) mostly tiny ones.
LARGE_TERMS = (1.0, 0.5, -1.0 + 2.0**-23, 1.0 + 2.0**-23)
TINY_TERMS = (2.0**-24, 2.0**-24, 3 * 2.0**-24, -(2.0**-25), 1.0)


def _adversarial(*shape, seed=20, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    terms = torch.tensor(LARGE_TERMS if seed % 2 == 0 else TINY_TERMS, dtype=torch.float64)
    return terms[torch.randint(0, len(terms), shape, generator=g)].to(dtype)


def _forward_case(name, exact, dtype=torch.float32):
    """The forward case ``name`` on adversarial inputs (in the mode with ``exact``), and the
    mode; then its oracle."""
    _, op, oracle, args, kwargs = MODE_CASES[name]
    with bt.exact_mode() if exact else contextlib.nullcontext() as mode:
        got = op(*_made(args, _adversarial, dtype), **kwargs)
    return got, mode, oracle(*_made(args, _adversarial, dtype), **kwargs)


def _backward_case(name, exact, dtype=torch.float32):
    """The table gradient of the backward case ``name`` on adversarial inputs (in the mode with
    ``exact``), and the mode; then its oracle."""
    _, shape, (forward, oracle) = (BACKWARD_CASES | DOCUMENTED_BACKWARD_CASES)[name]
    table = _adversarial(*shape, seed=30, dtype=dtype).requires_grad_()
    with bt.exact_mode() if exact else contextlib.nullcontext() as mode:
        out = forward(table)
        upstream = _adversarial(*out.shape, seed=31, dtype=dtype)
        (out * upstream).sum().backward()  # the output gradient: upstream itself
    return table.grad, mode, oracle(table.detach(), upstream)


#: float16 rounds -2^-25 to -0.0: its cases meet signed zeros
@pytest.mark.parametrize("dtype", FLOATS, ids=NAME.get)
@pytest.mark.parametrize("name", list(MODE_CASES))
def test_mode_forward_ops_are_the_correctly_rounded_sum(name, dtype):
    got, mode, want = _forward_case(name, exact=True, dtype=dtype)
    assert mode.counts == {MODE_CASES[name][0]: 1} and not mode.passed
    assert same_bits(got, want), (got, want)


@pytest.mark.parametrize("dtype", FLOATS, ids=NAME.get)
@pytest.mark.parametrize("name", [*BACKWARD_CASES, *DOCUMENTED_BACKWARD_CASES])
def test_mode_backward_ops_are_the_correctly_rounded_sum(name, dtype):
    got, mode, want = _backward_case(name, exact=True, dtype=dtype)
    kind = (BACKWARD_CASES | DOCUMENTED_BACKWARD_CASES)[name][0]
    assert mode.counts[kind] == 1 and not mode.passed  # (and the forward's, if it folds)
    assert same_bits(got, want), (got, want)


def test_plain_torch_misses_the_correctly_rounded_sum_in_these_cases():
    """The cases above can fail: plain torch differs from the oracle in most of them."""
    differ = {name: not same_bits(*_forward_case(name, exact=False)[::2]) for name in MODE_CASES}
    differ |= {name: not same_bits(*_backward_case(name, exact=False)[::2])
               for name in BACKWARD_CASES}  # fmt: skip
    assert sum(differ.values()) >= len(differ) // 2, differ
