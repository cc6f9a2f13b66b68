"""bitfold.torch (expand / fold / FoldedLinear) and bitfold.hashing (the layer's maps)."""

from __future__ import annotations

import doctest
import gc
import re

import numpy as np
import pytest
from oracle import bucket_oracle, exact_fold_oracle, ordered_fold_reference

import bitfold
from bitfold import hashing

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
bt = pytest.importorskip("bitfold.torch", reason="bitfold.torch needs PyTorch")

MASK = (1 << 64) - 1
BF16 = (8, -133, 127)  # precision, smallest subnormal exponent, largest exponent


def bits(t):
    """The raw bits of a tensor as a NumPy integer array (any float dtype)."""
    t = t.detach().contiguous()
    view = {torch.float16: torch.int16, torch.bfloat16: torch.int16,
            torch.float32: torch.int32, torch.float64: torch.int64}[t.dtype]
    return t.view(view).numpy()


# -- hashing --------------------------------------------------------------------------------------
def _mix_reference(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _hash_reference(seed, stream, row, col):
    """The docstring's definition with Python integers (independent of NumPy)."""
    x = _mix_reference((seed + stream * 0x9E3779B97F4A7C15) & MASK)
    return _mix_reference(_mix_reference(x ^ row) ^ col)


def test_bucket_and_sign_maps_hard_coded():
    # Computed once from the documented definition; guards against any accidental change.
    assert hashing.bucket_map(0, (4, 6), 7).tolist() == [
        [6, 5, 2, 5, 3, 6],
        [0, 3, 0, 4, 6, 6],
        [6, 2, 3, 6, 0, 4],
        [0, 1, 6, 1, 6, 4],
    ]
    assert hashing.bucket_map(3, (4, 6), 7).tolist() == [
        [3, 0, 6, 2, 4, 0],
        [1, 3, 5, 1, 4, 4],
        [2, 4, 1, 1, 2, 6],
        [4, 0, 0, 3, 3, 4],
    ]
    assert hashing.sign_map(0, (4, 6)).tolist() == [
        [1, -1, -1, -1, 1, 1],
        [1, 1, -1, -1, -1, -1],
        [1, 1, -1, -1, 1, 1],
        [-1, -1, 1, -1, -1, 1],
    ]


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63, 2**64 - 1])
def test_maps_follow_the_documented_definition(seed):
    b = hashing.bucket_map(seed, (5, 9), 13)
    s = hashing.sign_map(seed, (5, 9))
    for r in range(5):
        for c in range(9):
            assert b[r, c] == _hash_reference(seed, 1, r, c) % 13
            assert s[r, c] == (1 if _hash_reference(seed, 2, r, c) >> 63 == 0 else -1)


def test_maps_are_spread_over_buckets_and_signs():
    b = hashing.bucket_map(0, (200, 300), 10)
    counts = np.bincount(b.ravel(), minlength=10)
    assert counts.min() > 0.9 * 6000 and counts.max() < 1.1 * 6000
    s = hashing.sign_map(0, (200, 300))
    assert abs(int(s.sum())) < 0.02 * s.size
    assert not np.array_equal(hashing.bucket_map(1, (200, 300), 10), b)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True])
def test_hash_refuses_bad_seed(seed):
    with pytest.raises(bitfold.FoldError, match="seed"):
        hashing.bucket_map(seed, (2, 2), 3)


def test_hash_refuses_bad_shape_and_K():
    with pytest.raises(bitfold.FoldError, match="shape"):
        hashing.bucket_map(0, (2, 2, 2), 3)
    with pytest.raises(bitfold.FoldError, match="K"):
        hashing.bucket_map(0, (2, 2), 0)


def test_docstring_examples():
    for module in (hashing, bt):
        failed, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert tried > 0 and failed == 0, module.__name__


# -- expand / fold ---------------------------------------------------------------------------------
def _plan(shape=(6, 5), K=7, seed=0):
    return bitfold.Fold(np.random.default_rng(seed).integers(0, K, shape), K)


