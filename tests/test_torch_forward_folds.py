"""Folds beyond the scatter family made exact: embedding-bag forward sums, weighted bincount and
histograms, max-pooling gradients, under ``exact_mode()`` and ``bitfold.torch.compile``,
compared bit for bit with the Fraction oracle (tests/torch_oracle.py), and the same bits for
any order of the terms; and the reports of graphs compiled from inductor's caches."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch", reason="the PyTorch adapter needs torch")

import torch_oracle as to  # noqa: E402
from oracle import bucket_oracle  # noqa: E402

import bitfold  # noqa: E402
import bitfold.torch as bt  # noqa: E402

INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
       torch.float64: torch.int64}  # fmt: skip


def same_bits(got, want):
    """True when ``got`` and ``want`` hold the same bits (NaN payloads included)."""
    got, want = got.detach().contiguous(), want.detach().contiguous()
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    return torch.equal(got.view(INT[got.dtype]), want.view(INT[want.dtype]))


def spread(shape, dtype, seed):
    """Values over some 20 binary orders, so that the order of a float sum changes its bits."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp2(torch.randint(-10, 10, shape, generator=g).double())
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


# -- embedding bags ------------------------------------------------------------------------------
BAG_CASES = [
    # mode, per-sample weights, padding_idx, include_last_offset, dtype, 2-D input
    ("sum", False, None, False, torch.float32, False),
    ("sum", True, None, False, torch.float32, False),
    ("sum", True, 3, True, torch.float64, False),
    ("sum", False, 3, False, torch.float16, True),
    ("sum", False, None, True, torch.bfloat16, False),
    ("mean", False, None, False, torch.float32, False),
    ("mean", False, 3, False, torch.float32, True),
    ("mean", False, None, True, torch.float64, False),
    ("mean", False, 3, False, torch.bfloat16, False),
    ("mean", False, None, False, torch.float16, False),
]
NUM, DIM = 40, 5


def _bag_input(case, seed=0):
    mode, psw, padding, last, dtype, two_d = case
    g = torch.Generator().manual_seed(seed)
    weight = spread((NUM, DIM), dtype, seed)
    if two_d:
        ids = torch.randint(0, NUM, (12, 9), generator=g)
        offsets = None
    else:
        ids = torch.randint(0, NUM, (120,), generator=g)
        cuts = torch.randint(0, 121, (9,), generator=g).sort().values
        offsets = torch.cat([torch.tensor([0]), cuts[:-1], torch.tensor([30, 30])])
        offsets = offsets.sort().values
        if last:  # the last offset ends the last bag, before the end of the input
            offsets = torch.cat([offsets, torch.tensor([110])])
    weights = spread(ids.shape, dtype, seed + 1) if psw else None
    kwargs = dict(mode=mode, per_sample_weights=weights, include_last_offset=last,
                  padding_idx=padding)  # fmt: skip
    return weight, ids, offsets, kwargs


def _shuffled_within_bags(ids, offsets, weights, seed):
    """The same bags, each bag's ids (and their weights) in another order."""
    g = torch.Generator().manual_seed(seed)
    if offsets is None:
        perm = torch.argsort(torch.rand(ids.shape, generator=g), dim=1)
        return ids.gather(1, perm), None if weights is None else weights.gather(1, perm)
    bounds = [*offsets.tolist(), ids.numel()]
    order = torch.arange(ids.numel())
    for lo, hi in itertools.pairwise(bounds):
        if hi > lo:
            order[lo:hi] = lo + torch.randperm(hi - lo, generator=g)
    return ids[order], None if weights is None else weights[order]


def _bag_oracle(weight, ids, offsets, kwargs):
    return to.embedding_bag(ids, weight, offsets, mode=kwargs["mode"],
                            per_sample_weights=kwargs["per_sample_weights"],
                            include_last_offset=kwargs["include_last_offset"],
                            padding_idx=kwargs["padding_idx"])  # fmt: skip


