"""The host's exact route table: each route is taken for the shapes it claims, and forced, it
gives the oracle's bits; ``plan.route`` reports the route and its reason."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import exact_fold_oracle

import bitfold
from bitfold import dispatch
from bitfold.backends import host_buffers, host_routes
from bitfold.backends.host_routes import TABLE, Shape

#: route -> shapes (K, n, dtype, row size) the table must send to it
CLAIMS = {
    "buckets": [Shape(10, 50, "float32", 3), Shape(1 << 20, 50, "float64", 2)],
    "half-stream": [Shape(10, 50, "float16", 1), Shape(1 << 18, 1 << 22, "float16", 1)],
    "limbs": [Shape(1 << 10, 50, "float32", 1), Shape(1 << 15, 50, "float64", 1),
              Shape(3, 1 << 23, "float16", 1)],
    "partitioned-stream": [Shape((1 << 19) + 1, 50, "float32", 1),
                           Shape(1 << 20, 50, "bfloat16", 1),
                           Shape((1 << 19) + 7, 50, "float16", 1)],
    "float-stream": [Shape(3000, 50, "float32", 1), Shape(1 << 19, 50, "bfloat16", 1),
                     Shape(1 << 18, 1 << 23, "float16", 1)],
    "sorted-stream": [Shape((1 << 20) + 1, 50, "float32", 1), Shape(1 << 16, 50, "float64", 1),
                      Shape((1 << 20) + 1, 50, "float16", 1)],
}  # fmt: skip


def test_every_route_of_the_table_has_claims():
    assert set(CLAIMS) == {r.name for r in TABLE} == set(host_routes.ROUTES)


@pytest.mark.parametrize("route", TABLE, ids=lambda r: r.name)
def test_the_table_picks_each_route_for_the_shapes_it_claims(route):
    for shape in CLAIMS[route.name]:
        first = next(r for r in TABLE if r.when(shape))
        assert first is route, (shape, first.name)


@pytest.mark.parametrize("route", TABLE, ids=lambda r: r.name)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_each_forced_route_gives_the_oracle_bits(route, dtype):
    if dtype == "bfloat16":  # NumPy arrays of ml_dtypes' bfloat16, as JAX hands them over
        dtype = pytest.importorskip("ml_dtypes", reason="ml_dtypes (with jax) is needed").bfloat16
    if route.dtypes is not None and np.dtype(dtype).name not in route.dtypes:
        with pytest.raises(bitfold.FoldError, match=f"{route.name!r} route folds"):
            dispatch.fold(bitfold.Fold([0], 1), np.ones(1, dtype), route=route.name)
        return
    rng = np.random.default_rng(4)
    n, K = 900, 13
    idx = rng.integers(0, K, n)
    spread = 10 if dtype == "float16" else 60
    vals = (rng.standard_normal(n) * 2.0 ** rng.integers(-spread, spread, n)).astype(dtype)
    vals[:4] = [np.inf, -0.0, 1.0, -1.0]
    out = "float64" if dtype == "float64" else "float32"
    got = dispatch.fold(bitfold.Fold(idx, K), vals, route=route.name)
    want = exact_fold_oracle(idx, vals.astype(np.float64), K, out)
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{got.itemsize}"))


@pytest.mark.parametrize(("K", "dtype", "rows", "want"), [
    (10, "float32", 1, "limbs"), (3000, "float32", 1, "float-stream"),
    (10, "float16", 1, "half-stream"), (40_000, "float64", 1, "sorted-stream"),
    (10, "float32", 4, "buckets"),
])  # fmt: skip
def test_plan_route_reports_the_route_and_its_reason(K, dtype, rows, want):
    plan = bitfold.Fold(np.arange(6) % K, K)
    vals = np.ones((6, rows) if rows > 1 else 6, dtype)
    found = plan.route(vals)
    assert (found.backend, found.route) == ("host", want)
    assert f"{K:,}" in found.reason or "rows" in found.reason
    forced = plan.route(vals, route="buckets")
    assert forced.route == "buckets" and "forced" in forced.reason
    assert plan.route(vals, "ordered").route == "ordered"
    with pytest.raises(AttributeError):
        found.route = "x"  # frozen


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_dynamically_scheduled_binned_kernel_gives_the_oracle_for_any_thread_count(dtype):
    """Chunks go to whichever thread is free, each into its own slot, flushing as it must:
    the result is the correctly rounded sum with one thread or two, and bins flushed often."""
    import numba

    from bitfold.kernels import cpu

    rng = np.random.default_rng(7)
    n, K = 300_000, 5
    idx = rng.integers(0, K, n)
    vals = (rng.standard_normal(n) * np.exp2(rng.integers(-60, 60, n))).astype(np.float32)
    vals[::997] = 3e-39  # subnormal float32s, read DAZ-immune
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch", reason="torch is not installed")
        given = torch.from_numpy(vals).to(torch.bfloat16)
        vals = given.to(torch.float32).numpy()
    else:
        given = vals
    want = exact_fold_oracle(idx, vals.astype(np.float64), K, "float32")  # bfloat16 -> float32
    plan = bitfold.Fold(idx, K)
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            for carry_every in (None, 1_000):
                got = dispatch.fold(plan, given, "exact", kernel="binned",
                                    carry_every=carry_every)  # fmt: skip
                if dtype == "bfloat16":
                    got = got.to(torch.float32).numpy()
                np.testing.assert_array_equal(got.view(np.uint32), np.asarray(want, np.float32)
                                              .view(np.uint32))  # fmt: skip
    finally:
        numba.set_num_threads(before)
    assert cpu.DYNAMIC_CHUNKS > before  # more chunks than threads: a slow core is not waited for


@pytest.mark.parametrize("route", ["partitioned-stream", "float-stream"])
@pytest.mark.parametrize("negative_zeros", [True, False])
def test_the_float_streams_past_the_caches_give_the_oracle_bits(route, negative_zeros):
    """Over 2^19 buckets: the partitioned stream (its values grouped into nine partitions of
    2^16 buckets, the last one of three), and the float stream (forced: it prefetches its sums;
    private sums merged, one thread or several); inexact buckets redone through the order,
    empty buckets, ``-0.0``-only buckets, infinities, subnormal terms."""
    rng = np.random.default_rng(18)
    n, K = 400_000, (1 << 19) + 3
    idx = rng.integers(0, K - 2, n)
    vals = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(np.float32)
    idx[:3] = K - 2  # bucket K-1 is empty
    if negative_zeros:  # bucket K-2 holds -0.0 only; another holds -0.0 and +0.0
        vals[:3] = -0.0
        idx[3:5], vals[3:5] = K - 3, [-0.0, 0.0]
        idx[5:7] = K - 3
    vals[10:12] = [np.inf, np.inf]
    vals[20:24] = np.float32(2.0**-140) * np.float32([1, -3, 5, 7])  # subnormal float32 terms
    idx[20:22], idx[22:24] = 70_000, 140_000  # partitions 1 and 2
    import numba

    plan = bitfold.Fold(idx, K)
    assert plan.route(vals).route == "partitioned-stream"
    want = exact_fold_oracle(idx, vals, K, "float32").view(np.uint32)
    before = numba.get_num_threads()
    try:  # one thread: one private sum; more: chunks handed to whichever thread is free
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            got = dispatch.fold(plan, vals, route=route)
            np.testing.assert_array_equal(got.view(np.uint32), want)
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("n", [5_000, 300_000])
def test_the_sorted_stream_on_a_radix_sorted_plan_gives_the_oracle_bits(n):
    """More buckets than positions: the plan is sorted by radix, the sorted stream cuts its
    ranges from the sorted index (64 ranges past 2^18 values, some cuts inside a hot bucket)."""
    rng = np.random.default_rng(n)
    K = max(4 * n, 1 << 17)  # past the eager counts: the offsets are never made
    idx = rng.integers(0, K, n)
    idx[: n // 4] = 17  # a hot bucket that spans several of the 64 ranges
    plan = bitfold.Fold(idx, K)
    plain = rng.standard_normal(n).astype(np.float32)  # every bucket's float64 sum exact
    got = dispatch.fold(plan, plain, route="sorted-stream")
    kept = host_buffers.buffers_of(plan).nbytes  # its output, once over 1 MiB, kept for reuse
    assert kept == (got.nbytes if got.nbytes >= host_buffers.MIN_BYTES else 0)
    chunks = host_routes.BUCKET_CHUNKS if n >= 1 << 18 else 1
    cuts = (chunks + 1) * 8  # the int64 cuts of its ranges, kept too
    assert plan.nbytes == (plan.index.nbytes + plan.order.nbytes + plan.sorted_index.nbytes + cuts
                           + kept)  # fmt: skip
    want = exact_fold_oracle(idx, plain.astype(np.float64), K, "float32")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    vals = (rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)).astype(np.float32)
    vals[1:5] = [np.inf, -0.0, 1.0, -1.0]
    vals[idx == idx[6]] = -0.0  # a bucket of -0.0 terms only
    got = dispatch.fold(plan, vals, route="sorted-stream")  # redone buckets count the offsets
    want = exact_fold_oracle(idx, vals.astype(np.float64), K, "float32")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    starts = host_routes.sorted_starts(plan, host_routes.BUCKET_CHUNKS)
    ids = plan.sorted_index
    assert starts[0] == 0 and starts[-1] == n and np.all(np.diff(starts) >= 0)
    inner = starts[(starts > 0) & (starts < n)]
    assert np.all(ids[inner] != ids[inner - 1])  # every cut is at a bucket boundary


def test_a_forced_route_refuses_a_plan_past_its_bucket_limit_by_name():
    limit = host_routes.get("partitioned-stream").max_K
    plan = bitfold.Fold(np.array([0, limit]), K=limit + 1)
    with pytest.raises(bitfold.FoldError, match=rf"at most {limit:,} buckets; this plan has K = "
                                                rf"{limit + 1:,}"):  # fmt: skip
        dispatch.fold(plan, np.ones(2, np.float32), route="partitioned-stream")
    # the limit is the layout's own: at it the layout is built, one past it is not
    from bitfold.kernels import planning

    index = np.array([0, limit - 1], np.int64)
    dest, local = np.empty(2, np.int32), np.empty(2, np.uint16)
    starts = planning.partition_layout(index, limit, dest, local)
    assert starts[-1] == 2 and local.tolist() == [0, (limit - 1) & 0xFFFF]
    with pytest.raises(ValueError):
        planning.partition_layout(index, limit + 1, dest, local)


@pytest.mark.parametrize(("n", "K", "slots"), [(50, 100, 1), (3_000, 100, 2), (3_000, 1 << 19, 2)])
def test_the_float_stream_checks_an_unchecked_index_entry_by_entry(n, K, slots):
    """``bounded``: every entry checked as its value is added (one slot on the calling thread,
    private slots, the prefetching loop past 2^18 buckets): -1 at an entry outside [0, K),
    negative ones included; in range, the same sums as without the checks."""
    from bitfold.kernels import stream

    rng = np.random.default_rng(n + K)
    idx = rng.integers(0, K, n)
    vals = rng.standard_normal(n).astype(np.float32)
    sums = np.empty((slots, K))
    plain, checked = np.empty(K, np.float32), np.empty(K, np.float32)
    assert stream.float_sums(idx, vals, sums, plain) == 0
    assert stream.float_sums(idx, vals, sums, checked, bounded=True) == 0
    np.testing.assert_array_equal(checked.view(np.uint32), plain.view(np.uint32))
    np.testing.assert_array_equal(plain.view(np.uint32),
                                  exact_fold_oracle(idx, vals, K).view(np.uint32))  # fmt: skip
    for bad in (K, -1, np.iinfo(np.int64).min):
        wrong = idx.copy()
        wrong[n // 3] = bad
        assert stream.float_sums(wrong, vals, sums, checked, bounded=True) == -1


def test_the_routes_key_what_they_keep_on_a_plan_with_key_classes():
    """Every cache a route keeps on a plan has a key class (``PlanKey``/``DeviceKey``), never a
    tuple or a string, and a second call reads the kept value."""
    from bitfold.plan_view import DeviceKey, PlanKey

    rng = np.random.default_rng(7)
    n, K = 600, 9
    idx = rng.integers(0, K, n)
    plan = bitfold.Fold(idx, K)
    for route in TABLE:
        vals = rng.standard_normal((n, 2) if not route.scalars_only else n)
        dtype = "float32" if route.dtypes is None or "float32" in route.dtypes else "float16"
        dispatch.fold(plan, vals.astype(dtype), route=route.name)
    kept = {
        "bucket_bounds": lambda: host_routes.bucket_bounds(plan, n),
        "bucket_tasks": lambda: host_routes.bucket_tasks(plan, n),
        "staged_layout": lambda: host_routes.staged_layout(plan, 2),
        "partition_layout": lambda: host_routes.partition_layout(plan),
    }
    for name, get in kept.items():
        assert get() is get(), name
    assert plan._prepared
    assert all(isinstance(key, PlanKey | DeviceKey) for key in plan._prepared), list(plan._prepared)
    assert host_routes.BucketBoundsKey(4) != host_routes.SortedStartsKey(4)
