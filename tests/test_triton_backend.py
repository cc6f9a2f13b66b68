"""The Triton backend through the public API, on CPU tensors in Triton's interpreter.

``tests/conftest.py`` sets ``TRITON_INTERPRET=1`` on machines without a GPU, so
the kernels of :mod:`bitfold.kernels.triton` run here on CPU tensors, one
program after another. Every exact result is compared bit for bit with the
host backend and with the Fraction oracle; ``ordered`` with the host's
``ordered``. Sizes are small: the interpreter adds about a million values a
second. The adapter's paths (the drop-ins, ``exact_mode()``,
``bitfold.torch.compile``) are run with the Triton backend preferred for torch
tensors, as it is for GPU tensors by default.
"""

from __future__ import annotations

import dataclasses
import importlib.util

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed (make test installs it)", allow_module_level=True)

from oracle import exact_fold_oracle  # noqa: E402

import bitfold  # noqa: E402
from bitfold.backends import registry  # noqa: E402
from bitfold.backends import triton as triton_backend  # noqa: E402

pytestmark = pytest.mark.skipif(
    not triton_backend.interpreting(), reason="TRITON_INTERPRET=1 is not set (conftest sets it)"
)

INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    t = torch.as_tensor(t)
    return t.contiguous().view(INT[t.element_size()])


def same_bits(a, b) -> bool:
    return torch.equal(bits(a), bits(b))


def values(rng, shape, dtype, spread=30):
    v = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread, shape))
    return torch.from_numpy(v).to(dtype)


@pytest.fixture
def triton_first():
    """The Triton backend asked first for torch tensors (CPU ones included), then restored."""
    original = registry.get_backend("triton")
    registry.unregister("triton")
    registry.register(dataclasses.replace(original, priority=1000))
    try:
        yield
    finally:
        registry.unregister("triton")
        registry.register(original)


def test_gpu_tensors_route_to_triton_and_host_tensors_stay_on_the_host():
    assert registry.backend_for("torch", "cuda").name == "triton"
    assert registry.backend_for("cupy", "cuda").name == "triton"
    assert registry.backend_for("torch", "xpu").name == "triton"
    assert registry.backend_for("torch", "cpu").name == "host"
    assert registry.backend_for("numpy", "cpu").name == "host"


def test_cpu_tensors_are_refused_by_name_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    plan = bitfold.Fold(np.arange(6) % 3, 3)
    with pytest.raises(bitfold.DeviceError, match="triton"):
        plan(torch.ones(6), backend="triton")


@pytest.mark.parametrize(
    "dtype, out",
    [
        (torch.float32, None),
        (torch.float64, None),
        (torch.float16, torch.float16),
        (torch.bfloat16, torch.bfloat16),
        (torch.float64, torch.float32),
        (torch.float32, torch.float16),
    ],
)
@pytest.mark.parametrize("hot_min", [None, 64])
def test_exact_scalars_are_the_oracles_bits(dtype, out, hot_min):
    rng = np.random.default_rng(7)
    N, K = 900, 37
    index = rng.integers(0, K, N)
    index[:300] = 5  # one hot bucket
    v = values(rng, N, dtype)
    plan = bitfold.Fold(index, K)
    got = plan(v, backend="triton", out_dtype=out, hot_min=hot_min)
    assert same_bits(got, plan(v, out_dtype=out))
    if dtype != torch.bfloat16 and out != torch.bfloat16:
        name = str(out or (torch.float64 if dtype == torch.float64 else torch.float32))[6:]
        want = exact_fold_oracle(index, v.double().numpy(), K, name)
        assert same_bits(got, torch.from_numpy(want))


@pytest.mark.parametrize("trailing", [(3,), (2, 5), (70,)])
def test_exact_rows_with_hot_buckets_and_init(trailing):
    rng = np.random.default_rng(11)
    N, K = 120, 9
    index = rng.integers(0, K, N)
    index[::2] = 0
    v = values(rng, (N, *trailing), torch.float32)
    init = values(rng, (K, *trailing), torch.float32)
    plan = bitfold.Fold(index, K)
    for hot_min, chunk in [(None, None), (8, 16), (2, 5)]:
        got = plan(v, backend="triton", hot_min=hot_min, chunk=chunk)
        assert same_bits(got, plan(v))
        got = plan(v, backend="triton", init=init, hot_min=hot_min, chunk=chunk)
        assert same_bits(got, plan(v, init=init))


def test_one_bucket_and_special_values():
    rng = np.random.default_rng(3)
    N = 2000
    v = values(rng, N, torch.float32)
    plan = bitfold.Fold(np.zeros(N, np.int64), 1)
    assert same_bits(plan(v, backend="triton"), plan(v))
    index = np.repeat(np.arange(8), 25)
    w = torch.randn(200)
    w[0:25] = -0.0  # bucket 0: every term -0.0
    w[25:50] = 0.0
    w[50] = float("inf")
    w[75], w[76] = float("inf"), float("-inf")
    w[100] = float("nan")
    w[125:150] = 1e-45  # subnormals
    w[150:175] = 3e38  # past the range
    plan = bitfold.Fold(index, 9)  # bucket 8 empty
    for hot_min in (None, 3):
        got = plan(w, backend="triton", hot_min=hot_min)
        assert same_bits(got, plan(w))
        assert same_bits(got, torch.from_numpy(exact_fold_oracle(index, w.double().numpy(), 9)))


