"""A plan's index data as torch tensors on one device: the one home of the torch index copy.

Every torch consumer of a plan on a device (the Triton kernels, the adapter's
gather, the portable path's scatters) asks :func:`plan_tensors` (or, for the
flat index alone, :func:`index_tensor`) for the arrays it needs instead of
copying ``plan.index`` itself. The arrays are made once per plan and device
and kept by the plan (:meth:`bitfold.Fold.prepared`, keys
:class:`TensorsKey` and :class:`IndexKey` of the device), so a static index
is copied or built once, and there is one torch copy of the index per plan and
device.

Contents (all on ``device``):

* ``index``: the flat index, int64 (what ``torch.gather``/``index_select`` take);
* ``order``: the stable sorted order (positions sorted by bucket, increasing
  position within a bucket), int32 below 2^31 positions, else int64;
* ``sorted_index``: the bucket of each position of ``order``, int32 (int64 only
  for K >= 2^31, which int32 cannot hold);
* ``counts``: values a bucket, int32 below 2^31 positions, else int64;
* ``offsets``: ``offsets[k] .. offsets[k + 1]`` is bucket k's run in ``order``,
  int64, K + 1 entries.

Plans built on the device
-------------------------
A plan of a torch tensor that lives on a device other than the CPU (a CUDA
tensor, or any other torch device with data) is built there
(:func:`builds_on_device`, :func:`build`): the index is checked (integer
dtype, every entry in ``[0, K)``), sorted (a stable sort) and counted by
torch operations on its device, and never copied to the host. The one host
synchronisation is the read of one flag, "some entry is out of range"; when
it is set, the first bad position is found on the device and the same
:class:`bitfold.IndexRangeError` as the host build's is raised. The plan's
host arrays (``plan.index``, ``plan.order``, ...) are made from one host copy
of the index only if something asks for them (:func:`host_index`).

:func:`forced_device_build` makes CPU tensors take the same road, so the
device build can be tested (and compared with the host build) without a GPU.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..arrays import NO_DATA_DEVICES, check_has_data
from ..formats import dtype_name
from ..kernels import planning
from ..plan_view import DeviceKey, PlanView
from ..validate import index_dtype_error, index_range_error

#: The array family of the arrays this module keeps for a plan (:func:`bitfold.arrays.family_of`):
#: a consumer of another family makes its own from the plan's host arrays.
FAMILY = "torch"

#: The integer dtypes an index may have (by canonical name), as on the host.
INDEX_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")

_INT32_MAX = (1 << 31) - 1
_FORCED: ContextVar[bool] = ContextVar("bitfold_forced_device_build", default=False)


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

    @property
    def device(self) -> Any:
        """The torch device the tensors live on."""
        return self.index.device

    def tensors(self) -> tuple[Any, ...]:
        """The five tensors, in field order."""
        return (self.index, self.order, self.sorted_index, self.counts, self.offsets)


# -- where a plan is built -------------------------------------------------------------------------
@contextlib.contextmanager
def forced_device_build(on: bool = True) -> Iterator[None]:
    """Within the block (this thread or task), plans of CPU torch tensors build as on a device.

    For tests without a GPU: ``Fold(cpu_tensor, K)`` then takes the device
    build's road (torch operations, one flag read, tensors kept on the plan)
    with the CPU as the device. ``on=False`` turns it off inside an outer block.
    """
    token = _FORCED.set(on)
    try:
        yield
    finally:
        _FORCED.reset(token)


def builds_on_device(index: Any) -> bool:
    """True when a plan of ``index`` is built by :func:`build`, on the index's device.

    That is a torch tensor on a device other than the CPU that holds data (a
    CUDA tensor; ``meta`` tensors are refused by the host reader), or any CPU
    torch tensor inside :func:`forced_device_build`. Never imports torch: an
    index can only be a tensor when torch is imported already.
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(index, torch.Tensor):
        return False
    kind = index.device.type
    if kind in NO_DATA_DEVICES:
        return False
    return kind != "cpu" or _FORCED.get()


def _positions_dtype(n: int) -> Any:
    import torch

    return torch.int32 if n < 2**31 else torch.int64


def _keys_dtype(K: int) -> Any:
    import torch

    return torch.int32 if K <= _INT32_MAX else torch.int64


