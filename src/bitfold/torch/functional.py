"""Exact functions with torch's signatures: index_add, scatter_add, segment_sum, embeddings.

Each is a drop-in for the torch function of the same name (a changed import
is the whole migration) and computes the same thing, except that every sum
is exact: each output element is the **correctly rounded sum of its old
value (where the function adds into one) and all its terms**, one rounding
in the output's dtype, so the result has the same bits for any order of
the contributions, where torch adds in whatever order its threads or
atomics finish. Each term is computed as torch computes it: ``alpha *
source[i]`` rounded to the dtype, an embedding-bag row times its
per-sample weight, and so on (the docstrings say which).

Every floating argument is differentiable (``torch.library`` custom ops
with autograd and fake implementations: eager, ``torch.compile`` and
``torch.library.opcheck``); the gradients that are folds are exact folds
too. Floating dtypes float16, bfloat16, float32 and float64 are folded
exactly on every device a bitfold backend serves
(:func:`bitfold.torch.devices.folds_on`: CPU and CUDA tensors by the
kernels, MPS, XPU and others by the portable path). Integer and boolean
tensors go to torch's own op, whose integer sums are exact in any order;
complex tensors and devices without data or without a backend are refused
(:class:`bitfold.FoldTypeError`, :class:`bitfold.DeviceError`), as are
shapes torch would refuse
(:class:`bitfold.ShapeError`, naming them). An index outside the tensor
raises :class:`bitfold.IndexRangeError`.
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch.nn import functional as F

from ..errors import FoldError, FoldTypeError, ShapeError
from ..validate import check_has_data, check_K, checked_options, type_label
from .devices import check_device
from .folds import bag_of_positions, divide_by_counts, shape_problem
from .ops import check_tensor, embedding_op, index_add_op, scatter_add_op, segment_sum_op

_EXACT_ALREADY = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
)  # fmt: skip
#: The id dtypes torch's index_add, scatter_add, embedding and embedding_bag take.
INDEX_DTYPES = (torch.int32, torch.int64)


def _check_index(index: Any, what: str = "index") -> None:
    """Refuse an index that is no int32/int64 tensor (as torch), or that lives on a device
    without data (``meta``) or one no bitfold backend folds on, naming ``what`` it is."""
    if not isinstance(index, torch.Tensor):
        raise FoldTypeError(
            f"{what} must be a torch.Tensor of int32 or int64 ids; got a {type_label(index)}"
        )
    if index.dtype not in INDEX_DTYPES:
        raise FoldTypeError(
            f"{what} must hold integers of dtype int32 or int64, as torch takes them; got "
            f"{str(index.dtype).replace('torch.', '')}"
        )
    check_device(index, what)  # meta, or a device no backend serves: a DeviceError


def _check_dim(dim: Any) -> None:
    """Refuse a ``dim`` that is not an integer (torch's dims are ints; negative count back)."""
    if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
        raise FoldTypeError(f"dim must be an integer; got {dim!r} ({type(dim).__name__})")


def _check_real(value: Any, what: str) -> None:
    """Refuse a scalar argument that is not a real number (``alpha``, ``max_norm``, ...)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FoldTypeError(f"{what} must be a real number; got {value!r} ({type(value).__name__})")


def _have_data(**tensors: Any) -> None:
    """Refuse a tensor on a device without data (``meta``) before torch's own integer op."""
    for what, t in tensors.items():
        check_has_data(t, what)


def _check_out(out: Any, like: torch.Tensor, tensors: tuple[torch.Tensor, ...]) -> None:
    """Refuse an ``out=`` tensor torch would refuse for a result like ``like``, before any work:
    another dtype or device, a non-empty tensor of another shape, or inputs that need a gradient
    (``out=`` records none, as in torch)."""
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise FoldTypeError(f"out must be a torch.Tensor or None; got a {type_label(out)}")
    check_has_data(out, "out")
    if out.dtype != like.dtype or out.device != like.device:
        raise FoldTypeError(
            f"out is a {str(out.dtype).replace('torch.', '')} tensor on {out.device}; the result "
            f"is {str(like.dtype).replace('torch.', '')} on {like.device}: pass out of that "
            "dtype and device"
        )
    if out.numel() and tuple(out.shape) != tuple(like.shape):
        raise ShapeError(
            f"out has shape {tuple(out.shape)}; the result has input's shape "
            f"{tuple(like.shape)} (an empty out is resized)"
        )
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        raise FoldError(
            "out= records no gradient (as in torch: 'functions with out=... arguments don't "
            "support automatic differentiation'); call without out=, or under torch.no_grad()"
        )


def _into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    """``result``, written into ``out`` (resized when empty) when one is given."""
    if out is None:
        return result
    if tuple(out.shape) != tuple(result.shape):
        out.resize_(result.shape)
    return out.copy_(result)


def _same_dtype(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype:
        raise FoldTypeError(
            f"input is {str(a.dtype).replace('torch.', '')} and {what} "
            f"{str(b.dtype).replace('torch.', '')}: torch needs one dtype"
        )


def _check_fold(
    call: str,
    input: Any,
    dim: int,
    index: torch.Tensor,
    values: Any,
    name: str,
    out: Any,
) -> None:
    """What ``index_add`` and ``scatter_add`` (``call``) check after the index, in torch's
    order: the tensors, one dtype, the shapes (:func:`bitfold.torch.folds.shape_problem`),
    ``out``."""
    check_tensor(input, "input")
    check_tensor(values, name)
    _same_dtype(input, values, name)
    problem = shape_problem(call, input, dim, index, values)
    if problem:
        raise ShapeError(f"{call}: {problem}")
    _check_out(out, input, (input, values))


@checked_options
def index_add(
    input: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    source: torch.Tensor,
    *,
    alpha: float = 1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.index_add(input, dim, index, source, alpha=alpha, out=out)``, exact.

    ``out.select(dim, k)`` is the correctly rounded sum of ``input.select(dim,
    k)`` and every term ``alpha * source.select(dim, i)`` with ``index[i] ==
    k``, each term rounded to the dtype as ``source * alpha`` computes it (no
    product for ``alpha == 1``). The gradient of ``input`` is the output
    gradient; that of ``source`` is ``alpha * grad.index_select(dim, index)``.
    ``out`` (as in torch: the result's dtype and device, resized when empty)
    receives the result and is returned; it records no gradient.

    >>> import torch, bitfold.torch as bt
    >>> x, tiny = torch.tensor([1.0, 0.0]), 2.0**-24
    >>> bt.index_add(x, 0, torch.tensor([0, 0, 1]), torch.tensor([tiny, tiny, 3.0])).tolist()
    [1.0000001192092896, 3.0]
    """
    _check_index(index)
    _check_dim(dim)
    _check_real(alpha, "alpha")
    if isinstance(input, torch.Tensor) and input.dtype in _EXACT_ALREADY:
        _have_data(input=input, source=source)
        return torch.index_add(input, dim, index, source, alpha=alpha, out=out)
    _check_fold("index_add", input, dim, index, source, "source", out)
    if input.dim() == 0:
        one = index_add_op(input.reshape(1), 0, index.reshape(-1), source.reshape(1), float(alpha))
        return _into(out, one.reshape(()))
    return _into(out, index_add_op(input, dim, index.reshape(-1), source, float(alpha)))


@checked_options
def scatter_add(
    input: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    src: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.scatter_add(input, dim, index, src, out=out)``, exact.

    Every element of the output is the correctly rounded sum of its
    ``input`` value and every ``src`` element that ``index`` sends to it
    (for ``dim == 0``: ``src[i][j]`` goes to ``out[index[i][j]][j]``). An
    index constant along the other dimensions (ids expanded over the
    features, as graph libraries pass them) is folded row by row. The
    gradient of ``input`` is the output gradient; that of ``src`` is
    ``grad.gather(dim, index)`` (torch's, zeros where the index is smaller
    than ``src``). ``out`` as in :func:`index_add`.

    >>> import torch, bitfold.torch as bt
    >>> dst = torch.tensor([1, 0, 1])[:, None].expand(3, 2)
    >>> bt.scatter_add(torch.zeros(2, 2), 0, dst, torch.arange(6.0).view(3, 2)).tolist()
    [[2.0, 3.0], [4.0, 6.0]]
    """
    _check_index(index)
    _check_dim(dim)
    if isinstance(input, torch.Tensor) and input.dtype in _EXACT_ALREADY:
        _have_data(input=input, src=src)
        return torch.scatter_add(input, dim, index, src, out=out)
    _check_fold("scatter_add", input, dim, index, src, "src", out)
    if input.dim() == 0:
        one = scatter_add_op(input.reshape(1), 0, index.reshape(1), src.reshape(1))
        return _into(out, one.reshape(()))
    return _into(out, scatter_add_op(input, dim, index, src))


@checked_options
def segment_sum(values: torch.Tensor, index: torch.Tensor, K: int) -> torch.Tensor:
    """The K sums ``out[k] = sum of values[i] with index[i] == k``, exact, in ``values``' dtype.

    ``values`` have ``index``'s shape followed by any trailing (row) shape;
    the result is ``(K,) + trailing``: what ``torch.zeros(K, *trailing,
    dtype=values.dtype).index_add_(0, index, values)`` computes (or
    ``jax.ops.segment_sum``, or torch_scatter's ``scatter(..., reduce="sum")``),
    with each element the correctly rounded sum of its bucket (an empty
    bucket is ``+0.0``; all ``-0.0`` terms give ``-0.0``). The gradient of
    ``values`` is ``grad[index]``.

    >>> import torch, bitfold.torch as bt
    >>> bt.segment_sum(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 2, 0]), 3).tolist()
    [4.0, 0.0, 2.0]
    """
    _check_index(index)
    K = check_K(K, "K")
    if isinstance(values, torch.Tensor) and values.dtype in _EXACT_ALREADY:
        check_has_data(values, "values")
        out = values.new_zeros((K, *values.shape[index.dim() :]))
        return out.index_add_(0, index.reshape(-1), values.reshape((-1, *out.shape[1:])))
    check_tensor(values, "values")
    if tuple(values.shape[: index.dim()]) != tuple(index.shape):
        raise ShapeError(
            f"values of shape {tuple(values.shape)} do not start with index's shape "
            f"{tuple(index.shape)}: values.shape must be index.shape + trailing"
        )
    rows = values.reshape((index.numel(), *values.shape[index.dim() :]))
    return segment_sum_op(rows, index.reshape(-1), K)


# -- embeddings -----------------------------------------------------------------------------------
def _padding(padding_idx: int | None, num_embeddings: int) -> int:
    """``padding_idx`` as F.embedding reads it: negative ones count from the end; -1 for none."""
    if padding_idx is None:
        return -1
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, numbers.Integral):
        raise FoldTypeError(f"padding_idx must be an integer or None; got {padding_idx!r}")
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ShapeError(
            f"padding_idx {padding_idx} is outside the table of {num_embeddings} rows "
            f"(allowed: {-num_embeddings} .. {num_embeddings - 1})"
        )
    return padding_idx % num_embeddings


def refuse_sparse(sparse: bool, name: str) -> None:
    if sparse:
        raise FoldError(
            f"{name}(sparse=True) is not supported: a sparse gradient sums its duplicate rows "
            "when it is coalesced, outside bitfold; use sparse=False (a dense, exact gradient)"
        )


def _renorm(weight: torch.Tensor, ids: torch.Tensor, max_norm: float, norm_type: float) -> None:
    """F.embedding's ``max_norm``: rows looked up are rescaled in place, outside autograd."""
    _check_real(max_norm, "max_norm")
    _check_real(norm_type, "norm_type")
    with torch.no_grad():
        torch.embedding_renorm_(weight, ids.contiguous(), max_norm, norm_type)


@checked_options
def embedding(
    input: torch.Tensor,
    weight: torch.Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.embedding``, whose weight gradient is the exact fold.

    The lookup ``weight[input]`` is torch's. The gradient of row k of
    ``weight`` is the correctly rounded sum of the output-gradient rows at
    the positions of id k (each first divided by the id's frequency in
    ``input`` with ``scale_grad_by_freq``, rounded once); the
    ``padding_idx`` row gets ``+0.0``. ``max_norm`` renormalises the rows
    looked up in place, as torch does. ``sparse=True`` is refused.

    >>> import torch, bitfold.torch as bt
    >>> w = torch.zeros(3, 2, requires_grad=True)
    >>> bt.embedding(torch.tensor([[0, 2], [2, 2]]), w).sum().backward()
    >>> w.grad.tolist()
    [[1.0, 1.0], [0.0, 0.0], [3.0, 3.0]]
    """
    _check_index(input, "input")
    refuse_sparse(sparse, "embedding")
    if isinstance(weight, torch.Tensor) and weight.dtype in _EXACT_ALREADY:
        _have_data(weight=weight)
        return F.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq)
    check_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ShapeError(f"weight must be a 2-D table (rows, dim); got shape {tuple(weight.shape)}")
    padding = _padding(padding_idx, weight.shape[0])
    if max_norm is not None:
        _renorm(weight, input, max_norm, norm_type)
    return embedding_op(weight, input, padding, bool(scale_grad_by_freq))


BAG_MODES = ("sum", "mean")


def _bags(
    input: torch.Tensor, offsets: torch.Tensor | None, include_last_offset: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(flat ids, the bag of each id, number of bags), as F.embedding_bag reads input/offsets.

    With ``include_last_offset`` the ids from the last offset on belong to no
    bag and are left out (bag -1).
    """
    if input.dim() == 2:
        if offsets is not None:
            raise ShapeError("with a 2-D input (one bag a row), offsets must be None")
        num_bags, length = input.shape
        bags = torch.arange(num_bags, device=input.device).repeat_interleave(length)
        return input.reshape(-1), bags, num_bags
    if input.dim() != 1:
        raise ShapeError(
            f"input must be 1-D (with offsets) or 2-D (a bag a row); got shape {tuple(input.shape)}"
        )
    if offsets is None or offsets.dim() != 1:
        raise ShapeError(
            "a 1-D input needs 1-D offsets (where each bag starts); got "
            f"{None if offsets is None else tuple(offsets.shape)}"
        )
    _check_index(offsets, "offsets")
    num_bags = offsets.numel() - 1 if include_last_offset else offsets.numel()
    if num_bags < 0:
        raise ShapeError("include_last_offset=True needs at least one offset")
    end = None
    if not torch.compiler.is_compiling() and offsets.numel():
        first = int(offsets[0])
        if first != 0:
            raise ShapeError(f"offsets[0] must be 0 (the first bag starts the input); got {first}")
        if bool((offsets[1:] < offsets[:-1]).any()):
            raise ShapeError("offsets must not decrease")
        last = int(offsets[-1])
        if last > input.numel():
            raise ShapeError(f"offsets run past the input: {last} > {input.numel()} ids")
        end = last if include_last_offset else None
    return input, bag_of_positions(offsets, num_bags, input.numel(), end), num_bags


@checked_options
def embedding_bag(
    input: torch.Tensor,
    weight: torch.Tensor,
    offsets: torch.Tensor | None = None,
    max_norm: float | None = None,
    norm_type: float = 2,
    scale_grad_by_freq: bool = False,
    mode: str = "mean",
    sparse: bool = False,
    per_sample_weights: torch.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
) -> torch.Tensor:
    """``torch.nn.functional.embedding_bag`` (modes "sum" and "mean"), exact forward and gradient.

    Bags come from a 2-D ``input`` (a bag a row) or a 1-D ``input`` with
    ``offsets`` (where each bag starts; ``include_last_offset`` as torch).
    Each bag's output is the correctly rounded sum of its rows
    ``weight[id]``, each first multiplied by its ``per_sample_weights``
    entry (mode "sum"; rounded once); for "mean" that sum is divided once by
    the number of ids in the bag. Ids equal to ``padding_idx`` are left out
    (of the count too); an empty bag gives zeros. The weight gradient is the
    exact fold: row k gets the correctly rounded sum of the terms
    ``grad[bag]`` (divided by the bag's size for "mean", times the
    per-sample weight, divided by the id's frequency with
    ``scale_grad_by_freq``) of its positions. ``per_sample_weights`` are
    differentiable too.

    Unlike torch's, the forward gathers the ``(N, dim)`` rows before summing
    them. Mode "max" and ``sparse=True`` are refused (under
    :func:`bitfold.torch.exact_mode`, ``nn.EmbeddingBag(mode="max")``'s
    gradient is exact).

    >>> import torch, bitfold.torch as bt
    >>> w = torch.tensor([[1.0], [2.0**-24], [2.0**-24]], requires_grad=True)
    >>> out = bt.embedding_bag(torch.tensor([0, 1, 2, 1]), w, torch.tensor([0, 3]), mode="sum")
    >>> out.tolist()  # 1 + 2^-24 + 2^-24 rounds once
    [[1.0000001192092896], [5.960464477539063e-08]]
    """
    _check_index(input, "input")
    refuse_sparse(sparse, "embedding_bag")
    if mode not in BAG_MODES:
        raise FoldError(
            f"embedding_bag mode {mode!r} is not supported: bitfold.torch.embedding_bag sums "
            "(modes 'sum' and 'mean'); for 'max' use torch's under bitfold.torch.exact_mode()"
        )
    check_tensor(weight, "weight")
    if weight.dim() != 2:
        raise ShapeError(f"weight must be a 2-D table (rows, dim); got shape {tuple(weight.shape)}")
    ids, bags, num_bags = _bags(input, offsets, include_last_offset)
    if per_sample_weights is not None:
        if mode != "sum":
            raise FoldError(f"per_sample_weights need mode='sum' (as in torch); got mode={mode!r}")
        check_tensor(per_sample_weights, "per_sample_weights")
        _same_dtype(weight, per_sample_weights, "per_sample_weights")
        if tuple(per_sample_weights.shape) != tuple(input.shape):
            raise ShapeError(
                f"per_sample_weights of shape {tuple(per_sample_weights.shape)} must have "
                f"input's shape {tuple(input.shape)}"
            )
    padding = _padding(padding_idx, weight.shape[0])
    if max_norm is not None:
        _renorm(weight, ids, max_norm, norm_type)
    psw = None if per_sample_weights is None else per_sample_weights.reshape(-1)
    if not torch.compiler.is_compiling():
        inside = bags >= 0  # ids after the last offset, and padding ids, are left out
        if padding >= 0:
            inside &= ids != padding
        if not bool(inside.all()):
            ids, bags = ids[inside], bags[inside]
            psw = None if psw is None else psw[inside]
    rows = embedding_op(weight, ids, padding, bool(scale_grad_by_freq))
    if padding >= 0:  # compiled, where no id can be dropped: a padding id adds +0.0 rows
        rows = rows.masked_fill((ids == padding).view(-1, 1), 0)
    if psw is not None:
        rows = rows * psw.view(-1, 1)
    sums = segment_sum_op(rows, bags, num_bags) if num_bags else rows.new_zeros((0, rows.shape[1]))
    if mode == "sum":
        return sums
    kept = torch.ones_like(ids) if padding < 0 else (ids != padding).to(ids.dtype)
    counts = torch.zeros(num_bags, dtype=ids.dtype, device=ids.device).index_add_(0, bags, kept)
    return divide_by_counts(sums, counts.clamp(min=1).view(-1, 1))


__all__ = ["embedding", "embedding_bag", "index_add", "scatter_add", "segment_sum"]
