"""Plans built on the device: a torch index on a device is checked, sorted and counted there.

No GPU here: :func:`bitfold.backends.device_plan.forced_device_build` sends CPU
tensors down the device build (the same torch operations, the same flag read),
and every array it makes is compared with the host build's, entry for entry
and dtype for dtype; folds with either plan give the same bits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import bitfold  # noqa: E402
from bitfold import plan as plan_module  # noqa: E402
from bitfold.backends import device_plan  # noqa: E402
from bitfold.backends.device_plan import PlanTensors, forced_device_build  # noqa: E402
from bitfold.torch import ops as torch_ops  # noqa: E402
from bitfold.torch.folds import fold_rows  # noqa: E402
from bitfold.torch.plan_cache import PlanCache  # noqa: E402


def _random(g: np.random.Generator) -> tuple[np.ndarray, int]:
    return g.integers(0, 37, 1000), 37


def _skewed(g: np.random.Generator) -> tuple[np.ndarray, int]:
    ids = g.integers(0, 500, 3000)
    ids[g.random(3000) < 0.9] = 7  # one hot bucket
    return ids, 500


def _one_bucket(g: np.random.Generator) -> tuple[np.ndarray, int]:
    return np.zeros(257, np.int64), 1


def _empty_buckets(g: np.random.Generator) -> tuple[np.ndarray, int]:
    return 2 * g.integers(0, 50, 800) + 1, 120  # odd ids only, none past 100


def _large_K(g: np.random.Generator) -> tuple[np.ndarray, int]:
    return g.integers(0, 300_000, 5000), 300_000  # more buckets than positions (radix on host)


def _multi_dim(g: np.random.Generator) -> tuple[np.ndarray, int]:
    return g.integers(0, 29, (4, 5, 6)), 29


def _no_positions(g: np.random.Generator) -> tuple[np.ndarray, int]:
    return np.zeros((3, 0), np.int64), 5


CASES: dict[str, Callable[[np.random.Generator], tuple[np.ndarray, int]]] = {
    "random": _random,
    "skewed": _skewed,
    "K=1": _one_bucket,
    "empty-buckets": _empty_buckets,
    "large-K": _large_K,
    "multi-dim": _multi_dim,
    "no-positions": _no_positions,
}


@pytest.fixture
def host_copies(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the copies of a device-built plan's index to the host."""
    calls: list[int] = []
    real = device_plan.host_index

    def counted(tensors: PlanTensors, K: int) -> np.ndarray:
        calls.append(K)
        return real(tensors, K)

    monkeypatch.setattr(device_plan, "host_index", counted)
    yield calls


def _device_plan(index: Any, K: int) -> bitfold.Fold:
    with forced_device_build():
        return bitfold.Fold(index, K)


def _same(t: Any, arr: np.ndarray) -> bool:
    return np.array_equal(t.numpy().astype(np.int64), np.asarray(arr).astype(np.int64))


