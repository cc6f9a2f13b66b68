"""``ordered``: the seed's fixed order, in O(N) memory and one pass.

Order, exactly: ``out`` starts as ``+0.0`` in the output dtype; then for
``i = 0, 1, ..., N-1`` (positions of the flat index, C order)
``out[index[i]] = out[index[i]] + values[i]``, each addition rounded to
nearest-even in the output dtype (float32 by default, float64 for float64
values). Within a bucket this adds its values in increasing position, which
is the stable sorted-index order, without gathering through it. Same bits on
every run of the same backend; not correctly rounded (use ``exact``). A NaN
result is always the canonical NaN (:data:`bitfold.CANONICAL_NAN_BITS`), as
on the GPU, so digests agree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..exactsum import canonicalise_nans
from ..kernels import cpu
from ..validate import numpy_out_dtype
from . import register

if TYPE_CHECKING:
    from ..plan import Fold


@register("ordered", "same bits on every run of the same backend (a fixed, documented order)")
def fold_ordered(plan: Fold, values: np.ndarray, out_dtype: str) -> np.ndarray:
    """Sequential left-to-right sum per bucket in ``out_dtype`` (see the module docstring)."""
    dtype = numpy_out_dtype(out_dtype, "ordered")
    out = np.zeros(plan.K, dtype)
    if dtype == np.float16:  # Numba has no float16 arithmetic: add in order in NumPy
        for i, k in enumerate(plan.index.tolist()):
            out[k] = out[k] + np.float16(values[i])
    else:
        cpu.ordered_fold(plan.index, values.astype(dtype, copy=False), out)
    return canonicalise_nans(out)
