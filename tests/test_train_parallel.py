"""Data-parallel training with exact gradient sums: the same bits for every world size.

Two halves. The engine (:class:`bitfold.distributed.GradientSum`) in spawned
gloo processes on the CPU, on world sizes 1, 2, 3 and 4 (a module fixture runs
every scenario in two launches: one process, whose first use also compiles the
kernels every later rank loads from the cache, then four processes, whose
first two and first three ranks form the groups of 2 and 3): a model with dense
and folded layers trained several Adam steps, micro-batches dealt unevenly
(one rank may get none), ``mean_over``, NaN and Inf, float16 and bfloat16
parameters, parameter lists that differ between ranks; and plain
``torch.distributed.all_reduce`` of float32 gradients in the same setting,
which gives a different model for each world size. Then the command
(``bitfold train --world-size``): digests, ``--reduce plain``, resuming,
checkpoints killed mid-write, dead and hung ranks, torchrun-style launches.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import oracle
import pytest

from bitfold import cli
from bitfold.cli.launch import leave

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
from ranks import start_ranks  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with the gloo backend is not available",
                allow_module_level=True)  # fmt: skip

ROOT = Path(__file__).resolve().parents[1]
WORLD_SIZES = (1, 2, 3, 4)
STEPS, MICRO, PER_MICRO = 4, 10, 5  # 4 steps of 10 micro-batches of 5 examples
BATCH = MICRO * PER_MICRO


# --------------------------------------------------------------------------- engine: workers
def _uneven(m: int, world: int) -> int:
    """Micro-batch m's rank: blocks of 4, the rest to the last rank (4+4+2+0 on 4 ranks)."""
    return min(m // 4, world - 1)


def _model():
    from bitfold.torch import FoldedLinear

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 16), torch.nn.Tanh(),
        FoldedLinear(16, 24, buckets=40, seed=3), torch.nn.ReLU(),
        torch.nn.Linear(24, 3),
    )  # fmt: skip


def _training_data():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(STEPS, BATCH, 12)) * 2.0 ** rng.integers(-6, 7, (STEPS, BATCH, 1))
    y = rng.integers(0, 3, (STEPS, BATCH))
    return torch.from_numpy(X.astype(np.float32)), torch.from_numpy(y)


def _train(rank: int, world: int, exact: bool, group=None) -> dict[str, np.ndarray]:
    """Adam steps of the dense + folded model; the step's gradient summed exactly or plainly."""
    from bitfold.distributed import GradientSum

    model = _model()
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=1e-2)
    gs = GradientSum(params, timeout=60, group=group) if exact else None
    X, y = _training_data()
    for step in range(STEPS):
        for m in range(MICRO):
            if _uneven(m, world) != rank:
                continue
            sl = slice(m * PER_MICRO, (m + 1) * PER_MICRO)
            loss = torch.nn.functional.cross_entropy(model(X[step, sl]), y[step, sl],
                                                     reduction="sum")  # fmt: skip
            loss.backward()
            if gs is not None:
                gs.add()
        if gs is not None:
            gs.reduce(mean_over=BATCH)
        else:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(BATCH)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}


def _grads(dtype: str, n: int = 24) -> np.ndarray:
    """MICRO micro-batch gradients of n elements: wide ranges, cancellation, ties."""
    rng = np.random.default_rng(11)
    if dtype == "float32":
        g = rng.normal(size=(MICRO, n)) * 2.0 ** rng.integers(-40, 40, (MICRO, n))
        g[:, 0] = [1e30, 1.0, -1e30, 2.0**-30] + [0.0] * (MICRO - 4)  # cancellation
        g[:, 1] = -0.0
        return g.astype(np.float32)
    g = rng.normal(size=(MICRO, n)) * 2.0 ** rng.integers(-6, 6, (MICRO, n))
    return g.astype(np.float32)  # rounded to float16 / bfloat16 by the caller


