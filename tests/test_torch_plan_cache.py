"""The torch adapter's plan cache: an index met again reuses its plan, a changed one never does.

Every result is checked bit for bit against the Fraction oracle, so a stale plan (the ids of
an earlier index) would show as wrong sums, not only as a wrong hit count.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import exact_fold_oracle
from test_rows import rows_oracle

import bitfold

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
bt = pytest.importorskip("bitfold.torch", reason="bitfold.torch needs PyTorch")
from bitfold.torch import plan_cache  # noqa: E402  (after the importorskip above)
from bitfold.torch.folds import fold_rows  # noqa: E402

N, K = 6000, 37  # above plan_cache.MIN_POSITIONS: cached


@pytest.fixture(autouse=True)
def fresh_cache():
    bt.clear_plan_cache()
    yield
    bt.clear_plan_cache()


def _problem(seed: int, n: int = N, k: int = K):
    rng = np.random.default_rng(seed)
    idx = torch.from_numpy(rng.integers(0, k, n))
    # magnitudes far apart: a sum in another grouping or of other terms rounds differently
    vals = rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)
    return idx, torch.from_numpy(vals.astype(np.float32))


def _check(idx, vals, k: int = K) -> None:
    got = fold_rows(idx, vals, k)
    want = exact_fold_oracle(idx.numpy(), vals.numpy(), k)
    np.testing.assert_array_equal(got.numpy().view(np.uint32), want.view(np.uint32))


def _counts():
    return plan_cache.PLANS.hits, plan_cache.PLANS.misses


def test_an_index_met_again_reuses_its_plan_with_the_oracle_bits():
    """Met once: planned, not kept; twice: kept; from then on: reused."""
    idx, vals = _problem(1)
    hits, misses = _counts()
    _check(idx, vals)
    assert len(plan_cache.PLANS) == 0
    _check(idx, vals * 3)
    assert len(plan_cache.PLANS) == 1
    _check(idx, vals * 5)
    assert _counts() == (hits + 1, misses + 2)


def test_indices_made_afresh_do_not_push_kept_plans_out():
    idx, vals = _problem(20)
    _check(idx, vals)
    _check(idx, vals)  # kept
    fresh = [_problem(100 + i)[0] for i in range(3 * plan_cache.MAX_PLANS)]  # alive: own pointers
    for other in fresh:
        fold_rows(other, vals, K)
    assert len(plan_cache.PLANS) == 1
    hits = plan_cache.PLANS.hits
    _check(idx, vals)
    assert plan_cache.PLANS.hits == hits + 1


@pytest.mark.parametrize("where", [0, N // 2, N - 1])
def test_an_index_changed_in_place_by_torch_gets_a_new_plan(where):
    idx, vals = _problem(2)
    _check(idx, vals)
    _check(idx, vals)  # kept
    idx[where] = (idx[where] + 1) % K  # same tensor, same data pointer: only the check sees it
    hits, misses = _counts()
    _check(idx, vals)
    assert _counts() == (hits, misses + 1)


def test_an_index_changed_through_a_numpy_view_gets_a_new_plan():
    """A NumPy view writes without bumping torch's version counter: the check reads the ids."""
    idx, vals = _problem(3)
    version = idx._version
    _check(idx, vals)
    _check(idx, vals)  # kept
    view = idx.numpy()
    view[:] = np.roll(view, 1)
    assert idx._version == version, "the write should not be seen by torch's version counter"
    _check(idx, vals)


def test_the_same_index_into_another_K_has_its_own_plan():
    idx, vals = _problem(4)
    for k in (K, K, K + 5, K + 5):  # ids all below K: the extra buckets are empty
        _check(idx, vals, k)
    assert len(plan_cache.PLANS) == 2
    _check(idx, vals, K)


def test_small_indices_are_not_kept_and_bad_ones_are_refused_as_before():
    idx, vals = _problem(5, n=plan_cache.MIN_POSITIONS - 1)
    _check(idx, vals)
    assert len(plan_cache.PLANS) == 0
    big, big_vals = _problem(6)
    _check(big, big_vals)
    _check(big, big_vals)  # kept
    big[7] = K  # out of range after it was cached: refused, not folded with the old plan
    with pytest.raises(bitfold.IndexRangeError, match=f"{K}"):
        fold_rows(big, big_vals, K)
    with pytest.raises(bitfold.FoldTypeError, match="integers"):
        fold_rows(big.double(), big_vals, K)


