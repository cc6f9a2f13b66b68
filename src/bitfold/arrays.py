"""Which array library a value comes from, where it lives, and conversions to and from NumPy.

One class per array family (NumPy, PyTorch, CuPy, JAX, numba device arrays,
any ``__cuda_array_interface__`` object, Python sequences), found once per
type and cached. Nothing here imports a framework: a family is only
considered when its module is already in ``sys.modules`` (the value could
not exist otherwise), and the framework is touched only through the value
itself.

Families also carry the few *operations* a fold written once against them
needs (:mod:`bitfold.backends.portable`): zeros and constants on the values'
device, reinterpretation of float bits as integers and back, casts,
scatter-adds, maxima and minima into a flat array, gathers, ``where``,
reductions along an axis, a counted loop and a conditional; and the
*capabilities* in which libraries differ (a flag read without waiting, a
conditional on the device, eager folds taken in chunks). Integer arithmetic,
shifts, masks and comparisons are the arrays' own Python operators, which
NumPy, PyTorch, CuPy and JAX share. A new array library is one class here,
defining only what it differs in.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .errors import DeviceError, FoldTypeError
from .formats import dtype_name

#: Devices whose arrays hold shapes but no data (torch's ``meta``): nothing can be read or folded.
NO_DATA_DEVICES = ("meta",)


def type_label(x: Any) -> str:
    """``x``'s type as a user knows it: ``torch.Tensor``, ``numpy.ndarray``, ``jax.Array``, ..."""
    kind = type(x)
    module = kind.__module__.split(".")[0]
    if module == "jaxlib" or (module == "jax" and hasattr(x, "devices")):
        return "jax.Array"
    if module == "torch" and kind.__name__ in ("Tensor", "Parameter"):
        return f"torch.{'Tensor' if kind.__name__ == 'Tensor' else 'nn.Parameter'}"
    return f"{kind.__module__}.{kind.__qualname__}" if module != "builtins" else kind.__qualname__


def check_has_data(x: Any, what: str) -> None:
    """Refuse an array on a device that holds no data (torch's ``meta``), naming ``what`` it is.

    Such an array has a shape and a dtype but no values, so nothing can be
    read from it or folded; the refusal comes before any work, from every
    entry point that takes an index or values.
    """
    device = getattr(x, "device", None)
    kind = getattr(device, "type", device)
    if isinstance(kind, str) and kind in NO_DATA_DEVICES:
        raise DeviceError(
            f"{what} is a {type_label(x)} on the {kind!r} device, which holds shapes but no "
            f"data: bitfold reads and folds arrays with data (CPU, CUDA and other devices); "
            f"make it on a real device, e.g. .to('cpu')"
        )


