"""Partial exact sums from several torch.distributed processes merge to the one-pass bits.

Every scenario on 1, 2, 3 or 4 gloo processes runs in one of two launches (the module
fixture ``launches``): one process, whose first use also compiles the kernels every later
rank loads from the cache, then four processes, whose first two and first three ranks form
the groups of world size 2 and 3. Each world size runs its trainings of TRAININGS, then its
other scenarios, EXTRAS. The rank that dies, which breaks its group, has a launch of its own.
"""

from __future__ import annotations

import functools
import json
import os
import time

import numpy as np
import pytest

import bitfold
from bitfold.cli.launch import leave
from bitfold.errors import DistributedError

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
GradientSum = pytest.importorskip("bitfold.distributed", reason="needs torch").GradientSum

from ranks import start_ranks  # noqa: E402


def _spawn_ranks(fn, world: int, tmp_path, out: str) -> None:
    """Run ``fn(rank, world, init, out)`` in ``world`` gloo processes meeting in ``tmp_path``."""
    init = f"file://{tmp_path / 'rendezvous'}"
    start_ranks(fn, world, (world, init, out))


def _data():
    rng = np.random.default_rng(21)
    idx = rng.integers(0, 50, size=(40, 30))
    vals = (rng.normal(size=(40, 30)) * 2.0 ** rng.integers(-30, 30, (40, 30))).astype(np.float32)
    return idx, vals


def _state_sum(rank: int, world: int, out: str, group=None) -> None:
    """All-reduced accumulator states of each rank's share of the values (rank 0 saves)."""
    idx, vals = _data()
    plan = bitfold.Fold(idx, 50)
    flat = vals.reshape(-1)
    lo, hi = flat.size * rank // world, flat.size * (rank + 1) // world
    acc = plan.accumulator().add(flat[lo:hi], start=lo)  # this rank's share of the values
    state = torch.from_numpy(acc.state.copy())
    dist.all_reduce(state, op=dist.ReduceOp.SUM, group=group)
    result = bitfold.ExactAccumulator.from_state(plan, state.numpy()).result()
    if rank == 0:
        np.save(f"{out}/state.npy", result)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_all_reduced_states_give_the_single_process_bits(launches, world):
    idx, vals = _data()
    want = bitfold.Fold(idx, 50)(vals)
    got = np.load(launches[world] / "state.npy")
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


# -- GradientSum: the same bits for every world size ---------------------------------------------

MICRO, N_MICRO = 6, 10  # 10 micro-batches a step: uneven over 3 and 4 ranks


def _model(dtype):
    from bitfold.torch import FoldedLinear

    torch.manual_seed(0)
    return torch.nn.Sequential(
        FoldedLinear(12, 24, buckets=40, seed=3), torch.nn.ReLU(), torch.nn.Linear(24, 3)
    ).to(dtype)


def _batches(dtype):
    g = torch.Generator().manual_seed(1)
    X = torch.randn(MICRO * N_MICRO, 12, generator=g) * torch.exp2(
        torch.randint(-10, 10, (MICRO * N_MICRO, 12), generator=g).float()
    )
    return X.to(dtype), torch.randint(0, 3, (MICRO * N_MICRO,), generator=g)


