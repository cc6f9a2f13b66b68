"""The fold ops of extension packages (``torch_scatter``, ``torch_sparse``, ``pyg_lib``) under
``exact_mode()`` and ``bitfold.torch.compile``: sums translated into exact ATen folds (the
Fraction oracle's bits), other folds recorded in ``passed`` and refused by ``strict=True``.

The packages do not install here (no wheels for this torch), so stand-ins are registered
under their names with their schemas: the ``torch_scatter`` and ``torch_sparse`` ones as
``CompositeImplicitAutograd`` C++-style ops (invisible to a dispatch mode, as the real ones
are), the ``pyg`` ones with a CPU kernel. A stand-in of an op bitfold translates raises if it
ever runs; where a real package is installed, its own op is used instead.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import torch_oracle as to  # noqa: E402

import bitfold  # noqa: E402
import bitfold.torch as bt  # noqa: E402
from bitfold.torch import extension_ops  # noqa: E402

SCATTER = "(Tensor _0, Tensor _1, int _2, Tensor? _3, int? _4)"
CSR = "(Tensor _0, Tensor _1, Tensor? _2)"
COO = "(Tensor _0, Tensor _1, Tensor? _2, int? _3)"
SCHEMAS = {
    "torch_scatter": {
        "scatter_sum": SCATTER + " -> Tensor", "scatter_mean": SCATTER + " -> Tensor",
        "scatter_mul": SCATTER + " -> Tensor", "scatter_max": SCATTER + " -> (Tensor, Tensor)",
        "segment_sum_csr": CSR + " -> Tensor", "segment_mean_csr": CSR + " -> Tensor",
        "gather_csr": CSR + " -> Tensor", "segment_sum_coo": COO + " -> Tensor",
        "segment_mean_coo": COO + " -> Tensor", "gather_coo": CSR + " -> Tensor",
        "frobnicate": "(Tensor _0) -> Tensor",
    },
    "torch_sparse": {
        "spmm_sum": "(Tensor? _0, Tensor _1, Tensor _2, Tensor? _3, Tensor? _4, Tensor? _5, "
                    "Tensor _6) -> Tensor",
        "spmm_mean": "(Tensor? _0, Tensor _1, Tensor _2, Tensor? _3, Tensor? _4, Tensor? _5, "
                     "Tensor? _6, Tensor _7) -> Tensor",
    },
    "pyg": {
        "scatter_sum": "(Tensor src, Tensor index, int dim=-1, Tensor? out=None, "
                       "int? dim_size=None) -> Tensor",
        "softmax_csr": "(Tensor src, Tensor ptr, int dim=0) -> Tensor",
    },
}  # fmt: skip
TRANSLATED = {"scatter_sum", "scatter_mean", "segment_sum_csr", "segment_mean_csr",
              "gather_csr", "segment_sum_coo", "segment_mean_coo", "gather_coo", "spmm_sum",
              "spmm_mean"}  # fmt: skip


def _ran(*args):
    raise AssertionError("the extension's own kernel ran: bitfold should have translated it")


def _first(*args):
    return args[0].clone()


def _pair(*args):
    return args[0].clone(), torch.zeros(args[0].shape, dtype=torch.int64)


@pytest.fixture(scope="module", autouse=True)
def stand_ins():
    """Register a stand-in for every op of SCHEMAS that no installed package defines."""
    libraries = []
    for namespace, ops in SCHEMAS.items():
        library = torch.library.Library(namespace, "FRAGMENT")
        libraries.append(library)
        key = "CPU" if namespace == "pyg" else "CompositeImplicitAutograd"
        for name, schema in ops.items():
            if hasattr(getattr(torch.ops, namespace), name):
                continue  # the real package's op
            library.define(name + schema)
            impl = _ran if name in TRANSLATED else _pair if "(Tensor, Tensor)" in schema else _first
            library.impl(name, impl, key)
    yield
    for library in libraries:
        library._destroy()


def spread(shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-12, 12, shape, generator=g).double())
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def same_bits(got, want):
    got, want = got.detach().contiguous(), want.detach().contiguous()
    return got.dtype == want.dtype and got.shape == want.shape and torch.equal(
        got.view(torch.int32), want.view(torch.int32))  # fmt: skip


def rows_of(ids, width):
    return ids.reshape(-1, 1) * width + torch.arange(width)


N, D, K = 200, 3, 17
IDS = torch.randint(0, K, (N,), generator=torch.Generator().manual_seed(1))
SORTED = IDS.sort().values
INDPTR = torch.cat([torch.zeros(1, dtype=torch.int64), torch.bincount(SORTED, minlength=K)
                    .cumsum(0)])  # fmt: skip


def _sums(src, ids, *, mean=False, out=None):
    """The oracle: row k of the result the exact sum of the rows ``ids`` sends to k (added into
    ``out``); a mean divides that sum once by the count."""
    start = torch.zeros(K, D) if out is None else out
    return to.fold_into(start, rows_of(ids, D), src, start=None if out is None else "self",
                        mean=mean)  # fmt: skip


CASES = {
    "torch_scatter::scatter_sum": lambda s: (
        torch.ops.torch_scatter.scatter_sum(s, IDS, 0, None, K), _sums(s, IDS)),
    "pyg::scatter_sum": lambda s: (
        torch.ops.pyg.scatter_sum(s, IDS, dim=0, dim_size=K), _sums(s, IDS)),
    "torch_scatter::scatter_sum into out": lambda s: (
        torch.ops.torch_scatter.scatter_sum(s, IDS, 0, spread((K, D), 5), None),
        _sums(s, IDS, out=spread((K, D), 5))),
    "torch_scatter::scatter_mean": lambda s: (
        torch.ops.torch_scatter.scatter_mean(s, IDS, 0, None, K), _sums(s, IDS, mean=True)),
    "torch_scatter::segment_sum_csr": lambda s: (
        torch.ops.torch_scatter.segment_sum_csr(s, INDPTR, None), _sums(s, SORTED)),
    "torch_scatter::segment_sum_csr into out": lambda s: (
        torch.ops.torch_scatter.segment_sum_csr(s, INDPTR, spread((K, D), 6)), _sums(s, SORTED)),
    "torch_scatter::segment_mean_csr": lambda s: (
        torch.ops.torch_scatter.segment_mean_csr(s, INDPTR, None), _sums(s, SORTED, mean=True)),
    "torch_scatter::segment_sum_coo": lambda s: (
        torch.ops.torch_scatter.segment_sum_coo(s, SORTED, None, K), _sums(s, SORTED)),
    "torch_scatter::segment_mean_coo": lambda s: (
        torch.ops.torch_scatter.segment_mean_coo(s, SORTED, None, K), _sums(s, SORTED, mean=True)),
    "torch_sparse::spmm_sum": lambda s: (
        torch.ops.torch_sparse.spmm_sum(None, INDPTR, IDS, None, None, None, s[:K]),
        _sums(s[:K][IDS], SORTED)),
    "torch_sparse::spmm_mean": lambda s: (
        torch.ops.torch_sparse.spmm_mean(SORTED, INDPTR, IDS, None, None, None, None, s[:K]),
        _sums(s[:K][IDS], SORTED, mean=True)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_extension_sums_are_the_oracle_under_exact_mode(case):
    src = spread((N, D), 3)
    with bt.exact_mode(strict=True) as mode:
        got, want = CASES[case](src)
    assert same_bits(got, want), case
    assert mode.counts[case.split(" ")[0]] == 1 and not mode.passed


def test_a_weighted_sparse_product_rounds_each_product_then_sums_exactly():
    other, value = spread((K, D), 7), spread((N,), 8)
    with bt.exact_mode(strict=True):
        got = torch.ops.torch_sparse.spmm_sum(SORTED, INDPTR, IDS, value, None, None, other)
    terms = to.times(other[IDS], value.view(-1, 1))
    assert same_bits(got, _sums(terms, SORTED))


def test_gradients_through_extension_sums_and_gathers_are_exact():
    """A gather's backward is a segment sum: through the translation it is the oracle's."""
    src = spread((K, D), 9).requires_grad_(True)
    grad = spread((N, D), 10)
    with bt.exact_mode(strict=True) as mode:
        csr = torch.ops.torch_scatter.gather_csr(src, INDPTR, None)
        coo = torch.ops.torch_scatter.gather_coo(src, SORTED, None)
        assert torch.equal(csr, src[SORTED]) and torch.equal(coo, src[SORTED])
        ((csr + coo) * grad).sum().backward()
    twice = to.fold_into(torch.zeros(K, D), rows_of(torch.cat([SORTED, SORTED]), D),
                         torch.cat([grad, grad]), start=None)  # fmt: skip
    assert same_bits(src.grad, twice)
    assert mode.counts["torch_scatter::gather_csr"] == mode.counts["index_add"] == 1
    assert mode.counts["torch_scatter::gather_coo"] == mode.counts["scatter_add"] == 1


def test_folds_bitfold_does_not_rewrite_are_passed_and_refused_by_strict():
    src = spread((N, D), 11)
    with bt.exact_mode() as mode:
        torch.ops.torch_scatter.scatter_mul(src, IDS, 0, None, K)
        torch.ops.pyg.softmax_csr(src, INDPTR, 0)
        torch.ops.torch_scatter.frobnicate(src)
        torch.ops.torch_scatter.scatter_max(src, IDS, 0, None, K)  # exact in any order
    assert mode.passed == {
        "torch_scatter::scatter_mul: a product, not a sum": 1,
        "pyg::softmax_csr: a segment softmax: its sums are the extension's": 1,
        "torch_scatter::frobnicate: an op of an extension package bitfold does not know": 1,
    }
    assert not mode.counts
    with pytest.raises(bitfold.FoldError, match="torch_scatter::scatter_mul"), bt.exact_mode(
        strict=True
    ):
        torch.ops.torch_scatter.scatter_mul(src, IDS, 0, None, K)


def test_an_extension_op_called_from_torchscript_is_exact_below_autograd():
    """TorchScript calls ops through the dispatcher, past the function-level lookup: the pyg
    op (which has a CPU kernel) is caught there and translated under a nested mode."""

    @torch.jit.script
    def scripted(src: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
        return torch.ops.pyg.scatter_sum(src, index, 0, None, size)

    src = spread((N, D), 12)
    with bt.exact_mode(strict=True) as mode:
        got = scripted(src, IDS, K)
    assert same_bits(got, _sums(src, IDS))
    assert mode.counts["pyg::scatter_sum"] == 1


@pytest.mark.parametrize("op", ["segment_sum_csr", "segment_sum_coo", "scatter_mul"])
def test_a_composite_extension_op_called_from_torchscript_is_seen_by_the_mode(op):
    """torch_scatter's ops are CompositeImplicitAutograd (their C++ sums inside, above the
    dispatch mode): called from TorchScript, the mode still translates them, or passes them."""
    def segment_sum_csr(src: torch.Tensor, ptr: torch.Tensor, ids: torch.Tensor, k: int):
        return torch.ops.torch_scatter.segment_sum_csr(src, ptr, None)

    def segment_sum_coo(src: torch.Tensor, ptr: torch.Tensor, ids: torch.Tensor, k: int):
        return torch.ops.torch_scatter.segment_sum_coo(src, ids, None, k)

    def scatter_mul(src: torch.Tensor, ptr: torch.Tensor, ids: torch.Tensor, k: int):
        return torch.ops.torch_scatter.scatter_mul(src, ids, 0, None, k)

    function = {"segment_sum_csr": segment_sum_csr, "segment_sum_coo": segment_sum_coo,
                "scatter_mul": scatter_mul}[op]  # fmt: skip
    script = torch.jit.script(function)
    ids = IDS if op == "scatter_mul" else SORTED

    def scripted(src):
        return script(src, INDPTR, ids, K)

    src = spread((N, D), 15)
    if op == "scatter_mul":
        with bt.exact_mode() as mode:
            scripted(src)  # the stand-in's own kernel runs, as the package's would
        assert mode.passed == {"torch_scatter::scatter_mul: a product, not a sum": 1}
        # TorchScript's interpreter wraps the refusal in its RuntimeError, message kept
        with pytest.raises(RuntimeError, match=r"FoldError: exact_mode.strict=True.*scatter_mul"):
            with bt.exact_mode(strict=True):
                scripted(src)
        return
    with bt.exact_mode(strict=True) as mode:
        got = scripted(src)
    assert same_bits(got, _sums(src, SORTED))
    assert mode.counts[f"torch_scatter::{op}"] == 1
    with pytest.raises(RuntimeError, match="the extension's own kernel ran"):
        scripted(src)  # outside the mode: the op's own kernel again


def test_compiled_extension_sums_are_the_oracle():
    src = spread((N, D), 13)
    f = bt.compile(lambda s, i: torch.ops.torch_scatter.segment_sum_coo(s, i, None, K),
                   fullgraph=True)  # fmt: skip
    assert same_bits(f(src, SORTED), _sums(src, SORTED))
    assert f.bitfold.counts["scatter_add"] == 1


#: every op the packages register (from their sources), by namespace
REGISTERED = {
    "torch_scatter": ["cuda_version", "gather_coo", "gather_csr", "scatter_max", "scatter_mean",
                      "scatter_min", "scatter_mul", "scatter_sum", "segment_max_coo",
                      "segment_max_csr", "segment_mean_coo", "segment_mean_csr", "segment_min_coo",
                      "segment_min_csr", "segment_sum_coo", "segment_sum_csr"],
    "torch_sparse": ["cuda_version", "ego_k_hop_sample_adj", "hetero_neighbor_sample",
                     "hetero_temporal_neighbor_sample", "hgt_sample", "ind2ptr", "mt_partition",
                     "neighbor_sample", "non_diag_mask", "partition", "partition2", "ptr2ind",
                     "random_walk", "relabel", "relabel_one_hop", "saint_subgraph", "sample_adj",
                     "spmm_max", "spmm_mean", "spmm_min", "spmm_sum"],
    "pyg": ["cuda_version", "dist_neighbor_sample", "edge_sample", "fps", "gather_coo",
            "gather_csr", "graclus_cluster", "grid_cluster", "grouped_matmul",
            "hetero_neighbor_sample", "hetero_relabel_neighborhood", "index_sort", "knn",
            "merge_sampler_outputs", "metis", "nearest", "neighbor_sample", "radius",
            "random_walk", "relabel_neighborhood", "sampled_op", "scatter_max", "scatter_mean",
            "scatter_min", "scatter_mul", "scatter_sum", "segment_matmul", "segment_max_coo",
            "segment_max_csr", "segment_mean_coo", "segment_mean_csr", "segment_min_coo",
            "segment_min_csr", "segment_sum_coo", "segment_sum_csr", "softmax_csr",
            "softmax_csr_backward", "spline_basis", "spline_basis_backward", "spline_weighting",
            "spline_weighting_backward_basis", "spline_weighting_backward_weight",
            "spline_weighting_backward_x", "subgraph"],
}  # fmt: skip


def test_every_registered_extension_op_has_a_rule():
    unknown = "an op of an extension package bitfold does not know"
    for namespace, names in REGISTERED.items():
        for name in names:
            rule = extension_ops.rule_for(f"{namespace}::{name}")
            assert rule.reason != unknown, f"{namespace}::{name}"
            assert (rule.translate is not None) == (name in TRANSLATED), name


def test_compiled_extension_folds_it_cannot_translate_are_passed_once_or_refused():
    src = spread((N, D), 14)
    f = bt.compile(lambda s: torch.ops.torch_scatter.scatter_mul(s, IDS, 0, None, K))
    f(src), f(src)
    assert f.bitfold.passed == {"torch_scatter::scatter_mul: a product, not a sum": 1}
    strict = bt.compile(lambda s: torch.ops.torch_scatter.scatter_mul(s, IDS, 0, None, K) + 1,
                        strict=True)  # fmt: skip
    with pytest.raises(bitfold.FoldError, match=r"strict=True.*torch_scatter::scatter_mul"):
        strict(src)
