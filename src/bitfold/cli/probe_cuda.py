"""``bitfold probe --device cuda``: the same four questions, folded on a GPU.

The baselines are the GPU folds the seed and PyTorch use: ``cupyx.scatter_add``
(when CuPy is installed), PyTorch's CUDA ``index_add_`` with and without
``torch.use_deterministic_algorithms(True)``, and PyTorch's own gradient of
``v[idx]``. bitfold's strategies fold the same values on the device through
:mod:`bitfold.gpu`. The training question runs the seed's model with PyTorch
on the GPU: once with each bitfold fold as the gradient of ``v``, and with
PyTorch's autograd fold.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np

from .probe import TRAIN_STRATEGIES, Probe, ProbeConfig, _adam
from .torch_env import deterministic_algorithms


class CudaProbe(Probe):
    """The probe with values, baselines, timing and training on the current CUDA device."""

    def __init__(self, cfg: ProbeConfig, show_progress: bool = True) -> None:
        super().__init__(cfg, show_progress)
        import torch

        self.torch = torch
        self.device = "cuda"
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.idx_dev = torch.from_numpy(self.idx).to(self.dev)
        self.values = torch.from_numpy(self.g).to(self.dev)
        self.sync = torch.cuda.synchronize
        self.cupy = None
        if importlib.util.find_spec("cupy") is not None:
            import cupy

            self.cupy = cupy
        self.atomic_baseline = (
            "cupyx.scatter_add" if self.cupy is not None else "torch index_add_ (CUDA)"
        )

    def describe_backend(self) -> str:
        torch = self.torch
        name = torch.cuda.get_device_name(self.dev)
        return f"numba-cuda on {name} (torch {torch.__version__}, CUDA {torch.version.cuda})"

    def baseline_note(self, name: str) -> str:
        if "deterministic" in name:
            return "torch.use_deterministic_algorithms(True): sorted, serial per bucket"
        return "GPU atomics: the order of the additions is the scheduler's"

    def baselines(self) -> dict[str, Callable[[], Any]]:
        torch, K, ti, tg = self.torch, self.cfg.K, self.idx_dev, self.values
        found: dict[str, Callable[[], Any]] = {}
        if self.cupy is not None:
            import cupyx

            cp = self.cupy
            ci = cp.asarray(self.idx)
            cg = cp.asarray(self.g)

            def cupy_scatter() -> Any:
                out = cp.zeros(K, cp.float32)
                cupyx.scatter_add(out, ci, cg)
                return out

            found["cupyx.scatter_add"] = cupy_scatter

        def index_add() -> Any:
            return torch.zeros(K, device=self.dev).index_add_(0, ti, tg)

        def index_add_deterministic() -> Any:
            with deterministic_algorithms(torch):
                return torch.zeros(K, device=self.dev).index_add_(0, ti, tg)

        def autograd_fold() -> Any:
            v = torch.zeros(K, device=self.dev, requires_grad=True)
            (grad,) = torch.autograd.grad(v[ti], v, grad_outputs=tg)
            return grad

        found["torch index_add_ (CUDA)"] = index_add
        found["torch index_add_ deterministic"] = index_add_deterministic
        found["torch autograd v[idx] (CUDA)"] = autograd_fold
        return found

    def fold_memory(self, fn: Callable[[], Any]) -> int:
        torch = self.torch
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(self.dev)
        torch.cuda.reset_peak_memory_stats(self.dev)
        fn()
        torch.cuda.synchronize()
        return int(max(0, torch.cuda.max_memory_allocated(self.dev) - base))

    def forward_matmul(self) -> Callable[[], Any]:
        x = self.torch.from_numpy(self.matmul_x).to(self.dev)
        w = self.torch.from_numpy(self.matmul_w).to(self.dev)
        return lambda: x @ w

    def _start(self) -> tuple[Any, Any, Any, Any]:
        torch, cfg = self.torch, self.cfg
        r = np.random.default_rng(cfg.seed)
        v = torch.from_numpy(r.normal(0, 0.05, cfg.K).astype(np.float32)).to(self.dev)
        X = torch.from_numpy(r.normal(size=(cfg.batch, cfg.D)).astype(np.float32)).to(self.dev)
        return v, X, torch.zeros_like(v), torch.zeros_like(v)

    def _train_bitfold(self, strategy: str, tick: Callable[[], None]) -> Any:
        torch, cfg, plan = self.torch, self.cfg, self.plan
        assert plan is not None
        v, X, m, vv = self._start()
        with torch.no_grad():
            for t in range(1, cfg.steps + 1):
                W = v[self.idx_dev].reshape(cfg.D, cfg.hid)
                h = torch.relu(X @ W)
                d = (h - 1.0) / cfg.batch
                gW = X.T @ (d * (h > 0))
                gr = plan(gW, strategy)
                v, m, vv = _adam(v, m, vv, gr, t, cfg.lr, torch.sqrt)
                tick()
        return v

    def _train_autograd(self, tick: Callable[[], None]) -> Any:
        torch, cfg = self.torch, self.cfg
        v, X, m, vv = self._start()
        for t in range(1, cfg.steps + 1):
            v = v.detach().requires_grad_()
            W = v[self.idx_dev].reshape(cfg.D, cfg.hid)
            h = torch.relu(X @ W)
            loss = ((h - 1.0) ** 2).sum() / (2 * cfg.batch)
            (gr,) = torch.autograd.grad(loss, v)
            with torch.no_grad():
                v, m, vv = _adam(v.detach(), m, vv, gr, t, cfg.lr, torch.sqrt)
            tick()
        return v.detach()

    def training_runs(self) -> list[tuple[str, Callable[[Callable[[], None]], Any]]]:
        runs: list[tuple[str, Callable[[Callable[[], None]], Any]]] = [
            (s, lambda tick, s=s: self._train_bitfold(s, tick)) for s in TRAIN_STRATEGIES
        ]
        runs.append(("torch autograd (CUDA)", self._train_autograd))
        return runs
