"""``exact`` (the default): the correctly rounded sum of every bucket.

``fold(values)[k] == round_to_nearest_even(exact real sum of bucket k)`` in
the output dtype, with the zero, NaN, Inf and overflow rules of
:mod:`bitfold.exactsum`. Same bits for every order, thread count, split of
the work, backend and device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..exactsum import ExactAccumulator
from . import register

if TYPE_CHECKING:
    from ..plan import Fold


@register("exact", "correctly rounded: same bits for every order, thread count and backend")
def fold_exact(plan: Fold, values: np.ndarray, out_dtype: str) -> np.ndarray:
    """One exact accumulation of all values, rounded once to ``out_dtype``."""
    acc = ExactAccumulator(plan, values.dtype.name)
    return acc.add(values).result(out_dtype)
