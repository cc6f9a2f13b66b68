"""The exact accumulator: integer limbs per bucket, merged by integer addition, rounded once.

Numeric contract
----------------
For every bucket k, :meth:`ExactAccumulator.result` returns

    round_to_nearest_even(exact real sum of every value added to bucket k)

in the output precision (float32 by default; float64 for float64 values;
float16 on request), with these rules for the corner cases:

* an empty bucket gives ``+0.0``; a zero sum gives ``+0.0`` except ``-0.0``
  when every term was ``-0.0``; a non-zero sum that rounds to zero keeps its
  sign;
* any NaN in a bucket, or ``+inf`` together with ``-inf``, gives NaN, always
  the canonical quiet NaN :data:`CANONICAL_NAN_BITS` of the output dtype;
  otherwise ``+inf`` alone gives ``+inf`` and ``-inf`` alone ``-inf``;
* a finite exact sum beyond the output range rounds to ``±inf`` as IEEE
  round-to-nearest does.

Because the result is a function of the exact sum only, it does not depend
on the order of the values, on how they were split between calls, threads
or processes, or on the thread count.

State layout
------------
The state is one ``int64`` array of shape ``(K, L + 5)``: ``L`` limbs, then
the counters ``n_terms``, ``n_not_negzero``, ``n_nan``, ``n_posinf``,
``n_neginf``. Limb ``j`` of bucket k weighs ``2^(32 j + unit)``, with
``unit = -149`` (``L = 10``) for float32, float16 and bfloat16 values, and
``unit = -1074`` (``L = 67``) for float64 values. Two states of the same plan
and format merge by elementwise integer addition (so an all-reduce with SUM
over processes merges them); the sum need not be normalised, it only has to
stay clear of int64 overflow, which holds for fewer than 2^29 merged states.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import FoldError, FoldTypeError, ShapeError
from .kernels import cpu
from .validate import host_values, out_dtype_for

if TYPE_CHECKING:
    from .plan import Fold

#: Canonical NaN bit pattern of each output dtype (a positive quiet NaN).
CANONICAL_NAN_BITS = {"float16": 0x7E00, "float32": 0x7FC00000, "float64": 0x7FF8000000000000}

_UINT_OF = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}
_TARGETS = {  # name -> (precision bits, exponent of the smallest subnormal)
    "bfloat16": (8, -133),
    "float16": (11, -24),
    "float32": (24, -149),
    "float64": (53, -1074),
}

#: Counter columns after the limbs.
N_TERMS, N_NOT_NEGZERO, N_NAN, N_POSINF, N_NEGINF = range(5)

#: Largest K for which float32 values take the binned kernel (32 float64 bins a bucket).
BINNED_MAX_K = 1 << 18
#: Most private accumulator copies (slots) one call uses; fixed, never the thread count.
MAX_SLOTS = 16


@dataclass(frozen=True)
class LimbFormat:
    """How the exact sum of one family of value dtypes is held in integer limbs."""

    name: str
    limbs: int
    unit_exp: int
    value_dtypes: tuple[str, ...]
    carry_every: int  # values a slot may add between carry normalisations

    @property
    def width(self) -> int:
        """Columns of the state array: the limbs and the five counters."""
        return self.limbs + 5


F32 = LimbFormat("f32", 10, -149, ("float16", "bfloat16", "float32"), 1 << 30)
F64 = LimbFormat("f64", 67, -1074, ("float64",), 1 << 29)


def format_for(dtype_name: str) -> LimbFormat:
    """The limb format that holds sums of values of ``dtype_name`` exactly."""
    for fmt in (F32, F64):
        if dtype_name in fmt.value_dtypes:
            return fmt
    raise FoldTypeError(
        f"no exact accumulator for dtype {dtype_name}; supported: "
        f"{', '.join(F32.value_dtypes + F64.value_dtypes)}"
    )


#: Private accumulator copies may take at most this many bytes per value added.
SLOT_BYTES_PER_VALUE = 2


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


def accumulate(
    state: np.ndarray,
    index: np.ndarray,
    values: np.ndarray,
    fmt: LimbFormat,
    *,
    kernel: str = "auto",
    carry_every: int | None = None,
    counts: np.ndarray | None = None,
) -> None:
    """Add ``values[i]`` into bucket ``index[i]`` of ``state`` (in place), exactly.

    ``index`` and ``values`` are flat and of equal length; ``values`` are
    float32 for the f32 format (float16 must be widened first) and float64 for
    the f64 format. ``kernel`` is ``"auto"``, ``"binned"`` (float32 only) or
    ``"limbs"``; every kernel gives the same state value. ``counts`` are the
    per-bucket counts of ``index`` when the caller has them (else computed).
    The term counts (column ``n_terms``) are the caller's job.
    """
    K = state.shape[0]
    n = values.shape[0]
    if n == 0:
        return
    L = fmt.limbs
    if kernel == "auto":
        kernel = "binned" if fmt is F32 and K <= BINNED_MAX_K else "limbs"
    if kernel == "binned":
        if fmt is not F32:
            raise FoldError("the binned kernel serves float32 values only; use kernel='limbs'")
        every = min(carry_every or cpu.BIN_FLUSH_EVERY, cpu.BIN_FLUSH_EVERY)
        S = slots_for(n, K, 8 * (cpu.N_BINS + L))
        bins = np.full((S, cpu.N_BINS, K), -0.0)
        limbs, specials = _slot_arrays(state, S, L)
        cpu.exact_binned_accumulate(index, values, bins, limbs, specials, every)
        if S > 1:
            cpu.merge_slots(limbs, specials, state, L)
    elif kernel == "limbs":
        every = min(carry_every or fmt.carry_every, fmt.carry_every)
        S = slots_for(n, K, 8 * (L + 4))
        limbs, specials = _slot_arrays(state, S, L)
        bits = values.view(np.int64) if fmt is F64 else values.view(np.uint32)
        cpu.exact_accumulate(index, bits, fmt is F64, limbs, specials, every)
        if S > 1:
            cpu.merge_slots(limbs, specials, state, L)
        # the limb kernels count -0.0 terms negatively in n_not_negzero
        state[:, L + N_NOT_NEGZERO] += np.bincount(index, minlength=K) if counts is None else counts
    else:
        raise FoldError(f"unknown exact kernel {kernel!r}; choose 'auto', 'binned' or 'limbs'")


def _slot_arrays(state: np.ndarray, S: int, L: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-slot limbs (S, K, L) and side counters (S, K, 4); with one slot, views of ``state``.

    The state's columns after the limbs are n_terms, then the four side
    counters in the kernels' order, so one slot can write into it directly.
    """
    if S == 1:
        return state[None, :, :L], state[None, :, L + 1 :]
    K = state.shape[0]
    return np.zeros((S, K, L), np.int64), np.zeros((S, K, 4), np.int64)


