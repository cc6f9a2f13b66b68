"""A plan's index data as torch tensors on one device: the one home of the torch index copy.

Every torch consumer of a plan on a device (the Triton kernels, the adapter's
gather, the portable path's scatters) asks :func:`plan_tensors` for the arrays
it needs instead of copying ``plan.index`` itself. The arrays are made once per
plan and device and kept by the plan (:meth:`bitfold.Fold.prepared`, key
``("torch-plan", device)``), so a static index is copied or built once.

Contents (all on ``device``):

* ``index``: the flat index, int64 (what ``torch.gather``/``index_select`` take);
* ``order``: the stable sorted order (positions sorted by bucket, increasing
  position within a bucket), int32 below 2^31 positions, else int64;
* ``sorted_index``: the bucket of each position of ``order``, int32;
* ``counts``: values a bucket, int32 below 2^31 positions, else int64;
* ``offsets``: ``offsets[k] .. offsets[k + 1]`` is bucket k's run in ``order``,
  int64, K + 1 entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..plan import Fold

PREPARED_KEY = "torch-plan"


@dataclass(frozen=True)
class PlanTensors:
    """The index data of a plan, as torch tensors on one device (see the module)."""

    index: Any
    order: Any
    sorted_index: Any
    counts: Any
    offsets: Any

    @property
    def nbytes(self) -> int:
        """Bytes these tensors hold (on their device)."""
        return sum(int(t.numel() * t.element_size()) for t in self.tensors())

    def tensors(self) -> tuple[Any, ...]:
        return (self.index, self.order, self.sorted_index, self.counts, self.offsets)


def _positions_dtype(n: int) -> Any:
    import torch

    return torch.int32 if n < 2**31 else torch.int64


def _from_host(plan: Fold, device: Any) -> PlanTensors:
    """Copy the plan's host arrays to ``device`` (one copy each, made once)."""
    import torch

    def put(arr: np.ndarray, dtype: Any) -> Any:
        return torch.from_numpy(np.ascontiguousarray(arr)).to(device=device, dtype=dtype)

    positions = _positions_dtype(plan.size)
    return PlanTensors(
        index=put(plan.index, torch.int64),
        order=put(plan.order, positions),
        sorted_index=put(plan.sorted_index, torch.int32),
        counts=put(plan.counts, positions),
        offsets=put(plan.offsets, torch.int64),
    )


def plan_tensors(plan: Fold, device: Any) -> PlanTensors:
    """The plan's index data on torch ``device``, made on first use and kept by the plan."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return plan.prepared((PREPARED_KEY, str(device)), lambda: _from_host(plan, device))


__all__ = ["PREPARED_KEY", "PlanTensors", "plan_tensors"]
