"""Exact versions of the ATen ops that fold, on plain tensors: the arithmetic of the adapter.

Every function here takes plain tensors of a floating dtype (float16,
bfloat16, float32, float64) on a device a bitfold backend serves
(:func:`bitfold.torch.devices.folds_on`), returns a new tensor and records no
autograd: the custom ops of :mod:`bitfold.torch.ops` call them inside their
implementations, and :mod:`bitfold.torch.mode` calls them in place of ATen.
Each folds by a plan of the index it is given (ids may change every call;
an index tensor met again, equal entry for entry, reuses its plan:
:mod:`bitfold.torch.plan_cache`) through :func:`bitfold.dispatch.fold`, so
CUDA tensors fold on their device with the engine's GPU kernels (other
devices by the portable path). A small CPU fold (an index of fewer than
:data:`bitfold.torch.plan_cache.MIN_POSITIONS` ids, which the cache never
keeps, and fewer than :data:`SMALL_VALUES` values) skips the plan and the
dispatch: a NumPy sort of its ids and the host backend's bucket kernel, the
same bits at a fraction of the set-up's cost (:func:`_small_host_fold`).

The numeric contract, shared by every function: each *term* is computed as
torch computes it (``alpha * source[i]`` rounded to the dtype, a row of the
gradient divided by its bag size, times its per-sample weight, ...), then
every output element is the **correctly rounded sum of its old value (where
the op adds into one) and all its terms**, one rounding, in the output's
dtype: the same bits for any order of the terms. A mean is that sum, then
divided once by the count. NaN results are the canonical NaN
(``bitfold.CANONICAL_NAN_BITS``).

The functions trust their callers for the checks torch itself makes
(dtypes equal, shapes compatible); :func:`shape_problem` says what is
wrong, for the callers to refuse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..backends import registry
from ..backends.host_arrays import target as _rounding_target
from ..dispatch import fold as _engine_fold
from ..errors import IndexRangeError
from ..formats import limb_format_for
from ..kernels import buckets as _bucket_kernels
from ..validate import index_range_error
from .plan_cache import MIN_POSITIONS, PLANS

#: the dtypes bitfold folds exactly
FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
#: torch dtype -> the engine's dtype name
NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
#: fold into the distinct targets only when they are fewer than 1/8 of the tensor
_SPARSE_TARGETS = 8
#: a CPU fold of fewer values (positions times row) than this, by an index of fewer than
#: :data:`bitfold.torch.plan_cache.MIN_POSITIONS` positions (never cached), goes straight to the
#: host backend's bucket kernel (:func:`_small_host_fold`)
SMALL_VALUES = 1 << 17
#: the dtypes of the small folds' direct way: values, ``init`` and result all of one of them
_SMALL_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_SMALL_INDEX = (torch.int64, torch.int32)
#: what the bucket kernels take for a dtype: (limbs, rounding target)
_SMALL_KERNEL: dict[str, tuple[int, tuple[int, ...]]] = {}


# -- the two ways in ------------------------------------------------------------------------------
def fold_rows(
    index: torch.Tensor,
    values: torch.Tensor,
    K: int,
    *,
    init: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The exact fold of ``values`` (``(N,) + trailing``) by ``index`` (N ids) into K rows.

    The result has shape ``(K,) + trailing`` and the values' dtype (or
    ``out_dtype``, or ``init``'s: ``init`` of shape ``(K,) + trailing`` is
    added into, one rounding per element), on the values' device: float64
    values (exact products, say) can be rounded once to float32. An index
    outside ``[0, K)`` raises :class:`bitfold.IndexRangeError`.
    """
    values = values.detach()
    if not values.is_contiguous():
        values = values.contiguous()
    if out_dtype is None or out_dtype == values.dtype:
        small = _small_host_fold(index, values, K, init)
        if small is not None:
            return small
    plan = PLANS.plan(index, K)
    if init is None:
        out = NAMES[values.dtype if out_dtype is None else out_dtype]
        return _engine_fold(plan, values, "exact", out_dtype=out)
    return _engine_fold(plan, values, "exact", init=init.detach().contiguous())


def _host_serves_cpu() -> bool:
    """Whether the host backend is the one that serves CPU tensors now (never raises: with no
    backend for them, the usual way refuses them in its words)."""
    for backend in registry.backends():
        if backend.serves("torch", "cpu"):
            return backend.name == "host"
    return False


def _small_ids(ix: Any, first: torch.Tensor) -> bool:
    """Whether ``ix`` is a plain CPU tensor of int32 or int64 ids, as ``first`` is (the same
    dtype and number of ids; 1-D unless it is ``first`` itself)."""
    return (
        type(ix) is torch.Tensor
        and ix.is_cpu
        and ix.layout is torch.strided
        and ix.dtype in _SMALL_INDEX
        and (ix is first or (ix.dtype == first.dtype and ix.dim() == 1 and ix.shape == first.shape))
    )


