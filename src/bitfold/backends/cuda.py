"""The CUDA backend: folds of GPU arrays, on their device and stream, with the numba-cuda kernels.

It serves values that live on a CUDA device — a CuPy array, a torch CUDA
tensor, a numba device array, or any object with ``__cuda_array_interface__``
— and returns the K sums as the same kind of array (a numba device array for
other interface objects), on the same device. Kernels are launched on the
stream the values' library is using: torch's current stream of that device,
CuPy's current stream, the numba array's own stream, or the ``stream`` entry
of the interface (the default stream when it has none). Nothing waits for
the host: the call returns once the work is queued, and every step (the
accumulation, the rounding) is a kernel, so the call may be captured in a
CUDA graph after a first, warm-up call (which compiles the kernels, uploads
the plan and allocates the scratch buffers).

The plan's index data (index, counts, sorted order and offsets) is uploaded
once per device, the first time the plan meets that device, through
:meth:`bitfold.Fold.prepared` under the device's :class:`UploadKey`: the
copies run on the values' stream and the host waits for them once, so every
stream may use the arrays afterwards. Scratch buffers (the exact state of a
scalar fold, the state of the hot buckets of a fold of rows, the gathered
values of an ordered fold) are allocated once per plan, device and shape and
shared by every stream: a fold holds a buffer's lock, makes its stream wait
for the event that marks the end of the buffer's previous use (on whatever
stream, host thread or graph replay it ran) and records the event again at its
end. Inside a CUDA graph capture the wait and the record are external event
nodes, so a capture allocates nothing but the result, which the values' own
library makes (torch's caching allocator and CuPy's memory pool can be used
during graph capture; numba device arrays and other ``__cuda_array_interface__``
objects get a driver allocation, which cannot). A first call inside a capture,
which would have to upload or allocate, is refused with a clear error.

Numeric contracts: see :mod:`bitfold.kernels.cuda`. In short, ``exact``
gives the same bits as on the CPU (the correctly rounded sum), ``ordered``
the same bits as the CPU ``ordered`` strategy (NaN results as the canonical
NaN), ``atomic`` whatever the float atomics give.

Values in bfloat16 (torch only) are read as their 16-bit patterns by the
exact kernels (no copy); ``ordered`` and ``atomic`` widen them to float32
first (exact) with torch. Every other dtype is read in place. Validation happens before this
module is reached (:mod:`bitfold.dispatch`); only what is particular to
device memory (contiguity, the device of a state) is checked here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arrays import is_cuda_array, library_of, to_numpy
from ..errors import DeviceError, FoldError, FoldTypeError, ShapeError
from ..formats import LimbFormat, dtype_name, limb_format_for
from ..plan_view import DeviceKey, PlanView
from ..validate import Values
from . import host_state, selftest
from .device_plan import index_tensor
from .registry import Backend, InitRule

NAME = "cuda"

_BITS_OF = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16, "float64": np.int64}


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
    array: Any  # flat numba device array: float16/32/64 values, or bfloat16's uint16 bits
    dtype: str  # dtype name of the values as given (bfloat16 included)
    keep: Any = None  # converted copy that ``array`` points into, kept alive

    @property
    def bits(self) -> Any:
        """The values' bit patterns (the view the exact kernels decode)."""
        return self.array.view(_BITS_OF[self.dtype])

    def floats(self) -> Any:
        """The values as a numba float array: bfloat16 widened to float32 (exact, by torch)."""
        if self.dtype != "bfloat16":
            return self.array
        import torch

        wide = self.keep.view(torch.bfloat16).float()
        self.keep = (self.keep, wide)
        return _cuda().as_cuda_array(wide, sync=False)


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
        _, dev, stream = _home(values)
        cuda = _cuda()
        with cuda.gpus[dev]:
            arr = cuda.as_cuda_array(values, sync=False)
        dv = _numba_values(values, arr, kind="numba")
        dv.device, dv.stream = dev, stream
        return dv
    raise _host_error(values)