# -- the arrays -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("case", list(CASES))
def test_device_build_equals_host_build(case: str, dtype: Any, host_copies: list[int]) -> None:
    ids, K = CASES[case](np.random.default_rng(len(case)))
    index = torch.from_numpy(ids).to(dtype)
    host = bitfold.Fold(ids, K)
    plan = _device_plan(index, K)
    assert (plan.device, plan.K, plan.shape, plan.size) == ("cpu", K, host.shape, host.size)
    built = plan.device_tensors
    assert built is not None
    assert (built.index.dtype, built.order.dtype, built.sorted_index.dtype) == (
        torch.int64, torch.int32, torch.int32,
    )  # fmt: skip
    assert (built.counts.dtype, built.offsets.dtype) == (torch.int32, torch.int64)
    assert all(t.is_contiguous() for t in built.tensors())
    assert built.offsets.shape == (K + 1,) and built.counts.shape == (K,)
    assert _same(built.index, host.index)
    assert _same(built.order, host.order)
    assert _same(built.sorted_index, host.sorted_index)
    assert _same(built.counts, host.counts)
    assert _same(built.offsets, host.offsets)
    # the same tensors the host plan's copies are, dtype for dtype
    copied = device_plan.plan_tensors(host, "cpu")
    for a, b in zip(built.tensors(), copied.tensors(), strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert host_copies == []  # nothing above asked the device-built plan for a host array


@pytest.mark.parametrize("case", list(CASES))
def test_host_arrays_appear_lazily_from_one_copy(case: str, host_copies: list[int]) -> None:
    ids, K = CASES[case](np.random.default_rng(3))
    host = bitfold.Fold(ids, K)
    plan = _device_plan(torch.from_numpy(ids), K)
    before = plan.host_nbytes
    assert host_copies == []
    assert plan.fingerprint == host.fingerprint  # asks for the host index: one copy
    assert host_copies == [K]
    assert plan.index.dtype == host.index.dtype and np.array_equal(plan.index, host.index)
    assert not plan.index.flags.writeable
    for name in ("offsets", "counts", "order", "sorted_index"):
        a, b = getattr(plan, name), getattr(host, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert plan.same_map(host) and host.same_map(plan)
    assert plan.same_index(ids.reshape(host.shape))
    assert host_copies == [K]  # one host copy served every host array
    assert plan.host_nbytes > before


def test_non_contiguous_and_narrow_dtypes_read_in_c_order() -> None:
    g = np.random.default_rng(5)
    base = torch.from_numpy(g.integers(0, 40, (6, 9)))
    for index in (base.t(), base[:, ::2], base.to(torch.uint8), base.to(torch.int16)):
        host = bitfold.Fold(index, 40)
        plan = _device_plan(index, 40)
        assert plan.shape == host.shape
        assert _same(plan.device_tensors.index, host.index)
        assert _same(plan.device_tensors.order, host.order)


def test_device_plan_copies_the_index() -> None:
    index = torch.arange(10) % 3
    plan = _device_plan(index, 3)
    index.fill_(2)  # the caller's tensor changes; the plan's copy does not
    assert plan.device_tensors.index.tolist() == [i % 3 for i in range(10)]


def test_zero_dim_index() -> None:
    host = bitfold.Fold(np.array(4), 6)
    plan = _device_plan(torch.tensor(4), 6)
    assert plan.shape == host.shape == () and plan.size == 1
    assert plan.device_tensors.counts.tolist() == host.counts.tolist()


def test_deterministic_algorithms_build() -> None:
    ids = np.random.default_rng(9).integers(0, 64, 2048)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        plan = _device_plan(torch.from_numpy(ids), 64)
    finally:
        torch.use_deterministic_algorithms(was)
    assert _same(plan.device_tensors.order, bitfold.Fold(ids, 64).order)


# -- refusals -------------------------------------------------------------------------------------
def _refusal(build: Callable[[], Any]) -> BaseException:
    with pytest.raises(bitfold.FoldError) as info:
        build()
    return info.value


@pytest.mark.parametrize(
    "ids, shape",
    [
        ([0, 1, 5, 2, -1], (5,)),  # K = 5 first, then a negative one
        ([0, -3, 1, 9], (4,)),
        ([[0, 1, 2], [3, 4, 7]], (2, 3)),
        ([[[1]], [[2]], [[-1]]], (3, 1, 1)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_range_error_equals_the_host_build(ids: list, shape: tuple, dtype: Any) -> None:
    index = torch.tensor(ids, dtype=dtype)
    assert tuple(index.shape) == shape
    host = _refusal(lambda: bitfold.Fold(index, 5))
    device = _refusal(lambda: _device_plan(index, 5))
    assert type(device) is type(host) is bitfold.IndexRangeError
    assert str(device) == str(host)
    assert (device.position, device.value, device.K) == (host.position, host.value, host.K)


def test_range_error_beyond_int64_and_one_shot() -> None:
    index = torch.tensor([1, 2**63 + 5, 3], dtype=torch.uint64)
    host = _refusal(lambda: bitfold.Fold(index, 4))
    device = _refusal(lambda: _device_plan(index, 4))
    assert str(device) == str(host) and device.value == host.value == 2**63 + 5
    wide = torch.tensor([3, 2**40], dtype=torch.int64)  # does not wrap into range as int32 keys
    host = _refusal(lambda: bitfold.Fold(wide, 4))
    with forced_device_build():
        shot = _refusal(lambda: plan_module.one_shot(wide, 4))
    assert str(shot) == str(host) and shot.position == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool, torch.bfloat16, torch.complex64])
def test_dtype_refusal_equals_the_host_build(dtype: Any) -> None:
    index = torch.zeros(4, dtype=dtype)
    host = _refusal(lambda: bitfold.Fold(index, 3))
    device = _refusal(lambda: _device_plan(index, 3))
    assert type(device) is type(host) is bitfold.FoldTypeError and str(device) == str(host)


def test_k_refusals_and_meta_as_on_the_host() -> None:
    for K in (0, -2, 2.5):
        host = _refusal(lambda K=K: bitfold.Fold(torch.zeros(3, dtype=torch.int64), K))
        device = _refusal(lambda K=K: _device_plan(torch.zeros(3, dtype=torch.int64), K))
        assert type(device) is type(host) and str(device) == str(host)
    meta = torch.zeros(3, dtype=torch.int64, device="meta")
    assert not device_plan.builds_on_device(meta)  # refused by the host reader, as before
    host = _refusal(lambda: bitfold.Fold(meta, 3))
    assert str(_refusal(lambda: _device_plan(meta, 3))) == str(host)


def test_which_indices_build_on_the_device() -> None:
    t = torch.zeros(3, dtype=torch.int64)
    assert not device_plan.builds_on_device(t)
    assert not device_plan.builds_on_device(np.zeros(3, np.int64))
    with forced_device_build():
        assert device_plan.builds_on_device(t)
        assert not device_plan.builds_on_device(np.zeros(3, np.int64))
        with forced_device_build(False):
            assert not device_plan.builds_on_device(t)
    assert bitfold.Fold(t, 1).device is None and bitfold.Fold(t, 1).device_tensors is None


# -- memory ---------------------------------------------------------------------------------------
def test_nbytes_counts_the_device_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = np.random.default_rng(1).integers(0, 100, 4096)
    plan = _device_plan(torch.from_numpy(ids), 100)
    built = plan.device_tensors
    assert built.nbytes == 4096 * (8 + 4 + 4) + 100 * 4 + 101 * 8
    assert plan.nbytes == plan.host_nbytes + plan.device_nbytes
    assert plan.host_nbytes == built.nbytes  # forced: the "device" is the CPU
    # as on a real device: tensors off the host count in device_nbytes, once each
    monkeypatch.setattr(plan_module, "_on_host", lambda a: isinstance(a, np.ndarray))
    assert plan.device_nbytes == built.nbytes and plan.host_nbytes == 0
    assert device_plan.index_tensor(plan, "cpu") is built.index  # no second copy
    assert device_plan.plan_tensors(plan, "cpu") is built
    assert plan.device_nbytes == built.nbytes
    values = torch.ones(4096)
    plan(values, backend="portable")
    plan(values, "ordered", backend="portable")
    derived = plan.device_nbytes - built.nbytes  # the portable path's int64 order, counts and
    assert derived == 4096 * 8 + 100 * 8 + 100 * 8  # count rows; its starts view the offsets
    assert plan.host_nbytes == 0
    assert plan.nbytes == plan.device_nbytes


def test_host_plan_nbytes_unchanged_by_device_accounting() -> None:
    ids = np.random.default_rng(2).integers(0, 10, 1000)
    plan = bitfold.Fold(ids, 10)
    assert plan.device_nbytes == 0
    assert plan.nbytes == plan.host_nbytes == plan.index.nbytes + plan.offsets.nbytes


# -- one torch index per plan and device ---------------------------------------------------------
def test_one_torch_index_per_plan_and_device() -> None:
    ids = np.random.default_rng(4).integers(0, 12, 300)
    host = bitfold.Fold(ids, 12)
    first = device_plan.index_tensor(host, "cpu")
    assert first.dtype == torch.int64 and _same(first, host.index)
    assert torch_ops._index_tensor(torch_ops.plan_key(host), torch.device("cpu")) is first
    assert device_plan.plan_tensors(host, "cpu").index is first
    plan = _device_plan(torch.from_numpy(ids), 12)
    key = torch_ops.plan_key(plan)
    assert torch_ops._index_tensor(key, torch.device("cpu")) is plan.device_tensors.index


def test_tensors_for_another_device_copy_device_to_device(host_copies: list[int]) -> None:
    ids = np.random.default_rng(6).integers(0, 30, 500)
    plan = _device_plan(torch.from_numpy(ids), 30)
    other = device_plan.plan_tensors(plan, "meta")  # a second device, no host on the way
    assert host_copies == []
    assert other.index is device_plan.index_tensor(plan, "meta")
    for a, b in zip(other.tensors(), plan.device_tensors.tensors(), strict=True):
        assert a.device.type == "meta" and (a.dtype, a.shape) == (b.dtype, b.shape)


# -- folds ----------------------------------------------------------------------------------------
def _bits(t: Any) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy()
    return t.numpy().view(np.uint8)


@pytest.mark.parametrize("strategy", ["exact", "ordered", "atomic"])
@pytest.mark.parametrize("case", ["random", "skewed", "K=1", "empty-buckets", "multi-dim"])
def test_fold_with_device_plan_same_bits(case: str, strategy: str, host_copies: list[int]) -> None:
    g = np.random.default_rng(11)
    ids, K = CASES[case](g)
    host = bitfold.Fold(ids, K)
    plan = _device_plan(torch.from_numpy(ids).to(torch.int32), K)
    scale = np.exp2(g.integers(-30, 30, ids.shape))
    for values in (
        torch.from_numpy((g.standard_normal(ids.shape) * scale).astype(np.float32)),
        torch.from_numpy(g.standard_normal((*ids.shape, 3))),  # float64 rows
        torch.from_numpy(g.standard_normal(ids.shape).astype(np.float32)).to(torch.bfloat16),
    ):
        got = plan(values, strategy, backend="portable")
        want = host(values, strategy, backend="portable")
        assert got.dtype == want.dtype and np.array_equal(_bits(got), _bits(want))
        if strategy != "atomic":  # the host backend, from the host plan
            on_host = host(values, strategy)
            assert np.array_equal(_bits(got), _bits(on_host))
    init = torch.from_numpy(g.standard_normal(K).astype(np.float32))
    values = torch.from_numpy(g.standard_normal(ids.shape).astype(np.float32))
    got = plan(values, backend="portable", init=init)
    assert np.array_equal(_bits(got), _bits(host(values, init=init)))
    assert host_copies == []  # the portable path read the plan's tensors, never the host
    assert np.array_equal(_bits(plan(values)), _bits(host(values)))  # host backend: one copy
    assert len(host_copies) == 1


def test_expand_with_device_plan(host_copies: list[int]) -> None:
    ids = np.random.default_rng(12).integers(0, 20, (7, 8))
    plan = _device_plan(torch.from_numpy(ids), 20)
    v = torch.randn(20, 3)
    assert torch.equal(plan.expand(v), v[torch.from_numpy(ids)])
    assert torch.equal(plan.expand(v), bitfold.Fold(ids, 20).expand(v))
    assert host_copies == []


def test_one_shot_and_segment_sum_build_on_the_device(host_copies: list[int]) -> None:
    g = np.random.default_rng(13)
    ids = g.integers(0, 70_000, 5000)  # past the eager-count limit: the host defers its check
    values = torch.from_numpy(g.standard_normal(5000).astype(np.float32))
    with forced_device_build():
        shot = plan_module.one_shot(torch.from_numpy(ids), 70_000)
        got = bitfold.segment_sum(values, torch.from_numpy(ids), 70_000, backend="portable")
    assert shot.once and shot.device == "cpu" and shot.unchecked_index is None
    assert host_copies == []
    want = bitfold.segment_sum(values, ids, 70_000)
    assert np.array_equal(_bits(got), _bits(want))


def test_torch_adapter_folds_with_device_plans() -> None:
    g = np.random.default_rng(14)
    ids = torch.from_numpy(g.integers(0, 300, 8192))
    rows = torch.from_numpy(g.standard_normal((8192, 4)).astype(np.float32))
    want = fold_rows(ids, rows, 300)
    cache = PlanCache()
    with forced_device_build():
        for _ in range(3):  # planned afresh, then kept, then reused after its check
            plan = cache.plan(ids, 300)
            assert plan.device == "cpu"
            got = bitfold.dispatch.fold(plan, rows, "exact", out_dtype="float32")
            assert np.array_equal(_bits(got), _bits(want))
    assert (cache.hits, cache.misses, len(cache)) == (1, 2, 1)


def test_import_bitfold_imports_no_torch() -> None:
    import subprocess
    import sys

    code = "import sys, bitfold; bitfold.Fold([0, 1], 2); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
