"""JAX adapter: ``expand(v, plan)``, a gather whose gradient is the plan's exact fold.

``expand(v, plan)`` is ``v[plan.index]`` in the index's shape, rows too (``jnp.take``,
traced and compiled by XLA as usual). Its gradient with respect to ``v`` is
``plan(g, strategy)``, by default the exact fold: each bucket's exact real
sum rounded once, the same bits on every run, where XLA's own scatter-add
gradient promises no order. ``fold(values, plan)`` is the fold itself, whose
gradient is the expanded output gradient.

Two paths, the same bits
------------------------
``backend="portable"`` (the default on GPU and TPU backends): the fold is
written in ``jax.numpy`` and ``lax`` operations
(:mod:`bitfold.backends.portable`: integer decode, an integer scatter-add,
carry and one rounding), so XLA compiles it with the rest of the step: no
host callback, under ``jit``, ``grad`` and ``vmap``, on every backend. With
``jax_enable_x64`` the words are int64; in JAX's default 32-bit mode they
are int32 words of 16-bit (or 8-bit) digits. float64 values need
``jax_enable_x64``, as in JAX itself.

``backend="host"`` (the default on the CPU backend): the fold runs in
bitfold's CPU kernels, called by XLA through an FFI target
(:mod:`bitfold.xla_host_call`): the kernels read the gradient where it lies
and the K sums are written into XLA's output buffer (batched calls of
``vmap`` run one after another). A JAX without ``jax.ffi`` takes
``jax.pure_callback``, which copies the gradient first. It is refused on
other backends (:class:`bitfold.DeviceError`). A plan a jitted fold uses
is held by the computations that call it (their compiled executables) and
freed with the last of them, as any value the function closes over.

Plans of segment ids
--------------------
:func:`segment_sum` folds by a plan of its ids on the host route, as
``fold`` does. Concrete ids (outside ``jit``, or a constant the jitted
function closes over) are planned when it is called, so a jitted step
plans its constant ids once, when it is traced. Ids traced inside ``jit``
(an argument of the jitted step) are read by the host call where they lie
and folded by a plan kept for them (:mod:`bitfold.host_plans`: the last
few index arrays met), reused only after a check that the ids are its own,
entry for entry: never a stale plan, the same bits with or without it.
:func:`clear_plan_cache` forgets the kept plans.

Out-of-range segment ids
------------------------
:func:`segment_sum` refuses an id outside ``[0, num_segments)`` with
:class:`bitfold.IndexRangeError` when the ids are concrete (outside
``jit``). Inside ``jit`` the ids cannot be read on the host: there, on both
paths, an out-of-range id makes *every* element of the result the canonical
NaN (:data:`bitfold.CANONICAL_NAN_BITS`), never a silently wrong sum and
never an untyped runtime error.

Gradient dtype follows ``v``: float32 and float64 (with ``jax_enable_x64``)
get the correctly rounded sum in their own precision; float16 the exact sum
rounded once to float16; bfloat16, with ``exact``, the exact sum rounded
once to bfloat16 (with ``ordered``/``atomic``: the float32 fold rounded to
bfloat16).
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import math
import numbers
import operator
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import xla_host_call
from .arrays import family_of, library_of
from .backends import registry
from .backends.portable import BACKEND as _PORTABLE
from .backends.portable.paths import segment_fold
from .errors import DeviceError, FoldError, FoldTypeError, IndexRangeError, ShapeError
from .formats import FLOATS, VALUE_DTYPES, dtype_name, resolve_out_dtype
from .host_plans import HostPlans
from .jax_psum import psum, psum_scatter
from .plan import Fold
from .strategies import get_strategy
from .validate import (
    check_expand_input,
    check_K,
    check_values,
    checked_options,
    index_range_error,
    positive_int_or_none,
    type_label,
)

#: The paths a fold of JAX arrays can take (module docstring).
PATHS = ("host", "portable")

__all__ = ["MODES", "PATHS", "clear_plan_cache", "expand", "fold", "psum", "psum_scatter",
           "segment_sum"]  # fmt: skip


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


def _jax_array(x: Any, what: str) -> Any:
    """``x`` as a JAX array (a NumPy array or scalar is converted, as JAX's functions do), or a
    refusal naming the library it comes from: a torch tensor, CuPy array, list, ..."""
    if isinstance(x, jax.Array):  # tracers inside jit, grad and vmap too
        return x
    if isinstance(x, np.ndarray | np.generic):
        return jnp.asarray(x)
    library = library_of(x)
    given = f"a {type_label(x)}" + (f" ({library})" if library not in ("numpy", "other") else "")
    raise FoldTypeError(
        f"{what} must be a JAX array (or a NumPy array, which JAX reads); got {given}: "
        "convert it first (for a torch tensor: jnp.asarray(t.numpy()), or jax.dlpack)"
    )


def _check(x: Any, what: str) -> str:
    """The dtype name of the JAX array ``x``, refused unless it is a float dtype bitfold folds."""
    name = dtype_name(np.dtype(x.dtype))
    if name not in VALUE_DTYPES:
        raise FoldTypeError(
            f"{what} must be a floating JAX array ({', '.join(VALUE_DTYPES)}); got dtype {name}"
        )
    return name


def _path(x: Any, backend: str | None) -> str:
    """``"host"`` (a host callback) or ``"portable"`` (XLA operations): as asked, else the
    registry's backend for JAX arrays on ``x``'s device among these two (the host on the CPU,
    portable elsewhere: :func:`bitfold.backends.registry.backend_for`)."""
    device = family_of(x).device(x)  # a tracer inside jit: the default backend's platform
    if backend is None or backend == "auto":
        return registry.backend_for("jax", device, admits=lambda b, forced: b.name in PATHS).name
    if backend not in PATHS:
        raise FoldError(f"unknown backend {backend!r}; choose 'auto', 'host' or 'portable'")
    if not registry.get_backend(backend).serves("jax", device):
        raise DeviceError(
            f"backend={backend!r} folds through a host callback on the CPU backend only; the "
            f"values live on {device}: use backend='portable' (the default there)"
        )
    return backend


def _portable_fold(plan: Fold, strategy: str, g: Any, out_name: str) -> Any:
    """The fold of ``g`` in XLA operations (:mod:`bitfold.backends.portable`)."""
    spec = check_values(plan.shape, tuple(g.shape), np.dtype(g.dtype))
    impl = _PORTABLE.fold(strategy)
    if out_name == "bfloat16" and strategy != "exact":  # their float32 fold, rounded
        return impl(plan, g, spec, "float32").astype(jnp.bfloat16)
    return impl(plan, g, spec, out_name)


def _fold_by(path: str, plan: Fold, strategy: str, g: Any, out_name: str) -> Any:
    if path == "portable":
        return _portable_fold(plan, strategy, g, out_name)
    return _callback(plan, strategy, g, out_name)


def _callback(plan: Fold, strategy: str, g: Any, out_name: str) -> Any:
    """The fold of ``g`` ((N,) or the index's shape, then a trailing shape) on the host."""
    trailing = check_values(plan.shape, tuple(g.shape), np.dtype(g.dtype)).trailing
    out = jax.ShapeDtypeStruct((plan.K, *trailing), jnp.dtype(out_name))
    fn = functools.partial(_host_fold, plan, strategy, out_name)
    if xla_host_call.available():  # the gradient read where it lies
        return xla_host_call.host_call(fn, g, out, ("fold", plan, strategy, out_name))
    return jax.pure_callback(fn, out, g, vmap_method="sequential")


#: Gathers (``expand``, the gradients of ``fold`` and ``segment_sum``) of at least this many
#: elements take NumPy's ``take`` on the host route, written straight into XLA's output buffer
#: (a tenth of the time of XLA's CPU gather for a graph's 400,000 rows of 32); smaller ones are
#: XLA's, whose call costs less than a host call. A gather is exact: the same bits either way.
HOST_GATHER_MIN = 1 << 16


def _gather(x: Any, plan: Fold, path: str) -> Any:
    """``x[plan.index]`` along the first axis, of shape ``(plan.size,) + x.shape[1:]``."""
    shape = (plan.size, *x.shape[1:])
    if path != "host" or math.prod(shape) < HOST_GATHER_MIN or not xla_host_call.available():
        return jnp.take(x, _index(plan), axis=0)
    out = jax.ShapeDtypeStruct(shape, x.dtype)
    take = functools.partial(_take_into, _index(plan))
    return xla_host_call.host_call(take, x, out, ("take", plan), into=True)


#: Gathers of at least this many elements are cut into one slice a core (at most
#: :data:`TAKE_THREADS`), taken by threads at once: NumPy's take releases the GIL, and XLA's
#: fresh output pages are faulted in on every core (4.7 against 7.1 ms for 400,000 rows of 32
#: on 2 cores).
TAKE_PARALLEL_MIN = 1 << 20
TAKE_THREADS = 4


@functools.cache
def _takers() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(TAKE_THREADS - 1, "bitfold-take")


def _take_into(index: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = x[index[i]]`` (an index in range, or clipped into it)."""
    parts = min(TAKE_THREADS, os.cpu_count() or 1, len(index))
    if out.size < TAKE_PARALLEL_MIN or parts < 2:
        np.take(x, index, axis=0, out=out, mode="clip")  # "clip": no buffered copy of out
        return
    cuts = np.linspace(0, len(index), parts + 1).astype(np.int64)
    slices = [slice(a, b) for a, b in itertools.pairwise(cuts)]
    futures = [_takers().submit(np.take, x, index[s], 0, out[s], "clip") for s in slices[1:]]
    np.take(x, index[slices[0]], axis=0, out=out[slices[0]], mode="clip")
    for future in futures:
        future.result()


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def _expand(v: Any, plan: Fold, strategy: str, path: str) -> Any:
    return _gather(v, plan, path).reshape(plan.shape + tuple(v.shape[1:]))


def _expand_fwd(v: Any, plan: Fold, strategy: str, path: str) -> tuple[Any, Any]:
    return _expand(v, plan, strategy, path), None


def _expand_bwd(plan: Fold, strategy: str, path: str, res: Any, g: Any) -> tuple[Any]:
    return (_fold_by(path, plan, strategy, g, np.dtype(g.dtype).name),)


_expand.defvjp(_expand_fwd, _expand_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _fold(flat: Any, plan: Fold, strategy: str, out_name: str, path: str) -> Any:
    return _fold_by(path, plan, strategy, flat, out_name)


def _fold_fwd(flat: Any, plan: Fold, strategy: str, out_name: str, path: str) -> tuple[Any, Any]:
    return _fold(flat, plan, strategy, out_name, path), jnp.zeros((0,), flat.dtype)


def _fold_bwd(plan: Fold, strategy: str, out_name: str, path: str, res: Any, g: Any) -> tuple[Any]:
    return (_gather(g.astype(res.dtype), plan, path),)


_fold.defvjp(_fold_fwd, _fold_bwd)


def _check_plan(plan: Any, strategy: str) -> str:
    if not isinstance(plan, Fold):
        raise FoldTypeError(
            f"plan must be a bitfold.Fold; got {type(plan).__module__}.{type(plan).__qualname__}"
        )
    return get_strategy(strategy).name


@checked_options
def expand(v: Any, plan: Fold, strategy: str = "exact", *, backend: str | None = None) -> Any:
    """``v[plan.index]`` in the plan's shape; the gradient of ``v`` is ``plan``'s fold.

    ``v`` is a floating JAX array of shape ``(plan.K,)`` or ``(plan.K,) +
    trailing`` (rows), on any backend; the result has shape ``plan.shape +
    trailing``. ``backend`` (``"host"``, ``"portable"``) chooses the path of
    the gradient's fold (module docstring), with the same bits either way.

    >>> import numpy as np, jax, jax.numpy as jnp, bitfold, bitfold.jax as bj
    >>> plan = bitfold.Fold(np.array([[0, 1], [1, 1]]), K=2)
    >>> jax.grad(lambda v: bj.expand(v, plan).sum())(jnp.array([1.0, 2.0])).tolist()
    [1.0, 3.0]
    """
    strategy = _check_plan(plan, strategy)
    v = _jax_array(v, "v")
    _check(v, "v")
    check_expand_input(plan.K, tuple(v.shape))
    return _expand(v, plan, strategy, _path(v, backend))


@checked_options
def fold(
    values: Any,
    plan: Fold,
    strategy: str = "exact",
    *,
    out_dtype: Any = None,
    backend: str | None = None,
) -> Any:
    """The bucket sums of ``values`` as a JAX array of shape ``(K,) + trailing``.

    ``values`` have the index's shape or ``(N,)``, followed by a trailing
    (row) shape, as in ``plan(values)``.

    ``out_dtype`` defaults to float32 (float64 for float64 values), as in
    ``plan(values)``; ``"bfloat16"`` rounds the exact sum once to bfloat16.
    Differentiable: the gradient of ``values`` is the expanded output
    gradient. ``backend`` chooses the path (module docstring).
    """
    strategy = _check_plan(plan, strategy)
    values = _jax_array(values, "values")
    name = _check(values, "values")
    if out_dtype is not None and not isinstance(out_dtype, str):
        out_dtype = jnp.dtype(out_dtype).name
    out_name = resolve_out_dtype(name, out_dtype)
    spec = check_values(plan.shape, tuple(values.shape), name)
    path = _path(values, backend)
    return _fold(values.reshape((plan.size, *spec.trailing)), plan, strategy, out_name, path)


# -- segment_sum: jax.ops.segment_sum's signature, exact ----------------------------------------
#: The plans of the segment ids met on the host (concrete ids, ids read in an XLA buffer),
#: reused after an entry-for-entry check (:mod:`bitfold.host_plans`).
_PLANS = HostPlans()


def clear_plan_cache() -> None:
    """Forget the plans :func:`segment_sum` keeps for segment ids met again (no result changes:
    a kept plan is used only for ids equal to its own, entry for entry)."""
    _PLANS.clear()


def _host_segment_sum(num_segments: int, out_name: str, data: Any, ids: Any) -> np.ndarray:
    """One (unbatched) exact segment sum on the host of ``data`` (``(n,) + trailing``) by the
    flat ``ids``: the fold of a plan of these ids (a kept one when they are its ids).

    An id outside ``[0, num_segments)`` (possible only for ids traced inside
    ``jit``) gives the canonical NaN everywhere: raising inside a callback
    would surface as an untyped runtime error.
    """
    shape = (num_segments, *np.shape(data)[1:])
    try:
        plan = _PLANS.plan(ids, num_segments)
    except IndexRangeError:
        nan = FLOATS[out_name].canonical_nan
        return np.full(shape, nan, FLOATS[out_name].bits_dtype).view(jnp.dtype(out_name))
    return _host_fold(plan, "exact", out_name, data).reshape(shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _segment_sum(data: Any, segment_ids: Any, num_segments: int, path: str) -> Any:
    """The segment sum of ids traced inside ``jit`` (concrete ids fold through a plan)."""
    out_name = np.dtype(data.dtype).name
    trailing = tuple(data.shape[segment_ids.ndim :])
    ids = segment_ids.reshape(-1)
    flat = data.reshape((ids.shape[0], *trailing))
    if path == "portable":
        return segment_fold(flat, ids, num_segments, out_name)
    out = jax.ShapeDtypeStruct((num_segments, *trailing), data.dtype)
    fn = functools.partial(_host_segment_sum, num_segments, out_name)
    if xla_host_call.available():  # data and ids read where they lie
        return xla_host_call.host_call(fn, (flat, ids), out, ("segment_sum", num_segments))
    return jax.pure_callback(fn, out, flat, ids, vmap_method="sequential")


def _segment_sum_fwd(data: Any, segment_ids: Any, num_segments: int, path: str) -> tuple[Any, Any]:
    return _segment_sum(data, segment_ids, num_segments, path), segment_ids


def _segment_sum_bwd(num_segments: int, path: str, segment_ids: Any, g: Any) -> tuple[Any, Any]:
    ids_zero = np.zeros(segment_ids.shape, jax.dtypes.float0)
    shape = (*segment_ids.shape, *g.shape[1:])
    if path != "host" or math.prod(shape) < HOST_GATHER_MIN or not xla_host_call.available():
        return jnp.take(g, segment_ids, axis=0), ids_zero
    ids = segment_ids.reshape(-1)
    out = jax.ShapeDtypeStruct((ids.shape[0], *g.shape[1:]), g.dtype)
    take = functools.partial(_take_ids_into, num_segments)
    gathered = xla_host_call.host_call(take, (g, ids), out, ("take_ids", num_segments), into=True)
    return gathered.reshape(shape), ids_zero


def _take_ids_into(num_segments: int, g: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = g[ids[i]]``, as ``jnp.take`` gathers (an id outside ``[0, num_segments)``,
    whose forward sum is NaN everywhere: a negative one counted from the end, another a NaN
    row)."""
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_segments):
        ids = np.where(ids < 0, ids + num_segments, ids)
        _take_into(ids, g, out)
        out[(ids < 0) | (ids >= num_segments)] = np.nan
    else:
        _take_into(ids, g, out)


_segment_sum.defvjp(_segment_sum_fwd, _segment_sum_bwd)


#: The ``mode=`` names ``jax.ops.segment_sum`` takes (``None``: ``"fill"``); only ``"clip"``
#: changes what bitfold does with an id outside ``[0, num_segments)`` (it clips it into range).
MODES = ("clip", "drop", "fill", "promise_in_bounds")


@checked_options
def segment_sum(
    data: Any,
    segment_ids: Any,
    num_segments: int | None = None,
    indices_are_sorted: bool = False,
    unique_indices: bool = False,
    bucket_size: int | None = None,
    mode: Any = None,
    out_sharding: Any = None,
    *,
    backend: str | None = None,
) -> Any:
    """``jax.ops.segment_sum`` with the same signature, exact: one correctly rounded sum each.

    ``out[s] = `` the correctly rounded sum of ``data[i]`` over every ``i``
    with ``segment_ids[i] == s`` (rows too: ``data.shape == segment_ids.shape
    + trailing`` gives ``(num_segments,) + trailing``), in ``data``'s dtype:
    the same bits for any order of the data, where XLA's scatter-add promises
    no order. Works under ``jit``, ``grad`` (the gradient of ``data`` is
    ``g[segment_ids]``) and ``vmap`` on every backend; ``backend`` chooses
    the path (module docstring), with the same bits either way. ``data`` and
    ``segment_ids`` are JAX arrays or NumPy arrays (``segment_ids`` also a
    list); an array of another library (a torch tensor) is refused by name.

    Differences from ``jax.ops.segment_sum``: a segment id outside
    ``[0, num_segments)`` is never silently dropped: with concrete ids it is
    a :class:`bitfold.IndexRangeError` naming it and ``num_segments``; inside
    ``jit`` the whole result is the canonical NaN (module docstring), except
    with ``mode="clip"``, which clips every id into range as JAX does;
    ``num_segments`` must be given when ``segment_ids`` is traced (under
    ``jit``) and be at least 1. ``indices_are_sorted``, ``unique_indices``
    and ``bucket_size`` are accepted; none changes the exact result.
    ``out_sharding`` must be None. Integer data is exact in any order already
    and goes to ``jax.ops.segment_sum`` itself, after the same checks; bool
    and complex data are refused.

    >>> import jax.numpy as jnp, bitfold.jax as bj
    >>> bj.segment_sum(jnp.array([1.0, 2.0, 3.0]), jnp.array([0, 2, 0]), 3).tolist()
    [4.0, 0.0, 2.0]
    """
    data = _jax_array(data, "data")
    ids, concrete = _segment_ids(segment_ids)
    clip = _clips(mode)
    _check_hints(bucket_size, out_sharding)
    integers = np.dtype(data.dtype).kind in "iu"
    if not integers:
        _check(data, "data")
    if tuple(data.shape[: ids.ndim]) != tuple(ids.shape):
        raise ShapeError(
            f"data of shape {tuple(data.shape)} does not start with segment_ids' shape "
            f"{tuple(ids.shape)}: data.shape must be segment_ids.shape + trailing"
        )
    num_segments = _num_segments(num_segments, concrete)
    if clip:
        ids = jnp.clip(ids, 0, num_segments - 1)
        concrete = None if concrete is None else np.clip(concrete, 0, num_segments - 1)
    plan = None if concrete is None else _concrete_plan(concrete, num_segments)
    trailing = tuple(data.shape[ids.ndim :])
    if integers:  # exact in any order already: JAX's own scatter
        flat = data.reshape((ids.size, *trailing))
        return jax.ops.segment_sum(flat, ids.reshape(-1), num_segments, indices_are_sorted,
                                   unique_indices, mode=mode)  # fmt: skip
    path = _path(data, backend)
    if plan is not None and path == "host":  # concrete ids (a constant under jit): their plan
        flat = data.reshape((plan.size, *trailing))
        return _fold(flat, plan, "exact", np.dtype(data.dtype).name, path)
    return _segment_sum(data, ids, num_segments, path)


def _segment_ids(segment_ids: Any) -> tuple[Any, np.ndarray | None]:
    """``segment_ids`` as a JAX integer array, and on the host when they are concrete (None
    when traced); a non-integer dtype or an array of another library is refused by name."""
    if not isinstance(segment_ids, jax.Array | np.ndarray | np.generic | list | tuple | int):
        _jax_array(segment_ids, "segment_ids")  # refuses it, naming its library
    if isinstance(segment_ids, list | tuple) and not segment_ids:
        segment_ids = np.zeros(0, np.int32)
    try:
        concrete = np.asarray(segment_ids)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError):
        concrete = None  # traced: checked on the host when the callback runs
    except (TypeError, ValueError):  # a ragged list
        concrete = np.asarray(None, dtype=object)
    dtype = np.dtype(segment_ids.dtype) if hasattr(segment_ids, "dtype") else concrete.dtype
    if dtype.kind not in "iu":
        raise FoldTypeError(f"segment_ids must be integers; got dtype {dtype.name}")
    return jnp.asarray(segment_ids), concrete


def _num_segments(num_segments: Any, concrete: np.ndarray | None) -> int:
    """``num_segments`` as a Python int >= 1 (from the ids when None), refused by its name."""
    if num_segments is None:
        if concrete is None:
            raise FoldError("segment_ids are traced (inside jit): pass num_segments, a Python int")
        num_segments = int(np.max(concrete, initial=-1)) + 1
        if num_segments < 1:
            raise FoldError(
                "num_segments was not given and segment_ids hold no id >= 0 (max(segment_ids) "
                "+ 1 = 0 segments): pass num_segments >= 1"
            )
    elif isinstance(num_segments, jax.core.Tracer):
        raise FoldTypeError(
            "num_segments is traced (an argument of the jitted function): it sets the result's "
            "shape, so pass a Python int (static_argnums, or a closure), as jax.ops.segment_sum "
            "needs"
        )
    elif not isinstance(num_segments, numbers.Integral) and hasattr(num_segments, "__index__"):
        try:  # a concrete integer JAX or NumPy scalar array, as JAX takes it
            num_segments = operator.index(num_segments)
        except TypeError:
            pass  # refused below, by name
    return check_K(num_segments, "num_segments")


def _concrete_plan(concrete: np.ndarray, num_segments: int) -> Fold:
    """The plan of concrete ids (a kept one when they are its ids: :mod:`bitfold.host_plans`),
    built when ``segment_sum`` is called (under ``jit``: once, when the function is traced); an
    id outside ``[0, num_segments)`` is refused, naming it and ``num_segments``."""
    found: IndexRangeError
    try:
        return _PLANS.plan(concrete, num_segments)
    except IndexRangeError as err:  # raised below in segment_sum's words: one error
        found = err
    raise index_range_error(
        concrete.shape, found.position, found.value, num_segments,
        f"num_segments = {num_segments}", name="segment_ids",
    )  # fmt: skip


def _clips(mode: Any) -> bool:
    """True for ``mode="clip"``; the other modes of :data:`MODES` (and None) refuse an id out
    of range; anything else is refused, listing them."""
    name = getattr(mode, "name", mode)  # a jax.lax.GatherScatterMode
    name = {"FILL_OR_DROP": "fill", "ONE_HOT": "one_hot"}.get(name, name)
    if mode is not None and (not isinstance(name, str) or name.lower() not in MODES):
        raise FoldError(
            f"unknown mode {mode!r}: bitfold.jax.segment_sum takes mode=None or one of "
            f"{', '.join(repr(m) for m in MODES)} (or the jax.lax.GatherScatterMode of one)"
        )
    return mode is not None and name.lower() == "clip"


def _check_hints(bucket_size: Any, out_sharding: Any) -> None:
    """Refuse a ``bucket_size`` that is not None or a positive int, and any ``out_sharding``."""
    positive_int_or_none(bucket_size, "bucket_size", "it does not change an exact sum")
    if out_sharding is not None:
        raise FoldError(
            f"out_sharding={out_sharding!r} is not supported by bitfold.jax.segment_sum: pass "
            "None and shard the result with jax.device_put"
        )