@pytest.mark.parametrize("case", BAG_CASES, ids=lambda c: "-".join(map(str, c)))
def test_embedding_bag_forward_is_the_oracle_under_exact_mode_for_any_order(case):
    weight, ids, offsets, kwargs = _bag_input(case)
    want = _bag_oracle(weight, ids, offsets, kwargs)
    for seed in range(3):
        i, w = (ids, kwargs["per_sample_weights"]) if seed == 0 else _shuffled_within_bags(
            ids, offsets, kwargs["per_sample_weights"], seed)  # fmt: skip
        with bt.exact_mode(strict=True) as mode:
            got = torch.nn.functional.embedding_bag(i, weight, offsets,
                                                    **{**kwargs, "per_sample_weights": w})
        assert same_bits(got, want), (seed, got, want)
        assert mode.counts["embedding_bag"] == 1 and not mode.passed


DIRECT = [c for c in BAG_CASES if not c[1] and c[2] is None and c[4] in (torch.float32,
                                                                         torch.float64)]


@pytest.mark.parametrize("case", DIRECT, ids=lambda c: "-".join(map(str, c)))
def test_embedding_bag_forward_without_weights_or_padding_reads_the_table_directly(
    case, monkeypatch
):
    """No per-sample weights, no padding, float32/float64: the bags are summed by the bucket
    kernel straight from the table's rows (empty bags and a last offset included), the
    oracle's bits."""
    from bitfold.torch import folds

    weight, ids, offsets, kwargs = _bag_input(case, seed=5)
    taken = []
    direct = folds._bag_sums
    monkeypatch.setattr(folds, "_bag_sums", lambda *a: taken.append(direct(*a)) or taken[-1])
    with bt.exact_mode(strict=True):
        got = torch.nn.functional.embedding_bag(ids, torch.nn.Parameter(weight), offsets,
                                                **kwargs)  # fmt: skip
    assert taken and taken[0] is not None
    assert same_bits(got, _bag_oracle(weight, ids, offsets, kwargs))


@pytest.mark.parametrize("case", [BAG_CASES[1], BAG_CASES[6]], ids=["sum-psw", "mean-padding"])
def test_embedding_bag_module_step_is_the_oracle_and_its_gradient_matches_the_drop_in(case):
    """nn.EmbeddingBag's forward and backward inside the mode: the forward is the oracle, and
    the weight gradient is the drop-in bitfold.torch.EmbeddingBag's (the same exact sums)."""
    weight, ids, offsets, kwargs = _bag_input(case, seed=4)
    grads = []
    for cls in (torch.nn.EmbeddingBag, bt.EmbeddingBag):
        module = cls(NUM, DIM, mode=kwargs["mode"], padding_idx=kwargs["padding_idx"],
                     include_last_offset=kwargs["include_last_offset"])  # fmt: skip
        module.weight.data.copy_(weight)
        with bt.exact_mode() as mode:
            out = module(ids, offsets, per_sample_weights=kwargs["per_sample_weights"])
            (out * spread(out.shape, out.dtype, 9)).sum().backward()
        assert same_bits(out, _bag_oracle(weight, ids, offsets, kwargs))
        grads.append(module.weight.grad)
    assert same_bits(grads[0], grads[1])
    assert mode.counts["embedding_bag_backward"] == 0  # the drop-in's own ops, not ATen's


def test_embedding_bag_without_grad_runs_the_forward_only_op_exactly():
    weight, ids, offsets, kwargs = _bag_input(BAG_CASES[0], seed=2)
    with torch.no_grad(), bt.exact_mode() as mode:
        got = torch.ops.aten._embedding_bag_forward_only(weight, ids, offsets, False, 0)[0]
    assert same_bits(got, _bag_oracle(weight, ids, offsets, kwargs))
    assert mode.counts["embedding_bag"] == 1