def test_expand_forward_is_the_gather():
    plan = _plan()
    v = torch.randn(7, dtype=torch.float64)
    W = bt.expand(v, plan)
    assert W.shape == plan.shape and W.dtype == v.dtype
    assert torch.equal(W, v[torch.from_numpy(plan.index.astype(np.int64))].reshape(plan.shape))


def test_expand_gradient_is_the_exact_fold_on_adversarial_terms():
    # bucket 0 holds the double-rounding trap 1 + 2^-24 + 2^-80; a naive float32 sum gives 1.0
    index = np.array([[0, 1, 0], [1, 0, 2]])
    plan = bitfold.Fold(index, 3)
    gW = torch.tensor([[1.0, 3.0, 2.0**-24], [-3.0, 2.0**-80, -0.0]])
    v = torch.zeros(3, requires_grad=True)
    (bt.expand(v, plan) * gW).sum().backward()
    want = exact_fold_oracle(index, gW.numpy(), 3)
    assert np.array_equal(bits(v.grad), want.view(np.int32))
    assert v.grad[0].item() == 1.0 + 2.0**-23 and str(v.grad[2].item()) == "-0.0"


@pytest.mark.parametrize("strategy", ["exact", "ordered", "atomic"])
def test_expand_gradient_per_strategy(strategy):
    plan = _plan((40, 30), K=11)
    gW = torch.from_numpy(np.random.default_rng(1).standard_normal((40, 30)).astype(np.float32))
    v = torch.zeros(11, requires_grad=True)
    (bt.expand(v, plan, strategy) * gW).sum().backward()
    if strategy == "exact":
        want = exact_fold_oracle(plan.index, gW.numpy(), 11)
    elif strategy == "ordered":
        want = ordered_fold_reference(plan.index, gW.numpy(), 11)
    else:  # atomic promises no order: compare with a tolerance
        np.testing.assert_allclose(v.grad.numpy(), exact_fold_oracle(plan.index, gW.numpy(), 11),
                                   rtol=1e-5, atol=1e-5)
        return
    assert np.array_equal(bits(v.grad), want.view(np.int32))


def test_float64_gradient_is_correctly_rounded_float64():
    plan = _plan((20, 10), K=5)
    gW = torch.from_numpy(np.random.default_rng(2).standard_normal((20, 10)))
    v = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    (bt.expand(v, plan) * gW).sum().backward()
    assert v.grad.dtype == torch.float64
    want = exact_fold_oracle(plan.index, gW.numpy(), 5, out="float64")
    assert np.array_equal(bits(v.grad), want.view(np.int64))


def test_float16_gradient_is_summed_exactly_and_rounded_once():
    index = np.array([0, 0, 0, 1, 1, 2])
    plan = bitfold.Fold(index, 3)
    # bucket 0: 1 + 2^-11 + 2^-20 -> float16 rounds up to 1 + 2^-10 (a float16 running sum gives 1)
    g = torch.tensor([1.0, 2.0**-11, 2.0**-20, 60000.0, 60000.0, -(2.0**-24)],
                     dtype=torch.float16)
    v = torch.zeros(3, dtype=torch.float16, requires_grad=True)
    (bt.expand(v, plan) * g).sum().backward()
    assert v.grad.dtype == torch.float16
    want = exact_fold_oracle(index, g.float().numpy(), 3, out="float16")
    assert np.array_equal(bits(v.grad), want.view(np.int16))
    assert v.grad[0].item() == 1.0 + 2.0**-10 and v.grad[1].item() == float("inf")


def _bf16_oracle(index, values, K, monkeypatch):
    import oracle

    monkeypatch.setitem(oracle.FORMATS, "bfloat16", BF16)
    buckets = [[] for _ in range(K)]
    for k, x in zip(index.tolist(), values.tolist(), strict=True):
        buckets[k].append(x)
    want = torch.tensor([bucket_oracle(b, "bfloat16") for b in buckets], dtype=torch.float64)
    return want.to(torch.bfloat16)  # exact: the oracle's values are bfloat16 values


