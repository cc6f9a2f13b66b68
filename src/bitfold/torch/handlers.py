"""The exact handlers of the torch fold rules: bound ATen arguments -> exact result, or verdict.

A handler takes an ATen op's arguments by schema name (:func:`bind`) and
returns either the exact result (every element the correctly rounded sum of
its old value, where the op adds into one, and all its terms: one rounding,
the same bits for any order, :mod:`bitfold.torch.folds`) or a :class:`Leave`
verdict: run ATen's own op, with a ``reason`` when the fold stays inexact
(complex, a product, a sparse gradient; recorded in ``passed``) and none when
leaving it loses nothing (integer sums, maxima, a write without accumulate,
or a call ATen refuses with its own error).

The kinds that :func:`bitfold.torch.compile` rewrites split the handler in
two: a *verdict* (``*_verdict``) decided from dtypes, devices, layouts and
flags alone, so that it also reads the fake tensors of a traced graph, and
the computation. Index ranges are checked by :func:`bitfold.torch.folds.check_range`
inside the folds (:class:`bitfold.IndexRangeError`, naming the id and the
size), the same check every drop-in makes.

The table that maps ATen ops to these handlers is :mod:`bitfold.torch.rules`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor

from . import folds, histograms, segment, sparse
from .devices import folds_on
from .folds import FLOATING

aten = torch.ops.aten
INTEGER = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
)  # fmt: skip
PLAIN = (torch.Tensor, torch.nn.Parameter)


class Leave:
    """A verdict: run ATen's op; ``reason`` (when set) is why a fold stays inexact."""

    __slots__ = ("reason",)

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason


UNTOUCHED = Leave()


def bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    for i, (name, kwarg_only, has_default, default) in enumerate(_arguments(func)):
        if i < len(args) and not kwarg_only:
            bound[name] = args[i]
        elif name in kwargs:
            bound[name] = kwargs[name]
        elif has_default:
            bound[name] = list(default) if isinstance(default, list) else default
    return bound


#: an op's schema arguments as (name, kwarg_only, has a default, the default), by op: reading
#: a schema makes new Python objects for every argument (about 5 us an op call)
_ARGUMENTS: dict[Any, tuple[tuple[str, bool, bool, Any], ...]] = {}
_WRITTEN: dict[Any, tuple[str, ...]] = {}


def _arguments(func: Any) -> tuple[tuple[str, bool, bool, Any], ...]:
    try:
        return _ARGUMENTS[func]
    except KeyError:
        pass
    except TypeError:  # an unhashable callable: read each time
        return _read_arguments(func)
    found = _ARGUMENTS[func] = _read_arguments(func)
    return found


def _read_arguments(func: Any) -> tuple[tuple[str, bool, bool, Any], ...]:
    return tuple(
        (str(arg.name), bool(arg.kwarg_only), arg.has_default_value(),
         arg.default_value if arg.has_default_value() else None)
        for arg in func._schema.arguments
    )  # fmt: skip


def plain_index(t: Any) -> Any:
    """An integer tensor subclass that wraps one plain tensor of its shape (torch_geometric's
    ``Index`` and ``EdgeIndex``, through the ``__tensor_flatten__`` protocol), as that tensor;
    anything else as it is. Ids are integers: the wrapper changes no sum.
    """
    if type(t) is torch.Tensor:
        return t
    if isinstance(t, list | tuple):
        return type(t)(plain_index(x) for x in t)
    if not isinstance(t, torch.Tensor) or type(t) in PLAIN or t.dtype not in INTEGER:
        return t
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None:
        return t
    names, _ = flatten()
    inner = getattr(t, names[0], None) if len(names) == 1 else None
    if (
        type(inner) in PLAIN
        and inner.dtype == t.dtype
        and inner.shape == t.shape
        and inner.device == t.device
    ):
        return inner
    return t


