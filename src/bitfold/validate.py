"""The one validator every entry point shares: index maps, K, values, starts and dtypes.

It looks only at shapes, dtype names and integers, never at the data of a
values array, so the same checks (and the same messages) serve NumPy, CuPy,
numba device arrays, PyTorch tensors on any device, JAX arrays and JAX
tracers inside ``jit``, and the accumulator. Every refusal is a
:class:`~bitfold.errors.FoldError` that names the bad value and what is
allowed.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from .arrays import NO_DATA_DEVICES, check_has_data, family_of, to_numpy, type_label
from .errors import (
    FoldError,
    FoldTypeError,
    IndexRangeError,
    ShapeError,
    UnknownOptionError,
)
from .formats import check_value_dtype, dtype_name

F = TypeVar("F", bound=Callable[..., Any])


def check_K(K: Any, name: str = "K") -> int:
    """Return ``K`` as an int, or refuse it: it must be an integer >= 1.

    ``name`` is the parameter as the caller's user wrote it (``"num_segments"``,
    ``"buckets"``): the message names it, not bitfold's ``K``.
    """
    if isinstance(K, bool) or not isinstance(K, numbers.Integral):
        raise FoldTypeError(f"{name} must be a positive integer; got {K!r} ({type(K).__name__})")
    if K < 1:
        raise FoldError(f"{name} must be a positive integer ({name} >= 1); got {name} = {int(K)}")
    return int(K)


def _short(x: Any, width: int = 60) -> str:
    """``repr(x)``, cut to ``width`` characters."""
    text = repr(x)
    return text if len(text) <= width else text[: width - 3] + "..."


def unknown_option_error(
    call: str, given: Iterable[str], valid: Iterable[str], note: str = ""
) -> UnknownOptionError:
    """The refusal of the keywords ``given`` that ``call`` does not take, listing ``valid``."""
    bad = ", ".join(f"{o}=" for o in sorted(given))
    allowed = ", ".join(f"{o}=" for o in valid) or "none"
    return UnknownOptionError(f"{call} takes no option {bad}; valid options: {allowed}{note}")


def refuse_unknown_options(call: str, options: dict[str, Any], valid: Iterable[str]) -> None:
    """Raise :func:`unknown_option_error` unless every key of ``options`` is in ``valid``."""
    valid = tuple(valid)
    bad = [o for o in options if o not in valid]
    if bad:
        raise unknown_option_error(call, bad, valid)


def checked_options(func: F) -> F:
    """``func`` that refuses an unknown keyword argument with a bitfold error, before any work.

    Python would raise a bare ``TypeError`` ("got an unexpected keyword
    argument"); the wrapped function raises :class:`bitfold.errors.UnknownOptionError`
    (a :class:`~bitfold.FoldError` and a ``TypeError``) that names the keyword and
    lists the ones ``func`` takes, and a :class:`~bitfold.FoldTypeError` for
    more positional arguments than it has. ``inspect.signature`` of the wrapper is
    ``func``'s; a method's ``self`` (or ``cls``) is not listed.
    """
    params = list(inspect.signature(func).parameters.values())
    bound = 1 if params and params[0].name in ("self", "cls") else 0
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = tuple(p.name for p in params[bound:] if p.kind in named)
    positional = [p.name for p in params[bound:] if p.kind == named[0]]
    many = any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in params)
    call = f"{func.__qualname__.removesuffix('.__init__')}()"
    most = len(positional) + bound

    @functools.wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for name in kwargs:
            if name not in names:
                raise unknown_option_error(call, [o for o in kwargs if o not in names], names)
        if len(args) > most and not many:
            raise FoldTypeError(
                f"{call} takes at most {len(positional)} positional arguments "
                f"({', '.join(positional)}); got {len(args) - bound}"
            )
        return func(*args, **kwargs)

    return checked  # type: ignore[return-value]


def positive_int_or_none(
    value: Any, name: str, meaning: str, *, at_most: int | None = None, why: str = ""
) -> int | None:
    """``value`` as an ``int`` when it is a positive integer (not a bool), None when None.

    Anything else is refused with a :class:`~bitfold.FoldError` that names the
    option, says what it means (``meaning``) and shows the value given; so is
    a value above ``at_most``, saying ``why`` that is the most.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise FoldError(f"{name} must be None or a positive integer ({meaning}); got "
                        f"{name}={value!r}")  # fmt: skip
    if at_most is not None and value > at_most:
        raise FoldError(f"{name} must be at most {at_most:,} ({why}); got {name}={value!r}")
    return int(value)


#: Bytes a plan keeps per bucket at most (int64 offsets).
PLAN_BYTES_PER_BUCKET = 8


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
            f"K = {K:,} buckets need {_fmt_bytes(need)} for the plan's per-bucket offsets "
            f"alone ({PLAN_BYTES_PER_BUCKET} bytes a bucket), more than this machine's "
            f"{_fmt_bytes(have)} of memory: use a smaller K"
        )


