"""What the two one-word paths share: the terms of a fold, their bits, and order-free scatters.

Both paths (:mod:`.narrow`, :mod:`.shared_unit`) hold each term as one
integer word (int64; the shared unit's int32 digits in JAX's 32-bit mode),
read the values' bits as integers (immune to flush-to-zero), scatter with
integer adds, maxima and minima (order-free like the add), and take an eager
fold's values in chunks that stay in the caches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...arrays import ArrayFamily
from ...formats import FLOATS, LimbFormat
from .digits import Words

#: The narrow path's sums: one signed int64 word a bucket, rounded as two 32-bit digits.
NARROW = Words("int64", 64, 32, 2, 1 << 30)
#: Bits of a narrow word a sum may fill (its sign bit kept clear).
NARROW_BITS = 63


@dataclass(frozen=True)
class Terms:
    """The terms of one fold on one array family, for the one-word paths.

    ``groups`` are ``(index, values, dtype)``: output ids ``(n,)`` and values
    ``(n,) + shape[1:]``, summed into output elements of ``shape`` beside
    ``like`` (its library and device) in the limb format ``fmt``.
    """

    ops: ArrayFamily
    like: Any
    fmt: LimbFormat
    shape: tuple[int, ...]
    groups: list[tuple[Any, Any, str]]

    def chunks(self, index: Any) -> list[tuple[int, int]]:
        """The position ranges an eager fold takes ``index``'s values in (:func:`eager_chunks`)."""
        R = math.prod(self.shape)
        return eager_chunks(self.ops, self.like, int(index.shape[0]), R // self.shape[0], R)


def larger(ops: ArrayFamily, a: Any, b: Any) -> Any:
    return ops.where(a > b, a, b)


#: ``2^31 - 1``: added to a magnitude (int32, wrapping) so that 0 becomes the largest value and
#: every other magnitude ``m`` becomes ``m - 2^31 - 1``: a minimum then finds the least nonzero.
WRAP = (1 << 31) - 1


def value_bits(ops: ArrayFamily, values: Any, dtype: str) -> tuple[Any, Any]:
    """(signed bit patterns, their magnitudes' bits): int32 for 16-bit formats, else the width."""
    f = FLOATS[dtype]
    bits = ops.bitcast(values, f.signed_bits_dtype.name)
    if f.width < 32:
        bits = ops.astype(bits, "int32")
    return bits, bits & ((1 << (f.width - 1)) - 1)


def eager_chunks(ops: ArrayFamily, like: Any, n: int, row: int, R: int) -> list[tuple[int, int]]:
    """Position ranges an eager fold takes in turn (from the shapes only): each chunk's
    temporaries stay in the caches and are made again from freed memory, where one pass over
    all the values would fault in fresh pages for every operation. Where the family does not
    chunk a fold of ``like`` (:meth:`~bitfold.arrays.ArrayFamily.chunks_eager_folds`: traced
    folds, libraries that fuse a fold): one range."""
    if not ops.chunks_eager_folds(like):
        return [(0, n)]
    step = max(1, max(1 << 18, 4 * R) // max(row, 1))
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)] or [(0, 0)]
