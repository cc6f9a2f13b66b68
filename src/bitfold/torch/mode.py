"""``exact_mode()``: every fold that reaches ATen, in the forward and the backward, made exact.

Inside ``with bitfold.torch.exact_mode() as mode:`` a ``TorchDispatchMode``
sees every ATen op that runs (the backward's too: autograd carries the mode
to its threads) and sends the ops that fold, on floating CPU and CUDA
tensors, to :mod:`bitfold.torch.folds` instead of ATen. Every element they
produce is then the **correctly rounded sum of its old value (where the op
adds into one) and all its terms**, one rounding: the same bits for any order
of the contributions. Each term is computed as torch computes it (``alpha *
source[i]`` rounded to the dtype; a bag's gradient row divided by its size,
times its per-sample weight); a mean is that sum divided once by the count.
In-place (``index_add_``) and ``out=`` forms write their result where ATen
would. Every other op runs untouched.

============================================  ===========================================
ATen op (and its ``_`` / ``out=`` forms)       inside ``exact_mode()``
============================================  ===========================================
``scatter_add``                                exact (any dim; an index expanded along
                                               the trailing dims folds whole rows)
``scatter(..., reduce="add")``                 exact (tensor or scalar ``src``)
``scatter_reduce`` "sum", "mean"               exact (``include_self`` either way)
``index_add``                                  exact (any dim, ``alpha``)
``index_reduce`` "mean"                        exact (``include_self`` either way)
``index_put`` / ``_index_put_impl_`` /         exact with ``accumulate=True`` (the
``_unsafe_index_put``                          backward of ``x[idx]``); without it, not
                                               a sum: untouched
``put`` with ``accumulate=True``               exact (the backward of ``x.take(idx)``)
``embedding_dense_backward``                   exact (``padding_idx``,
                                               ``scale_grad_by_freq``)
``_embedding_bag_backward`` (dense),           exact (modes sum, mean and max,
``_embedding_bag_dense_backward``              ``per_sample_weights``, ``padding_idx``)
``bincount`` with floating ``weights``         exact (float32 or float64, as torch)
``segment_reduce`` "sum", "mean"               exact (``lengths`` or ``offsets``, any
                                               ``axis``, ``initial``; :mod:`.segment`);
                                               its backward is a gather: untouched
``mm``, ``addmm``, ``_sparse_addmm``,          exact when one factor is a COO, CSR or
``_sparse_mm``, ``_sparse_mm_reduce_impl``     CSC matrix (:mod:`.sparse`): the correctly
("sum", "mean"); and above autograd            rounded sum of the exact products, for
``A @ X``, ``X @ A``, ``torch.mm``,            ``addmm`` of ``beta * C + alpha * sum``
``torch.sparse.mm``, ``addmm``,                (one rounding); the public calls run as an
``torch.sparse.addmm``                         autograd function whose backward (dense
                                               operand, sparse values) is exact too
``sparse_sampled_addmm``                       exact (the CSR backward's sampled product)
``_coalesce``; ``_to_sparse_csr`` /            exact: each repeated coordinate's values
``_to_sparse_csc`` / ``_to_sparse`` of an      folded once (coalesced first, then
uncoalesced COO tensor                         converted)
the same ops on integer or bool tensors        untouched: integer sums are exact already
``scatter_reduce`` / ``index_reduce`` /        untouched: exact in any order already
``segment_reduce`` "amax", "amin", "max",
"min"
"prod" reductions, ``scatter(reduce=           untouched and recorded in ``mode.passed``:
"multiply")``, complex dtypes, sparse          not sums of reals, or not on a plain CPU /
gradients (``_embedding_bag_backward(sparse=   CUDA tensor; ``strict=True`` raises
True)``), sparse @ sparse, BSR/BSC, hybrid     :class:`bitfold.FoldError` instead
or batched sparse factors, ``out_dtype``
products, other devices, floating tensor
subclasses
everything else (``sum``, dense ``mm``, ...)   untouched
============================================  ===========================================

Integer index tensors of a subclass that wraps one plain tensor through
``__tensor_flatten__`` (torch_geometric's ``Index`` and ``EdgeIndex``) are
read as that tensor. An integer index out of range in ``index_put`` /
``put`` (``accumulate=True``) raises :class:`bitfold.IndexRangeError` naming
the id as given and the size, not torch's own error.

Two places where the exact result follows torch's documentation rather than
torch 2.13's CPU kernel: with ``scale_grad_by_freq`` the embedding-bag
gradient divides each term by the frequency of *its* id (torch's CUDA kernel
does; the CPU one divides some terms by another id's count,
pytorch/pytorch#190063), and with ``include_last_offset`` the ids after the
last offset belong to no bag and get no gradient (the CPU kernel, whose
forward leaves them out, gives their rows values anyway).

The forward sums of ``embedding_bag`` (``_embedding_bag``) and plain
reductions (``sum``, ``mean``, dense matrix products) are not folds through an
index: they are untouched, deterministic from run to run on one machine but
not independent of the order of their terms. Use
:class:`bitfold.torch.EmbeddingBag` for exact bag sums.

``mode.counts`` counts the ops made exact by kind (``"index_put"``,
``"embedding_dense_backward"``, ...), so a test can check that the mode saw
a model's folds; ``mode.passed`` counts the folds left to ATen that are not
exact (kind and reason).

``torch.compile``: while a ``TorchDispatchMode`` is active, Dynamo compiles
nothing (PyTorch 2.13 skips every frame while a non-infra dispatch mode is
on the stack), so inside ``exact_mode()`` a compiled model runs op by op and
its folds are exact: slower, never inexact. Dynamo remembers the skip: a
function whose first call ran inside the mode stays uncompiled until
``torch._dynamo.reset()``. ``torch.compile(fullgraph=True)`` inside the mode
raises PyTorch's own error ("non-infra torch dispatch mode present"). A
graph compiled and run *outside* the mode keeps its own kernels (atomics
included), so a backward run inside the mode through such a graph raises
:class:`bitfold.FoldError`: run the forward and the backward inside the
mode. For compiled exact training, use the drop-ins
(:class:`bitfold.torch.Embedding`, :func:`bitfold.torch.index_add`, ...),
custom operators that ``torch.compile`` keeps whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import FoldError
from . import folds, segment, sparse
from .folds import FLOATING

aten = torch.ops.aten
_INTEGER = (
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
)  # fmt: skip
_PLAIN = (torch.Tensor, torch.nn.Parameter)


class _Leave:
    """A verdict: run ATen's op; ``reason`` (when set) is why a fold stays inexact."""

    __slots__ = ("reason",)

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason


