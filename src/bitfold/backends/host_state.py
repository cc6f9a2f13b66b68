"""Exact states on the host: the accumulator's integer limbs, added to, merged and rounded.

A state is a ``(K,) + trailing + (L + 5,)`` int64 array in the layout of
:class:`bitfold.formats.LimbFormat` (:mod:`bitfold.exact` documents it).
:func:`add_to_state` adds host values into it with one of two kernels, chosen
once by :func:`exact_kernel`: ``"binned"`` (float16, bfloat16 and float32
scalars into at most :data:`BINNED_MAX_K` buckets: 32 float64 bins a bucket,
flushed into the limbs) or ``"limbs"`` (every dtype, any K); both give the
same state. :func:`merge_states` adds one state into another;
:func:`round_state` rounds every element once. These are the host backend's
state operations in the registry (:mod:`bitfold.backends.registry`): each
returns the state it updated, in place. :func:`slots_for` is the one formula
for how many private copies of a sum a host kernel splits its values over
(the accumulator's kernels and the streaming routes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import FoldError
from ..formats import FLOATS, N_NOT_NEGZERO, N_TERMS, LimbFormat
from ..kernels import cpu
from ..plan_view import PlanView
from ..validate import Values, positive_int_or_none
from .host_arrays import bfloat16_bits, host_rows, host_values, target

#: Largest K for which the binned kernel is chosen (32 float64 bins a bucket must stay cached).
BINNED_MAX_K = 1 << 18
#: The value dtypes the binned kernel reads (float16 widened to float32 first, exactly).
BINNABLE = ("float16", "bfloat16", "float32")
#: Most private accumulator copies (slots) one call uses; fixed, never the thread count.
MAX_SLOTS = 16
#: Private accumulator copies may take at most this many bytes per value added.
SLOT_BYTES_PER_VALUE = 2
#: The kernels ``add_to_state`` takes (``kernel=``).
KERNELS = ("auto", "binned", "limbs")


def new_state(
    K: int, fmt: LimbFormat, trailing: tuple[int, ...] = (), like: Any = None
) -> np.ndarray:
    """A zero state: for each of the K buckets' elements, ``fmt``'s limbs and counters.

    Always a host NumPy array (``like``, the values it is made for, is not read).
    """
    return np.zeros((K, *trailing, fmt.width), np.int64)


def check_tuning(kernel: Any = "auto", carry_every: Any = None) -> None:
    """Refuse a ``kernel=`` or ``carry_every=`` the host's exact kernels do not take, by name.

    ``kernel`` is one of :data:`KERNELS`; ``carry_every`` is ``None`` (the
    format's own) or a positive integer (a fraction of a value or a count below
    one would add nothing, or never carry). Called before any value is read.
    """
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise FoldError(f"unknown exact kernel {kernel!r}; choose 'auto', 'binned' or 'limbs'")
    positive_int_or_none(carry_every, "carry_every", "how many values the limbs take between "
                         "carries; None: the format's own")  # fmt: skip


def exact_kernel(kernel: str, dtype: str, K: int) -> str:
    """The kernel that adds scalars of ``dtype`` into K buckets: ``"binned"`` or ``"limbs"``.

    ``"auto"`` takes ``"binned"`` for :data:`BINNABLE` dtypes into at most
    :data:`BINNED_MAX_K` buckets, else ``"limbs"``; a named kernel is kept.
    """
    if kernel not in KERNELS:
        raise FoldError(f"unknown exact kernel {kernel!r}; choose 'auto', 'binned' or 'limbs'")
    if kernel == "auto":
        return "binned" if dtype in BINNABLE and K <= BINNED_MAX_K else "limbs"
    return kernel


def add_to_state(
    state: np.ndarray,
    plan: PlanView,
    values: Any,
    spec: Values,
    fmt: LimbFormat,
    *,
    kernel: str = "auto",
    carry_every: int | None = None,
) -> np.ndarray:
    """Add host ``values`` (plan positions ``spec.start ..``) into ``state``, exactly.

    ``state`` is ``(K,) + trailing + (L + 5,)``. For scalars, ``kernel`` is
    ``"auto"``, ``"binned"`` (float16, bfloat16 and float32 values) or
    ``"limbs"``; ``carry_every`` lowers how many values the limbs take between
    carries. Neither changes the state's value. The term counts are added
    too, so the state is complete when this returns. Returns ``state``.
    """
    check_tuning(kernel, carry_every)
    if spec.trailing:
        rows = host_rows(values, spec)
        index = plan.index[spec.start : spec.start + rows.shape[0]]
        every = min(carry_every or fmt.carry_every, fmt.carry_every)
        bits = rows.view(np.int64 if rows.dtype == np.float64 else np.uint32)
        cpu.accumulate_rows(index, bits, state.reshape(-1, fmt.width), every)
        return state
    kernel = exact_kernel(kernel, spec.dtype, plan.K)
    if spec.dtype == "bfloat16" and kernel == "binned":
        flat, dtype = bfloat16_bits(values), "bfloat16"
    else:  # bfloat16 read widened to float32 (exactly)
        flat = host_values(values)
        dtype = "float32" if spec.dtype == "bfloat16" else spec.dtype
    n = flat.shape[0]
    if spec.start == 0 and n == plan.size:
        index, counts = plan.index, plan.counts
    else:
        index = plan.index[spec.start : spec.start + n]
        counts = np.bincount(index, minlength=plan.K)
    if n:
        if kernel == "binned":
            _binned(state, index, flat, dtype, fmt, carry_every)
        else:
            _limbs(state, index, flat, dtype, fmt, carry_every, counts)
    state[:, fmt.limbs + N_TERMS] += counts
    return state


def _binned(state, index, flat, dtype, fmt, carry_every) -> None:
    if dtype == "float16":
        flat, dtype = flat.astype(np.float32), "float32"  # exact widening
    if dtype not in ("float32", "bfloat16"):
        raise FoldError(
            "the binned kernel serves float16, float32 and bfloat16 values only; "
            "use kernel='limbs'"
        )
    K, n, L = state.shape[0], flat.shape[0], fmt.limbs
    every = min(carry_every or cpu.BIN_FLUSH_EVERY, cpu.BIN_FLUSH_EVERY)
    S = slots_for(n, K, 8 * (cpu.N_BINS + L))
    # with a slot for every thread the kernel schedules chunks dynamically into one slot a
    # thread: more slots would only be cleared, flushed and merged (exact: same bits for any S)
    S = min(S, cpu.thread_count())
    bins = np.full((S, cpu.N_BINS, K), -0.0)
    limbs, specials = _slot_arrays(state, S, L)
    cpu.exact_binned_accumulate(index, flat, bins, limbs, specials, every)
    if S > 1:
        cpu.merge_slots(limbs, specials, state, L)


def _limbs(state, index, flat, dtype, fmt, carry_every, counts) -> None:
    K, n, L = state.shape[0], flat.shape[0], fmt.limbs
    every = min(carry_every or fmt.carry_every, fmt.carry_every)
    S = slots_for(n, K, 8 * (L + 4))
    limbs, specials = _slot_arrays(state, S, L)
    bits = flat.view(np.int64 if dtype == "float64" else FLOATS[dtype].bits_dtype)
    cpu.exact_accumulate(index, bits, cpu.SOURCE_CODES[dtype], limbs, specials, every)
    if S > 1:
        cpu.merge_slots(limbs, specials, state, L)
    # the limb kernels count -0.0 terms negatively in n_not_negzero
    state[:, L + N_NOT_NEGZERO] += counts


def slots_for(
    n: int,
    K: int,
    per_bucket_bytes: int,
    *,
    most: int | None = None,
    bytes_per_value: int | None = None,
) -> int:
    """How many private copies of a sum to split ``n`` values over: from the shapes only.

    Enough copies to keep several threads busy when the copies are cheap
    relative to the work (one a :data:`cpu.PARALLEL_MIN_VALUES` / 4 values);
    never more than ``most`` (default :data:`MAX_SLOTS`), nor so many that
    their memory (``per_bucket_bytes`` a bucket, and the work of clearing and
    merging them) exceeds ``bytes_per_value`` (default
    :data:`SLOT_BYTES_PER_VALUE`) bytes per value; one for small inputs, which
    then accumulate straight into the state with no parallel launch and no
    merge. Every caller is exact, so the count changes the speed, never a bit
    of the result.
    """
    most = MAX_SLOTS if most is None else most
    per_value = SLOT_BYTES_PER_VALUE if bytes_per_value is None else bytes_per_value
    by_memory = (per_value * n) // max(1, K * per_bucket_bytes)
    by_work = n // (cpu.PARALLEL_MIN_VALUES // 4)
    return int(max(1, min(most, by_memory, by_work)))


def _slot_arrays(state: np.ndarray, S: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-slot limbs (S, K, L) and side counters (S, K, 4); with one slot, views of ``state``.

    The state's columns after the limbs are n_terms, then the four side
    counters in the kernels' order, so one slot can write into it directly.
    """
    if S == 1:
        return state[None, :, :L], state[None, :, L + 1 :]
    K = state.shape[0]
    return np.zeros((S, K, L), np.int64), np.zeros((S, K, 4), np.int64)


