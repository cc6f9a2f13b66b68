"""Which array library a value comes from, where it lives, and conversions to and from NumPy.

One class per array family (NumPy, PyTorch, CuPy, JAX, numba device arrays,
any ``__cuda_array_interface__`` object, Python sequences), found once per
type and cached. Nothing here imports a framework: a family is only
considered when its module is already in ``sys.modules`` (the value could
not exist otherwise), and the framework is touched only through the value
itself.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .errors import FoldTypeError
from .formats import dtype_name


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
        """A host NumPy view or copy of ``x`` with the same values (bfloat16 widened to float32)."""
        return np.asarray(x)

    def from_numpy(self, result: np.ndarray, like: Any, out_dtype: str | None = None) -> Any:
        """``result`` as an array of this family, beside ``like`` (NumPy by default)."""
        return result


class _Numpy(ArrayFamily):
    name = "numpy"

    def is_appropriate(self, x: Any) -> bool:
        return isinstance(x, np.ndarray | np.generic)


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

        t = torch.from_numpy(np.ascontiguousarray(result))
        if out_dtype == "bfloat16":  # float32 holding bfloat16 values: the conversion is exact
            t = t.to(torch.bfloat16)
        if like.device.type != "cpu":
            t = t.to(like.device)
        return t


class _Cupy(ArrayFamily):
    name = "cupy"

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


class _Jax(ArrayFamily):
    name = "jax"

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


class _NumbaDevice(ArrayFamily):
    """numba-cuda device arrays, real or the simulator's."""

    name = "numba"

    def is_appropriate(self, x: Any) -> bool:
        return bool(getattr(x, "__cuda_ndarray__", False))

    def device(self, x: Any) -> str:
        return "cuda"

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.copy_to_host()

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


def raw_bits(x: Any) -> tuple[str, tuple[int, ...], bytes]:
    """``(dtype name, shape, little-endian C-order bytes)`` of any supported array.

    This is the canonical encoding behind :func:`bitfold.digest`: it keeps
    bfloat16 as bfloat16 (two bytes an element) whatever library holds it.
    """
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
    return name, shape, arr.tobytes(order="C")


__all__ = [
    "ArrayFamily",
    "device_of",
    "dtype_name",
    "family_of",
    "from_numpy",
    "is_cuda_array",
    "library_of",
    "raw_bits",
    "shape_of",
    "to_numpy",
]