def round_state(state: np.ndarray, fmt: LimbFormat, out_dtype: Any) -> np.ndarray:
    """Round every bucket of ``state`` once to ``out_dtype`` (see the module docstring).

    ``out_dtype`` is ``"float16"``, ``"float32"``, ``"float64"`` or
    ``"bfloat16"``; NumPy has no bfloat16, so bfloat16 results come back as
    a float32 array whose values are all exactly representable in bfloat16
    (``torch.Tensor.to(torch.bfloat16)`` converts them without rounding).
    """
    name = out_dtype if isinstance(out_dtype, str) else np.dtype(out_dtype).name
    precision, sub_exp = _TARGETS[name]
    q_min = max(0, sub_exp - fmt.unit_exp)
    wide = np.empty(state.shape[0], np.float64)
    cpu.finalise(np.ascontiguousarray(state), fmt.limbs, fmt.unit_exp, precision, q_min, wide)
    if name == "bfloat16":  # NumPy has no bfloat16: bfloat16 values, held exactly in float32
        name = "float32"
    with np.errstate(over="ignore", invalid="ignore"):
        out = wide.astype(name)
    return canonicalise_nans(out)


def canonicalise_nans(out: np.ndarray) -> np.ndarray:
    """Replace every NaN of ``out`` (in place) by the canonical NaN of its dtype; return it."""
    nan = np.isnan(out)
    if nan.any():
        out.view(_UINT_OF[out.dtype.name])[nan] = CANONICAL_NAN_BITS[out.dtype.name]
    return out


