"""Folds of rows whose hot buckets are cut into parts: every bit against the Fraction oracle.

The buckets route cuts a bucket of more than ``split_limit(N)`` positions into
parts summed exactly in parallel, their integer limbs added and rounded once
(``kernels/buckets.py``). Lowered thresholds send small inputs down that path
with several parts a bucket and several float64 chunks a part; the values are
built to break the float64 sums (1e30, 1, -1e30), to need subnormals, and to
carry -0.0, NaN and infinities across part boundaries.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import bucket_oracle
from test_rows import assert_bits, rows_oracle

import bitfold
from bitfold import dispatch
from bitfold.backends import host_routes
from bitfold.kernels import buckets, cpu

K, N = 7, 4000


@pytest.fixture
def small_split(monkeypatch):
    """Parallel from 64 values, a split past 63 positions (4000 / 64), float32 chunks of 16 rows."""
    monkeypatch.setattr(cpu, "PARALLEL_MIN_VALUES", 64)
    monkeypatch.setattr(host_routes, "ROW_TASKS", 64)
    monkeypatch.setattr(buckets, "ROW_CHUNK", 16)


def _index(rng):
    """Bucket 0: 2,600 positions; 1: 400 (all -0.0); 2 and 3: 300 each; 4-6: the rest."""
    idx = np.concatenate([np.zeros(2600, np.int64), np.full(400, 1), np.full(300, 2),
                          np.full(300, 3), rng.integers(4, K, N - 3600)])  # fmt: skip
    return rng.permutation(idx)


def _adversarial(idx, rng, D, dtype):
    vals = (rng.standard_normal((N, D)) * 2.0 ** rng.integers(-30, 30, (N, D))).astype(dtype)
    hot = np.flatnonzero(idx == 0)
    vals[hot[0::3], 0], vals[hot[1::3], 0], vals[hot[2::3], 0] = 1e30, 1.0, -1e30
    tiny = np.finfo(dtype).smallest_subnormal
    vals[hot[::5], 1] = tiny * rng.integers(-50, 50, hot[::5].size)
    vals[idx == 1] = -0.0
    two, three = np.flatnonzero(idx == 2), np.flatnonzero(idx == 3)
    vals[two[5], 0], vals[two[-5], 0] = np.inf, -np.inf  # in different parts: NaN
    vals[two[-1], 1] = np.nan
    vals[three[-3], 0] = np.inf  # one infinity: +inf
    vals[three, 1] = np.float32(3e38) if dtype == np.float32 else 1.7e308  # overflows: +inf
    return vals


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_split_buckets_give_the_oracle_bits(small_split, dtype):
    rng = np.random.default_rng(20)
    idx = _index(rng)
    vals = _adversarial(idx, rng, 4, dtype)
    plan = bitfold.Fold(idx, K)
    _, split = host_routes.bucket_tasks(plan, vals.size)
    assert {0, 1, 2, 3} <= set(split[:, 0].tolist())
    assert (split[:, 2] - split[:, 1] > 1).all()  # every one in several parts
    out = np.dtype(dtype).name
    got = plan(vals)
    assert_bits(got, rows_oracle(idx, vals, K, out), f"split {out}")
    assert np.signbit(got[1]).all() and (got[1] == 0).all()  # all -0.0 stays -0.0
    assert np.isnan(got[2, 0]) and np.isnan(got[2, 1]) and got[3, 0] == np.inf


def test_split_bits_do_not_depend_on_the_cut(monkeypatch):
    """The same fold cut into parts of 63 positions, of 1,024, and not at all: the same bits."""
    monkeypatch.setattr(cpu, "PARALLEL_MIN_VALUES", 64)
    rng = np.random.default_rng(21)
    idx = _index(rng)
    vals = _adversarial(idx, rng, 3, np.float32)
    results = []
    for tasks_count, chunk in ((64, 16), (4, 1024), (4, 4096)):
        monkeypatch.setattr(host_routes, "ROW_TASKS", tasks_count)
        monkeypatch.setattr(buckets, "ROW_CHUNK", chunk)
        results.append(bitfold.Fold(idx, K)(vals))
    for other in results[1:]:
        assert_bits(other, results[0], "cut")


def test_split_buckets_with_init(small_split):
    """init is one more term of a split bucket (its first part's), rounded with it once."""
    rng = np.random.default_rng(22)
    idx = _index(rng)
    vals = _adversarial(idx, rng, 2, np.float32)
    init = np.array([[1e30, -3e-39], [-0.0, -0.0], [1.0, 2.0], [-np.inf, 0.5], [1, 2], [3, 4],
                     [5, 6]], np.float32)  # fmt: skip
    got = dispatch.fold(bitfold.Fold(idx, K), vals, init=init)
    for k in range(K):
        for d in range(2):
            terms = [float(init[k, d]), *(float(x) for x in vals[idx == k, d])]
            want = np.float32(bucket_oracle(terms, "float32"))
            assert_bits(got[k, d], want, f"bucket {k} column {d}")


def test_tasks_are_fixed_and_cover_every_position():
    """Tasks depend on the plan alone; whole ranges and parts cover each bucket exactly once."""
    rng = np.random.default_rng(23)
    n, k = 1 << 17, 5000
    idx = np.minimum(rng.zipf(1.3, n) - 1, k - 1)
    plan = bitfold.Fold(idx, k)
    tasks, split = host_routes.bucket_tasks(plan, n * 4)
    limit = host_routes.split_limit(n)
    counts = np.bincount(idx, minlength=k)
    assert sorted(split[:, 0]) == sorted(np.flatnonzero(counts > limit))
    covered = np.zeros(n, np.int64)
    offsets = np.asarray(plan.offsets)
    for k0, k1, lo, hi, p in tasks:
        if p < 0:
            covered[offsets[k0]:offsets[k1]] += 1
        else:
            assert hi - lo <= limit and k1 == k0 + 1
            covered[lo:hi] += 1
    assert (covered == 1).all()
    assert tasks.shape[0] >= host_routes.ROW_TASKS // 2


def test_split_scalar_buckets_with_init(small_split):
    """Scalars folded into init take the same tasks: a split bucket of scalars, init included."""
    rng = np.random.default_rng(24)
    idx = _index(rng)
    vals = _adversarial(idx, rng, 2, np.float32)[:, 0].copy()
    init = np.array([1e30, -0.0, 3.0, -2.0, 1e-40, -np.inf, 0.0], np.float32)
    got = dispatch.fold(bitfold.Fold(idx, K), vals, init=init)
    want = [bucket_oracle([float(init[k]), *map(float, vals[idx == k])]) for k in range(K)]
    assert_bits(got, np.array(want, np.float32), "scalars with init")