def _home(x: Any) -> tuple[str, int, Any]:
    """``(kind, device, stream)`` of a GPU array of any dtype: the kind of array made beside
    it (``"torch"``, ``"cupy"`` or ``"numba"``), its CUDA device, and the numba stream its
    library is using there (torch's or CuPy's current stream, a numba array's own, the
    interface's ``stream`` entry; the default stream when it has none)."""
    lib = library_of(x)
    if lib == "torch":
        import torch

        if x.device.type != "cuda":
            raise _host_error(x)
        handle = int(torch.cuda.current_stream(x.device).cuda_stream)
        return "torch", int(x.device.index), _numba_stream(handle)
    if lib == "cupy":
        import cupy

        dev = int(x.device.id)
        with cupy.cuda.Device(dev):
            return "cupy", dev, _numba_stream(int(cupy.cuda.get_current_stream().ptr))
    if getattr(x, "__cuda_ndarray__", False):  # numba device arrays (and the simulator's)
        return "numba", _numba_array_device(x), getattr(x, "stream", 0) or _numba_stream(None)
    if hasattr(x, "__cuda_array_interface__"):
        iface = x.__cuda_array_interface__
        ptr = int(iface["data"][0])
        dev = _pointer_device(ptr) if ptr else None
        if dev is None:
            dev = _cuda().get_current_device().id
        return "numba", int(dev), _numba_stream(iface.get("stream"))
    raise _host_error(x)


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
    t = values.detach().contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)  # the bits, read by the exact kernels; numba has no bfloat16
    dev = int(t.device.index)
    cuda = _cuda()
    with cuda.gpus[dev]:
        arr = cuda.as_cuda_array(t, sync=False)
    if name == "bfloat16":
        arr = arr.view(np.uint16)
    return DeviceValues("torch", dev, _home(t)[2], arr, name, keep=t)


def _cupy_values(values: Any) -> DeviceValues:
    import cupy

    name = dtype_name(values)
    dev = int(values.device.id)
    cuda = _cuda()
    with cupy.cuda.Device(dev):
        a = cupy.ascontiguousarray(values).reshape(-1)
    with cuda.gpus[dev]:
        arr = cuda.as_cuda_array(a, sync=False)
    return DeviceValues("cupy", dev, _home(a)[2], arr, name, keep=a)


# -- results, allocated in the values' library -----------------------------------------------
def _empty(dv: DeviceValues | _StateView, shape: tuple[int, ...], dtype: Any) -> tuple[Any, Any]:
    """``(array of dv's kind, numba view of it)``: uninitialised, on dv's device (a numba
    array is bound to dv's stream)."""
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


# -- streams: ordering and graph capture ---------------------------------------------------
def capturing(stream: Any) -> bool:
    """Whether ``stream`` (a numba stream) is capturing a CUDA graph; False on the simulator."""
    if _kernels()._SIMULATOR:
        return False
    from numba.cuda.cudadrv.driver import binding, driver

    status = driver.cuStreamIsCapturing(_raw_stream(stream))
    return status != binding.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _raw_stream(stream: Any) -> Any:
    """The driver handle of a numba stream (or of 0, the default stream)."""
    from numba.cuda.cudadrv.driver import binding

    handle = getattr(stream, "handle", None)
    return handle if handle is not None else binding.CUstream(0)


def _wait_event(stream: Any, event: Any, in_capture: bool) -> None:
    """``stream`` waits for ``event``'s last record; in a capture, as an external event node."""
    if _kernels()._SIMULATOR:
        return  # the simulator runs every launch to completion, in call order
    from numba.cuda.cudadrv.driver import binding, driver

    flags = binding.CUevent_wait_flags.CU_EVENT_WAIT_EXTERNAL if in_capture else 0
    driver.cuStreamWaitEvent(_raw_stream(stream), event.handle, int(flags))


def _record_event(event: Any, stream: Any, in_capture: bool) -> None:
    """Record ``event`` on ``stream``; in a capture, as an external record node of the graph."""
    if _kernels()._SIMULATOR:
        return
    from numba.cuda.cudadrv.driver import binding, driver

    flags = binding.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL if in_capture else 0
    driver.cuEventRecordWithFlags(event.handle, _raw_stream(stream), int(flags))


def _refuse_in_capture(stream: Any, what: str) -> None:
    """Raise a clear error instead of a driver allocation or copy inside a graph capture."""
    if capturing(stream):
        raise FoldError(
            f"{what} needs a device allocation or a copy from the host, which a CUDA graph "
            "capture does not allow: call the fold once on this device, with the same shapes, "
            "before capturing it (a warm-up call prepares everything a captured call uses)"
        )


# -- the plan on a device ----------------------------------------------------------------------
@dataclass
class Scratch:
    """A device buffer of one plan on one device, reused by every fold on any stream.

    Uses are ordered on the device as well as on the host: :meth:`use` holds
    ``lock`` (one fold at a time from the host's threads), makes the fold's
    stream wait for ``event`` (the end of the previous fold that used the
    buffer, on whatever stream it ran), and records ``event`` again at the end
    of this fold. Inside a CUDA graph capture the wait and the record are
    external event nodes of the graph, so replays are ordered with eager folds
    too, and a capture allocates nothing. ``dirty`` is set while a fold uses
    the buffer, so a fold interrupted between its launches leaves a buffer
    that the next one zeroes first.
    """

    array: Any
    event: Any = None  # numba event (no timing); None on the simulator's first use
    used: bool = False  # ``event`` has been recorded at least once
    dirty: bool = False
    uses: int = 0
    waits: int = 0  # how many uses waited for an earlier one (tests read it)
    lock: threading.RLock = field(default_factory=threading.RLock)

    @contextmanager
    def use(self, stream: Any) -> Iterator[Any]:
        """The buffer, for launches on ``stream`` ordered after every earlier use of it."""
        with self.lock:
            in_capture = capturing(stream)
            if self.used:
                _wait_event(stream, self.event, in_capture)
                self.waits += 1
            try:
                yield self.array
            finally:
                _record_event(self.event, stream, in_capture)
                self.used = True
                self.uses += 1


