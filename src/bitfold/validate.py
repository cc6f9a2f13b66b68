"""The one validator every strategy and the accumulator share.

It turns whatever the user passed into a flat, contiguous host NumPy array
of a supported floating dtype, or raises a :class:`~bitfold.errors.FoldError`
that names the bad value and what is allowed.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

import numpy as np

from .arrays import SUPPORTED_VALUE_DTYPES, dtype_name, require_host, to_numpy
from .errors import FoldError, FoldTypeError, ShapeError

if TYPE_CHECKING:
    from .plan import Fold

#: Output dtypes a fold can round to.
SUPPORTED_OUT_DTYPES = ("bfloat16", "float16", "float32", "float64")


def check_K(K: Any) -> int:
    """Return ``K`` as an int, or refuse it: it must be an integer >= 1."""
    if isinstance(K, bool) or not isinstance(K, numbers.Integral):
        raise FoldTypeError(f"K must be a positive integer; got {K!r} ({type(K).__name__})")
    if K < 1:
        raise FoldError(f"K must be a positive integer (K >= 1); got K = {int(K)}")
    return int(K)


def value_dtype_name(values: Any) -> str:
    """The dtype name of ``values``, refused unless it is a supported floating dtype."""
    try:
        name = dtype_name(values)
    except AttributeError:
        name = dtype_name(np.asarray(values))
    if name not in SUPPORTED_VALUE_DTYPES:
        raise FoldTypeError(
            f"values must be floating point ({', '.join(SUPPORTED_VALUE_DTYPES)}); got dtype {name}"
        )
    return name


def host_values(plan: Fold, values: Any, *, start: int | None = None) -> tuple[np.ndarray, str]:
    """Flat contiguous host values for ``plan``, and the dtype name they came with.

    With ``start=None`` the values must have exactly ``plan.size`` elements,
    read in C order: either flat (1-D), or in the index's own shape when the
    index has several dimensions (a transposed gradient, shape (3, 2) for a
    (2, 3) map, is refused rather than folded into the wrong buckets); a
    one-dimensional index accepts values of any shape. With an integer
    ``start`` they are the flat slice ``[start, start + values.size)`` of the
    plan's positions. bfloat16 values are widened to float32 (exact); values
    of a non-native byte order are converted to native order first.
    """
    require_host(values, "values")
    if not hasattr(values, "dtype"):
        values = np.asarray(values)
    name = value_dtype_name(values)
    arr = to_numpy(values)
    if name == "bfloat16":
        arr = arr.astype(np.float32)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    n = int(arr.size)
    if start is None:
        if n != plan.size:
            raise ShapeError(
                f"values have {n} elements (shape {tuple(arr.shape)}); this plan folds "
                f"{plan.size} (index shape {plan.shape}): pass exactly {plan.size} values"
            )
        if len(plan.shape) > 1 and arr.ndim > 1 and tuple(arr.shape) != plan.shape:
            raise ShapeError(
                f"values have shape {tuple(arr.shape)} but the index has shape {plan.shape}: "
                "pass values in the index's shape (or flat, if their C order really matches "
                "the index's)"
            )
    else:
        if isinstance(start, bool) or not isinstance(start, numbers.Integral):
            raise FoldTypeError(f"start must be an integer position; got {start!r}")
        if start < 0 or start + n > plan.size:
            raise ShapeError(
                f"values for positions [{start}, {start + n}) do not fit in the plan's "
                f"{plan.size} positions: allowed 0 <= start and start + values.size <= {plan.size}"
            )
    return np.ascontiguousarray(arr.reshape(-1)), name


def out_dtype_for(value_name: str, out_dtype: Any = None) -> str:
    """The output dtype name: float64 for float64 values, else float32, unless ``out_dtype`` says.

    Accepts NumPy dtypes, torch dtypes and names; ``"bfloat16"`` is allowed
    (the exact strategy rounds to it; see :func:`bitfold.exactsum.round_state`).
    """
    if out_dtype is None:
        return "float64" if value_name == "float64" else "float32"
    name = str(out_dtype).replace("torch.", "")
    if name not in SUPPORTED_OUT_DTYPES:
        try:
            name = np.dtype(out_dtype).name
        except TypeError:
            pass
    if name not in SUPPORTED_OUT_DTYPES:
        raise FoldTypeError(
            f"out_dtype must be one of {', '.join(SUPPORTED_OUT_DTYPES)}; got {out_dtype!r}"
        )
    return name


def numpy_out_dtype(name: str, strategy: str) -> np.dtype:
    """The NumPy dtype for a rounding strategy's output; bfloat16 only where it is exact."""
    if name == "bfloat16":
        raise FoldTypeError(
            f"out_dtype bfloat16 is available with the exact strategy only (got {strategy!r}); "
            "use float32"
        )
    return np.dtype(name)
