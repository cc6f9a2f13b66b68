"""What machine and software a benchmark ran on (the ``machine`` block of ``results.json``)."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import sys
from typing import Any

#: Import name -> distributions that may provide it (first installed one wins).
LIBRARIES = {
    "numpy": ("numpy",),
    "numba": ("numba",),
    "torch": ("torch",),
    "torch_scatter": ("torch-scatter", "torch_scatter"),
    "jax": ("jax",),
    "jaxlib": ("jaxlib",),
    "cupy": ("cupy", "cupy-cuda13x", "cupy-cuda12x", "cupy-cuda11x"),
    "matplotlib": ("matplotlib",),
    "tqdm": ("tqdm",),
}


def physical_memory() -> int | None:
    """Total RAM in bytes, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def usable_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def versions() -> dict[str, str | None]:
    """Installed version of each library the benchmark may use (None when absent)."""
    out: dict[str, str | None] = {}
    for name, dists in LIBRARIES.items():
        out[name] = None
        if importlib.util.find_spec(name) is None:
            continue
        for dist in dists:
            try:
                out[name] = md.version(dist)
                break
            except md.PackageNotFoundError:
                continue
    return out


def thread_counts() -> dict[str, int | None]:
    """Threads Numba and (if already imported) PyTorch use in this process."""
    import numba

    counts: dict[str, int | None] = {"numba": int(numba.get_num_threads()), "torch": None}
    if "torch" in sys.modules:
        counts["torch"] = int(sys.modules["torch"].get_num_threads())
    return counts


def gpu_name(device: str) -> str | None:
    """The GPU's name on ``--device cuda`` (from torch or cupy), else None."""
    if device != "cuda":
        return None
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    if importlib.util.find_spec("cupy") is not None:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props.get("name", b"")
        return name.decode() if isinstance(name, bytes) else str(name)
    return None


def describe(device: str) -> dict[str, Any]:
    """The machine block: :func:`bitfold.machine.describe` plus what benchmarks need.

    Added: usable cores, RAM, the installed version of every library a
    contender may use (imported or not), thread counts, the GPU and the load
    average (other work competing for the cores).
    """
    from ..machine import describe as base

    return {
        **base(),
        "cores_usable": usable_cores(),
        "memory_bytes": physical_memory(),
        "libraries": versions(),
        "threads": thread_counts(),
        "gpu": gpu_name(device),
        "numba_cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
        "load_average": load_average(),
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (other work competing for the cores), if known."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None
