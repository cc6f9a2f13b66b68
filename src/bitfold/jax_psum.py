"""``bitfold.jax.psum``: the exact sum over the devices of a mapped axis, rounded once.

``lax.psum`` of floats depends on the number of devices and on the order the
collective adds their pieces in. ``psum(x, axis_name)`` returns, on every
device, each element's exact real sum over the devices of ``axis_name``
(and, with ``axis``, over that local axis too) rounded once to ``x``'s dtype:
the same bits for any number of devices and any split of the terms between
them, under ``jax.shard_map``, ``pmap`` and ``jit``, on one process or many
(``jax.distributed``).

How: each device writes its values' exact sums as integer digits in the
portable path's words (:mod:`bitfold.backends.portable.digits`: integer decode, an
integer scatter-add, a carry), the words travel through ``lax.psum`` (an
integer sum: exact in any order), and every device carries and rounds the
total once with integer operations. The words are int64 holding 32-bit
digits with ``jax_enable_x64``, else int32 holding 16-bit digits (8-bit when
an element has more than 2^13 terms); float64 needs ``jax_enable_x64``, as in
JAX itself. Each element travels as ``digits + 5`` words: exactness costs
bandwidth (15 int64 words an element for float32 values with x64, 25 int32
words without).

Numeric contract: the host's (:mod:`bitfold.exact`): the correctly rounded
sum; NaN results are the canonical NaN, a sum of ``-0.0`` terms only is
``-0.0``, one infinity gives that infinity, both give NaN.

Gradient: the transpose of ``psum`` as JAX defines it for the axis (under
``shard_map`` a cotangent that every device holds passes through unchanged;
under ``pmap`` the cotangents of the devices are summed), with any sum taken
exactly by this function again; with ``axis`` the result is broadcast back
over it.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .arrays import family_of
from .backends.portable.digits import carried_table, round_table, table_of, words_for
from .errors import FoldError, FoldTypeError
from .formats import VALUE_DTYPES, dtype_name, limb_format_for

__all__ = ["psum", "psum_scatter"]


def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple of ints) as sorted non-negative axes of ``x``."""
    if axis is None:
        return ()
    items = axis if isinstance(axis, (tuple, list)) else (axis,)
    out = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, int) or not -ndim <= a < ndim:
            raise FoldError(
                f"axis must be None, an int or a tuple of ints in [-{ndim}, {ndim}) for an "
                f"array of {ndim} dimensions; got axis={axis!r}"
            )
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise FoldError(f"axis names a dimension twice: axis={axis!r}")
    return tuple(sorted(out))


def _devices(axis_name: Any, what: str = "psum") -> int:
    """How many devices the mapped axis (or axes) ``axis_name`` spans (a trace-time int);
    ``what`` names the caller in the refusal of an unbound axis."""
    try:
        return int(lax.psum(1, axis_name))
    except NameError:
        raise FoldError(
            f"{what} over axis_name={axis_name!r}: no mapped axis of that name is bound here "
            "(call it inside jax.shard_map or jax.pmap over that axis)"
        ) from None  # one error: JAX's own NameError says less


def _exact_psum(x: Any, axis_name: Any, axes: tuple[int, ...]) -> Any:
    """The exact sum (module docstring), not differentiable by itself."""
    kept = [d for d in range(x.ndim) if d not in axes]
    out_shape = tuple(x.shape[d] for d in kept)
    total = _summed_words(x, axis_name, axes, lambda carried: lax.psum(carried, axis_name))
    return total.reshape(out_shape)


