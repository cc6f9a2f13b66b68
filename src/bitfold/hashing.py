"""Fixed counter-based hashes of (seed, row, column): bucket and sign maps of hashed layers.

A HashedNets-style layer needs an index map (which shared parameter each
weight reads) and optionally a sign map. Drawing them from a framework's
random generator ties the model to that generator's algorithm, version and
device. The maps here are instead a pure function of ``(seed, row, column)``,
defined bit for bit below, computed with NumPy ``uint64`` arithmetic, so the
same model has the same maps on every platform, device and version.

Definition (all arithmetic modulo 2^64 on unsigned 64-bit integers)
--------------------------------------------------------------------
``mix(z)`` is the splitmix64 finaliser (Steele, Lea, Flood 2014)::

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z =  z ^ (z >> 31)

With ``GAMMA = 0x9E3779B97F4A7C15`` and a *stream* number (``1`` for the
bucket map, ``2`` for the sign map), the hash of a position is::

    h(seed, stream, row, col) = mix( mix( mix(seed + stream * GAMMA) ^ row ) ^ col )

``seed``, ``row`` and ``col`` are non-negative integers below 2^64. Then::

    bucket(seed, row, col, K) = h(seed, 1, row, col) mod K                 in [0, K)
    sign(seed, row, col)      = +1 if the top bit (bit 63) of h(seed, 2, row, col) is 0 else -1

``mod K`` has a bias of at most ``K / 2^64`` per bucket, negligible for any
K a layer uses. For a layer whose weight has shape ``(rows, cols)`` (PyTorch's
``(out_features, in_features)``) the maps are these functions evaluated at
every ``(row, col)`` of the weight.

>>> bucket_map(0, (2, 3), K=5).tolist()
[[1, 4, 4], [2, 0, 2]]
>>> sign_map(0, (2, 3)).tolist()
[[1, -1, -1], [1, 1, -1]]
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .errors import FoldError, FoldTypeError
from .validate import check_K

GAMMA = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
#: stream numbers of the two maps
BUCKET_STREAM = 1
SIGN_STREAM = 2

_U64 = np.uint64
_MAX = (1 << 64) - 1


def mix(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of a ``uint64`` array (wrapping arithmetic), elementwise."""
    z = np.asarray(z, dtype=_U64)
    z = (z ^ (z >> _U64(30))) * _U64(MIX1)
    z = (z ^ (z >> _U64(27))) * _U64(MIX2)
    return z ^ (z >> _U64(31))


def _check_u64(x: Any, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        raise FoldTypeError(f"{what} must be an integer in [0, 2**64); got {x!r}")
    if not 0 <= int(x) <= _MAX:
        raise FoldError(f"{what} must be an integer in [0, 2**64); got {int(x)}")
    return int(x)


def _check_shape(shape: Any) -> tuple[int, int]:
    try:
        rows, cols = (int(s) for s in shape)
    except (TypeError, ValueError):
        raise FoldError(f"shape must be (rows, columns); got {shape!r}") from None
    if rows < 0 or cols < 0:
        raise FoldError(f"shape must be (rows, columns) with non-negative sizes; got {shape!r}")
    return rows, cols


def position_hash(seed: int, stream: int, shape: tuple[int, int]) -> np.ndarray:
    """``h(seed, stream, row, col)`` for every position of a ``(rows, cols)`` weight (uint64)."""
    seed = _check_u64(seed, "seed")
    stream = _check_u64(stream, "stream")
    rows, cols = _check_shape(shape)
    start = np.array([(seed + stream * GAMMA) & _MAX], dtype=_U64)
    per_row = mix(mix(start) ^ np.arange(rows, dtype=_U64))
    return mix(per_row[:, None] ^ np.arange(cols, dtype=_U64)[None, :])


def bucket_map(seed: int, shape: tuple[int, int], K: int) -> np.ndarray:
    """The bucket of every position, ``h(seed, 1, row, col) mod K``, as int64 of ``shape``."""
    K = check_K(K)
    return (position_hash(seed, BUCKET_STREAM, shape) % _U64(K)).astype(np.int64)


def sign_map(seed: int, shape: tuple[int, int]) -> np.ndarray:
    """The sign of every position, ``+1`` or ``-1`` from bit 63 of ``h(seed, 2, row, col)``."""
    top = position_hash(seed, SIGN_STREAM, shape) >> _U64(63)
    return (1 - 2 * top.astype(np.int8)).astype(np.int8)


__all__ = ["GAMMA", "bucket_map", "mix", "position_hash", "sign_map"]