_UNTOUCHED = _Leave()


def _bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in."""
    bound: dict[str, Any] = {}
    for i, arg in enumerate(func._schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _plain_index(t: Any) -> Any:
    """An integer tensor subclass that wraps one plain tensor of its shape (torch_geometric's
    ``Index`` and ``EdgeIndex``, through the ``__tensor_flatten__`` protocol), as that tensor;
    anything else as it is. Ids are integers: the wrapper changes no sum.
    """
    if isinstance(t, list | tuple):
        return type(t)(_plain_index(x) for x in t)
    if not isinstance(t, torch.Tensor) or type(t) in _PLAIN or t.dtype not in _INTEGER:
        return t
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None:
        return t
    names, _ = flatten()
    inner = getattr(t, names[0], None) if len(names) == 1 else None
    if (
        type(inner) in _PLAIN
        and inner.dtype == t.dtype
        and inner.shape == t.shape
        and inner.device == t.device
    ):
        return inner
    return t


def _written(func: Any) -> str | None:
    """The argument an in-place or ``out=`` overload writes (``self``, ``out``), or None."""
    for arg in func._schema.arguments:
        if arg.alias_info is not None and arg.alias_info.is_write:
            return str(arg.name)
    return None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _check(target: torch.Tensor, *tensors: Any) -> _Leave | None:
    """None when the fold into ``target`` can be made exact; else the verdict to leave it."""
    if target.dtype in _INTEGER:
        return _UNTOUCHED  # integer sums are exact in any order
    if target.dtype not in FLOATING:
        return _Leave(f"{_dtype_name(target.dtype)}: bitfold folds float16 .. float64 only")
    for t in (target, *tensors):
        if isinstance(t, torch.Tensor) and (
            type(t) not in _PLAIN
            or t.layout != torch.strided
            or t.device.type not in ("cpu", "cuda")
        ):
            return _Leave(
                f"a {type(t).__name__} on {t.device} ({t.layout}): bitfold folds plain CPU "
                "and CUDA tensors"
            )
    return None


def _same_dtype(target: torch.Tensor, values: torch.Tensor) -> bool:
    return isinstance(values, torch.Tensor) and values.dtype == target.dtype


# -- one handler per kind of op: the exact result, or a verdict to leave it to ATen ---------------
Handler = Callable[[dict[str, Any]], Any]


def _scatter_add(a: dict[str, Any]) -> torch.Tensor | _Leave:
    x, dim, index, src = a["self"], a["dim"], a["index"], a["src"]
    leave = _check(x, index, src)
    if leave is not None:
        return leave
    if not _same_dtype(x, src) or folds.scatter_shape_problem(x, dim, index, src):
        return _UNTOUCHED  # ATen raises its own error
    return folds.scatter_add(x, dim, index, src)


def _scatter(a: dict[str, Any]) -> torch.Tensor | _Leave:
    reduce = a.get("reduce")
    if reduce is None:
        return _UNTOUCHED  # a plain scatter writes, it does not sum
    x, index = a["self"], a["index"]
    if reduce != "add":
        leave = _check(x, index)
        return leave if leave is not None else _Leave(f"reduce={reduce!r}: a product, not a sum")
    src = a.get("src")
    if src is None:
        src = torch.full(index.shape, a["value"], dtype=x.dtype, device=x.device)
    return _scatter_add({"self": x, "dim": a["dim"], "index": index, "src": src})


def _scatter_reduce(a: dict[str, Any]) -> torch.Tensor | _Leave:
    x, dim, index, src, reduce = a["self"], a["dim"], a["index"], a["src"], a["reduce"]
    leave = _check(x, index, src)
    if leave is not None:
        return leave
    if reduce in ("amax", "amin"):
        return _UNTOUCHED  # a maximum is exact in any order
    if reduce not in ("sum", "mean"):
        return _Leave(f"reduce={reduce!r}: a product, not a sum")
    if not _same_dtype(x, src) or folds.scatter_shape_problem(x, dim, index, src):
        return _UNTOUCHED
    return folds.scatter_reduce(x, dim, index, src, reduce, bool(a["include_self"]))


def _index_add(a: dict[str, Any]) -> torch.Tensor | _Leave:
    x, dim, index, source = a["self"], a["dim"], a["index"], a["source"]
    leave = _check(x, index, source)
    if leave is not None:
        return leave
    if (
        not isinstance(dim, int)
        or not _same_dtype(x, source)
        or folds.index_add_shape_problem(x, dim, index, source)
    ):
        return _UNTOUCHED
    return folds.index_add(x, dim, index.reshape(-1), source, a.get("alpha", 1))


def _index_reduce(a: dict[str, Any]) -> torch.Tensor | _Leave:
    x, dim, index, source, reduce = a["self"], a["dim"], a["index"], a["source"], a["reduce"]
    leave = _check(x, index, source)
    if leave is not None:
        return leave
    if reduce in ("amax", "amin"):
        return _UNTOUCHED
    if reduce != "mean":
        return _Leave(f"reduce={reduce!r}: a product, not a sum")
    if not _same_dtype(x, source) or folds.index_add_shape_problem(x, dim, index, source):
        return _UNTOUCHED
    return folds.index_reduce_mean(x, dim, index.reshape(-1), source, bool(a["include_self"]))


def _index_put(a: dict[str, Any]) -> torch.Tensor | _Leave:
    if not a.get("accumulate", False):
        return _UNTOUCHED  # a write, not a sum
    x, indices, values = a["self"], a["indices"], a["values"]
    leave = _check(x, values, *[i for i in indices if i is not None])
    if leave is not None:
        return leave
    if not _same_dtype(x, values):
        return _UNTOUCHED
    return folds.index_put(x, indices, values)


def _put(a: dict[str, Any]) -> torch.Tensor | _Leave:
    if not a.get("accumulate", False):
        return _UNTOUCHED
    x, index, source = a["self"], a["index"], a["source"]
    leave = _check(x, index, source)
    if leave is not None:
        return leave
    if not _same_dtype(x, source) or index.numel() != source.numel():
        return _UNTOUCHED
    return folds.put(x, index, source)


def _embedding_dense_backward(a: dict[str, Any]) -> torch.Tensor | _Leave:
    grad, indices = a["grad_output"], a["indices"]
    leave = _check(grad, indices)
    if leave is not None:
        return leave
    return folds.embedding_backward(
        grad, indices, int(a["num_weights"]), int(a["padding_idx"]), bool(a["scale_grad_by_freq"])
    )


def _embedding_bag_backward(a: dict[str, Any]) -> torch.Tensor | _Leave:
    grad, indices, psw = a["grad"], a["indices"], a.get("per_sample_weights")
    if a.get("sparse", False):
        return _Leave("a sparse gradient: its duplicates are summed when coalesced")
    leave = _check(grad, indices, psw, a["bag_size"], a["maximum_indices"])
    if leave is not None:
        return leave
    mode = int(a["mode"])
    n = indices.numel()
    if "offsets" in a:
        offsets, num_bags = a["offsets"], grad.shape[0]
        end = int(offsets[num_bags]) if offsets.numel() > num_bags else None
        bags = folds.bag_of_positions(offsets, num_bags, n, end)
    elif a["offset2bag"].numel() == n:
        bags = a["offset2bag"]
    else:
        return _Leave("_embedding_bag_dense_backward without offset2bag")
    return folds.embedding_bag_backward(
        grad, indices, bags, a["bag_size"], a["maximum_indices"], int(a["num_weights"]),
        bool(a["scale_grad_by_freq"]), mode, psw, int(a.get("padding_idx", -1)),
    )  # fmt: skip


def _bincount(a: dict[str, Any]) -> torch.Tensor | _Leave:
    x, weights = a["self"], a.get("weights")
    if weights is None:
        return _UNTOUCHED  # integer counts
    leave = _check(weights, x)
    if leave is not None:
        return leave
    if x.dim() != 1 or x.dtype not in _INTEGER or weights.shape != x.shape:
        return _UNTOUCHED
    if x.numel() and int(x.min()) < 0:
        return _UNTOUCHED
    return folds.bincount(x, weights, int(a.get("minlength", 0)))


def _segment_reduce(a: dict[str, Any]) -> torch.Tensor | _Leave:
    data, reduce = a["data"], a["reduce"]
    lengths, offsets, axis = a.get("lengths"), a.get("offsets"), a.get("axis", 0)
    leave = _check(data, *[t for t in (lengths, offsets) if t is not None])
    if leave is not None:
        return leave
    if reduce in ("max", "min"):
        return _UNTOUCHED  # a maximum is exact in any order
    if reduce not in ("sum", "mean"):
        return _Leave(f"reduce={reduce!r}: a product, not a sum")
    if a.get("indices") is not None or segment.problem(
        data, lengths, offsets, axis % max(data.dim(), 1), bool(a.get("unsafe", False))
    ):
        return _UNTOUCHED  # ATen raises its own error
    initial = a.get("initial")
    return segment.segment_reduce(
        data, reduce, lengths, offsets, axis % data.dim(), None if initial is None else initial
    )


def _sparse_product(
    C: Any, a: Any, b: Any, beta: Any = 1, alpha: Any = 1, reduce: str = "sum"
) -> torch.Tensor | _Leave:
    """``beta * C + alpha * (a @ b)`` with a sparse factor, exact; ``reduce="mean"`` per row."""
    ops = sparse.operands(a, b, C)
    if ops is None:
        return _UNTOUCHED
    if isinstance(ops, str):
        return _Leave(ops)
    if reduce not in ("sum", "mean"):
        return _UNTOUCHED  # max, min: exact in any order
    if reduce == "mean" and (ops.right or C is not None):
        return _UNTOUCHED  # torch has no such product
    out = sparse.product(ops, C, float(beta), float(alpha))
    if reduce == "mean":
        out = out / sparse.row_counts(ops.A).clamp(min=1).to(out.dtype).view(-1, 1)
    return out


def _mm(a: dict[str, Any]) -> torch.Tensor | _Leave:
    if "out_dtype" in a:
        return _Leave("mm with out_dtype") if sparse.operands(a["self"], a["mat2"]) else _UNTOUCHED
    return _sparse_product(None, a["self"], a["mat2"])


def _addmm(a: dict[str, Any]) -> torch.Tensor | _Leave:
    x, mat1, mat2 = a["self"], a["mat1"], a["mat2"]
    if "out_dtype" in a:
        return _Leave("addmm with out_dtype") if sparse.operands(mat1, mat2, x) else _UNTOUCHED
    return _sparse_product(x, mat1, mat2, a["beta"], a["alpha"])


def _sparse_mm(a: dict[str, Any]) -> torch.Tensor | _Leave:
    return _sparse_product(None, a["sparse"], a["dense"], reduce=a.get("reduce", "sum"))


def _sparse_mm_reduce(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | _Leave:
    out = _sparse_product(None, a["self"], a["other"], reduce=a["reduce"])
    if isinstance(out, _Leave):
        return out
    return out, torch.empty(0, dtype=torch.int64, device=out.device)


def _sampled_addmm(a: dict[str, Any]) -> torch.Tensor | _Leave:
    S, mat1, mat2 = a["self"], a["mat1"], a["mat2"]
    if S.layout != torch.sparse_csr or S.dim() != 2 or mat1.dim() != 2 or mat2.dim() != 2:
        return _UNTOUCHED
    if S.dtype not in FLOATING or mat1.dtype != S.dtype or mat2.dtype != S.dtype:
        return _Leave(f"{_dtype_name(S.dtype)}: bitfold folds float16 .. float64")
    if sparse.is_sparse(mat1) or sparse.is_sparse(mat2) or sparse.problem(S) is not None:
        return _Leave("sparse factors or a hybrid pattern: summed by torch")
    return sparse.sampled_addmm(S, mat1, mat2, float(a["beta"]), float(a["alpha"]))


def _coalesce(a: dict[str, Any]) -> torch.Tensor | _Leave:
    x = a["self"]
    if x.dtype not in FLOATING:
        return _UNTOUCHED if x.dtype in _INTEGER else _Leave("complex duplicates summed by torch")
    if type(x) not in _PLAIN or x.device.type not in ("cpu", "cuda"):
        return _Leave(f"a {type(x).__name__} on {x.device}: bitfold folds plain CPU/CUDA tensors")
    return sparse.coalesce(x)


def _to_compressed(a: dict[str, Any], func: Any) -> Any:
    """A conversion of an uncoalesced COO tensor sums its duplicates: coalesce exactly first."""
    x = a["self"]
    if x.layout != torch.sparse_coo or x.is_coalesced() or x.dtype not in FLOATING:
        return _UNTOUCHED
    coalesced = _coalesce({"self": x})
    if isinstance(coalesced, _Leave):
        return coalesced
    rest = {k: v for k, v in a.items() if k != "self"}
    return func(coalesced, **rest)


def _to_sparse_csr(a: dict[str, Any]) -> Any:
    return _to_compressed(a, aten._to_sparse_csr)


def _to_sparse_csc(a: dict[str, Any]) -> Any:
    return _to_compressed(a, aten._to_sparse_csc)


def _to_sparse(a: dict[str, Any]) -> Any:
    if a.get("layout") in (None, torch.sparse_coo):
        return _UNTOUCHED  # COO to COO: no sum
    return _to_compressed(a, aten._to_sparse)


#: overload packet -> (kind recorded in counts, handler)
_RULES: dict[Any, tuple[str, Handler]] = {}
for _kind, _handler, _packets in (
    ("scatter_add", _scatter_add, (aten.scatter_add, aten.scatter_add_)),
    ("scatter_add", _scatter, (aten.scatter, aten.scatter_)),
    ("scatter_reduce", _scatter_reduce, (aten.scatter_reduce, aten.scatter_reduce_)),
    ("index_add", _index_add, (aten.index_add, aten.index_add_)),
    ("index_reduce", _index_reduce, (aten.index_reduce, aten.index_reduce_)),
    (
        "index_put",
        _index_put,
        (aten.index_put, aten.index_put_, aten._index_put_impl_, aten._unsafe_index_put),
    ),
    ("put", _put, (aten.put, aten.put_)),
    ("embedding_dense_backward", _embedding_dense_backward, (aten.embedding_dense_backward,)),
    (
        "embedding_bag_backward",
        _embedding_bag_backward,
        (aten._embedding_bag_backward, aten._embedding_bag_dense_backward),
    ),
    ("bincount", _bincount, (aten.bincount,)),
    ("coalesce", _coalesce, (aten._coalesce,)),
    ("coalesce", _to_sparse_csr, (aten._to_sparse_csr,)),
    ("coalesce", _to_sparse_csc, (aten._to_sparse_csc,)),
    ("coalesce", _to_sparse, (aten._to_sparse,)),
    ("segment_reduce", _segment_reduce, (aten.segment_reduce,)),
    ("sparse_mm", _mm, (aten.mm,)),
    ("sparse_mm", _addmm, (aten.addmm, aten._sparse_addmm)),
    ("sparse_mm", _sparse_mm, (aten._sparse_mm,)),
    ("sparse_mm", _sparse_mm_reduce, (aten._sparse_mm_reduce_impl,)),
    ("sparse_sampled_addmm", _sampled_addmm, (aten.sparse_sampled_addmm,)),
):
    for _packet in _packets:
        _RULES[_packet] = (_kind, _handler)


# -- graphs compiled outside the mode ----------------------------------------------------------
#: the autograd node of a graph compiled by torch.compile (AOT autograd's CompiledFunction)
_COMPILED_NODE = "CompiledFunctionBackward"
_BACKWARDS = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


def _compiled_node_in(roots: Any) -> str | None:
    """The name of a compiled graph's node reachable from ``roots``' autograd graph, or None."""
    if isinstance(roots, torch.Tensor):
        roots = (roots,)
    todo = [t.grad_fn for t in roots if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    seen: set[int] = set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.name().startswith(_COMPILED_NODE):
            return str(node.name())
        todo.extend(nxt for nxt, _ in node.next_functions)
    return None


# -- sparse products, seen above autograd ------------------------------------------------------
# The dispatch rules above make a sparse product's forward exact, and the dense operand's
# gradient (another sparse product); but ATen's backward into the sparse *values* of a COO
# matrix is a dense ``mm`` of two dense matrices, masked afterwards, which no rule can tell from
# any other ``mm``. So the public calls are caught above autograd and run as
# ``sparse.SparseAddmm``, whose backward is exact too.
@dataclass(frozen=True)
class _Product:
    """A call's operands: ``beta * C + alpha * (a @ b)``, ``reduce`` per row."""

    a: Any
    b: Any
    C: Any = None
    beta: Any = 1
    alpha: Any = 1
    reduce: Any = None


