"""The one validator every entry point shares: index maps, K, values, starts and dtypes.

It looks only at shapes, dtype names and integers, never at the data of a
values array, so the same checks (and the same messages) serve NumPy, CuPy,
numba device arrays, PyTorch tensors on any device, JAX arrays and JAX
tracers inside ``jit``, and the accumulator. Every refusal is a
:class:`~bitfold.errors.FoldError` that names the bad value and what is
allowed.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arrays import to_numpy
from .errors import FoldError, FoldTypeError, IndexRangeError, ShapeError
from .formats import check_value_dtype, dtype_name


def check_K(K: Any) -> int:
    """Return ``K`` as an int, or refuse it: it must be an integer >= 1."""
    if isinstance(K, bool) or not isinstance(K, numbers.Integral):
        raise FoldTypeError(f"K must be a positive integer; got {K!r} ({type(K).__name__})")
    if K < 1:
        raise FoldError(f"K must be a positive integer (K >= 1); got K = {int(K)}")
    return int(K)


#: Bytes a plan keeps per bucket (int64 counts and offsets).
PLAN_BYTES_PER_BUCKET = 16


def _physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def _fmt_bytes(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"  # pragma: no cover


def check_K_fits(K: int) -> None:
    """Refuse a K whose per-bucket arrays could not fit in this machine's memory."""
    need = PLAN_BYTES_PER_BUCKET * K
    have = _physical_memory()
    if have is not None and need > have:
        raise FoldError(
            f"K = {K:,} buckets need {_fmt_bytes(need)} for the plan's per-bucket counts and "
            f"offsets alone ({PLAN_BYTES_PER_BUCKET} bytes a bucket), more than this machine's "
            f"{_fmt_bytes(have)} of memory: use a smaller K"
        )


def read_index(index: Any) -> np.ndarray:
    """The index as a host NumPy integer array, or a refusal naming what is wrong.

    Arrays of any library are copied to the host once. An empty Python
    sequence is an empty index; an empty *array* must still have an integer dtype.
    """
    if isinstance(index, list | tuple) and len(index) == 0:
        return np.zeros(0, np.int64)
    arr = to_numpy(index) if hasattr(index, "dtype") else np.asarray(index)
    if arr.dtype == object or arr.dtype.kind not in "iu":
        name = dtype_name(index) if hasattr(index, "dtype") else str(arr.dtype)
        if not hasattr(index, "dtype") and arr.dtype.kind == "f":
            flat = arr.reshape(-1)
            odd = flat[~np.isfinite(flat) | (flat != np.round(flat))]
            example = (odd if odd.size else flat)[0].item()
            raise FoldTypeError(
                f"the index must hold integers (int8 .. int64, uint8 .. uint64); the sequence "
                f"given holds non-integer numbers (read as {name}): e.g. {example!r}"
            )
        raise FoldTypeError(
            f"the index must be an array of integers (int8 .. int64, uint8 .. uint64); "
            f"got dtype {name}"
        )
    flat = np.ravel(arr, order="C")
    if not flat.dtype.isnative:
        flat = flat.astype(flat.dtype.newbyteorder("="))
    return flat.reshape(arr.shape)


def index_range_error(shape: tuple[int, ...], position: int, value: int, K: int) -> IndexRangeError:
    """The error for an index entry outside ``[0, K)`` at flat ``position``."""
    where = [int(w) for w in np.unravel_index(position, shape)] if shape else []
    return IndexRangeError(
        f"index{where} = {value} (flat position {position}) is out "
        f"of range: every index must satisfy 0 <= index < K = {K}"
    )


def check_start(start: Any, n: int, size: int) -> int:
    """``start`` for ``n`` positions of a plan of ``size`` positions, refused unless it fits."""
    if isinstance(start, bool) or not isinstance(start, numbers.Integral):
        raise FoldTypeError(f"start must be an integer position; got {start!r}")
    if start < 0 or start + n > size:
        raise ShapeError(
            f"values for positions [{start}, {start + n}) do not fit in the plan's "
            f"{size} positions: allowed 0 <= start and start + values.size <= {size}"
        )
    return int(start)


@dataclass(frozen=True)
class Values:
    """What the validator learned about a values array: its dtype and how it maps on the plan."""

    dtype: str  # canonical dtype name, one of formats.VALUE_DTYPES
    shape: tuple[int, ...]  # the shape as given
    positions: int  # how many of the plan's positions the values cover
    start: int  # the first position they cover (0 for a whole fold)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


def check_values(
    plan_shape: tuple[int, ...],
    values_shape: tuple[int, ...],
    dtype: Any,
    *,
    start: int | None = None,
) -> Values:
    """Check values of ``values_shape`` and ``dtype`` against a plan whose index has ``plan_shape``.

    With ``start=None`` the values must have exactly as many elements as the
    index, read in C order: either flat (1-D), or in the index's own shape when
    the index has several dimensions (a transposed gradient, shape (3, 2) for a
    (2, 3) map, is refused rather than folded into the wrong buckets); a
    one-dimensional index accepts values of any shape. With an integer
    ``start`` they are the flat slice ``[start, start + values.size)`` of the
    plan's positions.
    """
    name = check_value_dtype(dtype_name(dtype))
    shape = tuple(int(s) for s in values_shape)
    plan_shape = tuple(plan_shape)
    size = math.prod(plan_shape)
    n = math.prod(shape)
    if start is not None:
        return Values(name, shape, n, check_start(start, n, size))
    if n != size:
        raise ShapeError(
            f"values have {n} elements (shape {shape}); this plan folds "
            f"{size} (index shape {plan_shape}): pass exactly {size} values"
        )
    if len(plan_shape) > 1 and len(shape) > 1 and shape != plan_shape:
        raise ShapeError(
            f"values have shape {shape} but the index has shape {plan_shape}: "
            "pass values in the index's shape (or flat, if their C order really matches "
            "the index's)"
        )
    return Values(name, shape, n, 0)


def check_expand_input(K: int, shape: tuple[int, ...]) -> None:
    """``expand`` takes a vector of K entries."""
    if len(shape) != 1 or shape[0] != K:
        raise ShapeError(f"expand needs v of shape ({K},) (K = {K}); got shape {tuple(shape)}")


__all__ = [
    "Values",
    "check_K",
    "check_K_fits",
    "check_expand_input",
    "check_start",
    "check_values",
    "index_range_error",
    "read_index",
]