def written(func: Any) -> tuple[str, ...]:
    """The arguments an in-place or ``out=`` overload writes (``self``; ``out``; ``hist`` and
    ``bin_edges``, ...), in the order of its results; empty for a functional overload."""
    try:
        return _WRITTEN[func]
    except (KeyError, TypeError):
        pass
    names = tuple(
        str(arg.name)
        for arg in func._schema.arguments
        if arg.alias_info is not None and arg.alias_info.is_write
    )
    try:
        _WRITTEN[func] = names
    except TypeError:  # an unhashable callable
        pass
    return names


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` for ``torch.float32``."""
    return str(dtype).replace("torch.", "")


def check_fold(target: torch.Tensor, *tensors: Any) -> Leave | None:
    """None when the fold into ``target`` can be made exact; else the verdict to leave it."""
    if target.dtype in INTEGER:
        return UNTOUCHED  # integer sums are exact in any order
    if target.dtype not in FLOATING:
        return Leave(f"{dtype_name(target.dtype)}: bitfold folds float16 .. float64 only")
    served = target.device  # asked of the registry once a device
    for t in (target, *tensors):
        if isinstance(t, torch.Tensor) and (
            not (type(t) in PLAIN or isinstance(t, FakeTensor))
            or t.layout != torch.strided
            or ((t is target or t.device != served) and not folds_on(t.device))
        ):
            return Leave(
                f"a {type(t).__name__} on {t.device} ({t.layout}): bitfold folds plain dense "
                "tensors on the devices its backends serve"
            )
    return None


def same_dtype(target: torch.Tensor, values: torch.Tensor) -> bool:
    """True when ``values`` is a tensor of ``target``'s dtype."""
    return isinstance(values, torch.Tensor) and values.dtype == target.dtype


# -- one handler per kind of op: the exact result, or a verdict to leave it to ATen ---------------
Handler = Callable[[dict[str, Any]], Any]


def scatter_add_verdict(a: dict[str, Any]) -> Leave | None:
    x, src = a["self"], a["src"]
    leave = check_fold(x, a["index"], src)
    if leave is None and not same_dtype(x, src):
        return UNTOUCHED  # ATen raises its own error
    return leave


def scatter_add(a: dict[str, Any]) -> torch.Tensor | Leave:
    x, dim, index, src = a["self"], a["dim"], a["index"], a["src"]
    leave = scatter_add_verdict(a)
    if leave is not None:
        return leave
    if folds.shape_problem("scatter_add", x, dim, index, src):
        return UNTOUCHED  # ATen raises its own error
    return folds.scatter_add(x, dim, index, src)


def scatter_verdict(a: dict[str, Any]) -> Leave | None:
    reduce = a.get("reduce")
    if reduce is None:
        return UNTOUCHED  # a plain scatter writes, it does not sum
    leave = check_fold(a["self"], a["index"])
    if leave is None and reduce != "add":
        return Leave(f"reduce={reduce!r}: a product, not a sum")
    return leave


def scatter(a: dict[str, Any]) -> torch.Tensor | Leave:
    leave = scatter_verdict(a)
    if leave is not None:
        return leave
    x, index, src = a["self"], a["index"], a.get("src")
    if src is None:
        src = torch.full(index.shape, a["value"], dtype=x.dtype, device=x.device)
    return scatter_add({"self": x, "dim": a["dim"], "index": index, "src": src})


def _reduce_verdict(reduce: str, sums: tuple[str, ...]) -> Leave | None:
    if reduce in ("amax", "amin"):
        return UNTOUCHED  # a maximum is exact in any order
    if reduce not in sums:
        return Leave(f"reduce={reduce!r}: a product, not a sum")
    return None


def scatter_reduce_verdict(a: dict[str, Any]) -> Leave | None:
    x, src = a["self"], a["src"]
    leave = check_fold(x, a["index"], src) or _reduce_verdict(a["reduce"], ("sum", "mean"))
    if leave is None and not same_dtype(x, src):
        return UNTOUCHED
    return leave


def scatter_reduce(a: dict[str, Any]) -> torch.Tensor | Leave:
    x, dim, index, src, reduce = a["self"], a["dim"], a["index"], a["src"], a["reduce"]
    leave = scatter_reduce_verdict(a)
    if leave is not None:
        return leave
    if folds.shape_problem("scatter_add", x, dim, index, src):
        return UNTOUCHED
    return folds.scatter_reduce(x, dim, index, src, reduce, bool(a["include_self"]))


def index_add_verdict(a: dict[str, Any]) -> Leave | None:
    x, source = a["self"], a["source"]
    leave = check_fold(x, a["index"], source)
    if leave is None and (not isinstance(a["dim"], int) or not same_dtype(x, source)):
        return UNTOUCHED
    return leave


def _index_fold(a: dict[str, Any], verdict: Callable[..., Leave | None],
                compute: Callable[..., torch.Tensor]) -> torch.Tensor | Leave:  # fmt: skip
    """An ``index_*`` fold: ``verdict``, then torch's shape rules, then ``compute(x, dim,
    flat index, source)``."""
    x, dim, index, source = a["self"], a["dim"], a["index"], a["source"]
    leave = verdict(a)
    if leave is not None:
        return leave
    if folds.shape_problem("index_add", x, dim, index, source):
        return UNTOUCHED
    return compute(x, dim, index.reshape(-1), source)


def index_add(a: dict[str, Any]) -> torch.Tensor | Leave:
    alpha = a.get("alpha", 1)
    return _index_fold(a, index_add_verdict, lambda *xdis: folds.index_add(*xdis, alpha))


def index_reduce_verdict(a: dict[str, Any]) -> Leave | None:
    x, source = a["self"], a["source"]
    leave = check_fold(x, a["index"], source) or _reduce_verdict(a["reduce"], ("mean",))
    if leave is None and not same_dtype(x, source):
        return UNTOUCHED
    return leave


def index_reduce(a: dict[str, Any]) -> torch.Tensor | Leave:
    include_self = bool(a["include_self"])
    return _index_fold(a, index_reduce_verdict,
                       lambda *xdis: folds.index_reduce_mean(*xdis, include_self))  # fmt: skip


def index_put_verdict(a: dict[str, Any]) -> Leave | None:
    if not a.get("accumulate", False):
        return UNTOUCHED  # a write, not a sum
    x, values = a["self"], a["values"]
    leave = check_fold(x, values, *[i for i in a["indices"] if i is not None])
    if leave is None and not same_dtype(x, values):
        return UNTOUCHED
    return leave


def index_put(a: dict[str, Any]) -> torch.Tensor | Leave:
    return index_put_verdict(a) or folds.index_put(a["self"], a["indices"], a["values"])


# -- lanes: the commonest small CPU folds, taken before any argument is bound ------------------
def _index_add_lane(args: tuple[Any, ...], kwargs: dict[str, Any],
                    in_place: bool = False) -> torch.Tensor | None:  # fmt: skip
    if kwargs or len(args) != 4 or args[1] != 0 or type(args[0]) is not torch.Tensor:
        return None
    x, _, index, source = args
    if source.dtype != x.dtype:
        return None
    return folds.small_index_add(x, index, source, in_place)


def _index_put_lane(args: tuple[Any, ...], kwargs: dict[str, Any],
                    in_place: bool = False) -> torch.Tensor | None:  # fmt: skip
    if kwargs or len(args) < 4 or args[3] is not True or type(args[0]) is not torch.Tensor:
        return None
    x, indices, values = args[:3]
    return folds.small_index_put(x, indices, values, in_place) if values.dtype == x.dtype else None


def _index_add_lane_(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    return _index_add_lane(args, kwargs, in_place=True)


def _index_put_lane_(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    return _index_put_lane(args, kwargs, in_place=True)


def _embedding_lane(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    if kwargs or len(args) != 5 or args[4] or args[3] >= 0:  # scaled by frequency, or padded
        return None
    return folds.small_embedding_backward(args[0], args[1], args[2])


#: ATen overload -> a lane: its exact result for plain CPU tensors of a small fold (the host
#: backend's direct way, :func:`bitfold.torch.folds.small_index_add` ...), or None, and the
#: op's rule then runs as for any other call. A lane sees the arguments as the op got them:
#: it takes only plain tensors and the usual flags, and the result is the rule's, bit for
#: bit. In a model, binding the arguments and the checks of every layer cost about as much
#: as the fold itself (a Mixtral-style step with eager experts: about 20 us of 60 a fold).
LANES: dict[Any, Callable[[tuple[Any, ...], dict[str, Any]], torch.Tensor | None]] = {
    aten.index_add_.default: _index_add_lane_,
    aten.index_add.default: _index_add_lane,
    aten.index_put_.default: _index_put_lane_,
    aten.index_put.default: _index_put_lane,
    aten._index_put_impl_.default: _index_put_lane_,
    aten.embedding_dense_backward.default: _embedding_lane,
}


def masked_index_put_verdict(a: dict[str, Any]) -> Leave | None:
    x, values = a["self"], a["values"]
    leave = check_fold(x, values, a["mask"], *[i for i in a["indices"] if i is not None])
    if leave is None and values.dtype not in FLOATING:
        return UNTOUCHED
    return leave


def masked_index_put(a: dict[str, Any]) -> torch.Tensor | Leave:
    """``_unsafe_masked_index_put_accumulate`` (the embedding backward's decomposition), exact.

    As ATen's decomposition: ids where ``mask`` is False add ``+0.0`` (and are
    clamped into the table, never out of range). ``values`` may be wider than
    ``self`` (float32 terms of a float16 table, as inductor computes them):
    each element is then rounded once, from the exact sum, to ``self``'s dtype.
    """
    leave = masked_index_put_verdict(a)
    if leave is not None:
        return leave
    x, mask, values = a["self"], a["mask"], a["values"]
    indices = [
        None if ix is None else ix.clamp(min=-x.shape[d], max=x.shape[d] - 1)
        for d, ix in enumerate(a["indices"])
    ]
    return folds.index_put(x, indices, values.masked_fill(~mask, 0))


def put_verdict(a: dict[str, Any]) -> Leave | None:
    if not a.get("accumulate", False):
        return UNTOUCHED
    x, source = a["self"], a["source"]
    leave = check_fold(x, a["index"], source)
    if leave is None and not same_dtype(x, source):
        return UNTOUCHED
    return leave


def put(a: dict[str, Any]) -> torch.Tensor | Leave:
    x, index, source = a["self"], a["index"], a["source"]
    leave = put_verdict(a)
    if leave is not None:
        return leave
    if index.numel() != source.numel():
        return UNTOUCHED
    return folds.put(x, index, source)


def embedding_dense_backward_verdict(a: dict[str, Any]) -> Leave | None:
    return check_fold(a["grad_output"], a["indices"])


def embedding_dense_backward(a: dict[str, Any]) -> torch.Tensor | Leave:
    return embedding_dense_backward_verdict(a) or folds.embedding_backward(
        a["grad_output"], a["indices"], int(a["num_weights"]), int(a["padding_idx"]),
        bool(a["scale_grad_by_freq"]),
    )  # fmt: skip


def embedding_bag_backward_verdict(a: dict[str, Any]) -> Leave | None:
    if a.get("sparse", False):
        return Leave("a sparse gradient: its duplicates are summed when coalesced")
    return check_fold(
        a["grad"], a["indices"], a.get("per_sample_weights"), a["bag_size"], a["maximum_indices"]
    )


def embedding_bag_backward(a: dict[str, Any]) -> torch.Tensor | Leave:
    leave = embedding_bag_backward_verdict(a)
    if leave is not None:
        return leave
    grad, indices, psw = a["grad"], a["indices"], a.get("per_sample_weights")
    mode = int(a["mode"])
    n = indices.numel()
    if "offsets" in a:
        offsets, num_bags = a["offsets"], grad.shape[0]
        end = int(offsets[num_bags]) if offsets.numel() > num_bags else None
        bags = folds.bag_of_positions(offsets, num_bags, n, end)
    elif a["offset2bag"].numel() == n:
        bags = a["offset2bag"]
    else:
        return Leave("_embedding_bag_dense_backward without offset2bag")
    return folds.embedding_bag_backward(
        grad, indices, bags, a["bag_size"], a["maximum_indices"], int(a["num_weights"]),
        bool(a["scale_grad_by_freq"]), mode, psw, int(a.get("padding_idx", -1)),
    )  # fmt: skip


def embedding_bag_verdict(a: dict[str, Any]) -> Leave | None:
    if int(a["mode"]) == 2:
        return UNTOUCHED  # a bag's maximum is exact in any order
    weight, psw = a["weight"], a.get("per_sample_weights")
    leave = check_fold(weight, a["indices"], a["offsets"], psw)
    if leave is None and (weight.dim() != 2 or (psw is not None and not same_dtype(weight, psw))):
        return UNTOUCHED  # ATen raises its own error
    return leave


def _embedding_bag_forward(op: Any) -> Handler:
    """The exact handler of ``op`` (``_embedding_bag`` or ``_embedding_bag_forward_only``).

    The bag rows are :func:`bitfold.torch.folds.embedding_bag_forward`'s.
    ``offset2bag`` and ``max_indices`` are ATen's, from the same op run on the
    table's first column (it checks the arguments as torch does); for mode
    mean, ``bag_size`` holds the divisors the exact rows were divided by, so
    that the backward divides each bag's gradient by the same count.
    """

    def handler(a: dict[str, Any]) -> tuple[torch.Tensor, ...] | Leave:
        leave = embedding_bag_verdict(a)
        if leave is not None:
            return leave
        weight, mode = a["weight"], int(a["mode"])
        first = weight if weight.shape[1] <= 1 else weight[:, :1]
        aten_args = {**a, "weight": first}
        _, offset2bag, bag_size, max_indices = op(*(aten_args[arg.name] for arg in
                                                    op._schema.arguments))  # fmt: skip
        psw = a.get("per_sample_weights")
        rows, sizes = folds.embedding_bag_forward(
            weight, a["indices"], a["offsets"], mode, psw, bool(a["include_last_offset"]),
            int(a.get("padding_idx", -1)),
        )  # fmt: skip
        if mode == 1 and sizes.shape == bag_size.shape:
            bag_size = sizes.to(bag_size.dtype)
        return rows, offset2bag, bag_size, max_indices

    return handler


embedding_bag = _embedding_bag_forward(aten._embedding_bag.default)
embedding_bag_forward_only = _embedding_bag_forward(aten._embedding_bag_forward_only.default)


def bincount_verdict(a: dict[str, Any]) -> Leave | None:
    x, weights = a["self"], a.get("weights")
    if weights is None:
        return UNTOUCHED  # integer counts
    leave = check_fold(weights, x)
    if leave is None and (x.dim() != 1 or x.dtype not in INTEGER or weights.shape != x.shape):
        return UNTOUCHED  # ATen raises its own error
    return leave


def bincount(a: dict[str, Any]) -> torch.Tensor | Leave:
    x, weights = a["self"], a.get("weights")
    leave = bincount_verdict(a)
    if leave is not None:
        return leave
    if x.numel() and int(x.min()) < 0:
        return UNTOUCHED
    return folds.bincount(x, weights, int(a.get("minlength", 0)))


def max_pool_backward_verdict(a: dict[str, Any]) -> Leave | None:
    grad, x, indices = a["grad_output"], a["self"], a["indices"]
    leave = check_fold(grad, x, indices)
    if leave is None and (not same_dtype(grad, x) or indices.shape != grad.shape):
        return UNTOUCHED  # ATen raises its own error
    return leave


def _max_pool_backward(spatial: int) -> Handler:
    """The exact handler of the input gradient of a max pooling over ``spatial`` dims."""

    def handler(a: dict[str, Any]) -> torch.Tensor | Leave:
        leave = max_pool_backward_verdict(a)
        if leave is not None:
            return leave
        return folds.max_pool_backward(a["grad_output"], a["self"], a["indices"], spatial)

    return handler


max_pool2d_backward = _max_pool_backward(2)
max_pool3d_backward = _max_pool_backward(3)


def grid_sampler_backward(a: dict[str, Any]) -> Leave:
    """The input gradient of grid sampling folds interpolated gradients at positions the grid
    picks: left to torch, recorded as passed (the grid's own gradient is no fold)."""
    x = a.get("input", a.get("self"))
    if not a.get("output_mask", (True, True))[0]:
        return UNTOUCHED
    leave = check_fold(x, a["grid"], a["grad_output"])
    return leave or Leave("grid sampling's input gradient: interpolation weights and their "
                          "sums are torch's")  # fmt: skip


def histogram_verdict(a: dict[str, Any]) -> Leave | None:
    x, weight = a["self"], a.get("weight")
    if weight is None:
        return UNTOUCHED  # counts: every term is 1
    bins = a["bins"]
    edges = [b for b in (bins if isinstance(bins, list | tuple) else [bins])
             if isinstance(b, torch.Tensor)]  # fmt: skip
    leave = check_fold(x, weight, *edges)
    if leave is None and not same_dtype(x, weight):
        return UNTOUCHED  # ATen raises its own error
    return leave


def histogram(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | Leave:
    """``histogram.bin_ct`` / ``.bins_tensor`` with ``weight``: exact bins, ATen's edges."""
    leave = histogram_verdict(a)
    if leave is not None:
        return leave
    x, bins, weight = a["self"], a["bins"], a["weight"]
    if weight.shape != x.shape:
        return UNTOUCHED
    if isinstance(bins, torch.Tensor):
        _, edges = aten.histogram.bins_tensor(x, bins)
    else:
        _, edges = aten.histogram.bin_ct(x, bins, range=a.get("range"))
    hist = histograms.weighted_histogram(x.reshape(-1, 1), [edges], weight, bool(a["density"]))
    return hist, edges


def histogramdd(a: dict[str, Any]) -> torch.Tensor | Leave:
    """``_histogramdd_from_bin_cts`` / ``_from_bin_tensors`` with ``weight``: exact bins."""
    leave = histogram_verdict(a)
    if leave is not None:
        return leave
    x, bins, weight = a["self"], a["bins"], a["weight"]
    if x.dim() < 1 or weight.shape != x.shape[:-1]:
        return UNTOUCHED
    if all(isinstance(b, torch.Tensor) for b in bins):
        edges = list(bins)
    else:
        edges = aten._histogramdd_bin_edges(x, bins, range=a.get("range"))
    coords = x.reshape(-1, x.shape[-1])
    return histograms.weighted_histogram(coords, edges, weight, bool(a["density"]))


def segment_reduce_verdict(a: dict[str, Any]) -> Leave | None:
    lengths, offsets = a.get("lengths"), a.get("offsets")
    leave = check_fold(a["data"], *[t for t in (lengths, offsets) if t is not None])
    return leave or _reduce_verdict({"max": "amax", "min": "amin"}.get(a["reduce"], a["reduce"]),
                                    ("sum", "mean"))  # fmt: skip


def segment_reduce(a: dict[str, Any]) -> torch.Tensor | Leave:
    data, reduce = a["data"], a["reduce"]
    lengths, offsets, axis = a.get("lengths"), a.get("offsets"), a.get("axis", 0)
    leave = segment_reduce_verdict(a)
    if leave is not None:
        return leave
    if a.get("indices") is not None or segment.problem(
        data, lengths, offsets, axis % max(data.dim(), 1), bool(a.get("unsafe", False))
    ):
        return UNTOUCHED  # ATen raises its own error
    initial = a.get("initial")
    return segment.segment_reduce(
        data, reduce, lengths, offsets, axis % data.dim(), None if initial is None else initial
    )


def sparse_product(
    C: Any, a: Any, b: Any, beta: Any = 1, alpha: Any = 1, reduce: str = "sum"
) -> torch.Tensor | Leave:
    """``beta * C + alpha * (a @ b)`` with a sparse factor, exact; ``reduce="mean"`` per row."""
    ops = sparse.operands(a, b, C)
    if ops is None:
        return UNTOUCHED
    if isinstance(ops, str):
        return Leave(ops)
    if reduce not in ("sum", "mean"):
        return UNTOUCHED  # max, min: exact in any order
    if reduce == "mean" and (ops.right or C is not None):
        return UNTOUCHED  # torch has no such product
    out = sparse.product(ops, C, float(beta), float(alpha))
    if reduce == "mean":
        out = folds.divide_by_counts(out, sparse.row_counts(ops.A).clamp(min=1).view(-1, 1))
    return out


def mm(a: dict[str, Any]) -> torch.Tensor | Leave:
    if "out_dtype" in a:
        return Leave("mm with out_dtype") if sparse.operands(a["self"], a["mat2"]) else UNTOUCHED
    return sparse_product(None, a["self"], a["mat2"])


def addmm(a: dict[str, Any]) -> torch.Tensor | Leave:
    x, mat1, mat2 = a["self"], a["mat1"], a["mat2"]
    if "out_dtype" in a:
        return Leave("addmm with out_dtype") if sparse.operands(mat1, mat2, x) else UNTOUCHED
    return sparse_product(x, mat1, mat2, a["beta"], a["alpha"])


def mv(a: dict[str, Any]) -> torch.Tensor | Leave:
    """A sparse matrix times a vector: the one-column product, exact as ``mm``."""
    A, x = a["self"], a["vec"]
    if not sparse.is_sparse(A) or x.dim() != 1:
        return UNTOUCHED
    out = sparse_product(None, A, x.unsqueeze(1))
    return out if isinstance(out, Leave) else out.squeeze(1)


def addmv(a: dict[str, Any]) -> torch.Tensor | Leave:
    """``beta * b + alpha * (A @ x)`` with a sparse ``A``, one rounding, as ``addmm``."""
    b, A, x = a["self"], a["mat"], a["vec"]
    if not sparse.is_sparse(A) or x.dim() != 1 or A.dim() != 2:
        return UNTOUCHED
    if b.dim() > 1 or (b.numel() != 1 and b.shape != (A.shape[0],)):
        return Leave("addmv whose added tensor is not a vector of the rows or a scalar")
    column = b.reshape(-1, 1).expand(A.shape[0], 1)
    out = sparse_product(column, A, x.unsqueeze(1), a["beta"], a["alpha"])
    return out if isinstance(out, Leave) else out.squeeze(1)


def sparse_mm(a: dict[str, Any]) -> torch.Tensor | Leave:
    return sparse_product(None, a["sparse"], a["dense"], reduce=a.get("reduce", "sum"))


def sparse_mm_reduce(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | Leave:
    out = sparse_product(None, a["self"], a["other"], reduce=a["reduce"])
    if isinstance(out, Leave):
        return out
    return out, torch.empty(0, dtype=torch.int64, device=out.device)


def sampled_addmm(a: dict[str, Any]) -> torch.Tensor | Leave:
    S, mat1, mat2 = a["self"], a["mat1"], a["mat2"]
    if S.layout != torch.sparse_csr or S.dim() != 2 or mat1.dim() != 2 or mat2.dim() != 2:
        return UNTOUCHED
    if S.dtype not in FLOATING or mat1.dtype != S.dtype or mat2.dtype != S.dtype:
        return Leave(f"{dtype_name(S.dtype)}: bitfold folds float16 .. float64")
    if sparse.is_sparse(mat1) or sparse.is_sparse(mat2) or sparse.problem(S) is not None:
        return Leave("sparse factors or a hybrid pattern: summed by torch")
    return sparse.sampled_addmm(S, mat1, mat2, float(a["beta"]), float(a["alpha"]))


def _sparse_place(x: torch.Tensor) -> Leave | None:
    """A verdict for a sparse tensor bitfold cannot fold where it is, or None."""
    if type(x) not in PLAIN or not folds_on(x.device):
        return Leave(
            f"a {type(x).__name__} on {x.device}: bitfold folds plain tensors on the devices "
            "its backends serve"
        )
    return None


def coalesce(a: dict[str, Any]) -> torch.Tensor | Leave:
    x = a["self"]
    if x.dtype not in FLOATING:
        return UNTOUCHED if x.dtype in INTEGER else Leave("complex duplicates summed by torch")
    return _sparse_place(x) or sparse.coalesce(x)


def to_compressed(a: dict[str, Any], func: Any) -> Any:
    """A conversion of an uncoalesced COO tensor sums its duplicates: coalesce exactly first."""
    x = a["self"]
    if x.layout != torch.sparse_coo or x.is_coalesced() or x.dtype not in FLOATING:
        return UNTOUCHED
    coalesced = coalesce({"self": x})
    if isinstance(coalesced, Leave):
        return coalesced
    rest = {k: v for k, v in a.items() if k != "self"}
    return func(coalesced, **rest)


def to_dense(a: dict[str, Any]) -> Any:
    """``_to_dense`` of an uncoalesced COO tensor sums its duplicates: coalesced exactly first."""
    return to_compressed(a, aten._to_dense)


def sparse_sum(a: dict[str, Any]) -> Any:
    """``_sparse_sum`` over ``dim`` of a COO tensor: exact (:func:`.sparse.sparse_sum`)."""
    x, dims = a["self"], a.get("dim")
    dtype = a.get("dtype")
    if dims is None or x.layout != torch.sparse_coo:
        return UNTOUCHED  # all of it: coalesce (a rule of its own), then a dense sum
    out_dtype = x.dtype if dtype is None else dtype
    if out_dtype in INTEGER:
        return UNTOUCHED
    if out_dtype not in FLOATING:
        return Leave(f"{dtype_name(out_dtype)}: bitfold folds float16 .. float64")
    return _sparse_place(x) or sparse.sparse_sum(x, list(dims), dtype)


def to_sparse_csr(a: dict[str, Any]) -> Any:
    return to_compressed(a, aten._to_sparse_csr)


def to_sparse_csc(a: dict[str, Any]) -> Any:
    return to_compressed(a, aten._to_sparse_csc)


def to_sparse(a: dict[str, Any]) -> Any:
    if a.get("layout") in (None, torch.sparse_coo):
        return UNTOUCHED  # COO to COO: no sum
    return to_compressed(a, aten._to_sparse)
