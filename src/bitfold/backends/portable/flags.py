"""One of two paths by a 0-d flag, without waiting for the device.

A fold that finds out on the device whether a quick path served (a flag)
reads the flag where it lies (eager values in host memory), branches in the
trace (JAX's ``lax.cond``), or makes both paths and selects one (a torch
device, fake tensors, ``torch.compile``): never a host synchronisation.
"""

from __future__ import annotations

from typing import Any

from ...arrays import ArrayFamily


def choose(ops: ArrayFamily, like: Any, flag: Any, if_set: Any, if_clear: Any) -> Any:
    """``if_set()`` where the 0-d ``flag`` is set, else ``if_clear()``: with no host wait.

    JAX: ``lax.cond`` (one branch runs, inside ``jit`` too); an eager torch CPU
    tensor or a NumPy array: the flag is read where it lies (no device to wait
    for). Elsewhere (a torch device, fake tensors, ``torch.compile``) both are
    made and one is selected with ``where``: ``torch.cond`` would run one, but
    inductor's post-grad passes refused some of its graphs here.
    """
    if ops.name == "jax":
        import jax

        return jax.lax.cond(flag, if_set, if_clear)
    if ops.reads_without_sync(like):  # a torch CPU tensor outside a trace, a NumPy array
        return if_set() if bool(flag) else if_clear()
    return ops.where(flag, if_set(), if_clear())