def _small_host_fold(
    index: torch.Tensor | tuple[torch.Tensor, ...],
    values: torch.Tensor,
    K: int,
    init: torch.Tensor | None,
    wrap: bool = False,
    dims: tuple[int, ...] | None = None,
    in_place: bool = False,
) -> torch.Tensor | None:
    """:func:`fold_rows` of a small CPU fold, or None where it is not one.

    A fold of a few hundred rows (an ``index_add``, an embedding gradient of
    one batch) costs far less than the way through the plan cache and the
    dispatch (their checks, backend choice, plan object and conversions:
    about 60 us of the 80 us such a fold took on a 2-core VM). Taken here:
    values plain contiguous CPU tensors of float32 or float64 (``init`` of
    the same dtype), an index a plain int32 or int64 CPU tensor of N <
    :data:`MIN_POSITIONS` positions (a size the plan cache never keeps, so no
    plan is lost), N times the row below :data:`SMALL_VALUES` (one task, as
    the host backend runs such a fold), and the host backend the one that
    serves CPU tensors. One Numba call
    (:func:`bitfold.kernels.buckets.fold_rows_into`) checks and sorts the
    index and sums every bucket it touches exactly, with ``init``'s entry as
    one more term, rounded once: the bits of every exact route. With
    ``dims`` (sizes whose product is K), ``index`` is a tuple of one 1-D
    tensor of ids a dimension, each position's bucket their row-major flat
    id (the rows of ``x[i, j] += v``). With ``wrap``, an id in ``[-size,
    0)`` counts from the end (torch's indexing). With ``in_place`` the sums
    are written into ``init`` itself (an in-place op's target: contiguous
    and sharing no memory with the values or ids, or None is returned), and
    ``init`` is returned. An index entry outside the range goes the usual
    way, which raises the usual :class:`bitfold.IndexRangeError`.
    """
    name = _SMALL_DTYPES.get(values.dtype)
    parts = (index,) if dims is None else index
    if (
        name is None
        or type(values) is not torch.Tensor
        or not values.is_cpu
        or values.layout is not torch.strided
        or values.dim() == 0
        or not all(_small_ids(ix, parts[0]) for ix in parts)
    ):
        return None
    n = parts[0].numel()
    if (
        not 0 < n < MIN_POSITIONS
        or values.shape[0] != n
        or values.numel() >= SMALL_VALUES
        or K <= 0
    ):
        return None
    trailing = tuple(values.shape[1:])
    if init is not None:
        init = init.detach()
        if (
            type(init) is not torch.Tensor
            or init.dtype != values.dtype
            or not init.is_cpu
            or init.layout is not torch.strided
            or tuple(init.shape) != (K, *trailing)
            or (in_place and not init.is_contiguous())
        ):
            return None
    elif in_place:
        return None
    if torch.compiler.is_compiling() or not _host_serves_cpu():
        return None
    if dims is None:  # integer ids: never a gradient, so .numpy() needs no detach
        ids, sizes = index.numpy().reshape(1, n), np.array([K], np.int64)
    else:
        ids, sizes = torch.stack(parts).numpy(), np.array(dims, np.int64)
    rows = values.numpy().reshape(n, -1)
    D = rows.shape[1]
    if in_place:
        result = init
        target = old = init.numpy().reshape(K, D)
        if np.may_share_memory(target, rows) or np.may_share_memory(target, ids):
            return None
    else:  # every element written by the kernel
        target = np.empty((K, D), rows.dtype)
        result = torch.from_numpy(target)
        old = None if init is None else init.contiguous().numpy().reshape(K, D)
    if not _fold_rows_into(name, ids, sizes, wrap, rows, target, old):
        return None  # an id out of range: refused the usual way, in its words
    return result if in_place else result.view((K, *trailing))


def _fold_rows_into(
    name: str,
    ids: np.ndarray,
    sizes: np.ndarray,
    wrap: bool,
    rows: np.ndarray,
    target: np.ndarray,
    old: np.ndarray | None,
) -> bool:
    """The host backend's small-fold kernel on this thread: row k of ``target`` (K, D) becomes
    the correctly rounded sum of the rows ``ids`` put in bucket k and of ``old[k]`` (``old``
    may be ``target`` itself); False (nothing written) for an id out of range."""
    limbs, goal = _small_kernel(name)
    return _bucket_kernels.fold_rows_into(ids, sizes, wrap, rows, target, goal, limbs,
                                          old) == 0  # fmt: skip