def test_the_cache_keeps_at_most_its_plans_and_positions():
    def keep(cache, index):
        cache.plan(index, K)
        return cache.plan(index, K)  # the second meeting keeps it

    cache = plan_cache.PlanCache(max_plans=2, max_positions=3 * N)
    idxs = [_problem(10 + i)[0] for i in range(3)]
    plans = [keep(cache, i) for i in idxs]
    assert len(cache) == 2
    assert cache.plan(idxs[2], K) is plans[2]  # kept
    assert cache.plan(idxs[0], K) is not plans[0]  # the least recently used went first
    small = plan_cache.PlanCache(max_plans=8, max_positions=N + 1)
    keep(small, idxs[0])
    keep(small, idxs[1])
    assert len(small) == 1, "two plans of N positions exceed N + 1 positions"
    cache.clear()
    assert len(cache) == 0


def test_exact_mode_steps_reuse_the_plans_of_their_edge_lists():
    """A message-passing step three times under exact_mode(): the third step's folds hit the
    cache (the second keeps their plans) and its gradients have the first step's bits."""
    g = torch.Generator().manual_seed(0)
    nodes, edges, feats = 500, 5000, 8
    scale = 2.0 ** torch.randint(-20, 20, (nodes, 1), generator=g)
    x = torch.randn(nodes, feats, generator=g) * scale
    src = torch.randint(0, nodes, (edges,), generator=g)
    dst = torch.randint(0, nodes, (edges,), generator=g)
    w = torch.randn(feats, feats, generator=g, requires_grad=True)

    def grad() -> torch.Tensor:
        w.grad = None
        with bt.exact_mode():
            agg = torch.zeros(nodes, feats).index_add_(0, dst, (x @ w)[src])
            agg.pow(2).sum().backward()
        return w.grad.clone()

    first = grad()
    grad()
    hits = plan_cache.PLANS.hits
    third = grad()
    assert plan_cache.PLANS.hits >= hits + 2, "the forward and backward folds reuse their plans"
    assert torch.equal(first.view(torch.int32), third.view(torch.int32))


# -- Fold.same_index, the host check --------------------------------------------------------------
@pytest.mark.parametrize("n", [10, 300_001])  # one chunk; parallel chunks
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.uint64])
def test_same_index_finds_any_single_difference(n, dtype):
    rng = np.random.default_rng(n)
    idx = rng.integers(0, 1000, n).astype(dtype)
    plan = bitfold.Fold(idx, 1000)
    assert plan.same_index(idx)
    assert plan.same_index(idx.astype(np.int8 if n == 10 and idx.max() < 128 else np.int64))
    for where in {0, n // 2, n - 1}:
        other = idx.copy()
        other[where] = (other[where] + 1) % 1000
        assert not plan.same_index(other), where


def test_same_index_is_false_for_another_shape_dtype_or_huge_ids():
    idx = np.arange(12) % 5
    plan = bitfold.Fold(idx, 5)
    assert not plan.same_index(idx.reshape(3, 4))
    assert not plan.same_index(idx.astype(np.float64))
    assert not plan.same_index(idx[:-1])
    huge = idx.astype(np.uint64)
    huge[3] += np.uint64(2**64 - 2**32)  # equal to the plan's id modulo 2^32, not as a number
    assert not plan.same_index(huge)
    assert plan.same_index(idx[::1].copy(order="F"))
    assert plan.same_index(idx.astype(">i8"))  # big-endian: read by value


def test_a_device_index_is_checked_against_its_kept_copy():
    """The branch a CUDA index takes (``torch.equal`` with the copy kept beside it), run here
    with the copy on the CPU; tests/cuda_cases.py runs it on a device."""
    idx, _ = _problem(7)
    plan = bitfold.Fold(idx, K)
    entry = plan_cache._Entry(plan, idx.clone())
    assert plan_cache.PlanCache._matches(entry, idx)
    changed = idx.clone()
    changed[-1] = (changed[-1] + 1) % K
    assert not plan_cache.PlanCache._matches(entry, changed)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [(), (1,), (5,), (3, 4)])
