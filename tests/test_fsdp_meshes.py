"""``exact_fsdp`` on every mesh shape: FSDP and HSDP give one process's gradient bits.

One spawn of local gloo processes a world size (1, 2 and 4) runs every data-parallel
mesh of that size — ``(W,)`` FSDP and ``(R, S)`` HSDP with ``R * S = W`` — under
several settings (``reshard_after_forward`` both ways, mixed precision with a float32
or a bfloat16 reduction, a parameter of 7 rows that no world size here divides), and
saves each run's full gradients. A step is four micro-batches of five rows dealt
round-robin, so a rank runs 4, 2 or 1 of them: all but its last inside
``no_reduce()``. With CPU offload (``CPUOffloadPolicy``) FSDP2 pins its CPU copies, which
needs an accelerator: without one the ranks pin nothing (``pin_memory`` returns the tensor)
and FSDP2's offload path runs otherwise as it is. The parent compares the bits across every
world size and mesh shape, and the float32 runs with the exact sum of a plain model's
micro-batch gradients.
"""

from __future__ import annotations

from contextlib import nullcontext
from functools import cache

import numpy as np
import pytest

from bitfold.cli.launch import leave

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
pytest.importorskip("bitfold.distributed", reason="needs torch")

MICRO, BATCH = 4, 5  # four micro-batches of five rows a step
WORLDS = (1, 2, 4)
#: Each setting: (reshard_after_forward, param_dtype, reduce_dtype) of FSDP2, and the
#: model's own dtype.
SETTINGS = {
    "fp32": (True, None, None, torch.float32),
    "fp32-keep": (False, None, None, torch.float32),
    "bf16-params-fp32-reduce": (True, torch.bfloat16, torch.float32, torch.float32),
    "bf16-reduce": (False, None, torch.bfloat16, torch.float32),
    "bf16-model-fp32-reduce": (True, torch.bfloat16, torch.float32, torch.bfloat16),
    "fp32-offload": (True, None, None, torch.float32),
}
OFFLOADED = {"fp32-offload"}  # with FSDP2's CPUOffloadPolicy