class ArrayFamily:
    """What bitfold needs to know about the arrays of one library."""

    name = "other"

    def is_appropriate(self, x: Any) -> bool:
        """True when ``x`` is an array of this family."""
        raise NotImplementedError

    def device(self, x: Any) -> str:
        """``"cpu"``, ``"cuda"``, or the name of another device (``"mps"``, ``"tpu"``, ...)."""
        return "cpu"

    def cuda_ordinal(self, x: Any) -> int | None:
        """The CUDA device number of ``x`` when known from the library (no driver query)."""
        return None

    def shape(self, x: Any) -> tuple[int, ...]:
        """The shape as a tuple of ints."""
        return tuple(int(s) for s in x.shape)

    def to_numpy(self, x: Any) -> np.ndarray:
        """A host NumPy view or copy of ``x`` with the same values.

        Torch widens bfloat16 to float32; ml_dtypes' bfloat16 stays (the host
        backend widens it when it reads values)."""
        return np.asarray(x)

    def from_numpy(self, result: np.ndarray, like: Any, out_dtype: str | None = None) -> Any:
        """``result`` as an array of this family, beside ``like`` (NumPy by default)."""
        return result

    # -- operations (a fold written once against the families: backends/portable/) ----------
    # Every operation takes and returns arrays of this family; dtypes are canonical names
    # ("int64", "float32", "bfloat16", ...). Nothing here waits for the device.

    def _missing(self, op: str) -> FoldTypeError:
        return FoldTypeError(f"{self.name} arrays have no {op!r} operation for the portable path")

    def has_int64(self, like: Any) -> bool:
        """True when int64 arrays can be made beside ``like`` (JAX: only with jax_enable_x64)."""
        return True

    def has_dtype(self, name: str) -> bool:
        """True when this library has arrays of dtype ``name`` (NumPy and CuPy: no bfloat16)."""
        return name != "bfloat16"

    def cache_key(self, like: Any) -> Any:
        """A hashable key for constants made beside ``like``, or ``None`` not to cache them
        (a traced value: a constant made while tracing belongs to that trace)."""
        return (self.name,)

    # -- capabilities: what the portable path asks of a library, beside ``like`` -------------
    def fast_float64(self, like: Any) -> bool:
        """True when float64 arithmetic exists beside ``like`` and runs at speed (a scaling
        by powers of two may then stand in for integer shifts)."""
        return self.has_dtype("float64")

    def reads_without_sync(self, like: Any) -> bool:
        """True when a 0-d flag made beside ``like`` is read as a Python bool with no device to
        wait for: eager values in host memory."""
        return self.cache_key(like) is not None and self.device(like) == "cpu"

    def traced_for_host(self, like: Any) -> bool:
        """True when ``like`` is traced into a graph a compiler builds for the host (torch's
        ``torch.compile`` on the CPU): a graph may then fall back to an eager fold."""
        return False

    def compiles_for_host(self) -> bool:
        """True when arrays of this library may later be traced for the host
        (:meth:`traced_for_host`): an eager fold then hands itself to the graph's fallback
        before any graph needs it. Asks nothing of a device; never changes a result's bits."""
        return False

    def branches_on_device(self, like: Any) -> bool:
        """True when :meth:`cond` on a flag made beside ``like`` runs one branch with no host
        wait, inside a trace too (JAX's ``lax.cond``); False where it reads the flag on the
        host (the default), which waits for the device unless :meth:`reads_without_sync`."""
        return False

    def chunks_eager_folds(self, like: Any) -> bool:
        """True when a fold of ``like`` runs eagerly, operation by operation, each making its
        temporaries at once in memory: it then takes its values in chunks whose temporaries
        stay in the caches (torch outside a trace, NumPy); False for a traced fold and a
        library that compiles and fuses a fold (JAX). Never changes a result's bits."""
        return False

    def constant(self, like: Any, arr: np.ndarray) -> Any:
        """The host array ``arr`` as an array of this family on ``like``'s device."""
        raise self._missing("constant")

    def zeros(self, like: Any, shape: tuple[int, ...], dtype: str) -> Any:
        """Zeros of ``shape`` and ``dtype`` on ``like``'s device."""
        raise self._missing("zeros")

    def arange(self, like: Any, n: int, dtype: str) -> Any:
        """``0, 1, .., n - 1`` of ``dtype`` on ``like``'s device."""
        raise self._missing("arange")

    def bitcast(self, x: Any, dtype: str) -> Any:
        """``x``'s bits read as ``dtype`` of the same width (no conversion, no float unit)."""
        raise self._missing("bitcast")

    def astype(self, x: Any, dtype: str) -> Any:
        """``x`` converted to ``dtype`` (integers: exact when the value fits; a value that does
        not fit, NaN or infinity gives what the library gives, with no warning: the portable
        path casts them and never reads the result)."""
        raise self._missing("astype")

    def scatter_add(self, target: Any, index: Any, src: Any) -> Any:
        """``target`` with ``target[index[i]] += src[i]`` along the first axis for every i
        (``src`` of ``index``'s length, then ``target``'s trailing shape); returns the result.

        In any order, atomics included: exact for integer arrays (wrapping on
        overflow, which callers keep clear of), unordered float additions otherwise.
        """
        raise self._missing("scatter_add")

    def scatter_max(self, target: Any, index: Any, src: Any) -> Any:
        """``target`` with ``target[index[i]] = max(target[index[i]], src[i])`` along the first
        axis for every i (shapes as :meth:`scatter_add`); returns the result.

        For integer arrays: order-free, like the integer scatter-add (each library's own
        scatter, any order, atomics included).
        """
        raise self._missing("scatter_max")

    def scatter_min(self, target: Any, index: Any, src: Any) -> Any:
        """``target`` with ``target[index[i]] = min(target[index[i]], src[i])`` along the first
        axis for every i (shapes as :meth:`scatter_add`); returns the result.

        For integer arrays: order-free, like the integer scatter-add.
        """
        raise self._missing("scatter_min")

    def take(self, x: Any, index: Any) -> Any:
        """``x[index]`` along the first axis."""
        raise self._missing("take")

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        """Elementwise ``a if cond else b`` (``a``, ``b``: arrays or Python scalars)."""
        raise self._missing("where")

    def clip(self, x: Any, lo: int, hi: int) -> Any:
        """``x`` limited to ``[lo, hi]`` (Python ints)."""
        raise self._missing("clip")

    def sum(self, x: Any, axis: int) -> Any:
        """Sum along ``axis`` (integers: exact, in the array's dtype)."""
        raise self._missing("sum")

    def amax(self, x: Any, axis: int) -> Any:
        """Maximum along ``axis``."""
        raise self._missing("amax")

    def amin(self, x: Any, axis: int) -> Any:
        """Minimum along ``axis``."""
        raise self._missing("amin")

    def floor(self, x: Any) -> Any:
        """Elementwise floor of a float array (exact)."""
        raise self._missing("floor")

    def stack(self, xs: list[Any], axis: int) -> Any:
        """The arrays ``xs`` stacked along a new ``axis``."""
        raise self._missing("stack")

    def concat(self, xs: list[Any]) -> Any:
        """The 1-D arrays ``xs`` one after another."""
        raise self._missing("concat")

    def loop(self, n: int, body: Any, init: Any) -> Any:
        """``init`` passed through ``body(i, carry)`` for i = 0 .. n-1 (JAX: one compiled loop)."""
        carry = init
        for i in range(n):
            carry = body(i, carry)
        return carry

    def cond(self, flag: Any, if_set: Any, if_clear: Any) -> Any:
        """``if_set()`` where the 0-d ``flag`` is set, else ``if_clear()``: one branch runs.

        By default the flag is read on the host (``bool(flag)``), which waits for
        the device unless :meth:`reads_without_sync`; a library that branches on
        the device overrides it and says so in :meth:`branches_on_device` (JAX:
        ``lax.cond``, inside ``jit`` too).
        """
        return if_set() if bool(flag) else if_clear()