@pytest.mark.parametrize("with_init", [False, True])
def test_small_cpu_folds_take_the_direct_way_with_the_engine_bits(
    dtype, width, with_init, monkeypatch
):
    """Below MIN_POSITIONS a CPU fold skips the plan and the dispatch: the same bits as the
    engine's (a NumPy plan), zeros, NaN, infinities and far-apart magnitudes included."""
    from bitfold.torch import folds

    rng = np.random.default_rng([len(dtype), len(width), int(with_init)])
    n, k = 300, 29
    idx = rng.integers(0, k - 3, n)  # the last buckets stay empty
    shape = (n, *width)
    vals = rng.standard_normal(shape) * 2.0 ** rng.integers(-60, 60, shape)
    flat = vals.reshape(-1)
    flat[:12] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e300, -1e300, 3e-310, 2.0**-1074,
                 -0.0, 5e-324, 1e38]  # fmt: skip
    with np.errstate(over="ignore"):  # float32: the float64 extremes become infinities
        vals = vals.astype(dtype)
    init = (rng.standard_normal((k, *width)) * 1e8).astype(dtype) if with_init else None
    if init is not None:
        init.reshape(-1)[:3] = [-0.0, np.nan, np.inf]
    taken = []
    direct = folds._small_host_fold
    monkeypatch.setattr(folds, "_small_host_fold", lambda *a: taken.append(direct(*a)) or taken[-1])
    start = None if init is None else torch.from_numpy(init)
    got = fold_rows(torch.from_numpy(idx), torch.from_numpy(vals), k, init=start)
    assert len(taken) == 1 and taken[0] is not None  # the direct way folded it
    want = bitfold.Fold(idx, k)(vals, init=init)
    bits = np.uint32 if dtype == "float32" else np.uint64
    assert got.shape == (k, *width) and got.dtype == getattr(torch, dtype)
    np.testing.assert_array_equal(got.numpy().view(bits), want.view(bits))


def _one_term_problem(dtype: str, width: tuple[int, ...], with_init: bool, specials: str):
    """Distinct ids (no bucket gets two rows): subnormals, signed zeros, cancellations and
    sums that overflow; ``specials`` ``"values"``: a NaN and an infinity among the rows,
    ``"init"``: NaNs with a payload in ``init`` (the exact sum's NaN is the canonical one)."""
    rng = np.random.default_rng([len(dtype), len(width), int(with_init), len(specials)])
    n, k = 40, 61
    idx = rng.permutation(k)[:n]
    shape = (n, *width)
    f = np.finfo(dtype)
    vals = (rng.standard_normal(shape) * 2.0 ** rng.integers(-30, 30, shape)).astype(dtype)
    flat = vals.reshape(-1)
    flat[:6] = [f.smallest_subnormal, -f.smallest_subnormal, -0.0, f.max, -f.max, 0.0]
    init = None
    if with_init:
        init = (rng.standard_normal((k, *width)) * 1e3).astype(dtype)
        rows = init.reshape(k, -1)
        rows[idx[0], 0] = f.smallest_subnormal  # subnormal + subnormal
        rows[idx[2], 0] = -0.0  # -0.0 + -0.0 is -0.0
        rows[idx[3], 0] = f.max  # overflows to inf
        rows[idx[5], 0] = -0.0  # -0.0 + 0.0 is +0.0
        rows[idx[6], 0] = -vals.reshape(n, -1)[6, 0]  # cancels to +0.0
        rows[np.setdiff1d(np.arange(k), idx)[0], 0] = -0.0  # an untouched -0.0 stays
    if specials == "values":
        flat[7], flat[8] = np.nan, np.inf
    if specials == "init" and init is not None:
        bits = init.view(np.uint32 if dtype == "float32" else np.uint64).reshape(k, -1)
        payload = bits.dtype.type(0x7FC00001 if dtype == "float32" else 0x7FF8000000000001)
        bits[idx[7], 0] = bits[np.setdiff1d(np.arange(k), idx)[1], 0] = payload
    return idx, vals, init, k


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [(), (3,)])
@pytest.mark.parametrize("with_init", [False, True])
@pytest.mark.parametrize("specials", ["", "values", "init"])
def test_small_folds_of_distinct_ids_are_the_oracles_bits(
    dtype, width, with_init, specials, monkeypatch
):
    """No bucket gets two rows (the gradient of one expert's tokens): the direct way folds them,
    the Fraction oracle's bits, subnormals, overflows and NaN payloads included."""
    from bitfold.torch import folds

    idx, vals, init, k = _one_term_problem(dtype, width, with_init, specials)
    taken = []
    direct = folds._small_host_fold
    monkeypatch.setattr(folds, "_small_host_fold", lambda *a: taken.append(direct(*a)) or taken[-1])
    start = None if init is None else torch.from_numpy(init)
    with np.errstate(over="ignore", invalid="ignore"):
        got = fold_rows(torch.from_numpy(idx), torch.from_numpy(vals), k, init=start)
    assert len(taken) == 1 and taken[0] is not None
    rows = vals.reshape(len(idx), -1)
    index, terms = idx, rows
    if init is not None:  # init is one more term of every bucket
        index = np.concatenate([np.arange(k), idx])
        terms = np.concatenate([init.reshape(k, -1), rows])
    want = rows_oracle(index, terms.astype(np.float64), k, dtype)
    bits = np.uint32 if dtype == "float32" else np.uint64
    np.testing.assert_array_equal(got.numpy().reshape(-1).view(bits),
                                  np.asarray(want, dtype).reshape(-1).view(bits))  # fmt: skip