@dataclass(frozen=True)
class ScratchKey:
    """The key of a scratch buffer among a :class:`UploadedPlan`'s: its name, shape and dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass
class UploadedPlan:
    """A plan's index data on one CUDA device (numba device arrays), uploaded once."""

    device: int
    index: Any
    counts: Any
    order: Any
    offsets: Any
    launch: Any  # kernels.LaunchShape sized for the device
    limits: Any  # kernels.DeviceLimits of the device
    scratch: dict[ScratchKey, Scratch] = field(default_factory=dict)
    # segment length -> kernels.DeviceHotSegmentTable
    hot: dict[int, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def buffer(
        self, dv: DeviceValues, name: str, shape: tuple[int, ...], dtype: Any, zeroed: bool
    ) -> Scratch:
        """The plan's scratch buffer ``name`` of this shape on this device, made the first time.

        The same buffer serves every stream (:meth:`Scratch.use` orders the
        folds); it is allocated, and zeroed with a kernel, on ``dv``'s stream
        by the first fold that needs it, which therefore cannot be inside a
        graph capture (refused with a clear error).
        """
        key = ScratchKey(name, tuple(shape), np.dtype(dtype).str)
        with self.lock:
            found = self.scratch.get(key)
            if found is None:
                _refuse_in_capture(dv.stream, f"the first GPU fold's scratch buffer {name!r}")
                cuda = _cuda()
                kernels = _kernels()
                array = cuda.device_array(shape, dtype, stream=dv.stream)
                if zeroed:
                    kernels.launch_zero(array.reshape(int(np.prod(shape))), dv.stream)
                event = None if kernels._SIMULATOR else cuda.event(timing=False)
                found = self.scratch[key] = Scratch(array, event)
                if event is not None:  # later folds on other streams wait for the zeroing
                    _record_event(event, dv.stream, False)
                    found.used = True
            return found

    def hot_segment_table(self, dv: DeviceValues, plan: PlanView, length: int) -> Any:
        """The hot buckets of the plan for segments of ``length`` positions, on the device."""
        with self.lock:
            found = self.hot.get(length)
            if found is None:
                kernels = _kernels()
                table = kernels.hot_segment_table(plan.offsets, length)
                if table.hot:
                    _refuse_in_capture(dv.stream, "the first GPU fold of rows with hot buckets")
                    arrays = _upload(dv.stream, table.buckets, table.starts, table.segment_bucket)
                else:
                    arrays = (None, None, None)
                found = self.hot[length] = kernels.DeviceHotSegmentTable(
                    table.length, table.hot, table.segments, *arrays
                )
            return found


def _upload(stream: Any, *arrays: np.ndarray) -> tuple[Any, ...]:
    """Copy host arrays to the device on ``stream`` and wait for the copies, once.

    The copies are ordered on the stream in use (not the legacy default
    stream, which a non-blocking stream does not wait for), and the host waits
    for them before the arrays are shared with folds on other streams.
    """
    cuda = _cuda()
    out = tuple(cuda.to_device(np.ascontiguousarray(a), stream=stream) for a in arrays)
    stream.synchronize()
    return out


class UploadKey(DeviceKey):
    """The key of a plan's index data uploaded to one CUDA device (a :class:`UploadedPlan`)."""


def uploaded_plan(plan: PlanView, device: int, stream: Any = None) -> UploadedPlan:
    """The plan's data on ``device``: uploaded the first time the plan meets it, then kept.

    Must be called with ``device``'s context current. The upload runs on
    ``stream`` (the default stream when None) and the host waits for it, so
    the arrays are ready for every stream afterwards; it cannot happen inside
    a graph capture (refused with a clear error).
    """

    def upload() -> UploadedPlan:
        cuda = _cuda()
        kernels = _kernels()
        on = stream if stream is not None else cuda.default_stream()
        _refuse_in_capture(on, "the first GPU fold of a plan on a device (the plan's upload)")
        limits = kernels.device_limits(cuda.get_current_device())
        index, counts, order, offsets = _upload(
            on, plan.index, plan.counts, plan.order, plan.offsets
        )
        return UploadedPlan(
            int(device), index, counts, order, offsets,
            kernels.LaunchShape(max_blocks=2 * limits.sms), limits,
        )  # fmt: skip

    entry = plan.prepared(UploadKey(int(device)), upload)
    if entry.device != int(device):
        raise DeviceError(
            f"the plan's index data cached for CUDA device {entry.device} cannot serve values "
            f"on CUDA device {device}"
        )
    return entry


@contextmanager
def _on_device(plan: PlanView, values: Any) -> Iterator[tuple[DeviceValues, UploadedPlan, Any]]:
    """The wrapped values, the plan's data on their device and the kernels, in its context."""
    dv = device_values(values)
    with _cuda().gpus[dv.device]:
        yield dv, uploaded_plan(plan, dv.device, dv.stream), _kernels()


# -- the strategies ----------------------------------------------------------------------------
def fold_exact(
    plan: PlanView,
    values: Any,
    spec: Values,
    out_name: str,
    *,
    launch: Any = None,
    exact_path: str = "auto",
    init: Any = None,
    segment: int | None = None,
) -> Any:
    """The exact fold on the values' device: the same bits as the CPU.

    ``init`` ((K,) + trailing, on the same device) adds one term to every
    bucket (the ``"buckets"`` path).

    ``exact_path`` is ``"auto"``, ``"shared"`` or ``"global"`` (per-block or
    global integer limbs, scalar folds only) or ``"buckets"`` (one thread an
    output element, summing its bucket in registers: rows, and scalar folds
    whose limbs would not fit in shared memory). ``"auto"`` takes
    ``"shared"`` for scalar folds whose K buckets' limbs fit in a block's
    shared memory (up to the device's opt-in limit: 227 KB on an H100/H200,
    2,400 buckets of float32 values, 420 of float64), else ``"buckets"``; a
    ``"shared"`` path that does not fit is refused. ``launch`` (a
    :class:`bitfold.kernels.cuda.LaunchShape`) and the path tune the kernels;
    they never change the result; nor does ``segment`` (the positions a
    thread of the ``"buckets"`` path sums at most; longer buckets are split).
    """
    with _on_device(plan, values) as (dv, entry, kernels):
        K, D = plan.K, spec.row_size
        fmt = limb_format_for(dv.dtype)
        rows_or_init = bool(spec.trailing) or init is not None
        nbytes = kernels.shared_bytes(K, fmt)
        limit = entry.limits.shared_per_block
        if exact_path == "auto":
            scalar_path = kernels.exact_path(K, fmt, limit)
            exact_path = "buckets" if rows_or_init or scalar_path == "global" else scalar_path
            state_shape = (K, fmt.width)
            if exact_path == "shared" and not kernels.allow_dynamic_shared(
                kernels.exact_shared_kernel(dv.dtype),
                (entry.index, dv.bits, 0, spec.positions,
                 entry.buffer(dv, "exact-state", state_shape, np.int64, zeroed=True).array),
                nbytes,
            ):  # fmt: skip
                exact_path = "buckets"  # the driver would not give the shared memory
        if rows_or_init and exact_path != "buckets":
            raise FoldError(
                f"exact_path {exact_path!r} folds scalars only, into zeros; folds of rows or "
                "into an existing array take 'buckets'"
            )
        if exact_path == "shared" and nbytes > limit:
            raise FoldError(
                f"exact_path='shared' needs {nbytes:,} bytes of shared memory a block for K = "
                f"{K:,} buckets of {dv.dtype} values ({kernels.shared_bytes(1, fmt)} bytes a "
                f"bucket); CUDA device {dv.device} allows {limit:,} — use exact_path='auto' or "
                "'buckets', which serve any K"
            )
        # bfloat16 results: torch gets bfloat16; other libraries the float32 holding them
        widen = out_name == "bfloat16" and dv.kind != "torch"
        out, out_bits = _empty(dv, (K, D), kernels.out_bits_dtype(out_name, widen))
        if exact_path == "buckets":
            _fold_buckets(plan, kernels, entry, dv, spec, out_name, out_bits, widen, init, segment)
        else:
            shape = launch or (
                entry.limits.shared_launch(nbytes) if exact_path == "shared" else entry.launch
            )
            scratch = entry.buffer(dv, "exact-state", (K, fmt.width), np.int64, zeroed=True)
            with scratch.use(dv.stream) as state:
                if scratch.dirty:
                    kernels.launch_zero(state.reshape(K * fmt.width), dv.stream, shape)
                scratch.dirty = True
                kernels.launch_exact(
                    entry.index, dv.bits, dv.dtype, state, entry.counts, dv.stream, shape=shape,
                    path=exact_path, count_terms=False, shared_limit=limit,
                )  # fmt: skip
                kernels.launch_round(state, entry.counts, True, fmt, out_name, out_bits.reshape(K),
                                     dv.stream, widen_bfloat16=widen, clear=True)  # fmt: skip
                scratch.dirty = False
        return _shaped(_view(out, dv.kind, "float32" if widen else out_name), dv.kind, K, spec)


def explain_route(
    plan: PlanView, values: Any, spec: Values, *, exact_path: str = "auto", launch: Any = None
) -> tuple[str, str]:
    """``(path, reason)``: the exact path :func:`fold_exact` takes for these values, and why.

    Reads the device's shared-memory limit (the plan is uploaded to the
    device if it was not); a ``"shared"`` path the driver then refuses to
    launch falls back to ``"buckets"`` in :func:`fold_exact`.
    """
    if exact_path != "auto":
        return exact_path, f"forced (exact_path={exact_path!r})"
    if spec.trailing:
        return "buckets", "rows: a thread an output element sums its bucket in registers"
    with _on_device(plan, values) as (dv, entry, kernels):
        fmt = limb_format_for(dv.dtype)
        limit = entry.limits.shared_per_block
        nbytes = kernels.shared_bytes(plan.K, fmt)
        path = kernels.exact_path(plan.K, fmt, limit)
    if path == "shared":
        return "shared", (f"{dv.dtype} scalars into {plan.K:,} buckets: their limbs "
                          f"({nbytes:,} bytes) fit in a block's shared memory ({limit:,})")
    return "buckets", (f"{dv.dtype} scalars into {plan.K:,} buckets: their limbs "
                       f"({nbytes:,} bytes) exceed a block's shared memory ({limit:,})")


def _fold_buckets(
    plan: PlanView, kernels: Any, entry: UploadedPlan, dv: DeviceValues, spec: Values,
    out_name: str, out_bits: Any, widen: bool, init: Any, segment: int | None,
) -> None:  # fmt: skip
    """The ``"buckets"`` path: a thread an output element sums its bucket and rounds it.

    Buckets of more than a segment's positions (hot buckets: K = 1, a Zipf
    map's head) are split into segments that many threads, in many blocks,
    sum into integer limbs with order-free atomics, then rounded once
    (:func:`bitfold.kernels.cuda.launch_buckets`); ``segment`` (tests) sets
    the segment length, else :func:`bitfold.kernels.cuda.segment_length`
    balances the work over the device's resident threads.
    """
    K, D = int(out_bits.shape[0]), spec.row_size
    bits = dv.bits.reshape(spec.positions, D)
    rows = bits if dv.dtype == "bfloat16" else dv.array.reshape(spec.positions, D)
    start = start_bits = None
    if init is not None:
        iv = _same_dtype(device_values(init), dv)
        start_bits = iv.bits.reshape(K, D)
        start = start_bits if dv.dtype == "bfloat16" else iv.array.reshape(K, D)
    fmt = limb_format_for(dv.dtype)
    length = segment or kernels.segment_length(
        spec.positions, D, fmt.width, entry.limits.sms * entry.limits.threads_per_sm
    )
    hot = entry.hot_segment_table(dv, plan, int(length))
    if not hot.hot:
        kernels.launch_buckets(
            rows, bits, entry.order, entry.offsets, dv.dtype, out_name, out_bits, dv.stream,
            widen_bfloat16=widen, init=start, init_bits=start_bits,
        )  # fmt: skip
        return
    scratch = entry.buffer(dv, "hot-state", (hot.hot * D, fmt.width), np.int64, zeroed=True)
    with scratch.use(dv.stream) as state:
        if scratch.dirty:
            kernels.launch_zero(state.reshape(hot.hot * D * fmt.width), dv.stream)
        scratch.dirty = True
        kernels.launch_buckets(
            rows, bits, entry.order, entry.offsets, dv.dtype, out_name, out_bits, dv.stream,
            widen_bfloat16=widen, init=start, init_bits=start_bits, hot=hot, hot_state=state,
        )  # fmt: skip
        scratch.dirty = False


def _same_dtype(iv: DeviceValues, dv: DeviceValues) -> DeviceValues:
    """``init``'s device values, refused unless in the values' dtype and on their device."""
    if iv.device != dv.device:
        raise DeviceError(
            f"init lives on CUDA device {iv.device} and the values on CUDA device {dv.device}"
        )
    if iv.dtype != dv.dtype:
        raise FoldTypeError(
            f"on the GPU, init must have the values' dtype ({dv.dtype}); got {iv.dtype}"
        )
    return iv


def _shaped(out: Any, kind: str, K: int, spec: Values) -> Any:
    """A (K, D) result as ``(K,) + trailing``."""
    shape = (K, *spec.trailing)
    return out.reshape(shape)


def fold_ordered(
    plan: PlanView, values: Any, spec: Values, out_name: str, *, launch: Any = None
) -> Any:
    """The ``ordered`` fold on the device: the same bits as the CPU ``ordered`` strategy."""
    with _on_device(plan, values) as (dv, entry, kernels):
        D = spec.row_size
        rows = dv.floats().reshape(spec.positions, D)
        out, out_bits = _empty(dv, (plan.K, D), kernels.out_bits_dtype(out_name))
        out_f = out_bits.view(np.dtype(out_name))
        scratch = entry.buffer(dv, "ordered-gather", tuple(rows.shape), rows.dtype, zeroed=False)
        with scratch.use(dv.stream) as gathered:
            kernels.launch_ordered(entry.order, entry.offsets, rows, gathered, out_f,
                                   out_bits, out_name, dv.stream, shape=entry.launch)  # fmt: skip
        return _shaped(_view(out, dv.kind, out_name), dv.kind, plan.K, spec)


def fold_atomic(
    plan: PlanView, values: Any, spec: Values, out_name: str, *, launch: Any = None
) -> Any:
    """Float atomics (float32, or float64 for float64 output); a float16 result is rounded once."""
    with _on_device(plan, values) as (dv, entry, kernels):
        shape = launch or entry.launch
        K, D = plan.K, spec.row_size
        acc_name = "float64" if out_name == "float64" else "float32"
        acc_obj, acc = _empty(dv, (K, D), np.dtype(acc_name))
        kernels.launch_zero(acc.reshape(K * D), dv.stream, shape)
        kernels.launch_atomic(entry.index, dv.floats().reshape(spec.positions, D), acc,
                              acc_name, dv.stream, shape=shape)  # fmt: skip
        if out_name == acc_name:
            return _shaped(acc_obj, dv.kind, K, spec)
        out, out_view = _empty(dv, (K, D), np.float16)
        kernels.launch_cast_f16(acc.reshape(K * D), out_view.reshape(K * D), dv.stream)
        return _shaped(out, dv.kind, K, spec)


class CupyIndexKey(DeviceKey):
    """The key of a plan's flat index as a CuPy array on one CUDA device (CuPy's gather)."""


def expand(plan: PlanView, v: Any, trailing: tuple[int, ...] = ()) -> Any:
    """``v[index]`` in the index's shape (then ``trailing``), on ``v``'s device and library."""
    lib = library_of(v)
    if lib == "torch":
        idx = index_tensor(plan, v.device)  # the plan's one torch index there
        return v[idx].reshape(plan.shape + trailing)
    if lib == "cupy":
        import cupy

        with cupy.cuda.Device(v.device.id):
            key = CupyIndexKey(int(v.device.id))
            idx = plan.prepared(key, lambda: cupy.asarray(plan.index))
            return cupy.take(v, idx, axis=0).reshape(plan.shape + trailing)
    from ..arrays import to_numpy

    cuda = _cuda()
    return cuda.to_device(np.take(to_numpy(v), plan.index, axis=0).reshape(plan.shape + trailing))


# -- exact states on the device ----------------------------------------------------------------
def exact_state(
    plan: PlanView, values: Any, state: Any = None, *, start: int = 0, launch: Any = None
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
    cuda = _cuda()
    kernels = _kernels()
    fmt = limb_format_for(dv.dtype)
    width = fmt.width
    n = int(dv.array.shape[0])
    with cuda.gpus[dv.device]:
        entry = uploaded_plan(plan, dv.device, dv.stream)
        shape = launch or entry.launch
        if start == 0 and n == plan.size:
            index, counts = entry.index, entry.counts
        else:
            index = entry.index[start : start + n]
            # the counts of this range, copied on the values' stream (ordered with the kernels)
            _refuse_in_capture(dv.stream, "an exact state of part of a plan's positions")
            part = np.bincount(plan.index[start : start + n], minlength=plan.K).astype(np.int64)
            counts = cuda.to_device(part, stream=dv.stream)
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
        kernels.launch_exact(index, dv.bits, dv.dtype, view, counts, dv.stream, shape=shape,
                             shared_limit=entry.limits.shared_per_block)  # fmt: skip
    return result


def new_state(K: int, fmt: LimbFormat, trailing: tuple[int, ...] = (), like: Any = None) -> Any:
    """A zero state ``(K, L + 5)`` int64 beside ``like`` (GPU values, or a state): an array
    of ``like``'s kind on its device, zeroed by a kernel on its stream.

    Rows (``trailing`` not empty) and a host or absent ``like`` get a host NumPy
    state: the device kernels add scalars into a state (:func:`exact_state`),
    while rows are folded bucket by bucket with no state, so an accumulator of
    rows sums on the host (:func:`add_to_state`).
    """
    if trailing or like is None or isinstance(like, np.ndarray):
        return host_state.new_state(K, fmt, trailing)
    kind, device, stream = _home(like)
    where = _StateView(device, None, kind, stream)
    with _cuda().gpus[device]:
        state, view = _empty(where, (K, fmt.width), np.int64)
        _kernels().launch_zero(view.reshape(K * fmt.width), stream)
    return state


def add_to_state(state: Any, plan: PlanView, values: Any, spec: Values, fmt: LimbFormat,
                 **options: Any) -> Any:  # fmt: skip
    """Add GPU ``values`` (plan positions ``spec.start ..``) into ``state`` exactly; ``state``.

    A device state (:func:`new_state`) is added to in place on the values'
    stream (:func:`exact_state`: no copy to or from the host). A host state
    gets the values' device state copied back once, on the values' stream;
    rows are copied to the host and added there.
    """
    if not isinstance(state, np.ndarray):
        return exact_state(plan, values, state, start=spec.start, **options)
    if spec.trailing:
        return host_state.add_to_state(state, plan, values, spec, fmt)
    dv = device_values(values)
    device_state = exact_state(plan, values, start=spec.start, **options)
    with _cuda().gpus[dv.device]:
        # the state was written on the values' stream (torch's or CuPy's current stream, which
        # need not wait for the legacy default stream): copy it on that stream, then wait for it
        view = device_values_of_state(device_state).array
        host_copy = view.copy_to_host(stream=dv.stream)
        dv.stream.synchronize()
    return host_state.merge_states(state, host_copy, fmt)


def merge_states(into: Any, other: Any, fmt: LimbFormat) -> Any:
    """``into + other``, carried: two states of one plan and format; ``into``, updated.

    Integer addition, exact in any order. Two device states add on
    ``into``'s device and stream (:func:`bitfold.kernels.cuda.launch_merge`:
    added, then carried as the host's merge normalises); a host ``other``, or
    one on another device, is copied there first (exact: integers). A host
    ``into`` (an accumulator of rows) merges on the host.
    """
    if isinstance(into, np.ndarray):
        return host_state.merge_states(into, to_numpy(other), fmt)
    st = device_values_of_state(into)
    cuda = _cuda()
    with cuda.gpus[st.device]:
        if not is_cuda_array(other) or device_values_of_state(other).device != st.device:
            _refuse_in_capture(st.stream, "merging a state from the host or another device")
            host = np.ascontiguousarray(to_numpy(other), dtype=np.int64)
            theirs = cuda.to_device(host, stream=st.stream)
        else:
            theirs = device_values_of_state(other).array
        rows = int(np.prod(st.array.shape[:-1]))
        _kernels().launch_merge(st.array.reshape(rows, fmt.width),
                                theirs.reshape(rows, fmt.width), fmt, st.stream)  # fmt: skip
    return into


def round_state(state: Any, fmt: LimbFormat, out_name: str) -> Any:
    """Round every element of ``state`` once to ``out_name``: the bits of :mod:`bitfold.exact`.

    A device state is rounded on its device and stream by the CPU's rounding
    compiled for it (:func:`bitfold.kernels.cuda.launch_round`); the result is
    an array of the state's kind on its device, shape ``(K,)`` (bfloat16: a
    torch bfloat16 tensor, else float32 holding bfloat16 values). A host
    state rounds as the host's.
    """
    if isinstance(state, np.ndarray):
        return host_state.round_state(state, fmt, out_name)
    st = device_values_of_state(state)
    kernels = _kernels()
    shape = tuple(int(s) for s in st.array.shape[:-1])
    rows = int(np.prod(shape))
    widen = out_name == "bfloat16" and st.kind != "torch"
    with _cuda().gpus[st.device]:
        out, out_bits = _empty(st, (rows,), kernels.out_bits_dtype(out_name, widen))
        kernels.launch_round(st.array.reshape(rows, fmt.width), None, False, fmt, out_name,
                             out_bits, st.stream, widen_bfloat16=widen)  # fmt: skip
    return _view(out, st.kind, "float32" if widen else out_name).reshape(shape)


@dataclass
class _StateView:
    """A state's numba view (``array``), its device, the kind of array it is and its stream."""

    device: int
    array: Any
    kind: str = "numba"
    stream: Any = 0


def device_values_of_state(state: Any) -> _StateView:
    """A numba view of a device state array, its device, kind and stream (any GPU array)."""
    kind, device, stream = _home(state)
    if kind == "torch" and not state.is_contiguous():
        raise FoldError("a GPU state array must be C-contiguous")
    if kind == "numba" and getattr(state, "__cuda_ndarray__", False):
        return _StateView(device, state, kind, stream)
    with _cuda().gpus[device]:
        return _StateView(device, _cuda().as_cuda_array(state, sync=False), kind, stream)


@functools.cache
def numba_cuda_loads() -> bool:
    """True when numba-cuda imports and finds a device (or its simulator); else CUDA values
    take the portable backend."""
    try:
        from numba import cuda as numba_cuda

        return bool(numba_cuda.is_available())
    except Exception:  # no numba-cuda, no driver
        return False


# -- the known-answer test (bitfold.backends.selftest) -------------------------------------------
def device_of(values: Any) -> str:
    """The CUDA device of GPU ``values``, as ``"cuda:<ordinal>"``."""
    return f"cuda:{_home(values)[1]}"


def place(bits: np.ndarray, dtype: str, values: Any) -> Any:
    """``bits`` (unsigned patterns of ``dtype``) as an array of ``dtype`` on the device of
    ``values``: a torch tensor beside a torch tensor (bfloat16 too), a CuPy array beside a
    CuPy array, a numba device array beside anything else."""
    kind, dev, _ = _home(values)
    host = np.ascontiguousarray(bits)
    if kind == "torch":
        import torch

        signed = host.view(np.dtype(f"int{host.dtype.itemsize * 8}"))
        return torch.from_numpy(signed).to(values.device).view(getattr(torch, dtype))
    if kind == "cupy":
        import cupy

        with cupy.cuda.Device(dev):
            return cupy.asarray(host).view(np.dtype(dtype))
    cuda = _cuda()
    with cuda.gpus[dev]:
        return cuda.to_device(host.view(np.dtype(dtype)))


def about(values: Any) -> dict[str, str]:
    """The device the kernels run on, its driver and the compiler: for the self-test's verdict."""
    import importlib.metadata

    compiler = (f"numba-cuda {importlib.metadata.version('numba-cuda')}, "
                f"numba {importlib.metadata.version('numba')}")  # fmt: skip
    if _kernels()._SIMULATOR:
        return {"device": "the numba-cuda simulator (NUMBA_ENABLE_CUDASIM=1)", "driver": "none",
                "compiler": compiler}  # fmt: skip
    from numba.cuda.cudadrv.driver import driver

    dev = _home(values)[1]
    name = _cuda().gpus[dev].name
    name = name.decode() if isinstance(name, bytes) else str(name)
    version = ".".join(str(v) for v in driver.get_version())
    nvidia = selftest.nvidia_driver()
    return {"device": name, "driver": f"NVIDIA {nvidia or 'unknown'}, CUDA driver API {version}",
            "compiler": compiler}  # fmt: skip


def busy(values: Any) -> bool:
    """True when the test cannot run now: values being traced, or their stream capturing."""
    if library_of(values) == "torch":
        import torch

        if type(values) is not torch.Tensor and not isinstance(values, torch.nn.Parameter):
            return True  # a fake or functional tensor: torch.compile or make_fx is tracing
    return capturing(_home(values)[2])


#: How the known-answer test runs here: scalars by the shared-memory path and by the buckets
#: path with the hot bucket cut in segments; rows by the buckets path, the hot bucket cut too.
KNOWN_ANSWERS = selftest.KnownAnswers.from_functions(
    globals(),
    family="numba-cuda",
    options={"scalars": ({}, {"exact_path": "buckets", "segment": 10}), "rows": ({"segment": 6},)},
)


#: The CUDA backend's registry entry (:mod:`bitfold.backends.registry`). An accumulator's
#: state lives on the GPU beside its values (:func:`new_state`; rows: on the host), so it
#: shares no states with the host: states of the two merge by an exact copy.
BACKEND = Backend.from_functions(
    globals(),
    name=NAME,
    families=("torch", "cupy", "numba", "cuda-interface"),
    devices=("cuda",),
    options={"exact": ("exact_path", "launch", "segment"), "ordered": ("launch",),
             "atomic": ("launch",), "add_to_state": ("launch",)},
    init=InitRule(strategies=("exact",), mixed_dtypes=False),
    explain=explain_route,
    available=lambda: numba_cuda_loads(),
    known_answers=KNOWN_ANSWERS,
    priority=100,  # below host; a GPU backend preferred to these kernels sits between
)

__all__ = [
    "BACKEND",
    "KNOWN_ANSWERS",
    "NAME",
    "CupyIndexKey",
    "DeviceValues",
    "ScratchKey",
    "UploadKey",
    "UploadedPlan",
    "about",
    "add_to_state",
    "busy",
    "device_of",
    "device_values",
    "device_values_of_state",
    "exact_state",
    "expand",
    "fold_atomic",
    "fold_exact",
    "fold_ordered",
    "merge_states",
    "new_state",
    "place",
    "round_state",
    "uploaded_plan",
]
