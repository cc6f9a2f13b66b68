"""The plan: validation table, counting sort, expand, and the large-map code path."""

from __future__ import annotations

import numpy as np
import pytest

import bitfold
from bitfold import plan as plan_module
from bitfold.backends import host_buffers, host_routes
from bitfold.kernels import cpu


@pytest.mark.parametrize(
    ("index", "K", "error", "words"),
    [
        ([0, 1, 3], 3, bitfold.IndexRangeError, ["index[2] = 3", "0 <= index < K = 3"]),
        ([[0, 1], [-1, 0]], 2, bitfold.IndexRangeError, ["index[1, 0] = -1", "position 2"]),
        (np.array([0.0, 1.0]), 2, bitfold.FoldTypeError, ["integers", "float64"]),
        (np.array([True, False]), 2, bitfold.FoldTypeError, ["integers", "bool"]),
        (np.array([0, 1], dtype=object), 2, bitfold.FoldTypeError, ["integers", "object"]),
        ([0, 1], 0, bitfold.FoldError, ["K >= 1", "K = 0"]),
        ([0, 1], -3, bitfold.FoldError, ["K = -3"]),
        ([0, 1], 2.0, bitfold.FoldTypeError, ["positive integer", "2.0"]),
        ([0, 1], True, bitfold.FoldTypeError, ["positive integer", "True"]),
        ([0, 1], "2", bitfold.FoldTypeError, ["positive integer", "'2'"]),
        (np.array([0, 2**63 + 5], dtype=np.uint64), 4, bitfold.IndexRangeError, ["index[1]"]),
    ],
)
def test_bad_plans_are_refused_with_a_clear_message(index, K, error, words):
    with pytest.raises(error) as info:
        bitfold.Fold(index, K)
    assert isinstance(info.value, ValueError)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64])
def test_counting_sort_is_stable_and_counts_match(dtype):
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 7, size=(13, 11)).astype(dtype)
    plan = bitfold.Fold(idx, 7)
    flat = idx.reshape(-1).astype(np.int64)
    assert plan.shape == (13, 11) and plan.size == 143 and plan.K == 7
    np.testing.assert_array_equal(plan.counts, np.bincount(flat, minlength=7))
    np.testing.assert_array_equal(plan.offsets, np.concatenate([[0], np.cumsum(plan.counts)]))
    np.testing.assert_array_equal(plan.order, np.argsort(flat, kind="stable"))


def test_plan_arrays_are_read_only():
    plan = bitfold.Fold([0, 1, 1], 2)
    for arr in (plan.index, plan.counts, plan.offsets, plan.order):
        with pytest.raises(ValueError):
            arr[0] = 1


def test_empty_index_and_empty_buckets():
    plan = bitfold.Fold(np.zeros((0,), np.int64), 3)
    out = plan(np.zeros(0, np.float32))
    assert out.view(np.uint32).tolist() == [0, 0, 0]


def test_expand_gathers_in_the_index_shape():
    idx = np.array([[2, 0, 1], [1, 1, 2]])
    plan = bitfold.Fold(idx, 3)
    v = np.array([5.0, 6.0, 7.0], np.float32)
    np.testing.assert_array_equal(plan.expand(v), v[idx])
    with pytest.raises(bitfold.ShapeError, match="K = 3"):
        plan.expand(np.ones(4, np.float32))


def test_large_map_path_uses_int64_order(monkeypatch):
    """Maps over 2^31 elements take int64 positions; exercised here by lowering the limit."""
    monkeypatch.setattr(plan_module, "_INT32_MAX", 5)
    idx = np.array([3, 0, 3, 1, 0, 2, 3, 3, 1])
    plan = bitfold.Fold(idx, 4)
    assert plan.order.dtype == np.int64 and plan.index.dtype == np.uint16
    np.testing.assert_array_equal(plan.order, np.argsort(idx, kind="stable"))
    v = np.arange(9, dtype=np.float32)
    np.testing.assert_array_equal(plan(v), np.bincount(idx, weights=v, minlength=4))


def test_same_map_and_fingerprint():
    a = bitfold.Fold(np.array([0, 1, 2]), 3)
    b = bitfold.Fold(np.array([0, 1, 2], np.int16), 3)
    c = bitfold.Fold(np.array([0, 2, 1]), 3)
    assert a.same_map(b) and a.fingerprint == b.fingerprint
    assert not a.same_map(c)


