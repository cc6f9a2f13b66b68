"""The host backend: NumPy arrays, CPU tensors and CPU JAX arrays, folded by the Numba CPU kernels.

Values are read on the host as one contiguous, native-byte-order NumPy
array (a view when they already are one; bfloat16 widened to float32, which
is exact), flat for a scalar fold and ``(positions, D)`` for a fold of rows,
and the result goes back to the values' own library, shaped ``(K,) + trailing``.

``exact`` takes one of two routes, with the same bits either way:

* *streaming* (scalar folds into at most :data:`BUCKETWISE_MIN_K` buckets):
  values are read in position order and added into a per-bucket state that
  fits in the caches (float64 bins for float32 values, integer limbs
  otherwise), rounded at the end;
* *bucket by bucket* (folds of rows, and scalar folds into more buckets):
  :mod:`bitfold.kernels.buckets` gathers each bucket's rows through the
  plan's stable order and sums them in a small scratch; no per-bucket state
  is kept.

State functions (the exact accumulator on the host): a state is a
``(K, L + 5)`` int64 array in the layout of :class:`bitfold.formats.LimbFormat`;
:func:`add_to_state` adds values into it, :func:`merge_states` adds one
state into another, :func:`round_state` rounds every bucket once.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..arrays import family_of, from_numpy, to_numpy
from ..errors import FoldError
from ..formats import FLOATS, N_NOT_NEGZERO, N_TERMS, LimbFormat, limb_format_for
from ..kernels import buckets, cpu, stream
from ..validate import Values

if TYPE_CHECKING:
    from ..plan import Fold

NAME = "host"

#: Largest K for which float32 values take the binned kernel (32 float64 bins a bucket).
BINNED_MAX_K = 1 << 18
#: Scalar folds into at most this many buckets take the limb-state streaming route.
LIMBS_MAX_K = 1 << 10
#: float64 scalars into more buckets than this are summed bucket by bucket.
BUCKETWISE_MIN_K = 1 << 15
#: Scalar folds into at most this many buckets stream in position order, one float64
#: (int64) a bucket; beyond, in the plan's sorted order.
FLOAT_STREAM_MAX_K = 1 << 18
#: The integer float16 route holds at most this many values (its int64 sums cannot overflow).
HALF_STREAM_MAX_VALUES = 1 << 23
#: Most private states of a streaming route, and the bytes they may take per value.
STREAM_SLOTS = 16
STREAM_SLOT_BYTES_PER_VALUE = 8
#: Independent bucket ranges of a bucket-by-bucket fold (fixed: never the thread count).
BUCKET_CHUNKS = 64
#: Most private accumulator copies (slots) one call uses; fixed, never the thread count.
MAX_SLOTS = 16
#: Private accumulator copies may take at most this many bytes per value added.
SLOT_BYTES_PER_VALUE = 2


def serves(device: str) -> bool:
    """The host backend folds values that live in host memory."""
    return device == "cpu"


def host_values(values: Any) -> np.ndarray:
    """The values as a flat, contiguous, native-order NumPy array (bfloat16 widened to float32)."""
    arr = to_numpy(values) if hasattr(values, "dtype") else np.asarray(values)
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return np.ascontiguousarray(arr.reshape(-1))


def bfloat16_bits(values: Any) -> np.ndarray:
    """The uint16 bit patterns of bfloat16 values, flat (no widening copy)."""
    if family_of(values).name == "torch":
        import torch

        t = values.detach().cpu().contiguous()
        return t.view(torch.int16).numpy().view(np.uint16).reshape(-1)
    return np.ascontiguousarray(np.asarray(values)).view(np.uint16).reshape(-1)


def host_rows(values: Any, spec: Values) -> np.ndarray:
    """The values as a contiguous ``(positions, D)`` float32 or float64 array (halves widened)."""
    flat = host_values(values)
    if flat.dtype == np.float16:
        flat = flat.astype(np.float32)  # exact
    return flat.reshape(spec.positions, spec.row_size)


def _result(out: np.ndarray, like: Any, out_name: str, spec: Values) -> Any:
    """``out`` shaped ``(K,) + trailing``, in the library (and device) of ``like``."""
    out = out.reshape(out.shape[:1] + spec.trailing)
    return from_numpy(out, like=like, dtype_name=out_name)


# -- the strategies ----------------------------------------------------------------------------
def fold_exact(
    plan: Fold,
    values: Any,
    spec: Values,
    out_name: str,
    *,
    route: str = "auto",
    init: Any = None,
    **options: Any,
) -> Any:
    """Every bucket's exact sum, rounded once to ``out_name`` (module docstring for the routes).

    ``route`` is ``"auto"`` or one of :data:`ROUTES`; ``options`` (``kernel=``,
    ``carry_every=``) tune the ``"limbs"`` route. None of them changes the
    result. With ``init`` ((K,) + trailing) each bucket's sum has that array's
    entry as one more term (the ``"buckets"`` route).
    """
    if init is not None:
        rows = host_rows(values, spec)
        start = host_rows(init, Values(spec.dtype, (), plan.K, 0, spec.trailing))
        if start.dtype != rows.dtype:  # one of them is float64: both are, exactly
            rows, start = rows.astype(np.float64), start.astype(np.float64)
        fmt = limb_format_for(rows.dtype.name)
        return _result(fold_buckets(plan, rows, fmt, out_name, start), values, out_name, spec)
    fmt = _format_of(spec)
    # rows of one element are scalars: the scalar routes are much faster than bucket by bucket
    one = replace(spec, trailing=()) if spec.row_size == 1 else spec
    if route == "auto":
        route = choose_route(plan, spec)
    if route not in ROUTES:
        raise FoldError(f"unknown exact route {route!r}; choose 'auto' or one of {ROUTES}")
    if one.trailing and route != "buckets":
        raise FoldError(f"the {route!r} route folds scalars only; folds of rows take 'buckets'")
    if route == "half-stream" and spec.dtype != "float16":
        raise FoldError(f"the 'half-stream' route folds float16 values only; got {spec.dtype}")
    if route == "limbs":
        state = new_state(plan.K, fmt)
        add_to_state(state, plan, values, one, fmt, **options)
        out = round_state(state, fmt, out_name)
    elif route == "half-stream":
        out = _half_stream(plan, values, one, out_name)
    else:
        rows = host_rows(values, spec)
        if route == "float-stream":
            out = _float_stream(plan, rows, fmt, out_name)
        elif route == "sorted-stream":
            out = _sorted_stream(plan, rows, fmt, out_name)
        else:
            out = fold_buckets(plan, rows, fmt, out_name)
    return _result(out, values, out_name, spec)


#: The routes of the exact fold on the host (all give the same bits).
ROUTES = ("limbs", "float-stream", "half-stream", "sorted-stream", "buckets")


def choose_route(plan: Fold, spec: Values) -> str:
    """The fastest route for this fold; from the shapes only (never from the data or threads).

    Rows go bucket by bucket (rows of one element are scalars). Scalars: into
    few buckets, the limb state streaming route (float64 bins for float32
    values); float16 values, an integer scatter-add; float32 and bfloat16
    values into more buckets, checked float64 sums streamed in position order
    into one float64 a bucket; into very many buckets (whose states would not
    be cache-sized), checked float64 sums streamed in the plan's sorted order.
    """
    if spec.row_size != 1:
        return "buckets"
    K, n = plan.K, spec.positions
    if spec.dtype == "float16" and n < HALF_STREAM_MAX_VALUES and K <= FLOAT_STREAM_MAX_K:
        return "half-stream"
    if K <= LIMBS_MAX_K or (spec.dtype == "float64" and K <= BUCKETWISE_MIN_K):
        return "limbs"
    if spec.dtype != "float64" and K <= FLOAT_STREAM_MAX_K:
        return "float-stream"
    return "sorted-stream"


def _target(out_name: str, fmt: LimbFormat) -> tuple[int, ...]:
    """``(unit_exp, precision, exp_bits, subnormal_exp, nan_bits, out_shift)`` for the kernels."""
    target = FLOATS[out_name]
    return (fmt.unit_exp, target.precision, target.exponent_bits, target.subnormal_exp,
            target.canonical_nan, 16 if out_name == "bfloat16" else 0)  # fmt: skip


def _empty_out(shape: tuple[int, ...], out_name: str) -> tuple[np.ndarray, np.ndarray]:
    """(the output as floats, the same memory as signed integers of its width)."""
    target = FLOATS[out_name]
    widen = out_name == "bfloat16"
    out_bits = np.empty(shape, np.int32 if widen else target.signed_bits_dtype)
    return out_bits.view(np.float32 if widen else out_name), out_bits


def _slots(n: int, K: int) -> int:
    """Private states of a streaming route: one a thread, within a memory budget.

    The routes that use them are exact, so their result does not depend on
    how many there are (an exact sum is unique), only their speed does.
    """
    if n < cpu.PARALLEL_MIN_VALUES:
        return 1
    by_memory = (STREAM_SLOT_BYTES_PER_VALUE * n) // (8 * K)
    return int(max(1, min(STREAM_SLOTS, cpu.thread_count(), by_memory)))


def _bounds(plan: Fold, n_values: int) -> np.ndarray:
    chunks = BUCKET_CHUNKS if n_values >= cpu.PARALLEL_MIN_VALUES else 1
    return plan.prepared(("bucket-bounds", chunks), lambda: _bucket_bounds(plan, chunks))


def fold_buckets(
    plan: Fold, rows: np.ndarray, fmt: LimbFormat, out_name: str, init: np.ndarray | None = None
) -> np.ndarray:
    """The exact fold of ``rows`` (positions, D) bucket by bucket: a (K, D) array of ``out_name``.

    ``init`` (K, D), in the rows' dtype, is one more term of every bucket.
    bfloat16 results come back as float32 holding bfloat16 values (as
    :func:`round_state`).
    """
    out, out_bits = _empty_out((plan.K, rows.shape[1]), out_name)
    if out.size == 0:
        return out
    fast = out_name == rows.dtype.name  # an exact float64 sum is simply cast
    buckets.fold_buckets(
        rows, plan.order, plan.offsets, _bounds(plan, rows.size),
        out if fast else np.empty((1, 1), rows.dtype), out_bits, _target(out_name, fmt), fast,
        fmt.limbs, init,
    )  # fmt: skip
    return out


def _float_stream(plan: Fold, rows: np.ndarray, fmt: LimbFormat, out_name: str) -> np.ndarray:
    """Scalars: checked float64 sums streamed per bucket, the inexact buckets redone (stream.py)."""
    n = rows.shape[0]
    sums = np.full((_slots(n, plan.K), plan.K), -0.0)
    merged = stream.float_sums(plan.index, rows[:, 0], sums)
    out, out_bits = _empty_out((plan.K, 1), out_name)
    fast = out_name == rows.dtype.name
    buckets.finish_scalar(
        merged, rows, plan.order, plan.offsets, _bounds(plan, n),
        out if fast else np.empty((1, 1), rows.dtype), out_bits, _target(out_name, fmt), fast,
        fmt.limbs,
    )  # fmt: skip
    return out


def _sorted_stream(plan: Fold, rows: np.ndarray, fmt: LimbFormat, out_name: str) -> np.ndarray:
    """Scalars into very many buckets: checked float64 sums in sorted order (stream.py)."""
    K = plan.K
    sorted_buckets = plan.prepared("sorted-buckets", lambda: _frozen(plan.index[plan.order]))
    bounds = _bounds(plan, rows.shape[0])
    starts = plan.prepared(("sorted-starts", bounds.size), lambda: plan.offsets[bounds])
    target = _target(out_name, fmt)
    if out_name == rows.dtype.name:  # sums cast straight into the output
        out = np.empty(K, out_name)
        out.fill(0.0)  # empty buckets (and every page touched once, here, in order)
        stream.sorted_sums(rows, plan.order, sorted_buckets, starts, out)
        out_bits = out.view(FLOATS[out_name].signed_bits_dtype)
        redo = np.flatnonzero(np.isnan(out))
    else:
        sums = np.empty(K)
        sums.fill(0.0)
        stream.sorted_sums(rows, plan.order, sorted_buckets, starts, sums)
        out, out_bits = _empty_out((K,), out_name)
        buckets.round_doubles(sums, out_bits, target)
        redo = np.flatnonzero(np.isnan(sums))
    if redo.size:
        buckets.redo_scalar(redo, rows, plan.order, plan.offsets, out_bits, target, fmt.limbs)
    return out


def _half_stream(plan: Fold, values: Any, spec: Values, out_name: str) -> np.ndarray:
    """float16 scalars: an exact int64 scatter-add in units of 2^-24 (stream.py)."""
    bits = host_values(values).view(np.uint16)
    S = _slots(bits.shape[0], plan.K)
    sums = np.zeros((S, plan.K), np.int64)
    specials = np.zeros((plan.K, 3), np.int64)
    stream.half_sums(plan.index, bits, sums, specials)
    out, out_bits = _empty_out((plan.K,), out_name)
    stream.finish_half(sums, specials, bits, plan.order, plan.offsets, out_bits,
                       _target(out_name, limb_format_for("float16")))  # fmt: skip
    return out


def _bucket_bounds(plan: Fold, chunks: int) -> np.ndarray:
    """Bucket ranges of about equal numbers of positions (a bucket is never split)."""
    targets = np.linspace(0, plan.size, chunks + 1)
    bounds = np.searchsorted(plan.offsets, targets, side="left").astype(np.int64)
    bounds[0], bounds[-1] = 0, plan.K
    return _frozen(np.maximum.accumulate(bounds))


def fold_ordered(
    plan: Fold, values: Any, spec: Values, out_name: str, *, init: Any = None
) -> Any:
    """``out[index[i]] += values[i]`` for i = 0 .. N-1, each addition rounded in ``out_name``.

    For rows, element by element in the same order of positions. ``out``
    starts as zeros, or as ``init``.
    """
    dtype = np.dtype(out_name)
    rows = host_values(values).reshape(spec.positions, spec.row_size).astype(dtype, copy=False)
    out = _start(plan, spec, dtype, init)
    if dtype == np.float16:  # Numba has no float16 arithmetic: NumPy's add.at, in order
        _add_at(out, _index64(plan), rows)
    else:
        cpu.ordered_fold_rows(plan.index, rows, out)
    out = canonicalise_nans(out)
    return _result(out, values, out_name, spec)


def fold_atomic(plan: Fold, values: Any, spec: Values, out_name: str, *, init: Any = None) -> Any:
    """``np.add.at`` into zeros (or ``init``) of ``out_name``, values cast to it first."""
    dtype = np.dtype(out_name)
    rows = host_values(values).reshape(spec.positions, spec.row_size).astype(dtype, copy=False)
    out = _start(plan, spec, dtype, init)
    _add_at(out, _index64(plan), rows)
    return _result(out, values, out_name, spec)


def _add_at(out: np.ndarray, index: np.ndarray, rows: np.ndarray) -> None:
    """``np.add.at(out, index, rows)``; one-dimensional when rows have one element (NumPy's
    fast path: about 7x faster than the same call on (K, 1) and (N, 1) arrays)."""
    if out.shape[1] == 1:
        np.add.at(out.reshape(-1), index, rows.reshape(-1))
    else:
        np.add.at(out, index, rows)


def _start(plan: Fold, spec: Values, dtype: np.dtype, init: Any) -> np.ndarray:
    """The (K, D) array an ordered or atomic fold adds into: zeros, or a copy of ``init``."""
    if init is None:
        return np.zeros((plan.K, spec.row_size), dtype)
    return host_values(init).reshape(plan.K, spec.row_size).astype(dtype, copy=True)


def _index64(plan: Fold) -> np.ndarray:
    return plan.prepared("index64", lambda: _frozen(plan.index.astype(np.int64)))


def expand(plan: Fold, v: Any, trailing: tuple[int, ...] = ()) -> Any:
    """``v[index]`` in the index's shape (then ``trailing``), in ``v``'s library."""
    family = family_of(v)
    shape = plan.shape + tuple(trailing)
    if family.name == "torch":
        import torch

        idx = plan.prepared(
            ("torch-index", "cpu"), lambda: torch.from_numpy(plan.index.astype(np.int64))
        )
        return v[idx].reshape(shape)
    host = np.ascontiguousarray(to_numpy(v))
    if trailing:
        out = np.take(host, plan.index, axis=0)
    else:
        out = np.empty(plan.size, host.dtype)
        if host.dtype.kind == "f" and host.dtype.itemsize >= 4:
            cpu.gather(host, plan.index, out)
        else:
            np.take(host, plan.index, out=out)
    return from_numpy(out.reshape(shape), like=v)


# -- exact states ------------------------------------------------------------------------------
def new_state(K: int, fmt: LimbFormat, trailing: tuple[int, ...] = ()) -> np.ndarray:
    """A zero state: for each of the K buckets' elements, ``fmt``'s limbs and counters."""
    return np.zeros((K, *trailing, fmt.width), np.int64)


def _format_of(spec: Values) -> LimbFormat:
    return limb_format_for(spec.dtype)


def add_to_state(
    state: np.ndarray,
    plan: Fold,
    values: Any,
    spec: Values,
    fmt: LimbFormat,
    *,
    kernel: str = "auto",
    carry_every: int | None = None,
) -> None:
    """Add host ``values`` (plan positions ``spec.start ..``) into ``state``, exactly.

    ``state`` is ``(K,) + trailing + (L + 5,)``. For scalars, ``kernel`` is
    ``"auto"``, ``"binned"`` (float32 values only) or ``"limbs"``; every kernel
    gives the same state value. The term counts are added too, so the state is
    complete when this returns.
    """
    if spec.trailing:
        rows = host_rows(values, spec)
        index = plan.index[spec.start : spec.start + rows.shape[0]]
        every = min(carry_every or fmt.carry_every, fmt.carry_every)
        bits = rows.view(np.int64 if rows.dtype == np.float64 else np.uint32)
        cpu.accumulate_rows(index, bits, state.reshape(-1, fmt.width), every)
        return
    binned = kernel in ("auto", "binned") and plan.K <= BINNED_MAX_K
    flat = bfloat16_bits(values) if spec.dtype == "bfloat16" and binned else host_values(values)
    n = flat.shape[0]
    if spec.start == 0 and n == plan.size:
        index, counts = plan.index, plan.counts
    else:
        index = plan.index[spec.start : spec.start + n]
        counts = np.bincount(index, minlength=plan.K)
    if n:
        _accumulate(state, index, flat, spec.dtype, fmt, kernel, carry_every, counts)
    state[:, fmt.limbs + N_TERMS] += counts


def _accumulate(state, index, flat, dtype, fmt, kernel, carry_every, counts) -> None:
    K = state.shape[0]
    n = flat.shape[0]
    L = fmt.limbs
    if dtype == "bfloat16" and flat.dtype != np.uint16:
        dtype = "float32"  # host_values widened them (exactly)
    if kernel == "auto":
        binnable = ("float16", "bfloat16", "float32")
        kernel = "binned" if dtype in binnable and K <= BINNED_MAX_K else "limbs"
    if kernel == "binned" and dtype == "float16":
        flat, dtype = flat.astype(np.float32), "float32"  # exact widening
    if kernel == "binned":
        if dtype not in ("float32", "bfloat16"):
            raise FoldError(
                "the binned kernel serves float32 and bfloat16 values only; use kernel='limbs'"
            )
        every = min(carry_every or cpu.BIN_FLUSH_EVERY, cpu.BIN_FLUSH_EVERY)
        S = slots_for(n, K, 8 * (cpu.N_BINS + L))
        bins = np.full((S, cpu.N_BINS, K), -0.0)
        limbs, specials = _slot_arrays(state, S, L)
        cpu.exact_binned_accumulate(index, flat, bins, limbs, specials, every)
        if S > 1:
            cpu.merge_slots(limbs, specials, state, L)
    elif kernel == "limbs":
        every = min(carry_every or fmt.carry_every, fmt.carry_every)
        S = slots_for(n, K, 8 * (L + 4))
        limbs, specials = _slot_arrays(state, S, L)
        bits = flat.view(np.int64 if dtype == "float64" else FLOATS[dtype].bits_dtype)
        cpu.exact_accumulate(index, bits, cpu.SOURCE_CODES[dtype], limbs, specials, every)
        if S > 1:
            cpu.merge_slots(limbs, specials, state, L)
        # the limb kernels count -0.0 terms negatively in n_not_negzero
        state[:, L + N_NOT_NEGZERO] += counts
    else:
        raise FoldError(f"unknown exact kernel {kernel!r}; choose 'auto', 'binned' or 'limbs'")


def slots_for(n: int, K: int, per_bucket_bytes: int) -> int:
    """How many private copies to split ``n`` values over: from n and K only.

    Enough copies to keep several threads busy when the copies are cheap
    relative to the work; never so many that their memory (and the work of
    clearing and merging them) exceeds :data:`SLOT_BYTES_PER_VALUE` bytes per
    value; one for small inputs, which then accumulate straight into the
    state with no parallel launch and no merge.
    """
    by_memory = (SLOT_BYTES_PER_VALUE * n) // max(1, K * per_bucket_bytes)
    by_work = n // (cpu.PARALLEL_MIN_VALUES // 4)
    return int(max(1, min(MAX_SLOTS, by_memory, by_work)))


def _slot_arrays(state: np.ndarray, S: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-slot limbs (S, K, L) and side counters (S, K, 4); with one slot, views of ``state``.

    The state's columns after the limbs are n_terms, then the four side
    counters in the kernels' order, so one slot can write into it directly.
    """
    if S == 1:
        return state[None, :, :L], state[None, :, L + 1 :]
    K = state.shape[0]
    return np.zeros((S, K, L), np.int64), np.zeros((S, K, 4), np.int64)


