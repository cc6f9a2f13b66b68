"""A description of the machine and software a measurement ran on (for JSON reports)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import numpy as np

from .._version import __version__


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux), or the platform's best guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> dict[str, Any]:
    """Versions, CPU, core and thread counts; frameworks only if they are already imported."""
    import numba

    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "bitfold": __version__,
        "numpy": np.__version__,
        "numba": numba.__version__,
        "numba_threads": numba.get_num_threads(),
    }
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    if "jax" in sys.modules:
        info["jax"] = sys.modules["jax"].__version__
    if "cupy" in sys.modules:
        info["cupy"] = sys.modules["cupy"].__version__
    return info
