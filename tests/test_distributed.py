"""Partial exact sums from several torch.distributed processes merge to the one-pass bits."""

from __future__ import annotations

import numpy as np
import pytest

import bitfold

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")


def _data():
    rng = np.random.default_rng(21)
    idx = rng.integers(0, 50, size=(40, 30))
    vals = (rng.normal(size=(40, 30)) * 2.0 ** rng.integers(-30, 30, (40, 30))).astype(np.float32)
    return idx, vals


def _rank(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    idx, vals = _data()
    plan = bitfold.Fold(idx, 50)
    flat = vals.reshape(-1)
    lo, hi = flat.size * rank // world, flat.size * (rank + 1) // world
    acc = plan.accumulator().add(flat[lo:hi], start=lo)  # this rank's share of the values
    state = torch.from_numpy(acc.state.copy())
    dist.all_reduce(state, op=dist.ReduceOp.SUM)
    result = bitfold.ExactAccumulator.from_state(plan, state.numpy()).result()
    if rank == 0:
        np.save(out, result)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_all_reduced_states_give_the_single_process_bits(tmp_path, world):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available")
    out = str(tmp_path / "result.npy")
    init = f"file://{tmp_path / 'rendezvous'}"
    torch.multiprocessing.spawn(_rank, args=(world, init, out), nprocs=world, join=True)
    idx, vals = _data()
    want = bitfold.Fold(idx, 50)(vals)
    np.testing.assert_array_equal(np.load(out).view(np.uint32), want.view(np.uint32))