class _NumpyLike(ArrayFamily):
    """A family whose library has NumPy's functions in one module (NumPy, CuPy, jax.numpy):
    the operations that read the same in all three, written once against :meth:`xp`."""

    def xp(self) -> Any:
        """The library's NumPy-like module."""
        raise NotImplementedError

    def take(self, x: Any, index: Any) -> Any:
        return self.xp().take(x, index, axis=0)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        return self.xp().where(cond, a, b)

    def clip(self, x: Any, lo: int, hi: int) -> Any:
        return self.xp().clip(x, lo, hi)

    def sum(self, x: Any, axis: int) -> Any:
        return x.sum(axis=axis, dtype=x.dtype)

    def amax(self, x: Any, axis: int) -> Any:
        return x.max(axis=axis)

    def amin(self, x: Any, axis: int) -> Any:
        return x.min(axis=axis)

    def floor(self, x: Any) -> Any:
        return self.xp().floor(x)

    def stack(self, xs: list[Any], axis: int) -> Any:
        return self.xp().stack(xs, axis=axis)

    def concat(self, xs: list[Any]) -> Any:
        return self.xp().concatenate(xs)


class _Numpy(_NumpyLike):
    name = "numpy"

    def xp(self) -> Any:
        return np

    def is_appropriate(self, x: Any) -> bool:
        return isinstance(x, (np.ndarray, np.generic))  # a tuple: torch.compile reads it

    def constant(self, like: Any, arr: np.ndarray) -> Any:
        return np.asarray(arr)

    def zeros(self, like: Any, shape: tuple[int, ...], dtype: str) -> Any:
        return np.zeros(shape, dtype)

    def arange(self, like: Any, n: int, dtype: str) -> Any:
        return np.arange(n, dtype=dtype)

    def bitcast(self, x: Any, dtype: str) -> Any:
        return np.asarray(x).view(dtype)

    def astype(self, x: Any, dtype: str) -> Any:
        with np.errstate(invalid="ignore", over="ignore"):
            return np.asarray(x).astype(dtype)

    def scatter_add(self, target: Any, index: Any, src: Any) -> Any:
        np.add.at(target, index, src)
        return target

    def scatter_max(self, target: Any, index: Any, src: Any) -> Any:
        np.maximum.at(target, index, src)
        return target

    def scatter_min(self, target: Any, index: Any, src: Any) -> Any:
        np.minimum.at(target, index, src)
        return target

    def chunks_eager_folds(self, like: Any) -> bool:
        return True  # NumPy is never traced: every fold is eager


