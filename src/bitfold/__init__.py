"""bitfold: exact, bit-reproducible folds (static-index scatter-adds).

``Fold(index, K)`` is a plan built once; ``plan(values)`` returns the K
sums, by default correctly rounded (strategy ``exact``): the same bits for
every order, thread count, split of the work and backend.

Importing bitfold imports NumPy and Numba only; framework adapters live in
``bitfold.torch`` and ``bitfold.jax`` and load when imported.
"""

from ._version import __version__
from .digest import bits_equal, digest
from .errors import (
    DeviceError,
    FoldError,
    FoldTypeError,
    IndexRangeError,
    ShapeError,
    UnknownStrategyError,
)
from .exactsum import CANONICAL_NAN_BITS, ExactAccumulator
from .manifest import record
from .plan import Fold
from .strategies import get_strategy, strategies

__all__ = [
    "CANONICAL_NAN_BITS",
    "DeviceError",
    "ExactAccumulator",
    "Fold",
    "FoldError",
    "FoldTypeError",
    "IndexRangeError",
    "ShapeError",
    "UnknownStrategyError",
    "__version__",
    "bits_equal",
    "digest",
    "get_strategy",
    "record",
    "strategies",
]