def merge_states(into: np.ndarray, other: np.ndarray, fmt: LimbFormat) -> None:
    """``into += other`` (two states of one plan and format), then carry-normalise ``into``."""
    into += other
    cpu.normalise_rows(into.reshape(-1, fmt.width)[:, : fmt.limbs])


def round_state(state: np.ndarray, fmt: LimbFormat, out_name: str) -> np.ndarray:
    """Round every element of ``state`` once to ``out_name`` (see :mod:`bitfold.exact`).

    ``state`` is ``(K,) + trailing + (L + 5,)``; the result ``(K,) + trailing``.
    NumPy has no bfloat16, so bfloat16 results come back as a float32 array
    whose values are all exactly representable in bfloat16
    (``torch.Tensor.to(torch.bfloat16)`` converts them without rounding).
    """
    target = FLOATS[out_name]
    out_shift = 16 if out_name == "bfloat16" else 0
    flat = np.ascontiguousarray(state).reshape(-1, fmt.width)
    out = np.empty(state.shape[:-1], np.int32 if out_shift else target.signed_bits_dtype)
    cpu.round_states(
        flat,
        fmt.limbs,
        (fmt.unit_exp, target.precision, target.exponent_bits, target.subnormal_exp,
         target.canonical_nan, out_shift),
        out.reshape(-1),
    )  # fmt: skip
    return out.view(np.float32 if out_shift else out_name)


def canonicalise_nans(out: np.ndarray) -> np.ndarray:
    """Replace every NaN of ``out`` (in place) by the canonical NaN of its dtype; return it."""
    nan = np.isnan(out)
    if nan.any():
        f = FLOATS[out.dtype.name]
        out.view(f.bits_dtype)[nan] = f.canonical_nan
    return out


def _frozen(arr: np.ndarray) -> np.ndarray:
    arr.flags.writeable = False
    return arr


#: strategy name -> implementation, read by :mod:`bitfold.strategies`
__all__ = [
    "NAME",
    "add_to_state",
    "canonicalise_nans",
    "expand",
    "fold_atomic",
    "fold_exact",
    "fold_ordered",
    "host_values",
    "merge_states",
    "new_state",
    "round_state",
    "serves",
    "slots_for",
]