@pytest.mark.parametrize(
    ("K", "dtype"), [(1, np.uint16), (65_536, np.uint16), (65_537, np.int32), (2**31 - 1, np.int32)]
)
def test_the_plan_keeps_its_index_in_the_narrowest_type_that_holds_K(K, dtype):
    idx = np.array([0, K - 1, K // 2], np.int64)
    plan = bitfold.Fold(idx, K) if K < 2**20 else None
    if plan is not None:
        assert plan.index.dtype == dtype
        assert plan.index.astype(np.int64).tolist() == idx.tolist()
    assert plan_module.planning.index_dtype(K) == dtype


def _chunks_of_the_plan_passes(monkeypatch):
    """Record the position chunks the plan's passes run in: ``{"scan": C, "counting": C}`` or
    ``{"scan": C, "radix": C}`` (the rows of the per-chunk counts and cursors each pass gets)."""
    planning = plan_module.planning
    used = {}

    def spy(name, what, rows):
        real = getattr(planning, name)

        def recording(*args):
            used[what] = rows(args)
            return real(*args)

        monkeypatch.setattr(planning, name, recording)

    spy("scan_index", "scan", lambda a: a[2].shape[0])  # (index, compact, counts, K)
    spy("_place_chunks", "counting", lambda a: a[1].shape[0])  # (index, cursors, order)
    spy("_digit_place_chunks", "radix", lambda a: a[3].shape[0])  # (keys, positions, shift, ...)
    return used


@pytest.mark.parametrize(
    ("K", "chunks"),
    [
        (3, {"scan": 64, "counting": 64}),  # few buckets: MAX_CHUNKS chunks
        (433, {"scan": 64, "counting": 64}),
        (50_000, {"scan": 3, "counting": 3}),  # 64 x K counts > N / 8: one chunk a thread
        (3_000_000, {"scan": 64, "radix": 3}),  # K > N: not counted in the scan; radix sort
    ],
)
def test_the_parallel_plan_passes_give_the_stable_order_and_counts(K, chunks, monkeypatch):
    """Over 786,432 positions the scan and the sort run in the position chunks the plan's rules
    give (three threads here), with the result of argsort: the order first, as a route asks for
    it, then the counts."""
    monkeypatch.setattr(cpu, "thread_count", lambda: 3)
    used = _chunks_of_the_plan_passes(monkeypatch)
    rng = np.random.default_rng(K)
    idx = (rng.zipf(1.3, 800_001) % K).astype(np.int64)
    plan = bitfold.Fold(idx, K)
    np.testing.assert_array_equal(plan.order, np.argsort(idx, kind="stable"))
    assert used == chunks
    np.testing.assert_array_equal(plan.counts, np.bincount(idx, minlength=K))
    np.testing.assert_array_equal(plan.index, idx)


@pytest.mark.parametrize(("K", "n"), [(1, 0), (1, 5), (7, 3), (433, 300_001), (3_000_000, 300_001)])
def test_the_sorted_buckets_are_the_sorted_index(K, n):
    """The bucket of every sorted position, written from the offsets in position chunks."""
    idx = (np.random.default_rng(n).zipf(1.3, n) % K).astype(np.int64)
    plan = bitfold.Fold(idx, K)
    out = np.empty(n, plan.index.dtype)
    plan_module.planning.sorted_buckets(plan.offsets, out)
    np.testing.assert_array_equal(out, np.sort(idx))


@pytest.mark.parametrize("where", [0, 150_000, 299_999])
def test_the_parallel_scan_names_the_first_bad_entry(where):
    idx = np.zeros(300_000, np.int64)
    idx[where] = 7
    idx[-1 if where != 299_999 else 0] = -2 if where != 299_999 else 0
    with pytest.raises(bitfold.IndexRangeError, match=rf"index\[{where}\] = 7"):
        bitfold.Fold(idx, 7)


def test_a_one_shot_plan_does_not_sort_until_a_route_needs_it():
    idx = np.random.default_rng(0).integers(0, 433, 400_000)
    plan = bitfold.Fold(idx, 433)
    held = plan.nbytes
    plan(np.ones(idx.size, np.float32))  # the limbs route reads the index in position order
    assert plan.nbytes <= held + plan.counts.nbytes  # the counts may be made, not the order
    before = plan.nbytes
    assert plan.order.nbytes == 4 * idx.size
    assert plan.nbytes == before + plan.order.nbytes


def test_a_plan_of_many_buckets_counts_them_only_when_a_route_needs_them():
    K = plan_module.planning.EAGER_COUNT_MAX_K + 1
    idx = np.random.default_rng(7).integers(0, K, 300_000)
    plan = bitfold.Fold(idx, K)
    assert plan.nbytes == plan.index.nbytes  # checked and copied, not counted
    plan(np.ones(idx.size, np.float32))  # the float stream needs no offsets
    # what it keeps for the next call: its slots' float64 sums and the float32 output, if large
    arrays = (host_routes.stream_slots(idx.size, K) * K * 8, K * 4)
    kept = sum(b for b in arrays if b >= host_buffers.MIN_BYTES)
    assert kept > 0
    assert host_buffers.buffers_of(plan).nbytes == kept
    assert plan.nbytes == plan.index.nbytes + kept
    np.testing.assert_array_equal(np.diff(plan.offsets), np.bincount(idx, minlength=K))
    assert plan.offsets[0] == 0 and plan.offsets.dtype == np.int32
    np.testing.assert_array_equal(plan.order, np.argsort(idx, kind="stable"))


@pytest.mark.parametrize(("n", "K"), [(0, 70_000), (5, 70_000), (1_000, 5_000_000),
                                      (300_001, 3_000_000), (200_000, 2**31 - 1)])  # fmt: skip
def test_a_plan_of_more_buckets_than_positions_sorts_by_radix(n, K):
    """The radix sort (two or three passes, one chunk a thread past 2^17 positions) gives the
    stable order and the sorted index, and never counts the K buckets."""
    rng = np.random.default_rng(n)
    idx = rng.integers(0, K, n)
    idx[: n // 3] = idx[0] if n else 0  # a hot bucket: equal ids keep their positions' order
    plan = bitfold.Fold(idx, K)
    assert plan_module.planning.prefer_radix(n, K)
    want = np.argsort(idx, kind="stable")
    np.testing.assert_array_equal(plan.order, want)
    np.testing.assert_array_equal(plan.sorted_index, idx[want])
    assert plan.sorted_index.dtype == plan.index.dtype
    assert plan.nbytes == plan.index.nbytes + plan.order.nbytes + plan.sorted_index.nbytes
    if K <= 5_000_000:  # the offsets, when asked for, still count every bucket
        np.testing.assert_array_equal(np.diff(plan.offsets), np.bincount(idx, minlength=K))


@pytest.mark.parametrize(("n", "K"), [(1_000, 433), (300_001, 50_000)])
def test_a_plan_of_fewer_buckets_sorts_by_counting_and_gives_the_same_sorted_index(n, K):
    idx = np.random.default_rng(K).integers(0, K, n)
    plan = bitfold.Fold(idx, K)
    assert not plan_module.planning.prefer_radix(n, K)
    np.testing.assert_array_equal(plan.sorted_index, np.sort(idx))
    np.testing.assert_array_equal(plan.order, np.argsort(idx, kind="stable"))


def test_a_plan_counts_the_host_arrays_its_routes_keep():
    """The partitioned stream's layout (a place a position, a uint16 id a place) is the plan's."""
    K = host_routes.PARTITIONED_MIN_K + 1
    n = 300_000
    plan = bitfold.Fold(np.random.default_rng(3).integers(0, K, n), K)
    before = plan.nbytes
    plan(np.ones(n, np.float32))  # every bucket's sum exact: nothing redone, no order built
    dest, local, starts = host_routes.partition_layout(plan)  # the kept layout, not a new one
    assert (dest.nbytes, local.nbytes) == (4 * n, 2 * n)
    kept = host_buffers.buffers_of(plan).nbytes
    held = plan.nbytes
    assert held == before + dest.nbytes + local.nbytes + starts.nbytes + kept
    plan(np.ones(n, np.float32))
    assert plan.nbytes == held  # the layout is built once; the next call reuses the kept output


def test_a_plan_counts_the_cpu_tensors_it_keeps_for_torch():
    torch = pytest.importorskip("torch", reason="torch is needed for its CPU index copy")
    n = 10_000
    plan = bitfold.Fold(np.random.default_rng(5).integers(0, 433, n), 433)
    before = plan.nbytes
    plan.expand(torch.ones(433))  # v[index] through an int64 tensor of the index, kept
    assert plan.nbytes == before + 8 * n
