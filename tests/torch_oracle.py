"""The oracle of bitfold.torch's folds: every output element's terms, summed exactly, rounded once.

Each function here takes the arguments of the torch op it stands for and
returns what the contract of :mod:`bitfold.torch.folds` says the exact op
returns, computed without bitfold: the terms of every output element are
gathered from the op's definition, each term computed as torch computes it
(one rounding in the dtype: ``alpha * source[i]``, a bag's gradient row divided
by its size, times its per-sample weight, divided by its id's frequency), and
the exact (``fractions.Fraction``) sum of the element's old value, where the op
adds into one, and its terms is rounded once (:func:`oracle.bucket_oracle`). A
mean is that correctly rounded sum divided once by the count: the quotient,
exact as a fraction, rounded once.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from oracle import bucket_oracle, round_fraction

NAME = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32",
        torch.float64: "float64"}  # fmt: skip


def positions_of(t):
    """The flat position of every element of ``t``, in ``t``'s shape."""
    return torch.arange(t.numel()).view(t.shape)


def _tensor(values, like):
    # exact: every value is one of the format's (or ±inf, NaN)
    return torch.tensor(values, dtype=torch.float64).to(like.dtype).view(like.shape)


def _elementwise(op, a, b, dtype):
    """``op`` of each pair of elements of ``a`` and ``b`` (broadcast), exact, rounded once."""
    a, b = torch.broadcast_tensors(torch.as_tensor(a).double(), torch.as_tensor(b).double())
    out = []
    for x, y in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist(), strict=True):
        exact = op(Fraction(x), Fraction(y)) if math.isfinite(x) and math.isfinite(y) else None
        if exact is None or exact == 0:
            out.append(op(x, y))  # infinities, NaN and zeros (with IEEE's sign): float64's
        else:
            out.append(round_fraction(exact, NAME[dtype]))
    return _tensor(out, torch.empty(a.shape, dtype=dtype))


def times(t, factor):
    """Each element of ``t`` times ``factor`` (a number or a broadcast tensor), rounded once."""
    return _elementwise(lambda x, y: x * y, t, factor, t.dtype)


def divided(t, count):
    """Each element of ``t`` divided by ``count`` (a number or a broadcast tensor), rounded once."""
    return _elementwise(lambda x, y: x / y, t, count, t.dtype)


def fold_into(target, positions, terms, *, start="self", mean=False):
    """``target`` with each element that ``positions`` names made the exact sum of its terms.

    ``positions`` (flat positions into ``target``) and ``terms`` have one shape.
    ``start`` says what each named element's sum begins with: ``"self"`` its
    value in ``target`` (the op adds into it), ``"zero"`` +0.0 (the op first sets
    it to the sum's identity), ``None`` nothing (a new tensor of sums: an empty
    one is +0.0, all ``-0.0`` terms give ``-0.0``). ``mean=True`` divides each
    named element's sum by the number of its terms (and of its value, with
    ``"self"``). Elements no position names keep their value.
    """
    name = NAME[target.dtype]
    old = target.detach().double().reshape(-1).tolist()
    buckets: dict[int, list[float]] = {}
    for p, t in zip(positions.reshape(-1).tolist(), terms.detach().double().reshape(-1).tolist(),
                    strict=True):  # fmt: skip
        buckets.setdefault(p, []).append(t)
    out = list(old) if start is not None else [0.0] * len(old)
    for p, ts in buckets.items():
        first = {"self": [old[p]], "zero": [0.0], None: []}[start]
        total = bucket_oracle(first + ts, name)
        if mean:
            count = len(ts) + (start == "self")
            total = total / count if not math.isfinite(total) else (
                round_fraction(Fraction(total) / count, name))  # fmt: skip
        out[p] = total
    return _tensor(out, target)


# -- forward ops (the names and arguments of torch's) -----------------------------------------
def _cropped(src, index):
    return src[tuple(slice(0, s) for s in index.shape)]


def scatter_add(input, dim, index, src):
    """``input.scatter_add(dim, index, src)``: ``src[p]`` into ``p`` with ``p[dim] = index[p]``."""
    return fold_into(input, positions_of(input).gather(dim, index), _cropped(src, index))


