"""Small CPU folds in ``exact_mode()`` (the lanes' one kernel call, in place or not, with an old
value or none) against the oracle: each bucket's exact sum of its old value and its rows,
rounded once, compared bit for bit; random sizes, duplicate ids, values spread over many
binades, signed zeros, infinities and NaNs."""

from __future__ import annotations

import numpy as np
import pytest
from oracle import exact_fold_oracle

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
bt = pytest.importorskip("bitfold.torch", reason="bitfold.torch needs PyTorch")

aten = torch.ops.aten
BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Normals times 2^[-40, 40), with a few -0.0, +-inf and NaN (with a payload) among them."""
    v = rng.standard_normal(shape) * np.exp2(rng.integers(-40, 40, shape))
    special = rng.random(shape)
    v[special < 0.03] = -0.0
    v[(special >= 0.03) & (special < 0.035)] = np.inf
    v[(special >= 0.035) & (special < 0.04)] = -np.inf
    t = torch.from_numpy(v).to(dtype)
    nan = torch.from_numpy(special >= 0.995)
    t.view(BITS[dtype])[nan] = 0x7FC0_0123 if dtype == torch.float32 else 0x7FF8_0000_0000_0123
    return t


def _want(flat_ids: np.ndarray, rows: torch.Tensor, K: int, old: torch.Tensor | None) -> np.ndarray:
    """The oracle's (K, D) result: every column folded alone, the old rows as K more terms."""
    out = "float32" if rows.dtype == torch.float32 else "float64"
    vals = rows.reshape(len(flat_ids), -1).numpy().astype(np.float64)
    ids = flat_ids
    if old is not None:
        ids = np.concatenate([np.arange(K), flat_ids])
        vals = np.concatenate([old.reshape(K, -1).numpy().astype(np.float64), vals])
    return np.stack([exact_fold_oracle(ids, vals[:, d], K, out) for d in range(vals.shape[1])], 1)


def _same_bits(got: torch.Tensor, want: np.ndarray) -> bool:
    return np.array_equal(got.reshape(want.shape).numpy().view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("seed", range(24))
def test_small_folds_are_the_oracles_bits(seed):
    rng = np.random.default_rng(seed)
    dtype = (torch.float32, torch.float64)[seed % 2]
    D = (1, 3, 64)[seed % 3]
    K, n = int(rng.integers(1, 300)), int(rng.integers(1, 200))
    ids = torch.from_numpy(rng.integers(0, K, n))
    rows, old = _values(rng, (n, D), dtype), _values(rng, (K, D), dtype)
    with bt.exact_mode() as m:
        in_place = old.clone()
        assert aten.index_add_(in_place, 0, ids, rows) is in_place
        out_of_place = aten.index_add(old, 0, ids, rows)
        no_old = aten.embedding_dense_backward(rows, ids, K, -1, False)
    assert dict(m.counts) == {"index_add": 2, "embedding_dense_backward": 1}
    flat = ids.numpy()
    assert _same_bits(in_place, _want(flat, rows, K, old))
    assert _same_bits(out_of_place, _want(flat, rows, K, old))
    assert _same_bits(no_old, _want(flat, rows, K, None))


@pytest.mark.parametrize("seed", range(8))
def test_small_index_puts_by_two_ids_are_the_oracles_bits(seed):
    """``x[i, j] += v`` (the backward of ``x[i, j]``): negative ids count from the end."""
    rng = np.random.default_rng(100 + seed)
    dtype = (torch.float32, torch.float64)[seed % 2]
    A, B, D, n = int(rng.integers(1, 20)), int(rng.integers(1, 20)), (1, 5)[seed % 2], 150
    i, j = rng.integers(-A, A, n), rng.integers(-B, B, n)
    rows, old = _values(rng, (n, D), dtype), _values(rng, (A, B, D), dtype)
    target = old.clone()
    with bt.exact_mode() as m:
        aten._index_put_impl_(target, [torch.from_numpy(i), torch.from_numpy(j)], rows, True, False)
    assert dict(m.counts) == {"index_put": 1}
    flat = (i % A) * B + (j % B)
    assert _same_bits(target, _want(flat, rows, A * B, old.reshape(A * B, D)))
