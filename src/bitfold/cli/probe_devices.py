"""Where ``bitfold probe`` folds: one small backend object per device.

The probe's questions (:mod:`bitfold.cli.probe`) are written once; what
differs between the CPU and a CUDA GPU is here: the arrays bitfold folds and
trains on, the arrays PyTorch's autograd baseline trains on, how to wait for
the device, the peak memory of one fold, a line naming the backend and a note
on each baseline. Neither backend imports the probe; the baselines themselves
come from the benchmark's contender table (:mod:`bitfold.cli.bench.contenders`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..backends import selftest
from ..plan import Fold
from .timing import peak_bytes


def known_answers(values: Any) -> dict[str, Any]:
    """The GPU kernels' known-answer test for values like ``values`` (float32), as the probe
    reports it: ``mode`` (``BITFOLD_SELFTEST``), ``backend`` (the one that folds them, once the
    test has run: a family that fails it is passed over, with its warning; ``strict`` raises)
    and ``verdicts`` (every verdict of this process, as data)."""
    how = selftest.mode()
    chosen = Fold(np.zeros(1, np.int64), 1).route(values).backend
    return {"mode": how, "backend": chosen,
            "verdicts": [v.as_dict() for v in selftest.verdicts()]}  # fmt: skip


class CpuDevice:
    """The CPU: bitfold folds and trains on NumPy arrays; torch (if given) runs its CPU folds."""

    name = "cpu"
    #: nothing to wait for on the CPU
    sync: Callable[[], None] | None = None

    def __init__(self, torch: Any | None) -> None:
        self.torch = torch

    def array(self, a: np.ndarray) -> Any:
        """``a`` as bitfold's folds and the hashed layer model's bitfold training take it here."""
        return a

    def tensor(self, a: np.ndarray) -> Any:
        """``a`` as a torch tensor for PyTorch's autograd baseline (needs torch)."""
        return self.torch.from_numpy(a)

    def describe(self, backend: str | None = None) -> str:
        """One line naming where the folds ran."""
        return "numpy + numba (CPU)" + (" and torch (CPU)" if self.torch is not None else "")

    def known_answers(self) -> dict[str, Any]:
        """No known-answer test runs here: the host's kernels are the reference."""
        return {"mode": selftest.mode(), "backend": "host", "verdicts": []}

    def baseline_note(self, contender: Any) -> str:
        """Why a baseline is or is not expected to be deterministic here."""
        if contender.name == "numpy-add-at":
            return "sequential on the CPU, so deterministic by construction"
        threads = self.torch.get_num_threads() if self.torch is not None else None
        return f"CPU, {threads} threads"

    def fold_memory(self, fn: Callable[[], Any]) -> int:
        """Peak bytes NumPy and Python allocate during ``fn()``."""
        return peak_bytes(fn)[1]


class TorchDevice:
    """A torch device of type ``kind`` (``xpu``, ``mps``, ... ; :class:`CudaDevice` for CUDA):
    values, training and memory there, through ``torch.<kind>``'s functions where it has
    them."""

    def __init__(self, torch: Any, kind: str) -> None:
        self.torch = torch
        self.name = kind
        self.module = getattr(torch, kind)
        current = getattr(self.module, "current_device", None)
        self.dev = torch.device(kind, current()) if callable(current) else torch.device(kind)
        self.sync: Callable[[], None] | None = getattr(self.module, "synchronize", None)

    def array(self, a: np.ndarray) -> Any:
        """``a`` as a torch tensor on the device (bitfold folds it there)."""
        return self.torch.from_numpy(a).to(self.dev)

    def tensor(self, a: np.ndarray) -> Any:
        """``a`` as a torch tensor on the device, for PyTorch's autograd baseline."""
        return self.array(a)

    def kernels(self, backend: str | None) -> str:
        """The kernels that fold here: ``backend`` (the one chosen once the known-answer test
        ran), else the registry's first for torch tensors on this device."""
        if backend is None:
            from ..backends.registry import backend_for

            backend = backend_for("torch", self.name).name
        return {"triton": "Triton", "cuda": "numba-cuda"}.get(backend, backend)

    def describe(self, backend: str | None = None) -> str:
        """One line naming the device type, the kernels that fold there and torch's version."""
        return f"{self.kernels(backend)} on {self.name} (torch {self.torch.__version__})"

    def known_answers(self) -> dict[str, Any]:
        """The known-answer test of the kernels that fold float32 tensors on this device, run
        now (once a process): :func:`known_answers`."""
        return known_answers(self.array(np.zeros(1, np.float32)))

    def baseline_note(self, contender: Any) -> str:
        """Why a baseline is or is not expected to be deterministic on a GPU."""
        if contender.guarantee == "deterministic mode":
            return "torch.use_deterministic_algorithms(True): sorted, serial per bucket"
        return "GPU atomics: the order of the additions is the scheduler's"

    def fold_memory(self, fn: Callable[[], Any]) -> int:
        """Peak bytes of the device's allocator during ``fn()``, above what was allocated
        (0 where torch reports no peak for this device type)."""
        m = self.module
        if not all(hasattr(m, f) for f in ("memory_allocated", "reset_peak_memory_stats",
                                            "max_memory_allocated")):  # fmt: skip
            fn()
            return 0
        m.synchronize()
        base = m.memory_allocated(self.dev)
        m.reset_peak_memory_stats(self.dev)
        fn()
        m.synchronize()
        return int(max(0, m.max_memory_allocated(self.dev) - base))


class CudaDevice(TorchDevice):
    """The current CUDA device, through PyTorch: values, training and memory on the GPU."""

    def __init__(self, torch: Any) -> None:
        super().__init__(torch, "cuda")

    def describe(self, backend: str | None = None) -> str:
        """One line naming the GPU, the kernels that fold there (``backend``: the one chosen
        once the known-answer test ran; else the registry's first) and the versions of torch
        and CUDA."""
        torch = self.torch
        name = torch.cuda.get_device_name(self.dev)
        kernels = self.kernels(backend)
        kernels = kernels if kernels in ("Triton", "numba-cuda") else "portable"
        return f"{kernels} on {name} (torch {torch.__version__}, CUDA {torch.version.cuda})"