def _special() -> np.ndarray:
    """Gradients with NaN, +inf, -inf, both infinities, overflow and all -0.0."""
    g = np.zeros((MICRO, 6), np.float32)
    g[3, 0] = np.nan
    g[7, 1] = np.inf
    g[2, 2] = -np.inf
    g[1, 3], g[8, 3] = np.inf, -np.inf
    g[:, 4] = 3e38
    g[:, 5] = -0.0
    return g


def _sum_given(rank: int, world: int, tensors: list[np.ndarray], dtypes: list, mean_over=None,
               group=None):  # fmt: skip
    """Each rank adds the micro-batch gradients it is dealt; returns the reduced ``.grad``s."""
    from bitfold.distributed import GradientSum

    params = [torch.nn.Parameter(torch.zeros(t.shape[1], dtype=dt)) for t, dt in
              zip(tensors, dtypes, strict=True)]  # fmt: skip
    gs = GradientSum(params, timeout=60, group=group)
    for m in range(MICRO):
        if m % world == rank:
            for p, t in zip(params, tensors, strict=True):
                p.grad = torch.from_numpy(t[m].copy()).to(p.dtype)
            gs.add()
    gs.reduce(mean_over=mean_over)
    return [p.grad.float().numpy() if p.dtype == torch.bfloat16 else p.grad.numpy()
            for p in params]  # fmt: skip


def _mismatch(rank: int, world: int, group=None) -> str:
    """Rank 1 sums one parameter more than the others: refused on every rank, nothing reduced."""
    from bitfold.distributed import GradientSum
    from bitfold.errors import DistributedError

    params = [torch.nn.Parameter(torch.ones(5))]
    if rank == 1:
        params.append(torch.nn.Parameter(torch.ones(3)))
    gs = GradientSum(params, timeout=60, group=group)
    for p in params:
        p.grad = torch.full_like(p, 2.0)
    gs.add()
    try:
        gs.reduce()
    except DistributedError as err:
        untouched = all(p.grad is None for p in params)
        return f"refused untouched={untouched}: {err}"
    return "reduced"


def _scenarios(rank: int, world: int, group, out: str) -> None:
    """Every scenario on this rank of a group of ``world`` ranks; the results in ``out``."""
    res: dict = {}
    for name, arr in _train(rank, world, exact=True, group=group).items():
        res[f"exact/{name}"] = arr
    for name, arr in _train(rank, world, exact=False, group=group).items():
        res[f"plain/{name}"] = arr
    f32 = [torch.float32]
    (res["sum"],) = _sum_given(rank, world, [_grads("float32")], f32, group=group)
    (res["mean"],) = _sum_given(rank, world, [_grads("float32")], f32, mean_over=7, group=group)
    (res["special"],) = _sum_given(rank, world, [_special()], f32, group=group)
    res["float16"], res["bfloat16"] = _sum_given(
        rank, world, [_grads("float16"), _grads("bfloat16")], [torch.float16, torch.bfloat16],
        group=group)  # fmt: skip
    mismatch = _mismatch(rank, world, group) if world > 1 else ""
    np.savez(f"{out}/world{world}-rank{rank}.npz", **res)
    Path(f"{out}/world{world}-rank{rank}.txt").write_text(mismatch)


