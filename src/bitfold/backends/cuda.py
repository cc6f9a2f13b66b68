"""The CUDA backend: folds of GPU arrays, on their device and stream, with the numba-cuda kernels.

It serves values that live on a CUDA device — a CuPy array, a torch CUDA
tensor, a numba device array, or any object with ``__cuda_array_interface__``
— and returns the K sums as the same kind of array (a numba device array for
other interface objects), on the same device. Kernels are launched on the
stream the values' library is using: torch's current stream of that device,
CuPy's current stream, the numba array's own stream, or the ``stream`` entry
of the interface (the default stream when it has none). Nothing waits for
the host: the call returns once the work is queued, and every step (the
zeroing, the accumulation, the rounding) is a kernel, so the call may be
captured in a CUDA graph after a first, warm-up call (which compiles the
kernels and uploads the plan).

The plan's index data (index, counts, sorted order and offsets) is uploaded
once per device, the first time the plan meets that device, through
:meth:`bitfold.Fold.prepared` under the key ``("numba-cuda", device)``.

Numeric contracts: see :mod:`bitfold.kernels.cuda`. In short, ``exact``
gives the same bits as on the CPU (the correctly rounded sum), ``ordered``
the same bits as the CPU ``ordered`` strategy (NaN results as the canonical
NaN), ``atomic`` whatever the float atomics give.

Values in bfloat16 (torch only) are widened to float32 first (exact) by
torch; every other dtype is read in place. Validation happens before this
module is reached (:mod:`bitfold.dispatch`); only what is particular to
device memory (contiguity, the device of a state) is checked here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import library_of
from ..errors import DeviceError, FoldError, FoldTypeError, ShapeError
from ..formats import dtype_name, limb_format_for
from ..validate import Values

if TYPE_CHECKING:
    from ..plan import Fold

NAME = "cuda"

_BITS_OF = {"float32": np.uint32, "float16": np.uint16, "float64": np.int64}


def _cuda() -> Any:
    from numba import cuda

    return cuda


def _kernels() -> Any:
    from ..kernels import cuda as kernels

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


def serves(device: str) -> bool:
    """The CUDA backend folds values that live on a CUDA device."""
    return device == "cuda"


def device_values(values: Any) -> DeviceValues:
    """Wrap GPU ``values`` for the kernels, or refuse them with a clear error."""
    lib = library_of(values)
    if lib == "torch":
        return _torch_values(values)
    if lib == "cupy":
        return _cupy_values(values)
    if lib == "jax":
        raise DeviceError(
            "JAX arrays are not folded by the numba-cuda kernels (JAX arrays are immutable and "
            "JAX owns their streams); use bitfold.jax, or pass a CuPy/torch array"
        )
    if getattr(values, "__cuda_ndarray__", False):  # numba device arrays (and the simulator's)
        return _numba_values(values, values, kind="numba")
    if hasattr(values, "__cuda_array_interface__"):
        iface = values.__cuda_array_interface__
        ptr = int(iface["data"][0])
        dev = _pointer_device(ptr) if ptr else None
        cuda = _cuda()
        if dev is None:
            dev = cuda.get_current_device().id
        with cuda.gpus[dev]:
            arr = cuda.as_cuda_array(values, sync=False)
        dv = _numba_values(values, arr, kind="numba")
        dv.device = dev
        dv.stream = _numba_stream(iface.get("stream"))
        return dv
    raise _host_error(values)


def _numba_values(original: Any, arr: Any, kind: str) -> DeviceValues:
    name = dtype_name(arr)
    if name not in _BITS_OF:
        raise FoldTypeError(f"GPU folds take float16, float32 or float64 values; got {name}")
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


def _torch_values(values: Any) -> DeviceValues:
    import torch

    if values.device.type != "cuda":
        raise _host_error(values)
    name = dtype_name(values)
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


def _cupy_values(values: Any) -> DeviceValues:
    import cupy

    name = dtype_name(values)
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
    order: Any
    offsets: Any
    launch: Any  # kernels.LaunchShape sized for the device


def device_plan(plan: Fold, device: int) -> DevicePlan:
    """The plan's data on ``device``: uploaded the first time the plan meets it, then kept.

    Must be called with ``device``'s context current.
    """

    def upload() -> DevicePlan:
        cuda = _cuda()
        kernels = _kernels()
        sm = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", None)
        launch = kernels.LaunchShape(max_blocks=2 * int(sm)) if sm else kernels.LaunchShape()
        return DevicePlan(
            int(device),
            cuda.to_device(plan.index),
            cuda.to_device(plan.counts),
            cuda.to_device(plan.order),
            cuda.to_device(plan.offsets),
            launch,
        )

    entry = plan.prepared(("numba-cuda", int(device)), upload)
    if entry.device != int(device):
        raise DeviceError(
            f"the plan's index data cached for CUDA device {entry.device} cannot serve values "
            f"on CUDA device {device}"
        )
    return entry


@contextmanager
def _on_device(plan: Fold, values: Any) -> Iterator[tuple[DeviceValues, DevicePlan, Any]]:
    """The wrapped values, the plan's data on their device and the kernels, in its context."""
    dv = device_values(values)
    with _cuda().gpus[dv.device]:
        yield dv, device_plan(plan, dv.device), _kernels()


