"""bitfold.torch.compile: compiled folds, forward and backward, with the eager exact folds' bits.

Inductor compiles take seconds, so each test compiles few functions: one
function holds every rewritten fold (compiled once per dtype), and the model
tests compile each model once per setting, reusing it for both data orders.
"""

from __future__ import annotations

import doctest

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

import bitfold  # noqa: E402
import bitfold.torch as bt  # noqa: E402
from bitfold.torch import compiled, rules  # noqa: E402

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
#: what inductor's code shows for a fold it generates itself or leaves to ATen
FOLD_MARKS = (
    "atomic_add", "aten.index_put", "aten._unsafe_index_put", "aten.scatter_add",
    "aten.scatter_reduce", "aten._embedding_bag_backward", "aten.index_add",
    "aten._unsafe_masked_index_put",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def no_cache():
    """Inductor's caches off: the pass runs (and reports) on every compile."""
    with (
        torch._inductor.config.patch(fx_graph_cache=False),
        torch._functorch.config.patch(enable_autograd_cache=False),
    ):
        yield


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))


def wide_values(shape, dtype, gen):
    """Values spanning many binary orders, with signs: sums that depend on the order of terms."""
    scale = torch.tensor(2.0).pow(torch.randint(-20, 4, shape, generator=gen))
    sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
    return (torch.rand(shape, generator=gen) * scale * sign).to(dtype)


# -- every rewritten fold, one compiled function per dtype --------------------------------------
K, N, D = 7, 40, 3


def _data(dtype):
    gen = torch.Generator().manual_seed(5)
    idx = torch.randint(0, K, (N,), generator=gen)
    idx[:3] = 0  # one hot bucket
    leaf = {
        name: wide_values(shape, dtype, gen).requires_grad_()
        for name, shape in (("gather", (K, D)), ("embedding", (K, D)), ("bag", (K, D)),
                            ("bag_mean", (K, D)), ("bag_max", (K, D)))
    }  # fmt: skip
    plain = {
        "x": wide_values((K, D), dtype, gen),
        "src": wide_values((N, D), dtype, gen),
        "flat": wide_values((N,), dtype, gen),
    }
    half_ulp = torch.finfo(dtype).eps / 2
    tie = torch.tensor([1.0, half_ulp, half_ulp], dtype=dtype)  # 1 first: rounds back to 1 twice
    plain["x"][0] = 0
    plain["src"][:3] = tie[:, None]
    plain["flat"][:3] = tie
    grads = {name: wide_values((N, D), dtype, gen) for name in ("gather", "embedding")}
    offsets = torch.tensor([0, 5, 5, 17, 30])
    for name in ("bag", "bag_mean", "bag_max"):
        grads[name] = wide_values((len(offsets), D), dtype, gen)
    return idx, offsets, leaf, plain, grads


def all_folds(idx, offsets, leaf, plain):
    """Every fold the pass rewrites: forward folds of ``plain``, gathers whose backward folds."""
    x, src, flat = plain["x"], plain["src"], plain["flat"]
    rows = idx[:, None].expand(N, D)
    forward = {
        "index_add": x.index_add(0, idx, src),
        "index_add_alpha_dim1": x.t().index_add(1, idx, src.t(), alpha=0.5),
        "scatter_add": x.scatter_add(0, rows, src),
        "scatter_sum": x.scatter_reduce(0, rows, src, "sum", include_self=False),
        "scatter_mean": x.scatter_reduce(0, rows, src, "mean"),
        "scatter_reduce_add": x.scatter(0, rows, src, reduce="add"),
        "index_put": torch.index_put(x, (idx,), src, accumulate=True),
        "put": x.put(idx, flat, accumulate=True),
        "index_reduce_mean": x.index_reduce(0, idx, src, "mean"),
    }
    outputs = {
        "gather": leaf["gather"][idx],
        "embedding": F.embedding(idx, leaf["embedding"]),
        "bag": F.embedding_bag(idx, leaf["bag"], offsets, mode="sum"),
        "bag_mean": F.embedding_bag(idx, leaf["bag_mean"], offsets, mode="mean"),
        "bag_max": F.embedding_bag(idx, leaf["bag_max"], offsets, mode="max"),
    }
    return forward, outputs


def run_all(fn, dtype):
    idx, offsets, leaf, plain, grads = _data(dtype)
    forward, outputs = fn(idx, offsets, leaf, plain)
    names = sorted(outputs)
    got = torch.autograd.grad([outputs[n] for n in names], [leaf[n] for n in names],
                              [grads[n] for n in names])  # fmt: skip
    return forward, dict(zip(names, got, strict=True))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_rewritten_fold_gives_the_eager_exact_bits(dtype, no_cache):
    with bt.exact_mode() as mode:
        want_fwd, want_bwd = run_all(all_folds, dtype)
    assert mode.counts["embedding_bag_backward"] == 3
    fn = bt.compile(all_folds, fullgraph=True)
    got_fwd, got_bwd = run_all(fn, dtype)
    for name in want_fwd:
        assert same_bits(got_fwd[name], want_fwd[name]), name
    for name in want_bwd:
        assert same_bits(got_bwd[name], want_bwd[name]), name
    report = fn.bitfold
    assert not report.passed and report.graphs == 2  # forward and backward
    assert {"index_put", "scatter_add", "scatter_reduce", "embedding_dense_backward",
            "embedding_bag_backward"} <= set(report.counts)  # fmt: skip
    # and plain torch.compile does not: the hot bucket's terms in its order
    plain_fwd, _ = run_all(torch.compile(all_folds, fullgraph=True), dtype)
    assert any(not same_bits(plain_fwd[n], want_fwd[n]) for n in want_fwd)