def _engine_rank(rank: int, world: int, init: str, out: str) -> None:
    """One rank of a launch of ``world`` processes: every group size of WORLD_SIZES from
    ``world`` (the default group) down to 2 (the first ranks of the launch), or the one
    process of a launch of 1."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    sizes = sorted((w for w in WORLD_SIZES if w <= world and (w > 1 or world == 1)), reverse=True)
    groups = {w: None if w == world else dist.new_group(list(range(w))) for w in sizes}
    for w in sizes:  # every rank makes every group first; the largest group sums first, so
        if rank < w:  # no rank waits in a sum for the others' smaller groups
            _scenarios(rank, w, groups[w], out)
    dist.barrier()
    dist.destroy_process_group()
    leave(0)  # no interpreter teardown: see bitfold.cli.launch.leave


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> dict[int, list[dict]]:
    """Every scenario on 1, 2, 3 and 4 processes: world size -> each rank's results."""
    out = tmp_path_factory.mktemp("engine")
    for launch in (1, max(WORLD_SIZES)):  # one process first: it compiles the kernels once
        init = (out / f"rendezvous{launch}").as_uri()
        start_ranks(_engine_rank, launch, (launch, init, str(out)))
    return {
        world: [{**dict(np.load(out / f"world{world}-rank{r}.npz")),
                 "mismatch": (out / f"world{world}-rank{r}.txt").read_text()}
                for r in range(world)]
        for world in WORLD_SIZES
    }  # fmt: skip


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _keys(runs, prefix: str) -> list[str]:
    return sorted(k for k in runs[1][0] if k.startswith(prefix))


# --------------------------------------------------------------------------- engine: tests
@pytest.mark.slow
def test_world_sizes_give_bit_identical_models(engine):
    """Dense and folded layers, Adam, uneven micro-batches (4+4+2+0 on 4 ranks): one model."""
    keys = _keys(engine, "exact/")
    assert any("shared_weight" in k for k in keys) and any(k.endswith("0.weight") for k in keys)
    want = {k: _bits(engine[1][0][k]) for k in keys}
    for world in WORLD_SIZES:
        for rank in range(world):
            assert {k: _bits(engine[world][rank][k]) for k in keys} == want, (world, rank)
    start = _model().state_dict()  # training moved every parameter
    for k in keys:
        assert not np.array_equal(engine[1][0][k], start[k.split("/", 1)[1]].numpy())


@pytest.mark.slow
def test_plain_all_reduce_gives_a_model_per_world_size(engine):
    """The same setting with float32 gradients summed by torch.distributed.all_reduce."""
    keys = _keys(engine, "plain/")
    models = {world: b"".join(_bits(engine[world][0][k]) for k in keys) for world in WORLD_SIZES}
    assert len(set(models.values())) >= 3, "plain all-reduce unexpectedly world-size invariant"
    for world in WORLD_SIZES:  # within one run the ranks still agree
        for rank in range(world):
            assert b"".join(_bits(engine[world][rank][k]) for k in keys) == models[world]


def _exact(g: np.ndarray, out: str, mean_over: int = 1) -> np.ndarray:
    """The correctly rounded (mean of the) column sums of ``g``, by Fraction."""
    res = []
    for col in g.astype(np.float64).T.tolist():
        total = sum((Fraction(v) for v in col), Fraction(0))
        if total == 0:
            neg = all(v == 0 and math.copysign(1, v) < 0 for v in col)
            res.append(-0.0 if neg else 0.0)
        else:
            res.append(oracle.round_fraction(total / mean_over, out))
    return np.array(res)


@pytest.mark.slow
def test_sums_and_means_are_correctly_rounded_on_every_world_size(engine):
    g = _grads("float32")
    for world in WORLD_SIZES:
        for rank in range(world):
            got = engine[world][rank]
            assert _bits(got["sum"]) == _bits(_exact(g, "float32").astype(np.float32))
            assert _bits(got["mean"]) == _bits(_exact(g, "float32", 7).astype(np.float32))
    s = engine[1][0]["sum"]
    assert s[0] == 1.0 and s[1] == 0 and np.signbit(s[1])  # 1e30 + 1 - 1e30 + 2^-30; all -0.0


@pytest.mark.slow
def test_nan_and_inf_follow_the_contract_on_every_world_size(engine):
    want = np.array([np.nan, np.inf, -np.inf, np.nan, np.inf, -0.0], np.float32)
    want.view(np.uint32)[[0, 3]] = oracle.CANONICAL_NAN["float32"]
    for world in WORLD_SIZES:
        for rank in range(world):
            assert _bits(engine[world][rank]["special"]) == _bits(want), (world, rank)