def read_index(index: Any, name: str = "index") -> np.ndarray:
    """The index as a host NumPy integer array, or a refusal naming what is wrong.

    Arrays of any library are copied to the host once; one on a device without
    data (torch's ``meta``) is refused first. An empty Python sequence is an
    empty index; an empty *array* must still have an integer dtype. ``name``
    is the argument as the caller's user knows it (``"indices"``,
    ``"segment_ids"``).
    """
    if isinstance(index, list | tuple) and len(index) == 0:
        return np.zeros(0, np.int64)
    check_has_data(index, name)
    if hasattr(index, "dtype"):
        family_of(index)  # an array of no known library: a FoldTypeError naming its type
        arr = to_numpy(index)
    else:
        try:
            arr = np.asarray(index)
        except (TypeError, ValueError):  # a ragged list, an object NumPy cannot read
            arr = np.asarray(None, dtype=object)
    if not hasattr(index, "dtype") and arr.size == 0 and arr.dtype.kind == "f":
        return np.zeros(arr.shape, np.int64)  # nested empty sequences: NumPy reads float64
    if arr.dtype == object or arr.dtype.kind not in "iu":
        dtype = dtype_name(index) if hasattr(index, "dtype") else str(arr.dtype)
        if not hasattr(index, "dtype") and arr.dtype.kind == "f":
            flat = arr.reshape(-1)
            odd = flat[~np.isfinite(flat) | (flat != np.round(flat))]
            example = (odd if odd.size else flat)[0].item()
            raise FoldTypeError(
                f"{name} must hold integers (int8 .. int64, uint8 .. uint64); the sequence "
                f"given holds non-integer numbers (read as {dtype}): e.g. {example!r}"
            )
        if not hasattr(index, "dtype") and arr.dtype == object:
            raise FoldTypeError(
                f"{name} must be an array of integers (int8 .. int64, uint8 .. uint64); got "
                f"{_short(index)} ({type_label(index)}), which is no array of numbers"
            )
        raise index_dtype_error(dtype, name)
    flat = np.ravel(arr, order="C")
    if not flat.dtype.isnative:
        flat = flat.astype(flat.dtype.newbyteorder("="))
    return flat.reshape(arr.shape)


def index_dtype_error(dtype: str, name: str = "index") -> FoldTypeError:
    """The refusal of an index array of the non-integer dtype ``dtype`` (a canonical name).

    The one message for every index, read on the host (:func:`read_index`) or
    checked where it lives (a plan built on a device).
    """
    return FoldTypeError(
        f"{name} must be an array of integers (int8 .. int64, uint8 .. uint64); got dtype {dtype}"
    )


def index_range_error(
    shape: tuple[int, ...],
    position: int,
    value: int,
    K: int,
    bound: str | None = None,
    *,
    name: str = "index",
    negative: bool = False,
) -> IndexRangeError:
    """The error for an index entry outside ``[0, K)`` at flat ``position``.

    ``bound`` names the limit as the caller's user knows it (``"K = 433"`` by
    default; ``"len(a) = 3"`` for ``add_at``, the table size for an
    embedding). ``name`` names the index in the message (``"input"`` for an
    embedding's ids); ``negative=True`` says that ``-K <= index < 0`` was
    allowed too (an index that counts from the end, as torch's indexing reads
    it). The error keeps ``position``, ``value`` and ``K`` as attributes, so
    that a public function can re-raise it in its own words.
    """
    where = [int(w) for w in np.unravel_index(position, shape)] if shape else []
    limit = bound or f"K = {K}"
    allowed = f"-{K} <= {name} < {limit}" if negative else f"0 <= {name} < {limit}"
    err = IndexRangeError(
        f"{name}{where} = {value} (flat position {position}) is out "
        f"of range: every entry of {name} must satisfy {allowed}"
    )
    err.position, err.value, err.K = position, value, K
    return err


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
    trailing: tuple[int, ...] = ()  # the shape of the row each position brings

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def row_size(self) -> int:
        """Elements a position brings (1 for a scalar fold)."""
        return math.prod(self.trailing)


