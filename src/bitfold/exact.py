"""The exact accumulator: integer limbs per bucket, merged by integer addition, rounded once.

Numeric contract
----------------
For every bucket k, :meth:`ExactAccumulator.result` (and the ``exact``
strategy, which is one accumulation rounded at once) returns

    round_to_nearest_even(exact real sum of every value added to bucket k)

in the output precision (float32 by default; float64 for float64 values;
float16 or bfloat16 on request), with these rules for the corner cases:

* an empty bucket gives ``+0.0``; a zero sum gives ``+0.0`` except ``-0.0``
  when every term was ``-0.0``; a non-zero sum that rounds to zero keeps its
  sign;
* any NaN in a bucket, or ``+inf`` together with ``-inf``, gives NaN, always
  the canonical quiet NaN :data:`bitfold.CANONICAL_NAN_BITS` of the output
  dtype; otherwise ``+inf`` alone gives ``+inf`` and ``-inf`` alone ``-inf``;
* a finite exact sum beyond the output range rounds to ``±inf`` as IEEE
  round-to-nearest does.

Because the result is a function of the exact sum only, it does not depend
on the order of the values, on how they were split between calls, threads
or processes, or on the thread count.

State layout
------------
The state is one ``int64`` array of shape ``(K,) + trailing + (L + 5,)``
(``trailing`` is ``()`` for a scalar fold, the row shape for a fold of rows):
for every output element ``L`` limbs, then the counters ``n_terms``,
``n_not_negzero``, ``n_nan``, ``n_posinf``, ``n_neginf``
(:class:`bitfold.formats.LimbFormat`). That is 120 bytes per output element
for float16, bfloat16 and float32 values and 576 bytes for float64 values: an
accumulator of a (50,000 x 768) table holds 4.6 GB, so a one-shot fold never
builds one (``plan(values)`` sums bucket by bucket instead). Limb ``j`` of bucket k
weighs ``2^(32 j + unit)``, with ``unit = -149`` (``L = 10``) for float32,
float16 and bfloat16 values, and ``unit = -1074`` (``L = 67``) for float64
values. Two states of the same plan and format merge by elementwise integer
addition (so an all-reduce with SUM over processes merges them); the sum
need not be normalised, it only has to stay clear of int64 overflow, which
holds for fewer than 2^29 merged states.

Where the state lives
---------------------
An accumulator keeps its state with the backend of the first values added
(or of ``backend=``), through that backend's registered state operations
(:mod:`bitfold.backends.registry`): a host NumPy array for host values; on
the CUDA backend an int64 array of the values' kind on their GPU (a torch
CUDA tensor, a CuPy or numba device array), added to, merged and rounded
there by kernels on the values' stream (rows: a host array, summed on the
host); an int64 array beside the values on the portable backend (a torch
tensor on its device, a CuPy or 64-bit JAX array; a host array for JAX in
32-bit mode). Until values arrive it is an empty host state. :attr:`backend` says
which backend keeps it. Values of another backend are summed in a state of
their own and added in. Merging two accumulators whose states live in
different places copies the other's state to the receiver's place (exact: it
is integers) and adds it there: the merged state lives where the receiver's
did, except that an empty receiver takes the other's place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dispatch
from .arrays import family_of, from_numpy, place_of, to_numpy
from .backends.registry import Backend, get_backend
from .errors import FoldError, FoldTypeError, ShapeError
from .formats import dtype_name, limb_format_for, resolve_out_dtype
from .plan_view import AccumulatorPlan
from .validate import check_has_data, check_trailing, checked_options, type_label


def _dtype_label(dtype: Any) -> str:
    """A value dtype given as a name, NumPy dtype or torch dtype, as its name."""
    if dtype is None:
        raise FoldTypeError("the accumulator needs a value dtype, e.g. 'float32'; got None")
    return dtype_name(dtype)


class ExactAccumulator:
    """A mergeable exact sum per bucket of a plan: ``add``, ``merge``, ``result``.

    Build it with :meth:`bitfold.Fold.accumulator`. Values may be added in
    any pieces and any order, and accumulators of the same plan and format
    merged in any order: :meth:`result` is always the correctly rounded sum
    of everything added (module docstring), bit for bit the same as one
    ``plan(values)`` call over the same values.

    The state lives with the backend of the first values added (module
    docstring, :attr:`backend`); values of any library and device may be
    added, and accumulators of any backends merged. :meth:`result` returns an
    array of the library and device of the first values added (NumPy when
    nothing was added, or of the state given to :meth:`from_state`).

    >>> import numpy as np, bitfold
    >>> plan = bitfold.Fold(np.array([0, 1, 0, 1]), K=2)
    >>> acc = plan.accumulator()
    >>> _ = acc.add(np.array([1.0, 2.0], np.float32), start=0)
    >>> _ = acc.add(np.array([2.0**-24, 3.0], np.float32), start=2)
    >>> acc.result().tolist()
    [1.0, 5.0]
    """

    def __init__(
        self, plan: AccumulatorPlan, dtype: Any = "float32", trailing: Any = (), **options: Any
    ) -> None:
        if not hasattr(plan, "same_map") or not hasattr(plan, "K"):  # a Fold (no import cycle)
            raise FoldTypeError(
                f"an accumulator sums into the buckets of a bitfold.Fold; got a {type_label(plan)}"
            )
        self.plan = plan
        self.format = limb_format_for(_dtype_label(dtype))
        self.trailing = check_trailing(trailing)
        dispatch.check_accumulator_options(options)
        self.options = options  # backend tuning (host: kernel=, carry_every=; cuda: launch=)
        self._keeper: Backend = get_backend("host")  # whose state operations hold the state
        self._placed = False  # placed by the first values added (or merged in)
        self._state = self._keeper.new_state(plan.K, self.format, self.trailing)
        self._like: Any = None  # the first values added: the result's library and device

    # -- state -----------------------------------------------------------------
    @property
    def backend(self) -> str:
        """The name of the backend whose state operations keep the state (``"host"`` until
        values arrive; then the backend of the first values, or of ``backend=``)."""
        return self._keeper.name

    @property
    def state(self) -> np.ndarray:
        """The integer state, shape ``(K,) + trailing + (L + 5,)`` int64, read-only on the host:
        a view of a host state, a copy of a state on a device."""
        view = to_numpy(self._state).view()
        view.flags.writeable = False
        return view

    @classmethod
    @checked_options
    def from_state(
        cls, plan: AccumulatorPlan, state: Any, dtype: Any = "float32"
    ) -> ExactAccumulator:
        """Rebuild an accumulator of ``plan`` from a state array (e.g. after an all-reduce).

        The trailing (row) shape is read from the state's shape,
        ``(K,) + trailing + (L + 5,)``. The state is kept on the host (a copy).
        """
        check_has_data(state, "state")
        arr = to_numpy(state) if hasattr(state, "dtype") else np.asarray(state)
        acc = cls(plan, dtype, trailing=tuple(arr.shape[1:-1]) if arr.ndim > 2 else ())
        want = (plan.K, *acc.trailing, acc.format.width)
        if arr.dtype != np.int64:
            raise FoldTypeError(f"an accumulator state must be int64; got dtype {arr.dtype}")
        if tuple(arr.shape) != want:
            raise ShapeError(
                f"an accumulator state of this plan ({acc.format.name} format) has shape "
                f"(K,) + trailing + (L + 5,) = {want}; got {tuple(arr.shape)}"
            )
        acc._state, acc._placed = np.array(arr, dtype=np.int64, order="C"), True
        if family_of(state).name != "numpy":
            acc._like = state
        return acc

    def copy(self) -> ExactAccumulator:
        """An independent accumulator with the same state, in the same place."""
        twin = ExactAccumulator(
            self.plan, self.format.value_dtypes[-1], self.trailing, **self.options
        )
        twin._keeper, twin._placed, twin._like = self._keeper, self._placed, self._like
        twin._state = from_numpy(np.array(to_numpy(self._state)), like=self._state)
        return twin

    def reset(self) -> ExactAccumulator:
        """Forget everything added (keep the plan, format and the state's place)."""
        self._state = self._keeper.new_state(
            self.plan.K, self.format, self.trailing, like=self._state
        )
        return self

    # -- adding and merging ------------------------------------------------------
    @checked_options
    def add(self, values: Any, start: int | None = None) -> ExactAccumulator:
        """Add values: for every position, or positions ``start .. start + len(values)``.

        Values have the fold's shapes (index shape or ``(N,)``, then the
        accumulator's trailing shape); with ``start`` they are
        ``(n,) + trailing`` for ``n`` consecutive positions.
        """
        plan, fmt, trailing = self.plan, self.format, self.trailing
        add = dispatch.addition(plan, fmt, values, start=start, trailing=trailing, **self.options)
        by = add.backend
        if not self._placed:
            self._place(by, add.values)
        if by.shares_states(self._keeper):
            self._state = by.add_to_state(self._state, plan, add.values, add.spec, fmt,
                                          **add.options)  # fmt: skip
        else:  # summed in a state of the values' own backend, then brought here
            part = by.new_state(plan.K, fmt, trailing, like=add.values)
            self._add_state(by.add_to_state(part, plan, add.values, add.spec, fmt, **add.options))
        if self._like is None:
            self._like = values
        return self

    def _place(self, backend: Backend, like: Any) -> None:
        """Keep the (still empty) state with ``backend``, beside ``like``."""
        if not backend.shares_states(self._keeper):
            self._state = backend.new_state(self.plan.K, self.format, self.trailing, like=like)
        self._keeper, self._placed = backend, True

    def _add_state(self, other: Any) -> None:
        """Add a state from anywhere into this one, in this one's place (copied there exactly)."""
        if place_of(other) != place_of(self._state):
            other = from_numpy(to_numpy(other), like=self._state)
        self._state = self._keeper.merge_states(self._state, other, self.format)

    @checked_options
    def merge(self, other: ExactAccumulator) -> ExactAccumulator:
        """Add ``other``'s sums into this accumulator (``other`` is unchanged).

        The merged state stays where this one's lives (an empty accumulator
        takes ``other``'s place): a state of another backend or device is
        copied here first, exactly. The result is the one of adding every
        value to one accumulator.
        """
        if not isinstance(other, ExactAccumulator):
            raise FoldTypeError(f"can only merge another ExactAccumulator; got {type(other)}")
        if other.format is not self.format:
            raise FoldTypeError(
                f"cannot merge a {other.format.name} accumulator "
                f"({'/'.join(other.format.value_dtypes)} values) into a {self.format.name} one "
                f"({'/'.join(self.format.value_dtypes)} values)"
            )
        if other.trailing != self.trailing:
            raise ShapeError(
                f"cannot merge an accumulator of rows {other.trailing} into one of rows "
                f"{self.trailing}"
            )
        if not self.plan.same_map(other.plan):
            raise FoldError(
                "cannot merge accumulators of different plans "
                f"(K={self.plan.K}, shape {self.plan.shape} vs K={other.plan.K}, "
                f"shape {other.plan.shape}, or different index maps)"
            )
        if not self._placed and other._placed:
            self._place(other._keeper, other._state)
        self._add_state(other._state)
        if self._like is None:
            self._like = other._like
        return self

    def __iadd__(self, other: ExactAccumulator) -> ExactAccumulator:
        return self.merge(other)

    # -- result --------------------------------------------------------------------
    @checked_options
    def result(self, out_dtype: Any = None) -> Any:
        """The K correctly rounded sums: float32 (float64 for float64 values) or ``out_dtype``.

        An array of the library and device of the first values added (NumPy
        if none were); bfloat16 results are bfloat16 tensors in PyTorch and
        float32 arrays holding bfloat16 values elsewhere.
        """
        out_name = resolve_out_dtype(self.format.value_dtypes[-1], out_dtype)
        out = self._keeper.round_state(self._state, self.format, out_name)
        if self._like is None or place_of(out) == place_of(self._like):
            return out
        return from_numpy(to_numpy(out), like=self._like, dtype_name=out_name)

    def __repr__(self) -> str:
        rows = f", trailing={self.trailing}" if self.trailing else ""
        return f"ExactAccumulator(K={self.plan.K}, format={self.format.name}{rows})"


__all__ = ["ExactAccumulator"]
