"""The host backend: NumPy arrays, CPU tensors and CPU JAX arrays, folded by the Numba CPU kernels.

Values are read as host NumPy arrays (:mod:`bitfold.backends.host_arrays`)
and the result goes back to the values' own library, shaped
``(K,) + trailing``.

* ``exact`` takes one of the routes of :mod:`bitfold.backends.host_routes`
  (an ordered table: the first route whose test holds serves the fold; all
  give the same bits), or the one named by ``route=``;
* ``ordered`` adds in position order in the output dtype; ``atomic`` is
  NumPy's ``add.at``;
* the exact accumulator's state functions are in
  :mod:`bitfold.backends.host_state`.

Every fold takes ``init=`` (an array the values are added into), in any
float dtype: values and ``init`` are widened to the wider of the two, exactly
(:data:`BACKEND`'s :class:`~bitfold.backends.registry.InitRule`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..arrays import family_of, from_numpy, to_numpy
from ..formats import limb_format_for
from ..kernels import cpu
from ..plan_view import PlanKey, PlanView
from ..validate import Values
from . import device_plan, host_routes
from .host_arrays import canonicalise_nans, frozen, host_rows, host_values, result
from .host_routes import ROUTES, fold_buckets
from .host_state import (
    add_to_state,
    check_tuning,
    merge_states,
    new_state,
    round_state,
    slots_for,
)
from .registry import Backend, InitRule

NAME = "host"
#: NumPy's floating-point warnings silenced where a fold's IEEE arithmetic makes NaN and infinities
_IEEE_QUIET = {"over": "ignore", "invalid": "ignore"}


# -- the strategies ----------------------------------------------------------------------------
def fold_exact(
    plan: PlanView,
    values: Any,
    spec: Values,
    out_name: str,
    *,
    route: str = "auto",
    init: Any = None,
    **options: Any,
) -> Any:
    """Every bucket's exact sum, rounded once to ``out_name``.

    ``route`` is ``"auto"`` (the first route of :data:`host_routes.TABLE`
    whose test holds) or one of :data:`ROUTES`; ``options`` (``kernel=``,
    ``carry_every=``) tune the ``"limbs"`` route. None of them changes the
    result. With ``init`` ((K,) + trailing) each bucket's sum has that array's
    entry as one more term (the ``"buckets"`` route). Options are checked
    before any value is read.
    """
    check_tuning(**options)
    chosen = None if route == "auto" else host_routes.get(route)
    if init is not None:
        rows = host_rows(values, spec)
        start = host_rows(init, Values(spec.dtype, (), plan.K, 0, spec.trailing))
        if start.dtype != rows.dtype:  # one of them is float64: both are, exactly
            rows, start = rows.astype(np.float64), start.astype(np.float64)
        fmt = limb_format_for(rows.dtype.name)
        return result(fold_buckets(plan, rows, fmt, out_name, start), values, out_name, spec)
    # rows of one element are scalars: the scalar routes are much faster than bucket by bucket
    one = replace(spec, trailing=()) if spec.row_size == 1 else spec
    chosen = chosen or host_routes.choose(plan, spec)
    out = host_routes.run(chosen, plan, values, one, out_name, **options)
    return result(out, values, out_name, spec)


def choose_route(plan: PlanView, spec: Values) -> str:
    """The name of the exact route ``fold_exact`` takes for this fold (from the shapes only)."""
    return host_routes.choose(plan, spec).name


def explain_route(
    plan: PlanView, values: Any, spec: Values, *, route: str = "auto", **options: Any
) -> tuple[str, str]:
    """``(route, reason)``: the exact route ``fold_exact`` takes (or the forced one), and why.

    The options are checked as ``fold_exact`` checks them."""
    check_tuning(**options)
    chosen = host_routes.choose(plan, spec) if route == "auto" else host_routes.get(route)
    reason = host_routes.explain(chosen, plan, spec)
    return chosen.name, reason if route == "auto" else f"forced (route={route!r}); {reason}"


def fold_ordered(
    plan: PlanView, values: Any, spec: Values, out_name: str, *, init: Any = None
) -> Any:
    """``out[index[i]] += values[i]`` for i = 0 .. N-1, each addition rounded in ``out_name``.

    For rows, element by element in the same order of positions. ``out``
    starts as zeros, or as ``init``.
    """
    dtype = np.dtype(out_name)
    with np.errstate(**_IEEE_QUIET):
        rows = host_values(values).reshape(spec.positions, spec.row_size).astype(dtype, copy=False)
        out = _start(plan, spec, dtype, init)
    if dtype == np.float16:  # Numba has no float16 arithmetic: NumPy's add.at, in order
        _add_at(out, _index64(plan), rows)
    elif spec.row_size == 1:  # the one-dimensional loop: about 3x the speed of rows of one
        cpu.ordered_fold(plan.index, rows.reshape(-1), out.reshape(-1))
    else:
        cpu.ordered_fold_rows(plan.index, rows, out)
    out = canonicalise_nans(out)
    return result(out, values, out_name, spec)


def fold_atomic(
    plan: PlanView, values: Any, spec: Values, out_name: str, *, init: Any = None
) -> Any:
    """``np.add.at`` into zeros (or ``init``) of ``out_name``, values cast to it first."""
    dtype = np.dtype(out_name)
    with np.errstate(**_IEEE_QUIET):
        rows = host_values(values).reshape(spec.positions, spec.row_size).astype(dtype, copy=False)
        out = _start(plan, spec, dtype, init)
    _add_at(out, _index64(plan), rows)
    return result(out, values, out_name, spec)


def _add_at(out: np.ndarray, index: np.ndarray, rows: np.ndarray) -> None:
    """``np.add.at(out, index, rows)``; one-dimensional when rows have one element (NumPy's
    fast path: about 7x faster than the same call on (K, 1) and (N, 1) arrays). NaN,
    infinities and overflow follow IEEE arithmetic, with no NumPy warning (none of the
    other strategies warns either)."""
    with np.errstate(**_IEEE_QUIET):
        if out.shape[1] == 1:
            np.add.at(out.reshape(-1), index, rows.reshape(-1))
        else:
            np.add.at(out, index, rows)


def _start(plan: PlanView, spec: Values, dtype: np.dtype, init: Any) -> np.ndarray:
    """The (K, D) array an ordered or atomic fold adds into: zeros, or a copy of ``init``."""
    if init is None:
        return np.zeros((plan.K, spec.row_size), dtype)
    return host_values(init).reshape(plan.K, spec.row_size).astype(dtype, copy=True)


class Index64Key(PlanKey):
    """The key of a plan's int64 copy of its index (NumPy's and PyTorch's CPU scatters)."""