# -- the strategies ----------------------------------------------------------------------------
def fold_exact(
    plan: Fold,
    values: Any,
    spec: Values,
    out_name: str,
    *,
    launch: Any = None,
    exact_path: str = "auto",
    init: Any = None,
) -> Any:
    """The exact fold on the values' device: the same bits as the CPU.

    ``init`` ((K,) + trailing, on the same device) adds one term to every
    bucket (the ``"buckets"`` path).

    ``exact_path`` is ``"auto"``, ``"shared"`` or ``"global"`` (per-block or
    global integer limbs, scalar folds only) or ``"buckets"`` (one thread an
    output element, summing its bucket in registers: rows, and scalar folds
    whose limbs would not fit in shared memory). ``launch`` (a
    :class:`bitfold.kernels.cuda.LaunchShape`) and the path tune the kernels;
    they never change the result.
    """
    with _on_device(plan, values) as (dv, entry, kernels):
        shape = launch or entry.launch
        K, D = plan.K, spec.row_size
        source = "float32" if dv.dtype == "bfloat16" else dv.dtype
        fmt = limb_format_for(source)
        if exact_path == "auto":
            scalar_path = kernels.exact_path(K, fmt)
            rows_or_init = spec.trailing or init is not None
            exact_path = "buckets" if rows_or_init or scalar_path == "global" else scalar_path
        if (spec.trailing or init is not None) and exact_path != "buckets":
            raise FoldError(
                f"exact_path {exact_path!r} folds scalars only, into zeros; folds of rows or "
                "into an existing array take 'buckets'"
            )
        # bfloat16 results: torch gets bfloat16; other libraries the float32 holding them
        widen = out_name == "bfloat16" and dv.kind != "torch"
        out, out_bits = _empty(dv, (K, D), kernels.out_bits_dtype(out_name, widen))
        if exact_path == "buckets":
            rows = dv.array.reshape(spec.positions, D)
            start = start_bits = None
            if init is not None:
                start = _same_dtype(device_values(init), source, dv).array.reshape(K, D)
                start_bits = start.view(_BITS_OF[source])
            kernels.launch_buckets(
                rows, rows.view(_BITS_OF[source]), entry.order, entry.offsets, source, out_name,
                out_bits, dv.stream, widen_bfloat16=widen, init=start, init_bits=start_bits,
            )  # fmt: skip
        else:
            _, state = _empty(dv, (K, fmt.width), np.int64)
            kernels.launch_zero(state.reshape(K * fmt.width), dv.stream, shape)
            kernels.launch_exact(
                entry.index, dv.array.view(_BITS_OF[source]), source, state, entry.counts,
                dv.stream, shape=shape, path=exact_path, count_terms=False,
            )  # fmt: skip
            kernels.launch_round(state, entry.counts, True, fmt, out_name,
                                 out_bits.reshape(K), dv.stream, widen_bfloat16=widen)  # fmt: skip
        return _shaped(_view(out, dv.kind, "float32" if widen else out_name), dv.kind, K, spec)


def _same_dtype(iv: DeviceValues, source: str, dv: DeviceValues) -> DeviceValues:
    """``init``'s device values in the values' dtype (refused if that would round)."""
    if iv.device != dv.device:
        raise DeviceError(
            f"init lives on CUDA device {iv.device} and the values on CUDA device {dv.device}"
        )
    name = "float32" if iv.dtype == "bfloat16" else iv.dtype
    if name != source:
        raise FoldTypeError(
            f"on the GPU, init must have the values' dtype ({source}); got {iv.dtype}"
        )
    return iv


def _shaped(out: Any, kind: str, K: int, spec: Values) -> Any:
    """A (K, D) result as ``(K,) + trailing``."""
    shape = (K, *spec.trailing)
    return out.reshape(shape)


def fold_ordered(
    plan: Fold, values: Any, spec: Values, out_name: str, *, launch: Any = None, init: Any = None
) -> Any:
    """The ``ordered`` fold on the device: the same bits as the CPU ``ordered`` strategy."""
    if init is not None:
        raise FoldError("the GPU ordered fold adds into zeros only; use 'exact' with init")
    with _on_device(plan, values) as (dv, entry, kernels):
        D = spec.row_size
        out, out_bits = _empty(dv, (plan.K, D), kernels.out_bits_dtype(out_name))
        out_f = out_bits.view(np.dtype(out_name))
        kernels.launch_ordered(entry.order, entry.offsets, dv.array.reshape(spec.positions, D),
                               out_f, out_bits, out_name, dv.stream)  # fmt: skip
        return _shaped(_view(out, dv.kind, out_name), dv.kind, plan.K, spec)


