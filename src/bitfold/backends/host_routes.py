"""The host's exact routes: one ordered table, the first route whose test holds serves the fold.

Every route returns the same bits, the correctly rounded sum; they differ in
speed only, and are chosen from the shapes (K, the number of values, the
dtype, the row size), never from the data or the thread count. Each
:class:`Route` states when it is taken, why, and how it runs; its size
constants sit just above it (those that several routes share, in a section
before the first route). The sections follow the table's order:

1. ``buckets``: folds of rows (and folds into ``init``): each bucket's rows
   gathered through the plan's stable order and summed in a small scratch
   (:mod:`bitfold.kernels.buckets`); no per-bucket state is kept; run as
   :data:`ROW_TASKS` fixed tasks, a hot bucket cut into parts whose exact
   sums are merged as integers (:func:`bucket_tasks`). Past the caches
   (:data:`STAGED_MIN_VALUES` float32 values, a plan kept for more than one
   fold, unless long rows fit in half the last-level cache) the rows are
   read once in position order instead: the hot buckets'
   rows summed as they pass, the others copied into the plan's order and
   summed from there (:func:`staged_layout`);
2. ``half-stream``: float16 scalars, an exact int64 scatter-add in units of
   2^-24 (:mod:`bitfold.kernels.stream`);
3. ``limbs``: scalars into few buckets, added into the accumulator's state
   (:mod:`bitfold.backends.host_state`: float64 bins or integer limbs),
   rounded at the end;
4. ``partitioned-stream``: float32 and bfloat16 scalars into 2^19 to 2^20
   buckets: the values grouped by their bucket's high bits through a layout
   the plan keeps, each group's checked float64 sums in a core's L2 cache,
   the inexact buckets redone exactly;
5. ``float-stream``: float32 and bfloat16 scalars into more buckets than the
   limbs take, up to 2^20: checked float64 sums streamed in position order,
   one a bucket a slot, the inexact buckets redone exactly;
6. ``sorted-stream``: every other scalar fold (very many buckets, or float64
   values past the limbs): checked float64 sums in the plan's sorted order.

Rows of one element are scalars here. :func:`choose` names the route;
:func:`explain` says why; :func:`run` folds with a given route. The routes
read a plan as :class:`bitfold.plan_view.PlanView` and keep what they derive
from it through ``plan.prepared``, each cache under a key class of its own
(:class:`BucketBoundsKey`, :class:`BucketTasksKey`, :class:`StagedLayoutKey`,
:class:`PartitionLayoutKey`, :class:`SortedStartsKey`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import FoldError
from ..formats import FLOATS, LimbFormat, limb_format_for
from ..kernels import buckets, cpu, planning, stream
from ..kernels.compiling import first_use
from ..plan_view import PlanKey, PlanView
from ..validate import Values
from .cpu_caches import last_level_cache_bytes
from .host_arrays import empty_out, frozen, host_rows, host_values, target
from .host_buffers import reused_empty
from .host_state import add_to_state, new_state, round_state, slots_for


@dataclass(frozen=True)
class Shape:
    """What a route is chosen from: buckets, values (positions), value dtype, row size, and
    whether the plan was built for this one fold (:func:`bitfold.plan.one_shot`)."""

    K: int
    n: int
    dtype: str
    row_size: int
    once: bool = False


@dataclass(frozen=True)
class Route:
    """One exact route: when it is taken, why (a template over the shape and the constants), how.

    ``run(plan, values, spec, fmt, out_name, **options)`` returns a ``(K, D)``
    (or ``(K,)``) NumPy array of ``out_name``. ``scalars_only``, ``dtypes``
    (None: every dtype) and ``max_K`` (None: any K) say what a forced route
    can fold. ``first_use_s``: about how long its kernels take to compile on
    a first use with an empty cache, said while they do (seconds of CPU on a
    2-core VM, rounded up: 23.8 for float32 rows, 23.0 for float64 rows, 2.9
    half-stream, 5.0 limbs, 3.3 partitioned-stream, 4.2 float-stream, 6.6
    sorted-stream for float64).
    """

    name: str
    when: Callable[[Shape], bool]
    reason: str
    run: Callable[..., np.ndarray]
    scalars_only: bool = True
    dtypes: tuple[str, ...] | None = None
    max_K: int | None = None
    first_use_s: int = 10  # each entry of TABLE says its own


# -- shared by the streaming and bucket routes ------------------------------------------------
#: Independent bucket ranges of a bucket-by-bucket pass (fixed: never the thread count).
BUCKET_CHUNKS = 64
#: Most private states of a streaming route, and the bytes they may take per value.
STREAM_SLOTS = 16
STREAM_SLOT_BYTES_PER_VALUE = 8
#: Scalar folds into at most this many buckets stream in position order (``float-stream``), one
#: float64 a bucket a slot (at 10^6 buckets this beats reading the values through the plan's
#: order, and needs no order: a one-shot fold does not sort); ``partitioned-stream`` takes the
#: upper part of that range, below this limit too.
FLOAT_STREAM_MAX_K = 1 << 20


def stream_slots(n: int, K: int) -> int:
    """Private float64 (or int64) sums of a streaming route: :func:`host_state.slots_for`'s
    formula, one 8-byte sum a bucket, at most one a thread.

    The routes that use them are exact, so their result does not depend on
    how many there are (an exact sum is unique), only their speed does.
    """
    most = min(STREAM_SLOTS, cpu.thread_count())
    return slots_for(n, K, 8, most=most, bytes_per_value=STREAM_SLOT_BYTES_PER_VALUE)


@dataclass(frozen=True)
class BucketBoundsKey(PlanKey):
    """The key of a plan's :func:`bucket_bounds` cut into ``chunks`` ranges."""

    chunks: int


