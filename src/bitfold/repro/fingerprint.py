"""The environment fingerprint: what machine and software a run or a measurement ran on.

One description, written at the top of every run manifest
(:mod:`bitfold.repro.manifest`) and into the JSON of ``bitfold probe``,
``bitfold train``, ``bitfold bench`` and ``scripts/gpu_check.py``, so that
``bitfold diff`` and a reader compare like with like.

Taking it changes nothing in the process:

* no framework is imported: PyTorch, JAX, CuPy and numba-cuda are described
  only when they are already in ``sys.modules``;
* Numba's thread pool is never started: the thread count is read from
  ``NUMBA_NUM_THREADS`` (``numba.config``), and the running pool is asked only
  once it exists. (``numba.get_num_threads()`` starts the pool, and with the
  OpenMP threading layer that resets the OpenMP thread count torch shares.)
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..backends.cpu_caches import last_level_cache_bytes

#: Environment variables that can change the bits a run produces; recorded
#: in every fingerprint (``None`` when unset).
DETERMINISM_ENV_VARS = (
    "PYTHONHASHSEED",
    "OMP_NUM_THREADS",
    "OMP_PROC_BIND",
    "OMP_PLACES",
    "KMP_AFFINITY",
    "MKL_NUM_THREADS",
    "MKL_CBWR",
    "MKL_ENABLE_INSTRUCTIONS",
    "MKL_DEBUG_CPU_TYPE",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "NUMBA_THREADING_LAYER",
    "NUMBA_ENABLE_CUDASIM",
    "ATEN_CPU_CAPABILITY",
    "ONEDNN_MAX_CPU_ISA",
    "ONEDNN_DEFAULT_FPMATH_MODE",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_LAUNCH_BLOCKING",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "TF_DETERMINISTIC_OPS",
    "TF_CUDNN_DETERMINISTIC",
    "XLA_FLAGS",
    "JAX_ENABLE_X64",
    "JAX_DEFAULT_MATMUL_PRECISION",
    "JAX_PLATFORMS",
)


def cpu_model() -> str:
    """The CPU model name (from /proc/cpuinfo on Linux), or the platform's best guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> str | None:
    try:
        text = Path("/proc/driver/nvidia/version").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d[\w.]*)", text)
    return m.group(1) if m else text.splitlines()[0].strip() if text else None


def _safe(fn: Any) -> Any:
    """``fn()``, or ``"unavailable: <error>"``: a fingerprint never stops a run."""
    try:
        return fn()
    except Exception as err:
        return f"unavailable: {type(err).__name__}: {err}"


def _torch_info(torch: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    info: dict[str, Any] = {
        "deterministic_algorithms": _safe(torch.are_deterministic_algorithms_enabled),
        "float32_matmul_precision": _safe(torch.get_float32_matmul_precision),
        "cuda_build": getattr(torch.version, "cuda", None),
    }
    cudnn = getattr(getattr(torch, "backends", None), "cudnn", None)
    if cudnn is not None:
        info["cudnn_deterministic"] = _safe(lambda: bool(cudnn.deterministic))
        info["cudnn_benchmark"] = _safe(lambda: bool(cudnn.benchmark))
    gpu = None
    if _safe(torch.cuda.is_available) is True:
        n = torch.cuda.device_count()
        gpu = {
            "devices": [
                _safe(lambda i=i: torch.cuda.get_device_name(i)) for i in range(n)
            ],
            "capability": [
                _safe(lambda i=i: list(torch.cuda.get_device_capability(i))) for i in range(n)
            ],
            "cuda_runtime": torch.version.cuda,
            "cudnn": _safe(lambda: torch.backends.cudnn.version()),
            "driver": _nvidia_driver(),
            "matmul_allow_tf32": _safe(lambda: bool(torch.backends.cuda.matmul.allow_tf32)),
            "cudnn_allow_tf32": _safe(lambda: bool(torch.backends.cudnn.allow_tf32)),
        }
    return info, gpu


def _cupy_device_name(cupy: Any) -> str:
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id).get("name", b"")
    return name.decode() if isinstance(name, bytes) else str(name)


def thread_settings(pool: bool = True) -> dict[str, Any]:
    """Thread settings now: Numba's and, when torch is loaded, torch's.

    ``numba_max`` is ``NUMBA_NUM_THREADS`` and ``numba_layer_config`` the
    requested threading layer. With ``pool=True`` (the closing record) also
    ``numba`` and ``numba_layer``, the running pool's thread count and layer,
    or ``None`` when no parallel kernel has started it; the header leaves
    them out, so that two runs in one process do not differ only because
    the first one started the pool. Reading changes nothing:
    ``numba.get_num_threads()`` is only called once the pool runs (it would
    start it, and with the OpenMP layer that resets the OpenMP thread count
    that torch shares).
    """
    import numba
    from numba.np.ufunc import parallel

    threads: dict[str, Any] = {
        "numba_max": numba.config.NUMBA_NUM_THREADS,
        "numba_layer_config": getattr(numba.config, "THREADING_LAYER", None),
    }
    if pool:
        if getattr(parallel, "_is_initialized", False):
            threads["numba"] = _safe(numba.get_num_threads)
            threads["numba_layer"] = _safe(numba.threading_layer)
        else:
            threads["numba"] = threads["numba_layer"] = None
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        threads["torch"] = _safe(torch.get_num_threads)
        threads["torch_interop"] = _safe(torch.get_num_interop_threads)
    return threads


