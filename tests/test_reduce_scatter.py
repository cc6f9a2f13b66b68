"""``exact_reduce_scatter``: each rank's shard is the Fraction oracle's bits on 1, 2 and 4 ranks.

One spawn of local gloo processes a world size runs every case and saves each
rank's shard; the parent puts the shards together and compares them with the
oracle bit for bit, and across world sizes where the terms are the same (each
rank's micro-batches in a :class:`bitfold.dense.DenseSum`). The two-rank run
also passes bad input and records what every rank raised.
"""

from __future__ import annotations

import warnings
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
from oracle import exact_fold_oracle, round_fraction

from bitfold.cli.launch import leave
from bitfold.errors import DistributedError, FoldError

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
distributed = pytest.importorskip("bitfold.distributed", reason="needs torch")

#: Elements of every case's input: shards of 600, 300 and 150 (not whole blocks of 64).
N = 600
#: Micro-batches of the world-size-invariant cases, dealt round-robin to the ranks.
MICRO = 4


def _micro(j: int, specials: bool = False) -> np.ndarray:
    """Micro-batch ``j``'s gradient (float32, many binades), the same for every world size."""
    rng = np.random.default_rng(100 + j)
    v = (rng.standard_normal(N) * 2.0 ** rng.integers(-40, 40, N)).astype(np.float32)
    v[64:128] = -0.0  # every term -0.0: the block's zero signs travel, the sums are -0.0
    v[200] = -0.0 if j == 0 else 0.0  # -0.0 and +0.0: +0.0
    v[5] = [1.0, 2.0**-24, 2.0**-24, 2.0**-25][j]  # float adds give 1.0, the exact sum 1+2^-23
    v[300:330] = 2.0**-149  # subnormal terms
    if specials:
        v[10] = np.nan if j == 1 else v[10]
        v[20] = np.inf if j == 2 else v[20]
        v[30] = np.inf if j == 0 else -np.inf if j == 3 else v[30]
    return v