def test_ordered_is_the_hosts_order_and_bits():
    rng = np.random.default_rng(5)
    N, K = 700, 23
    index = rng.integers(0, K, N)
    for dtype, out in [(torch.float32, None), (torch.float64, torch.float16),
                       (torch.bfloat16, None), (torch.float32, torch.float64)]:  # fmt: skip
        v = values(rng, (N, 2), dtype, spread=12)
        v[3, 0] = float("nan")
        plan = bitfold.Fold(index, K)
        assert same_bits(plan(v, "ordered", backend="triton", out_dtype=out),
                         plan(v, "ordered", out_dtype=out))  # fmt: skip


def test_states_merge_with_host_states_bit_for_bit():
    rng = np.random.default_rng(9)
    N, K = 400, 11
    index = rng.integers(0, K, N)
    v = values(rng, (N, 2), torch.float32)
    plan = bitfold.Fold(index, K)
    device = plan.accumulator("float32", (2,), backend="triton").add(v[:150], start=0)
    host = plan.accumulator("float32", (2,)).add(v[150:].numpy(), start=150)
    assert device.backend == "triton"
    assert same_bits(device.merge(host).result(), plan(v))


def test_tuning_options_are_checked_by_name():
    plan = bitfold.Fold(np.arange(10) % 3, 3)
    with pytest.raises(bitfold.FoldError, match="hot_min"):
        plan(torch.ones(10), backend="triton", hot_min=0)
    with pytest.raises(bitfold.FoldError, match="chunk"):
        plan(torch.ones(10), backend="triton", chunk=-1)
    with pytest.raises(bitfold.FoldError, match="hot_min"):
        plan(torch.ones(10), "ordered", backend="triton", hot_min=4)


def test_route_names_the_lanes_and_the_hot_split():
    plan = bitfold.Fold(np.zeros(300, np.int64), 2)
    assert plan.route(torch.ones(300), backend="triton").route == "lanes+hot"
    assert plan.route(torch.ones(300), backend="triton", hot_min=400).route == "lanes"


def test_dropins_and_exact_mode_fold_through_triton(triton_first):
    import bitfold.torch as bt

    rng = np.random.default_rng(13)
    index = torch.from_numpy(rng.integers(0, 40, 600))
    src = values(rng, (600, 3), torch.float32)
    assert registry.backend_for("torch", "cpu").name == "triton"
    got = bt.index_add(torch.zeros(40, 3), 0, index, src)
    emb = torch.nn.Embedding(40, 3)
    with bt.exact_mode():
        emb(index).mul(src).sum().backward()
    via_triton = emb.weight.grad.clone()
    registry.unregister("triton")
    registry.register(dataclasses.replace(registry_default(), priority=0))
    try:
        want = bt.index_add(torch.zeros(40, 3), 0, index, src)
        emb.weight.grad = None
        with bt.exact_mode():
            emb(index).mul(src).sum().backward()
    finally:
        registry.unregister("triton")
        registry.register(dataclasses.replace(registry_default(), priority=1000))
    assert same_bits(got, want)
    assert same_bits(via_triton, emb.weight.grad)


def registry_default():
    return triton_backend.BACKEND


def test_compiled_step_folds_through_triton(triton_first):
    import bitfold.torch as bt

    rng = np.random.default_rng(17)
    index = torch.from_numpy(rng.integers(0, 30, 500))
    src = values(rng, (500, 4), torch.float32, spread=10)

    def step(x):
        return torch.zeros(30, 4).index_add(0, index, x)

    compiled = bt.compile(step, fullgraph=True)
    got = compiled(src)
    want = bitfold.Fold(index.numpy(), 30)(src.numpy())
    assert same_bits(got, torch.from_numpy(np.asarray(want)))


def test_a_plan_built_on_the_device_folds_there_without_a_host_copy():
    from bitfold.backends import device_plan

    rng = np.random.default_rng(19)
    index = torch.from_numpy(rng.integers(0, 12, 500))
    index[:300] = 4  # a hot bucket: its chunks are cut from the device's counts
    v = values(rng, (500, 2), torch.float32)
    with device_plan.forced_device_build():
        plan = bitfold.Fold(index, 12)
        got = plan(v, backend="triton")
        ordered = plan(v, "ordered", backend="triton")
        assert plan.route(v, backend="triton").route == "lanes+hot"
    assert plan._index is None and plan._order is None  # nothing was copied to the host
    host = bitfold.Fold(index.numpy(), 12)
    assert same_bits(got, host(v))
    assert same_bits(ordered, host(v, "ordered"))
