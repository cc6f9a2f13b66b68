"""What the JAX collective check scripts share: their XLA flags and the loop of every case on a
mesh of each size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Bits = dict[str, list[str]]


def xla_flags(devices: int) -> str:
    """``XLA_FLAGS`` for a check script: ``devices`` simulated CPU devices, and LLVM's
    optimization level 0 for XLA's CPU code. What these scripts judge is integer arithmetic from
    the bitcast of the inputs to that of the results (the psums' digit words), which no
    optimization level changes (nor do IEEE float operations change without fast-math flags,
    which XLA leaves off); level 0 takes about a quarter off the compilation of these large
    programs, most of the scripts' time on a fresh clone. ``tests/jax_x64_check.py`` (bits
    against the oracle, one device) takes the same flags: 44-53 -> 31 core-s from an empty
    cache. The examples and every in-process JAX test compile at XLA's default level."""
    return f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"


def bits_on_meshes(cases: dict[str, Any], run_case: Callable[..., Bits],
                   meshes: list[int] | None, x64: bool) -> dict[str, Bits]:  # fmt: skip
    """``{mesh size: {name: hex bits}}``: ``run_case(name, case, mesh, n)`` for every case of
    this mode (``case.x64 == x64``) on a mesh of the first ``n`` devices, for each ``n`` of
    ``meshes`` (default: one mesh of every device). Imports JAX when called, after the script
    has set its device count."""
    import jax

    runs: dict[str, Bits] = {}
    for n in meshes or [jax.device_count()]:
        mesh = jax.make_mesh((n,), ("i",), devices=jax.devices()[:n])
        out = runs[str(n)] = {}
        for name, case in cases.items():
            if case.x64 == x64:
                out.update(run_case(name, case, mesh, n))
    return runs
