"""bitfold: exact, bit-reproducible folds (static-index scatter-adds).

``Fold(index, K)`` is a plan built once; ``plan(values)`` returns the K
sums, by default correctly rounded (strategy ``exact``): the same bits for
every order, thread count, split of the work and backend.

Importing bitfold imports NumPy and Numba only; framework adapters live in
``bitfold.torch`` and ``bitfold.jax`` and load when imported. The tools
(``digest``, ``bits_equal``, ``record``) load on first use.
"""

from __future__ import annotations

from typing import Any

from ._version import __version__
from .backends.registry import backend_names
from .errors import (
    BitfoldWarning,
    DeviceError,
    FoldError,
    FoldTypeError,
    IndexRangeError,
    SelfTestError,
    SelfTestWarning,
    ShapeError,
    UnknownOptionError,
    UnknownStrategyError,
)
from .exact import ExactAccumulator
from .formats import CANONICAL_NAN_BITS
from .functions import add_at, segment_sum
from .plan import Fold
from .strategies import get_strategy, strategies

#: public name -> module that defines it, imported on first use (PEP 562)
_LAZY = {
    "digest": "bitfold.repro.digest",
    "bits_equal": "bitfold.repro.digest",
    "record": "bitfold.repro.manifest",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bitfold' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "CANONICAL_NAN_BITS",
    "BitfoldWarning",
    "DeviceError",
    "ExactAccumulator",
    "Fold",
    "FoldError",
    "FoldTypeError",
    "IndexRangeError",
    "SelfTestError",
    "SelfTestWarning",
    "ShapeError",
    "UnknownOptionError",
    "UnknownStrategyError",
    "__version__",
    "add_at",
    "backend_names",
    "bits_equal",
    "digest",
    "get_strategy",
    "record",
    "segment_sum",
    "strategies",
]