@pytest.mark.slow
def test_half_precision_parameters(engine, monkeypatch):
    monkeypatch.setitem(oracle.FORMATS, "bfloat16", (8, -133, 127))
    g16 = _grads("float16").astype(np.float16)
    gbf = torch.from_numpy(_grads("bfloat16")).to(torch.bfloat16).float().numpy()
    want16 = _exact(g16, "float16").astype(np.float16)
    wantbf = torch.from_numpy(_exact(gbf, "bfloat16")).to(torch.bfloat16).float().numpy()
    for world in WORLD_SIZES:
        for rank in range(world):
            got = engine[world][rank]
            assert got["float16"].dtype == np.float16
            assert _bits(got["float16"]) == _bits(want16), (world, rank)
            assert _bits(got["bfloat16"]) == _bits(wantbf), (world, rank)


@pytest.mark.slow
def test_mismatched_parameter_lists_are_refused_before_any_reduction(engine):
    for world in WORLD_SIZES[1:]:
        for rank in range(world):
            text = engine[world][rank]["mismatch"]
            assert text.startswith("refused untouched=True:"), (world, rank, text)
            assert "parameter lists differ between ranks" in text


# --------------------------------------------------------------------------- the command
TINY = ["train", "--hidden", "32", "--buckets", "64", "--batch", "64", "--micro-batch", "8",
        "--timeout", "60"]  # fmt: skip


#: Steps of every full run below: 30 steps of 64 examples cross an epoch (22 steps).
STEPS_CLI = "30"