def _meshes(world: int) -> list[tuple[int, ...]]:
    """Every data-parallel mesh of ``world`` ranks: 1-D, then (replicate, shard) pairs."""
    return [(world,)] + [(r, world // r) for r in range(1, world + 1) if world % r == 0]


def _data():
    g = torch.Generator().manual_seed(3)
    n = MICRO * BATCH
    x = torch.randn(n, 5, generator=g) * torch.exp2(torch.randint(-20, 20, (n, 5), generator=g))
    return x, torch.randn(n, 3, generator=g)


def _model():
    torch.manual_seed(0)  # 7 hidden rows: FSDP pads them for 2 and 4 shards
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def _loss(model, x, y, j):
    sl = slice(j * BATCH, (j + 1) * BATCH)
    return torch.nn.functional.mse_loss(model(x[sl]).float(), y[sl], reduction="sum")


def _sharded(mesh, setting: str):
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    reshard, param_dtype, reduce_dtype, dtype = SETTINGS[setting]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    offload = CPUOffloadPolicy() if setting in OFFLOADED else OffloadPolicy()
    model = _model().to(dtype)
    for part in (model[0], model[2], model):
        fully_shard(part, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy,
                    offload_policy=offload)  # fmt: skip
    return model


def _rank(rank: int, world: int, init: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from bitfold.dense import DenseSum
    from bitfold.distributed import exact_fsdp

    torch.set_num_threads(1)
    if not torch.accelerator.is_available():  # CPUOffloadPolicy pins its copies: not here
        torch.Tensor.pin_memory = lambda self, *args, **kwargs: self
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    x, y = _data()
    saved: dict[str, np.ndarray] = {}
    for shape in _meshes(world):
        names = ("replicate", "shard")[-len(shape) :]
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        me = mesh.get_coordinate()  # micro-batches are dealt over every rank of the mesh
        index = me[0] * shape[1] + me[1] if len(shape) == 2 else me[0]
        mine = list(range(index, MICRO, world))
        for setting in SETTINGS:
            for exact in (True, False):
                if not exact and setting != "fp32":
                    continue
                model = _sharded(mesh, setting)
                handle = exact_fsdp(model, mean_over=MICRO * BATCH) if exact else None
                if not exact:  # FSDP's own float sums, without its division: the same scale
                    model.set_force_sum_reduction_for_comms(True)
                    model.set_gradient_divide_factor(1.0)
                for step in range(2):  # the second step: the held sums were emptied
                    for i, j in enumerate(mine):
                        hold = handle is not None and i < len(mine) - 1
                        with handle.no_reduce() if hold else nullcontext():
                            _loss(model, x, y, j).backward()
                    label = f"{'x'.join(map(str, shape))}|{setting}|{'exact' if exact else 'float'}"
                    for name, p in model.named_parameters():
                        saved[f"{label}|{step}|{name}"] = (
                            p.grad.full_tensor().float().numpy().copy())  # fmt: skip
                    model.zero_grad(set_to_none=True)
    if world == 2:  # FSDP's float way to skip HSDP's all-reduce is refused by name
        mesh = init_device_mesh("cpu", (2, 1), mesh_dim_names=("replicate", "shard"))
        model = _sharded(mesh, "fp32")
        exact_fsdp(model)
        model.set_requires_all_reduce(False)
        _loss(model, x, y, rank).backward()
        try:
            _loss(model, x, y, rank).backward()
            said = "no error"
        except Exception as err:  # what FSDP's backward lets through
            said = f"{type(err).__name__}: {err}"
        saved["refused"] = np.array(said)
    if world == 1:  # a sum that float32 leaves on a bfloat16 tie: rounded once, it is not one
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        tiny = torch.nn.Linear(1, 1, bias=False).to(torch.bfloat16)
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(tiny, mesh=init_device_mesh("cpu", (1,)), mp_policy=policy)
        handle = exact_fsdp(tiny)
        terms = (1.0, 2.0**-8, 2.0**-30)  # float32: 1 + 2^-8, a tie, to even: 1.0
        for i, term in enumerate(terms):
            with handle.no_reduce() if i < len(terms) - 1 else nullcontext():
                tiny(torch.full((1, 1), term, dtype=torch.bfloat16)).sum().backward()
        saved["tie"] = tiny.weight.grad.full_tensor().float().numpy()
        said = []  # FSDP's float accumulation, asked for after exact_fsdp and before it
        tiny.set_requires_gradient_sync(True)  # FSDP's own: nothing to refuse
        other = torch.nn.Linear(1, 1)
        fully_shard(other, mesh=init_device_mesh("cpu", (1,)))
        other.set_requires_gradient_sync(False)
        for ask in (lambda: tiny.set_requires_gradient_sync(False), lambda: exact_fsdp(other)):
            try:
                ask()
                said.append("no error")
            except Exception as err:
                said.append(f"{type(err).__name__}: {err}")
        saved["float accumulation"] = np.array(said)
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

        tp_mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
        tp = torch.nn.Sequential(torch.nn.Linear(4, 4))  # tensor parallel inside FSDP
        parallelize_module(tp, tp_mesh["tp"], {"0": ColwiseParallel()})
        fully_shard(tp, mesh=tp_mesh["dp"])
        try:
            exact_fsdp(tp)
            saved["tensor parallel"] = np.array("no error")
        except Exception as err:
            saved["tensor parallel"] = np.array(f"{type(err).__name__}: {err}")
        saved["still syncs"] = np.array(all(g.reduce_grads for g in
                                            tiny._get_fsdp_state()._fsdp_param_groups))
        # the reference: each micro-batch's gradient of a plain model, summed exactly
        for dtype, tag in ((torch.float32, ""), (torch.bfloat16, "bf16-")):
            plain = _model().to(dtype)
            sums = {name: DenseSum(tuple(p.shape)) for name, p in plain.named_parameters()}
            for j in range(MICRO):
                _loss(plain, x.to(dtype), y, j).backward()
                for name, p in plain.named_parameters():
                    sums[name].add(p.grad)
                plain.zero_grad(set_to_none=True)
            for name, s in sums.items():  # rounded once, to the parameters' dtype
                got = s.result(str(dtype).removeprefix("torch."), mean_over=MICRO * BATCH)
                saved[f"{tag}reference|{name}"] = torch.as_tensor(got).float().numpy()
    if rank == 0:
        np.savez(out, **saved)
    dist.destroy_process_group()
    leave(0)  # no interpreter teardown: see bitfold.cli.launch.leave


@cache
def _run(world: int, tmp: str) -> dict[str, np.ndarray]:
    from pathlib import Path

    from test_distributed import _spawn_ranks

    where = Path(tmp) / f"world-{world}"
    where.mkdir()
    out = str(where / "grads.npz")
    _spawn_ranks(_rank, world, where, out)
    with np.load(out) as got:
        return {k: got[k] for k in got.files}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("fsdp-meshes"))
    return {world: _run(world, tmp) for world in WORLDS}


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, np.float32).view(np.uint32).tobytes()


PARAMS = ("0.weight", "0.bias", "2.weight", "2.bias")


def _runs(results, setting: str, kind: str = "exact") -> dict[str, dict[str, bytes]]:
    """``{"world/mesh/step": {param: bits}}`` of one setting, over every world and mesh."""
    found: dict[str, dict[str, bytes]] = {}
    for world, got in results.items():
        for key, value in got.items():
            parts = key.split("|")
            if len(parts) == 5 and parts[1] == setting and parts[2] == kind:
                found.setdefault(f"{world}/{parts[0]}/{parts[3]}", {})[parts[4]] = _bits(value)
    return found


@pytest.mark.slow
def test_every_mesh_shape_gives_the_exact_sum_of_the_micro_batch_gradients(results):
    want = {name: _bits(results[1][f"reference|{name}"]) for name in PARAMS}
    runs = _runs(results, "fp32")
    meshes = {label.split("/")[1] for label in runs}
    assert meshes == {"1", "2", "4", "1x1", "1x2", "2x1", "1x4", "2x2", "4x1"}, sorted(runs)
    assert len(runs) == 9 * 2  # two steps each
    for label, grads in runs.items():
        assert grads == want, label
    assert _runs(results, "fp32-keep") == runs  # reshard_after_forward=False: the same bits
    assert _runs(results, "fp32-offload") == runs  # CPUOffloadPolicy: the same bits


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["bf16-params-fp32-reduce", "bf16-reduce",
                                     "bf16-model-fp32-reduce"])
