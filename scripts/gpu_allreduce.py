"""The exact all-reduce on a GPU machine, for ``make gpu-check``: bits and time, JSON out.

    python scripts/gpu_allreduce.py OUT.json [--smoke] [--budget SECONDS]

Steps, each recorded in ``steps`` as ``ok``, ``failed`` (with the error) or
``skipped`` (with the reason); the JSON is written whatever fails:

* ``one_process``: a one-process group (NCCL with CUDA tensors): the exact
  all-reduce of ``N`` float32 elements (10^8 on a GPU), its words made on the
  device and on the host, against ``dist.all_reduce`` of the same tensor,
  medians of wall time; one rank's sum is its own tensor, so the result must
  be the input's bits. The device words alone (bounds, layout, words, decode:
  :mod:`bitfold.dense_device`) are timed against one read and one write of
  the tensor (a copy), with the goal of at most 2x.
  The exact reduce-scatter (:func:`bitfold.distributed.exact_reduce_scatter`)
  of the same tensor, against ``dist.reduce_scatter_tensor``: its one shard is
  the whole input, whose bits it must return.
* ``two_processes``: two processes on the one GPU, a gloo group with CUDA
  tensors: each rank's exact all-reduce must equal the exact sum of both
  ranks' tensors computed in this process on the CPU
  (:class:`bitfold.dense.DenseSum`), bit for bit, and each rank's exact
  reduce-scatter that sum's half of its rank; rank 0 makes its words on
  the device, rank 1 once on the device and once on the host.
* ``gradient_sum_step``: a small MLP's training step on one device with
  :class:`bitfold.GradientSum` (add, then the exact reduce) against the same
  step under ``DistributedDataParallel``, medians and their ratio.

``--smoke`` runs every step with gloo and CPU
tensors at small sizes, without a GPU (the times mean nothing there).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


def _median_us(fn: Callable[[], Any], sync: Callable[[], None], repeats: int = 5) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _values(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * np.exp2(rng.integers(-20, 20, n))).astype(np.float32)


def _bits(a: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, np.float32)).view(np.uint32)


class Run:
    """The report and its steps, written to ``out`` at every change."""

    def __init__(self, out: Path, smoke: bool, budget: float) -> None:
        self.out, self.smoke, self.deadline = out, smoke, time.monotonic() + budget
        self.report: dict[str, Any] = {"smoke": smoke, "steps": {}}

    def step(self, name: str, fn: Callable[[], dict[str, Any]], need_s: float) -> None:
        if time.monotonic() + need_s > self.deadline:
            self.report["steps"][name] = {"status": "skipped", "reason": "the budget is spent"}
        else:
            try:
                self.report["steps"][name] = {"status": "ok", **fn()}
            except Skip as e:
                self.report["steps"][name] = {"status": "skipped", "reason": str(e)}
            except Exception as e:  # recorded, the next step still runs
                self.report["steps"][name] = {"status": "failed", "error": repr(e),
                                              "traceback": traceback.format_exc()[-2000:]}
        self.write()

    def write(self) -> None:
        self.out.write_text(json.dumps(self.report, indent=2))


class Skip(Exception):
    """A step that cannot run here, with the reason."""


@contextlib.contextmanager
def _one_rank_group(smoke: bool) -> Iterator[tuple[Any, str, Callable[[], None]]]:
    """A one-process group: NCCL on the GPU, or gloo on the CPU with ``smoke``; yields
    ``(torch.distributed, device, synchronise)`` and destroys the group after."""
    import torch
    import torch.distributed as dist

    cuda = not smoke
    if cuda and not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    store = dist.FileStore(tempfile.mktemp(prefix="bitfold-allreduce-"), 1)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1)
    try:
        yield dist, "cuda" if cuda else "cpu", torch.cuda.synchronize if cuda else (lambda: None)
    finally:
        dist.destroy_process_group()


def one_process(smoke: bool) -> dict[str, Any]:
    import torch

    from bitfold.distributed import exact_all_reduce, exact_reduce_scatter

    with _one_rank_group(smoke) as (dist, device, sync):
        n = 10**5 if smoke else 10**8
        x = torch.from_numpy(_values(n, 1)).to(device)
        exact = exact_all_reduce(x, words="device")
        host = exact_all_reduce(x, words="host")
        shard = exact_reduce_scatter(torch.empty_like(x), x, words="device")
        plain = x.clone()
        coding, copy = _device_coding_us(x, sync), _median_us(lambda: plain.copy_(x), sync)
        return {
            "backend": dist.get_backend(),
            "elements": n,
            "wire_bytes_per_element": _wire_bytes(_gradient_like(min(n, 10**7))),
            "exact_us": _median_us(lambda: exact_all_reduce(x, words="device"), sync, 3),
            "exact_host_words_us": _median_us(lambda: exact_all_reduce(x, words="host"),
                                              sync, 3),
            "float32_all_reduce_us": _median_us(lambda: dist.all_reduce(plain), sync),
            "exact_reduce_scatter_us": _median_us(
                lambda: exact_reduce_scatter(shard, x, words="device"), sync, 3),
            "float32_reduce_scatter_us": _median_us(
                lambda: dist.reduce_scatter_tensor(plain, x), sync),
            "device_encode_decode_us": coding,
            "read_write_us": copy,
            "encode_decode_over_read_write": coding / copy,
            "goal_encode_decode": 2.0,
            "met_encode_decode": coding / copy <= 2.0,
            "equals_input": bool(np.array_equal(_bits(exact.cpu()), _bits(x.cpu()))),
            "host_words_equal_input": bool(np.array_equal(_bits(host.cpu()), _bits(x.cpu()))),
            "reduce_scatter_equals_input": bool(np.array_equal(_bits(shard.cpu()),
                                                               _bits(x.cpu()))),
        }


def _device_coding_us(x: Any, sync: Callable[[], None]) -> float:
    """Median time of the device words' own work on ``x`` (one rank, no collective): bounds,
    layout (with its one host read), words, and the decode of those words."""
    from bitfold import dense_device
    from bitfold.dense import BLOCK, DenseSum

    limbs = DenseSum(1).format.limbs

    def coding() -> None:
        bounds = dense_device.array_bounds(x, BLOCK)
        layout = dense_device.device_layout(bounds, x.numel(), 1, BLOCK, True, limbs)
        count, _, _ = layout.totals()
        words = dense_device.array_words(x, layout, count)
        dense_device.decode(words, layout, None, "float32")

    return _median_us(coding, sync, 3)


def _wire_bytes(flat: np.ndarray) -> dict[str, float]:
    """Bytes an element takes on the exact all-reduce's wire for these values, by rank count:
    the int64 words of its layout (:func:`bitfold.dense.wire_layout`) and the bounds (three
    int32 a block of :data:`bitfold.dense.BLOCK` elements)."""
    from bitfold.dense import array_bounds, wire_layout
    from bitfold.formats import F32

    bounds = array_bounds(flat)
    if bounds is None:
        return {}
    out = {}
    for ranks in (2, 8, 64):
        layout = wire_layout(bounds, flat.size, ranks, F32.limbs)
        out[str(ranks)] = (layout.words * 8 + bounds.shape[0] * 12) / flat.size
    return out


def _gradient_like(n: int) -> np.ndarray:
    """Standard normal float32 values: the spread of an ordinary gradient's elements."""
    return np.random.default_rng(3).standard_normal(n).astype(np.float32)