def _shard(r: int, world: int) -> slice:
    return slice(N * r // world, N * (r + 1) // world)


def _cases(rank: int, world: int) -> dict[str, np.ndarray]:
    """Every case's output on this rank (float results as float32 or float64 arrays)."""
    from bitfold.dense import DenseSum
    from bitfold.distributed import exact_reduce_scatter

    m = N // world
    mine = torch.from_numpy(_micro(rank))
    out: dict[str, np.ndarray] = {}

    warned: list[str] = []  # what the exact reduce-scatter warned of (torch's deprecations too)

    def run(name: str, x, dtype=torch.float32, shape=(m,), **options) -> None:
        result = torch.full(shape, 7.0, dtype=dtype)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert exact_reduce_scatter(result, x, **options) is result
        warned.extend(f"{name}: {w.category.__name__}: {w.message}" for w in seen)
        held = result if dtype == torch.float64 else result.float()  # bfloat16: as float32
        out[name] = held.numpy().reshape(-1)

    run("array", mine)
    run("array-device", mine, words="device")
    run("array-mixed", mine, words="device" if rank % 2 else "host")
    run("array-2d-output", mine.reshape(20, 30), shape=(m // 2, 2))
    run("specials", torch.from_numpy(_micro(rank, True)))
    run("specials-device", torch.from_numpy(_micro(rank, True)), words="device")
    run("avg", mine, op=dist.ReduceOp.AVG)
    run("mean-over-3", mine, mean_over=3, words="device" if rank % 2 else "host")
    run("bfloat16", mine.to(torch.bfloat16), dtype=torch.bfloat16)
    run("bfloat16-device", mine.to(torch.bfloat16), dtype=torch.bfloat16, words="device")
    run("float16-to-float32", (mine * 2.0**-28).to(torch.float16))
    run("float64", torch.from_numpy(_micro(rank).astype(np.float64) * 2.0**-600),
        dtype=torch.float64)  # fmt: skip
    numpy_out = np.full(m, 7.0, np.float32)
    exact_reduce_scatter(numpy_out, _micro(rank), timeout=60)
    out["numpy"] = numpy_out
    for specials in (False, True):  # the same terms on every world size: one sum a rank
        s = DenseSum(N)
        for j in range(rank, MICRO, world):
            s.add(_micro(j, specials))
        run("micro" + ("-specials" if specials else ""), s)
    partial = torch.zeros(N)  # the usual way: float partial sums, a float reduce-scatter
    for j in range(rank, MICRO, world):
        partial += torch.from_numpy(_micro(j))
    floats = torch.empty(m)
    getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(floats, partial)
    out["float-contrast"] = floats.numpy()
    out["warnings"] = np.array(warned, dtype=str)
    return out


def _bad_inputs(rank: int, world: int) -> dict[str, str]:
    """Each bad call's message on this rank (or what went wrong instead)."""
    from bitfold.distributed import exact_reduce_scatter

    m = N // world
    good = torch.from_numpy(_micro(rank))
    calls = {
        "shapes": lambda o: exact_reduce_scatter(o, good if rank == 0 else good[:-2]),
        "dtypes": lambda o: exact_reduce_scatter(o, good if rank == 0 else good.double()),
        "integers": lambda o: exact_reduce_scatter(o, good.to(torch.int64)),
        "output-size": lambda o: exact_reduce_scatter(o if rank == 0 else o[:-1], good),
        "indivisible": lambda o: exact_reduce_scatter(o, torch.ones(N + 1)),
        "op": lambda o: exact_reduce_scatter(o, good, op=dist.ReduceOp.MAX),
        "avg-and-mean-over": lambda o: exact_reduce_scatter(
            o, good, op=dist.ReduceOp.AVG, mean_over=2
        ),
        "words": lambda o: exact_reduce_scatter(
            o, good.numpy() if rank else good, words="device"
        ),
    }
    said = {}
    for name, call in calls.items():
        output = torch.full((m,), 7.0)
        try:
            call(output)
            said[name] = "no error"
        except DistributedError as err:
            said[name] = str(err)
        if not bool((output == 7.0).all()):
            said[name] += " [output written]"
    after = torch.empty(m)  # the group still works after the refusals
    exact_reduce_scatter(after, good)
    said["after"] = after.numpy().tobytes().hex()
    return said


def _rank(rank: int, world: int, init: str, out: str) -> None:
    import json

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    np.savez(f"{out}-{rank}.npz", **_cases(rank, world))
    if world == 2:
        with open(f"{out}-{rank}.json", "w") as f:
            json.dump(_bad_inputs(rank, world), f)
    dist.destroy_process_group()
    leave(0)  # no interpreter teardown: see bitfold.cli.launch.leave


@cache
def _run(world: int, tmp: str) -> tuple[dict[str, np.ndarray], list[dict[str, str]]]:
    """Every case's whole result (the ranks' shards put together) on ``world`` ranks, and each
    rank's refusals of bad input (two ranks only)."""
    import json
    from pathlib import Path

    from test_distributed import _spawn_ranks

    tmp_path = Path(tmp) / f"world-{world}"
    tmp_path.mkdir()
    out = str(tmp_path / "shard")
    _spawn_ranks(_rank, world, tmp_path, out)
    ranks = [np.load(f"{out}-{r}.npz") for r in range(world)]
    said = [json.loads(Path(f"{out}-{r}.json").read_text()) for r in range(world) if world == 2]
    return {name: np.concatenate([r[name] for r in ranks]) for name in ranks[0].files}, said


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("reduce-scatter"))
    return lambda world: _run(world, tmp)


def _bits(a: np.ndarray) -> list[int]:
    a = np.ascontiguousarray(a)
    return a.view({4: np.uint32, 8: np.uint64}[a.dtype.itemsize]).tolist()


def _sum_oracle(parts: list[np.ndarray], out: str = "float32") -> np.ndarray:
    index = np.tile(np.arange(N), len(parts))
    return exact_fold_oracle(index, np.concatenate(parts).astype(np.float64), N, out)


def _mean_oracle(parts: list[np.ndarray], count: int) -> np.ndarray:
    sums = [sum((Fraction(float(p[i])) for p in parts), Fraction(0)) for i in range(N)]
    want = np.array([round_fraction(s / count) for s in sums], np.float32)
    negzero = np.all([np.signbit(p) & (p == 0) for p in parts], axis=0)
    want[negzero] = -0.0  # every term -0.0: the mean of -0.0s is -0.0
    return want


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_shard_is_the_oracles_bits(results, world):
    got = results(world)[0]
    parts = [_micro(r) for r in range(world)]
    want = _sum_oracle(parts)
    for name in ("array", "array-device", "array-mixed", "array-2d-output", "numpy"):
        assert _bits(got[name]) == _bits(want), name
    specials = _sum_oracle([_micro(r, True) for r in range(world)])
    assert _bits(got["specials"]) == _bits(specials)
    assert _bits(got["specials-device"]) == _bits(specials)
    assert _bits(got["avg"]) == _bits(_mean_oracle(parts, world))
    assert _bits(got["mean-over-3"]) == _bits(_mean_oracle(parts, 3))
    halves = [torch.from_numpy(p).to(torch.bfloat16).float().numpy() for p in parts]
    assert _bits(got["bfloat16"]) == _bits(_sum_oracle(halves, "bfloat16"))
    assert _bits(got["bfloat16-device"]) == _bits(_sum_oracle(halves, "bfloat16"))
    f16 = [(p * np.float32(2.0**-28)).astype(np.float16).astype(np.float32) for p in parts]
    assert _bits(got["float16-to-float32"]) == _bits(_sum_oracle(f16))
    f64 = [p.astype(np.float64) * 2.0**-600 for p in parts]
    assert _bits(got["float64"]) == _bits(_sum_oracle(f64, "float64"))
    assert got["array"][64:128].view(np.uint32).tolist() == [0x80000000] * 64  # -0.0 sums


@pytest.mark.slow
def test_the_exact_reduce_scatter_warns_of_nothing(results):
    """No warning on any rank, torch's own included (a deprecated collective would warn in
    every user's training loop)."""
    assert results(2)[0]["warnings"].tolist() == []


@pytest.mark.slow
def test_a_ranks_shard_does_not_change_with_the_world_size(results):
    """Every rank sums its micro-batches of one step into a DenseSum: the same terms on 1, 2
    and 4 ranks, so the same bits; a float reduce-scatter of float partial sums differs."""
    every = {world: results(world)[0] for world in (1, 2, 4)}
    for name, specials in (("micro", False), ("micro-specials", True)):
        want = _bits(_sum_oracle([_micro(j, specials) for j in range(MICRO)]))
        for world, got in every.items():
            assert _bits(got[name]) == want, (name, world)
    assert every[1]["micro"][5] == np.float32(1 + 2.0**-23)
    floats = {world: tuple(_bits(got["float-contrast"])) for world, got in every.items()}
    assert len(set(floats.values())) > 1  # the data tells an exact sum from float ones


@pytest.mark.slow
def test_bad_input_is_refused_on_every_rank_before_the_output_is_written(results):
    said = results(2)[1]
    expected = {
        "shapes": "different shapes or dtypes (rank 0: float32 (600,), rank 1: float32 (598,))",
        "dtypes": "rank 0: float32 (600,), rank 1: float64 (600,)",
        "integers": "rank 0's input has dtype int64",
        "output-size": "rank 1's output holds 299 elements; input.numel() / world_size = "
                       "600 / 2 = 300",
        "indivisible": "input.numel() = 601 does not split into 2 equal shards",
        "op": "rank 0 passes an op other than ReduceOp.SUM or ReduceOp.AVG",
        "avg-and-mean-over": "op=ReduceOp.AVG and mean_over",
        "words": "rank 1 passes words that are not ('host', 'device')",
    }  # fmt: skip
    for rank in (0, 1):
        for name, text in expected.items():
            message = said[rank][name]
            assert message.startswith("exact_reduce_scatter refused on every rank"), message
            assert text in message, (rank, name, message)
            assert "[output written]" not in message
    assert said[0]["after"] != said[1]["after"]  # each rank's shard of a working reduce-scatter


def test_no_process_group_is_refused_before_any_work():
    from bitfold.distributed import exact_reduce_scatter

    assert not dist.is_initialized()
    output = torch.full((3,), 7.0)
    with pytest.raises(DistributedError, match=r"exact_reduce_scatter .*init_process_group"):
        exact_reduce_scatter(output, torch.ones(3))
    assert output.tolist() == [7.0] * 3


def test_a_span_of_a_dense_sum_has_the_words_of_a_sum_of_its_own():
    """A shard of a DenseSum (what a rank reduce-scatters) gives the bounds, words and zero
    flags of a DenseSum that took only those elements: one wire format for both."""
    from bitfold.dense import DenseSum, wire_layout

    whole = DenseSum(N).add(_micro(0, True)).add(_micro(1))
    for start, stop in ((0, N), (150, 300), (1, 2), (599, 600)):
        alone = DenseSum(stop - start).add(_micro(0, True)[start:stop]).add(_micro(1)[start:stop])
        bounds = whole.bounds(start=start, stop=stop)
        assert np.array_equal(bounds, alone.bounds())
        layout = wire_layout(bounds, stop - start, 3, alone.format.limbs)
        into = np.full(layout.words + 5, -1, np.int64)
        whole.encode(layout, start=start, into=into)
        assert np.array_equal(into[: layout.words], alone.encode(layout))
        assert (into[layout.words :] == -1).all()
        assert np.array_equal(whole.negzero(start=start, stop=stop), alone.negzero())
    with pytest.raises(FoldError, match="not within"):
        whole.bounds(start=500, stop=601)


# -- exact_fsdp's refusals (its bits on every mesh: tests/test_fsdp_meshes.py) ---------------

def test_exact_fsdp_refuses_a_module_that_is_not_sharded():
    from bitfold.distributed import exact_fsdp
    from bitfold.errors import FoldTypeError

    with pytest.raises(FoldTypeError, match="fully_shard"):
        exact_fsdp(torch.nn.Linear(2, 2))
    with pytest.raises(FoldError, match="mean_over"):
        exact_fsdp(torch.nn.Linear(2, 2), mean_over=0)
