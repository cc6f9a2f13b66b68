"""Numba kernels that build a plan: one checked pass over the index, then the stable order.

A plan is built in two steps, each run in parallel over a fixed number of
*position chunks* (equal ranges of positions):

1. :func:`scan_index` reads the user's index once: it checks every entry
   against ``[0, K)``, writes the plan's compact copy (the narrowest integer
   type that holds K) and counts each chunk's entries per bucket;
2. :func:`stable_order` (only when a route needs it) places every position
   in the stable sorted order — bucket by bucket, increasing position within
   a bucket — each chunk starting at its own cursor per bucket, derived from
   the counts of step 1.

The stable sorted order of an index is unique, and so are its counts: the
number of chunks (chosen from N and K only) changes the speed, never the
result.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

#: Most position chunks of a plan's passes.
MAX_CHUNKS = 64
#: Chunks keep one count per bucket each: at most this many counts per position.
COUNTS_PER_POSITION = 1 / 8
#: Below this many positions the passes run in one chunk, on the calling thread.
PARALLEL_MIN_POSITIONS = 1 << 17


def chunk_count(n: int, K: int) -> int:
    """Position chunks of the plan's passes: from N and K only (their C x K counts stay small)."""
    if n < PARALLEL_MIN_POSITIONS:
        return 1
    return int(max(1, min(MAX_CHUNKS, int(n * COUNTS_PER_POSITION) // max(K, 1))))


def index_dtype(K: int) -> np.dtype:
    """The narrowest integer type a plan stores its index in: it holds every id below K."""
    if K <= 1 << 16:
        return np.dtype(np.uint16)
    if K <= np.iinfo(np.int32).max:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


@njit(cache=True, nogil=True)
def _scan_chunk(index, compact, counts, lo, hi):  # pragma: no cover - compiled
    # Two simple loops (a copy with min and max, which vectorises, then the counts) beat one
    # fused loop; slices let the loops start at 0, so Numba drops its negative-index checks.
    K = counts.shape[0]
    ix, cp = index[lo:hi], compact[lo:hi]
    least, most = np.int64(0), np.int64(0)
    for t in range(hi - lo):
        k = np.int64(ix[t])  # a uint64 above int64's range wraps negative: refused
        least = min(least, k)
        most = max(most, k)
        cp[t] = k
    if least < 0 or most >= K:
        for t in range(hi - lo):
            k = np.int64(ix[t])
            if k < 0 or k >= K:
                return lo + t
    for t in range(hi - lo):
        counts[cp[t]] += 1
    return -1


@njit(cache=True, parallel=True)
def _scan_chunks(index, compact, counts, first_bad):  # pragma: no cover - compiled
    n = index.shape[0]
    C = counts.shape[0]
    for c in prange(C):
        first_bad[c] = _scan_chunk(index, compact, counts[c], n * c // C, n * (c + 1) // C)


def scan_index(index: np.ndarray, compact: np.ndarray, counts: np.ndarray) -> int:
    """Check, copy and count ``index`` in one pass; the first bad position, or -1.

    ``compact`` (N,) receives the index in its own dtype; ``counts`` (C, K)
    int32 or int64, zeroed by the caller, receives chunk c's count of each
    bucket (chunk c holds positions ``N*c//C .. N*(c+1)//C``). An entry
    outside ``[0, K)`` stops the pass: the lowest such position is returned.
    """
    C = counts.shape[0]
    if C == 1:
        return int(_scan_chunk(index, compact, counts[0], 0, index.shape[0]))
    from .cpu import dynamic_schedule

    first_bad = np.empty(C, np.int64)
    with dynamic_schedule():
        _scan_chunks(index, compact, counts, first_bad)
    bad = first_bad[first_bad >= 0]
    return int(bad.min()) if bad.size else -1


@njit(cache=True, nogil=True)
def _place_chunk(index, cursor, order, lo, hi):  # pragma: no cover - compiled
    ix = index[lo:hi]
    for t in range(hi - lo):
        k = ix[t]
        order[cursor[k]] = lo + t
        cursor[k] += 1


@njit(cache=True, parallel=True)
def _place_chunks(index, cursors, order):  # pragma: no cover - compiled
    n = index.shape[0]
    C = cursors.shape[0]
    for c in prange(C):
        _place_chunk(index, cursors[c], order, n * c // C, n * (c + 1) // C)


@njit(cache=True, nogil=True)
def _chunk_cursors(counts, offsets, cursors):  # pragma: no cover - compiled
    C, K = counts.shape
    for k in range(K):
        at = offsets[k]
        for c in range(C):
            cursors[c, k] = at
            at += counts[c, k]


def stable_order(
    index: np.ndarray, counts: np.ndarray | None, offsets: np.ndarray, order: np.ndarray
) -> None:
    """Fill ``order`` with the positions sorted by bucket, increasing within a bucket.

    ``counts`` (C, K) are :func:`scan_index`'s chunk counts of ``index`` (None:
    one chunk), ``offsets`` (K + 1) the bucket starts: chunk c places its
    positions of bucket k from ``offsets[k]`` plus the earlier chunks' counts of k.
    """
    if counts is None:
        _place_chunk(index, offsets[:-1].copy(), order, 0, index.shape[0])
        return
    cursors = np.empty(counts.shape, order.dtype)
    _chunk_cursors(counts, offsets, cursors)
    from .cpu import dynamic_schedule

    with dynamic_schedule():
        _place_chunks(index, cursors, order)


__all__ = [
    "MAX_CHUNKS",
    "chunk_count",
    "index_dtype",
    "scan_index",
    "stable_order",
]