def _two(args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...]) -> _Product | None:
    if kwargs.keys() - set(names) - {"reduce"} or len(args) > 3:
        return None  # out= and the like: the dispatch rules make the forward exact
    got = dict(zip(names, args, strict=False)) | kwargs
    if not all(n in got for n in names):
        return None
    a, b = (got[n] for n in names)
    return _Product(a, b, reduce=got.get("reduce", args[2] if len(args) > 2 else None))


def _mm_call(*args: Any, **kwargs: Any) -> _Product | None:
    return _two(args, kwargs, ("input", "mat2")) or _two(args, kwargs, ("self", "mat2"))


def _matmul_call(*args: Any, **kwargs: Any) -> _Product | None:
    return _two(args, kwargs, ("input", "other")) or _two(args, kwargs, ("self", "other"))


def _rmatmul_call(*args: Any, **kwargs: Any) -> _Product | None:
    got = _two(args, kwargs, ("self", "other"))
    return None if got is None else _Product(got.b, got.a)


def _sparse_mm_call(*args: Any, **kwargs: Any) -> _Product | None:
    return _two(args, kwargs, ("mat1", "mat2")) or _two(args, kwargs, ("sparse", "dense"))


def _addmm_call(*args: Any, **kwargs: Any) -> _Product | None:
    names = ("input", "mat1", "mat2", "beta", "alpha")
    if "self" in kwargs:
        kwargs = {"input": kwargs.pop("self"), **kwargs}
    if kwargs.keys() - set(names) or len(args) > 5:
        return None
    got = dict(zip(names, args, strict=False)) | kwargs
    if not all(n in got for n in names[:3]):
        return None
    return _Product(got["mat1"], got["mat2"], got["input"], got.get("beta", 1), got.get("alpha", 1))


