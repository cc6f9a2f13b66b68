"""Which array library a value comes from, and conversions to and from NumPy.

Nothing here imports a framework: a value is recognised by the module its
type comes from, and the framework is only touched when the value is already
one of its arrays (so it has already been imported by the user).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from .errors import DeviceError, FoldTypeError

#: dtype names bitfold accepts as fold values.
SUPPORTED_VALUE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def library_of(x: Any) -> str:
    """Return ``"numpy"``, ``"torch"``, ``"cupy"``, ``"jax"`` or ``"other"`` for ``x``."""
    if isinstance(x, np.ndarray | np.generic):
        return "numpy"
    root = type(x).__module__.split(".", 1)[0]
    if root == "torch" and "torch" in sys.modules:
        return "torch"
    if root == "cupy" and "cupy" in sys.modules:
        return "cupy"
    if root in ("jax", "jaxlib") and "jax" in sys.modules:
        return "jax"
    return "other"


def dtype_name(x: Any) -> str:
    """The canonical dtype name of an array of any supported library (``"float32"``, ...)."""
    dt = x.dtype
    name = dt.name if isinstance(dt, np.dtype) else str(dt)
    if name.startswith("torch."):
        name = name[len("torch.") :]
    return {"bool_": "bool", "float": "float32", "double": "float64", "half": "float16"}.get(
        name, name
    )


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: widening is exact
        return t.float().numpy()
    return t.contiguous().numpy()


def raw_bits(x: Any) -> tuple[str, tuple[int, ...], bytes]:
    """``(dtype name, shape, little-endian C-order bytes)`` of any supported array.

    This is the canonical encoding behind :func:`bitfold.digest`: it keeps
    bfloat16 as bfloat16 (two bytes an element) whatever library holds it.
    """
    lib = library_of(x)
    if not hasattr(x, "dtype"):
        raise FoldTypeError(
            f"digests are of arrays (NumPy, PyTorch, CuPy, JAX) or mappings of them; got "
            f"{type(x).__qualname__}: wrap it with numpy.asarray(..., dtype=...) first"
        )
    name = dtype_name(x)
    if lib == "torch":
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


def to_numpy(x: Any) -> np.ndarray:
    """Return a NumPy view or copy of ``x`` on the host, without changing its values.

    Device arrays are copied to the host; this is for digests, tests and the
    CPU path, not for hot GPU code.
    """
    lib = library_of(x)
    if lib == "numpy":
        return np.asarray(x)
    if lib == "torch":
        return _torch_to_numpy(x)
    if lib == "cupy":
        import cupy

        return cupy.asnumpy(x)
    if lib == "jax":
        return np.asarray(x)
    if hasattr(x, "copy_to_host"):  # numba device arrays
        return x.copy_to_host()
    if hasattr(x, "__array__") or isinstance(x, list | tuple):
        return np.asarray(x)
    raise FoldTypeError(
        f"cannot read an array from a {type(x).__module__}.{type(x).__qualname__}; "
        "pass a NumPy, PyTorch, CuPy or JAX array"
    )


def require_host(x: Any, what: str) -> None:
    """Refuse ``x`` if it lives on an accelerator that this code path cannot serve."""
    lib = library_of(x)
    on_device = False
    if lib == "torch":
        on_device = x.device.type != "cpu"
    elif lib == "cupy" or hasattr(x, "__cuda_array_interface__"):
        on_device = True
    elif lib == "jax":
        devs = getattr(x, "devices", None)
        on_device = bool(devs) and any(d.platform != "cpu" for d in devs())
    if on_device:
        raise DeviceError(
            f"{what} live on a device this path cannot serve "
            f"({type(x).__module__}.{type(x).__qualname__}); bitfold folds host arrays "
            "and CUDA arrays (CuPy, torch CUDA, numba, __cuda_array_interface__); "
            "move them with .cpu() or to a CUDA device"
        )


def from_numpy(result: np.ndarray, like: Any, dtype_name: str | None = None) -> Any:
    """Return ``result`` as an array of the same library as ``like`` (host arrays only).

    ``dtype_name="bfloat16"`` marks a float32 array holding bfloat16 values:
    torch gets a bfloat16 tensor (an exact conversion), others the float32.
    """
    lib = library_of(like)
    if lib == "torch":
        import torch

        t = torch.from_numpy(np.ascontiguousarray(result))
        return t.to(torch.bfloat16) if dtype_name == "bfloat16" else t
    if lib == "jax":
        import jax.numpy as jnp

        return jnp.asarray(result)
    return result


__all__ = [
    "SUPPORTED_VALUE_DTYPES",
    "dtype_name",
    "from_numpy",
    "library_of",
    "raw_bits",
    "require_host",
    "to_numpy",
]