def _summed_words(x: Any, axis_name: Any, axes: tuple[int, ...], collective: Any) -> Any:
    """Each output element's exact sum over the devices, rounded once: ``(R,)`` in ``x``'s
    dtype, ``R`` the elements of ``x`` without ``axes`` (in ``x``'s order).

    This device's digit words (a carried ``(R, columns)`` table: the local sums over
    ``axes``) go through ``collective``, an integer sum over ``axis_name`` (``lax.psum``,
    or ``lax.psum_scatter`` along the rows, which leaves this device its rows only); what
    comes back is rounded row by row.
    """
    dtype = dtype_name(x)
    fmt = limb_format_for(dtype)
    kept = [d for d in range(x.ndim) if d not in axes]
    R = math.prod(x.shape[d] for d in kept)
    A = math.prod(x.shape[d] for d in axes)
    flat = jnp.transpose(x, (*kept, *axes)).reshape(R * A)
    ops = family_of(x)
    words = words_for(fmt, ops.has_int64(x), _devices(axis_name) * A)
    rows = jnp.repeat(jnp.arange(R, dtype=words.word), A) if A != 1 else jnp.arange(
        R, dtype=words.word)  # fmt: skip
    counts = jnp.full((R,), A, dtype=words.word)
    table = table_of(ops, x, fmt, words, R, [(rows, flat, dtype)], counts, A)
    carried = carried_table(ops, table, words, R).reshape(R, words.columns)
    total = collective(carried).reshape(-1, words.columns)
    return round_table(ops, total, words, fmt, dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _psum(x: Any, axis_name: Any, axes: tuple[int, ...]) -> Any:
    return _exact_psum(x, axis_name, axes)


def _psum_fwd(x: Any, axis_name: Any, axes: tuple[int, ...]) -> tuple[Any, Any]:
    return _exact_psum(x, axis_name, axes), x


def _psum_bwd(axis_name: Any, axes: tuple[int, ...], x: Any, g: Any) -> tuple[Any]:
    """JAX's transpose of psum (module docstring), any sum in it taken exactly."""
    like = x if not axes else jnp.sum(x, axis=axes)  # its shape and its mapped-axis type
    transpose = jax.vjp(lambda t: lax.psum(t, axis_name), like)[1]
    if _transpose_sums(transpose, g):
        back = _exact_psum(g, axis_name, ())
    else:
        back = transpose(g)[0]
    if axes:
        back = jnp.broadcast_to(jnp.expand_dims(back, axes), x.shape)
    return (back.astype(x.dtype),)


def _transpose_sums(transpose: Any, g: Any) -> bool:
    """Whether JAX's transpose of psum sums the devices' cotangents here (under ``pmap``) or
    passes each through (under ``shard_map``): read from its traced program, not from values."""
    program = jax.make_jaxpr(transpose)(g)
    return any(e.primitive.name == "psum" for e in program.jaxpr.eqns)


_psum.defvjp(_psum_fwd, _psum_bwd)


def psum(x: Any, axis_name: Any, *, axis: Any = None) -> Any:
    """The exact sum of ``x`` over the devices of ``axis_name`` (and over ``axis``), rounded once.

    ``x``: an array of this device's terms, or a pytree of them (a model's
    gradients), as ``lax.psum`` takes; ``axis_name``: the mapped axis (or a
    tuple of axes) of the enclosing ``jax.shard_map`` or ``pmap``; ``axis``:
    None, or local axes of every leaf summed too. Float leaves (float16,
    bfloat16, float32, float64) come back in their dtype, the shape without
    ``axis``: on every device, each element's exact real sum over every
    device and ``axis`` rounded once to nearest-even, the same bits for any
    number of devices and any split of the terms. Integer and boolean leaves
    are summed by ``lax.psum`` itself (an integer sum is exact already);
    complex leaves are refused, by their path in ``x``. Before any work, every
    leaf and ``axis`` are checked, then ``axis_name``: one that no enclosing
    ``shard_map`` or ``pmap`` binds is a :class:`bitfold.FoldError`, whatever
    the leaves' dtypes.

    >>> import jax, jax.numpy as jnp, bitfold.jax
    >>> f = jax.pmap(lambda x: bitfold.jax.psum(x, "i", axis=0), axis_name="i")
    >>> f(jnp.array([[1.0, 2.0**-24, 2.0**-24, 2.0**-24]])).tolist()  # float32 adds give 1.0
    [1.000000238418579]
    """
    paths, tree = jax.tree_util.tree_flatten_with_path(x)
    for path, leaf in paths:
        _check_leaf(leaf, path)
    arrays = [leaf if isinstance(leaf, jax.Array) or hasattr(leaf, "aval") else jnp.asarray(leaf)
              for _, leaf in paths]  # fmt: skip
    for a in arrays:
        _axes(axis, a.ndim)
    _devices(axis_name)  # bound here, for float and integer leaves alike
    out: list[Any] = [None] * len(arrays)
    if axis is None:  # float leaves of one dtype travel as one array: one sum, one collective
        groups: dict[str, list[int]] = {}
        for i, a in enumerate(arrays):
            if dtype_name(a) in VALUE_DTYPES:
                groups.setdefault(dtype_name(a), []).append(i)
        for members in groups.values():
            if len(members) < 2:
                continue
            flat = jnp.concatenate([arrays[i].reshape(-1) for i in members])
            summed = _psum(flat, axis_name, ())
            at = 0
            for i in members:
                out[i] = summed[at : at + arrays[i].size].reshape(arrays[i].shape)
                at += arrays[i].size
    out = [_leaf_psum(a, axis_name, axis) if o is None else o for a, o in zip(arrays, out,
                                                                              strict=True)]
    return jax.tree.unflatten(tree, out)


def _check_leaf(leaf: Any, path: tuple[Any, ...] = (), what: str = "psum") -> None:
    """Refuse a leaf that is neither a float of :data:`VALUE_DTYPES` nor an integer, by its
    dtype and its ``path`` in ``what``'s ``x`` (``jax.tree_util.keystr``)."""
    kind = jnp.result_type(leaf)
    if dtype_name(kind) in VALUE_DTYPES or jnp.issubdtype(kind, jnp.integer) or kind == jnp.bool_:
        return
    raise FoldTypeError(
        f"{what} adds floating-point arrays ({', '.join(VALUE_DTYPES)}) exactly, and integers "
        f"as lax.{what} does; the leaf x{jax.tree_util.keystr(path)} has dtype "
        f"{dtype_name(kind)}"
    )


def _leaf_psum(x: Any, axis_name: Any, axis: Any) -> Any:
    axes = _axes(axis, x.ndim)
    if dtype_name(x) not in VALUE_DTYPES:  # integers: lax.psum's sum is exact
        return lax.psum(jnp.sum(x, axis=axes) if axes else x, axis_name)
    return _psum(x, axis_name, axes)


# -- psum_scatter ---------------------------------------------------------------------------------


def _scatter_checked(
    shape: tuple[int, ...], axis_name: Any, scatter_dimension: Any, tiled: bool
) -> int:
    """``scatter_dimension`` as a non-negative axis of the summed ``shape``, after the checks
    ``lax.psum_scatter`` makes (as bitfold errors naming the values)."""
    ndim = len(shape)
    if isinstance(scatter_dimension, bool) or not isinstance(scatter_dimension, int) or not (
        -ndim <= scatter_dimension < ndim
    ):
        raise FoldError(
            f"scatter_dimension must be an int in [-{ndim}, {ndim}) for a sum of "
            f"{ndim} dimensions; got scatter_dimension={scatter_dimension!r}"
        )
    sd = scatter_dimension % ndim
    devices, n = _devices(axis_name, "psum_scatter"), shape[sd]
    if tiled and n % devices:
        raise FoldError(
            f"psum_scatter(tiled=True) cuts dimension {sd} of size {n} into {devices} equal "
            f"pieces (the devices of axis_name={axis_name!r}): it must be a multiple of {devices}"
        )
    if not tiled and n != devices:
        raise FoldError(
            f"psum_scatter(tiled=False) gives each of the {devices} devices of "
            f"axis_name={axis_name!r} one slice of dimension {sd}: its size must be {devices}; "
            f"got {n} (tiled=True cuts it into equal pieces)"
        )
    return sd


def _exact_psum_scatter(x: Any, axis_name: Any, axes: tuple[int, ...], sd: int, tiled: bool) -> Any:
    """The exact reduce-scatter (:func:`psum_scatter`), not differentiable by itself."""
    kept = [d for d in range(x.ndim) if d not in axes]
    moved = jnp.moveaxis(x, kept[sd], 0)  # the scattered dimension first: whole rows a device
    order = [kept[sd]] + [d for d in range(x.ndim) if d != kept[sd]]
    moved_axes = tuple(sorted(order.index(a) for a in axes))
    rest = [x.shape[d] for d in kept if d != kept[sd]]
    n = x.shape[kept[sd]]

    def scatter(carried: Any) -> Any:
        rows = carried.reshape(n, -1, carried.shape[-1])
        return lax.psum_scatter(rows, axis_name, scatter_dimension=0, tiled=True)

    rounded = _summed_words(moved, axis_name, moved_axes, scatter)
    out = jnp.moveaxis(rounded.reshape(-1, *rest), 0, sd)
    return out if tiled else jnp.squeeze(out, sd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def _psum_scatter(x: Any, axis_name: Any, axes: tuple[int, ...], sd: int, tiled: bool) -> Any:
    return _exact_psum_scatter(x, axis_name, axes, sd, tiled)


def _psum_scatter_fwd(
    x: Any, axis_name: Any, axes: tuple[int, ...], sd: int, tiled: bool
) -> tuple[Any, Any]:
    return _exact_psum_scatter(x, axis_name, axes, sd, tiled), x


def _psum_scatter_bwd(
    axis_name: Any, axes: tuple[int, ...], sd: int, tiled: bool, x: Any, g: Any
) -> tuple[Any]:
    """JAX's own transpose of ``lax.psum_scatter`` (an all-gather of the cotangents: no sum),
    broadcast back over ``axes``."""
    like = x if not axes else jnp.sum(x, axis=axes)  # its shape and its mapped-axis type
    transpose = jax.linear_transpose(
        lambda t: lax.psum_scatter(t, axis_name, scatter_dimension=sd, tiled=tiled), like
    )
    back = transpose(g)[0]
    if axes:
        back = jnp.broadcast_to(jnp.expand_dims(back, axes), x.shape)
    return (back.astype(x.dtype),)


_psum_scatter.defvjp(_psum_scatter_fwd, _psum_scatter_bwd)


def psum_scatter(
    x: Any, axis_name: Any, *, scatter_dimension: int = 0, tiled: bool = False, axis: Any = None
) -> Any:
    """``lax.psum_scatter``, exact: each device's piece of the sum over ``axis_name``, rounded once.

    The signature and shapes of ``lax.psum_scatter``: ``x`` (an array, or a
    pytree of them) is summed over the devices of the mapped axis
    ``axis_name`` (of an enclosing ``jax.shard_map`` or ``pmap``) and cut along
    ``scatter_dimension``; device ``i`` keeps piece ``i``: with ``tiled`` a
    ``1 / devices`` block of that dimension (its size a multiple of the
    device count), without it slice ``i`` of a dimension whose size is the
    device count, that dimension dropped. ``axis`` (None, an int or a tuple,
    as for :func:`psum`) names local axes of ``x`` summed too, in the same
    exact sum (then ``scatter_dimension`` counts the dimensions left): each
    device's micro-batches stacked along ``axis``, so that the terms are the
    same whatever the device count.

    Float leaves (float16, bfloat16, float32, float64) come back in their
    dtype: each element the exact real sum of its terms on every device (and
    ``axis``), rounded once to nearest-even, with the fold's rules for
    ``-0.0``, NaN (canonical) and infinities — piece ``i`` holds the same
    bits as those elements of :func:`psum`, for any number of devices and any
    split of the terms between them. Integer and boolean leaves go to
    ``lax.psum_scatter`` itself (an integer sum is exact already); complex
    leaves are refused by their path. The leaves, ``axis``,
    ``scatter_dimension``, the sizes and ``axis_name`` are checked before any
    work (a :class:`bitfold.FoldError` naming them).

    How: the digit words of :func:`psum` (each element's exact sum as integer
    digits) travel through ``lax.psum_scatter`` — an integer sum, exact in any
    order — and each device rounds only the rows it keeps. Gradient: JAX's
    transpose of ``psum_scatter``, an all-gather of the cotangents (no sum),
    broadcast over ``axis``.

    >>> import jax, jax.numpy as jnp, bitfold.jax
    >>> f = jax.pmap(lambda x: bitfold.jax.psum_scatter(x, "i", axis=0, tiled=True),
    ...              axis_name="i")
    >>> f(jnp.array([[[1.0, 1.0], [2.0**-24, 0.0], [2.0**-24, 0.0]]])).tolist()  # float: 1.0
    [[1.0000001192092896, 1.0]]
    """
    paths, tree = jax.tree_util.tree_flatten_with_path(x)
    for path, leaf in paths:
        _check_leaf(leaf, path, "psum_scatter")
    arrays = [leaf if isinstance(leaf, jax.Array) or hasattr(leaf, "aval") else jnp.asarray(leaf)
              for _, leaf in paths]  # fmt: skip
    every_axes = [_axes(axis, a.ndim) for a in arrays]
    _devices(axis_name, "psum_scatter")  # bound here, for float and integer leaves alike
    out = []
    for a, axes in zip(arrays, every_axes, strict=True):
        summed = tuple(n for d, n in enumerate(a.shape) if d not in axes)
        sd = _scatter_checked(summed, axis_name, scatter_dimension, bool(tiled))
        if dtype_name(a) in VALUE_DTYPES:
            out.append(_psum_scatter(a, axis_name, axes, sd, bool(tiled)))
        else:  # integers: lax.psum_scatter's sum is exact
            local = jnp.sum(a, axis=axes) if axes else a
            out.append(lax.psum_scatter(local, axis_name, scatter_dimension=sd, tiled=tiled))
    return jax.tree.unflatten(tree, out)