def fold_atomic(
    plan: Fold, values: Any, spec: Values, out_name: str, *, launch: Any = None, init: Any = None
) -> Any:
    """Float atomics (float32, or float64 for float64 output); a float16 result is rounded once."""
    if init is not None:
        raise FoldError("the GPU atomic fold adds into zeros only; use 'exact' with init")
    with _on_device(plan, values) as (dv, entry, kernels):
        shape = launch or entry.launch
        K, D = plan.K, spec.row_size
        acc_name = "float64" if out_name == "float64" else "float32"
        acc_obj, acc = _empty(dv, (K, D), np.dtype(acc_name))
        kernels.launch_zero(acc.reshape(K * D), dv.stream, shape)
        kernels.launch_atomic(entry.index, dv.array.reshape(spec.positions, D), acc, acc_name,
                              dv.stream, shape=shape)  # fmt: skip
        if out_name == acc_name:
            return _shaped(acc_obj, dv.kind, K, spec)
        out, out_view = _empty(dv, (K, D), np.float16)
        kernels.launch_cast_f16(acc.reshape(K * D), out_view.reshape(K * D), dv.stream)
        return _shaped(out, dv.kind, K, spec)


def expand(plan: Fold, v: Any, trailing: tuple[int, ...] = ()) -> Any:
    """``v[index]`` in the index's shape (then ``trailing``), on ``v``'s device and library."""
    lib = library_of(v)
    if lib == "torch":
        import torch

        idx = plan.prepared(
            ("torch-index", str(v.device)),
            lambda: torch.from_numpy(plan.index.astype(np.int64)).to(v.device),
        )
        return v[idx].reshape(plan.shape + trailing)
    if lib == "cupy":
        import cupy

        with cupy.cuda.Device(v.device.id):
            idx = plan.prepared(("cupy-index", int(v.device.id)), lambda: cupy.asarray(plan.index))
            return cupy.take(v, idx, axis=0).reshape(plan.shape + trailing)
    from ..arrays import to_numpy

    cuda = _cuda()
    return cuda.to_device(np.take(to_numpy(v), plan.index, axis=0).reshape(plan.shape + trailing))


# -- exact states on the device ----------------------------------------------------------------
def exact_state(
    plan: Fold, values: Any, state: Any = None, *, start: int = 0, launch: Any = None
) -> Any:
    """The exact accumulator state of GPU ``values``, or ``values`` added into ``state``.

    ``values`` cover the plan's positions ``start .. start + values.size``.
    Returns (or updates in place and returns) a ``(K, L + 5)`` int64 array of
    the values' kind and device, in the layout of
    :attr:`bitfold.ExactAccumulator.state`; it equals, bit for bit, the state
    of ``plan.accumulator(dtype, kernel="limbs").add(values, start=start)`` on
    the CPU, so it can be copied to the host and given to
    :meth:`bitfold.ExactAccumulator.from_state`, or summed over devices and
    processes (an all-reduce with SUM) before rounding. A ``state`` on another
    device than ``values`` is refused with :class:`bitfold.DeviceError`.
    """
    dv = device_values(values)
    source = "float32" if dv.dtype == "bfloat16" else dv.dtype
    cuda = _cuda()
    kernels = _kernels()
    fmt = limb_format_for(source)
    width = fmt.width
    n = int(dv.array.shape[0])
    with cuda.gpus[dv.device]:
        entry = device_plan(plan, dv.device)
        shape = launch or entry.launch
        if start == 0 and n == plan.size:
            index, counts = entry.index, entry.counts
        else:
            index = entry.index[start : start + n]
            counts = cuda.to_device(np.bincount(plan.index[start : start + n], minlength=plan.K))
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
            kernels.launch_settle(view, counts, False, fmt, dv.stream)
        kernels.launch_exact(
            index, dv.array.view(_BITS_OF[source]), source, view, counts, dv.stream, shape=shape
        )
    return result


def add_to_state(
    state: np.ndarray, plan: Fold, values: Any, spec: Values, fmt: Any, **options: Any
) -> None:
    """Add GPU ``values`` into the host state ``state`` (the device state is copied back once).

    Rows are copied to the host and added there (an accumulator of rows keeps
    its state on the host).
    """
    from . import host

    if spec.trailing:
        host.add_to_state(state, plan, values, spec, fmt)
        return
    device_state = exact_state(plan, values, start=spec.start, **options)
    merge_states = host.merge_states
    merge_states(state, device_values_of_state(device_state).array.copy_to_host(), fmt)


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


__all__ = [
    "NAME",
    "DevicePlan",
    "DeviceValues",
    "add_to_state",
    "device_plan",
    "device_values",
    "exact_state",
    "expand",
    "fold_atomic",
    "fold_exact",
    "fold_ordered",
    "serves",
]
