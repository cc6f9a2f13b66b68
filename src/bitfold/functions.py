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
from .arrays import family_of
from .backends.host_buffers import share_one_shot
from .errors import FoldTypeError, IndexRangeError, ShapeError
from .formats import dtype_name
from .plan import Fold, one_shot
from .validate import index_range_error


def segment_sum(
    values: Any, index: Any, K: int, strategy: str = "exact", *, out_dtype: Any = None
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
    over the index fewer; an entry outside ``[0, K)`` raises the same
    :class:`bitfold.IndexRangeError` as :class:`bitfold.Fold`.

    >>> import numpy as np, bitfold
    >>> bitfold.segment_sum(np.array([1.0, 2.0, 3.0], np.float32), [0, 2, 0], 3).tolist()
    [4.0, 0.0, 2.0]
    """
    return share_one_shot(one_shot(index, K))(values, strategy, out_dtype=out_dtype)


def add_at(a: Any, indices: Any, b: Any) -> None:
    """``np.add.at(a, indices, b)``, exact: ``a[k]`` becomes one correctly rounded sum, in place.

    The drop-in for ``np.add.at`` (and ``cupyx.scatter_add``) with an integer
    index array on the first axis: for every ``k``, ``a[k]`` becomes the
    correctly rounded sum of its old value and every row of ``b`` added to it
    (``b`` broadcast to ``indices.shape + a.shape[1:]`` and cast to ``a``'s
    dtype first, as NumPy does): the same bits for any order of the rows,
    where ``np.add.at`` rounds after every addition. ``a`` may be a NumPy or
    CuPy array (or a torch tensor) of a floating dtype; an integer or boolean
    ``a`` is exact already and goes to ``np.add.at`` itself.

    Unlike ``np.add.at``, an index outside ``[0, len(a))`` — negative ones
    included — is refused with :class:`bitfold.IndexRangeError` (NumPy would
    wrap negative indices); slices, tuples of index arrays and boolean masks
    are refused with :class:`bitfold.FoldTypeError`.

    >>> import numpy as np, bitfold
    >>> a = np.array([1.0, 2.0**-24, 0.0], np.float32)
    >>> bitfold.add_at(a, np.array([0, 0, 2]), np.array([2.0**-24, 2.0**-25, 5.0], np.float32))
    >>> a.tolist()  # 1 + 2^-24 + 2^-25 rounds once, up: np.add.at gives 1.0
    [1.0000001192092896, 5.960464477539063e-08, 5.0]
    """
    idx = _first_axis_index(indices)
    if not hasattr(a, "dtype") or not hasattr(a, "shape") or len(a.shape) == 0:
        raise FoldTypeError(
            f"add_at adds into an array with a first axis (NumPy, CuPy, torch); got "
            f"{type(a).__module__}.{type(a).__qualname__} of shape {getattr(a, 'shape', None)}"
        )
    family = family_of(a)
    name = dtype_name(a)
    if name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"):
        if family.name != "numpy":
            raise FoldTypeError(f"add_at on an integer {family.name} array: use its own scatter")
        np.add.at(a, idx, b)  # integer sums are exact in any order
        return
    trailing = tuple(int(s) for s in a.shape[1:])
    want = (*idx.shape, *trailing)
    values = _broadcast_like(a, b, want, family.name)
    n = int(a.shape[0])
    try:
        plan = share_one_shot(Fold(idx, n))
    except IndexRangeError as err:  # in add_at's words: the bound is a's length, not a "K"
        raise index_range_error(idx.shape, err.position, err.value, n, f"len(a) = {n}") from None
    result = dispatch.fold(plan, values, init=a)
    a[...] = result


def _first_axis_index(indices: Any) -> np.ndarray:
    """An integer index array for the first axis, or a refusal naming the form given."""
    if isinstance(indices, slice) or indices is Ellipsis or indices is None:
        raise FoldTypeError(
            f"add_at takes an integer index array on the first axis; got {indices!r} "
            "(for a slice, add to a[slice] directly)"
        )
    if isinstance(indices, tuple):
        raise FoldTypeError(
            "add_at takes one integer index array on the first axis; got a tuple of "
            f"{len(indices)} indices (fold each axis with bitfold.Fold on a flattened map)"
        )
    if isinstance(indices, numbers.Integral):
        indices = [indices]
    arr = np.asarray(indices) if not hasattr(indices, "dtype") else indices
    if dtype_name(arr) == "bool":
        raise FoldTypeError("add_at takes integer indices; got a boolean mask (use np.flatnonzero)")
    return arr


def _broadcast_like(a: Any, b: Any, shape: tuple[int, ...], library: str) -> Any:
    """``b`` as an array of ``a``'s library, dtype and device, broadcast to ``shape``."""
    if library == "torch":
        import torch

        t = b if isinstance(b, torch.Tensor) else torch.as_tensor(np.asarray(b))
        try:
            return t.to(device=a.device, dtype=a.dtype).broadcast_to(shape).contiguous()
        except RuntimeError as err:
            raise ShapeError(f"b of shape {tuple(t.shape)} cannot broadcast to {shape}") from err
    if library == "cupy":
        import cupy

        xp: Any = cupy
    else:
        xp = np
    arr = xp.asarray(b).astype(a.dtype, copy=False)
    try:
        return xp.ascontiguousarray(xp.broadcast_to(arr, shape))
    except ValueError:
        raise ShapeError(
            f"b of shape {tuple(arr.shape)} cannot broadcast to indices.shape + a.shape[1:] = "
            f"{shape}"
        ) from None


__all__ = ["add_at", "segment_sum"]