def scatter(input, dim, index, src, *, reduce):
    """``input.scatter(dim, index, src, reduce="add")``; ``src`` a tensor or a number."""
    assert reduce == "add", reduce
    if not isinstance(src, torch.Tensor):
        src = torch.full(index.shape, src, dtype=input.dtype)
    return scatter_add(input, dim, index, src)


def scatter_reduce(input, dim, index, src, reduce, *, include_self=True):
    """``input.scatter_reduce(...)``, "sum" or "mean"; without ``include_self`` the elements
    ``index`` names start from +0.0 (torch fills them with the identity)."""
    assert reduce in ("sum", "mean"), reduce
    return fold_into(input, positions_of(input).gather(dim, index), _cropped(src, index),
                     start="self" if include_self else "zero", mean=reduce == "mean")  # fmt: skip


def index_add(input, dim, index, source, *, alpha=1):
    """``input.index_add(dim, index, source, alpha=alpha)``: the terms ``alpha * source`` each
    rounded to the dtype (``source`` itself when ``alpha == 1``)."""
    terms = source if alpha == 1 else times(source, alpha)
    return fold_into(input, positions_of(input).index_select(dim, index), terms)


def index_reduce(input, dim, index, source, reduce, *, include_self=True):
    """``input.index_reduce(dim, index, source, "mean", include_self=...)``."""
    assert reduce == "mean", reduce
    return fold_into(input, positions_of(input).index_select(dim, index), source,
                     start="self" if include_self else "zero", mean=True)  # fmt: skip


def index_put(input, indices, values, accumulate=False):
    """``input.index_put(indices, values, accumulate=True)``: each value into the element its
    indices name (torch's indexing of the positions; negative ids count from the end)."""
    assert accumulate
    where = positions_of(input)[tuple(indices)]
    return fold_into(input, where, values.broadcast_to(where.shape))


def put(input, index, source, accumulate=False):
    """``input.put(index, source, accumulate=True)``: flat positions, negative ones wrap."""
    assert accumulate
    return fold_into(input, index % input.numel(), source)


def bincount(input, weights, minlength=0):
    """``torch.bincount(input, weights, minlength)``: float32 bins for float32 weights, else
    float64; a new tensor of sums."""
    dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
    K = max(int(minlength), int(input.max()) + 1 if input.numel() else 0)
    return fold_into(torch.zeros(K, dtype=dtype), input, weights, start=None)


# -- embeddings ---------------------------------------------------------------------------------
def _row_positions(ids, width):
    return ids.reshape(-1, 1) * width + torch.arange(width)


def embedding_weight_grad(grad, input, num_weights, padding_idx=None, scale_grad_by_freq=False):
    """The weight gradient of ``F.embedding(input, weight, padding_idx, ...)`` for the output
    gradient ``grad``: row k the sum of the gradient rows of id k's positions (each divided by
    the id's frequency in ``input`` with ``scale_grad_by_freq``); the padding row +0.0."""
    ids = input.reshape(-1)
    rows = grad.reshape(ids.numel(), -1)
    if scale_grad_by_freq:
        rows = divided(rows, torch.bincount(ids, minlength=num_weights)[ids].view(-1, 1))
    keep = ids != (-1 if padding_idx is None else padding_idx % num_weights)
    target = torch.zeros(num_weights, rows.shape[1], dtype=grad.dtype)
    return fold_into(target, _row_positions(ids[keep], rows.shape[1]), rows[keep], start=None)


def bag_members(input, offsets=None, include_last_offset=False, padding_idx=None, num_weights=0):
    """``(position, id, bag)`` of every id that belongs to a bag, and the number of bags, as
    ``F.embedding_bag`` reads ``input`` and ``offsets``: ids after the last offset (with
    ``include_last_offset``) and ids equal to ``padding_idx`` belong to none."""
    ids = input.reshape(-1).tolist()
    if input.dim() == 2:
        width = input.shape[1]
        bounds = [(b * width, (b + 1) * width) for b in range(input.shape[0])]
    else:
        starts = offsets.tolist()
        ends = starts[1:] if include_last_offset else [*starts[1:], len(ids)]
        bounds = list(zip(starts, ends, strict=False))
    padding = None if padding_idx is None else padding_idx % num_weights
    members = [(p, ids[p], b) for b, (lo, hi) in enumerate(bounds) for p in range(lo, hi)
               if ids[p] != padding]  # fmt: skip
    return members, len(bounds)