def _bucket_sums(
    name: str, rows: np.ndarray, order: np.ndarray, offsets: np.ndarray, start: np.ndarray | None
) -> torch.Tensor:
    """The host backend's bucket kernel on this thread: row k of the result (K, D) is the
    correctly rounded sum of ``rows[order[offsets[k]:offsets[k + 1]]]`` (and ``start[k]``).

    ``order`` and ``offsets`` int32; the arrays are marked read-only in place (the caller owns
    them: views made for the call), as the kernels take them.
    """
    for owned in (offsets, order, rows, start):
        if owned is not None:
            owned.flags.writeable = False
    limbs, goal = _small_kernel(name)
    K = offsets.shape[0] - 1
    out = np.empty((K, rows.shape[1]), rows.dtype)
    bits = np.int32 if name == "float32" else np.int64
    _bucket_kernels.fold_bucket_range(rows, order, offsets, 0, K, out, out.view(bits), goal, True,
                                      limbs, start)  # fmt: skip
    return torch.from_numpy(out)


def _small_kernel(name: str) -> tuple[int, tuple[int, ...]]:
    """What the bucket kernels take for a dtype: its limb count and rounding target."""
    kernel = _SMALL_KERNEL.get(name)
    if kernel is None:
        fmt = limb_format_for(name)
        kernel = _SMALL_KERNEL[name] = (fmt.limbs, _rounding_target(name, fmt))
    return kernel


