"""One of two paths by a 0-d flag, without waiting for the device.

A fold that finds out on the device whether a quick path served (a flag)
reads the flag where it lies (eager values in host memory), branches in the
trace (a library's own conditional: JAX's ``lax.cond``), or makes both paths
and selects one (a torch device, fake tensors, ``torch.compile``): never a
host synchronisation.
"""

from __future__ import annotations

from typing import Any

from ...arrays import ArrayFamily
from .checks import library


def runs_one_path(ops: ArrayFamily, like: Any) -> bool:
    """True when :func:`choose` runs only the path the flag picks for values like ``like``
    (the library branches on the device, or the flag is read where it lies); False where it
    makes both and selects one (a path worth trying only when it serves most folds)."""
    return library(ops).cond is not None or ops.reads_without_sync(like)


def choose(ops: ArrayFamily, like: Any, flag: Any, if_set: Any, if_clear: Any) -> Any:
    """``if_set()`` where the 0-d ``flag`` is set, else ``if_clear()``: with no host wait.

    A library that branches on a device flag (:attr:`.checks.Library.cond`, JAX's
    ``lax.cond``: one branch runs, inside ``jit`` too) branches there; an eager
    array in host memory (``reads_without_sync``: a torch CPU tensor, a NumPy
    array) has its flag read where it lies (no device to wait for). Elsewhere
    (a torch device, fake tensors, ``torch.compile``) both are made and one is
    selected with ``where``: ``torch.cond`` would run one, but inductor's
    post-grad passes refused some of its graphs here.
    """
    cond = library(ops).cond
    if cond is not None:
        return cond(flag, if_set, if_clear)
    if ops.reads_without_sync(like):  # a torch CPU tensor outside a trace, a NumPy array
        return if_set() if bool(flag) else if_clear()
    return ops.where(flag, if_set(), if_clear())
