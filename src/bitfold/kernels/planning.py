"""Numba kernels that build a plan: one checked pass over the index, then the stable order.

A plan is built in two steps, each run in parallel over *position chunks*
(equal ranges of positions), each chunk with its own count of every bucket:

1. :func:`scan_index` reads the user's index once: it checks every entry
   against ``[0, K)``, writes the plan's compact copy (the narrowest integer
   type that holds K) and counts the buckets;
2. :func:`stable_order` (only when a route needs it) counts again per chunk
   and places every position in the stable sorted order — bucket by bucket,
   increasing position within a bucket — each chunk from its own cursor per
   bucket.

The stable sorted order of an index is unique, and so are its counts: the
number of chunks changes the speed, never the result.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .compile_lock import one_compiler_at_a_time
from .compiling import read_only

#: Most position chunks of a plan's passes.
MAX_CHUNKS = 64
#: Up to this many counts per position, every one of MAX_CHUNKS chunks keeps its own.
SMALL_COUNTS_PER_POSITION = 1 / 8
#: Up to this many buckets a plan counts them while it checks the index (the counts stay in
#: the caches); beyond, it counts them when a route first needs the offsets.
EAGER_COUNT_MAX_K = 1 << 16
#: Below this many positions the passes run in one chunk, on the calling thread.
PARALLEL_MIN_POSITIONS = 1 << 17
#: Below this many positions, a plan of more buckets than :data:`MAX_CHUNKS` chunks could count
#: in the caches places in one chunk too: two threads placing a few positions a bucket write
#: the same cache lines of the order (N = 262,144 into 50,000 buckets: 2.3 ms in two chunks,
#: 1.1 ms in one; equal at N = 786,432 into 100,000; two faster from there on).
PARALLEL_PLACE_MIN_POSITIONS = 3 << 18


def chunk_count(n: int, K: int) -> int:
    """Position chunks of the plan's passes: many while their counts are small, else one a thread.

    The plan's counts and order are unique, so the chunk count may follow the
    thread count (unlike the folds', whose float sums must not): with few
    buckets, :data:`MAX_CHUNKS` chunks whose counts stay in the caches, handed
    to whichever thread is free; with many, one chunk a thread (each chunk's
    counts are K more integers), and never more counts than positions.
    """
    if n < PARALLEL_MIN_POSITIONS:
        return 1
    if MAX_CHUNKS * K <= n * SMALL_COUNTS_PER_POSITION:
        return MAX_CHUNKS
    if n < PARALLEL_PLACE_MIN_POSITIONS:
        return 1
    from .cpu import thread_count

    return int(max(1, min(thread_count(), n // max(K, 1))))


def index_dtype(K: int) -> np.dtype:
    """The narrowest integer type a plan stores its index in: it holds every id below K."""
    if K <= 1 << 16:
        return np.dtype(np.uint16)
    if K <= np.iinfo(np.int32).max:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


@njit(cache=True, nogil=True)
def _scan_chunk(index, compact, counts, K, lo, hi):  # pragma: no cover - compiled
    # Two simple loops (a copy with min and max, which vectorises, then the counts) beat one
    # fused loop; slices let the loops start at 0, so Numba drops its negative-index checks.
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
    if counts.shape[0]:  # counts of width 0: check and copy only
        for t in range(hi - lo):
            counts[cp[t]] += 1
    return -1


@njit(cache=True, parallel=True)
def _scan_chunks(index, compact, counts, K, first_bad):  # pragma: no cover - compiled
    n = index.shape[0]
    C = counts.shape[0]
    for c in prange(C):
        first_bad[c] = _scan_chunk(index, compact, counts[c], K, n * c // C, n * (c + 1) // C)


def scan_index(index: np.ndarray, compact: np.ndarray, counts: np.ndarray, K: int) -> int:
    """Check, copy and count ``index`` in one pass; the first bad position, or -1.

    ``compact`` (N,) receives the index in its own dtype; ``counts`` (C, K)
    int32 or int64, zeroed by the caller, receives chunk c's count of each
    bucket (chunk c holds positions ``N*c//C .. N*(c+1)//C``); counts of shape
    (C, 0) count nothing. An entry outside ``[0, K)`` stops the pass: the
    lowest such position is returned.
    """
    C = counts.shape[0]
    index = read_only(index)  # the caller's array, writable or not: one compiled type
    if C == 1:
        return int(_scan_chunk(index, compact, counts[0], K, 0, index.shape[0]))
    from .cpu import dynamic_schedule

    first_bad = np.empty(C, np.int64)
    with dynamic_schedule():
        _scan_chunks(index, compact, counts, K, first_bad)
    bad = first_bad[first_bad >= 0]
    return int(bad.min()) if bad.size else -1


@njit(cache=True, nogil=True)
def _differs_chunk(index, compact, lo, hi):  # pragma: no cover - compiled
    # a count, not an early exit: the loop vectorises (an index met again usually matches)
    ix, cp = index[lo:hi], compact[lo:hi]
    differ = 0
    for t in range(hi - lo):
        differ += np.int64(ix[t]) != np.int64(cp[t])
    return differ


@njit(cache=True, parallel=True)
def _differs_chunks(index, compact, differ):  # pragma: no cover - compiled
    n = index.shape[0]
    C = differ.shape[0]
    for c in prange(C):
        differ[c] = _differs_chunk(index, compact, n * c // C, n * (c + 1) // C)


def same_entries(index: np.ndarray, compact: np.ndarray) -> bool:
    """True when the flat integer arrays ``index`` and ``compact`` hold the same values.

    Any integer dtypes; values are compared as int64, so a uint64 above int64's
    range (which no plan holds) never equals a plan's entry. Sizes must match.
    """
    n = index.shape[0]
    index, compact = read_only(index), read_only(compact)
    C = 1 if n < PARALLEL_MIN_POSITIONS else MAX_CHUNKS
    if C == 1:
        return int(_differs_chunk(index, compact, 0, n)) == 0
    from .cpu import dynamic_schedule

    differ = np.empty(C, np.int64)
    with dynamic_schedule():
        _differs_chunks(index, compact, differ)
    return int(differ.sum()) == 0


def bucket_offsets(index: np.ndarray, K: int, dtype: np.dtype) -> np.ndarray:
    """The K + 1 offsets of a checked ``index``: one counting pass, then the running totals."""
    n = index.shape[0]
    index = read_only(index)
    C = chunk_count(n, K)
    offsets = np.zeros(K + 1, dtype)
    counts = offsets[1:].reshape(1, K) if C == 1 else np.zeros((C, K), dtype)
    if C == 1:
        _count_chunk(index, counts[0], 0, n)
    else:
        from .cpu import dynamic_schedule

        with dynamic_schedule():
            _count_chunks(index, counts)
    offsets_from_counts(counts, offsets)
    return offsets


@njit(cache=True, nogil=True)
def _running_totals(counts, offsets):  # pragma: no cover - compiled
    C, K = counts.shape
    total = offsets.dtype.type(0)
    offsets[0] = 0
    for k in range(K):
        for c in range(C):
            total += counts[c, k]
        offsets[k + 1] = total  # counts may be offsets[1:] itself: counts[., k] is read first


def offsets_from_counts(counts: np.ndarray, offsets: np.ndarray) -> None:
    """``offsets[k + 1]`` = every chunk's count of buckets 0 .. k, in one pass (``offsets[0] = 0``).

    ``counts`` (C, K) may be ``offsets[1:]`` itself (one chunk): added up in place.
    """
    _running_totals(counts, offsets)


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


@njit(cache=True, nogil=True)
def _count_chunk(index, counts, lo, hi):  # pragma: no cover - compiled
    ix = index[lo:hi]
    for t in range(hi - lo):
        counts[ix[t]] += 1


@njit(cache=True, parallel=True)
def _count_chunks(index, counts):  # pragma: no cover - compiled
    n = index.shape[0]
    C = counts.shape[0]
    for c in prange(C):
        _count_chunk(index, counts[c], n * c // C, n * (c + 1) // C)


def stable_order(index: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> None:
    """Fill ``order`` with the positions sorted by bucket, increasing within a bucket.

    ``index`` is a plan's compact index and ``offsets`` (K + 1) its bucket
    starts. With several chunks, each counts its own positions per bucket;
    chunk c then places its positions of bucket k from ``offsets[k]`` plus the
    earlier chunks' counts of k.
    """
    K = offsets.shape[0] - 1
    index = read_only(index)
    C = chunk_count(index.shape[0], K)
    if C == 1:
        _place_chunk(index, offsets[:-1].copy(), order, 0, index.shape[0])
        return
    from .cpu import dynamic_schedule

    counts = np.zeros((C, K), order.dtype)
    with dynamic_schedule():
        _count_chunks(index, counts)
    cursors = np.empty_like(counts)
    _chunk_cursors(counts, offsets, cursors)
    with dynamic_schedule():
        _place_chunks(index, cursors, order)


@njit(cache=True, parallel=True)
def _fill_buckets(offsets, out, chunks):  # pragma: no cover - compiled
    n = out.shape[0]
    K = offsets.shape[0] - 1
    for c in prange(chunks):
        lo, hi = n * c // chunks, n * (c + 1) // chunks
        if lo == hi:
            continue
        k = np.searchsorted(offsets, lo, side="right") - 1  # the bucket holding position lo
        t = lo
        while t < hi:
            end = min(offsets[k + 1], hi)
            while t < end:
                out[t] = k
                t += 1
            k += 1
            if k >= K:
                break


def sorted_buckets(offsets: np.ndarray, out: np.ndarray) -> None:
    """Fill ``out`` (N,) with the bucket of every sorted position: each k ``counts[k]`` times.

    Written in sequence from the offsets, in parallel over position chunks, with
    no temporary (``np.repeat`` would widen the counts to 8 bytes a bucket).
    """
    n = out.shape[0]
    _fill_buckets(offsets, out, MAX_CHUNKS if n >= PARALLEL_MIN_POSITIONS else 1)


# -- a radix sort, for plans of many more buckets than positions ---------------------------------
#: Bits of bucket id sorted by one radix pass: 2,048 counts a chunk, and as many places each
#: chunk writes to at once (12 bits measured slower: too many places for the caches).
RADIX_BITS = 11


def radix_passes(K: int) -> int:
    """Passes of :data:`RADIX_BITS` bits that sort ids below ``K``."""
    bits = max(1, int(K - 1).bit_length())
    return -(-bits // RADIX_BITS)


def prefer_radix(n: int, K: int) -> bool:
    """Whether :func:`radix_order` is cheaper than the counting sort for ``n`` positions.

    A counting sort reads and writes K-long counts, offsets and cursors at random: past
    :data:`EAGER_COUNT_MAX_K` buckets and more buckets than positions, a few passes over
    the positions with 2^RADIX_BITS counts each cost less.
    """
    return K > EAGER_COUNT_MAX_K and K > n


@njit(cache=True, nogil=True)
def _digit_counts(keys, shift, counts, lo, hi):  # pragma: no cover - compiled
    mask = (1 << RADIX_BITS) - 1
    ks = keys[lo:hi]
    for t in range(hi - lo):
        counts[(np.int64(ks[t]) >> shift) & mask] += 1


@njit(cache=True, parallel=True)
def _digit_counts_chunks(keys, shift, counts):  # pragma: no cover - compiled
    n = keys.shape[0]
    C = counts.shape[0]
    for c in prange(C):
        counts[c, :] = 0
        _digit_counts(keys, shift, counts[c], n * c // C, n * (c + 1) // C)


@njit(cache=True, nogil=True)
def _digit_cursors(counts, cursors):  # pragma: no cover - compiled
    C, D = counts.shape
    at = 0
    for d in range(D):
        for c in range(C):
            cursors[c, d] = at
            at += counts[c, d]


@njit(cache=True, nogil=True)
def _digit_place(keys, positions, shift, cursor, out_keys, out_positions, lo, hi, first):
    # pragma: no cover - compiled
    mask = (1 << RADIX_BITS) - 1
    for t in range(lo, hi):
        k = keys[t]
        d = (np.int64(k) >> shift) & mask
        at = cursor[d]
        out_keys[at] = k
        out_positions[at] = t if first else positions[t]
        cursor[d] = at + 1


@njit(cache=True, parallel=True)
def _digit_place_chunks(keys, positions, shift, cursors, out_keys, out_positions, first):
    # pragma: no cover - compiled
    n = keys.shape[0]
    C = cursors.shape[0]
    for c in prange(C):
        _digit_place(keys, positions, shift, cursors[c], out_keys, out_positions,
                     n * c // C, n * (c + 1) // C, first)  # fmt: skip


def radix_order(index: np.ndarray, K: int, order: np.ndarray, sorted_index: np.ndarray) -> None:
    """:func:`stable_order` by a least-significant-digit radix sort, without offsets.

    Fills ``order`` with the positions sorted by bucket, increasing within a
    bucket, and ``sorted_index`` (the index's dtype) with the bucket of every
    sorted position (``index[order]``). Each pass is a stable counting sort on
    :data:`RADIX_BITS` bits of the id, in parallel over position chunks that
    place from their own cursors: the result is the unique stable order,
    whatever the chunk count. O(passes x N), no K-long array: at N = 3.1M, K = 10^7 about
    50 ms where the counting sort takes 120-140 ms (three passes; `/tmp` timing).
    """
    n = index.shape[0]
    passes = radix_passes(K)
    C = 1
    if n >= PARALLEL_MIN_POSITIONS:  # one chunk a thread: more chunks write to more places
        from .cpu import thread_count

        C = thread_count()
    counts = np.empty((C, 1 << RADIX_BITS), np.int64)
    cursors = np.empty_like(counts)
    # the passes alternate between two buffers and end in the caller's arrays
    spare_keys, spare_positions = np.empty_like(sorted_index), np.empty_like(order)
    if passes % 2:
        bufs = [(sorted_index, order), (spare_keys, spare_positions)]
    else:
        bufs = [(spare_keys, spare_positions), (sorted_index, order)]
    # positions unread in the first pass (they are 0 .. n-1); every pass reads its inputs only
    keys, positions = read_only(index), read_only(order)
    for p in range(passes):
        shift = p * RADIX_BITS
        out_keys, out_positions = bufs[p % 2]
        _digit_counts_chunks(keys, shift, counts)
        _digit_cursors(counts, cursors)
        _digit_place_chunks(keys, positions, shift, cursors, out_keys, out_positions, p == 0)
        keys, positions = read_only(out_keys), read_only(out_positions)


# -- partitions: positions grouped by their id's high bits, for the partitioned stream ---------
#: Buckets of one partition: a partition's float64 sums (512 KiB) stay in a core's L2 cache.
PARTITION_BITS = 16
#: Most buckets a layout groups: one radix digit of partitions.
PARTITIONED_MAX_K = 1 << (PARTITION_BITS + RADIX_BITS)


@njit(cache=True, nogil=True)
def _partition_place(index, cursor, dest, local, lo, hi):  # pragma: no cover - compiled
    mask = (1 << PARTITION_BITS) - 1
    for t in range(lo, hi):
        k = np.int64(index[t])
        p = k >> PARTITION_BITS
        at = cursor[p]
        dest[t] = at
        local[at] = k & mask
        cursor[p] = at + 1


@njit(cache=True, parallel=True)
def _partition_place_chunks(index, cursors, dest, local):  # pragma: no cover - compiled
    n = index.shape[0]
    C = cursors.shape[0]
    for c in prange(C):
        _partition_place(index, cursors[c], dest, local, n * c // C, n * (c + 1) // C)


def partition_layout(index: np.ndarray, K: int, dest: np.ndarray, local: np.ndarray) -> np.ndarray:
    """Group the positions by partition (id >> :data:`PARTITION_BITS`), in position order in each.

    Fills ``dest`` (N,) with the place of every position in the grouped order,
    and ``local`` (N,) uint16 with the id, less its partition's first id, at
    every place; returns the ``partitions + 1`` starts of the partitions'
    places. One stable counting pass (the radix sort's, on one digit) in
    parallel over position chunks, each placing from its own cursors: the
    layout is unique, whatever the chunk count. Needs ``K <=``
    :data:`PARTITIONED_MAX_K` (callers check; a ValueError otherwise).
    """
    n = index.shape[0]
    partitions = max(1, (K + (1 << PARTITION_BITS) - 1) >> PARTITION_BITS)
    if K > PARTITIONED_MAX_K:
        raise ValueError(f"K = {K:,} has more than {1 << RADIX_BITS:,} partitions")
    C = 1
    if n >= PARALLEL_MIN_POSITIONS:
        from .cpu import thread_count

        C = thread_count()
    counts = np.empty((C, 1 << RADIX_BITS), np.int64)
    cursors = np.empty_like(counts)
    index = read_only(index)
    _digit_counts_chunks(index, PARTITION_BITS, counts)
    _digit_cursors(counts, cursors)
    starts = np.empty(partitions + 1, np.int64)
    starts[:partitions] = cursors[0, :partitions]
    starts[partitions] = n
    _partition_place_chunks(index, cursors, dest, local)
    return starts


@njit(cache=True, nogil=True)
def touched_order(index, sizes, wrap):  # pragma: no cover - compiled
    """Check a small index and sort its positions by the buckets they touch, in one pass.

    ``index`` (M, N) of any integer dtype holds, for each of N positions, its
    ids along M dimensions of ``sizes`` (M int64): the position's bucket is
    their row-major flat id, one of K = ``prod(sizes)`` (M = 1: the ids
    themselves, below ``sizes[0]``). With ``wrap`` an id in ``[-size, 0)``
    stands for itself plus its dimension's size (torch's indexing).

    Returns ``(U, slot, touched, offsets, order)``: the U buckets the index
    touches get compact ids ``0 .. U-1`` in the order they first appear
    (``touched[u]`` is bucket ``u``'s flat id, ``slot[k]`` bucket ``k``'s
    compact id or -1, int32 of K), and ``offsets`` (U + 1) and ``order`` (N)
    int32 are their starts and the stable order of positions (as
    :func:`bucket_offsets` and :func:`stable_order` of the compact ids). U is
    -1 when an id is outside its range, found before anything is sorted: the
    caller refuses it the usual way. One call in place of the dozen NumPy
    calls a count, a sort and their checks take, and no pass over the K
    buckets but one to mark them (a fold of a few hundred rows, such as an
    ``index_add`` of one batch, spends more on calls than on sums).
    """
    M, n = index.shape
    K = np.int64(1)
    for d in range(M):
        K *= sizes[d]
    slot = np.full(K, -1, np.int32)
    touched = np.empty(n, np.int64)
    offsets = np.zeros(n + 1, np.int32)
    order = np.empty(n, np.int32)
    compact = np.empty(n, np.int32)
    U = 0
    for t in range(n):
        if M == 1:  # the common case: no loop over dimensions
            k = np.int64(index[0, t])
            if wrap and k < 0:
                k += K
            if k < 0 or k >= K:
                return -1, slot, touched, offsets, order
        else:
            k = np.int64(0)
            for d in range(M):
                j = np.int64(index[d, t])
                if wrap and j < 0:
                    j += sizes[d]
                if j < 0 or j >= sizes[d]:
                    return -1, slot, touched, offsets, order
                k = k * sizes[d] + j
        u = slot[k]
        if u < 0:
            u = slot[k] = U
            touched[U] = k
            U += 1
        compact[t] = u
        offsets[u + 1] += 1
    for u in range(U):
        offsets[u + 1] += offsets[u]
    cursor = offsets[:U].copy()
    for t in range(n):
        u = compact[t]
        order[cursor[u]] = t
        cursor[u] += 1
    return U, slot, touched, offsets[: U + 1], order


__all__ = [
    "MAX_CHUNKS",
    "PARTITION_BITS",
    "bucket_offsets",
    "chunk_count",
    "index_dtype",
    "offsets_from_counts",
    "partition_layout",
    "prefer_radix",
    "radix_order",
    "radix_passes",
    "same_entries",
    "scan_index",
    "sorted_buckets",
    "stable_order",
    "touched_order",
]


one_compiler_at_a_time(globals())
