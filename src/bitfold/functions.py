"""One-call exact folds with the names people already use: ``segment_sum`` and ``add_at``.

No plan to keep: each call builds one (O(N + K)) and folds once. For a map
that never changes, build a :class:`bitfold.Fold` once instead and call it
every step.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from . import dispatch
from .arrays import ArrayFamily, family_of
from .backends.host_buffers import share_one_shot
from .errors import FoldError, FoldTypeError, IndexRangeError, ShapeError
from .formats import dtype_name
from .plan import Fold, one_shot
from .validate import (
    check_has_data,
    checked_options,
    index_range_error,
    read_index,
    type_label,
)


def segment_sum(
    values: Any,
    index: Any,
    K: int,
    strategy: str = "exact",
    *,
    out_dtype: Any = None,
    **options: Any,
) -> Any:
    """The K bucket sums of ``values`` by ``index``: ``bitfold.Fold(index, K)(values)``.

    ``values`` have ``index``'s shape (or ``(N,)``) followed by any trailing
    shape; the result has shape ``(K,) + trailing``, in the values' library
    and on their device. With the default ``exact`` strategy every element is
    the correctly rounded sum of its bucket's values (float32 for float16,
    bfloat16 and float32 values, float64 for float64 values, or
    ``out_dtype``): the same bits for any order of the values. A large result's
    memory is handed to a later call once nothing holds it any more
    (:mod:`bitfold.backends.host_buffers`). The plan is built for this one
    fold (:func:`bitfold.plan.one_shot`): past 2^16 buckets a fold that reads
    the index in position order checks each entry as it reads it, one pass
    over the index fewer; an entry outside ``[0, K)`` (negative ones included)
    raises the same :class:`bitfold.IndexRangeError` as :class:`bitfold.Fold`.
    ``options`` are a plan call's (``backend=``, ``init=``, the backend's
    tuning options); any other keyword is a :class:`bitfold.FoldError`
    listing the valid ones, raised before any work.

    >>> import numpy as np, bitfold
    >>> bitfold.segment_sum(np.array([1.0, 2.0, 3.0], np.float32), [0, 2, 0], 3).tolist()
    [4.0, 0.0, 2.0]
    """
    plan = share_one_shot(one_shot(index, K))
    return plan(values, strategy, out_dtype=out_dtype, **options)


#: The array libraries whose arrays ``add_at`` changes in place.
_IN_PLACE = ("numpy", "torch", "cupy")
_INTEGERS = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


@checked_options
def add_at(a: Any, indices: Any, b: Any) -> None:
    """``np.add.at(a, indices, b)``, exact: each element of ``a`` becomes one correctly rounded sum.

    The drop-in for ``np.add.at`` (and ``cupyx.scatter_add``): for every
    element of ``a`` that ``indices`` names, ``a`` becomes the correctly
    rounded sum of its old value and every element of ``b`` added to it
    (``b`` broadcast to the shape of ``a[indices]``), where ``np.add.at``
    rounds after every addition: the same bits for any order of the rows.
    ``indices`` take what NumPy's indexing takes: negative entries count from
    the end (``-1`` is the last element), and an entry outside
    ``[-len, len)`` of its axis is refused with :class:`bitfold.IndexRangeError`
    naming it and the range. For a NumPy ``a`` they may also be a tuple of
    index arrays, slices, ``...`` or a boolean mask (folded by flat position,
    one ``int64`` per element of ``a`` for the map); a CuPy array or torch
    tensor takes one integer index array on its first axis.

    Each term of ``b`` is read in the dtype NumPy would add it in (a float64
    ``b`` into a float32 ``a`` is summed exactly as float64 terms and rounded
    once to float32; a Python scalar is read in ``a``'s dtype). ``a`` is a
    float16, bfloat16 (torch), float32 or float64 array; an integer or
    boolean NumPy array (or torch tensor) is exact in any order already and is
    added by NumPy (torch) itself, after the same checks. Refused before any
    work, with the bad value named: a read-only ``a`` (a NumPy array whose
    writeable flag is off, a torch leaf that requires grad, a JAX array),
    complex ``a`` or ``b``, an ``a`` on a device without data (torch's ``meta``).

    >>> import numpy as np, bitfold
    >>> a = np.array([1.0, 2.0**-24, 0.0], np.float32)
    >>> bitfold.add_at(a, np.array([0, 0, -1]), np.array([2.0**-24, 2.0**-25, 5.0], np.float32))
    >>> a.tolist()  # 1 + 2^-24 + 2^-25 rounds once, up: np.add.at gives 1.0
    [1.0000001192092896, 5.960464477539063e-08, 5.0]
    """
    family = _target(a)
    name = dtype_name(a)
    first_axis = _first_axis_index(indices, a)
    if first_axis is None:
        _add_at_positions(a, indices, b, name)
    elif name in _INTEGERS:
        _add_at_integers(a, family, first_axis, b)
    else:
        _add_at_rows(a, family, first_axis, b)


def _target(a: Any) -> ArrayFamily:
    """The family of ``a`` after refusing what add_at cannot add into in place, before any work."""
    if not hasattr(a, "dtype") or not hasattr(a, "shape"):
        raise FoldTypeError(
            f"add_at adds into an array (NumPy, CuPy, torch); got a {type_label(a)}"
        )
    check_has_data(a, "a")
    family = family_of(a)
    if family.name == "jax":
        raise FoldTypeError(
            "a is a jax.Array, which cannot change in place: add_at adds into a NumPy or CuPy "
            "array or a torch tensor; for JAX use a + bitfold.jax.segment_sum(b, indices, len(a))"
        )
    if family.name not in _IN_PLACE:
        raise FoldTypeError(
            f"add_at adds into a NumPy or CuPy array or a torch tensor in place; got a "
            f"{type_label(a)}"
        )
    _refuse_read_only(a, family.name)
    name = dtype_name(a)
    if name in _INTEGERS and family.name == "cupy":
        raise FoldTypeError(
            f"a is an integer CuPy array ({name}): its sums are exact in any order already; "
            "use cupyx.scatter_add(a, indices, b)"
        )
    if name not in _INTEGERS and name not in ("float16", "bfloat16", "float32", "float64"):
        raise FoldTypeError(
            f"add_at adds into float16, bfloat16, float32 or float64 arrays (integer and boolean "
            f"ones by NumPy's or torch's own exact scatter); a has dtype {name}"
        )
    return family


def _refuse_read_only(a: Any, library: str) -> None:
    """Refuse an ``a`` that cannot be written in place, naming why."""
    if library == "numpy" and not a.flags.writeable:
        raise FoldError(
            "a is read-only (its writeable flag is off): add_at adds into a in place; pass a "
            "writable array, e.g. a.copy()"
        )
    if library == "torch":
        import torch

        if a.requires_grad and a.is_leaf and torch.is_grad_enabled():
            raise FoldError(
                "a is a leaf tensor that requires grad, which torch does not let change in "
                "place: call add_at under torch.no_grad(), or on a.detach()"
            )
        if a.is_inference() and not torch.is_inference_mode_enabled():
            raise FoldError(
                "a is an inference tensor, which cannot change in place outside "
                "torch.inference_mode(): call add_at inside it, or on a.clone()"
            )


def _first_axis_index(indices: Any, a: Any) -> Any:
    """``indices`` when they are integers on ``a``'s first axis (an array, list or int), else
    None: a NumPy index of another form (tuple, slice, ``...``, boolean mask) or a 0-d ``a``."""
    if isinstance(indices, numbers.Integral) and not isinstance(indices, bool):
        indices = [int(indices)]
    elif isinstance(indices, tuple | slice) or indices is Ellipsis or indices is None:
        return _other_form(indices, a)
    elif isinstance(indices, list):
        indices = _list_index(indices)
    if getattr(indices, "dtype", None) is not None and dtype_name(indices) == "bool":
        return _other_form(indices, a)
    if len(a.shape) == 0:
        return _other_form(indices, a)
    return indices


def _list_index(indices: list) -> Any:
    """A list index as NumPy reads it (an empty list: no ids), or the list itself when NumPy
    cannot read it (:func:`bitfold.validate.read_index` then names what is wrong)."""
    if not indices:
        return np.zeros(0, np.int64)
    try:
        return np.asarray(indices)
    except (TypeError, ValueError):
        return indices


def _other_form(indices: Any, a: Any) -> None:
    """None for a NumPy ``a`` (the index is folded by flat position), else a refusal."""
    if family_of(a).name == "numpy":
        return None
    raise FoldTypeError(
        f"add_at into a {type_label(a)} takes one integer index array on the first axis; got "
        f"{_describe(indices)} (tuples, slices and masks are taken for NumPy arrays)"
    )


def _describe(indices: Any) -> str:
    if isinstance(indices, tuple):
        return f"a tuple of {len(indices)} indices"
    if hasattr(indices, "dtype") and dtype_name(indices) == "bool":
        return "a boolean mask"
    return repr(indices)


# -- integer indices on the first axis ------------------------------------------------------------
def _first_axis_plan(indices: Any, n: int) -> Fold:
    """A plan of ``indices`` into ``n`` rows, negative entries counted from the end; an entry
    outside ``[-n, n)`` is refused in add_at's words (the first one, by position)."""
    flat = read_index(indices, "indices")
    plan = _plan_or_none(flat, n)
    if plan is None:
        flat = _wrapped(flat, n)
        plan = Fold(flat, n)
    return plan


def _plan_or_none(flat: np.ndarray, n: int) -> Fold | None:
    """``Fold(flat, n)``, or None when an entry is outside ``[0, n)``."""
    try:
        return Fold(flat, n)
    except IndexRangeError:
        return None


def _wrapped(flat: np.ndarray, n: int) -> np.ndarray:
    """``flat`` with ``-n <= i < 0`` read as ``i + n``; the first entry outside ``[-n, n)`` is
    refused, naming it and the range."""
    wide = flat.astype(np.int64) if flat.dtype.kind == "i" else flat
    bad = np.flatnonzero((wide < -n) | (wide >= n)) if wide.dtype.kind == "i" else None
    if bad is None:
        bad = np.flatnonzero(wide >= n)
    if bad.size:
        at = int(bad[0])
        raise index_range_error(
            flat.shape, at, int(flat.reshape(-1)[at]), n, f"len(a) = {n}",
            name="indices", negative=True,
        )  # fmt: skip
    return np.where(wide < 0, wide + n, wide)


def _add_at_rows(a: Any, family: ArrayFamily, indices: Any, b: Any) -> None:
    """Float ``a``, integer ``indices`` on its first axis: one exact fold of rows into ``a``."""
    n = int(a.shape[0])
    plan = share_one_shot(_first_axis_plan(indices, n))
    want = (*plan.shape, *(int(s) for s in a.shape[1:]))
    values = _terms_like(a, b, want, family.name)
    a[...] = dispatch.fold(plan, values, init=a)


def _add_at_integers(a: Any, family: ArrayFamily, indices: Any, b: Any) -> None:
    """Integer or boolean ``a``: exact in any order; added by the library's own scatter."""
    n = int(a.shape[0])
    plan = _first_axis_plan(indices, n)
    ids = plan.index.astype(np.int64).reshape(plan.shape)
    want = (*plan.shape, *(int(s) for s in a.shape[1:]))
    if family.name == "numpy":
        terms = _numpy_b(b, a.dtype)
        _check_broadcast(np.shape(terms), want)
        np.add.at(a, ids, terms)
        return
    import torch

    terms = _terms_like(a, b, want, "torch").reshape((plan.size, *a.shape[1:]))
    a.index_add_(0, torch.from_numpy(ids.reshape(-1)).to(a.device), terms)


# -- any NumPy index: folded by flat position ------------------------------------------------------
def _add_at_positions(a: np.ndarray, indices: Any, b: Any, name: str) -> None:
    """A NumPy ``a`` and any index NumPy's ``add.at`` takes: the flat positions it names, found
    by NumPy's own indexing (bounds and negative entries as NumPy reads them), folded at once."""
    shape = _indexed_shape(a, indices)
    if name in _INTEGERS:
        terms = _numpy_b(b, a.dtype)
        _check_broadcast(np.shape(terms), shape)
        np.add.at(a, indices, terms)
        return
    positions = np.arange(a.size, dtype=np.int64).reshape(a.shape)[indices]
    values = _terms_like(a, b, shape, "numpy").reshape(-1)
    plan = share_one_shot(Fold(positions.reshape(-1), max(a.size, 1)))
    flat = np.ascontiguousarray(a).reshape(-1)
    if a.size:
        a[...] = dispatch.fold(plan, values, init=flat).reshape(a.shape)


def _indexed_shape(a: np.ndarray, indices: Any) -> tuple[int, ...]:
    """The shape of ``a[indices]``, found without touching ``a`` or allocating its size; an
    index NumPy refuses is an :class:`bitfold.IndexRangeError` with NumPy's reason."""
    probe = np.broadcast_to(np.zeros((), np.int8), a.shape)  # zero strides: no memory
    problem = None
    try:
        shape = probe[indices].shape
    except IndexError as err:  # raised below, outside this block: one error
        problem = str(err)
    if problem is not None:
        raise IndexRangeError(
            f"indices do not fit a of shape {tuple(a.shape)}: {problem} (an index on an axis "
            f"of size n must satisfy -n <= index < n)"
        )
    return tuple(shape)


# -- b --------------------------------------------------------------------------------------------
def _check_broadcast(shape: tuple[int, ...], want: tuple[int, ...]) -> None:
    """Refuse a ``b`` of ``shape`` that does not broadcast to ``want`` (NumPy's rule)."""
    try:
        fits = np.broadcast_shapes(shape, want) == want
    except ValueError:
        fits = False
    if not fits:
        raise ShapeError(
            f"b of shape {tuple(shape)} cannot broadcast to the shape of a[indices] "
            f"(indices.shape + a.shape[1:] for an index array) = {want}"
        )


def _python_scalar(b: Any) -> bool:
    """True for a Python bool, int or float (NumPy 2 reads them in the other operand's dtype)."""
    return isinstance(b, bool | int | float) and not isinstance(b, np.generic)


def _numpy_b(b: Any, dtype: np.dtype) -> Any:
    """``b`` read by NumPy, refused (not cast) when complex or not numbers."""
    if _python_scalar(b):
        return b
    arr = _as_numpy(b)
    if arr.dtype.kind not in "biuf":
        raise FoldTypeError(
            f"b must hold real numbers (bool, integers or floats) to add into a of dtype "
            f"{dtype}; got dtype {arr.dtype}"
        )
    return arr


def _as_numpy(b: Any) -> np.ndarray:
    """``b`` as a NumPy array, or a refusal naming its type."""
    problem = ""
    try:
        return np.asarray(b)
    except (TypeError, ValueError, RuntimeError) as err:  # raised below: one error
        problem = str(err)
    raise FoldTypeError(f"b cannot be read as a NumPy array: a {type_label(b)} ({problem})")


def _term_dtype(a: np.ndarray, b: Any, arr: np.ndarray) -> np.dtype:
    """The dtype NumPy's ``add`` reads the terms of ``b`` in: ``a``'s, or a wider float.

    A Python scalar is read in ``a``'s dtype (NumPy 2's weak scalars); an array
    (or a list, read by NumPy) by NumPy's promotion with ``a``'s dtype.
    """
    if _python_scalar(b):
        return a.dtype
    work = np.result_type(a.dtype, arr.dtype)
    return work if work.kind == "f" and work.itemsize > a.dtype.itemsize else a.dtype


def _terms_like(a: Any, b: Any, shape: tuple[int, ...], library: str) -> Any:
    """``b`` broadcast to ``shape``, as an array of ``a``'s library and device, in the dtype its
    terms are added in (``a``'s; a wider float for a NumPy ``a``, as NumPy adds them)."""
    if library == "torch":
        return _torch_terms(a, b, shape)
    if library == "cupy":
        import cupy

        arr = cupy.asarray(b)
        _refuse_complex(arr.dtype)
        return _broadcast(cupy, arr.astype(a.dtype, copy=False), shape)
    arr = _numpy_b(b, a.dtype)
    arr = np.asarray(arr)
    return _broadcast(np, arr.astype(_term_dtype(a, b, arr), copy=False), shape)


def _refuse_complex(dtype: Any) -> None:
    if np.dtype(dtype).kind not in "biuf":
        raise FoldTypeError(f"b must hold real numbers (bool, integers or floats); got {dtype}")


def _torch_terms(a: Any, b: Any, shape: tuple[int, ...]) -> Any:
    import torch

    if isinstance(b, torch.Tensor):
        check_has_data(b, "b")
        t = b
    else:
        t = torch.as_tensor(np.asarray(_numpy_b(b, a.dtype)))
    if t.dtype.is_complex:
        raise FoldTypeError(f"b must hold real numbers; got {str(t.dtype).replace('torch.', '')}")
    _check_broadcast(tuple(t.shape), shape)
    return t.to(device=a.device, dtype=a.dtype).broadcast_to(shape).contiguous()


def _broadcast(xp: Any, arr: Any, shape: tuple[int, ...]) -> Any:
    """``arr`` (of library ``xp``) broadcast to ``shape``, contiguous, or a ShapeError."""
    _check_broadcast(tuple(arr.shape), shape)
    return xp.ascontiguousarray(xp.broadcast_to(arr, shape))


__all__ = ["add_at", "segment_sum"]