def bucket_bounds(plan: PlanView, n_values: int) -> np.ndarray:
    """Bucket ranges of about equal numbers of positions (a bucket is never split), cached."""
    chunks = BUCKET_CHUNKS if n_values >= cpu.PARALLEL_MIN_VALUES else 1

    def build() -> np.ndarray:
        # ceil(size * c / chunks), in the offsets' dtype: float targets would copy the offsets
        targets = -(np.arange(chunks + 1, dtype=np.int64) * -plan.size // chunks)
        bounds = np.searchsorted(plan.offsets, targets.astype(plan.offsets.dtype), side="left")
        bounds = bounds.astype(np.int64)
        bounds[0], bounds[-1] = 0, plan.K
        return frozen(np.maximum.accumulate(bounds))

    return plan.prepared(BucketBoundsKey(chunks), build)


# -- 1. buckets ---------------------------------------------------------------------------------
#: Tasks of about equal numbers of positions a fold of rows is cut into (fixed: never the
#: thread count), more than there are threads, so that threads take them as they free up.
ROW_TASKS = 256


def _is_rows(s: Shape) -> bool:
    return s.row_size != 1


def split_limit(n_positions: int) -> int:
    """Positions past which a bucket is cut into parts of at most this many (N only, fixed)."""
    return max(buckets.ROW_CHUNK, -(-n_positions // ROW_TASKS))


@dataclass(frozen=True)
class BucketTasksKey(PlanKey):
    """The key of a plan's :func:`bucket_tasks`, for a ``parallel`` fold or a serial one."""

    parallel: bool


def bucket_tasks(plan: PlanView, n_values: int) -> tuple[np.ndarray, np.ndarray]:
    """The tasks and split buckets of :func:`bitfold.kernels.buckets.fold_buckets`, cached.

    Bucket ranges of about ``N / ROW_TASKS`` positions; a bucket of more than
    :func:`split_limit` positions is a range of its own, cut into parts of
    that many positions (the last one shorter). Everything depends on the
    plan alone, never on the thread count; the result does not depend on it
    either (each part's sum is exact).
    """
    parallel = n_values >= cpu.PARALLEL_MIN_VALUES
    return plan.prepared(BucketTasksKey(parallel),
                         lambda: _task_table(plan.offsets, plan.K, parallel))  # fmt: skip


def _task_table(offsets_in: np.ndarray, K: int, parallel: bool) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bucket_tasks` for the bucket ranges ``offsets_in`` (K + 1 entries)."""
    size = int(offsets_in[-1]) if K else 0
    if not parallel or K == 0:
        return frozen(np.array([[0, K, 0, 0, -1]], np.int64)), frozen(np.empty((0, 3), np.int64))
    offsets = np.asarray(offsets_in, np.int64)
    limit = split_limit(size)
    hot = np.flatnonzero(np.diff(offsets) > limit)
    targets = np.linspace(0, size, ROW_TASKS + 1)
    cuts = np.searchsorted(offsets, targets, side="left")
    cuts = np.unique(np.clip(np.concatenate([cuts, hot, hot + 1, [0, K]]), 0, K))
    k0, k1 = cuts[:-1], cuts[1:]
    tasks: list[np.ndarray] = [np.stack([k0, k1, k0 * 0, k0 * 0, k0 * 0 - 1], axis=1)]
    split = np.empty((hot.size, 3), np.int64)
    parts = 0
    for h, k in enumerate(hot):
        lo = np.arange(offsets[k], offsets[k + 1], limit, dtype=np.int64)
        hi = np.minimum(lo + limit, offsets[k + 1])
        n = lo.size
        tasks.append(np.stack([lo * 0 + k, lo * 0 + k + 1, lo, hi,
                               np.arange(parts, parts + n)], axis=1))  # fmt: skip
        split[h] = (k, parts, parts + n)
        parts += n
    table = np.concatenate(tasks).astype(np.int64)
    whole = table[:, 4] < 0
    keep = ~whole | ~np.isin(table[:, 0], hot)  # a split bucket's range is its parts
    table = table[keep]
    table = table[np.lexsort((table[:, 2], table[:, 0]))]  # bucket order, parts in order
    return frozen(table), frozen(split)


# -- 1b. staged rows ----------------------------------------------------------------------------
#: float32 rows of at least this many values (N x D) into a plan kept for more than one fold
#: are read in position order (:func:`staged_layout`): past the caches, rows gathered in
#: the plan's order wait for memory (measured on the 2-core VM: 262,144 x 64 rows took 15 to
#: 17 ms gathered in a random order, 1.8 to 2.5 ms read in position order, one thread).
STAGED_MIN_VALUES = 1 << 21
#: ... unless each row has at least this many bytes and the rows fit in this share of the
#: last-level cache: long rows in the caches are gathered faster than they are copied into
#: order (an Intel VM with 480 MiB of L3, 2 cores, the fold interleaved with XLA's and
#: torch's: 65,536 x 768 rows 31 ms gathered against 48-54 ms staged, 131,072 x 256 18
#: against 31 ms, 262,144 x 128 23 against 26 ms; 262,144 x 64, 256-byte rows, 13 against
#: 11 ms: staged). Where the operating system reports no cache, rows are staged. (The
#: route's reason says "half": change it with the share.)
GATHERED_MIN_ROW_BYTES = 512
GATHERED_MAX_CACHE_SHARE = 0.5
#: Buckets of at least this many positions are summed as the rows stream past ("hot") ...
HOT_MIN_ROWS = 16
#: ... as many of the largest as have a float64 sum a value of a row within this many bytes
#: (the state one stream task adds into, kept in a core's L2 cache).
HOT_STATE_BYTES = 1 << 18
#: Hot buckets a task of the second pass merges and rounds.
HOT_MERGE_TASK = 32
#: Fixed tasks the position-order pass is cut into (never the thread count: each task keeps
#: its own hot sums, merged exactly).
STREAM_TASKS = 4


@dataclass(frozen=True)
class StagedLayout:
    """What :func:`bitfold.kernels.buckets.fold_staged` reads of a plan for rows of D values.

    ``hot``: the hot buckets (H, int64), ``is_hot`` (K booleans) marks them;
    ``route``: per position, its rank
    among the cold positions in the plan's order (where its row is staged),
    or ``-1 - h`` for a row of hot bucket ``hot[h]``; ``bounds``: the
    :data:`STREAM_TASKS` position ranges; ``stage_order``: the identity over
    the cold positions and ``stage_offsets`` their buckets' ranges (hot
    buckets empty), in the dtypes of the plan's order and offsets; ``tasks``
    and ``split``: :func:`bucket_tasks` of those ranges, then the hot buckets' merges
    ``(h0, h1, 0, 0, -2)``, :data:`HOT_MERGE_TASK` hot buckets each.
    """

    hot: np.ndarray
    is_hot: np.ndarray
    route: np.ndarray
    bounds: np.ndarray
    stage_order: np.ndarray
    stage_offsets: np.ndarray
    tasks: np.ndarray
    split: np.ndarray


def _gathered_in_cache(rows: np.ndarray) -> bool:
    """Rows of at least :data:`GATHERED_MIN_ROW_BYTES` that fit in
    :data:`GATHERED_MAX_CACHE_SHARE` of the last-level cache: gathering them is faster."""
    return (rows.shape[1] * rows.itemsize >= GATHERED_MIN_ROW_BYTES
            and rows.nbytes <= GATHERED_MAX_CACHE_SHARE * last_level_cache_bytes())  # fmt: skip


def _is_staged(plan: PlanView, rows: np.ndarray) -> bool:
    """float32 rows past :data:`STAGED_MIN_VALUES` values into a plan kept for more folds,
    except long rows in the caches (:func:`_gathered_in_cache`), each stream task at most
    2^29 positions (a spilled element's limbs take 2^29 values unnormalised)."""
    return (rows.dtype == np.float32 and rows.size >= STAGED_MIN_VALUES and not plan.once
            and rows.shape[1] > 1 and not _gathered_in_cache(rows)
            and plan.size <= (1 << 29) * STREAM_TASKS)  # fmt: skip


def _line_aligned(plan: PlanView, n: int, D: int) -> np.ndarray:
    """An uninitialised (n, D) uint32 array starting at a multiple of 64 bytes (whole cache
    lines for non-temporal stores), in memory the plan reuses (:func:`reused_empty`)."""
    nbytes = n * D * 4
    block = reused_empty(plan, (nbytes + 64,), np.uint8)
    skip = -block.ctypes.data % 64
    return block[skip : skip + nbytes].view(np.uint32).reshape(n, D)


@dataclass(frozen=True)
class StagedLayoutKey(PlanKey):
    """The key of a plan's :class:`StagedLayout` for rows of ``D`` values."""

    D: int


def staged_layout(plan: PlanView, D: int) -> StagedLayout:
    """The plan's :class:`StagedLayout` for rows of ``D`` values (built once, cached).

    Hot buckets: those of at least :data:`HOT_MIN_ROWS` positions, the largest
    first (ties: the lower bucket), at most ``HOT_STATE_BYTES // (8 D)`` of
    them. It depends on the plan and D alone, never on the values or threads.
    """
    most = max(0, HOT_STATE_BYTES // (8 * D))

    def build() -> StagedLayout:
        offsets = np.asarray(plan.offsets, np.int64)
        counts = np.diff(offsets)
        big = np.flatnonzero(counts >= HOT_MIN_ROWS)
        big = big[np.argsort(-counts[big], kind="stable")][:most]
        hot = np.sort(big).astype(np.int64)
        slot = np.full(plan.K, -1, np.int64)
        slot[hot] = np.arange(hot.size)
        index = np.asarray(plan.index)
        hot_slot = slot[index]
        order = plan.order
        cold_in_order = order[hot_slot[order] < 0]
        route = -1 - hot_slot
        route[cold_in_order] = np.arange(cold_in_order.size)
        cold_counts = counts.copy()
        cold_counts[hot] = 0
        stage_offsets = np.zeros(plan.K + 1, plan.offsets.dtype)
        np.cumsum(cold_counts, out=stage_offsets[1:])
        n = plan.size
        bounds = np.arange(STREAM_TASKS + 1, dtype=np.int64) * n // STREAM_TASKS
        parallel = cold_in_order.size * D >= cpu.PARALLEL_MIN_VALUES
        tasks, split = _task_table(stage_offsets, plan.K, parallel)
        h0 = np.arange(0, hot.size, HOT_MERGE_TASK, dtype=np.int64)
        merges = np.stack([h0, np.minimum(h0 + HOT_MERGE_TASK, hot.size), h0 * 0, h0 * 0,
                           h0 * 0 - 2], axis=1)  # fmt: skip
        tasks = frozen(np.concatenate([tasks, merges]))
        return StagedLayout(frozen(hot), frozen(slot >= 0), frozen(route), frozen(bounds),
                            frozen(np.arange(cold_in_order.size, dtype=order.dtype)),
                            frozen(stage_offsets), tasks, split)  # fmt: skip

    return plan.prepared(StagedLayoutKey(D), build)


def fold_buckets(
    plan: PlanView, rows: np.ndarray, fmt: LimbFormat, out_name: str, init: np.ndarray | None = None
) -> np.ndarray:
    """The exact fold of ``rows`` (positions, D) bucket by bucket: a (K, D) array of ``out_name``.

    ``init`` (K, D), in the rows' dtype, is one more term of every bucket.
    bfloat16 results come back as float32 holding bfloat16 values.
    """
    out, out_bits = empty_out(plan, (plan.K, rows.shape[1]), out_name)
    if out.size == 0:
        return out
    fast = out_name == rows.dtype.name  # an exact float64 sum is simply cast
    out_f = out if fast else np.empty((1, 1), rows.dtype)
    goal = target(out_name, fmt)
    if init is None and _is_staged(plan, rows):
        lay = staged_layout(plan, rows.shape[1])
        stage = _line_aligned(plan, lay.stage_order.size, rows.shape[1])
        if buckets.fold_staged(rows, lay.route, lay.bounds, lay.hot, lay.is_hot, stage,
                               lay.stage_order, lay.stage_offsets, lay.tasks, lay.split, out_f,
                               out_bits, goal, fast, fmt.limbs):  # fmt: skip
            return out
    tasks, split = bucket_tasks(plan, rows.size)
    buckets.fold_buckets(rows, plan.order, plan.offsets, tasks, split, out_f, out_bits, goal,
                         fast, fmt.limbs, init)  # fmt: skip
    return out


def _run_buckets(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat, out_name: str,
                 **_: Any) -> np.ndarray:  # fmt: skip
    return fold_buckets(plan, host_rows(values, spec), fmt, out_name)


# -- 2. half-stream -----------------------------------------------------------------------------
#: The integer float16 route holds at most this many values (its int64 sums cannot overflow).
HALF_STREAM_MAX_VALUES = 1 << 23
#: ... into at most this many buckets (one int64 sum a bucket a slot).
HALF_STREAM_MAX_K = 1 << 18


def _is_half_stream(s: Shape) -> bool:
    return s.dtype == "float16" and s.n < HALF_STREAM_MAX_VALUES and s.K <= HALF_STREAM_MAX_K


def _run_half_stream(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat, out_name: str,
                     **_: Any) -> np.ndarray:  # fmt: skip
    bits = host_values(values).view(np.uint16)
    sums = np.zeros((stream_slots(bits.shape[0], plan.K), plan.K), np.int64)
    specials = np.zeros((plan.K, 3), np.int64)
    stream.half_sums(plan.index, bits, sums, specials)
    out, out_bits = empty_out(plan, (plan.K,), out_name)
    stream.finish_half(sums, specials, bits, plan.order, plan.offsets, out_bits,
                       target(out_name, limb_format_for("float16")))  # fmt: skip
    return out


# -- 3. limbs -----------------------------------------------------------------------------------
#: Scalar folds into at most this many buckets add into the accumulator's state.
LIMBS_MAX_K = 1 << 10
#: float64 scalars take the limbs up to this many buckets (beyond: the sorted stream).
LIMBS_FLOAT64_MAX_K = 1 << 15


def _is_limbs(s: Shape) -> bool:
    return s.K <= LIMBS_MAX_K or (s.dtype == "float64" and s.K <= LIMBS_FLOAT64_MAX_K)


def _run_limbs(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat, out_name: str,
               **options: Any) -> np.ndarray:  # fmt: skip
    state = new_state(plan.K, fmt)
    add_to_state(state, plan, values, spec, fmt, **options)
    return round_state(state, fmt, out_name)


# -- 4. partitioned-stream ----------------------------------------------------------------------
#: Scalar folds into more buckets than this (and at most FLOAT_STREAM_MAX_K) group their values
#: by partition first: a float-stream slot's sums (8 bytes a bucket) no longer fit a core's L2
#: cache, a partition's (2^16 buckets) do. In-process, two threads, N = 3,145,728: into 10^6
#: buckets 7.0 against 10.9 ms; into 300,000 (five partitions for two threads) 6.9 against 6.0.
PARTITIONED_MIN_K = 1 << 19


def _is_partitioned_stream(s: Shape) -> bool:
    # its layout (two passes over the index) pays back over many folds, not in one: a one-shot
    # fold into 10^6 buckets (N = 3,145,728, two threads) streams in 13.2 ms, grouped 17.3 ms
    return s.dtype != "float64" and PARTITIONED_MIN_K < s.K <= FLOAT_STREAM_MAX_K and not s.once


class PartitionLayoutKey(PlanKey):
    """The key of a plan's :func:`partition_layout` (one a plan)."""


def partition_layout(plan: PlanView) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dest, local, starts): the plan's positions grouped by partition, built once, kept."""

    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dest = np.empty(plan.size, np.int32 if plan.size <= np.iinfo(np.int32).max else np.int64)
        local = np.empty(plan.size, np.uint16)
        starts = planning.partition_layout(plan.index, plan.K, dest, local)
        return frozen(dest), frozen(local), frozen(starts)

    return plan.prepared(PartitionLayoutKey(), build)


def _run_partitioned_stream(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat,
                            out_name: str, **_: Any) -> np.ndarray:  # fmt: skip
    rows = host_rows(values, spec)
    dest, local, starts = partition_layout(plan)

    def fill(out: np.ndarray) -> int:  # reads the order only to redo an inexact bucket
        grouped = reused_empty(plan, (plan.size,), np.uint32)
        sums = reused_empty(plan, (cpu.thread_count(), 1 << planning.PARTITION_BITS), np.float64)
        return stream.partition_sums(plan.index, rows[:, 0], dest, local, starts, grouped, sums,
                                     out)  # fmt: skip

    return _cast_or_redo(plan, rows, fmt, out_name, fill)


# -- 5. float-stream ----------------------------------------------------------------------------
#: Index dtypes the float stream reads from a one-shot plan's caller, unchecked (each entry is
#: checked as its value is added): a kernel is compiled for each, so only the usual ones.
UNCHECKED_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


def _is_float_stream(s: Shape) -> bool:
    # past FLOAT_STREAM_MAX_K a kept plan's sorted order pays back; a one-shot fold's radix sort
    # does not: N = 3,145,728, two threads, into 1.5 x 10^6 buckets 15.9 ms streamed against
    # 64 sorted, 3 x 10^6 38 against 90, 5 x 10^6 50 against 62 (a slot's sums: 8 bytes a
    # bucket, at most one a value)
    return s.dtype != "float64" and (s.K <= FLOAT_STREAM_MAX_K or (s.once and s.K <= s.n))


def _run_float_stream(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat, out_name: str,
                      **_: Any) -> np.ndarray:  # fmt: skip
    rows = host_rows(values, spec)
    slots = stream_slots(rows.shape[0], plan.K)

    def fill(out: np.ndarray) -> int:  # reads the order only to redo an inexact bucket
        sums = reused_empty(plan, (slots, plan.K), np.float64)  # each slot's state
        raw = plan.unchecked_index  # a one-shot plan's: each entry checked as it is read
        if raw is not None and raw.dtype in UNCHECKED_DTYPES:
            left = stream.float_sums(raw, rows[:, 0], sums, out, bounded=True)
            if left >= 0:
                return left
        # a checked plan; or an entry outside [0, K), and plan.index raises the plan's error
        return stream.float_sums(plan.index, rows[:, 0], sums, out)

    return _cast_or_redo(plan, rows, fmt, out_name, fill)


# -- 6. sorted-stream ---------------------------------------------------------------------------
def _always(s: Shape) -> bool:
    return True


@dataclass(frozen=True)
class SortedStartsKey(PlanKey):
    """The key of a plan's :func:`sorted_starts` cut into ``chunks`` ranges."""

    chunks: int


def _run_sorted_stream(plan: PlanView, values: Any, spec: Values, fmt: LimbFormat, out_name: str,
                       **_: Any) -> np.ndarray:  # fmt: skip
    rows = host_rows(values, spec)
    chunks = BUCKET_CHUNKS if rows.shape[0] >= cpu.PARALLEL_MIN_VALUES else 1
    starts = plan.prepared(SortedStartsKey(chunks), lambda: sorted_starts(plan, chunks))

    def fill(out: np.ndarray) -> None:  # the buckets left NaN are looked for
        out.fill(0.0)  # empty buckets (and every page touched once, here, in order)
        stream.sorted_sums(rows, plan.order, plan.sorted_index, starts, out)

    return _cast_or_redo(plan, rows, fmt, out_name, fill)


def sorted_starts(plan: PlanView, chunks: int) -> np.ndarray:
    """``chunks + 1`` cuts of the sorted positions at bucket boundaries, about equal ranges.

    Cut c is the first bucket start at or after position ``ceil(N c / chunks)``
    (the offsets :func:`bucket_bounds` would cut at), found in the plan's
    sorted index: no offsets needed, so a plan sorted by radix never counts
    its K buckets.
    """
    ids = plan.sorted_index
    n = ids.shape[0]
    cuts = -(np.arange(chunks + 1, dtype=np.int64) * -n // chunks)
    inner = cuts[(cuts > 0) & (cuts < n)]
    inside = ids[inner] == ids[inner - 1]  # a cut inside a bucket moves to its end
    inner[inside] = np.searchsorted(ids, ids[inner[inside]], side="right")
    cuts[(cuts > 0) & (cuts < n)] = inner
    return frozen(np.maximum.accumulate(cuts))


def _cast_or_redo(plan: PlanView, rows: np.ndarray, fmt: LimbFormat, out_name: str,
                  fill: Callable[[np.ndarray], int | None]) -> np.ndarray:  # fmt: skip
    """The output of a streaming kernel ``fill`` that writes each bucket's exact sum, or NaN.

    ``fill(out)`` writes into ``out`` (K,) — the output itself when it has the
    values' dtype, else float64 sums rounded here — every bucket's exact sum
    (``+0.0`` when empty), or NaN where it could not, and returns how many it
    left NaN (or None: then they are looked for): those buckets are summed
    again exactly through the plan's order (built then, if it was not yet).
    """
    K = plan.K
    goal = target(out_name, fmt)
    if out_name == rows.dtype.name:  # sums cast straight into the output
        sums = out = reused_empty(plan, (K,), out_name)
        out_bits = out.view(FLOATS[out_name].signed_bits_dtype)
    else:
        sums = reused_empty(plan, (K,), np.float64)
        out, out_bits = empty_out(plan, (K,), out_name)
    left = fill(sums)
    redo = np.flatnonzero(np.isnan(sums)) if left is None or left else np.empty(0, np.int64)
    if sums is not out:
        buckets.round_doubles(sums, out_bits, goal)
    if redo.size:
        buckets.redo_scalar(redo, rows, plan.order, plan.offsets, out_bits, goal, fmt.limbs)
    return out


# -- the table ----------------------------------------------------------------------------------
#: What the float-streaming routes read: values that widen to float32 (their checks decode
#: float32 bits; float64 values take the limbs or the sorted stream).
_NARROW = ("float16", "bfloat16", "float32")

#: The exact routes, in the order they are tried: the first whose ``when`` holds is taken.
TABLE: tuple[Route, ...] = (
    Route("buckets", _is_rows,
          "rows of {row_size} elements: each bucket's rows summed in a scratch, bucket by bucket "
          "(float32 past {STAGED_MIN_VALUES:,} values, unless rows of {GATHERED_MIN_ROW_BYTES:,} "
          "bytes or more fit in half the last-level cache: read in position order, hot "
          "buckets summed as they pass, the other rows staged in the plan's order)",
          _run_buckets, scalars_only=False, first_use_s=25),
    Route("half-stream", _is_half_stream,
          "float16 scalars ({n:,} < {HALF_STREAM_MAX_VALUES:,} values) into {K:,} buckets "
          "(<= {HALF_STREAM_MAX_K:,}): an exact int64 scatter-add in units of 2^-24",
          _run_half_stream, dtypes=("float16",), first_use_s=3),
    Route("limbs", _is_limbs,
          "{dtype} scalars into {K:,} buckets (<= {LIMBS_MAX_K:,}, or float64 and "
          "<= {LIMBS_FLOAT64_MAX_K:,}): added into a cache-sized per-bucket limb state",
          _run_limbs, first_use_s=5),
    Route("partitioned-stream", _is_partitioned_stream,
          "{dtype} scalars into {K:,} buckets ({PARTITIONED_MIN_K:,} < K <= "
          "{FLOAT_STREAM_MAX_K:,}), a plan kept for more than one fold: values grouped by "
          "partitions of 2^16 buckets, checked "
          "float64 sums in position order in the caches, inexact buckets redone",
          _run_partitioned_stream, dtypes=_NARROW, max_K=planning.PARTITIONED_MAX_K, first_use_s=4),
    Route("float-stream", _is_float_stream,
          "{dtype} scalars into {K:,} buckets (<= {FLOAT_STREAM_MAX_K:,}, or a one-shot "
          "fold into at most one a value): checked float64 sums in position order, one a "
          "bucket, inexact buckets redone",
          _run_float_stream, dtypes=_NARROW, first_use_s=5),
    Route("sorted-stream", _always,
          "{dtype} scalars into {K:,} buckets (past the other routes' limits): checked "
          "float64 sums in the plan's sorted order, inexact buckets redone",
          _run_sorted_stream, first_use_s=7),
)  # fmt: skip

#: The route names, in table order (all give the same bits).
ROUTES: tuple[str, ...] = tuple(r.name for r in TABLE)


def shape_of(plan: PlanView, spec: Values) -> Shape:
    """The :class:`Shape` a route is chosen from."""
    return Shape(plan.K, spec.positions, spec.dtype, spec.row_size, plan.once)


def get(name: str) -> Route:
    """The route called ``name``; an unknown name lists the valid ones."""
    for route in TABLE:
        if route.name == name:
            return route
    raise FoldError(f"unknown exact route {name!r}; choose 'auto' or one of {ROUTES}")


def choose(plan: PlanView, spec: Values) -> Route:
    """The first route of :data:`TABLE` whose test holds for this fold's shape."""
    shape = shape_of(plan, spec)
    return next(route for route in TABLE if route.when(shape))


def explain(route: Route, plan: PlanView, spec: Values) -> str:
    """Why ``route`` serves this fold: its reason, filled with the shape and the constants."""
    return route.reason.format(**vars(shape_of(plan, spec)), **_constants())


def _constants() -> dict[str, int]:
    g = globals()
    return {k: g[k] for k in ("HALF_STREAM_MAX_VALUES", "HALF_STREAM_MAX_K", "LIMBS_MAX_K",
                              "LIMBS_FLOAT64_MAX_K", "FLOAT_STREAM_MAX_K",
                              "PARTITIONED_MIN_K", "STAGED_MIN_VALUES",
                              "GATHERED_MIN_ROW_BYTES")}  # fmt: skip


def run(route: Route, plan: PlanView, values: Any, spec: Values, out_name: str,
        **options: Any) -> np.ndarray:  # fmt: skip
    """Fold with ``route`` (refused when it cannot fold these values); ``spec`` of scalars for
    rows of one element. ``options`` (``kernel=``, ``carry_every=``) tune the ``limbs`` route.
    A first use that compiles the route's kernels says so on stderr, once a process
    (:mod:`bitfold.kernels.compiling`)."""
    if route.scalars_only and spec.trailing:
        raise FoldError(
            f"the {route.name!r} route folds scalars only; folds of rows take 'buckets'"
        )
    if route.dtypes is not None and spec.dtype not in route.dtypes:
        raise FoldError(
            f"the {route.name!r} route folds {', '.join(route.dtypes)} values only; "
            f"got {spec.dtype}"
        )
    if route.max_K is not None and plan.K > route.max_K:
        raise FoldError(
            f"the {route.name!r} route folds into at most {route.max_K:,} buckets; "
            f"this plan has K = {plan.K:,}"
        )
    kind = "rows" if spec.trailing else "scalars"
    with first_use(f"exact fold kernels for {spec.dtype} {kind}, {route.name} route",
                   route.first_use_s):  # fmt: skip
        return route.run(plan, values, spec, limb_format_for(spec.dtype), out_name, **options)


__all__ = [
    "ROUTES",
    "TABLE",
    "Route",
    "Shape",
    "StagedLayout",
    "bucket_bounds",
    "bucket_tasks",
    "choose",
    "explain",
    "fold_buckets",
    "get",
    "run",
    "shape_of",
    "staged_layout",
    "stream_slots",
]
