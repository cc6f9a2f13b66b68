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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from . import dispatch
from .arrays import family_of, from_numpy, to_numpy
from .backends.host import merge_states, new_state, round_state
from .errors import FoldError, FoldTypeError, ShapeError
from .formats import dtype_name, limb_format_for, resolve_out_dtype
from .validate import check_trailing

if TYPE_CHECKING:
    from .plan import Fold


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

    The state lives on the host. Values of any library and device may be
    added (GPU values are accumulated on their device and the state copied
    back). :meth:`result` returns an array of the library and device of the
    first values added (NumPy when nothing was added, or of the state given
    to :meth:`from_state`).

    >>> import numpy as np, bitfold
    >>> plan = bitfold.Fold(np.array([0, 1, 0, 1]), K=2)
    >>> acc = plan.accumulator()
    >>> _ = acc.add(np.array([1.0, 2.0], np.float32), start=0)
    >>> _ = acc.add(np.array([2.0**-24, 3.0], np.float32), start=2)
    >>> acc.result().tolist()
    [1.0, 5.0]
    """

    def __init__(
        self, plan: Fold, dtype: Any = "float32", trailing: Any = (), **options: Any
    ) -> None:
        self.plan = plan
        self.format = limb_format_for(_dtype_label(dtype))
        self.trailing = check_trailing(trailing)
        dispatch.check_accumulator_options(options)
        self.options = options  # backend tuning (host: kernel=, carry_every=; cuda: launch=)
        self._state = new_state(plan.K, self.format, self.trailing)
        self._like: Any = None  # the first values added: the result's library and device

    # -- state -----------------------------------------------------------------
    @property
    def state(self) -> np.ndarray:
        """The integer state, shape ``(K,) + trailing + (L + 5,)`` int64 (a read-only view)."""
        view = self._state.view()
        view.flags.writeable = False
        return view

    @classmethod
    def from_state(cls, plan: Fold, state: Any, dtype: Any = "float32") -> ExactAccumulator:
        """Rebuild an accumulator of ``plan`` from a state array (e.g. after an all-reduce).

        The trailing (row) shape is read from the state's shape,
        ``(K,) + trailing + (L + 5,)``.
        """
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
        acc._state = np.array(arr, dtype=np.int64, order="C")
        if family_of(state).name != "numpy":
            acc._like = state
        return acc

    def copy(self) -> ExactAccumulator:
        """An independent accumulator with the same state."""
        twin = ExactAccumulator(
            self.plan, self.format.value_dtypes[-1], self.trailing, **self.options
        )
        twin._state = self._state.copy()
        twin._like = self._like
        return twin

    def reset(self) -> ExactAccumulator:
        """Forget everything added (keep the plan and format)."""
        self._state[:] = 0
        return self

    # -- adding and merging ------------------------------------------------------
    def add(self, values: Any, start: int | None = None) -> ExactAccumulator:
        """Add values: for every position, or positions ``start .. start + len(values)``.

        Values have the fold's shapes (index shape or ``(N,)``, then the
        accumulator's trailing shape); with ``start`` they are
        ``(n,) + trailing`` for ``n`` consecutive positions.
        """
        dispatch.add_to_state(self.plan, self._state, self.format, values, start=start,
                              trailing=self.trailing, **self.options)  # fmt: skip
        if self._like is None:
            self._like = values
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
        merge_states(self._state, other._state, self.format)
        if self._like is None:
            self._like = other._like
        return self

    def __iadd__(self, other: ExactAccumulator) -> ExactAccumulator:
        return self.merge(other)

    # -- result --------------------------------------------------------------------
    def result(self, out_dtype: Any = None) -> Any:
        """The K correctly rounded sums: float32 (float64 for float64 values) or ``out_dtype``.

        An array of the library and device of the first values added (NumPy
        if none were); bfloat16 results are bfloat16 tensors in PyTorch and
        float32 arrays holding bfloat16 values elsewhere.
        """
        out_name = resolve_out_dtype(self.format.value_dtypes[-1], out_dtype)
        out = round_state(self._state, self.format, out_name)
        if self._like is None:
            return out
        return from_numpy(out, like=self._like, dtype_name=out_name)

    def __repr__(self) -> str:
        rows = f", trailing={self.trailing}" if self.trailing else ""
        return f"ExactAccumulator(K={self.plan.K}, format={self.format.name}{rows})"


__all__ = ["ExactAccumulator"]