def fold_positions(
    positions: torch.Tensor, values: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    """``target`` with ``values[i]`` added at flat position ``positions[i]``: one rounding each.

    ``positions`` and ``values`` are flat (N each); the result is a new tensor
    of ``target``'s shape. When the positions touch few elements of a large
    target, only the distinct ones are folded (a sort of the positions), so
    the plan stays O(N).
    """
    flat = target.reshape(-1)
    size = flat.numel()
    positions = positions.reshape(-1)
    values = values.reshape(-1)
    if positions.numel() == 0:
        return target.clone()
    if positions.numel() * _SPARSE_TARGETS >= size:
        return fold_rows(positions, values, size, init=flat).view(target.shape)
    check_range(positions, size)
    targets, inverse = torch.unique(positions, return_inverse=True)
    summed = fold_rows(inverse, values, targets.numel(), init=flat[targets])
    out = flat.clone()
    out[targets] = summed
    return out.view(target.shape)


def check_range(
    index: torch.Tensor,
    size: int,
    bound: str | None = None,
    *,
    name: str = "index",
    negative: bool = False,
) -> None:
    """Refuse an index outside ``[0, size)`` (:class:`bitfold.IndexRangeError`, naming it).

    ``bound`` names the limit as the user knows it (``"input.shape[0] = 5"``);
    ``negative=True`` accepts ``-size <= index < 0`` too (torch's indexing
    counts those from the end); ``name`` names the index in the message.
    """
    low = -size if negative else 0
    if index.numel() == 0:
        return
    least, most = torch.aminmax(index)  # one pass, and no mask, for the common case: all in range
    if int(least) >= low and int(most) < size:
        return
    bad = (index < low) | (index >= size)
    if bool(bad.any()):
        flat = index.reshape(-1)
        at = int(torch.nonzero(bad.reshape(-1))[0, 0])
        raise index_range_error(
            tuple(index.shape), at, int(flat[at]), size, bound, name=name, negative=negative
        )


def _least_in_range(index: torch.Tensor, size: int) -> int | None:
    """The least id of ``index`` when every id is in ``[-size, size)``; None when one is not, or
    when there are none (one pass over the ids: what :func:`check_range` and
    :func:`wrap_negative` ask, together)."""
    if index.numel() == 0:
        return None
    least, most = torch.aminmax(index)
    low = int(least)
    return low if low >= -size and int(most) < size else None


def wrap_negative(index: torch.Tensor, size: int) -> torch.Tensor:
    """Negative indices (``-size <= i < 0``) as ``i + size``, as torch's indexing reads them.

    An index without negative entries is returned as it is (the same tensor), so an index
    met again keeps its plan (:mod:`bitfold.torch.plan_cache`)."""
    if index.numel() == 0 or int(index.min()) >= 0:
        return index
    return torch.where(index < 0, index + size, index)


def shape_problem(
    op: str, input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor
) -> str | None:
    """What torch would refuse in ``op(input, dim, index, src)``, or None; ``op`` is
    ``"index_add"`` or ``"scatter_add"`` (whose shapes ``scatter_reduce`` takes too).

    First a ``dim`` outside ``input``'s dimensions (a 0-d tensor has one), then the
    shapes, as that op checks them.
    """
    nd = max(input.dim(), 1)
    if not -nd <= dim < nd:
        return f"dim {dim} is out of range for a tensor of {input.dim()} dimensions"
    shapes = {"index_add": _index_add_shapes, "scatter_add": _scatter_shapes}[op]
    return shapes(input, dim, dim % nd, index, src)


# -- index_add ------------------------------------------------------------------------------------
def _index_add_shapes(
    input: torch.Tensor, dim: int, d: int, index: torch.Tensor, source: torch.Tensor
) -> str | None:
    """What torch would refuse in the shapes of ``index_add(input, dim, index, source)``, or
    None; ``dim`` is in range, ``d`` is it counted from the front."""
    if index.dim() > 1:
        return f"index must be a vector; got shape {tuple(index.shape)}"
    in_shape = tuple(input.shape) or (1,)
    src_shape = tuple(source.shape) or (1,)
    if len(src_shape) != len(in_shape):
        return (
            f"source has {source.dim()} dimensions and input {input.dim()}: index_add needs the "
            "same number"
        )
    if src_shape[d] != index.numel():
        return (
            f"source has {src_shape[d]} entries along dim {dim} and index {index.numel()}: "
            "they must be equal"
        )
    for k, (a, b) in enumerate(zip(in_shape, src_shape, strict=True)):
        if k != d and a != b:
            return (
                f"source of shape {tuple(source.shape)} does not fit input of shape "
                f"{tuple(input.shape)} outside dim {dim} (dimension {k}: {b} != {a})"
            )
    return None


def index_add(
    input: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, alpha: Any = 1
) -> torch.Tensor:
    """``input.index_add(dim, index, source, alpha=alpha)``, exact.

    Each term ``alpha * source[i]`` is rounded to the dtype as ``source *
    alpha`` computes it (no product when ``alpha == 1``); every slice
    ``input.select(dim, k)`` then gets the correctly rounded sum of its old
    value and its terms.
    """
    if input.dim() == 0:
        return index_add(input.reshape(1), 0, index, source.reshape(1), alpha).reshape(())
    d = dim % input.dim()
    terms = source if d == 0 else source.movedim(d, 0)
    if alpha != 1:
        terms = terms * alpha
    try:
        out = fold_rows(index, terms, input.shape[d], init=input if d == 0 else input.movedim(d, 0))
    except IndexRangeError as err:  # in index_add's words: the bound is input.shape[dim]
        bound = f"input.shape[{dim}] = {input.shape[d]}"
        raise index_range_error(
            tuple(index.shape), err.position, err.value, input.shape[d], bound
        ) from None
    return out if d == 0 and out.is_contiguous() else out.movedim(0, d).contiguous()


def index_reduce_mean(
    input: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, include_self: bool
) -> torch.Tensor:
    """``input.index_reduce(dim, index, source, "mean", include_self=...)``, exact.

    Every slice that ``index`` names becomes the correctly rounded sum of its
    terms (and its old value with ``include_self``), divided once by their
    count; the other slices keep their value.
    """
    if input.dim() == 0:
        return index_reduce_mean(
            input.reshape(1), 0, index, source.reshape(1), include_self
        ).reshape(())
    d = dim % input.dim()
    base = input if include_self else input.index_fill(d, index, 0)
    summed = index_add(base, d, index, source)
    K = input.shape[d]
    ids = index.reshape(-1).to(torch.int64)
    counts = torch.zeros(K, dtype=torch.int64, device=input.device)
    counts.index_add_(0, ids, torch.ones_like(ids))
    counts = (counts + int(include_self)).clamp(min=1)
    shape = [1] * input.dim()
    shape[d] = K
    return divide_by_counts(summed, counts.view(shape))


# -- scatter_add ----------------------------------------------------------------------------------
def _scatter_shapes(
    input: torch.Tensor, dim: int, d: int, index: torch.Tensor, src: torch.Tensor
) -> str | None:
    """What torch would refuse in the shapes of ``scatter_add(input, dim, index, src)``, or
    None; ``dim`` is in range, ``d`` is it counted from the front."""
    if index.numel() == 0:
        return None
    dims = {max(t.dim(), 1) for t in (input, index, src)}
    if len(dims) != 1:
        return (
            f"input, index and src must have the same number of dimensions; got "
            f"{input.dim()}, {index.dim()} and {src.dim()}"
        )
    shapes = [tuple(t.shape) or (1,) for t in (input, index, src)]
    for k, (a, i, s) in enumerate(zip(*shapes, strict=True)):
        if i > s or (k != d and i > a):
            return (
                f"index of shape {tuple(index.shape)} is larger than src {tuple(src.shape)}"
                f" or than input {tuple(input.shape)} outside dim {dim} (dimension {k})"
            )
    return None


def _constant_along_trailing(idx: torch.Tensor) -> bool:
    """True when ``idx[i, ...]`` is one value for each i (an index expanded along trailing dims)."""
    if idx.dim() <= 1:
        return True
    if all(st == 0 or n == 1 for st, n in zip(idx.stride()[1:], idx.shape[1:], strict=True)):
        return True
    first = idx[(slice(None),) + (slice(0, 1),) * (idx.dim() - 1)]
    return bool((idx == first).all())


def scatter_add(
    input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor
) -> torch.Tensor:
    """``input.scatter_add(dim, index, src)``, exact.

    Every element of ``input`` gets the correctly rounded sum of its old
    value and the ``src`` elements that ``index`` sends to it (one rounding).
    An index constant along the dimensions after ``dim`` (a vector of ids
    expanded over the features, as graph libraries pass it) folds whole rows;
    any other index folds element by element.
    """
    if index.numel() == 0:
        return input.clone()
    if input.dim() == 0:
        return scatter_add(input.reshape(1), 0, index.reshape(1), src.reshape(1)).reshape(())
    d = dim % input.dim()
    try:
        return _scatter_add(input, d, index, src)
    except IndexRangeError:  # the first bad entry of the index as given, in scatter's words
        check_range(index, input.shape[d], f"input.shape[{dim}] = {input.shape[d]}")
        raise


def _scatter_add(
    input: torch.Tensor, d: int, index: torch.Tensor, src: torch.Tensor
) -> torch.Tensor:
    idx = index.movedim(d, 0)
    n, trailing = idx.shape[0], tuple(idx.shape[1:])
    terms = src.movedim(d, 0)[tuple(slice(0, s) for s in idx.shape)]
    base = input.movedim(d, 0)
    K = base.shape[0]
    rows = _constant_along_trailing(idx)
    if rows and trailing == tuple(base.shape[1:]):  # whole rows: no copy of the untouched part
        ids = idx[(slice(None),) + (0,) * len(trailing)]
        return fold_rows(ids, terms, K, init=base).movedim(0, d).contiguous()
    out = base.clone()
    region = (slice(None), *(slice(0, s) for s in trailing))
    if rows:
        ids = idx[(slice(None),) + (0,) * len(trailing)]
        out[region] = fold_rows(ids, terms.reshape((n, *trailing)), K, init=out[region])
    else:
        check_range(idx.movedim(0, d), K)  # before positions are flattened
        width = math.prod(trailing)
        cols = torch.arange(width, device=idx.device).view(trailing)
        positions = idx.to(torch.int64) * width + cols
        out[region] = fold_positions(positions, terms.reshape(-1), out[region].contiguous())
    return out.movedim(0, d).contiguous()


def scatter_reduce(
    input: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    src: torch.Tensor,
    reduce: str,
    include_self: bool = True,
) -> torch.Tensor:
    """``input.scatter_reduce(dim, index, src, reduce, include_self=...)``, "sum" and "mean", exact.

    "sum": as :func:`scatter_add`; without ``include_self`` the elements
    ``index`` names start from zero (as torch fills them with the sum's
    identity). "mean": that correctly rounded sum, divided once by the
    number of terms (plus one with ``include_self``); untouched elements keep
    their value.
    """
    if reduce == "sum" and include_self:
        return scatter_add(input, dim, index, src)
    base = input if include_self else input.scatter(dim, index, 0)
    summed = scatter_add(base, dim, index, src)
    if reduce == "sum":
        return summed
    counts = torch.zeros(input.shape, dtype=torch.int64, device=input.device)
    if index.numel():
        counts.scatter_add_(dim, index, torch.ones_like(index, dtype=torch.int64))
    counts = (counts + int(include_self)).clamp(min=1)
    return divide_by_counts(summed, counts)


# -- index_put / put (accumulate=True) ------------------------------------------------------------
def index_put(
    input: torch.Tensor, indices: Sequence[torch.Tensor | None], values: torch.Tensor
) -> torch.Tensor:
    """``input.index_put(indices, values, accumulate=True)``, exact (the backward of ``x[idx]``).

    ``indices`` as ATen takes them: one entry per leading dimension, ``None``
    for a full slice, integer (negative ones wrap) or boolean tensors. Every
    element of ``input`` gets the correctly rounded sum of its old value and
    every value sent to it. An integer index outside ``[-size, size)`` of its
    dimension raises :class:`bitfold.IndexRangeError` naming it as given.
    """
    small = small_index_put(input, indices, values)
    if small is not None:
        return small
    first = indices[0] if len(indices) == 1 else None
    least: dict[int, int | None] = {}  # each integer index's least id, once all are in range
    for d, ix in enumerate(indices):  # before anything wraps or flattens them: the ids as given
        if ix is not None and ix.dtype not in (torch.bool, torch.uint8) and d < input.dim():
            size = input.shape[d]
            least[d] = _least_in_range(ix, size)
            if least[d] is None:  # some id out of range (raises), or no ids
                check_range(ix, size, f"input.shape[{d}] = {size}", negative=True)
    if first is not None and first.dtype not in (torch.bool, torch.uint8) and input.dim() >= 1:
        K = input.shape[0]
        idx = first.reshape(-1)
        if (least.get(0) or 0) < 0:  # negative ids count from the end
            idx = torch.where(idx < 0, idx + K, idx)
        rows = tuple(input.shape[1:])
        terms = values.broadcast_to((*first.shape, *rows)).reshape((idx.numel(), *rows))
        return fold_rows(idx, terms, K, init=input)
    where = torch.arange(input.numel(), device=input.device).view(input.shape)
    positions = torch.ops.aten.index.Tensor(where, list(indices))
    return fold_positions(positions, values.broadcast_to(positions.shape), input)


def small_index_put(
    input: torch.Tensor,
    indices: Sequence[torch.Tensor | None],
    values: torch.Tensor,
    in_place: bool = False,
) -> torch.Tensor | None:
    """:func:`index_put` of a small CPU fold by integer ids for the leading dims (the backward
    of ``x[idx]`` or ``x[i, j]``: a row of ``values`` a position), by the direct way; None where
    it is not one (or an id is out of range: :func:`index_put` then says so). With
    ``in_place``, the sums are written into ``input``, which is returned (``index_put_``)."""
    m = len(indices)
    if not 0 < m <= input.dim() or any(ix is None for ix in indices):
        return None
    if in_place and not input.is_contiguous():  # the (K, *rows) reshape below would be a copy
        return None
    dims, rows = tuple(input.shape[:m]), tuple(input.shape[m:])
    if tuple(values.shape) != (indices[0].numel(), *rows):
        return None
    K = math.prod(dims)
    small = _small_host_fold(indices[0] if m == 1 else tuple(indices),
                             values.detach().contiguous(), K, input.reshape((K, *rows)), wrap=True,
                             dims=None if m == 1 else dims, in_place=in_place)  # fmt: skip
    if small is None:
        return None
    return input if in_place else small.view(input.shape)


def small_index_add(
    input: torch.Tensor, index: torch.Tensor, source: torch.Tensor, in_place: bool = False
) -> torch.Tensor | None:
    """``input.index_add(0, index, source)`` of a small CPU fold by the direct way, or None
    (not one, or an id out of range: :func:`index_add` then says so). With ``in_place``, the
    sums are written into ``input``, which is returned (``index_add_``)."""
    if input.dim() == 0 or index.dim() > 1:
        return None
    small = _small_host_fold(index.reshape(-1), source.detach().contiguous(), input.shape[0],
                             input, in_place=in_place)  # fmt: skip
    return input if in_place and small is not None else small


def small_embedding_backward(
    grad: torch.Tensor, indices: torch.Tensor, num_weights: int
) -> torch.Tensor | None:
    """:func:`embedding_backward` without padding or frequency scaling, of a small CPU fold, by
    the direct way, or None (not one, or an id out of range)."""
    lead = indices.dim()
    if tuple(grad.shape[:lead]) != tuple(indices.shape) or grad.dim() == lead:
        return None
    rows = grad.detach().reshape((indices.numel(), *grad.shape[lead:]))
    return _small_host_fold(indices.reshape(-1), rows.contiguous(), num_weights, None)


def put(input: torch.Tensor, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``input.put(index, source, accumulate=True)``, exact: flat positions, negative ones wrap."""
    check_range(index, input.numel(), f"input.numel() = {input.numel()}", negative=True)
    positions = wrap_negative(index.reshape(-1), input.numel())
    return fold_positions(positions, source.reshape(-1), input)


# -- embeddings -----------------------------------------------------------------------------------
def embedding_terms(
    grad: torch.Tensor,
    ids: torch.Tensor,
    num_weights: int,
    padding_idx: int,
    scale_grad_by_freq: bool,
) -> torch.Tensor:
    """The rows an embedding's backward folds: ``grad`` rows (N, ...) scaled and masked.

    With ``scale_grad_by_freq`` each row is divided by how often its id
    occurs in ``ids`` (rounded once); rows whose id is ``padding_idx`` (>= 0)
    become zeros, so the padding row's gradient is ``+0.0``. ATen ops only
    (the custom ops' backward is traced by ``torch.compile``).
    """
    terms = grad
    trailing = (1,) * (grad.dim() - 1)
    if scale_grad_by_freq:
        counts = torch.zeros(num_weights, dtype=torch.int64, device=grad.device)
        counts.index_add_(0, ids.to(torch.int64), torch.ones_like(ids, dtype=torch.int64))
        terms = terms / counts[ids].to(grad.dtype).view((-1, *trailing))
    if padding_idx >= 0:
        terms = terms.masked_fill((ids == padding_idx).view((-1, *trailing)), 0)
    return terms


def embedding_backward(
    grad: torch.Tensor,
    indices: torch.Tensor,
    num_weights: int,
    padding_idx: int,
    scale_grad_by_freq: bool,
) -> torch.Tensor:
    """``embedding_dense_backward``, exact: row k is the correctly rounded sum of its terms.

    ``grad`` has shape ``indices.shape + (D,)``; the terms are
    :func:`embedding_terms`'s; the result is ``(num_weights, D)`` in
    ``grad``'s dtype.
    """
    ids = indices.reshape(-1)
    rows = grad.reshape((ids.numel(), *grad.shape[indices.dim() :]))
    terms = embedding_terms(rows, ids, num_weights, padding_idx, scale_grad_by_freq)
    return fold_rows(ids, terms, num_weights)


def bag_of_positions(
    offsets: torch.Tensor, num_bags: int, n: int, end: int | None = None
) -> torch.Tensor:
    """The bag of each of ``n`` positions, for bags starting at ``offsets[:num_bags]``.

    Positions from ``end`` on (the last offset, with ``include_last_offset``)
    belong to no bag: -1, as are positions before the first offset.
    """
    starts = offsets[:num_bags].to(torch.int64)
    positions = torch.arange(n, device=offsets.device, dtype=torch.int64)
    bags = torch.searchsorted(starts, positions, right=True) - 1
    if end is not None and end < n:
        bags = bags.masked_fill(positions >= end, -1)
    return bags


def embedding_bag_backward(
    grad: torch.Tensor,
    indices: torch.Tensor,
    bags: torch.Tensor,
    bag_size: torch.Tensor,
    maximum_indices: torch.Tensor,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    per_sample_weights: torch.Tensor | None,
    padding_idx: int,
) -> torch.Tensor:
    """The weight gradient of ``embedding_bag``, exact (modes 0 sum, 1 mean, 2 max).

    Sum and mean: position i (id ``indices[i]``, in bag ``bags[i]``)
    contributes the term ``grad[bag]``, divided by the bag's size for mean,
    times ``per_sample_weights[i]``, divided by the id's frequency with
    ``scale_grad_by_freq`` (each step rounded as torch rounds it); padding
    positions contribute nothing. Max: each bag's gradient goes to the row
    that gave its maximum, column by column. Every row of the result is the
    correctly rounded sum of its terms.
    """
    ids = indices.reshape(-1)
    if mode != 2 and bool((bags < 0).any()):  # ids after the last offset belong to no bag
        inside = bags >= 0
        ids, bags = ids[inside], bags[inside]
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)[inside]
    if mode == 2:
        num_bags, width = grad.shape
        full = (bag_size > 0).view(-1, 1).expand(num_bags, width)
        cols = torch.arange(width, device=grad.device)
        positions = (maximum_indices.to(torch.int64) * width + cols)[full]
        out = grad.new_zeros(num_weights * width)
        if positions.numel():  # the sums of the terms alone (all -0.0 terms: -0.0), no old value
            targets, inverse = torch.unique(positions, return_inverse=True)
            out[targets] = fold_rows(inverse, grad[full], targets.numel())
        return out.view(num_weights, width)
    terms = grad[bags]
    if mode == 1:
        terms = terms / bag_size[bags].clamp(min=1).to(grad.dtype).view(-1, 1)
    if per_sample_weights is not None:
        terms = terms * per_sample_weights.reshape(-1, 1)
    terms = embedding_terms(terms, ids, num_weights, padding_idx, scale_grad_by_freq)
    return fold_rows(ids, terms, num_weights)


def divide_by_counts(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``sums / counts``, each quotient rounded once to ``sums``' dtype (a mean's one division).

    ``counts`` are integers, broadcast against ``sums``. The quotient is formed
    in float64 (every count below 2^53 is exact there) and rounded to the dtype:
    float64 carries more than twice the precision of float32, float16 and
    bfloat16 plus two bits, so the two roundings give the correctly rounded
    quotient; a count is never rounded to a narrow dtype first (bfloat16 holds
    integers exactly only up to 256).
    """
    if sums.dtype == torch.float64:
        return sums / counts.to(torch.float64)
    return (sums.to(torch.float64) / counts.to(torch.float64)).to(sums.dtype)


def embedding_bag_forward(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    mode: int,
    per_sample_weights: torch.Tensor | None,
    include_last_offset: bool,
    padding_idx: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward of ``embedding_bag`` (modes 0 sum, 1 mean), exact: (bag rows, bag sizes).

    Bags start at ``offsets`` (with ``include_last_offset`` the last offset
    ends the last bag, and ids from it on belong to no bag). Position i of bag
    b contributes the term ``weight[indices[i]]`` times ``per_sample_weights[i]``
    (rounded once to the dtype, as torch rounds the product); ids equal to
    ``padding_idx`` (>= 0) are left out. Each bag row is the correctly rounded
    sum of its terms (an empty bag gives ``+0.0``); for mean it is then divided
    once by the bag's size (:func:`divide_by_counts`): the number of its terms,
    at least 1. The sizes (int64, one a bag) are returned too: the mean's
    divisors, as the backward reads them.
    """
    ids = indices.reshape(-1)
    num_bags = offsets.numel() - 1 if include_last_offset else offsets.numel()
    end = int(offsets[num_bags]) if include_last_offset and offsets.numel() > num_bags else None
    if per_sample_weights is None and padding_idx < 0:
        direct = _bag_sums(weight, ids, offsets, num_bags, end, mode)
        if direct is not None:
            return direct
    bags = bag_of_positions(offsets, num_bags, ids.numel(), end)
    psw = None if per_sample_weights is None else per_sample_weights.reshape(-1)
    inside = bags >= 0
    if padding_idx >= 0:
        inside &= ids != padding_idx
    if not bool(inside.all()):
        ids, bags = ids[inside], bags[inside]
        psw = None if psw is None else psw[inside]
    terms = weight.index_select(0, ids.to(torch.int64))
    if psw is not None:
        terms = terms * psw.view(-1, 1)
    if num_bags == 0:
        sums = weight.new_zeros((0, weight.shape[1]))
    else:
        sums = fold_rows(bags, terms, num_bags)
    sizes = torch.zeros(num_bags, dtype=torch.int64, device=weight.device)
    sizes.index_add_(0, bags, torch.ones_like(bags))
    if mode == 1:
        sums = divide_by_counts(sums, sizes.clamp(min=1).view(-1, 1))
    return sums, sizes


def _bag_sums(
    weight: torch.Tensor,
    ids: torch.Tensor,
    offsets: torch.Tensor,
    num_bags: int,
    end: int | None,
    mode: int,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`embedding_bag_forward` of a plain CPU table of float32 or float64 without weights
    or padding, by the bucket kernel reading the table's rows through the ids (no gathered
    copy, no plan: a bag is a run of positions); None where it is not one.

    Bags are ``[offsets[b], offsets[b + 1])`` (the last to ``end`` or the last id), offsets
    starting at 0 and never decreasing, every id a row of the table (the kernel reads rows
    unchecked: any other input goes the usual way). The sums are the bits of every exact
    route.
    """
    name = _SMALL_DTYPES.get(weight.dtype)
    n = ids.numel()
    if (
        name is None
        or num_bags == 0
        or type(weight) not in (torch.Tensor, torch.nn.Parameter)
        or not weight.is_cpu
        or weight.layout is not torch.strided
        or weight.dim() != 2
        or not _small_ids(ids, ids)
        or not _small_ids(offsets, offsets)
        or weight.shape[0] >= 1 << 31
        or n >= 1 << 31
        or not _host_serves_cpu()
    ):
        return None
    bounds = np.empty(num_bags + 1, np.int32)
    bounds[:num_bags] = offsets.numpy()[:num_bags]
    bounds[num_bags] = n if end is None else min(end, n)
    if bounds[0] != 0 or (np.diff(bounds) < 0).any():
        return None
    if n:
        least, most = torch.aminmax(ids)
        if int(least) < 0 or int(most) >= weight.shape[0]:
            return None
    rows = weight.detach().contiguous().numpy()
    sums = _bucket_sums(name, rows, ids.numpy().astype(np.int32), bounds, None)
    sizes = torch.from_numpy(np.diff(bounds).astype(np.int64))
    if mode == 1:
        sums = divide_by_counts(sums, sizes.clamp(min=1).view(-1, 1))
    return sums, sizes


def max_pool_backward(
    grad: torch.Tensor, input: torch.Tensor, indices: torch.Tensor, spatial: int
) -> torch.Tensor:
    """The input gradient of a max pooling with ``indices`` over ``spatial`` (2 or 3) dims, exact.

    ``indices`` (the shape of ``grad``) holds, for every output element, the
    flat position in its plane (the last ``spatial`` dims of ``input``) of the
    element it took; that element gets the output's gradient. Every element of
    the result (``input``'s shape and dtype) is the correctly rounded sum of
    the gradients sent to it (overlapping windows may send several), ``+0.0``
    where none is.
    """
    size = math.prod(input.shape[-spatial:])
    target = torch.zeros(input.shape, dtype=grad.dtype, device=grad.device)
    if grad.numel() == 0 or size == 0:
        return target
    planes = input.numel() // size
    base = torch.arange(planes, device=indices.device, dtype=torch.int64).view(-1, 1) * size
    positions = indices.reshape(planes, -1).to(torch.int64) + base
    return fold_positions(positions.reshape(-1), grad.reshape(-1), target)


def bincount(input: torch.Tensor, weights: torch.Tensor, minlength: int = 0) -> torch.Tensor:
    """``torch.bincount(input, weights, minlength)``, exact.

    As torch: float32 weights give float32 counts, other floating weights
    float64; every bin is the correctly rounded sum of its weights.
    """
    out_dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
    K = max(int(minlength), int(input.max()) + 1 if input.numel() else 0)
    if K == 0:
        return torch.zeros(0, dtype=out_dtype, device=weights.device)
    return fold_rows(input, weights.reshape(-1).to(out_dtype), K)


__all__ = [
    "FLOATING",
    "NAMES",
    "bag_of_positions",
    "bincount",
    "check_range",
    "divide_by_counts",
    "embedding_backward",
    "embedding_bag_backward",
    "embedding_bag_forward",
    "embedding_terms",
    "fold_positions",
    "fold_rows",
    "index_add",
    "index_put",
    "index_reduce_mean",
    "max_pool_backward",
    "put",
    "scatter_add",
    "scatter_reduce",
    "shape_problem",
    "wrap_negative",
]