def _shape_error(shape: tuple[int, ...], plan_shape: tuple[int, ...]) -> ShapeError:
    n = math.prod(shape)
    size = math.prod(plan_shape)
    hint = ""
    if len(shape) == 1 and size and n % size == 0 and n > size:
        hint = (
            f" (a flat vector of {size}·{n // size} values is ambiguous: reshape it to "
            f"{(size, n // size)})"
        )
    forms = f"{plan_shape} + trailing"
    if plan_shape != (size,):
        forms += f" or {(size,)} + trailing"
    return ShapeError(
        f"values have shape {shape} but the index has shape {plan_shape}: the values have {n} "
        f"elements and this plan folds {size} values (or rows of values); pass values of shape "
        f"{forms}{hint}"
    )


def check_values(
    plan_shape: tuple[int, ...],
    values_shape: tuple[int, ...],
    dtype: Any,
    *,
    start: int | None = None,
    trailing: tuple[int, ...] | None = None,
) -> Values:
    """Check values of ``values_shape`` and ``dtype`` against a plan whose index has ``plan_shape``.

    With ``start=None`` the values cover every position: their shape is the
    index's shape followed by a *trailing* shape (each position brings a row
    of values; ``()`` for a scalar fold), or ``(N,)`` followed by the trailing
    shape, N being the number of positions. Anything else is refused with
    both shapes named: a transposed gradient (shape (3, 2) for a (2, 3) map)
    would be folded into the wrong buckets, and a flat vector of N·D values is
    ambiguous. With an integer ``start`` the values have shape
    ``(n,) + trailing`` and cover positions ``[start, start + n)``.
    ``trailing``, when given, is the trailing shape the caller requires (an
    accumulator's).
    """
    name = check_value_dtype(dtype_name(dtype))
    shape = tuple(int(s) for s in values_shape)
    plan_shape = tuple(int(s) for s in plan_shape)
    size = math.prod(plan_shape)
    if start is not None:
        if not shape:
            raise ShapeError(
                "values added at a start position need a leading positions axis; got a scalar"
            )
        positions, found = shape[0], shape[1:]
        first = check_start(start, positions, size)
    elif shape[: len(plan_shape)] == plan_shape:
        positions, found, first = size, shape[len(plan_shape) :], 0
    elif len(plan_shape) != 1 and shape[:1] == (size,):
        positions, found, first = size, shape[1:], 0
    else:
        raise _shape_error(shape, plan_shape)
    if trailing is not None and found != tuple(trailing):
        raise ShapeError(
            f"values have shape {shape}: rows of shape {found}, but this accumulator sums rows of "
            f"shape {tuple(trailing)}; pass values of shape (positions,) + {tuple(trailing)}"
        )
    return Values(name, shape, positions, first, found)


def check_init(K: int, values: Values, init_shape: tuple[int, ...], dtype: Any) -> str:
    """An array the values are folded into: shape ``(K,) + trailing``, a float dtype; its dtype."""
    name = check_value_dtype(dtype_name(dtype))
    want = (K, *values.trailing)
    if tuple(int(s) for s in init_shape) != want:
        raise ShapeError(
            f"init has shape {tuple(init_shape)}; folding values of shape {values.shape} into "
            f"K = {K} buckets needs init of shape (K,) + trailing = {want}"
        )
    return name


def check_trailing(trailing: Any) -> tuple[int, ...]:
    """A trailing (row) shape as a tuple of non-negative ints, or a refusal."""
    shape = None
    try:
        shape = tuple(int(s) for s in trailing)
    except (TypeError, ValueError):  # refused below, outside this block: one error
        pass
    if shape is None:
        raise FoldTypeError(f"trailing must be a shape (a tuple of ints); got {trailing!r}")
    if any(s < 0 for s in shape):
        raise ShapeError(f"trailing must be a shape of non-negative sizes; got {shape}")
    return shape


def check_expand_input(K: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``expand`` takes ``v`` of shape ``(K,) + trailing``; returns the trailing shape."""
    shape = tuple(int(s) for s in shape)
    if not shape or shape[0] != K:
        raise ShapeError(
            f"expand needs v of shape ({K},) or ({K},) + trailing (K = {K}); got shape {shape}"
        )
    return shape[1:]


__all__ = [
    "NO_DATA_DEVICES",
    "Values",
    "check_K",
    "check_K_fits",
    "check_expand_input",
    "check_has_data",
    "check_init",
    "check_start",
    "check_trailing",
    "check_values",
    "checked_options",
    "index_dtype_error",
    "index_range_error",
    "read_index",
    "refuse_unknown_options",
    "type_label",
    "unknown_option_error",
]