def test_embedding_bag_max_is_left_to_torch():
    weight, ids, offsets, _ = _bag_input(BAG_CASES[0], seed=3)
    with bt.exact_mode(strict=True) as mode:
        got = torch.nn.functional.embedding_bag(ids, weight, offsets, mode="max")
    assert torch.equal(got, torch.nn.functional.embedding_bag(ids, weight, offsets, mode="max"))
    assert not mode.counts and not mode.passed


@pytest.mark.parametrize("case", [BAG_CASES[1], BAG_CASES[5], BAG_CASES[6]],
                         ids=["sum-psw", "mean", "mean-padding-2d"])  # fmt: skip
def test_compiled_embedding_bag_forward_is_the_oracle_for_any_order(case):
    weight, ids, offsets, kwargs = _bag_input(case, seed=5)
    module = torch.nn.EmbeddingBag(NUM, DIM, mode=kwargs["mode"], padding_idx=kwargs["padding_idx"])
    module.weight.data.copy_(weight)
    step = bt.compile(module)
    want = _bag_oracle(weight, ids, offsets, kwargs)
    for seed in range(2):
        i, w = (ids, kwargs["per_sample_weights"]) if seed == 0 else _shuffled_within_bags(
            ids, offsets, kwargs["per_sample_weights"], seed)  # fmt: skip
        out = step(i, offsets, per_sample_weights=w)
        out.sum().backward()
        assert same_bits(out, want)
    assert step.bitfold.counts["embedding_bag"] >= 1 and not step.bitfold.passed


# -- weighted bincount ---------------------------------------------------------------------------
def _pairs(n=3000, bins=40, seed=7, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, bins, (n,), generator=g), spread((n,), dtype, seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_weighted_bincount_is_the_oracle_in_exact_mode_and_compiled_for_any_order(dtype):
    ids, weights = _pairs(dtype=dtype)
    want = to.bincount(ids, weights, minlength=50)
    f = bt.compile(lambda i, w: torch.bincount(i, weights=w, minlength=50), fullgraph=True)
    for seed in range(3):
        perm = torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed))
        with bt.exact_mode(strict=True):
            eager = torch.bincount(ids[perm], weights[perm], 50)
        assert same_bits(eager, want) and same_bits(f(ids[perm], weights[perm]), want)
    assert f.bitfold.counts["bincount"] == 1


def test_compiled_tensor_bincount_and_an_unweighted_one():
    ids, weights = _pairs(n=500, seed=8)
    f = bt.compile(lambda i, w: (i.bincount(w), i.bincount()), fullgraph=True)
    weighted, counts = f(ids, weights)
    assert same_bits(weighted, to.bincount(ids, weights))
    assert torch.equal(counts, torch.bincount(ids))


# -- weighted histograms -------------------------------------------------------------------------
def _histogram_oracle(coords, edges, weight):
    """Each bin the exact sum of its weights: bin j of a dimension holds e[j] <= x < e[j+1]
    (the last bin its right edge too); rows outside the edges, or NaN, in none."""
    shape = [e.numel() - 1 for e in edges]
    buckets = {}
    for row, w in zip(coords.double().tolist(), weight.double().reshape(-1).tolist(),
                      strict=True):  # fmt: skip
        where = []
        for x, e in zip(row, edges, strict=True):
            e = e.double().tolist()
            if not e[0] <= x <= e[-1]:
                break
            j = max(k for k in range(len(e) - 1) if e[k] <= x)
            where.append(j)
        else:
            flat = 0
            for j, n in zip(where, shape, strict=True):
                flat = flat * n + j
            buckets.setdefault(flat, []).append(w)
    name = to.NAME[coords.dtype]
    out = [bucket_oracle(buckets.get(k, []), name) for k in range(int(torch.tensor(shape).prod()))]
    return torch.tensor(out, dtype=torch.float64).to(coords.dtype).view(shape)


