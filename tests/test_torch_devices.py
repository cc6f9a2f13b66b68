"""The torch adapter's device policy: one answer (``bitfold.torch.devices.folds_on``), asked of
the backend registry, read by every entry point.

CPU and CUDA tensors are folded as before; a device only the portable backend serves (MPS,
XPU, ...) is folded by it, with the same bits; a device no registered backend serves is
refused with a DeviceError by the functions and left to torch (and recorded) by the mode.
Devices other than the CPU are simulated by changing which backends are registered: every
backend but the portable one taken away, CPU tensors are a device only the portable path
serves; every backend but an unavailable one taken away, a device nothing serves.
"""

from __future__ import annotations

import numpy as np
import pytest

import bitfold
from bitfold.backends import cuda, registry

torch = pytest.importorskip("torch")

import bitfold.torch as bt  # noqa: E402  (after torch is known to load)
from bitfold.torch import devices, functional, plan_cache, sparse  # noqa: E402
from bitfold.torch.ops import check_tensor  # noqa: E402


def _only(monkeypatch, *names):
    """Leave only the backends ``names`` registered (for the test)."""
    for name in list(registry._REGISTRY):
        if name not in names:
            monkeypatch.delitem(registry._REGISTRY, name)


@pytest.fixture
def nothing_serves(monkeypatch):
    """CPU tensors as on a device no registered backend serves: only an unavailable one left."""
    _only(monkeypatch, "cuda")
    monkeypatch.setattr(cuda, "numba_cuda_loads", lambda: False)
    assert not devices.folds_on("cpu")


def _bits(t):
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy().view({2: np.uint16, 4: np.uint32, 8: np.uint64}[t.element_size()])


def test_folds_on_asks_the_registry():
    assert devices.folds_on("cpu") and devices.folds_on(torch.device("cpu"))
    assert devices.folds_on("cuda") and devices.folds_on("cuda:1")  # cuda kernels or portable
    for kind in ("mps", "xpu", "hpu"):  # the portable path serves every device
        assert devices.folds_on(kind) and devices.folds_on(torch.device(kind))
    assert not devices.folds_on("meta")  # no data: never, whatever serves it
    assert devices.device_type("cuda:1") == "cuda"


def test_without_the_portable_backend_other_devices_are_not_folded(monkeypatch):
    _only(monkeypatch, "host", "cuda")
    monkeypatch.setattr(cuda, "numba_cuda_loads", lambda: False)
    assert devices.folds_on("cpu")
    assert not devices.folds_on("xpu") and not devices.folds_on("cuda")
    monkeypatch.setattr(cuda, "numba_cuda_loads", lambda: True)
    assert devices.folds_on("cuda") and not devices.folds_on("mps")


def test_a_backend_that_cannot_run_on_a_device_does_not_make_it_foldable(monkeypatch):
    import dataclasses

    from bitfold.backends import host

    gpu = dataclasses.replace(host.BACKEND, name="fake-gpu", devices=("fakegpu",),
                              runs_on=lambda d: False, priority=200)  # fmt: skip
    _only(monkeypatch, "host")
    registry.register(gpu)
    try:
        assert not devices.folds_on("fakegpu") and devices.folds_on("cpu")
    finally:
        registry.unregister("fake-gpu")


def test_cpu_tensors_fold_unchanged(monkeypatch):
    """The policy decided once changes nothing on the CPU: the host folds, bits as before."""
    plan = bitfold.Fold(np.array([0, 1, 1, 0]), 2)
    v = torch.tensor([1.0, 2.0**-20, 3.0, -1.0])
    assert bt.fold(v, plan).tolist() == [0.0, 3.0 + 2.0**-20]
    check_tensor(v, "values")  # no refusal
    with pytest.raises(bitfold.DeviceError, match="meta"):
        check_tensor(v.to("meta"), "values")


