"""Folds of GPU arrays, on their device and stream, with the numba-cuda kernels.

``cuda_fold(plan, values, strategy, out_dtype)`` takes values that live on
a CUDA device — a CuPy array, a torch CUDA tensor, a numba device array, or
any object with ``__cuda_array_interface__`` — and returns the K sums as the
same kind of array (a numba device array for other interface objects), on
the same device. Kernels are launched on the stream the values' library is
using: torch's current stream of that device, CuPy's current stream, the
numba array's own stream, or the ``stream`` entry of the interface (the
default stream when it has none). Nothing waits for the host: the call
returns once the work is queued, and every step (the zeroing, the
accumulation, the rounding) is a kernel, so the call may be captured in a
CUDA graph after a first, warm-up call (which compiles the kernels and
uploads the plan).

The plan's index data (index, counts, and for ``ordered`` the sorted order
and offsets) is uploaded once per device and kept in ``plan._device_cache``
under the key ``("numba-cuda", device)``.

Numeric contracts: see :mod:`bitfold.kernels.cuda`. In short, ``exact``
gives the same bits as ``plan(values)`` on the CPU (the correctly rounded
sum), ``ordered`` the same bits as the CPU ``ordered`` strategy (NaN results
as the canonical NaN), ``atomic`` whatever the float atomics give.

Values in bfloat16 (torch only) are widened to float32 first (exact) by
torch; every other dtype is read in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import library_of
from .errors import DeviceError, FoldError, FoldTypeError, ShapeError, UnknownStrategyError
from .validate import numpy_out_dtype, out_dtype_for, value_dtype_name

if TYPE_CHECKING:
    from .plan import Fold

#: Strategies with a GPU kernel.
GPU_STRATEGIES = ("exact", "ordered", "atomic")

_BITS_OF = {"float32": np.uint32, "float16": np.uint16, "float64": np.int64}


def _cuda() -> Any:
    from numba import cuda

    return cuda


def _kernels() -> Any:
    from .kernels import cuda as kernels

    return kernels


# -- the values ---------------------------------------------------------------------------
@dataclass
class DeviceValues:
    """Flat, contiguous values on one device, as a numba device array, plus where they came from."""

    kind: str  # "torch", "cupy" or "numba": the kind of array results are returned as
    device: int
    stream: Any  # numba stream object (or 0 for the default stream)
    array: Any  # flat numba device array of the values (float16, float32 or float64)
    dtype: str  # dtype name of the values as given (bfloat16 included)
    keep: Any = None  # converted copy that ``array`` points into, kept alive


def _host_error(values: Any) -> DeviceError:
    where = f"{type(values).__module__}.{type(values).__qualname__}"
    if library_of(values) == "torch":
        where = f"a torch tensor on device {values.device}"
    return DeviceError(
        f"GPU folds need values on a CUDA device (a CuPy array, a torch CUDA tensor, a "
        f"numba device array or any object with __cuda_array_interface__); got {where} "
        "— fold host arrays with plan(values), or move the values to the GPU"
    )


def _check_size(plan: Fold, n: int, shape: tuple[int, ...]) -> None:
    if n != plan.size:
        raise ShapeError(
            f"values have {n} elements (shape {shape}); this plan folds {plan.size} "
            f"(index shape {plan.shape}): pass exactly {plan.size} values"
        )


def _numba_stream(handle: int | None) -> Any:
    cuda = _cuda()
    if not handle:
        return cuda.default_stream()
    return cuda.external_stream(int(handle))


def _pointer_device(ptr: int) -> int | None:
    """The device ordinal owning a device pointer (driver query), or None if unknown."""
    try:
        from numba.cuda.cudadrv import driver as drv

        attr = drv.binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return int(drv.driver.cuPointerGetAttribute(attr, drv.binding.CUdeviceptr(ptr)))
    except Exception:  # simulator, old driver, or not a device pointer
        return None


def _numba_array_device(arr: Any) -> int:
    try:
        return int(arr.gpu_data.context.device.id)
    except AttributeError:  # the simulator's arrays: one device
        return 0


def device_values(plan: Fold, values: Any) -> DeviceValues:
    """Wrap GPU ``values`` for the kernels, or refuse them with a clear error."""
    lib = library_of(values)
    if lib == "torch":
        return _torch_values(plan, values)
    if lib == "cupy":
        return _cupy_values(plan, values)
    if lib == "jax":
        raise DeviceError(
            "JAX arrays are not folded by the numba-cuda kernels (JAX arrays are immutable and "
            "JAX owns their streams); use bitfold.jax, or pass a CuPy/torch array"
        )
    if getattr(values, "__cuda_ndarray__", False):  # numba device arrays (and the simulator's)
        return _numba_values(plan, values, values, kind="numba")
    if hasattr(values, "__cuda_array_interface__"):
        iface = values.__cuda_array_interface__
        ptr = int(iface["data"][0])
        dev = _pointer_device(ptr) if ptr else None
        cuda = _cuda()
        if dev is None:
            dev = cuda.get_current_device().id
        with cuda.gpus[dev]:
            arr = cuda.as_cuda_array(values, sync=False)
        dv = _numba_values(plan, values, arr, kind="numba")
        dv.device = dev
        dv.stream = _numba_stream(iface.get("stream"))
        return dv
    raise _host_error(values)


def _numba_values(plan: Fold, original: Any, arr: Any, kind: str) -> DeviceValues:
    name = value_dtype_name(arr)
    if name not in _BITS_OF:
        raise FoldTypeError(f"GPU folds take float16, float32 or float64 values; got {name}")
    _check_size(plan, int(arr.size), tuple(arr.shape))
    if not arr.is_c_contiguous():
        raise FoldError(
            f"GPU folds of {type(original).__qualname__} values need a C-contiguous array; "
            f"got strides {tuple(arr.strides)} for shape {tuple(arr.shape)} — pass a "
            "contiguous copy"
        )
    stream = getattr(arr, "stream", 0) or _numba_stream(None)
    return DeviceValues(
        kind, _numba_array_device(arr), stream, arr.reshape(int(arr.size)), name, keep=original
    )


def _torch_values(plan: Fold, values: Any) -> DeviceValues:
    import torch

    if values.device.type != "cuda":
        raise _host_error(values)
    name = value_dtype_name(values)
    _check_size(plan, int(values.numel()), tuple(values.shape))
    t = values.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()  # exact widening
    t = t.contiguous().reshape(-1)
    dev = int(t.device.index)
    cuda = _cuda()
    with cuda.gpus[dev]:
        arr = cuda.as_cuda_array(t, sync=False)
    stream = _numba_stream(torch.cuda.current_stream(t.device).cuda_stream)
    return DeviceValues("torch", dev, stream, arr, name, keep=t)


def _cupy_values(plan: Fold, values: Any) -> DeviceValues:
    import cupy

    name = value_dtype_name(values)
    _check_size(plan, int(values.size), tuple(values.shape))
    dev = int(values.device.id)
    cuda = _cuda()
    with cupy.cuda.Device(dev):
        a = cupy.ascontiguousarray(values).reshape(-1)
        stream = _numba_stream(cupy.cuda.get_current_stream().ptr)
    with cuda.gpus[dev]:
        arr = cuda.as_cuda_array(a, sync=False)
    return DeviceValues("cupy", dev, stream, arr, name, keep=a)


# -- results, allocated in the values' library -----------------------------------------------
def _empty(dv: DeviceValues, shape: tuple[int, ...], dtype: Any) -> tuple[Any, Any]:
    """``(array of dv's kind, numba view of it)``: uninitialised, on dv's device."""
    cuda = _cuda()
    if dv.kind == "torch":
        import torch

        tdt = getattr(torch, np.dtype(dtype).name)
        obj = torch.empty(shape, dtype=tdt, device=f"cuda:{dv.device}")
        return obj, cuda.as_cuda_array(obj, sync=False)
    if dv.kind == "cupy":
        import cupy

        with cupy.cuda.Device(dv.device):
            obj = cupy.empty(shape, dtype=dtype)
        return obj, cuda.as_cuda_array(obj, sync=False)
    obj = cuda.device_array(shape, dtype=dtype, stream=dv.stream)
    return obj, obj


def _view(obj: Any, kind: str, name: str) -> Any:
    """``obj`` (an int16/32/64 array of ``kind``) viewed as the float dtype ``name``."""
    if kind == "torch":
        import torch

        return obj.view(getattr(torch, name))
    return obj.view(np.dtype(name))


# -- the plan on a device ----------------------------------------------------------------------
@dataclass
class DevicePlan:
    """A plan's index data on one CUDA device (numba device arrays), uploaded once."""

    device: int
    index: Any
    counts: Any
    launch: Any  # kernels.LaunchShape sized for the device
    order_offsets: tuple[Any, Any] | None = field(default=None)


def device_plan(plan: Fold, device: int) -> DevicePlan:
    """The plan's data on ``device`` (uploaded on first use, then taken from the cache).

    Must be called with ``device``'s context current.
    """
    key = ("numba-cuda", int(device))
    entry = plan._device_cache.get(key)
    if entry is None:
        cuda = _cuda()
        kernels = _kernels()
        sm = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", None)
        launch = kernels.LaunchShape(max_blocks=2 * int(sm)) if sm else kernels.LaunchShape()
        entry = DevicePlan(
            int(device), cuda.to_device(plan.index), cuda.to_device(plan.counts), launch
        )
        plan._device_cache[key] = entry
    if entry.device != int(device):
        raise DeviceError(
            f"the plan's index data cached for CUDA device {entry.device} cannot serve values "
            f"on CUDA device {device}"
        )
    return entry


def _order_offsets(entry: DevicePlan, plan: Fold) -> tuple[Any, Any]:
    if entry.order_offsets is None:
        cuda = _cuda()
        entry.order_offsets = (cuda.to_device(plan.order), cuda.to_device(plan.offsets))
    return entry.order_offsets


# -- the entry points --------------------------------------------------------------------------
def cuda_fold(
    plan: Fold,
    values: Any,
    strategy: str = "exact",
    out_dtype: Any = None,
    *,
    launch: Any = None,
    exact_path: str = "auto",
) -> Any:
    """Fold GPU ``values`` with ``strategy`` on their device and stream; same kind of array out.

    ``out_dtype`` defaults to float32 (float64 for float64 values), as on the
    CPU. ``launch`` (a :class:`bitfold.kernels.cuda.LaunchShape`) and
    ``exact_path`` (``"auto"``, ``"shared"``, ``"global"``) tune the kernels;
    they never change an ``exact`` or ``ordered`` result.
    """
    if strategy not in GPU_STRATEGIES:
        raise UnknownStrategyError(
            f"unknown strategy {strategy!r}; choose one of: {', '.join(GPU_STRATEGIES)}"
        )
    dv = device_values(plan, values)
    out_name = out_dtype_for(dv.dtype, out_dtype)
    if strategy != "exact":
        numpy_out_dtype(out_name, strategy)  # refuses bfloat16, as on the CPU
    cuda = _cuda()
    kernels = _kernels()
    with cuda.gpus[dv.device]:
        entry = device_plan(plan, dv.device)
        shape = launch or entry.launch
        K = plan.K
        if strategy == "exact":
            source = "float32" if dv.dtype == "bfloat16" else dv.dtype
            fmt = kernels.SOURCES[source][1]
            _, state = _empty(dv, (K, fmt.width), np.int64)
            kernels.launch_zero(state.reshape(K * fmt.width), dv.stream, shape)
            bits = dv.array.view(_BITS_OF[source])
            kernels.launch_exact(
                entry.index, bits, source, state, entry.counts, dv.stream,
                shape=shape, path=exact_path, count_terms=False,
            )
            # bfloat16 results: torch gets bfloat16; other libraries the float32 holding them
            widen = out_name == "bfloat16" and dv.kind != "torch"
            out, out_bits = _empty(dv, (K,), kernels.out_bits_dtype(out_name, widen))
            kernels.launch_round(
                state, entry.counts, True, fmt, out_name, out_bits, dv.stream,
                widen_bfloat16=widen,
            )
            return _view(out, dv.kind, "float32" if widen else out_name)
        if strategy == "ordered":
            order, offsets = _order_offsets(entry, plan)
            out, out_bits = _empty(dv, (K,), kernels.out_bits_dtype(out_name))
            out_f = out_bits.view(np.dtype(out_name))
            kernels.launch_ordered(order, offsets, dv.array, out_f, out_bits, out_name, dv.stream)
            return _view(out, dv.kind, out_name)
        # atomic: float32 (or float64) atomics; a float16 result is rounded once at the end
        acc_name = "float64" if out_name == "float64" else "float32"
        acc_obj, acc = _empty(dv, (K,), np.dtype(acc_name))
        kernels.launch_zero(acc, dv.stream, shape)
        kernels.launch_atomic(entry.index, dv.array, acc, acc_name, dv.stream, shape=shape)
        if out_name == acc_name:
            return acc_obj
        out, out_view = _empty(dv, (K,), np.float16)
        kernels.launch_cast_f16(acc, out_view, dv.stream)
        return out


def cuda_exact_state(plan: Fold, values: Any, state: Any = None, *, launch: Any = None) -> Any:
    """The exact accumulator state of GPU ``values``, or ``values`` added into ``state``.

    Returns (or updates in place and returns) a ``(K, L + 5)`` int64 array of
    the values' kind and device, in the layout of
    :attr:`bitfold.ExactAccumulator.state`; it equals, bit for bit, the state
    of ``plan.accumulator(dtype, kernel="limbs").add(values)`` on the CPU, so
    it can be copied to the host and given to
    :meth:`bitfold.ExactAccumulator.from_state`, or summed over devices and
    processes (an all-reduce with SUM) before rounding. A ``state`` on another
    device than ``values`` is refused with :class:`bitfold.DeviceError`.
    """
    dv = device_values(plan, values)
    source = "float32" if dv.dtype == "bfloat16" else dv.dtype
    cuda = _cuda()
    kernels = _kernels()
    fmt = kernels.SOURCES[source][1]
    width = fmt.width
    with cuda.gpus[dv.device]:
        entry = device_plan(plan, dv.device)
        shape = launch or entry.launch
        if state is None:
            result, view = _empty(dv, (plan.K, width), np.int64)
            kernels.launch_zero(view.reshape(plan.K * width), dv.stream, shape)
        else:
            result = state
            st = device_values_of_state(state)
            if st.device != dv.device:
                raise DeviceError(
                    f"the state lives on CUDA device {st.device} and the values on CUDA device "
                    f"{dv.device}: an accumulation needs both on one device"
                )
            view = st.array
            if tuple(view.shape) != (plan.K, width) or view.dtype != np.int64:
                raise ShapeError(
                    f"a state of this plan for {dv.dtype} values is int64 with shape "
                    f"{(plan.K, width)}; got {view.dtype} with shape {tuple(view.shape)}"
                )
            # a state from elsewhere (e.g. an all-reduce) may not be normalised: settle it
            kernels.launch_settle(view, entry.counts, False, fmt, dv.stream)
        kernels.launch_exact(
            entry.index, dv.array.view(_BITS_OF[source]), source, view, entry.counts, dv.stream,
            shape=shape,
        )
    return result


@dataclass
class _StateView:
    device: int
    array: Any


def device_values_of_state(state: Any) -> _StateView:
    """A numba view of a device state array and its device (any kind of GPU array)."""
    cuda = _cuda()
    lib = library_of(state)
    if lib == "torch":
        if state.device.type != "cuda":
            raise _host_error(state)
        if not state.is_contiguous():
            raise FoldError("a GPU state array must be C-contiguous")
        dev = int(state.device.index)
        with cuda.gpus[dev]:
            return _StateView(dev, cuda.as_cuda_array(state, sync=False))
    if lib == "cupy":
        dev = int(state.device.id)
        with cuda.gpus[dev]:
            return _StateView(dev, cuda.as_cuda_array(state, sync=False))
    if getattr(state, "__cuda_ndarray__", False):
        return _StateView(_numba_array_device(state), state)
    if hasattr(state, "__cuda_array_interface__"):
        ptr = int(state.__cuda_array_interface__["data"][0])
        dev = _pointer_device(ptr)
        if dev is None:
            dev = cuda.get_current_device().id
        with cuda.gpus[dev]:
            return _StateView(dev, cuda.as_cuda_array(state, sync=False))
    raise _host_error(state)


def is_device_array(x: Any) -> bool:
    """True for values :func:`cuda_fold` serves: CUDA tensors/arrays of any library.

    Never imports a framework or numba.cuda: torch tensors are recognised by
    ``x.device.type`` and everything else by the interface attributes. JAX
    arrays are not served here (``False``): :mod:`bitfold.jax` handles them.
    """
    lib = library_of(x)
    if lib == "torch":
        return x.device.type == "cuda"
    if lib == "jax":
        return False
    return bool(getattr(x, "__cuda_ndarray__", False)) or hasattr(
        x, "__cuda_array_interface__"
    )


__all__ = [
    "GPU_STRATEGIES",
    "DevicePlan",
    "DeviceValues",
    "cuda_exact_state",
    "cuda_fold",
    "device_plan",
    "device_values",
    "is_device_array",
]