def build(index: Any, K: int, name: str = "index") -> tuple[tuple[int, ...], PlanTensors]:
    """Check and plan the torch tensor ``index`` into K buckets on its device: (shape, tensors).

    The index's dtype must be an integer one (the host reader's
    :class:`bitfold.FoldTypeError` otherwise); it is read in C order, any
    shape. Every entry must lie in ``[0, K)``: the flag "some entry does not"
    is the one value read back to the host; when it is set, the first bad flat
    position is found on the device and :func:`bitfold.validate.index_range_error`
    raised with it and its value, as the host build raises it. The tensors are
    the index as int64 (a copy: the caller may change its tensor afterwards),
    the stable order and the sorted index (one stable sort), the offsets (a
    search of the sorted ids) and the counts (their differences), all made by
    torch operations on the index's device.
    """
    import torch

    check_has_data(index, name)
    dtype = dtype_name(index)
    if dtype not in INDEX_DTYPES:
        raise index_dtype_error(dtype, name)
    shape = tuple(int(s) for s in index.shape)
    given = index.detach()
    device = given.device
    n = given.numel()
    flat = torch.empty(shape, dtype=torch.int64, device=device)
    flat.copy_(given)  # one pass: C order, int64, whatever the caller's strides and dtype
    flat = flat.reshape(-1)
    keys = _keys_dtype(K)
    # out-of-range ids clamp to -1 or K: the sorted keys' ends then show whether any was
    # there, and no id wraps in the narrower key type
    sorted_index, perm = torch.sort(flat.clamp(-1, K).to(keys), stable=True)
    offsets = torch.empty(K + 1, dtype=torch.int64, device=device)
    bounds = torch.arange(K, dtype=keys, device=device)
    torch.searchsorted(sorted_index, bounds, out=offsets[:K])
    offsets[K:].fill_(n)
    positions = _positions_dtype(n)
    tensors = PlanTensors(
        index=flat,
        order=perm.to(positions),
        sorted_index=sorted_index,
        counts=torch.diff(offsets).to(positions),
        offsets=offsets,
    )
    if n and bool((sorted_index[0] < 0) | (sorted_index[-1] >= K)):  # the one host sync
        bad = (flat < 0) | (flat >= K)
        at = int(torch.argmax(bad.to(torch.int8)))  # the first bad position (argmax: first max)
        value = int(given.reshape(-1)[at].item())  # as given: a uint64 id past int64 stays itself
        raise index_range_error(shape, at, value, K)
    return shape, tensors


def host_index(tensors: PlanTensors, K: int) -> np.ndarray:
    """The flat index of a plan built on a device as the host's compact array (one copy).

    In :func:`bitfold.kernels.planning.index_dtype` of K (uint16, int32 or
    int64), copied to the host once, in 4-byte ids where K allows.
    """
    import torch

    index = tensors.index
    if K <= _INT32_MAX:
        index = index.to(torch.int32)  # half the bytes across the bus
    return index.cpu().numpy().astype(planning.index_dtype(K), copy=False)


# -- a plan's tensors on one device ---------------------------------------------------------------
def _device(device: Any) -> Any:
    """``device`` as a torch.device with its index (the current CUDA device when none is given)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def keep_built(plan: PlanView, tensors: PlanTensors) -> None:
    """Keep ``tensors``, built on their device from the plan's index, as the plan's there."""
    where = str(_device(tensors.device))
    plan.prepared(IndexKey(where), lambda: tensors.index)
    plan.prepared(TensorsKey(where), lambda: tensors)


def _from_host(plan: PlanView, device: Any) -> PlanTensors:
    """Copy the plan's host arrays to ``device`` (one copy each, made once)."""
    import torch

    def put(arr: np.ndarray, dtype: Any) -> Any:
        with warnings.catch_warnings():  # the plan's arrays are read-only; so is what views them
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            host = torch.from_numpy(np.ascontiguousarray(arr))
        return host.to(device=device, dtype=dtype)

    positions = _positions_dtype(plan.size)
    return PlanTensors(
        index=index_tensor(plan, device),
        order=put(plan.order, positions),
        sorted_index=put(plan.sorted_index, _keys_dtype(plan.K)),
        counts=put(plan.counts, positions),
        offsets=put(plan.offsets, torch.int64),
    )


def _from_built(built: PlanTensors, plan: PlanView, device: Any) -> PlanTensors:
    """A device-built plan's tensors on another device: copied device to device, not via host."""
    return PlanTensors(
        index=index_tensor(plan, device),
        order=built.order.to(device),
        sorted_index=built.sorted_index.to(device),
        counts=built.counts.to(device),
        offsets=built.offsets.to(device),
    )


class TensorsKey(DeviceKey):
    """The key of a plan's :class:`PlanTensors` on one torch device (``str`` of it)."""


def plan_tensors(plan: PlanView, device: Any) -> PlanTensors:
    """The plan's index data on torch ``device``, made on first use and kept by the plan.

    A plan built on ``device`` (:func:`build`) returns the tensors it was built
    as, with no copy; one built on another device copies them from there; a
    plan built on the host copies its host arrays.
    """
    device = _device(device)

    def make() -> PlanTensors:
        built = plan.device_tensors
        if built is not None:
            return _from_built(built, plan, device)
        return _from_host(plan, device)

    return plan.prepared(TensorsKey(str(device)), make)


class IndexKey(DeviceKey):
    """The key of a plan's int64 torch index on one device (the tensor of ``PlanTensors.index``)."""


def index_tensor(plan: PlanView, device: Any) -> Any:
    """The plan's flat index as an int64 tensor on ``device``: ``plan_tensors(plan, device).index``.

    The same tensor, made alone when nothing needs the rest of the plan's
    tensors there yet (a gather needs no order): one torch copy of the index
    per plan and device, whoever asks first. From the plan's device-built
    index (copied device to device) when it has one, else from its host index.
    """
    import torch

    device = _device(device)

    def make() -> Any:
        built = plan.device_tensors
        if built is not None:
            return built.index.to(device)
        return torch.from_numpy(plan.index.astype(np.int64)).to(device)

    return plan.prepared(IndexKey(str(device)), make)


__all__ = [
    "FAMILY",
    "INDEX_DTYPES",
    "IndexKey",
    "PlanTensors",
    "TensorsKey",
    "build",
    "builds_on_device",
    "forced_device_build",
    "host_index",
    "index_tensor",
    "keep_built",
    "plan_tensors",
]