def test_small_folds_of_distinct_ids_keep_subnormals_where_the_thread_flushes_them():
    """With flush-to-zero and denormals-are-zero on (``torch.set_flush_denormal``), a plain
    addition would lose subnormals: the small fold's bits stay exact."""
    tiny = np.float32(2.0**-149)
    vals = torch.tensor([[tiny], [tiny * 3], [-tiny]])
    init = torch.tensor([[tiny], [0.0], [tiny * 2], [1.0]])
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals (torch.set_flush_denormal is False)")
    try:
        assert torch.tensor([tiny]).add(0).item() == 0.0  # the mode is on
        got = fold_rows(torch.tensor([0, 2, 3]), vals, 4, init=init)
    finally:
        torch.set_flush_denormal(False)
    want = np.array([2 * tiny, 0.0, 5 * tiny, 1.0 - tiny], np.float32)  # 1 - 2^-149 rounds to 1
    np.testing.assert_array_equal(got.numpy().reshape(-1).view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dims", [(23,), (6, 4)], ids=["x[i]", "x[i, j]"])
def test_small_index_put_with_negative_ids_is_the_oracles_bits(dtype, dims, monkeypatch):
    """``x.index_put_(ids, v, accumulate=True)`` in the mode, one index or one a leading dim,
    ids from the end among them, takes the direct way (which wraps them, as torch's
    indexing) and gives the oracle's bits; an id below ``-size`` is refused in the usual
    words."""
    from bitfold.torch import folds

    rng = np.random.default_rng(len(dims))
    n, width = 90, 4
    ids = [rng.integers(-size, size, n) for size in dims]
    vals = (rng.standard_normal((n, width)) * 2.0 ** rng.integers(-40, 40, (n, width)))
    vals = vals.astype(dtype)
    start = (rng.standard_normal((*dims, width)) * 1e6).astype(dtype)
    taken = []
    direct = folds._small_host_fold
    monkeypatch.setattr(folds, "_small_host_fold",
                        lambda *a, **kw: taken.append(direct(*a, **kw)) or taken[-1])  # fmt: skip
    x = torch.from_numpy(start.copy())
    with bt.exact_mode():
        x.index_put_(tuple(torch.from_numpy(i) for i in ids), torch.from_numpy(vals),
                     accumulate=True)  # fmt: skip
    assert taken and taken[0] is not None
    k = int(np.prod(dims))
    wrapped = tuple(np.where(i < 0, i + s, i) for i, s in zip(ids, dims, strict=True))
    flat = np.ravel_multi_index(wrapped, dims)
    index = np.concatenate([np.arange(k), flat])
    terms = np.concatenate([start.reshape(k, width), vals]).astype(np.float64)
    want = np.asarray(rows_oracle(index, terms, k, dtype), dtype)
    bits = np.uint32 if dtype == "float32" else np.uint64
    np.testing.assert_array_equal(x.numpy().reshape(k, width).view(bits), want.view(bits))
    bad = tuple(torch.tensor([0, -s - 1]) for s in dims)
    said = rf"= {-dims[-1] - 1} .*shape\[{len(dims) - 1}\] = {dims[-1]}"
    if len(dims) == 2:
        bad = (torch.tensor([0, 1]), bad[1])
    with bt.exact_mode(), pytest.raises(bitfold.IndexRangeError, match=said):
        x.index_put_(bad, torch.ones(2, width, dtype=x.dtype), accumulate=True)


def test_small_cpu_folds_refuse_a_bad_index_in_the_usual_words():
    vals = torch.ones(5, 2)
    for bad, k, said in (
        (torch.tensor([0, 1, 7, 2, 0]), 5, r"index\[2\] = 7"),
        (torch.tensor([0, -1, 2, 2, 0], dtype=torch.int32), 7, r"index\[1\] = -1"),
    ):
        with pytest.raises(bitfold.IndexRangeError, match=said):
            fold_rows(bad, vals, k)
    assert len(plan_cache.PLANS) == 0
