"""What the portable path takes: array families (and what it asks of each library beyond its
family's operations), value and result dtypes, options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...arrays import ArrayFamily, family_of
from ...errors import DeviceError, FoldError, FoldTypeError
from ...formats import F64, LimbFormat, check_value_dtype, dtype_name, limb_format_for


@dataclass(frozen=True)
class Library:
    """What the portable path asks of an array library that its family's operations and
    capabilities (:class:`bitfold.arrays.ArrayFamily`: ``reads_without_sync``,
    ``traced_for_host``, ...) do not say: one row of :data:`LIBRARIES` a library.

    ``cond``: the library's conditional on a 0-d device flag,
    ``cond(flag, if_set, if_clear)``, that runs one branch only, without waiting for the
    device, inside a trace too (JAX's ``lax.cond``); None where it has none (both paths are
    then made and one selected, unless the flag is read where it lies).
    ``chunks_eager_folds``: an eager fold runs operation by operation, each making its
    temporaries at once in memory, so it takes its values in chunks whose temporaries stay
    in the caches (torch, NumPy); not a library that compiles and fuses a fold (JAX).
    """

    cond: Callable[[Any, Callable[[], Any], Callable[[], Any]], Any] | None = None
    chunks_eager_folds: bool = False


def _lax_cond(flag: Any, if_set: Callable[[], Any], if_clear: Callable[[], Any]) -> Any:
    import jax

    return jax.lax.cond(flag, if_set, if_clear)


#: The libraries whose families' operations the portable path is written against, and what it
#: asks of each beyond them. A new library: its family in :mod:`bitfold.arrays`, one row here.
LIBRARIES: dict[str, Library] = {
    "torch": Library(chunks_eager_folds=True),
    "cupy": Library(),
    "jax": Library(cond=_lax_cond),
    "numpy": Library(chunks_eager_folds=True),
}
#: The array families whose operations the portable path is written against.
FAMILIES: tuple[str, ...] = tuple(LIBRARIES)


def library(ops: ArrayFamily) -> Library:
    """The row of :data:`LIBRARIES` for ``ops``'s library (a family :func:`check_family` took)."""
    return LIBRARIES[ops.name]


def chunks_eager_folds(ops: ArrayFamily, like: Any) -> bool:
    """True when a fold of values like ``like`` runs eagerly (not traced) in a library whose
    eager folds take their values in chunks (:attr:`Library.chunks_eager_folds`)."""
    return ops.cache_key(like) is not None and library(ops).chunks_eager_folds


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
