"""Folds of rows read in position order (the staged path): every bit against the Fraction oracle.

Past :data:`host_routes.STAGED_MIN_VALUES` float32 values (unless long rows fit in
half the last-level cache), a fold of rows reads
them once in position order: the rows of hot buckets are added into float64
sums an element a stream task, in chunks whose magnitudes certify them exact (a
row that cannot be certified tested value by value, a value or chunk sum that
would round spilled into integer limbs); the other rows are copied into the
plan's order and summed bucket by bucket, certified or tested
(``kernels/buckets.py``, :func:`fold_staged`). Lowered thresholds send small
inputs down that path. The values are built to break the float64 sums (a huge
exponent span, sums past 2^53 units), to need subnormals, to pass their tests
with no certificate, and to carry -0.0, NaN and infinities in hot and cold
buckets; a spill pool too small for them sends the fold back to the gather
path, with the same bits.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_rows import assert_bits, rows_oracle

import bitfold
from bitfold.backends import host_routes
from bitfold.kernels import buckets, cpu

K, N = 40, 3000


@pytest.fixture
def staged(monkeypatch):
    """Staged from 64 values, hot from 100 positions, three stream tasks, run in parallel."""
    monkeypatch.setattr(host_routes, "STAGED_MIN_VALUES", 64)
    monkeypatch.setattr(host_routes, "GATHERED_MAX_CACHE_SHARE", 0.0)  # whatever the caches
    monkeypatch.setattr(host_routes, "HOT_MIN_ROWS", 100)
    monkeypatch.setattr(host_routes, "STREAM_TASKS", 3)
    monkeypatch.setattr(cpu, "PARALLEL_MIN_VALUES", 64)
    monkeypatch.setattr(host_routes, "ROW_TASKS", 16)


def _index(rng):
    """Buckets 0-3: 900, 500, 300 and 200 positions (hot); 4: 30 (cold); 5-39: the rest."""
    idx = np.concatenate([np.full(900, 0), np.full(500, 1), np.full(300, 2), np.full(200, 3),
                          np.full(30, 4), rng.integers(5, K, N - 1930)])  # fmt: skip
    return rng.permutation(idx)


def _values(idx, rng, D=4):
    """Normal rows, then columns that the float64 sums cannot hold, in hot and cold buckets."""
    vals = rng.standard_normal((N, D)).astype(np.float32)
    zero, one, two, three = (np.flatnonzero(idx == k) for k in range(4))
    cold = np.flatnonzero(idx == 4)
    vals[zero[0::3], 0], vals[zero[1::3], 0], vals[zero[2::3], 0] = 1e30, 1.0, -1e30  # span
    vals[zero[::7], 1] = np.float32(1e-30)
    tiny = np.finfo(np.float32).smallest_subnormal
    vals[zero[::5], 2] = tiny * rng.integers(-50, 50, zero[::5].size)  # subnormals
    vals[one] = -0.0  # every term -0.0: -0.0
    vals[one[7], 3] = 0.0  # one +0.0: +0.0
    vals[two[5], 0], vals[two[-5], 0] = np.inf, -np.inf  # in different tasks: NaN
    vals[two[-1], 1] = np.nan
    vals[two[3], 2] = np.inf  # one infinity: +inf
    vals[three, 0] = np.float32(3e38)  # an exact sum past float32's range: +inf
    vals[three, 1] = np.float32(2.0**30)  # a sum of 2^37.6 ...
    vals[three[::2], 1] = np.float32(2.0**-30)  # ... with terms 2^60 times smaller: limbs
    vals[cold[3], 0], vals[cold[4], 1] = np.nan, np.inf  # cold buckets take the gather rules
    vals[cold[::2], 2] = tiny
    vals[cold[::3], 3] = np.float32(2.0**-40)  # 40 binades: no certificate, yet exact in float64
    return vals


def test_staged_rows_give_the_oracle_bits(staged, monkeypatch):
    rng = np.random.default_rng(30)
    idx = _index(rng)
    vals = _values(idx, rng)
    plan = bitfold.Fold(idx, K)
    lay = host_routes.staged_layout(plan, vals.shape[1])
    assert lay.hot.tolist() == [0, 1, 2, 3]
    calls = []
    real = buckets.fold_staged
    monkeypatch.setattr(buckets, "fold_staged", lambda *a: calls.append(real(*a)) or calls[-1])
    got = plan(vals)
    assert calls == [True]  # the spills fit the pool: no fallback
    assert_bits(got, rows_oracle(idx, vals, K), "staged")
    assert np.signbit(got[1, :3]).all() and (got[1] == 0).all() and not np.signbit(got[1, 3])
    assert np.isnan(got[2, 0]) and np.isnan(got[2, 1]) and got[2, 2] == np.inf
    assert got[3, 0] == np.inf and np.isnan(got[4, 0]) and got[4, 1] == np.inf


@pytest.mark.parametrize("out", ["float64", "bfloat16", "float16"])
def test_staged_rows_rounded_to_other_outputs(staged, out):
    """One rounding from the exact sum straight to the output dtype, hot buckets included."""
    rng = np.random.default_rng(31)
    idx = _index(rng)
    vals = _values(idx, rng)
    got = bitfold.Fold(idx, K)(vals, out_dtype=out)
    want = rows_oracle(idx, vals, K, out)
    if out == "bfloat16":  # a float32 array holding bfloat16 values
        want = want.astype(np.float32)
    assert_bits(np.asarray(got), want, f"staged to {out}")


def _chunk_breaking_rows(rng, n, D):
    """Rows of 2^20 and 2^-40 magnitudes, interleaved: each row alone is certified, a chunk of
    both kinds is not, and a chunk of small rows rounds when added into the large sum."""
    vals = rng.standard_normal((n, D)).astype(np.float32)
    small = rng.random(n) < 0.4
    vals[small] *= np.float32(2.0**-40)
    vals[~small] *= np.float32(2.0**20)
    return vals


def test_chunks_flushed_and_spilled_give_the_oracle_bits(staged, monkeypatch):
    """A hot bucket whose rows change magnitude: chunks end, and their sums spill to limbs."""
    rng = np.random.default_rng(36)
    idx = _index(rng)
    vals = _chunk_breaking_rows(rng, N, 4)
    calls = []
    real = buckets.fold_staged
    monkeypatch.setattr(buckets, "fold_staged", lambda *a: calls.append(real(*a)) or calls[-1])
    assert_bits(bitfold.Fold(idx, K)(vals), rows_oracle(idx, vals, K), "chunks")
    assert calls == [True]


def test_stream_task_flushes_chunk_sums_into_limbs_exactly():
    """The stream pass alone: its float64 sums plus spilled limbs are the exact sums."""
    from fractions import Fraction

    rng = np.random.default_rng(37)
    n, D, L = 600, 3, 24
    vals = _chunk_breaking_rows(rng, n, D)
    route = np.full(n, -1, np.int64)  # every row into hot bucket 0
    state = np.full((1, 1, D), -0.0)
    slot = np.full((1, 1, D), -1, np.int32)
    pool = np.zeros((1, 8, L + 5), np.int64)
    used = np.zeros(1, np.int64)
    bounds = np.array([0, n], np.int64)
    stage = np.empty((0, D), np.uint32)
    unit_exp = -149
    buckets._stream_parallel(vals.view(np.uint32), route, bounds, stage, False, state, slot, pool,
                             used, L, unit_exp)  # fmt: skip
    assert used[0] == D  # every element spilled a chunk sum that would have rounded
    for d in range(D):
        limbs = pool[0, slot[0, 0, d], :L]
        in_limbs = sum(Fraction(int(v)) * Fraction(2) ** (32 * i + unit_exp)
                       for i, v in enumerate(limbs))  # fmt: skip
        exact = sum(Fraction(float(v)) for v in vals[:, d])
        assert Fraction(float(state[0, 0, d])) + in_limbs == exact


def test_spill_pool_overflow_falls_back_with_the_same_bits(staged, monkeypatch):
    """A pool of two limb rows a task cannot hold the spills: the gather path folds instead."""
    rng = np.random.default_rng(32)
    idx = _index(rng)
    vals = _values(idx, rng)
    plan = bitfold.Fold(idx, K)
    calls = []
    real = buckets.fold_staged
    monkeypatch.setattr(buckets, "SPILL_ROWS", 2)
    monkeypatch.setattr(buckets, "fold_staged", lambda *a: calls.append(real(*a)) or calls[-1])
    got = plan(vals)
    assert calls == [False]
    assert_bits(got, rows_oracle(idx, vals, K), "after an overflow")


def test_staged_bits_equal_the_gather_path_for_any_cut(monkeypatch):
    """Normal rows, hot and cold: the same bits staged in 1, 3 or 4 tasks, or not staged."""
    monkeypatch.setattr(cpu, "PARALLEL_MIN_VALUES", 64)
    monkeypatch.setattr(host_routes, "GATHERED_MAX_CACHE_SHARE", 0.0)
    rng = np.random.default_rng(33)
    n, k, D = 8_000, 300, 16  # rows of whole cache lines: staged with non-temporal stores
    idx = np.minimum(rng.zipf(1.3, n) - 1, k - 1)
    vals = (rng.standard_normal((n, D)) * 2.0 ** rng.integers(-20, 20, (n, D))).astype(np.float32)
    results = []
    for min_values, tasks in ((1 << 62, 4), (64, 1), (64, 3), (64, 4)):
        monkeypatch.setattr(host_routes, "STAGED_MIN_VALUES", min_values)
        monkeypatch.setattr(host_routes, "STREAM_TASKS", tasks)
        results.append(bitfold.Fold(idx, k)(vals))
    for other in results[1:]:
        assert_bits(other, results[0], "cut")
    assert_bits(results[0], rows_oracle(idx, vals, k), "oracle")


def test_layout_routes_every_position_once(staged):
    """Hot rows name their bucket's slot; cold rows are a permutation into the plan's order."""
    rng = np.random.default_rng(34)
    idx = _index(rng)
    plan = bitfold.Fold(idx, K)
    lay = host_routes.staged_layout(plan, 4)
    hot = lay.route < 0
    assert (lay.hot[-1 - lay.route[hot]] == idx[hot]).all()
    cold = np.flatnonzero(~hot)
    assert sorted(lay.route[cold]) == list(range(cold.size))
    staged_index = np.empty(cold.size, np.int64)
    staged_index[lay.route[cold]] = idx[cold]
    assert (np.diff(staged_index) >= 0).all()  # bucket order
    counts = np.diff(np.asarray(lay.stage_offsets))
    assert (counts == np.bincount(staged_index, minlength=K)).all()
    assert lay.bounds[0] == 0 and lay.bounds[-1] == N


def test_one_shot_and_init_folds_are_not_staged(staged, monkeypatch):
    """A plan built for one fold, and a fold into an existing array, keep the gather path."""
    rng = np.random.default_rng(35)
    idx = _index(rng)
    vals = _values(idx, rng)
    monkeypatch.setattr(buckets, "fold_staged", lambda *a: pytest.fail("staged"))
    got = bitfold.segment_sum(vals, idx, K)
    assert_bits(got, rows_oracle(idx, vals, K), "one-shot")


def test_long_rows_within_the_cache_share_are_gathered(monkeypatch):
    """Rows past the value count, long enough and within the cache share: the gather path."""
    rng = np.random.default_rng(38)
    idx = _index(rng)
    vals = _values(idx, rng)  # rows of 16 bytes
    monkeypatch.setattr(host_routes, "STAGED_MIN_VALUES", 64)
    monkeypatch.setattr(host_routes, "GATHERED_MIN_ROW_BYTES", 16)
    monkeypatch.setattr(host_routes, "last_level_cache_bytes", lambda: 2 * vals.nbytes)
    plan = bitfold.Fold(idx, K)
    monkeypatch.setattr(buckets, "fold_staged", lambda *a: pytest.fail("staged"))
    assert_bits(plan(vals), rows_oracle(idx, vals, K), "gathered")
    monkeypatch.setattr(host_routes, "last_level_cache_bytes", lambda: 2 * vals.nbytes - 2)
    assert host_routes._is_staged(plan, vals)  # past the cache share
    monkeypatch.setattr(host_routes, "last_level_cache_bytes", lambda: 2 * vals.nbytes)
    monkeypatch.setattr(host_routes, "GATHERED_MIN_ROW_BYTES", 17)
    assert host_routes._is_staged(plan, vals)  # rows too short
    monkeypatch.setattr(host_routes, "last_level_cache_bytes", lambda: 0)
    monkeypatch.setattr(host_routes, "GATHERED_MIN_ROW_BYTES", 16)
    assert host_routes._is_staged(plan, vals)  # no cache reported