def merge_states(into: np.ndarray, other: np.ndarray, fmt: LimbFormat) -> np.ndarray:
    """``into += other`` (two host states of one plan and format), carry-normalised; ``into``.

    Integer addition: exact, in any order, and the normalised state has the same value.
    """
    into += other
    cpu.normalise_rows(into.reshape(-1, fmt.width)[:, : fmt.limbs])
    return into


def round_state(state: np.ndarray, fmt: LimbFormat, out_name: str) -> np.ndarray:
    """Round every element of ``state`` once to ``out_name`` (see :mod:`bitfold.exact`).

    ``state`` is ``(K,) + trailing + (L + 5,)``; the result ``(K,) + trailing``.
    NumPy has no bfloat16, so bfloat16 results come back as a float32 array
    whose values are all exactly representable in bfloat16
    (``torch.Tensor.to(torch.bfloat16)`` converts them without rounding).
    """
    widen = out_name == "bfloat16"
    flat = np.ascontiguousarray(state).reshape(-1, fmt.width)
    out = np.empty(state.shape[:-1], np.int32 if widen else FLOATS[out_name].signed_bits_dtype)
    cpu.round_states(flat, fmt.limbs, target(out_name, fmt), out.reshape(-1))
    return out.view(np.float32 if widen else out_name)


__all__ = [
    "BINNED_MAX_K",
    "KERNELS",
    "add_to_state",
    "check_tuning",
    "exact_kernel",
    "merge_states",
    "new_state",
    "round_state",
    "slots_for",
]
