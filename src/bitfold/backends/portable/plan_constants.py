"""What a plan gives the device, made once per device and kept on the plan.

Its index, order, starts and counts as integers of the fold's words on the
values' device, and the most values of one bucket. A plan built on a device
derives them from its tensors there (:mod:`bitfold.backends.device_plan`),
never through the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...arrays import ArrayFamily
from ...plan_view import PlanView
from .. import device_plan


@dataclass(frozen=True)
class ConstantKey:
    """The key of one of a plan's device constants: what it is, and where (``cache_key``).

    ``place`` is the family's :meth:`bitfold.arrays.ArrayFamily.cache_key` of the
    values beside which it lives (None for a Python number, the same everywhere).
    """

    what: str
    place: Any = None


def _constant(plan: PlanView, ops: ArrayFamily, like: Any, what: str, build: Any) -> Any:
    """``build()`` (a host array) on ``like``'s device; kept on the plan unless tracing.

    Under ``torch.compile`` the plan must have met the device once before (a
    first, eager call), as for a CUDA-graph capture: the compiled fold then
    reads the kept constants.
    """
    key = ops.cache_key(like)
    if key is None:
        return ops.constant(like, build())
    return plan.prepared(ConstantKey(what, key), lambda: ops.constant(like, build()))


def max_count(plan: PlanView) -> int:
    """The most values of one bucket (a Python int, kept on the plan).

    A plan built on a device reads it from its counts there (one read, once).
    """
    built = plan.device_tensors
    if built is not None:
        return plan.prepared(ConstantKey("max-count"), lambda: int(built.counts.max()))
    return plan.prepared(ConstantKey("max-count"), lambda: int(plan.counts.max()))


def _kept_by_device_plan(ops: ArrayFamily, like: Any) -> bool:
    """True when :mod:`bitfold.backends.device_plan` keeps a plan's arrays for values like
    ``like``: eager (not traced) values of the family whose arrays it keeps (torch tensors)."""
    return ops.name == device_plan.FAMILY and ops.cache_key(like) is not None


def _derived_on_device(plan: PlanView, ops: ArrayFamily, like: Any) -> bool:
    """True when the plan's arrays for ``like`` come from its tensors on ``like``'s device
    (:mod:`bitfold.backends.device_plan`): a plan built on a device, values it keeps arrays
    for."""
    return plan.device_tensors is not None and _kept_by_device_plan(ops, like)


def plan_array(plan: PlanView, ops: ArrayFamily, like: Any, what: str, word: str) -> Any:
    """The plan's ``what`` ("order", "starts", "counts") as ``word`` integers on ``like``'s device.

    Kept on the plan; a plan built on a device derives it there from its
    tensors (:func:`device_plan.plan_tensors`), never through the host.
    """
    if _derived_on_device(plan, ops, like):

        def derived() -> Any:
            t = device_plan.plan_tensors(plan, like.device)
            src = {"order": t.order, "starts": t.offsets[:-1], "counts": t.counts}[what]
            return ops.astype(src, word)

        return plan.prepared(ConstantKey(f"{what}-{word}", ops.cache_key(like)), derived)
    host = {"order": lambda: plan.order, "starts": lambda: plan.offsets[:-1],
            "counts": lambda: plan.counts}[what]  # fmt: skip
    return _constant(plan, ops, like, f"{what}-{word}", lambda: host().astype(word))


def counts_rows(plan: PlanView, ops: ArrayFamily, like: Any, D: int, extra: int, word: str) -> Any:
    """Every bucket's count plus ``extra``, repeated for its ``D`` table rows, as ``word``."""
    what = f"counts-rows-{word}-{D}-{bool(extra)}"
    if _derived_on_device(plan, ops, like):
        counts = plan_array(plan, ops, like, "counts", word)

        def derived() -> Any:  # each count D times, in place of the count: (K,) -> (K·D,)
            rows = (counts + extra).reshape(-1, 1) + ops.zeros(like, (1, D), word)
            return rows.reshape(-1)

        return plan.prepared(ConstantKey(what, ops.cache_key(like)), derived)
    return _constant(plan, ops, like, what,
                     lambda: np.repeat(plan.counts + extra, D).astype(word))  # fmt: skip


def plan_index(plan: PlanView, ops: ArrayFamily, like: Any, word: str) -> Any:
    """The plan's flat index as ``word`` integers on ``like``'s device (kept on the plan).

    int64 for values :mod:`bitfold.backends.device_plan` keeps arrays for: its one index of
    the plan there (:func:`device_plan.index_tensor`, torch's int64).
    """
    if word == "int64" and _kept_by_device_plan(ops, like):
        return device_plan.index_tensor(plan, like.device)
    return _constant(plan, ops, like, f"index-{word}", lambda: plan.index.astype(word))