def _train_json(tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert cli.main([*TINY, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> tuple[dict, Path]:
    """The uninterrupted run on one process that the other world sizes, the resumed run and the
    torchrun launch must reproduce: its JSON, and the folder of its final checkpoint."""
    tmp = tmp_path_factory.mktemp("single")
    return _train_json(tmp, "single", "--world-size", "1", "--steps", STEPS_CLI,
                       "--save", str(tmp / "a")), tmp / "a"  # fmt: skip


@pytest.mark.slow
def test_cli_world_sizes_one_digest_and_plain_differs(single, tmp_path, capsys):
    capsys.readouterr()
    exact = _train_json(tmp_path, "exact", "--world-size", "3,4", "--steps", STEPS_CLI)
    runs = [*single[0]["runs"], *exact["runs"]]
    assert [r["micro_batches_per_rank"] for r in runs] == [[8], [3, 3, 2], [2, 2, 2, 2]]
    assert exact["identical"] is True and exact["distinct_digests"] == 1
    assert all(r["ranks_agree"] for r in runs)
    run = runs[0]
    assert {r["digest"] for r in runs} == {run["digest"]}
    assert run["digest"].startswith("sha256:") and 0 < run["final_loss"] < 3
    assert 0 <= run["test_accuracy"] <= 1 and run["steps"] == 30
    printed = capsys.readouterr().out
    assert "one digest for every world size: yes" in printed
    plain = _train_json(tmp_path, "plain", "--world-size", "1,2", "--steps", STEPS_CLI,
                        "--reduce", "plain")  # fmt: skip
    assert plain["distinct_digests"] > 1 and plain["identical"] is False
    assert plain["runs"][0]["digest"] != run["digest"]


def _ckpt(directory: Path) -> dict:
    return torch.load(directory / "checkpoint.pt", weights_only=True)


@pytest.mark.slow
def test_cli_resume_equals_the_uninterrupted_run(single, tmp_path):
    whole, a_dir = single  # 30 steps on one process, saved
    # 30 steps of 64 examples cross an epoch (22 steps): the data order resumes mid-epoch
    half = _train_json(tmp_path, "half", "--world-size", "1", "--steps", "15",
                       "--save", str(tmp_path / "b"), "--save-every", "5")  # fmt: skip
    assert _ckpt(tmp_path / "b")["step"] == 15
    rest = _train_json(tmp_path, "rest", "--world-size", "3", "--steps", STEPS_CLI,
                       "--resume", str(tmp_path / "b"), "--save", str(tmp_path / "b"))  # fmt: skip
    assert rest["runs"][0]["start_step"] == 15
    assert rest["runs"][0]["digest"] == whole["runs"][0]["digest"] != half["runs"][0]["digest"]
    a, b = _ckpt(a_dir), _ckpt(tmp_path / "b")
    assert (a["step"], b["step"], a["world_size"], b["world_size"]) == (30, 30, 1, 3)
    from bitfold import digest

    for key in ("model", "optimizer", "data", "torch_rng"):  # bit for bit, everything
        ta = {f"{i}": t for i, t in enumerate(_tensors(a[key]))}
        tb = {f"{i}": t for i, t in enumerate(_tensors(b[key]))}
        assert digest(ta) == digest(tb), key
    assert a["data"]["generator"] == b["data"]["generator"] and a["config"] == b["config"]


def _tensors(obj) -> list:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _tensors(obj[k])]
    if isinstance(obj, list | tuple):
        return [t for x in obj for t in _tensors(x)]
    return [torch.tensor(float(obj))] if isinstance(obj, int | float) else []


@pytest.mark.slow
def test_cli_resume_refuses_another_configuration(single, capsys):
    saved = str(single[1])  # a checkpoint at step 30
    capsys.readouterr()
    rc = cli.main([*TINY, "--hidden", "48", "--lr", "0.5", "--world-size", "2", "--steps", "60",
                   "--resume", saved])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "the checkpoint was written by a different configuration" in err
    assert "hidden: checkpoint 32, this run 48" in err
    assert "lr: checkpoint 0.01, this run 0.5" in err
    assert cli.main([*TINY, "--world-size", "1", "--steps", "2", "--resume", saved]) == 2
    assert "past --steps 2" in capsys.readouterr().err


def test_cli_resume_refuses_missing_and_foreign_files(tmp_path, capsys):
    assert cli.main([*TINY, "--resume", str(tmp_path / "none")]) == 2
    assert "no checkpoint there" in capsys.readouterr().err
    (tmp_path / "x").mkdir()
    torch.save({"w": torch.ones(2)}, tmp_path / "x" / "checkpoint.pt")
    assert cli.main([*TINY, "--resume", str(tmp_path / "x")]) == 2
    assert "is not a bitfold train checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("cut", [1000, 0.5], ids=["head", "middle"])
@pytest.mark.parametrize("as_dir", [True, False], ids=["DIR", "FILE"])
def test_cli_resume_names_a_truncated_checkpoint(tmp_path, capsys, cut, as_dir):
    """A checkpoint cut short: one line naming the file, before any process starts."""
    from bitfold.cli import checkpoints

    model = {"w": torch.arange(20_000, dtype=torch.float32)}
    good = checkpoints.save(torch, tmp_path / "good", {"step": 1, "config": {}, "model": model})
    data = good.read_bytes()
    (tmp_path / "cut").mkdir()
    bad = tmp_path / "cut" / "checkpoint.pt"
    bad.write_bytes(data[: int(len(data) * cut) if isinstance(cut, float) else cut])
    assert cli.main([*TINY, "--resume", str(bad.parent if as_dir else bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bitfold train: error: --resume: {bad}: damaged or truncated")
    assert err.count("\n") == 1 and "Errno" not in err and "Traceback" not in err


def test_cli_resume_refuses_an_empty_or_foreign_file_naming_it(tmp_path, capsys):
    (tmp_path / "empty.pt").write_bytes(b"")
    np.savez(tmp_path / "w.npz", w=np.ones(3))
    for name, words in (("empty.pt", "empty file"), ("w.npz", "a NumPy .npz archive")):
        assert cli.main([*TINY, "--resume", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert f"--resume: {tmp_path / name}: {words}" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--world-size", "0"], "--world-size takes positive integers"),
        (["--world-size", "two"], "--world-size takes positive integers"),
        (["--world-size", "2", "--micro-batch", "5"], "must be a multiple of --micro-batch 5"),
        (["--world-size", "1,2", "--save", "d"], "--save takes one --world-size"),
        (["--world-size", "2", "--record", "d"], "--record belongs to the strategy comparison"),
        (["--world-size", "2", "--timeout", "0"], "--timeout must be a positive finite number"),
        (["--world-size", "2", "--timeout", "inf"], "--timeout must be a positive finite number"),
        (["--world-size", "2", "--fault", "1:x:kill"], "--fault takes RANK:STEP:kill"),
        (["--world-size", "2", "--save-every", "0"], "--save-every must be a positive integer"),
    ],
)
def test_cli_bad_parallel_options_are_refused(extra, message, capsys):
    assert cli.main([*TINY, *extra]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_cli_killed_rank_stops_the_others_with_a_clear_error(capsys):
    t0 = time.monotonic()
    rc = cli.main([*TINY, "--world-size", "3", "--steps", "6", "--fault", "1:2:kill"])
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "the run on 3 processes stopped" in err
    assert "rank 1: died (killed by signal SIGKILL)" in err
    assert "rank 0: DistributedError:" in err and "rank 2: DistributedError:" in err
    assert elapsed < 60 + 60, elapsed  # within the 60 s timeout, after start-up


@pytest.mark.slow
def test_cli_hung_rank_stops_the_others_within_the_timeout(capsys, monkeypatch):
    from bitfold.cli import launch

    monkeypatch.setattr(launch, "GRACE", 1.0)  # the launcher's wait after rank 1's error
    t0 = time.monotonic()
    rc = cli.main([*TINY, "--world-size", "2", "--steps", "6", "--fault", "0:3:hang",
                   "--timeout", "4"])  # fmt: skip
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "rank 0: still running after the others had stopped (hung?)" in err
    assert "rank 1: DistributedError: the parameter check failed on rank 1 of 2" in err
    assert "(collectives wait at most 4 s)" in err
    assert elapsed < 4 + 1 + 60, elapsed  # timeout, the launcher's grace, start-up


# --------------------------------------------------------------------------- checkpoints
def test_checkpoint_killed_mid_write_leaves_the_old_one_readable(tmp_path):
    from bitfold.cli import checkpoints

    old = {"step": 1, "model": {"w": torch.arange(4.0)}}
    checkpoints.save(torch, tmp_path, old)
    code = f"""
import os, signal, torch
from bitfold.cli import checkpoints
def partial(obj, f):
    f.write(b"PK\\x03\\x04 half a checkpoint")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
torch.save = partial
checkpoints.save(torch, {str(tmp_path)!r}, {{"step": 2, "model": {{"w": torch.zeros(4)}}}})
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "checkpoint.pt"]
    assert len(leftovers) == 1 and leftovers[0].endswith(".tmp")  # the half-written file
    state = checkpoints.load(torch, tmp_path)
    assert state["step"] == 1 and torch.equal(state["model"]["w"], torch.arange(4.0))
    checkpoints.save(torch, tmp_path, {"step": 3, "model": {"w": torch.ones(4)}})
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # the leftover is gone
    assert checkpoints.load(torch, tmp_path)["step"] == 3


def test_checkpoint_interrupted_by_an_exception_keeps_the_old_one(tmp_path, monkeypatch):
    from bitfold.cli import checkpoints

    checkpoints.save(torch, tmp_path, {"step": 1})

    def broken(obj, f):
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", broken)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save(torch, tmp_path, {"step": 2})
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]
    assert checkpoints.load(torch, tmp_path)["step"] == 1


def test_data_order_resumes_mid_epoch_and_across_epochs():
    from bitfold.cli.data_order import DataOrder, deal, micro_batch_shares

    whole = DataOrder(10, 3, seed=4)
    steps = [whole.step(s).tolist() for s in range(8)]  # 3 steps an epoch, one example dropped
    epochs = [[i for s in steps[e * 3 : e * 3 + 3] for i in s] for e in range(2)]
    assert all(len(set(e)) == 9 and set(e) <= set(range(10)) for e in epochs)
    assert epochs[0] != epochs[1]  # a new shuffle every epoch
    assert DataOrder(10, 3, seed=4, shuffle=False).step(2).tolist() == [6, 7, 8]
    for cut in range(1, 8):
        a = DataOrder(10, 3, seed=4)
        for s in range(cut):
            a.step(s)
        b = DataOrder(10, 3, seed=99)
        b.load_state_dict(a.state_dict())
        assert [b.step(s).tolist() for s in range(cut, 8)] == steps[cut:], cut
    assert deal(10, 4, 1) == [1, 5, 9] and micro_batch_shares(10, 4) == [3, 3, 2, 2]
    assert micro_batch_shares(2, 3) == [1, 1, 0]


def test_a_rank_leaves_with_its_output_flushed_and_without_the_teardown():
    code = ("import atexit, sys\n"
            "from bitfold.cli.launch import leave\n"
            "atexit.register(lambda: print('teardown ran'))\n"
            "sys.stdout.write('result on stdout')\n"
            "sys.stderr.write('note on stderr')\n"
            "leave(3)\n")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as usual
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(ROOT / "src")}, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "result on stdout",
                                                           "note on stderr")  # fmt: skip


# --------------------------------------------------------------------------- torchrun
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env_launch(per_rank_args: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Start one ``python -m bitfold train`` per rank with torchrun's environment variables."""
    port = _free_port()
    procs = []
    for rank, extra in enumerate(per_rank_args):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(len(per_rank_args)),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "PYTHONPATH": str(ROOT / "src")}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-m", "bitfold", *TINY, *extra], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


@pytest.mark.slow
def test_local_ranks_start_from_the_fork_server_and_leave_nothing_behind():
    """On Linux the command's ranks fork from a server that imported torch and bitfold once; a
    run prints nothing on stderr (no semaphore left behind by the ranks' fast exit)."""
    from bitfold.cli import launch
    from bitfold.cli.parallel_rank import run_rank

    method = launch._context(run_rank).get_start_method()
    assert method == ("forkserver" if sys.platform.startswith("linux") else "spawn")
    done = subprocess.run([sys.executable, "-m", "bitfold", *TINY, "--world-size", "2",
                           "--steps", "2"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    assert done.returncode == 0 and "sha256:" in done.stdout, done.stderr
    assert done.stderr == ""


@pytest.mark.slow
def test_launched_ranks_match_the_local_run(single, tmp_path):
    """Ranks started with torchrun's environment (as on several machines) give the local bits."""
    local = single[0]
    out = tmp_path / "launched.json"
    done = _env_launch([["--steps", STEPS_CLI, "--json", str(out)], ["--steps", STEPS_CLI]])
    assert [d.returncode for d in done] == [0, 0], done[0].stderr + done[1].stderr
    launched = json.loads(out.read_text())
    assert launched["config"]["launcher"] == "torchrun" and launched["config"]["world_sizes"] == [2]
    assert launched["runs"][0]["digest"] == local["runs"][0]["digest"]
    assert done[1].stdout == ""  # only rank 0 prints


@pytest.mark.slow
def test_launched_ranks_with_different_options_are_refused(tmp_path):
    done = _env_launch([["--steps", "5"], ["--steps", "5", "--lr", "0.5"]])
    for rank, d in enumerate(done):
        assert d.returncode == 2, d.stderr
        assert f"bitfold train: error: rank {rank} of 2:" in d.stderr
        assert "was started with different options from another rank" in d.stderr