class _Torch(ArrayFamily):
    name = "torch"

    def is_appropriate(self, x: Any) -> bool:
        torch = sys.modules.get("torch")
        return torch is not None and isinstance(x, torch.Tensor)

    def device(self, x: Any) -> str:
        return str(x.device.type)

    def cuda_ordinal(self, x: Any) -> int | None:
        return int(x.device.index or 0) if x.device.type == "cuda" else None

    def to_numpy(self, x: Any) -> np.ndarray:
        import torch

        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: widening is exact
            return t.float().numpy()
        return t.contiguous().numpy() if not t.is_contiguous() else t.numpy()

    def from_numpy(self, result: np.ndarray, like: Any, out_dtype: str | None = None) -> Any:
        import torch

        result = np.ascontiguousarray(result)
        if out_dtype == "bfloat16" and result.dtype == np.float32:
            # float32 holding bfloat16 values: their patterns are the high halves, moved as bits
            # (torch's own conversion turns the canonical NaN 0x7FC00000 into 0xFFFF)
            high = (result.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
            t = torch.from_numpy(high.view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(result)
            if out_dtype == "bfloat16":
                t = t.to(torch.bfloat16)
        if like.device.type != "cpu":
            t = t.to(like.device)
        return t

    # operations: ATen ops only, nothing that waits for the device (traces with fake tensors)
    def has_dtype(self, name: str) -> bool:
        return True

    def fast_float64(self, like: Any) -> bool:
        return self.device(like) != "mps"  # Apple's MPS has no float64

    def reads_without_sync(self, like: Any) -> bool:
        return not self._compiling() and super().reads_without_sync(like)

    def traced_for_host(self, like: Any) -> bool:
        return self._compiling() and self.device(like) == "cpu"

    def compiles_for_host(self) -> bool:
        return True

    def chunks_eager_folds(self, like: Any) -> bool:
        return self.cache_key(like) is not None  # not a fake or functional tensor

    @staticmethod
    def _compiling() -> bool:
        import torch

        return bool(torch.compiler.is_compiling())

    def cache_key(self, like: Any) -> Any:
        import torch

        if type(like) is not torch.Tensor and not isinstance(like, torch.nn.Parameter):
            return None  # a fake or functional tensor: tracing (make_fx, torch.compile)
        return (self.name, str(like.device))

    def constant(self, like: Any, arr: np.ndarray) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(arr)).to(like.device)

    def zeros(self, like: Any, shape: tuple[int, ...], dtype: str) -> Any:
        import torch

        return torch.zeros(shape, dtype=getattr(torch, dtype), device=like.device)

    def arange(self, like: Any, n: int, dtype: str) -> Any:
        import torch

        return torch.arange(n, dtype=getattr(torch, dtype), device=like.device)

    def bitcast(self, x: Any, dtype: str) -> Any:
        import torch

        return x.view(getattr(torch, dtype))

    def astype(self, x: Any, dtype: str) -> Any:
        import torch

        return x.to(getattr(torch, dtype))

    def scatter_add(self, target: Any, index: Any, src: Any) -> Any:
        if src.dim() == 1:  # one value a position: ATen's scatter is the faster of the two
            return target.scatter_add(0, index, src)
        return target.index_add(0, index, src)

    def scatter_max(self, target: Any, index: Any, src: Any) -> Any:
        return self._scatter_reduce(target, index, src, "amax")

    def scatter_min(self, target: Any, index: Any, src: Any) -> Any:
        return self._scatter_reduce(target, index, src, "amin")

    @staticmethod
    def _scatter_reduce(target: Any, index: Any, src: Any, how: str) -> Any:
        if src.dim() > 1:  # rows: ATen's scatter takes an index of the values' shape
            index = index.reshape(-1, *(1,) * (src.dim() - 1)).expand(src.shape)
        return target.scatter_reduce(0, index, src, how)

    def take(self, x: Any, index: Any) -> Any:
        return x.index_select(0, index)

    def where(self, cond: Any, a: Any, b: Any) -> Any:
        import torch

        return torch.where(cond, a, b)

    def clip(self, x: Any, lo: int, hi: int) -> Any:
        return x.clamp(lo, hi)

    def sum(self, x: Any, axis: int) -> Any:
        return x.sum(axis, dtype=x.dtype)

    def amax(self, x: Any, axis: int) -> Any:
        return x.amax(axis)

    def amin(self, x: Any, axis: int) -> Any:
        return x.amin(axis)

    def floor(self, x: Any) -> Any:
        return x.floor()

    def stack(self, xs: list[Any], axis: int) -> Any:
        import torch

        return torch.stack(xs, axis)

    def concat(self, xs: list[Any]) -> Any:
        import torch

        return torch.cat(xs)


class _Cupy(_NumpyLike):
    name = "cupy"

    def xp(self) -> Any:
        import cupy

        return cupy

    def is_appropriate(self, x: Any) -> bool:
        cupy = sys.modules.get("cupy")
        return cupy is not None and isinstance(x, cupy.ndarray)

    def device(self, x: Any) -> str:
        return "cuda"

    def cuda_ordinal(self, x: Any) -> int | None:
        return int(x.device.id)

    def to_numpy(self, x: Any) -> np.ndarray:
        import cupy

        return cupy.asnumpy(x)

    def from_numpy(self, result: np.ndarray, like: Any, out_dtype: str | None = None) -> Any:
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.asarray(result)

    # operations: cupyx's scatter-add (int64 added as uint64: the same bits modulo 2^64)
    def constant(self, like: Any, arr: np.ndarray) -> Any:
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.asarray(arr)

    def cache_key(self, like: Any) -> Any:
        return (self.name, int(like.device.id))

    def zeros(self, like: Any, shape: tuple[int, ...], dtype: str) -> Any:
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.zeros(shape, dtype)

    def arange(self, like: Any, n: int, dtype: str) -> Any:
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.arange(n, dtype=dtype)

    def bitcast(self, x: Any, dtype: str) -> Any:
        return x.view(dtype)

    def astype(self, x: Any, dtype: str) -> Any:
        return x.astype(dtype)

    def scatter_add(self, target: Any, index: Any, src: Any) -> Any:
        import cupyx

        if target.dtype == np.int64:  # cupyx adds uint64, not int64
            target_u, src_u = target.view(np.uint64), src.astype(np.int64).view(np.uint64)
            cupyx.scatter_add(target_u, index, src_u)
            return target
        cupyx.scatter_add(target, index, src.astype(target.dtype))
        return target

    def scatter_max(self, target: Any, index: Any, src: Any) -> Any:
        import cupyx

        cupyx.scatter_max(target, index, src)
        return target

    def scatter_min(self, target: Any, index: Any, src: Any) -> Any:
        import cupyx

        cupyx.scatter_min(target, index, src)
        return target


class _Jax(_NumpyLike):
    name = "jax"

    def xp(self) -> Any:
        import jax.numpy as jnp

        return jnp

    def is_appropriate(self, x: Any) -> bool:
        jax = sys.modules.get("jax")
        return jax is not None and isinstance(x, jax.Array)

    def device(self, x: Any) -> str:
        try:  # a concrete array knows its devices; a tracer inside jit does not
            platforms = {d.platform for d in x.devices()}
        except Exception:
            platforms = {sys.modules["jax"].default_backend()}
        if platforms == {"cpu"}:
            return "cpu"
        return "cuda" if platforms <= {"gpu", "cuda"} else ",".join(sorted(platforms))

    def from_numpy(self, result: np.ndarray, like: Any, out_dtype: str | None = None) -> Any:
        import jax.numpy as jnp

        return jnp.asarray(result)

    # operations: jax.numpy and lax, traceable under jit, grad and vmap
    def has_int64(self, like: Any) -> bool:
        return bool(sys.modules["jax"].config.jax_enable_x64)

    def has_dtype(self, name: str) -> bool:
        return name != "float64" or self.has_int64(None)

    def cache_key(self, like: Any) -> Any:
        return (self.name, self.has_int64(like))

    def constant(self, like: Any, arr: np.ndarray) -> Any:
        import jax
        import jax.numpy as jnp

        with jax.ensure_compile_time_eval():  # a concrete array, even inside jit
            return jnp.asarray(arr)

    def zeros(self, like: Any, shape: tuple[int, ...], dtype: str) -> Any:
        import jax.numpy as jnp

        return jnp.zeros(shape, jnp.dtype(dtype))

    def arange(self, like: Any, n: int, dtype: str) -> Any:
        import jax.numpy as jnp

        return jnp.arange(n, dtype=jnp.dtype(dtype))

    def bitcast(self, x: Any, dtype: str) -> Any:
        import jax
        import jax.numpy as jnp

        return jax.lax.bitcast_convert_type(x, jnp.dtype(dtype))

    def astype(self, x: Any, dtype: str) -> Any:
        import jax.numpy as jnp

        return x.astype(jnp.dtype(dtype))

    def scatter_add(self, target: Any, index: Any, src: Any) -> Any:
        return target.at[index].add(src)

    def scatter_max(self, target: Any, index: Any, src: Any) -> Any:
        return target.at[index].max(src)

    def scatter_min(self, target: Any, index: Any, src: Any) -> Any:
        return target.at[index].min(src)

    def branches_on_device(self, like: Any) -> bool:
        return True  # lax.cond: one branch, on the device, traced or not

    def cond(self, flag: Any, if_set: Any, if_clear: Any) -> Any:
        import jax

        return jax.lax.cond(flag, if_set, if_clear)

    def loop(self, n: int, body: Any, init: Any) -> Any:
        import jax

        return jax.lax.fori_loop(0, n, body, init)


class _NumbaDevice(ArrayFamily):
    """numba-cuda device arrays, real or the simulator's."""

    name = "numba"

    def is_appropriate(self, x: Any) -> bool:
        return bool(getattr(x, "__cuda_ndarray__", False))

    def device(self, x: Any) -> str:
        return "cuda"

    def to_numpy(self, x: Any) -> np.ndarray:
        # on the stream the array is bound to (the one that wrote it), then waited for
        stream = getattr(x, "stream", 0)
        host = x.copy_to_host(stream=stream)
        if stream:
            stream.synchronize()
        return host

    def from_numpy(self, result: np.ndarray, like: Any, out_dtype: str | None = None) -> Any:
        from numba import cuda

        return cuda.to_device(np.ascontiguousarray(result))


class _CudaInterface(ArrayFamily):
    """Any other object with ``__cuda_array_interface__``."""

    name = "cuda-interface"

    def is_appropriate(self, x: Any) -> bool:
        return hasattr(x, "__cuda_array_interface__")

    def device(self, x: Any) -> str:
        return "cuda"

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(int(s) for s in x.__cuda_array_interface__["shape"])

    def to_numpy(self, x: Any) -> np.ndarray:
        from numba import cuda

        return cuda.as_cuda_array(x).copy_to_host()


class _Sequence(ArrayFamily):
    """Python sequences and scalars, and objects with ``__array__``: read through NumPy."""

    name = "numpy"

    def is_appropriate(self, x: Any) -> bool:
        return isinstance(x, list | tuple | int | float) or hasattr(x, "__array__")

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(int(s) for s in np.shape(x))


_FAMILIES: tuple[ArrayFamily, ...] = (
    _Numpy(), _Torch(), _Cupy(), _Jax(), _NumbaDevice(), _CudaInterface(), _Sequence(),
)  # fmt: skip
_BY_TYPE: dict[type, ArrayFamily] = {}


def family_of(x: Any) -> ArrayFamily:
    """The family of ``x`` (cached by type), or a :class:`FoldTypeError` naming the type."""
    family = _BY_TYPE.get(type(x))
    if family is not None:
        return family
    for family in _FAMILIES:
        if family.is_appropriate(x):
            if family.name != "numpy" or isinstance(x, np.ndarray | np.generic):
                _BY_TYPE[type(x)] = family
            return family
    raise FoldTypeError(
        f"cannot read an array from a {type(x).__module__}.{type(x).__qualname__}; "
        "pass a NumPy, PyTorch, CuPy or JAX array"
    )


def library_of(x: Any) -> str:
    """``"numpy"``, ``"torch"``, ``"cupy"``, ``"jax"``, ``"numba"``, ... or ``"other"``."""
    try:
        return family_of(x).name
    except FoldTypeError:
        return "other"


def device_of(x: Any) -> str:
    """``"cpu"``, ``"cuda"`` or another device name for an array of any family."""
    return family_of(x).device(x)


def place_of(x: Any) -> tuple[str, str, int | None]:
    """Where ``x`` lives: ``(family name, device, CUDA ordinal or None)``; two arrays of
    one place can be combined by their library's own operations."""
    family = family_of(x)
    return family.name, family.device(x), family.cuda_ordinal(x)


def is_cuda_array(x: Any) -> bool:
    """True for values that live on a CUDA device (CuPy, torch CUDA, numba, JAX GPU, ...)."""
    try:
        return family_of(x).device(x) == "cuda"
    except FoldTypeError:
        return False


def shape_of(x: Any) -> tuple[int, ...]:
    """The shape of an array of any family."""
    return family_of(x).shape(x)


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy view or copy of ``x`` on the host, with the same values.

    Device arrays are copied to the host (for digests, tests and the CPU
    path, not for hot GPU code); bfloat16 tensors are widened to float32.
    """
    return family_of(x).to_numpy(x)


def from_numpy(result: np.ndarray, like: Any, dtype_name: str | None = None) -> Any:
    """``result`` as an array of ``like``'s library and device.

    ``dtype_name="bfloat16"`` marks a float32 array holding bfloat16 values:
    torch gets a bfloat16 tensor (an exact conversion), others the float32.
    """
    return family_of(like).from_numpy(result, like, dtype_name)


def raw_bits(x: Any) -> tuple[str, tuple[int, ...], memoryview]:
    """``(dtype name, shape, little-endian C-order bytes)`` of any supported array.

    This is the canonical encoding behind :func:`bitfold.digest`: it keeps
    bfloat16 as bfloat16 (two bytes an element) whatever library holds it.
    The bytes are a read-only view (format ``B``: two views are equal when
    their bytes are) of the array itself where it is already little-endian
    and C-ordered on the host, not a copy: hashing a (10^6, 64) result took
    twice as long with one.
    """
    check_has_data(x, "the array to digest")
    if not hasattr(x, "dtype"):
        raise FoldTypeError(
            f"digests are of arrays (NumPy, PyTorch, CuPy, JAX) or mappings of them; got "
            f"{type(x).__qualname__}: wrap it with numpy.asarray(..., dtype=...) first"
        )
    name = dtype_name(x)
    if library_of(x) == "torch":
        import torch

        t = x.detach()
        t = t.cpu() if t.device.type != "cpu" else t
        shape = tuple(int(s) for s in t.shape)
        if t.dtype == torch.bfloat16:
            arr = t.contiguous().view(torch.int16).numpy()
        else:
            arr = t.contiguous().numpy()
    else:
        arr = to_numpy(x)
        shape = tuple(int(s) for s in arr.shape)
        name = dtype_name(arr)
        if name == "bfloat16":
            arr = arr.view(np.uint16)
    arr = np.ascontiguousarray(arr)
    if arr.dtype.kind in "OV" and name != "bfloat16":
        raise FoldTypeError(
            f"cannot digest an array of dtype {name}: only numeric and boolean arrays have "
            "canonical bytes (object arrays hold pointers)"
        )
    if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
        arr = arr.byteswap().view(arr.dtype.newbyteorder("<"))
    data = memoryview(arr.reshape(-1).view(np.uint8))
    return name, shape, data.toreadonly()


__all__ = [
    "NO_DATA_DEVICES",
    "ArrayFamily",
    "check_has_data",
    "device_of",
    "dtype_name",
    "family_of",
    "from_numpy",
    "is_cuda_array",
    "library_of",
    "place_of",
    "raw_bits",
    "shape_of",
    "to_numpy",
    "type_label",
]