def _rank_main(rank: int, port: int, n: int, device: str, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    from bitfold.distributed import exact_all_reduce, exact_reduce_scatter

    dist.init_process_group("gloo", init_method=f"tcp://localhost:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    try:
        x = torch.from_numpy(_values(n, 10 + rank)).to(device)
        device_words = _bits(exact_all_reduce(x, words="device").cpu()).tolist()
        mixed = _bits(exact_all_reduce(x, words="host" if rank else "device").cpu()).tolist()
        half = torch.empty(n // 2, dtype=x.dtype, device=device)
        shard = _bits(exact_reduce_scatter(half, x, words="device").cpu()).tolist()
        mixed_shard = _bits(exact_reduce_scatter(half, x, words="host" if rank else "device")
                            .cpu()).tolist()  # fmt: skip
        queue.put((rank, (device_words, mixed, shard, mixed_shard)))
    finally:
        dist.destroy_process_group()


def two_processes(smoke: bool) -> dict[str, Any]:
    import torch
    import torch.multiprocessing as mp

    from bitfold.dense import DenseSum

    device = "cpu" if smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device")
    n = 10**4 if smoke else 10**6
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, port, n, device, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    want = DenseSum((n,), "float32").add(_values(n, 10)).add(_values(n, 11)).result("float32")
    want_bits = _bits(want).tolist()
    halves = [want_bits[: n // 2], want_bits[n // 2:]]
    return {"device": device, "elements": n,
            "each_rank_equals_cpu": [got[r][0] == want_bits for r in (0, 1)],
            "mixed_host_and_device_words_equal_cpu": [got[r][1] == want_bits for r in (0, 1)],
            "reduce_scatter_shard_equals_cpu": [got[r][2] == halves[r] for r in (0, 1)],
            "reduce_scatter_mixed_words_equal_cpu": [got[r][3] == halves[r] for r in (0, 1)]}


def gradient_sum_step(smoke: bool) -> dict[str, Any]:
    import torch

    from bitfold.distributed import GradientSum

    with _one_rank_group(smoke) as (_dist, device, sync):
        torch.manual_seed(0)
        width = 256 if smoke else 4096
        model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                    torch.nn.Linear(width, 10)).to(device)  # fmt: skip
        x = torch.randn(64, width, device=device)
        y = torch.randint(0, 10, (64,), device=device)
        loss_fn = torch.nn.CrossEntropyLoss()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        summed = GradientSum(list(model.parameters()), words="device")

        def ddp_step() -> None:
            loss_fn(ddp(x), y).backward()
            ddp.zero_grad(set_to_none=True)

        def exact_step() -> None:
            loss_fn(model(x), y).backward()
            summed.add().reduce()
            model.zero_grad(set_to_none=True)

        t_ddp, t_exact = _median_us(ddp_step, sync), _median_us(exact_step, sync)
        return {"device": device, "parameters": sum(p.numel() for p in model.parameters()),
                "ddp_step_us": t_ddp, "gradient_sum_step_us": t_exact,
                "ratio": t_exact / t_ddp, "goal": 1.3, "met": t_exact / t_ddp <= 1.3}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--budget", type=float, default=60.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("MASTER_ADDR", "localhost")
    run = Run(args.out, args.smoke, args.budget)
    run.step("one_process", lambda: one_process(args.smoke), need_s=5)
    run.step("two_processes", lambda: two_processes(args.smoke), need_s=15)
    run.step("gradient_sum_step", lambda: gradient_sum_step(args.smoke), need_s=5)
    steps = run.report["steps"]
    one, two = steps.get("one_process", {}), steps.get("two_processes", {})
    bits_ok = [b for b in (one.get("equals_input"), one.get("host_words_equal_input"),
                           one.get("reduce_scatter_equals_input"),
                           *two.get("each_rank_equals_cpu", []),
                           *two.get("mixed_host_and_device_words_equal_cpu", []),
                           *two.get("reduce_scatter_shard_equals_cpu", []),
                           *two.get("reduce_scatter_mixed_words_equal_cpu", []))
               if b is not None]  # fmt: skip
    failed = [name for name, s in steps.items() if s["status"] == "failed"]
    run.report["bits_equal_cpu"] = all(bits_ok) if bits_ok else None  # None: nothing compared
    run.write()
    return 1 if failed or run.report["bits_equal_cpu"] is False else 0


if __name__ == "__main__":
    sys.exit(main())