_SPARSE_CALLS: dict[Any, Callable[..., _Product | None]] = {
    torch.mm: _mm_call,
    torch.Tensor.mm: _mm_call,
    torch.matmul: _matmul_call,
    torch.Tensor.matmul: _matmul_call,
    torch.Tensor.__matmul__: _matmul_call,
    torch.Tensor.__rmatmul__: _rmatmul_call,
    torch.sparse.mm: _sparse_mm_call,
    torch.addmm: _addmm_call,
    torch.Tensor.addmm: _addmm_call,
    torch.sparse.addmm: _addmm_call,
}


def _sparse_call(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The exact, differentiable result of a sparse product call; a :class:`_Leave` otherwise."""
    try:
        binder = _SPARSE_CALLS.get(func)
    except TypeError:  # an unhashable callable
        return _UNTOUCHED
    call = None if binder is None else binder(*args, **kwargs)
    if call is None:
        return _UNTOUCHED
    a, b, vector = call.a, call.b, None
    if isinstance(b, torch.Tensor) and b.dim() == 1 and sparse.is_sparse(a) and call.C is None:
        b, vector = b.unsqueeze(1), 1  # matmul of a matrix and a vector
    elif isinstance(a, torch.Tensor) and a.dim() == 1 and sparse.is_sparse(b) and call.C is None:
        a, vector = a.unsqueeze(0), 0
    ops = sparse.operands(a, b, call.C)
    if ops is None:
        return _UNTOUCHED
    if isinstance(ops, str):
        return _Leave(ops)
    reduce = "sum" if call.reduce in (None, "sum") else call.reduce
    if reduce != "sum" and (reduce != "mean" or ops.right):
        return _UNTOUCHED  # max, min: exact in any order
    beta, alpha = float(call.beta), float(call.alpha)
    out = sparse.differentiable_product(ops, call.C, beta, alpha)
    if reduce == "mean":
        out = out / sparse.row_counts(ops.A).clamp(min=1).to(out.dtype).view(-1, 1)
    return out if vector is None else out.squeeze(vector)


class _CompiledBackwardGuard(TorchFunctionMode):
    """Refuses a backward, inside the mode, through a graph that torch.compile compiled outside it.

    Dynamo compiles nothing while a dispatch mode is active, so everything
    compiled inside the mode runs op by op; but a forward compiled and run
    outside the mode leaves compiled backward kernels (atomics included) that
    no ATen op of the mode would see.

    It also runs the sparse products (``_SPARSE_CALLS``) as exact autograd
    functions, counted in ``mode``.
    """

    def __init__(self, mode: ExactMode) -> None:
        super().__init__()
        self.mode = mode

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _BACKWARDS and args:
            name = _compiled_node_in(args[0])
            if name is not None:
                raise FoldError(
                    f"exact_mode(): this backward runs through {name}, a graph torch.compile "
                    "compiled outside the mode, whose kernels the mode cannot see (its sums "
                    "would not be exact); run the forward inside exact_mode() too (torch.compile "
                    "then runs it op by op), or use bitfold.torch's drop-in functions and modules"
                )
        result = _sparse_call(func, args, kwargs)
        if isinstance(result, _Leave):
            if result.reason is not None:
                self.mode.leave(str(func), "sparse_mm", result.reason)
            return func(*args, **kwargs)
        self.mode.counts["sparse_mm"] += 1
        return result


class ExactMode(TorchDispatchMode):
    """The dispatch mode behind :func:`exact_mode` (see the module docstring).

    ``counts``: a ``Counter`` of the ops made exact, by kind. ``passed``: a
    ``Counter`` of the folds left to ATen that are not exact, keyed
    ``"kind: reason"``. ``strict=True`` raises :class:`bitfold.FoldError`
    for those instead.
    """

    def __init__(self, *, strict: bool = False) -> None:
        super().__init__()
        self.strict = bool(strict)
        self.counts: Counter[str] = Counter()
        self.passed: Counter[str] = Counter()
        self._guards: list[_CompiledBackwardGuard] = []

    def __enter__(self) -> ExactMode:
        guard = _CompiledBackwardGuard(self)
        guard.__enter__()
        self._guards.append(guard)
        try:
            super().__enter__()
        except BaseException:
            self._guards.pop().__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._guards.pop().__exit__(*exc)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        rule = _RULES.get(func.overloadpacket)
        if rule is None:
            return func(*args, **kwargs)
        kind, handler = rule
        bound = {k: _plain_index(v) for k, v in _bind(func, args, kwargs).items()}
        result = handler(bound)
        if isinstance(result, _Leave):
            if result.reason is not None:
                self.leave(str(func), kind, result.reason)
            return func(*args, **kwargs)
        self.counts[kind] += 1
        written = _written(func)
        if written is None:
            return result
        target = bound[written]
        if target.shape != result.shape:
            target.resize_(result.shape)
        return target.copy_(result)

    def leave(self, func: str, kind: str, reason: str) -> None:
        """Record a fold left to torch (``passed``), or refuse it with ``strict=True``."""
        if self.strict:
            raise FoldError(f"exact_mode(strict=True): {func} cannot be made exact ({reason})")
        self.passed[f"{kind}: {reason}"] += 1

    def __repr__(self) -> str:
        return f"ExactMode(counts={dict(self.counts)}, passed={dict(self.passed)})"


def exact_mode(*, strict: bool = False) -> ExactMode:
    """A context manager inside which every fold that reaches ATen is exact, forward and backward.

    ``with exact_mode() as mode:`` around a training step makes every
    ``scatter_add``, ``index_add``, ``index_put(accumulate=True)``,
    embedding and embedding-bag backward, ``scatter_reduce`` sum/mean (the
    module docstring's table) the correctly rounded sum, the same bits for any
    order of the contributions, and so are ``segment_reduce`` sum/mean and
    products with a sparse (COO, CSR, CSC) factor, forward and backward;
    every other op runs untouched.
    ``mode.counts`` says how many ops of each kind it made exact;
    ``mode.passed`` lists the folds it could not (complex, sparse, "prod");
    ``strict=True`` raises :class:`bitfold.FoldError` for those.

    >>> import torch, bitfold.torch as bt
    >>> w = torch.zeros(3, requires_grad=True)
    >>> with bt.exact_mode() as mode:
    ...     w[torch.tensor([0, 2, 2])].sum().backward()
    >>> w.grad.tolist(), mode.counts["index_put"]
    ([1.0, 0.0, 2.0], 1)
    """
    return ExactMode(strict=strict)


__all__ = ["ExactMode", "exact_mode"]