def _samples(n, dtype, seed):
    x = spread((n,), dtype, seed)
    x[::97] = float("nan")
    return x, spread((n,), dtype, seed + 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_histogram_is_the_oracle_with_torch_edges_for_any_order(dtype):
    x, w = _samples(4000, dtype, 11)
    bins = torch.tensor([-50.0, -1.0, -0.5, 0.0, 0.25, 3.0, 800.0], dtype=dtype)
    for spec in (dict(bins=30, range=(-5.0, 5.0)), dict(bins=bins)):
        edges = torch.histogram(x, **spec).bin_edges
        want = _histogram_oracle(x.view(-1, 1), [edges], w)
        for seed in range(2):
            perm = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(seed))
            with bt.exact_mode(strict=True) as mode:
                got = torch.histogram(x[perm], **spec, weight=w[perm])
            assert same_bits(got.hist, want) and torch.equal(got.bin_edges, edges)
        assert mode.counts["histogram"] == 1


def test_histogram_bins_are_torchs_own():
    """Weights of ones give torch's own counts, bin for bin (values on the edges included)."""
    x = torch.linspace(-3, 3, 601)  # many values on or next to linspace edges
    x = torch.cat([x, x.nextafter(torch.tensor(10.0)), x.nextafter(torch.tensor(-10.0))])
    for bins in (7, 13, 100):
        with bt.exact_mode():
            got = torch.histogram(x, bins, weight=torch.ones_like(x)).hist
        assert torch.equal(got, torch.histogram(x, bins).hist)


def test_histogram_density_out_and_histogramdd_are_exact():
    x, w = _samples(2000, torch.float32, 12)
    x = x.nan_to_num(0.0)
    with bt.exact_mode(strict=True) as mode:
        dense = torch.histogram(x, 20, weight=w, density=True)
        hist, edges = torch.empty(0), torch.empty(0)
        torch.histogram(x, 20, weight=w, out=(hist, edges))
        coords = torch.stack([x, w.flip(0)], dim=1)
        dd = torch.histogramdd(coords, bins=[4, 6], weight=w)
        dd_tensors = torch.histogramdd(coords, bins=[torch.tensor([-9.0, 0.0, 9.0])] * 2, weight=w)
    sums = _histogram_oracle(x.view(-1, 1), [edges], w)
    assert same_bits(hist, sums)
    assert same_bits(dense.hist, sums / sums.sum().item() / edges.diff())
    assert same_bits(dd.hist, _histogram_oracle(coords, list(dd.bin_edges), w))
    assert same_bits(dd_tensors.hist, _histogram_oracle(coords, list(dd_tensors.bin_edges), w))
    assert mode.counts["histogram"] == 4


def test_compiled_weighted_histogram_is_exact():
    x, w = _samples(2000, torch.float32, 13)
    f = bt.compile(lambda x, w: torch.histogram(x, bins=16, range=(-8.0, 8.0), weight=w))
    got = f(x, w)
    assert same_bits(got.hist, _histogram_oracle(x.view(-1, 1), [got.bin_edges], w))
    assert f.bitfold.counts["histogram"] == 1


def test_unweighted_histograms_and_counts_are_left_to_torch():
    x = torch.randn(100)
    with bt.exact_mode(strict=True) as mode:
        torch.histogram(x, 5)
        torch.histc(x, 5)
        torch.bincount(torch.tensor([0, 2, 2]))
    assert not mode.counts and not mode.passed


def test_forward_fold_rules_are_in_the_table():
    from bitfold.torch import rules

    assert {"embedding_bag", "bincount", "histogram"} <= {rule.kind for rule in rules.RULES}
    compiled = {str(op) for op in rules.COMPILED}
    assert {"aten._embedding_bag.default", "aten._embedding_bag_forward_only.default",
            "aten.bincount.default", "aten.histogram.bin_ct"} <= compiled  # fmt: skip