def test_mixed_precision_gives_one_set_of_bits_on_every_mesh(results, setting):
    runs = _runs(results, setting)
    assert len(runs) == 18, sorted(runs)
    first = next(iter(runs.values()))
    assert all(grads == first for grads in runs.values()), setting
    assert first != _runs(results, "fp32")["1/1/0"]  # bfloat16 did change the numbers
    if setting != "bf16-params-fp32-reduce":  # rounded once to bfloat16
        for name in PARAMS:
            bits = np.frombuffer(first[name], np.uint32)
            assert not (bits & 0xFFFF).any(), name


@pytest.mark.slow
def test_a_bf16_model_reduced_in_fp32_is_rounded_once_to_bf16(results):
    """The exact sum goes straight to the parameters' bfloat16, not through float32 first."""
    want = {name: _bits(results[1][f"bf16-reference|{name}"]) for name in PARAMS}
    runs = _runs(results, "bf16-model-fp32-reduce")
    assert len(runs) == 18, sorted(runs)
    for label, grads in runs.items():
        assert grads == want, label
    assert results[1]["tie"].tolist() == [[1 + 2.0**-7]]  # 1 + 2^-8 + 2^-30, nearest bf16


@pytest.mark.slow
def test_plain_fsdp_float_sums_depend_on_the_mesh(results):
    runs = _runs(results, "fp32", "float")
    assert len(runs) == 18
    assert len({tuple(sorted(g.items())) for g in runs.values()}) > 1


@pytest.mark.slow
def test_fsdps_float_accumulation_is_refused_before_it_changes_anything(results):
    """``set_requires_gradient_sync(False)`` on a model under exact_fsdp, and exact_fsdp of a
    model already set so: each refused by name, the model left reducing."""
    for said in results[1]["float accumulation"].tolist():
        assert said.startswith("FoldError: exact_fsdp: set_requires_gradient_sync(False)"), said
        assert "no_reduce()" in said, said
    assert bool(results[1]["still syncs"])


@pytest.mark.slow
def test_fsdp_with_tensor_parallelism_is_refused_by_name(results):
    """A model whose parameters are sharded by tensor parallelism inside FSDP (placements
    (Shard(0), Shard(0))): not a mesh exact_fsdp reduces, refused naming its placements."""
    said = str(results[1]["tensor parallel"])
    assert said.startswith("FoldError: exact_fsdp reduces FSDP"), said
    assert "placements (Shard(dim=0), Shard(dim=0))" in said, said


@pytest.mark.slow
def test_fsdps_float_way_to_skip_the_all_reduce_is_refused(results):
    said = str(results[2]["refused"])
    assert said.startswith("FoldError: exact_fsdp"), said
    assert "set_requires_all_reduce(False)" in said and "no_reduce()" in said, said