def _index64(plan: PlanView) -> np.ndarray:
    return plan.prepared(Index64Key(), lambda: frozen(plan.index.astype(np.int64)))


def expand(plan: PlanView, v: Any, trailing: tuple[int, ...] = ()) -> Any:
    """``v[index]`` in the index's shape (then ``trailing``), in ``v``'s library."""
    family = family_of(v)
    shape = plan.shape + tuple(trailing)
    if family.name == "torch":
        return v[device_plan.index_tensor(plan, "cpu")].reshape(shape)
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


#: The host's registry entry (:mod:`bitfold.backends.registry`).
BACKEND = Backend.from_functions(
    globals(),
    name=NAME,
    families=("numpy", "torch", "jax"),
    devices=("cpu",),
    options={"exact": ("route", "kernel", "carry_every"), "ordered": (), "atomic": (),
             "add_to_state": ("kernel", "carry_every")},
    init=InitRule(strategies=("exact", "ordered", "atomic"), mixed_dtypes=True),
    explain=explain_route,
    priority=300,  # asked first: host values never need a device
)

__all__ = [
    "BACKEND",
    "NAME",
    "ROUTES",
    "add_to_state",
    "canonicalise_nans",
    "choose_route",
    "expand",
    "explain_route",
    "fold_atomic",
    "fold_buckets",
    "fold_exact",
    "fold_ordered",
    "host_values",
    "merge_states",
    "new_state",
    "round_state",
    "slots_for",
]