def test_bfloat16_gradient_is_summed_exactly_and_rounded_once(monkeypatch):
    index = np.array([0, 0, 0, 1, 1, 2, 2, 3])
    plan = bitfold.Fold(index, 4)
    # bucket 0: 1 + 2^-8 + 2^-30 must round up to 1 + 2^-7; through float32 it would tie to 1.0
    g = torch.tensor([1.0, 2.0**-8, 2.0**-30, 3.0e38, 3.0e38, 2.0**-133, 2.0**-133, -0.0],
                     dtype=torch.bfloat16)
    v = torch.zeros(4, dtype=torch.bfloat16, requires_grad=True)
    (bt.expand(v, plan) * g).sum().backward()
    assert v.grad.dtype == torch.bfloat16
    want = _bf16_oracle(index, g.double().numpy(), 4, monkeypatch)
    assert np.array_equal(bits(v.grad), bits(want))
    assert v.grad[0].item() == 1.0 + 2.0**-7
    assert v.grad[1].item() == float("inf") and v.grad[2].item() == 2.0**-132


def test_bfloat16_random_gradient_matches_the_oracle(monkeypatch):
    plan = _plan((30, 20), K=9)
    g = torch.randn(30, 20, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    v = torch.zeros(9, dtype=torch.bfloat16, requires_grad=True)
    (bt.expand(v, plan) * g).sum().backward()
    want = _bf16_oracle(plan.index, g.double().numpy().ravel(), 9, monkeypatch)
    assert np.array_equal(bits(v.grad), bits(want))


def test_fold_functional_and_its_gradient():
    plan = _plan((8, 6), K=5)
    values = torch.randn(8, 6, dtype=torch.float64, requires_grad=True)
    out = bt.fold(values, plan)
    want = exact_fold_oracle(plan.index, values.detach().numpy(), 5, out="float64")
    assert np.array_equal(bits(out), want.view(np.int64))
    assert torch.autograd.gradcheck(lambda x: bt.fold(x, plan), (values,))
    half = bt.fold(values.detach().half(), plan)
    assert half.dtype == torch.float32  # the core's default for half-precision values
    assert bt.fold(values.detach().float(), plan, out_dtype=torch.bfloat16).dtype == torch.bfloat16


def test_second_derivative_goes_through_fold_and_expand():
    plan = _plan((5, 4), K=3)
    v = torch.randn(3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: (bt.expand(x, plan) ** 3).sum(), (v,))


def test_plan_used_only_in_the_forward_stays_alive_for_the_backward():
    v = torch.randn(7, requires_grad=True)
    W = bt.expand(v, _plan())  # the plan object has no other reference
    gc.collect()
    W.sum().backward()
    assert v.grad.sum().item() == 30.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_opcheck(dtype):
    plan = _plan()
    key = bt.plan_key(plan)
    v = torch.randn(7, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.bitfold.expand.default, (v, key, "exact"))
    g = torch.randn(6, 5, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.bitfold.fold.default, (g, key, "exact", dtype))


def test_deterministic_algorithms_mode():
    layer = bt.FoldedLinear(16, 12, 10)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    layer(x).square().sum().backward()
    eager = layer.shared_weight.grad.clone()
    layer.zero_grad()
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        layer(x).square().sum().backward()
    finally:
        torch.use_deterministic_algorithms(previous)
    assert np.array_equal(bits(layer.shared_weight.grad), bits(eager))


def test_torch_compile_fullgraph_matches_eager():
    # backend="aot_eager": traces through dynamo and AOT autograd like inductor does, without
    # inductor's C++ code generation (about 20 s a graph on a 2-core machine).
    layer = bt.FoldedLinear(16, 12, 10, signed=True)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    layer(x).square().sum().backward()
    eager = layer.shared_weight.grad.clone()
    layer.zero_grad()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    compiled(x).square().sum().backward()
    assert np.array_equal(bits(layer.shared_weight.grad), bits(eager))

    plan_a, plan_b = _plan(seed=1), _plan(seed=2)

    def f(v, plan):
        return (bt.expand(v, plan) ** 2).sum()

    cf = torch.compile(f, fullgraph=True, backend="aot_eager")
    for plan in (plan_a, plan_b, plan_a):  # a different plan must not reuse the other's graph
        v = torch.randn(7, requires_grad=True)
        cf(v, plan).backward()
        want = exact_fold_oracle(plan.index, (2 * plan.expand(v.detach())).numpy(), 7)
        assert np.array_equal(bits(v.grad), want.view(np.int32))


# -- FoldedLinear ---------------------------------------------------------------------------------
def test_folded_linear_maps_come_from_hashing():
    layer = bt.FoldedLinear(6, 4, 7, seed=0, signed=True)
    assert layer.plan.index.reshape(4, 6).tolist() == hashing.bucket_map(0, (4, 6), 7).tolist()
    assert layer.sign.tolist() == hashing.sign_map(0, (4, 6)).astype(float).tolist()
    W = layer.weight.detach()
    v = layer.shared_weight.detach()
    sign = torch.from_numpy(hashing.sign_map(0, (4, 6)).astype(np.float32))
    assert torch.equal(W, sign * v[torch.from_numpy(hashing.bucket_map(0, (4, 6), 7))])
    assert set(layer.state_dict()) == {"shared_weight", "bias"}


@pytest.mark.parametrize("signed", [False, True])
def test_folded_linear_gradient_is_the_exact_fold_of_the_weight_gradient(signed):
    layer = bt.FoldedLinear(20, 30, 17, seed=5, signed=signed)
    x = torch.randn(8, 20, generator=torch.Generator().manual_seed(0))
    W = layer.weight
    W.retain_grad()
    torch.nn.functional.linear(x, W, layer.bias).tanh().square().sum().backward()
    gW = W.grad * layer.sign if signed else W.grad  # the gradient of expand's output
    assert np.array_equal(bits(layer.shared_weight.grad), bits(layer.plan(gW)))
    want = exact_fold_oracle(layer.plan.index, gW.numpy(), 17)
    assert np.array_equal(bits(layer.shared_weight.grad), want.view(np.int32))


def _train_digest(steps=15):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        bt.FoldedLinear(64, 512, 256, seed=0), torch.nn.ReLU(), bt.FoldedLinear(512, 10, 64, seed=1)
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1)
    X, y = torch.randn(64, 64, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    return bitfold.digest(model.state_dict())


def test_three_training_runs_have_identical_digests():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # where PyTorch's own v[idx] backward uses racing atomics
    try:
        digests = {_train_digest() for _ in range(3)}
    finally:
        torch.set_num_threads(threads)
    assert len(digests) == 1


def test_folded_linear_half_precision_layers():
    for dtype in (torch.float16, torch.bfloat16):
        layer = bt.FoldedLinear(8, 6, 5, dtype=dtype)
        x = torch.randn(3, 8).to(dtype)
        layer(x).float().sum().backward()
        assert layer.shared_weight.grad.dtype == dtype


# -- errors ---------------------------------------------------------------------------------------
def test_errors_name_the_mismatch():
    plan = _plan()
    with pytest.raises(bitfold.ShapeError, match=r"shape \(7,\).*got shape \(6,\)"):
        bt.expand(torch.zeros(6), plan)
    with pytest.raises(bitfold.ShapeError, match="shape"):
        bt.expand(torch.zeros(1, 7), plan)  # (7, 1) is a vector of rows since folds of rows
    with pytest.raises(bitfold.FoldTypeError, match="int64"):
        bt.expand(torch.zeros(7, dtype=torch.int64), plan)
    with pytest.raises(bitfold.FoldTypeError, match=r"bitfold\.Fold"):
        bt.expand(torch.zeros(7), plan.index)
    with pytest.raises(bitfold.UnknownStrategyError, match="exact"):
        bt.expand(torch.zeros(7), plan, "fast")
    with pytest.raises(bitfold.ShapeError, match="31 elements"):
        bt.fold(torch.zeros(31), plan)
    with pytest.raises(bitfold.FoldTypeError, match="out_dtype"):
        bt.fold(torch.zeros(30), plan, out_dtype=torch.int32)
    with pytest.raises(bitfold.DeviceError, match="meta"):
        bt.expand(torch.zeros(7, device="meta"), plan)


def test_folded_linear_errors():
    with pytest.raises(bitfold.ShapeError, match=r"\(4, 6\).*K = buckets = 7"):
        bt.FoldedLinear(6, 4, 7, plan=bitfold.Fold(np.zeros((6, 4), np.int64), 7))
    with pytest.raises(bitfold.ShapeError, match="K = buckets = 9"):
        bt.FoldedLinear(6, 4, 9, plan=bitfold.Fold(np.zeros((4, 6), np.int64), 7))
    with pytest.raises(bitfold.FoldTypeError, match="floating"):
        bt.FoldedLinear(6, 4, 7, dtype=torch.int32)
    with pytest.raises(bitfold.FoldError, match="in_features"):
        bt.FoldedLinear(0, 4, 7)
    with pytest.raises(bitfold.UnknownStrategyError, match="ordered"):
        bt.FoldedLinear(6, 4, 7, strategy="sorted")
    layer = bt.FoldedLinear(6, 4, 7)
    with pytest.raises(bitfold.ShapeError, match=r"\(\.\.\., 6\)"):
        layer(torch.zeros(2, 5))
    layer.shared_weight = torch.nn.Parameter(torch.zeros(7, dtype=torch.int64), requires_grad=False)
    with pytest.raises(bitfold.FoldTypeError, match="shared_weight"):
        layer(torch.zeros(2, 6))


def test_custom_plan_layer():
    index = np.arange(12).reshape(3, 4) % 5
    layer = bt.FoldedLinear(4, 3, 5, bias=False, plan=bitfold.Fold(index, 5))
    assert layer.bias is None
    assert torch.equal(layer.weight, layer.shared_weight[torch.from_numpy(index)])


# -- rows (embedding tables) ----------------------------------------------------------------------
def test_expand_of_rows_and_its_exact_gradient():
    rng = np.random.default_rng(12)
    index = rng.integers(0, 6, (4, 5))
    plan = bitfold.Fold(index, 6)
    table = torch.randn(6, 3, requires_grad=True)
    out = bt.expand(table, plan)
    assert out.shape == (4, 5, 3)
    assert torch.equal(out, table.detach()[torch.from_numpy(index)])
    g = rng.standard_normal((4, 5, 3)) * 2.0 ** rng.integers(-30, 30, (4, 5, 3))
    g = torch.from_numpy(g.astype(np.float32))
    (out * g).sum().backward()
    want = np.stack([exact_fold_oracle(index, g.numpy()[..., d], 6) for d in range(3)], axis=1)
    assert np.array_equal(bits(table.grad), want.view(np.int32))


def test_fold_of_rows_and_its_gradient():
    plan = _plan((6, 5), K=7)
    values = torch.randn(30, 2, dtype=torch.float64, requires_grad=True)
    out = bt.fold(values, plan)
    assert out.shape == (7, 2)
    assert torch.autograd.gradcheck(lambda x: bt.fold(x, plan), (values,))
    assert torch.autograd.gradcheck(lambda t: bt.expand(t, plan),
                                    (torch.randn(7, 2, dtype=torch.float64, requires_grad=True),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_with_rows(dtype):
    plan = _plan()
    key = bt.plan_key(plan)
    v = torch.randn(7, 4, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.bitfold.expand.default, (v, key, "exact"))
    g = torch.randn(6, 5, 4, dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.bitfold.fold.default, (g, key, "exact", dtype))


# -- the drop-ins take what torch's functions take -------------------------------------------------
def _terms(shape, seed):
    """float32 values spread over 2^-30 .. 2^30: sums that round, and ties."""
    gen = torch.Generator().manual_seed(seed)
    scale = torch.pow(2.0, torch.randint(-30, 30, shape, generator=gen).float())
    return torch.randn(shape, generator=gen) * scale


def _oracle(target, positions, values):
    """Every element of ``target`` the correctly rounded sum of its old value and the values sent
    to its flat position (the Fraction oracle), float32."""
    flat = target.detach().reshape(-1).tolist()
    pos, vals = positions.reshape(-1).tolist(), values.detach().reshape(-1).tolist()
    terms = [[v] for v in flat]
    for p, v in zip(pos, vals, strict=True):
        terms[p].append(v)
    out = torch.tensor([bucket_oracle(t) if len(t) > 1 else t[0] for t in terms])
    return out.reshape(target.shape)


def _where(t):
    return torch.arange(t.numel()).reshape(t.shape)


def _index_add_cases():
    x, s = _terms((4, 3), 1), _terms((4, 5), 2)
    rows = _terms((3, 3), 3)
    i3 = torch.tensor([0, 2, 2])
    return {
        "negative dim": (x, -1, torch.tensor([1, 1, 0, 2, 1]), s),
        "int32 ids": (x, 0, i3.int(), rows),
        "non-contiguous": (x.t(), 1, i3, rows.t()),
        "0-d input": (torch.tensor(1.0), 0, torch.tensor([0]), torch.tensor(2.0**-24)),
        "0-d index": (torch.tensor(1.0), 0, torch.tensor(0), torch.tensor(2.0**-24)),
        "empty index": (x, 0, torch.zeros(0, dtype=torch.long), torch.zeros(0, 3)),
        "empty input": (torch.zeros(0, 3), 1, torch.tensor([0, 0]), torch.zeros(0, 2)),
    }


@pytest.mark.parametrize("case", list(_index_add_cases()))
def test_index_add_takes_torchs_inputs_and_rounds_once(case):
    input, dim, index, source = _index_add_cases()[case]
    got = bt.index_add(input, dim, index, source)
    ref = torch.index_add(input, dim, index, source)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    where = _where(input).reshape(input.shape or (1,))
    d = dim % max(input.dim(), 1)
    positions = where.index_select(d, index.reshape(-1).long())
    want = _oracle(input, positions, source.reshape(positions.shape))
    assert np.array_equal(bits(got), bits(want))


def _scatter_add_cases():
    x, src = _terms((4, 3), 4), _terms((4, 3), 5)
    idx = torch.randint(0, 4, (4, 3), generator=torch.Generator().manual_seed(6))
    return {
        "negative dim": (x, -1, idx % 3, src),
        "dim -2": (x, -2, idx, src),
        "int32 ids": (x, 0, idx.int(), src),
        "non-contiguous": (x.t(), 1, idx.t(), src.t()),
        "index smaller than src": (x, 0, idx[:2, :2], src),
        "rows": (x, 0, torch.tensor([3, 0, 3])[:, None].expand(3, 3), src[:3]),
        "0-d": (torch.tensor(1.0), 0, torch.tensor(0), torch.tensor(2.0**-24)),
        "empty index": (x, 0, torch.zeros(0, 3, dtype=torch.long), src),
    }


@pytest.mark.parametrize("case", list(_scatter_add_cases()))
def test_scatter_add_takes_torchs_inputs_and_rounds_once(case):
    input, dim, index, src = _scatter_add_cases()[case]
    got = bt.scatter_add(input, dim, index, src)
    ref = torch.scatter_add(input, dim, index, src)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if index.dim() == 0:
        index, src, input2 = index.reshape(1), src.reshape(1), input.reshape(1)
    else:
        input2 = input
    positions = _where(input2).gather(dim, index.long())
    part = src[tuple(slice(0, n) for n in index.shape)]
    assert np.array_equal(bits(got), bits(_oracle(input, positions, part)))


def test_segment_sum_and_embeddings_take_int32_empty_0d_and_non_contiguous_inputs():
    rows = _terms((3, 4), 7).t()  # (4, 3), not contiguous
    ids = torch.tensor([2, 0, 2, 2], dtype=torch.int32)
    got = bt.segment_sum(rows, ids, 3)
    positions = ids.long()[:, None] * 3 + torch.arange(3)
    assert np.array_equal(bits(got), bits(_oracle(torch.zeros(3, 3), positions, rows)))
    empty = bt.segment_sum(torch.zeros(0, 2), torch.zeros(0, dtype=torch.int32), 3)
    assert empty.shape == (3, 2) and not bits(empty).any()
    scalar = bt.segment_sum(torch.tensor(2.0), torch.tensor(1), 3)
    assert scalar.tolist() == [0.0, 2.0, 0.0]
    table = _terms((5, 3), 8).t().contiguous().t().requires_grad_()  # non-contiguous rows
    lookup = torch.tensor([[4, 0], [4, 4]], dtype=torch.int32).t()  # int32, non-contiguous
    out = bt.embedding(lookup, table)
    assert torch.equal(out, torch.nn.functional.embedding(lookup, table))
    grad = _terms(tuple(out.shape), 9)
    out.backward(grad)
    positions = lookup.reshape(-1).long()[:, None] * 3 + torch.arange(3)
    want = _oracle(torch.zeros(5, 3), positions, grad.reshape(-1, 3))
    assert np.array_equal(bits(table.grad), bits(want))
    assert bt.embedding(torch.tensor(4), table).shape == (3,)
    assert bt.embedding(torch.zeros(0, dtype=torch.long), table).shape == (0, 3)


def test_embedding_bag_takes_int32_ids_empty_bags_and_rounds_each_bag_once():
    weight = _terms((6, 3), 10)
    ids, offsets = torch.tensor([5, 1, 5, 0, 5], dtype=torch.int32), torch.tensor([0, 3, 3])
    for offs in (offsets, offsets.int()):  # int32 ids with int64 or int32 offsets, as torch
        got = bt.embedding_bag(ids, weight, offs, mode="sum")
        bags = torch.tensor([0, 0, 0, 2, 2])
        positions = bags[:, None] * 3 + torch.arange(3)
        want = _oracle(torch.zeros(3, 3), positions, weight[ids.long()])
        assert np.array_equal(bits(got), bits(want))
        assert got.shape == torch.nn.functional.embedding_bag(ids, weight, offs).shape
    flat = torch.zeros(0, dtype=torch.long)
    assert bt.embedding_bag(flat, weight, torch.tensor([0, 0])).shape == (2, 3)
    zero_length = bt.embedding_bag(torch.zeros(2, 0, dtype=torch.long), weight)  # torch raises
    assert zero_length.shape == (2, 3) and not bits(zero_length).any()
    two_d = torch.tensor([[1, 5], [0, 5], [5, 5]]).t()  # non-contiguous bags of 3
    got = bt.embedding_bag(two_d, weight, mode="sum")
    positions = torch.tensor([0, 0, 0, 1, 1, 1])[:, None] * 3 + torch.arange(3)
    want = _oracle(torch.zeros(2, 3), positions, weight[two_d.reshape(-1)])
    assert np.array_equal(bits(got), bits(want))


def test_embedding_bag_mean_with_include_last_offset_divides_by_the_bags_size():
    """Each bag's mean is its correctly rounded sum divided once by its number of ids; the ids
    after the last offset belong to no bag. (torch's CPU kernel divides the last bag by the
    ids from its start to the input's end: 3 here, a difference docs/guides/pytorch.md lists.)"""
    weight = torch.eye(6)
    got = bt.embedding_bag(torch.arange(6), weight, torch.tensor([0, 2, 4]),
                           include_last_offset=True)  # fmt: skip
    assert got[1].tolist() == [0.0, 0.0, 0.5, 0.5, 0.0, 0.0]


def test_index_add_and_scatter_add_take_torchs_out():
    x, s, i = _terms((4, 3), 11), _terms((3, 3), 12), torch.tensor([0, 2, 2])
    out = torch.empty(4, 3)
    assert bt.index_add(x, 0, i, s, out=out) is out
    assert torch.equal(out, bt.index_add(x, 0, i, s))
    resized = torch.empty(0)
    assert bt.scatter_add(x, 0, i[:, None].expand(3, 3), s, out=resized) is resized
    assert torch.equal(resized, bt.scatter_add(x, 0, i[:, None].expand(3, 3), s))
    ints = torch.zeros(3, dtype=torch.long)
    assert bt.index_add(ints, 0, i, i, out=ints.clone()).tolist() == [0, 0, 4]
    bad = [
        (torch.empty(4, 3, dtype=torch.float64), bitfold.FoldTypeError, "float64 tensor on cpu"),
        (torch.empty(2, 3), bitfold.ShapeError, "out has shape (2, 3)"),
        ([0.0], bitfold.FoldTypeError, "out must be a torch.Tensor or None; got a list"),
    ]
    for target, error, words in bad:
        before = target.clone() if isinstance(target, torch.Tensor) else None
        with pytest.raises(error, match=re.escape(words)):
            bt.index_add(x, 0, i, s, out=target)
        if before is not None:
            assert torch.equal(target, before) or torch.isnan(before).any()
    with pytest.raises(bitfold.FoldError, match="out= records no gradient"):
        bt.index_add(x, 0, i, s.requires_grad_(), out=torch.empty(4, 3))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.bool, torch.float32])
def test_ids_of_a_dtype_torch_refuses_are_refused_by_name(dtype):
    """torch takes int32 and int64 ids; embedding passed uint8 ids on to index_select, whose
    RuntimeError came out raw."""
    ids = torch.tensor([0, 1]).to(dtype)
    name = str(dtype).replace("torch.", "")
    for call, what in [
        (lambda: bt.embedding(ids, torch.ones(3, 2)), "input"),
        (lambda: bt.index_add(torch.zeros(3), 0, ids, torch.ones(2)), "index"),
        (lambda: bt.segment_sum(torch.ones(2), ids, 3), "index"),
        (lambda: bt.embedding_bag(torch.tensor([0, 1]), torch.ones(3, 2), ids), "offsets"),
    ]:
        with pytest.raises(bitfold.FoldTypeError, match=f"{what} must hold integers of dtype int32 "
                           f"or int64, as torch takes them; got {name}"):  # fmt: skip
            call()


def test_a_bfloat16_nan_result_is_the_canonical_pattern():
    """Host folds of torch bfloat16 give bfloat16 NaN as 0x7FC0 (torch's own float32 to
    bfloat16 conversion would give 0xFFFF), in a plan's fold and under exact_mode()."""
    plan = bitfold.Fold(np.array([0, 0, 1]), 2)
    v = torch.tensor([float("nan"), 1.0, 2.0], dtype=torch.bfloat16)
    got = plan(v, out_dtype="bfloat16")
    assert got.dtype == torch.bfloat16
    assert got.view(torch.int16).tolist() == [0x7FC0, 0x4000]  # NaN, 2.0
    with bt.exact_mode():
        mode = torch.zeros(2, dtype=torch.bfloat16).index_add(0, torch.tensor([0, 0, 1]), v)
    assert mode.view(torch.int16).tolist() == [0x7FC0, 0x4000]