# -- max-pooling gradients -----------------------------------------------------------------------
POOLS = {
    "max_pool2d-overlapping": lambda x: torch.nn.functional.max_pool2d(
        x, 3, 1, padding=1, return_indices=True),
    "max_pool2d-dilated-ceil": lambda x: torch.nn.functional.max_pool2d(
        x, 2, 1, dilation=2, ceil_mode=True, return_indices=True),
    "adaptive_max_pool2d": lambda x: torch.nn.functional.adaptive_max_pool2d(
        x, 5, return_indices=True),
    "max_pool3d": lambda x: torch.nn.functional.max_pool3d(
        x.view(2, 1, 3, 9, 9), (2, 3, 3), 1, return_indices=True),
}  # fmt: skip


@pytest.mark.parametrize("pool", list(POOLS))
def test_max_pool_gradient_is_the_oracle(pool):
    """Overlapping windows send several gradients to one element: each element's gradient is
    the exact sum of what its windows send it."""
    x = spread((2, 3, 9, 9), torch.float32, 21).requires_grad_(True)
    with bt.exact_mode(strict=True) as mode:
        out, indices = POOLS[pool](x)
        grad = spread(out.shape, out.dtype, 22)
        (out * grad).sum().backward()
    planes = indices.shape[0] * indices.shape[1]
    size = x.numel() // planes
    positions = indices.reshape(planes, -1) + torch.arange(planes).view(-1, 1) * size
    want = to.fold_into(torch.zeros(x.shape), positions.view(indices.shape), grad)
    assert same_bits(x.grad, want)
    assert mode.counts["max_pool_backward"] == 1


# -- reports of graphs loaded from inductor's caches ---------------------------------------------
@pytest.mark.parametrize("aot_cache", [True, False], ids=["aot-autograd-cache", "fx-graph-cache"])
def test_a_model_compiled_from_the_cache_reports_its_rewrites(aot_cache):
    """Two identical models: the second one's graphs come from inductor's caches (with the AOT
    autograd cache off, its backward graph is loaded lazily, at the first backward), and its
    report still counts the folds they make exact."""
    ids, offsets = torch.randint(0, 30, (48,)), torch.arange(0, 48, 6)
    reports = []
    with torch._functorch.config.patch(enable_autograd_cache=aot_cache):
        for _ in range(2):
            step = bt.compile(torch.nn.EmbeddingBag(30, 3, mode="sum"))
            step(ids, offsets).sum().backward()
            reports.append(step.bitfold)
    first, second = reports
    assert first.counts == second.counts == {"embedding_bag": 1, "embedding_bag_backward": 1}
    assert first.graphs + first.cached == 2 and second.cached == 2 and second.graphs == 0


# -- sums of sparse tensors ----------------------------------------------------------------------
def _hybrid(seed=30, nnz=120):
    """An uncoalesced (2, 3) x (4,) hybrid COO tensor: most coordinates stored several times."""
    g = torch.Generator().manual_seed(seed)
    indices = torch.stack([torch.randint(0, 2, (nnz,), generator=g),
                           torch.randint(0, 3, (nnz,), generator=g)])  # fmt: skip
    return torch.sparse_coo_tensor(indices, spread((nnz, 4), torch.float32, seed), (2, 3, 4))


def _dense_oracle(A, dims):
    """``A.to_dense().sum(dims)``, each element the exact sum of the stored values that fall in
    it (repeated coordinates included), rounded once."""
    keep = [d for d in range(A.dim()) if d not in dims]
    target = torch.zeros([A.shape[d] for d in keep])
    place = to.positions_of(target)
    values = A._values()
    targets = torch.empty(values.shape, dtype=torch.int64)
    for e, (i, j) in enumerate(A._indices().t().tolist()):
        for c in range(values.shape[1]):
            coord = (i, j, c)
            targets[e, c] = place[tuple(coord[d] for d in keep)] if keep else 0
    return to.fold_into(target, targets, values, start=None)


