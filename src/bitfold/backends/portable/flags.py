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


def runs_one_path(ops: ArrayFamily, like: Any) -> bool:
    """True when :func:`choose` runs only the path the flag picks for values like ``like``
    (the library branches on the device, or the flag is read where it lies); False where it
    makes both and selects one (a path worth trying only when it serves most folds)."""
    return ops.branches_on_device(like) or ops.reads_without_sync(like)


def choose(ops: ArrayFamily, like: Any, flag: Any, if_set: Any, if_clear: Any) -> Any:
    """``if_set()`` where the 0-d ``flag`` is set, else ``if_clear()``: with no host wait.

    The family's conditional (:meth:`~bitfold.arrays.ArrayFamily.cond`) runs one
    branch where it branches on the device (``branches_on_device``: JAX's
    ``lax.cond``, inside ``jit`` too) or where the flag is read where it lies
    (``reads_without_sync``: a torch CPU tensor, a NumPy array; no device to wait
    for). Elsewhere (a torch device, fake tensors, ``torch.compile``) both are
    made and one is selected with ``where``: ``torch.cond`` would run one, but
    inductor's post-grad passes refused some of its graphs here.
    """
    if runs_one_path(ops, like):  # lax.cond; the flag of an eager CPU tensor read on the host
        return ops.cond(flag, if_set, if_clear)
    return ops.where(flag, if_set(), if_clear())
