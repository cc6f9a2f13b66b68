"""JAX adapter: ``expand(v, plan)``, a gather whose gradient is the plan's exact fold.

``expand(v, plan)`` is ``v[plan.index]`` in the index's shape, rows too (``jnp.take``,
traced and compiled by XLA as usual). Its gradient with respect to ``v`` is
``plan(g, strategy)``, by default the exact fold: each bucket's exact real
sum rounded once, the same bits on every run, where XLA's own scatter-add
gradient promises no order. ``fold(values, plan)`` is the fold itself, whose
gradient is the expanded output gradient.

Host round trip
---------------
The fold runs in bitfold's CPU kernels through ``jax.pure_callback``: the
gradient is copied to a host NumPy array, folded, and the K sums copied
back. On the CPU backend that costs one copy of the gradient; it works
under ``jit``, ``grad`` and ``vmap`` (batched calls run one after another,
``vmap_method="sequential"``). On a GPU or TPU backend it would copy every
gradient to the host and back each step, so it is refused with a
:class:`bitfold.DeviceError` until a device path exists.

Gradient dtype follows ``v``: float32 and float64 (with ``jax_enable_x64``)
get the correctly rounded sum in their own precision; float16 the exact sum
rounded once to float16; bfloat16, with ``exact``, the exact sum rounded
once to bfloat16 (with ``ordered``/``atomic``: the float32 fold rounded to
bfloat16).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .errors import DeviceError, FoldError, FoldTypeError, ShapeError
from .formats import VALUE_DTYPES, dtype_name, resolve_out_dtype
from .plan import Fold
from .strategies import get_strategy
from .validate import check_expand_input, check_K, check_values

__all__ = ["expand", "fold", "segment_sum"]


def _host_fold(plan: Fold, strategy: str, out_name: str, g: Any) -> np.ndarray:
    """The fold of one (unbatched) host gradient, in dtype ``out_name``."""
    g = np.asarray(g)
    if g.dtype.name == "bfloat16":
        g = g.astype(np.float32)  # exact widening
    if out_name == "bfloat16":
        # exact: rounded once to bfloat16 (held in float32); others: their float32 fold, rounded
        out = plan(g, strategy, out_dtype="bfloat16" if strategy == "exact" else None)
        return np.asarray(out).astype(jnp.bfloat16)
    return np.asarray(plan(g, strategy, out_dtype=out_name))


def _index(plan: Fold) -> Any:
    return plan.index  # a host constant that XLA embeds in the traced computation


def _check(x: Any, what: str) -> str:
    dtype = getattr(x, "dtype", None)
    name = dtype_name(np.dtype(dtype)) if dtype is not None else None
    if name not in VALUE_DTYPES:
        raise FoldTypeError(
            f"{what} must be a floating JAX array ({', '.join(VALUE_DTYPES)}); got dtype {name}"
        )
    try:  # a concrete array knows its devices; a tracer inside jit does not
        platforms = {d.platform for d in x.devices()}
    except (AttributeError, jax.errors.ConcretizationTypeError):
        platforms = {jax.default_backend()}
    if platforms != {"cpu"}:
        raise DeviceError(
            f"{what} lives on {', '.join(sorted(platforms))}; bitfold.jax folds on the host "
            "through jax.pure_callback and supports the CPU backend only for now "
            "(a GPU path is not implemented yet)"
        )
    return name


def _callback(plan: Fold, strategy: str, g: Any, out_name: str) -> Any:
    """The fold of ``g`` ((N,) or the index's shape, then a trailing shape) on the host."""
    trailing = check_values(plan.shape, tuple(g.shape), np.dtype(g.dtype)).trailing
    out = jax.ShapeDtypeStruct((plan.K, *trailing), jnp.dtype(out_name))
    fn = functools.partial(_host_fold, plan, strategy, out_name)
    return jax.pure_callback(fn, out, g, vmap_method="sequential")


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _expand(v: Any, plan: Fold, strategy: str) -> Any:
    return jnp.take(v, _index(plan), axis=0).reshape(plan.shape + tuple(v.shape[1:]))


def _expand_fwd(v: Any, plan: Fold, strategy: str) -> tuple[Any, Any]:
    return _expand(v, plan, strategy), None


def _expand_bwd(plan: Fold, strategy: str, res: Any, g: Any) -> tuple[Any]:
    return (_callback(plan, strategy, g, np.dtype(g.dtype).name),)


_expand.defvjp(_expand_fwd, _expand_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _fold(flat: Any, plan: Fold, strategy: str, out_name: str) -> Any:
    return _callback(plan, strategy, flat, out_name)


def _fold_fwd(flat: Any, plan: Fold, strategy: str, out_name: str) -> tuple[Any, Any]:
    return _fold(flat, plan, strategy, out_name), jnp.zeros((0,), flat.dtype)


def _fold_bwd(plan: Fold, strategy: str, out_name: str, res: Any, g: Any) -> tuple[Any]:
    return (jnp.take(g.astype(res.dtype), _index(plan), axis=0),)


_fold.defvjp(_fold_fwd, _fold_bwd)


def _check_plan(plan: Any, strategy: str) -> str:
    if not isinstance(plan, Fold):
        raise FoldTypeError(
            f"plan must be a bitfold.Fold; got {type(plan).__module__}.{type(plan).__qualname__}"
        )
    return get_strategy(strategy).name


def expand(v: Any, plan: Fold, strategy: str = "exact") -> Any:
    """``v[plan.index]`` in the plan's shape; the gradient of ``v`` is ``plan``'s fold.

    ``v`` is a floating JAX array of shape ``(plan.K,)`` or ``(plan.K,) +
    trailing`` (rows) on the CPU backend; the result has shape ``plan.shape +
    trailing``. See the module docstring for the host round trip and the
    gradient dtype.

    >>> import numpy as np, jax, jax.numpy as jnp, bitfold, bitfold.jax as bj
    >>> plan = bitfold.Fold(np.array([[0, 1], [1, 1]]), K=2)
    >>> jax.grad(lambda v: bj.expand(v, plan).sum())(jnp.array([1.0, 2.0])).tolist()
    [1.0, 3.0]
    """
    strategy = _check_plan(plan, strategy)
    _check(v, "v")
    check_expand_input(plan.K, tuple(v.shape))
    return _expand(v, plan, strategy)


def fold(values: Any, plan: Fold, strategy: str = "exact", *, out_dtype: Any = None) -> Any:
    """The bucket sums of ``values`` as a JAX array of shape ``(K,) + trailing``.

    ``values`` have the index's shape or ``(N,)``, followed by a trailing
    (row) shape, as in ``plan(values)``.

    ``out_dtype`` defaults to float32 (float64 for float64 values), as in
    ``plan(values)``; ``"bfloat16"`` rounds the exact sum once to bfloat16.
    Differentiable: the gradient of ``values`` is the expanded output
    gradient. Runs on the host (see the module docstring).
    """
    strategy = _check_plan(plan, strategy)
    name = _check(values, "values")
    if out_dtype is not None and not isinstance(out_dtype, str):
        out_dtype = jnp.dtype(out_dtype).name
    out_name = resolve_out_dtype(name, out_dtype)
    spec = check_values(plan.shape, tuple(values.shape), name)
    return _fold(values.reshape((plan.size, *spec.trailing)), plan, strategy, out_name)


# -- segment_sum: jax.ops.segment_sum's signature, exact ----------------------------------------
def _host_segment_sum(num_segments: int, out_name: str, data: Any, ids: Any) -> np.ndarray:
    """One (unbatched) exact segment sum on the host: a plan of these ids, folded once."""
    ids = np.asarray(ids)
    plan = Fold(ids, num_segments)
    return _host_fold(plan, "exact", out_name, np.asarray(data).reshape(ids.size, -1)).reshape(
        (num_segments, *np.shape(data)[ids.ndim :])
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _segment_sum(data: Any, segment_ids: Any, num_segments: int) -> Any:
    out_name = np.dtype(data.dtype).name
    trailing = tuple(data.shape[segment_ids.ndim :])
    out = jax.ShapeDtypeStruct((num_segments, *trailing), data.dtype)
    fn = functools.partial(_host_segment_sum, num_segments, out_name)
    return jax.pure_callback(fn, out, data, segment_ids, vmap_method="sequential")


def _segment_sum_fwd(data: Any, segment_ids: Any, num_segments: int) -> tuple[Any, Any]:
    return _segment_sum(data, segment_ids, num_segments), segment_ids


def _segment_sum_bwd(num_segments: int, segment_ids: Any, g: Any) -> tuple[Any, Any]:
    ids_zero = np.zeros(segment_ids.shape, jax.dtypes.float0)
    return jnp.take(g, segment_ids, axis=0), ids_zero


_segment_sum.defvjp(_segment_sum_fwd, _segment_sum_bwd)


def segment_sum(
    data: Any,
    segment_ids: Any,
    num_segments: int | None = None,
    indices_are_sorted: bool = False,
    unique_indices: bool = False,
) -> Any:
    """``jax.ops.segment_sum`` with the same signature, exact: one correctly rounded sum each.

    ``out[s] = `` the correctly rounded sum of ``data[i]`` over every ``i``
    with ``segment_ids[i] == s`` (rows too: ``data.shape == segment_ids.shape
    + trailing`` gives ``(num_segments,) + trailing``), in ``data``'s dtype:
    the same bits for any order of the data, where XLA's scatter-add promises
    no order. Works under ``jit``, ``grad`` (the gradient of ``data`` is
    ``g[segment_ids]``) and ``vmap`` on the CPU backend, through
    ``jax.pure_callback`` (the host round trip of :func:`fold`); a GPU array
    is refused with :class:`bitfold.DeviceError` until a device path exists.

    Differences from ``jax.ops.segment_sum``: a segment id outside
    ``[0, num_segments)`` is an error (:class:`bitfold.IndexRangeError`,
    raised when the callback runs) rather than silently dropped;
    ``num_segments`` must be given when ``segment_ids`` is traced (under
    ``jit``). ``indices_are_sorted`` and ``unique_indices`` are accepted
    hints; neither changes the result.

    >>> import jax.numpy as jnp, bitfold.jax as bj
    >>> bj.segment_sum(jnp.array([1.0, 2.0, 3.0]), jnp.array([0, 2, 0]), 3).tolist()
    [4.0, 0.0, 2.0]
    """
    _check(data, "data")
    ids_dtype = getattr(segment_ids, "dtype", None)
    ids_dtype = np.dtype(ids_dtype if ids_dtype is not None else np.asarray(segment_ids).dtype)
    if ids_dtype.kind not in "iu":
        raise FoldTypeError(f"segment_ids must be integers; got dtype {ids_dtype.name}")
    segment_ids = jnp.asarray(segment_ids)
    if tuple(data.shape[: segment_ids.ndim]) != tuple(segment_ids.shape):
        raise ShapeError(
            f"data of shape {tuple(data.shape)} does not start with segment_ids' shape "
            f"{tuple(segment_ids.shape)}: data.shape must be segment_ids.shape + trailing"
        )
    try:
        concrete = np.asarray(segment_ids)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        concrete = None  # traced: checked on the host when the callback runs
    if num_segments is None:
        if concrete is None:
            raise FoldError("segment_ids are traced (inside jit): pass num_segments, a Python int")
        num_segments = int(np.max(concrete, initial=-1)) + 1
    num_segments = check_K(num_segments)
    if concrete is not None and concrete.size:
        Fold(concrete, num_segments)  # refuses an id outside [0, num_segments) now, by name
    return _segment_sum(data, segment_ids, num_segments)