def _train(rank, world, dtype_name, exact, n_micro, words, group=None):
    """Three SGD steps of ``n_micro`` micro-batches dealt round-robin; the model's digest."""
    dtype = getattr(torch, dtype_name)
    model, (X, y) = _model(dtype), _batches(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gs = GradientSum(model.parameters(), timeout=60, words=words, group=group)
    for _step in range(3):
        partial = [torch.zeros_like(p) for p in model.parameters()]
        for j in range(rank, n_micro, world):
            sl = slice(j * MICRO, (j + 1) * MICRO)
            loss = torch.nn.functional.cross_entropy(model(X[sl]).float(), y[sl], reduction="sum")
            loss.backward()
            if exact:
                gs.add()
            else:
                for acc, p in zip(partial, model.parameters(), strict=True):
                    acc += p.grad
                    p.grad = None
        if exact:
            gs.reduce(mean_over=MICRO * n_micro)
        else:  # the usual way: float partial sums, a float all-reduce
            for acc, p in zip(partial, model.parameters(), strict=True):
                dist.all_reduce(acc, group=group)
                p.grad = acc / (MICRO * N_MICRO)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return bitfold.digest({k: v.float() for k, v in model.state_dict().items()})


#: (world size, dtype, exact, micro-batches a step, words): the trainings the tests below
#: compare, each world size's in one launch of its ranks (a fresh model and GradientSum each)
TRAININGS = [
    *[(w, "float32", True, N_MICRO, None) for w in (1, 2, 3, 4)],
    *[(w, "bfloat16", True, N_MICRO, None) for w in (1, 3)],
    *[(w, "float32", False, N_MICRO, None) for w in (1, 2, 4)],
    *[(w, "float32", True, 4, words)
      for w, words in ((1, "host"), (2, "device"), (4, "device"), (4, "host"))],
]  # fmt: skip


def _world_size(rank, world, group, out):
    """This rank's part of world size ``world``: every training of TRAININGS in turn (rank 0
    writes their digests), then EXTRAS, each leaving its results in the folder ``out``."""
    trainings = [t[1:] for t in TRAININGS if t[0] == world]
    digests = [_train(rank, world, *t, group=group) for t in trainings]
    if rank == 0:
        with open(f"{out}/digests.json", "w") as f:
            json.dump(digests, f)
    for scenario in EXTRAS.get(world, ()):
        scenario(rank, world, out, group)


def _launch_rank(rank, launch, init, outs):
    """One rank of a launch of ``launch`` processes: every world size of WORLDS from
    ``launch`` (the default group) down to 2 (the first ranks of the launch), or the one
    process of a launch of 1; ``outs`` maps a world size to its results' folder."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=launch)
    sizes = sorted((w for w in WORLDS if w <= launch and (w > 1 or launch == 1)), reverse=True)
    groups = {w: None if w == launch else dist.new_group(list(range(w))) for w in sizes}
    for w in sizes:  # every rank makes every group first; the largest group sums first, so
        if rank < w:  # no rank waits in a sum for the others' smaller groups
            _world_size(rank, w, groups[w], outs[w])
    dist.barrier()
    dist.destroy_process_group()
    leave(0)  # no interpreter teardown: see bitfold.cli.launch.leave


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    """Every world size's trainings and scenarios: world size -> the folder of its results."""
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available")
    outs = {w: tmp_path_factory.mktemp(f"world{w}") for w in WORLDS}
    for launch in (1, max(WORLDS)):  # one process first: it compiles the kernels once
        init = f"file://{outs[launch] / 'rendezvous'}"
        start_ranks(_launch_rank, launch, (launch, init, {w: str(o) for w, o in outs.items()}))
    return outs


@pytest.fixture(scope="module")
def digests(launches):
    """Every training of TRAININGS: ``(world, dtype, exact, n_micro, words)`` -> digest."""
    got = {}
    for world, tmp in launches.items():
        trainings = [t[1:] for t in TRAININGS if t[0] == world]
        done = json.loads((tmp / "digests.json").read_text())
        got.update(zip([(world, *t) for t in trainings], done, strict=True))
    return got


@pytest.mark.parametrize(("library", "current", "want"), [
    ("gloo", None, "cpu"), ("nccl", 2, "cuda:2"), ("xccl", 1, "xpu:1"), ("mpi", None, "cpu"),
    ("cpu:gloo,cuda:nccl", None, "cpu"), ("toyccl", 3, "cuda:3"),
])  # fmt: skip
def test_a_groups_collectives_take_the_device_the_registry_names(monkeypatch, library,
                                                                 current, want):  # fmt: skip
    """Where a group's tensors go is the registry's answer for its library (a library a
    backend adds, ``toyccl``, is one row), on the current device of that type."""
    from bitfold import distributed
    from bitfold.backends import registry

    monkeypatch.setattr(registry, "_COLLECTIVES", registry.collective_libraries())
    registry.register_collective("toyccl", "cuda")
    monkeypatch.setattr(dist, "get_backend", lambda group=None: library)
    kind = registry.collective_device_type(library)
    if current is not None:
        monkeypatch.setattr(getattr(torch, kind), "current_device", lambda: current)
    assert distributed._device_of(None) == torch.device(want)
    t = torch.zeros(2)
    if want == "cpu":  # a library taking CPU tensors takes them where they are
        assert distributed._on_group_device(t, None) is t


@pytest.mark.slow
def test_device_words_train_the_host_words_bits(digests):
    """Four micro-batches a step: one a rank on 4 ranks (kept on the device, its words made
    there), two or four a rank on 2 or 1 (summed on the host first): one digest."""
    got = {(w, words): digests[w, "float32", True, 4, words]
           for w, words in ((1, "host"), (2, "device"), (4, "device"), (4, "host"))}  # fmt: skip
    assert len(set(got.values())) == 1, got


@pytest.mark.slow
@pytest.mark.parametrize(("dtype_name", "worlds"), [("float32", (1, 2, 3, 4)),
                                                    ("bfloat16", (1, 3))])
def test_every_world_size_trains_the_same_bits(digests, dtype_name, worlds):
    got = {w: digests[w, dtype_name, True, N_MICRO, None] for w in worlds}
    assert len(set(got.values())) == 1, got


@pytest.mark.slow
def test_a_float_all_reduce_does_not(digests):
    got = {w: digests[w, "float32", False, N_MICRO, None] for w in (1, 2, 4)}
    assert len(set(got.values())) > 1, got


def _mismatch(rank, world, out, group=None):
    params = [torch.nn.Parameter(torch.ones(3 + rank))]
    params[0].grad = torch.ones(3 + rank)
    gs = GradientSum(params, timeout=30, group=group).add()
    try:
        gs.reduce()
        result = "reduced"
    except DistributedError as err:
        result = str(err)
    with open(f"{out}/mismatch.{rank}", "w") as f:
        f.write(result)


@pytest.mark.slow
def test_different_parameter_lists_are_refused_before_any_reduction(launches):
    for rank in (0, 1):
        said = (launches[2] / f"mismatch.{rank}").read_text()
        assert "parameter lists differ between ranks" in said


def _dying_rank(rank, world, init, out):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    params = [torch.nn.Parameter(torch.ones(4))]
    params[0].grad = torch.ones(4)
    gs = GradientSum(params, timeout=5).add()
    if rank == 1:
        os._exit(0)  # dies before the reduction
    t0 = time.monotonic()
    try:
        gs.reduce()
        result = "reduced"
    except DistributedError as err:
        result = f"{time.monotonic() - t0:.1f} {err}"
    with open(out, "w") as f:
        f.write(result)
    leave(0)  # the group is broken: no teardown


@pytest.mark.slow
def test_a_dead_rank_stops_the_others_with_a_clear_error_within_the_timeout(tmp_path):
    out = str(tmp_path / "dead")
    start_ranks(_dying_rank, 2, (2, f"file://{tmp_path / 'rdv'}", out))  # rank 1 exits first
    seconds, message = open(out).read().split(" ", 1)
    assert float(seconds) < 30
    assert "failed on rank 0 of 2 (collectives wait at most 5 s)" in message


# -- exact_all_reduce of one array, and the refusals ----------------------------------------------


def _array_sums(rank: int, world: int, out: str, group=None) -> None:
    from bitfold.distributed import exact_all_reduce

    t = torch.from_numpy(_array_terms(world)[rank])
    summed = exact_all_reduce(t, group=group)
    mean = exact_all_reduce(t.numpy(), mean_over=world, group=group)
    half = exact_all_reduce(t.to(torch.bfloat16), group=group)
    if rank == 0:
        assert isinstance(summed, torch.Tensor) and summed.dtype == torch.float32
        assert isinstance(mean, np.ndarray) and half.dtype == torch.bfloat16
        np.savez(f"{out}/array.npz", summed=summed.numpy(), mean=mean, half=half.float().numpy())


def _array_terms(world: int) -> list[np.ndarray]:
    """Per rank a (3, 4) float32 array; their sums round differently left to right."""
    rng = np.random.default_rng(4)
    terms = [(rng.normal(size=(3, 4)) * 2.0 ** rng.integers(-30, 30, (3, 4))).astype(np.float32)
             for _ in range(world)]  # fmt: skip
    terms[0][0, 0], terms[1][0, 0] = 1.0, 2.0**-24  # with 2^-24 from rank 2: 1 + 2^-23
    terms[-1][0, 0] = 2.0**-24
    return terms


@pytest.mark.slow
def test_exact_all_reduce_sums_a_tensor_or_an_array(launches):
    from oracle import exact_fold_oracle

    world = 3
    got = np.load(launches[world] / "array.npz")
    terms = _array_terms(world)
    idx = np.tile(np.arange(12), world)
    want = exact_fold_oracle(idx, np.concatenate([t.reshape(-1) for t in terms]), 12)
    assert want[0] == np.float32(1 + 2.0**-23)
    assert sum(t[0, 0] for t in terms) == np.float32(1.0)  # a float sum rounds otherwise
    assert got["summed"].reshape(-1).view(np.uint32).tolist() == want.view(np.uint32).tolist()
    import torch as _t

    halves = [_t.from_numpy(t).to(_t.bfloat16).float().numpy() for t in terms]
    want_half = exact_fold_oracle(idx, np.concatenate([h.reshape(-1) for h in halves]), 12,
                                  "bfloat16")  # fmt: skip
    assert got["half"].reshape(-1).view(np.uint32).tolist() == want_half.view(np.uint32).tolist()
    assert got["mean"].shape == (3, 4)


def _narrow_terms(rank: int) -> np.ndarray:
    """Per rank 700 float32 (narrow blocks); rank 0 holds a NaN, both a block of -0.0."""
    rng = np.random.default_rng(10 + rank)
    a = (rng.standard_normal(700) * 2.0 ** rng.integers(-6, 6, 700)).astype(np.float32)
    a[64:128] = -0.0
    if rank == 0:
        a[300] = np.nan
    return a


def _exact_sum(terms, options: dict, name: str, rank: int, world: int, out: str,
               group=None) -> None:  # fmt: skip
    """A rank's ``exact_all_reduce(terms(rank), **options)``, saved by rank 0 as ``name``.npy
    (bind the first three with functools.partial for EXTRAS)."""
    from bitfold.distributed import exact_all_reduce

    got = exact_all_reduce(torch.from_numpy(terms(rank)), group=group, **options)
    if rank == 0:
        np.save(f"{out}/{name}.npy", got.numpy())


@pytest.mark.slow
def test_one_array_read_from_its_bits_or_through_a_sum_gives_the_exact_bits(launches):
    """A rank with a NaN takes a DenseSum, the other reads its array's bits: one wire."""
    from bitfold.dense import DenseSum

    got = np.load(launches[2] / "narrow.npy")
    want = DenseSum(700).add(_narrow_terms(0)).add(_narrow_terms(1)).result(mean_over=3)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got.view(np.uint32)[64] == 0x80000000  # -0.0 on every rank


def _float16_terms(rank: int) -> np.ndarray:
    """Per rank 1,000 float16 gradients (11-bit significands: half words on the wire)."""
    a = (np.random.default_rng(30 + rank).standard_normal(1000) * 1e-2).astype(np.float16)
    a[:3] = [-0.0, 65504.0 if rank else -65504.0, 2.0**-24]  # a zero, the extremes, a subnormal
    return a


@pytest.mark.slow
def test_half_precision_gradients_travel_two_a_word_and_sum_exactly(launches):
    """float16 gradients span few bits a block: two elements share an int64 word through
    gloo, and the sums over the ranks come back exact (the Fraction oracle's bits)."""
    from oracle import exact_fold_oracle

    from bitfold.dense import DenseSum, array_bounds, wire_layout
    from bitfold.kernels import dense as kernels

    world = 3
    terms = [_float16_terms(r).astype(np.float32) for r in range(world)]
    bounds = np.maximum.reduce([array_bounds(t) for t in terms])
    layout = wire_layout(bounds, 1000, world, DenseSum(1000).format.limbs)
    assert (layout.classes == kernels.HALF).sum() >= layout.classes.size - 1  # block 0 spans 2^40
    got = np.load(launches[world] / "float16.npy")
    want = exact_fold_oracle(np.tile(np.arange(1000), world), np.concatenate(terms), 1000)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_gradient_sum_refuses_to_start_without_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(DistributedError, match="init_process_group"):
        GradientSum([torch.zeros(3, requires_grad=True)])


def test_exact_all_reduce_refuses_what_it_cannot_sum():
    from bitfold.distributed import exact_all_reduce
    from bitfold.errors import FoldTypeError

    with pytest.raises(FoldTypeError, match="int64"):
        exact_all_reduce(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(FoldTypeError, match="list"):
        exact_all_reduce([1.0, 2.0])


# -- DistributedDataParallel with the exact communication hook -----------------------------------


def _hook_batches(world: int):
    """Per rank a batch whose gradients span many binades: their float sums round."""
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(5, 6, generator=g) * torch.exp2(torch.randint(-20, 20, (5, 6), generator=g))
          for _ in range(world)]  # fmt: skip
    ys = [torch.randn(5, 4, generator=g) for _ in range(world)]
    return xs, ys


def _hook(rank: int, world: int, out: str, group=None) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from bitfold.distributed import exact_allreduce_hook

    torch.manual_seed(0)
    plain = torch.nn.Linear(6, 4)
    ddp = DistributedDataParallel(torch.nn.Linear(6, 4), process_group=group)
    ddp.module.load_state_dict(plain.state_dict())
    ddp.register_comm_hook(group, exact_allreduce_hook)  # refused before: a string annotation
    xs, ys = _hook_batches(world)
    torch.nn.functional.mse_loss(plain(xs[rank]), ys[rank], reduction="sum").backward()
    torch.nn.functional.mse_loss(ddp(xs[rank]), ys[rank], reduction="sum").backward()
    np.savez(f"{out}/hook-{rank}.npz", **{f"local_{n}": p.grad.numpy()
                                           for n, p in plain.named_parameters()},
             **{f"ddp_{n}": p.grad.numpy() for n, p in ddp.module.named_parameters()})  # fmt: skip


@pytest.mark.slow
def test_ddp_with_the_exact_hook_averages_each_gradient_exactly(launches):
    from fractions import Fraction

    from oracle import round_fraction

    world = 3
    ranks = [np.load(launches[world] / f"hook-{r}.npz") for r in range(world)]
    rounded_twice = 0
    for name in ("weight", "bias"):
        local = [r[f"local_{name}"].reshape(-1) for r in ranks]
        want = np.array([round_fraction(sum(Fraction(float(g[i])) for g in local) / world)
                         for i in range(local[0].size)], np.float32)  # fmt: skip
        float_mean = (local[0] + local[1] + local[2]) / np.float32(world)
        rounded_twice += int(np.sum(float_mean.view(np.uint32) != want.view(np.uint32)))
        for r in ranks:  # every rank holds the same, correctly rounded mean
            got = r[f"ddp_{name}"].reshape(-1)
            assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), name
    assert rounded_twice > 0  # the data tells an exact mean from a float one


#: The scenarios besides the trainings, by world size, in the order each launch runs them (the
#: refused parameter lists last: nothing follows a refusal on that group).
EXTRAS = {
    2: [_state_sum, functools.partial(_exact_sum, _narrow_terms, {"mean_over": 3}, "narrow"),
        _mismatch],
    3: [_state_sum, _array_sums,
        functools.partial(_exact_sum, _float16_terms, {"out_dtype": "float32"}, "float16"),
        _hook],
}  # fmt: skip
WORLDS = (1, 2, 3, 4)