@pytest.mark.parametrize("dims", [(1,), (0,), (0, 1), (1, 2), (0, 1, 2)])
def test_sparse_sum_and_to_dense_of_an_uncoalesced_tensor_are_exact(dims):
    A = _hybrid()
    with bt.exact_mode(strict=True) as mode:
        got = torch.sparse.sum(A, dim=dims)
        dense = A.to_dense()
    got = got.to_dense() if got.is_sparse else got
    assert same_bits(got, _dense_oracle(A, dims))
    assert same_bits(dense, _dense_oracle(A, ()))
    assert mode.counts["sparse_sum"] == 1 and mode.counts["coalesce"] >= 1


def test_grid_sampling_input_gradient_is_passed_and_refused_by_strict():
    """Its sums of interpolated gradients are torch's: recorded, never silent."""
    x = torch.randn(1, 2, 5, 5, requires_grad=True)
    grid = (torch.rand(1, 3, 3, 2, generator=torch.Generator().manual_seed(3)) * 2 - 1)
    sample = torch.nn.functional.grid_sample
    with bt.exact_mode() as mode:
        sample(x, grid, align_corners=False).sum().backward()
    assert list(mode.passed) == ["grid_sampler_backward: grid sampling's input gradient: "
                                 "interpolation weights and their sums are torch's"]  # fmt: skip
    with bt.exact_mode(strict=True) as mode:  # the grid's own gradient folds nothing
        sample(x.detach(), grid.clone().requires_grad_(), align_corners=False).sum().backward()
    assert not mode.passed
    with pytest.raises(bitfold.FoldError, match="grid_sampler_2d_backward"), bt.exact_mode(
        strict=True
    ):
        sample(x, grid, align_corners=False).sum().backward()


def test_drop_in_and_mode_agree_on_long_narrow_means_and_negative_zero_bags():
    """A bfloat16 mean over 257 ids (a count bfloat16 cannot hold) is divided once by the
    count; a bag of -0.0 rows and a padding id sums to -0.0 (the padding id is left out)."""
    width = 64  # enough columns that dividing by bfloat16(257) = 256 changes some quotients
    weight = spread((NUM, width), torch.bfloat16, 40)
    weight[7] = -0.0
    ids = torch.cat([torch.randint(8, NUM, (257,), generator=torch.Generator().manual_seed(4)),
                     torch.tensor([7, 3, 7])])  # fmt: skip
    offsets = torch.tensor([0, 257])
    for mode_name in ("mean", "sum"):
        want = to.embedding_bag(ids, weight, offsets, mode=mode_name, padding_idx=3)
        drop_in = bt.embedding_bag(ids, weight, offsets, mode=mode_name, padding_idx=3)
        with bt.exact_mode():
            eager = torch.nn.functional.embedding_bag(ids, weight, offsets, mode=mode_name,
                                                      padding_idx=3)  # fmt: skip
        assert same_bits(drop_in, want) and same_bits(eager, want), mode_name
        assert torch.equal(torch.signbit(want[1]), torch.ones(width, dtype=torch.bool))


def test_means_over_counts_a_narrow_dtype_cannot_hold_divide_once():
    """257 terms into one bfloat16 element: the correctly rounded sum divided by 257, not by
    bfloat16(257) = 256 (one rounding of the quotient)."""
    width = 64
    src = spread((257, width), torch.bfloat16, 41)
    index = torch.zeros(257, width, dtype=torch.int64)
    base = spread((1, width), torch.bfloat16, 42)
    with bt.exact_mode(strict=True):
        scattered = base.scatter_reduce(0, index, src, "mean", include_self=False)
        indexed = base.index_reduce(0, index[:, 0], src, "mean", include_self=False)
        segments = torch.segment_reduce(src, "mean", lengths=torch.tensor([257]))
    want = to.scatter_reduce(base, 0, index, src, "mean", include_self=False)
    assert same_bits(scattered, want) and same_bits(indexed, want) and same_bits(segments, want)
