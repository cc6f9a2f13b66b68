"""The loop the JAX collective check scripts share: every case on a mesh of each size."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Bits = dict[str, list[str]]


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