def _dtype_label(dtype: Any) -> str:
    """A value dtype given as a name, NumPy dtype or torch dtype, as its name."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text[len("torch.") :]
    if dtype is None:
        raise FoldTypeError("the accumulator needs a value dtype, e.g. 'float32'; got None")
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise FoldTypeError(f"not a dtype: {dtype!r}") from None


class ExactAccumulator:
    """A mergeable exact sum per bucket of a plan: ``add``, ``merge``, ``result``.

    Build it with :meth:`bitfold.Fold.accumulator`. Values may be added in
    any pieces and any order, and accumulators of the same plan and format
    merged in any order: :meth:`result` is always the correctly rounded sum
    of everything added (module docstring), bit for bit the same as one
    ``plan(values)`` call over the same values.

    >>> import numpy as np, bitfold
    >>> plan = bitfold.Fold(np.array([0, 1, 0, 1]), K=2)
    >>> acc = plan.accumulator()
    >>> _ = acc.add(np.array([1.0, 2.0], np.float32), start=0)
    >>> _ = acc.add(np.array([2.0**-24, 3.0], np.float32), start=2)
    >>> acc.result().tolist()
    [1.0, 5.0]
    """

    def __init__(
        self,
        plan: Fold,
        dtype: Any = "float32",
        *,
        kernel: str = "auto",
        carry_every: int | None = None,
    ) -> None:
        self.plan = plan
        self.format = format_for(_dtype_label(dtype))
        self.kernel = kernel
        self.carry_every = carry_every
        self._state = np.zeros((plan.K, self.format.width), np.int64)

    # -- state -----------------------------------------------------------------
    @property
    def state(self) -> np.ndarray:
        """The integer state, shape ``(K, L + 5)`` int64 (a read-only view)."""
        view = self._state.view()
        view.flags.writeable = False
        return view

    @classmethod
    def from_state(cls, plan: Fold, state: Any, dtype: Any = "float32") -> ExactAccumulator:
        """Rebuild an accumulator of ``plan`` from a state array (e.g. after an all-reduce)."""
        acc = cls(plan, dtype)
        arr = np.asarray(state) if not hasattr(state, "numpy") else state.detach().cpu().numpy()
        want = (plan.K, acc.format.width)
        if arr.dtype != np.int64:
            raise FoldTypeError(f"an accumulator state must be int64; got dtype {arr.dtype}")
        if tuple(arr.shape) != want:
            raise ShapeError(
                f"an accumulator state of this plan ({acc.format.name} format) has shape "
                f"{want}; got {tuple(arr.shape)}"
            )
        acc._state = np.array(arr, dtype=np.int64, order="C")
        return acc

    def copy(self) -> ExactAccumulator:
        """An independent accumulator with the same state."""
        return ExactAccumulator.from_state(self.plan, self._state, self.format.value_dtypes[-1])

    def reset(self) -> ExactAccumulator:
        """Forget everything added (keep the plan and format)."""
        self._state[:] = 0
        return self

    # -- adding and merging ------------------------------------------------------
    def add(self, values: Any, start: int | None = None) -> ExactAccumulator:
        """Add values: all ``plan.size`` of them, or the flat slice starting at ``start``."""
        flat, name = host_values(self.plan, values, start=start)
        if name not in self.format.value_dtypes:
            raise FoldTypeError(
                f"this accumulator sums {', '.join(self.format.value_dtypes)} values; got {name}"
            )
        if flat.dtype == np.float16:
            flat = flat.astype(np.float32)
        if start is None:
            index, counts = self.plan.index, self.plan.counts
        else:
            index = self.plan.index[start : start + flat.size]
            counts = np.bincount(index, minlength=self.plan.K)
        accumulate(
            self._state,
            index,
            flat,
            self.format,
            kernel=self.kernel,
            carry_every=self.carry_every,
            counts=counts,
        )
        self._state[:, self.format.limbs + N_TERMS] += counts
        return self

    def merge(self, other: ExactAccumulator) -> ExactAccumulator:
        """Add ``other``'s sums into this accumulator (``other`` is unchanged)."""
        if not isinstance(other, ExactAccumulator):
            raise FoldTypeError(f"can only merge another ExactAccumulator; got {type(other)}")
        if other.format is not self.format:
            raise FoldTypeError(
                f"cannot merge a {other.format.name} accumulator "
                f"({'/'.join(other.format.value_dtypes)} values) into a {self.format.name} one "
                f"({'/'.join(self.format.value_dtypes)} values)"
            )
        if not self.plan.same_map(other.plan):
            raise FoldError(
                "cannot merge accumulators of different plans "
                f"(K={self.plan.K}, shape {self.plan.shape} vs K={other.plan.K}, "
                f"shape {other.plan.shape}, or different index maps)"
            )
        self._state += other._state
        cpu.normalise_rows(self._state[:, : self.format.limbs])
        return self

    def __iadd__(self, other: ExactAccumulator) -> ExactAccumulator:
        return self.merge(other)

    # -- result --------------------------------------------------------------------
    def result(self, out_dtype: Any = None) -> np.ndarray:
        """The K correctly rounded sums: float32 (float64 for float64 values) or ``out_dtype``."""
        default = "float64" if self.format is F64 else "float32"
        return round_state(self._state, self.format, out_dtype_for(default, out_dtype))

    def __repr__(self) -> str:
        return f"ExactAccumulator(K={self.plan.K}, format={self.format.name})"
