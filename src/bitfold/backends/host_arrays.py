"""Host arrays for the host backend: values read as NumPy, outputs made and handed back.

Values are read on the host as one contiguous, native-byte-order NumPy array
(a view when they already are one; bfloat16 widened to float32, which is
exact), flat for a scalar fold and ``(positions, D)`` for a fold of rows;
results go back to the values' own library, shaped ``(K,) + trailing``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..arrays import family_of, from_numpy, to_numpy
from ..formats import FLOATS, LimbFormat, rounding_target
from ..kernels.compiling import read_only
from ..plan_view import PlanView
from ..validate import Values
from .host_buffers import reused_empty


def host_values(values: Any) -> np.ndarray:
    """The values as a flat, contiguous, native-order NumPy array (bfloat16 widened to float32),
    read-only whatever the caller's flag (:func:`bitfold.kernels.compiling.read_only`: each
    kernel compiles once a dtype)."""
    arr = to_numpy(values) if hasattr(values, "dtype") else np.asarray(values)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype.name == "bfloat16":  # ml_dtypes' bfloat16 (JAX, NumPy): widening is exact
        arr = arr.astype(np.float32)
    return read_only(np.ascontiguousarray(arr.reshape(-1)))


def bfloat16_bits(values: Any) -> np.ndarray:
    """The uint16 bit patterns of bfloat16 values, flat and read-only (no widening copy)."""
    if family_of(values).name == "torch":
        import torch

        t = values.detach().cpu().contiguous()
        return read_only(t.view(torch.int16).numpy().view(np.uint16).reshape(-1))
    return read_only(np.ascontiguousarray(np.asarray(values)).view(np.uint16).reshape(-1))


def host_rows(values: Any, spec: Values) -> np.ndarray:
    """The values as a contiguous, read-only ``(positions, D)`` float32 or float64 array (halves
    widened)."""
    flat = host_values(values)
    if flat.dtype == np.float16:
        flat = read_only(flat.astype(np.float32))  # exact
    return flat.reshape(spec.positions, spec.row_size)


def result(out: np.ndarray, like: Any, out_name: str, spec: Values) -> Any:
    """``out`` shaped ``(K,) + trailing``, in the library (and device) of ``like``."""
    out = out.reshape(out.shape[:1] + spec.trailing)
    return from_numpy(out, like=like, dtype_name=out_name)


def target(out_name: str, fmt: LimbFormat) -> tuple[int, ...]:
    """``(unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift)`` for the kernels."""
    return rounding_target(out_name, fmt)


def empty_out(
    plan: PlanView, shape: tuple[int, ...], out_name: str
) -> tuple[np.ndarray, np.ndarray]:
    """(the output as floats, the same memory as signed integers of its width).

    NumPy has no bfloat16: a bfloat16 output is a float32 array holding
    bfloat16 values (its integers are the bfloat16 bits shifted left by 16).
    A large output reuses memory ``plan`` kept from an earlier call that
    nothing holds any more (:mod:`bitfold.backends.host_buffers`).
    """
    widen = out_name == "bfloat16"
    out_bits = reused_empty(plan, shape, np.int32 if widen else FLOATS[out_name].signed_bits_dtype)
    return out_bits.view(np.float32 if widen else out_name), out_bits


def canonicalise_nans(out: np.ndarray) -> np.ndarray:
    """Replace every NaN of ``out`` (in place) by the canonical NaN of its dtype; return it."""
    nan = np.isnan(out)
    if nan.any():
        f = FLOATS[out.dtype.name]
        out.view(f.bits_dtype)[nan] = f.canonical_nan
    return out


def frozen(arr: np.ndarray) -> np.ndarray:
    """``arr``, made read-only (what a plan keeps through ``plan.prepared``)."""
    arr.flags.writeable = False
    return arr


__all__ = [
    "bfloat16_bits",
    "canonicalise_nans",
    "empty_out",
    "frozen",
    "host_rows",
    "host_values",
    "result",
    "target",
]
