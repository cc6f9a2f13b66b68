"""Backends: one module per place values can live, each registered once in the backend registry.

``host`` serves NumPy arrays, CPU tensors and CPU JAX arrays with the Numba
CPU kernels; ``triton`` serves torch tensors and CuPy arrays on GPUs (CUDA,
ROCm, XPU) with Triton kernels, and CPU tensors in Triton's interpreter when
named; ``cuda`` serves GPU arrays (CuPy, torch CUDA, numba and
``__cuda_array_interface__`` arrays) with the numba-cuda kernels (loaded
only when GPU values arrive); ``portable`` serves torch, CuPy and JAX arrays
on any device (CUDA without numba-cuda, MPS, XPU, ROCm, TPU, JAX on a GPU)
with the array libraries' own integer operations. Each module ends with its ``BACKEND`` entry
(:class:`~bitfold.backends.registry.Backend`), whose ``priority`` says when
:func:`~bitfold.backends.registry.backend_for` asks it (host 300, triton 200,
cuda 100, portable -100: highest first); the lines below register them. A new backend
is one module, with a priority among these, and one line here.
"""

from __future__ import annotations

from . import cuda, host, portable, triton
from .registry import backend_names, register

register(host.BACKEND)  # priority 300: NumPy arrays and CPU values
register(triton.BACKEND)  # priority 200: GPU tensors where Triton runs
register(cuda.BACKEND)  # priority 100: when numba-cuda loads (its entry's available())
register(portable.BACKEND)  # priority -100: every device the array libraries run on

__all__ = ["backend_names"]
