"""The strategy registry: one name, one module, one signature.

Every strategy is a :class:`Strategy` whose ``fold(plan, values, out_dtype=)``
takes values of any supported library and returns the K sums in the same
library. Each validates through :mod:`bitfold.validate`, so all refuse the
same bad input with the same errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import gpu
from ..arrays import from_numpy
from ..errors import UnknownStrategyError
from ..validate import host_values, out_dtype_for

if TYPE_CHECKING:
    from ..plan import Fold

HostFold = Callable[["Fold", np.ndarray, str], np.ndarray]


@dataclass(frozen=True)
class Strategy:
    """A named way to compute the fold, and what it guarantees."""

    name: str
    guarantee: str
    host_fold: HostFold  # (plan, flat host values, out dtype) -> K sums

    def fold(self, plan: Fold, values: Any, *, out_dtype: Any = None) -> Any:
        """Validate ``values`` against ``plan``, fold them, return the library of ``values``.

        Values on a CUDA device (CuPy, torch CUDA, numba device arrays, any
        ``__cuda_array_interface__``) are folded there by :mod:`bitfold.gpu`,
        with the same numeric contract (``exact``: the same bits as here).
        """
        if gpu.is_device_array(values):
            return gpu.cuda_fold(plan, values, self.name, out_dtype)
        flat, name = host_values(plan, values)
        out_name = out_dtype_for(name, out_dtype)
        out = self.host_fold(plan, flat, out_name)
        return from_numpy(out, like=values, dtype_name=out_name)


_REGISTRY: dict[str, Strategy] = {}


def register(name: str, guarantee: str) -> Callable[[HostFold], HostFold]:
    """Decorator: register ``host_fold`` under ``name``."""

    def wrap(fn: HostFold) -> HostFold:
        _REGISTRY[name] = Strategy(name, guarantee, fn)
        return fn

    return wrap


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; an unknown name lists the valid ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownStrategyError(
            f"unknown strategy {name!r}; choose one of: {', '.join(strategies())}"
        ) from None


def strategies() -> tuple[str, ...]:
    """Names of the registered strategies, the default (``exact``) first."""
    return tuple(sorted(_REGISTRY, key=lambda n: (n != "exact", n)))


from . import atomic, exact, ordered  # noqa: E402  (register on import)

__all__ = ["Strategy", "atomic", "exact", "get_strategy", "ordered", "register", "strategies"]