def numba_threads() -> int:
    """Numba's thread count: the running pool's, or ``NUMBA_NUM_THREADS`` before it starts.

    Never starts the pool (see the module docstring).
    """
    threads = thread_settings(pool=True)
    running = threads["numba"]
    return int(running) if isinstance(running, int) else int(threads["numba_max"])


def usable_cores() -> int | None:
    """The number of CPU cores this process may run on (None where the OS does not say)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity else None


def physical_memory() -> int | None:
    """Total RAM in bytes, or None where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (other work competing for the cores), if known."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def installed_versions(libraries: Mapping[str, tuple[str, ...]]) -> dict[str, str | None]:
    """The installed version of each import name (None when absent), without importing any.

    ``libraries`` maps an import name to the distributions that may provide it;
    the first one installed wins.
    """
    out: dict[str, str | None] = {}
    for name, dists in libraries.items():
        out[name] = None
        if importlib.util.find_spec(name) is None:
            continue
        for dist in dists:
            try:
                out[name] = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return out


def fingerprint() -> dict[str, Any]:
    """The environment fingerprint (see the module docstring for what taking it never does).

    Python, platform, CPU model, core counts (``cpu_count``; ``cpu_affinity``,
    the cores this process may use), RAM, the last-level cache (0 when the
    operating system reports none), the versions of bitfold, NumPy and
    Numba, thread settings (:func:`thread_settings` without the pool), the
    environment variables of :data:`DETERMINISM_ENV_VARS`, and, for PyTorch,
    JAX, CuPy and numba-cuda *only when they are already imported*, their
    versions, settings and the GPU name, driver and CUDA versions.
    """
    import numba

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": _safe(usable_cores),
        "memory_bytes": physical_memory(),
        "last_level_cache_bytes": last_level_cache_bytes(),
        "versions": {"bitfold": __version__, "numpy": np.__version__, "numba": numba.__version__},
        "threads": thread_settings(pool=False),
    }
    gpu: dict[str, Any] | None = None
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "__version__"):
        env["versions"]["torch"] = torch.__version__
        env["torch"], gpu = _torch_info(torch)
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "__version__"):
        env["versions"]["jax"] = jax.__version__
        jaxlib = sys.modules.get("jaxlib")
        if jaxlib is not None:
            env["versions"]["jaxlib"] = getattr(jaxlib, "__version__", None)
        env["jax_devices"] = _safe(lambda: [str(d) for d in jax.devices()])
    cupy = sys.modules.get("cupy")
    if cupy is not None and hasattr(cupy, "__version__"):
        env["versions"]["cupy"] = cupy.__version__
        env["cupy"] = {
            "runtime": _safe(lambda: cupy.cuda.runtime.runtimeGetVersion()),
            "driver": _safe(lambda: cupy.cuda.runtime.driverGetVersion()),
            "device": _safe(lambda: _cupy_device_name(cupy)),
        }
    numba_cuda = sys.modules.get("numba_cuda")
    if numba_cuda is not None:
        env["versions"]["numba_cuda"] = getattr(numba_cuda, "__version__", None)
    if gpu is not None:
        env["gpu"] = gpu
    env["env"] = {name: os.environ.get(name) for name in DETERMINISM_ENV_VARS}
    return env


def summary(fp: Mapping[str, Any]) -> dict[str, Any]:
    """The few facts a printed report shows: CPU, usable cores, RAM, GPU, versions, threads.

    Reads a :func:`fingerprint` or the machine block of a ``results.json``
    written by an older ``bitfold bench`` (flat ``cores_usable``, ``bitfold``,
    ``threads.numba``, ``gpu`` as a name); missing facts are None.
    """
    versions = fp.get("versions") or {}
    threads = fp.get("threads") or {}
    gpu = fp.get("gpu")
    if isinstance(gpu, Mapping):
        gpu = ", ".join(map(str, gpu.get("devices") or [])) or None
    elif gpu is None and isinstance(fp.get("cupy"), Mapping):
        gpu = fp["cupy"].get("device")
    return {
        "cpu": fp.get("cpu"),
        "cores": fp.get("cpu_affinity") or fp.get("cores_usable") or fp.get("cpu_count")
        or fp.get("cores"),
        "memory_bytes": fp.get("memory_bytes"),
        "gpu": gpu,
        "python": fp.get("python"),
        "bitfold": versions.get("bitfold") or fp.get("bitfold"),
        "numba_threads": threads.get("numba") or threads.get("numba_max"),
        "torch_threads": threads.get("torch"),
    }


__all__ = [
    "DETERMINISM_ENV_VARS",
    "cpu_model",
    "fingerprint",
    "installed_versions",
    "load_average",
    "numba_threads",
    "physical_memory",
    "summary",
    "thread_settings",
    "usable_cores",
]
