"""The Triton path's bits in the places a first device meets: every dtype, streams, graphs.

One step of ``make gpu-check``, in a process of its own (a sticky CUDA error stays here). Every
case folds a Zipf-skewed map with a hot bucket through ``backend="triton"`` and compares the
result's bits with the host backend's (the CPU's, the Fraction oracle's by the host's own
tests):

* each value dtype (float32, float16, bfloat16, float64), without and with ``init``;
* on a non-default torch stream (``torch.cuda.Stream``), and with CuPy arrays on a non-default
  CuPy stream;
* the hot buckets' kernels inside a CUDA graph (``torch.cuda.graph``), after a warm-up, replayed
  with new values;
* on ``cuda:1`` while ``cuda:0`` is current, where there are two devices;
* the share of buckets whose certificate lets the lanes sum one word a value (counted on the
  host from the plan's buckets: the lanes' own rule), and the known-answer test's verdicts.

    python scripts/gpu_bits.py OUT.json [--smoke]

``--smoke``: no GPU; CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``), tiny sizes;
the stream, graph, CuPy and second-device cases are recorded as skipped with the reason. Exit
status 0 when every case run gives the host's bits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

SIGNIFICAND = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def zipf_map(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A skewed index: bucket 0 hot, the rest Zipf(1.3)."""
    ids = (rng.zipf(1.3, n) - 1) % k
    ids[: n // 8] = 0
    return ids.astype(np.int64)


def wide_values(n: int, rng: np.random.Generator, spread: int = 20) -> np.ndarray:
    return rng.standard_normal(n) * np.exp2(rng.integers(-spread, spread, n))


def word_share(index: np.ndarray, values: np.ndarray, k: int, dtype: str) -> float:
    """The share of non-empty buckets whose lanes' certificate holds (one word a value)."""
    finite = np.isfinite(values) & (values != 0)
    _, exps = np.frexp(np.where(finite, values, 1.0))
    held, seen = 0, 0
    for b in range(k):
        mine = index == b
        n = int(mine.sum())
        if not n:
            continue
        seen += 1
        e = exps[mine & finite]
        span = int(e.max() - e.min()) if e.size else 0
        held += n.bit_length() + span + SIGNIFICAND[dtype] <= 62
    return held / max(seen, 1)


class Cases:
    """Runs each case, records ``{"ok": bool}``, a skip with its reason, or the error."""

    def __init__(self) -> None:
        self.results: dict[str, Any] = {}

    def run(self, name: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        try:
            got = fn()
        except Exception as exc:  # a kernel error is a result, not the end of the check
            got = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc()[-2000:]}  # fmt: skip
        if isinstance(got, bool):
            got = {"ok": got}
        got["seconds"] = round(time.perf_counter() - t0, 3)
        self.results[name] = got
        print(f"{name}: {got}", flush=True)

    def skip(self, name: str, reason: str) -> None:
        self.results[name] = {"skipped": reason}
        print(f"{name}: skipped ({reason})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--smoke", action="store_true", help="CPU tensors in the interpreter")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    import bitfold

    smoke = args.smoke
    device = "cpu" if smoke else "cuda"
    n, k = (600, 16) if smoke else (1 << 20, 5000)
    rng = np.random.default_rng(7)
    index = zipf_map(n, k, rng)
    plan = bitfold.Fold(index, k)
    cases = Cases()
    shares: dict[str, float] = {}

    def same(got: Any, want: np.ndarray) -> bool:
        g = got.detach().cpu() if isinstance(got, torch.Tensor) else torch.as_tensor(got.get())
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[g.element_size()]
        w = torch.from_numpy(np.ascontiguousarray(want)).view(width)
        return bool(torch.equal(g.contiguous().view(width), w))

    def host(values: torch.Tensor, init: torch.Tensor | None = None) -> np.ndarray:
        cpu = values.cpu()
        kw = {} if init is None else {"init": init.cpu()}
        got = plan(cpu, **kw)
        return (got.view(torch.int16) if got.element_size() == 2 else got).numpy()

    for dtype in ("float32", "float16", "bfloat16", "float64"):
        tdtype = getattr(torch, dtype)
        raw = wide_values(n, rng, 6 if dtype == "float16" else 20)
        values = torch.from_numpy(raw).to(tdtype).to(device)
        shares[dtype] = word_share(index, values.double().cpu().numpy(), k, dtype)
        for with_init in (False, True):
            init = torch.from_numpy(wide_values(k, rng, 4)).to(tdtype).to(device) if with_init \
                else None  # fmt: skip

            def fold(values: Any = values, init: Any = init) -> bool:
                kw = {} if init is None else {"init": init}
                got = plan(values, backend="triton", **kw)
                want = host(values, init)
                return same(got.view(torch.int16) if got.element_size() == 2 else got, want)

            cases.run(f"{dtype}, init={with_init}", fold)

    f32 = torch.from_numpy(wide_values(n, rng)).float().to(device)
    want32 = host(f32)
    if smoke:
        for name in ("torch stream", "cupy stream", "hot buckets in a CUDA graph", "cuda:1"):
            cases.skip(name, "--smoke: CPU tensors in Triton's interpreter")
    else:

        def on_stream() -> bool:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                got = plan(f32, backend="triton")
            stream.synchronize()
            return same(got, want32)

        cases.run("torch stream", on_stream)
        try:
            import cupy
        except ImportError:
            cases.skip("cupy stream", "CuPy is not installed")
        else:

            def on_cupy_stream() -> bool:
                with cupy.cuda.Stream(non_blocking=True) as stream:
                    got = plan(cupy.asarray(f32.cpu().numpy()), backend="triton")
                    stream.synchronize()
                return same(got, want32)

            cases.run("cupy stream", on_cupy_stream)

        def in_graph() -> bool:
            static = f32.clone()
            plan(static, backend="triton")  # warm-up: the plan and the hot table on the device
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = plan(static, backend="triton")
            fresh = torch.from_numpy(wide_values(n, rng)).float()
            static.copy_(fresh.to(device))
            graph.replay()
            torch.cuda.synchronize()
            return same(out, host(fresh))

        cases.run("hot buckets in a CUDA graph", in_graph)
        if torch.cuda.device_count() < 2:
            cases.skip("cuda:1", "one device here")
        else:

            def second_device() -> bool:
                torch.cuda.set_device(0)
                got = plan(f32.to("cuda:1"), backend="triton")
                return got.device.index == 1 and same(got, want32)

            cases.run("cuda:1", second_device)
    # the known-answer test's verdicts (it ran before the first fold of each dtype pair)
    try:
        from bitfold.backends import selftest as st

        selftest: Any = [v.as_dict() for v in st.verdicts()] or "did not run"
    except Exception as exc:
        selftest = f"{type(exc).__name__}: {exc}"
    ran = [r for r in cases.results.values() if "ok" in r]
    report = {
        "smoke": smoke,
        "device": torch.cuda.get_device_name(0) if not smoke else "cpu (interpreter)",
        "positions": n,
        "buckets": k,
        "cases": cases.results,
        "one_word_share": shares,
        "selftest": selftest,
        "all_bits_equal": bool(ran) and all(r["ok"] for r in ran),
    }
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2, default=str)
    print("all bits equal:", report["all_bits_equal"])
    return 0 if report["all_bits_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