def _folds_everywhere():
    """The same folds through every entry point whose device check changed: the custom op
    (``bt.fold``), a drop-in (its index checked), exact_mode's handler, the plan cache (an
    index long enough to be kept) and a sparse product; their results."""
    rng = np.random.default_rng(4)
    n, K = plan_cache.MIN_POSITIONS + 5, 37
    idx = torch.from_numpy(rng.integers(0, K, n))
    vals = torch.from_numpy(rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).float()
    plan = bitfold.Fold(idx.numpy(), K)
    out = {"fold": bt.fold(vals, plan), "index_add": functional.index_add(
        torch.zeros(K), 0, idx, vals)}  # fmt: skip
    with bt.exact_mode() as mode:
        out["mode"] = torch.zeros(K).index_add_(0, idx, vals)
        dense = torch.from_numpy(rng.standard_normal((6, 3))).float()
        A = torch.sparse_coo_tensor(torch.tensor([[0, 0, 2, 3], [1, 4, 4, 0]]),
                                    torch.tensor([1.5, -2.0, 2.0**-20, 3.0]), (4, 6))  # fmt: skip
        out["sparse"] = torch.sparse.mm(A, dense)
    bt.clear_plan_cache()
    hits = plan_cache.PLANS.hits
    for _ in range(3):  # met, kept, reused
        out["cached"] = functional.segment_sum(vals, idx, K)
    out["hits"] = plan_cache.PLANS.hits - hits
    bt.clear_plan_cache()
    return out, mode


def test_a_device_only_the_portable_backend_serves_is_folded_by_it(monkeypatch):
    """MPS, XPU: every entry point folds there through the portable path, the host's bits."""
    want, want_mode = _folds_everywhere()
    calls = []
    real = registry.get_backend("portable").folds["exact"]

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    portable = registry.get_backend("portable")
    _only(monkeypatch, "portable")
    monkeypatch.setitem(portable.folds, "exact", counted)  # type: ignore[index]
    got, mode = _folds_everywhere()
    assert len(calls) >= 5  # every fold went through the portable backend
    assert got["hits"] == want["hits"] >= 1  # the plan cache kept and reused the index's plan
    for key in ("fold", "index_add", "mode", "sparse", "cached"):
        assert np.array_equal(_bits(got[key]), _bits(want[key])), key
    assert mode.counts == want_mode.counts and not mode.passed


def test_a_device_no_backend_serves_is_refused_or_left_to_torch(nothing_serves):
    plan = bitfold.Fold(np.array([0, 1, 1]), 2)
    v = torch.ones(3)
    idx = torch.tensor([0, 1, 1])
    for call in (lambda: bt.fold(v, plan), lambda: bt.expand(torch.ones(2), plan),
                 lambda: functional.segment_sum(v, idx, 2),
                 lambda: functional.index_add(torch.zeros(2), 0, idx, v)):  # fmt: skip
        with pytest.raises(bitfold.DeviceError, match="device 'cpu', which no backend folds"):
            call()
    with pytest.raises(bitfold.DeviceError, match="the backends serve cuda: "):
        devices.check_device(v, "values")
    with bt.exact_mode() as mode:  # left to torch, and recorded
        got = torch.zeros(2).index_add_(0, idx, v)
        A = torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([1.0, 2.0]), (2,))
        A.coalesce()
    assert got.tolist() == [1.0, 2.0] and not mode.counts
    assert any("no bitfold backend folds" in k or "devices its backends serve" in k
               for k in mode.passed), mode.passed  # fmt: skip
    with pytest.raises(bitfold.FoldError, match="devices its backends serve"), bt.exact_mode(
        strict=True
    ):
        torch.zeros(2).index_add_(0, idx, v)
    S = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2))
    why = sparse.operands(S, torch.ones(2, 2))
    assert why == "a tensor on cpu: no bitfold backend folds tensors there"


def test_the_plan_cache_plans_afresh_where_nothing_folds(nothing_serves):
    idx = torch.zeros(plan_cache.MIN_POSITIONS + 1, dtype=torch.int64)
    cache = plan_cache.PlanCache()
    for _ in range(3):
        cache.plan(idx, 3)
    assert len(cache) == 0 and cache.hits == 0 and cache.misses == 0
