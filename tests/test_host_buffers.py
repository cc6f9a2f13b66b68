"""A plan reuses the memory of its large host outputs and scratch, never a result still held.

``bitfold.backends.host_buffers`` keeps, per plan, up to ``KEEP`` arrays of each
shape and dtype of at least ``MIN_BYTES``, and hands one out again when nothing
references it. These tests lower ``MIN_BYTES`` so that small folds (whose exact
sums the Fraction oracle can check) take the reuse path, and check, bit for
bit, that every result stays the oracle's after later calls: dropped results
are reused, held ones (the array, a view of it, a torch tensor sharing it) are not.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from oracle import exact_fold_oracle

import bitfold
from bitfold import dispatch
from bitfold.backends import host_buffers
from bitfold.backends.host_buffers import KEEP, buffers_of


@pytest.fixture
def small_buffers(monkeypatch):
    """Reuse every output and scratch array of 64 bytes or more."""
    monkeypatch.setattr(host_buffers, "MIN_BYTES", 64)


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint32 if np.asarray(a).dtype == np.float32 else np.uint64)


def _rows_oracle(idx: np.ndarray, rows: np.ndarray, K: int) -> np.ndarray:
    cols = [exact_fold_oracle(idx, rows[:, d], K) for d in range(rows.shape[1])]
    return np.stack(cols, axis=1)


def _data(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _values(seed: int, n: int, D: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (n, D) if D > 1 else (n,)
    # terms of spread magnitudes, so that sums round (and a reused buffer's old bits would show)
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, shape))).astype(np.float32)


ROWS = (300, 8, 40)  # n, D, K: a (40, 8) float32 output of 1,280 bytes


def test_a_dropped_rows_result_is_reused_and_a_held_one_is_never_overwritten(small_buffers):
    n, D, K = ROWS
    idx = np.random.default_rng(1).integers(0, K, n)
    plan = bitfold.Fold(idx, K)
    v1, v2, v3, v4 = (_values(s, n, D) for s in range(4))

    held = plan(v1)
    first = _data(held)
    second = plan(v2)  # the first result is held: new memory
    assert _data(second) != first
    second_at = _data(second)
    assert np.array_equal(_bits(held), _bits(_rows_oracle(idx, v1, K)))
    del second
    third = plan(v3)  # the second was dropped: its memory again
    assert _data(third) == second_at
    assert np.array_equal(_bits(third), _bits(_rows_oracle(idx, v3, K)))
    assert np.array_equal(_bits(held), _bits(_rows_oracle(idx, v1, K)))
    del held
    fourth = plan(v4)
    assert _data(fourth) == first  # the first result's memory, once dropped
    assert np.array_equal(_bits(fourth), _bits(_rows_oracle(idx, v4, K)))
    assert np.array_equal(_bits(third), _bits(_rows_oracle(idx, v3, K)))
    assert buffers_of(plan).nbytes == KEEP * K * D * 4


def test_a_view_of_a_result_keeps_its_memory_from_reuse(small_buffers):
    n, D, K = ROWS
    idx = np.random.default_rng(2).integers(0, K, n)
    plan = bitfold.Fold(idx, K)
    v = [_values(10 + s, n, D) for s in range(5)]
    views = [plan(v[0])[3:, 1], plan(v[1]).reshape(-1)[5:]]  # the results themselves dropped
    for s in range(2, 5):
        plan(v[s])
    assert np.array_equal(_bits(views[0]), _bits(_rows_oracle(idx, v[0], K)[3:, 1]))
    assert np.array_equal(_bits(views[1]), _bits(_rows_oracle(idx, v[1], K).reshape(-1)[5:]))


@pytest.mark.parametrize(
    ("route", "K", "dtype"),
    [
        ("float-stream", 300, np.float32),
        ("sorted-stream", 300, np.float32),
        ("sorted-stream", 300, np.float64),
        ("half-stream", 300, np.float16),
        ("buckets", 300, np.float32),
    ],
)
def test_scalar_routes_reuse_their_outputs_and_scratch_with_the_oracle_bits(small_buffers, route,
                                                                            K, dtype):  # fmt: skip
    n = 2000
    idx = np.random.default_rng(3).integers(0, K, n)
    plan = bitfold.Fold(idx, K)
    out = "float32" if dtype != np.float64 else "float64"
    held = []
    for s in range(6):
        vals = _values(20 + s, n, 1).astype(dtype)
        if dtype == np.float16:  # keep them finite
            vals = np.clip(vals.astype(np.float32), -60000, 60000).astype(dtype)
        got = dispatch.fold(plan, vals, route=route)  # float16 values fold into float32
        want = exact_fold_oracle(idx, vals, K, out)
        assert np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8)), (route, s)
        if s % 2 == 0:
            held.append((got, want))  # every other result is held through later calls
    for got, want in held:
        assert np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))
    assert buffers_of(plan).nbytes > 0  # the route went through the kept buffers


def test_a_torch_tensor_sharing_a_result_keeps_its_memory():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
    n, D, K = 4096, 64, 1024  # a (1024, 64) float32 output: 256 KiB
    idx = np.random.default_rng(4).integers(0, K, n)
    plan = bitfold.Fold(idx, K)
    vals = [_values(30 + s, n, D) for s in range(4)]
    want = [_rows_oracle(idx, v, K) for v in vals[:2]]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(host_buffers, "MIN_BYTES", 64)
        tensors = [plan(torch.from_numpy(v)) for v in vals[:2]]
        for v in vals[2:]:
            plan(torch.from_numpy(v))
    for t, w in zip(tensors, want, strict=True):
        assert np.array_equal(t.numpy().view(np.uint32), w.view(np.uint32))


def test_threads_folding_with_one_plan_each_get_their_own_bits(small_buffers):
    n, D, K = 2000, 4, 64
    idx = np.random.default_rng(5).integers(0, K, n)
    plan = bitfold.Fold(idx, K)
    inputs = [_values(40 + s, n, D) for s in range(8)]
    want = [_bits(bitfold.Fold(idx, K)(v)).copy() for v in inputs]  # plans of their own
    failures: list[str] = []

    def work(t: int) -> None:
        kept = []
        for r in range(60):
            s = (t + r) % len(inputs)
            got = plan(inputs[s])
            kept.append((s, got))
            if len(kept) > 3:
                kept.pop(0)
            for s_, g in kept:
                if not np.array_equal(_bits(g), want[s_]):
                    failures.append(f"thread {t}, call {r}: result of input {s_} changed")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failures == []


def test_small_outputs_are_not_kept_and_a_plan_keeps_at_most_keep_of_a_shape():
    idx = np.arange(1000) % 100
    plan = bitfold.Fold(idx, 100)
    plan(np.ones((1000, 4), np.float32))  # 1.6 kB, under MIN_BYTES
    assert buffers_of(plan).nbytes == 0
    K = host_buffers.MIN_BYTES // 4 // 16 + 1  # a (K, 16) float32 output just over MIN_BYTES
    big = bitfold.Fold(np.arange(K), K)
    results = [big(np.full((K, 16), float(s), np.float32)) for s in range(KEEP + 2)]
    assert buffers_of(big).nbytes == KEEP * K * 16 * 4
    assert [float(r[0, 0]) for r in results] == [float(s) for s in range(KEEP + 2)]


def test_jax_results_stay_their_own_while_the_plan_reuses_its_memory(small_buffers):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed (the 'jax' extra)")
    n, D, K = ROWS
    idx = np.random.default_rng(6).integers(0, K, n)
    plan = bitfold.Fold(idx, K)
    vals = [_values(50 + s, n, D) for s in range(4)]
    results = [plan(jnp.asarray(v)) for v in vals]
    for r, v in zip(results, vals, strict=True):
        assert np.array_equal(np.asarray(r).view(np.uint32), _bits(_rows_oracle(idx, v, K)))


def test_one_shot_folds_share_buffers_and_never_touch_a_result_held(small_buffers, monkeypatch):
    monkeypatch.setattr(host_buffers, "ONE_SHOT", host_buffers.HostBuffers(max_shapes=2))
    n, D, K = ROWS
    idx = np.random.default_rng(7).integers(0, K, n)
    vals = [_values(60 + s, n, D) for s in range(4)]
    held = bitfold.segment_sum(vals[0], idx, K)
    at = _data(bitfold.segment_sum(vals[1], idx, K))  # dropped at once
    again = bitfold.segment_sum(vals[2], idx, K)
    assert _data(again) == at and _data(held) != at  # a new plan each call, the same memory
    a = np.zeros((K, D), np.float32)
    bitfold.add_at(a, idx, vals[3])  # through the shared buffers too
    for got, v in ((held, vals[0]), (again, vals[2]), (a, vals[3])):
        assert np.array_equal(_bits(got), _bits(_rows_oracle(idx, v, K)))


def test_shared_buffers_forget_the_least_recently_used_shape_past_their_limit(small_buffers):
    shared = host_buffers.HostBuffers(max_shapes=2)
    first = shared.empty((100,), np.float32)
    first[:] = 7.0
    shared.empty((200,), np.float32)
    shared.empty((100,), np.float32)  # (100,) used again: (200,) is now the oldest
    shared.empty((300,), np.float32)
    assert shared.nbytes == (2 * 100 + 300) * 4  # (200,) forgotten; first still held: two
    assert np.all(first == 7.0)