def _bag_sizes(members, num_bags):
    sizes = torch.zeros(num_bags, dtype=torch.int64)
    for _, _, b in members:
        sizes[b] += 1
    return sizes


def embedding_bag(input, weight, offsets=None, *, mode="mean", per_sample_weights=None,
                  include_last_offset=False, padding_idx=None):  # fmt: skip
    """``F.embedding_bag``'s output, modes "sum" and "mean": each bag the sum of its rows (each
    times its per-sample weight, rounded once), for "mean" divided by its number of ids."""
    members, num_bags = bag_members(input, offsets, include_last_offset, padding_idx,
                                    weight.shape[0])  # fmt: skip
    width = weight.shape[1]
    positions = torch.tensor([p for p, _, _ in members], dtype=torch.int64)
    ids = torch.tensor([k for _, k, _ in members], dtype=torch.int64)
    bags = torch.tensor([b for _, _, b in members], dtype=torch.int64)
    rows = weight.detach()[ids]
    if per_sample_weights is not None:
        rows = times(rows, per_sample_weights.detach().reshape(-1)[positions].view(-1, 1))
    target = torch.zeros(num_bags, width, dtype=weight.dtype)
    sums = fold_into(target, _row_positions(bags, width), rows, start=None)
    if mode == "sum":
        return sums
    assert mode == "mean", mode
    return divided(sums, _bag_sizes(members, num_bags).clamp(min=1).view(-1, 1))


def embedding_bag_weight_grad(grad, input, weight, offsets=None, *, mode="mean",
                              per_sample_weights=None, include_last_offset=False,
                              padding_idx=None, scale_grad_by_freq=False):  # fmt: skip
    """The weight gradient of ``F.embedding_bag(input, weight, offsets, ...)`` for the output
    gradient ``grad`` (bags x dim).

    Sum and mean: the id at position i of bag b gets the term ``grad[b]``,
    divided by the bag's number of ids for "mean", times ``per_sample_weights[i]``,
    divided by the id's number of positions in the bags with
    ``scale_grad_by_freq``, each step rounded once. Max: column c of bag b
    goes to the first id of the bag holding the column's largest weight (the
    one torch's forward picks). Row k is the sum of its terms.
    """
    num_weights, width = weight.shape
    members, num_bags = bag_members(input, offsets, include_last_offset, padding_idx, num_weights)
    target = torch.zeros(num_weights, width, dtype=grad.dtype)
    if mode == "max":
        positions, terms = [], []
        for b in range(num_bags):
            ids = [k for _, k, bag in members if bag == b]
            for c in range(width):
                if ids:
                    column = [float(weight[k, c]) for k in ids]
                    positions.append(ids[column.index(max(column))] * width + c)
                    terms.append(float(grad[b, c]))
        return fold_into(target, torch.tensor(positions, dtype=torch.int64),
                         torch.tensor(terms, dtype=torch.float64), start=None)  # fmt: skip
    positions = torch.tensor([p for p, _, _ in members], dtype=torch.int64)
    ids = torch.tensor([k for _, k, _ in members], dtype=torch.int64)
    bags = torch.tensor([b for _, _, b in members], dtype=torch.int64)
    terms = grad.detach()[bags]
    if mode == "mean":
        terms = divided(terms, _bag_sizes(members, num_bags).clamp(min=1)[bags].view(-1, 1))
    if per_sample_weights is not None:
        terms = times(terms, per_sample_weights.detach().reshape(-1)[positions].view(-1, 1))
    if scale_grad_by_freq:
        terms = divided(terms, torch.bincount(ids, minlength=num_weights)[ids].view(-1, 1))
    return fold_into(target, _row_positions(ids, width), terms, start=None)
