"""What the portable path takes: array families, value and result dtypes, options."""

from __future__ import annotations

from typing import Any

from ...arrays import ArrayFamily, family_of
from ...errors import DeviceError, FoldError, FoldTypeError
from ...formats import F64, LimbFormat, check_value_dtype, dtype_name, limb_format_for

#: The array families whose operations the portable path is written against (their classes in
#: :mod:`bitfold.arrays`, which also say what the path asks of each library: a conditional on a
#: device flag, whether eager folds take chunks, ...). A new library: its family there, its name
#: here.
FAMILIES: tuple[str, ...] = ("torch", "cupy", "jax", "numpy")


def float_name(x: Any) -> str:
    """The canonical dtype name of a float array (a refusal for any other)."""
    return check_value_dtype(dtype_name(x))


def values_format(dtype: str, init_dtype: str | None) -> LimbFormat:
    fmt = limb_format_for(dtype)
    if init_dtype is not None and limb_format_for(init_dtype) is F64:
        return F64  # float64 init and float32 values: both summed in the float64 format
    return fmt


def check_family(values: Any) -> ArrayFamily:
    ops = family_of(values)
    if ops.name not in FAMILIES:
        raise DeviceError(
            f"the portable path folds {', '.join(FAMILIES)} arrays; got {ops.name} arrays "
            f"({type(values).__module__}.{type(values).__qualname__})"
        )
    return ops


def check_out(ops: ArrayFamily, out_name: str) -> None:
    if out_name == "float64" and not ops.has_dtype("float64"):
        raise FoldTypeError(
            "float64 results need jax_enable_x64 (JAX makes no float64 arrays without it)"
        )


def check_options(options: dict[str, Any]) -> None:
    """The portable path takes no tuning options: refuse any, by name."""
    if options:
        raise FoldError(
            f"the portable backend takes no options; got {', '.join(f'{k}=' for k in options)}"
        )
