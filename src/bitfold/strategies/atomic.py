"""``atomic``: the scatter-add everyone uses today, kept as the baseline.

On the CPU this is ``np.add.at(out, index, values)`` into a zeroed array of
the output dtype (NumPy happens to run it sequentially). It promises nothing
about order; probes and benchmarks compare against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..validate import numpy_out_dtype
from . import register

if TYPE_CHECKING:
    from ..plan import Fold


@register("atomic", "none: the order of the additions is the backend's choice")
def fold_atomic(plan: Fold, values: np.ndarray, out_dtype: str) -> np.ndarray:
    """``np.add.at`` into zeros of ``out_dtype``, values cast to ``out_dtype`` first."""
    dtype = numpy_out_dtype(out_dtype, "atomic")
    out = np.zeros(plan.K, dtype)
    np.add.at(out, plan.index64(), values.astype(dtype, copy=False))
    return out
