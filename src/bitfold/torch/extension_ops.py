"""The fold ops of PyTorch extension packages: ``torch_scatter``, ``torch_sparse``, ``pyg_lib``.

Graph libraries sum their messages through compiled extension ops
(``torch.ops.torch_scatter.segment_sum_csr``, ``torch.ops.torch_sparse.spmm_sum``,
``torch.ops.pyg.scatter_sum``, ...) whenever those packages are installed. Their
sums run inside the extension's own C++ or CUDA loops, which no ATen-level rule
sees, in whatever order their threads or atomics take. Every op of these
namespaces is looked up here, by its qualified name, above autograd (the
function-level half of :func:`bitfold.torch.exact_mode`, and the function mode
of :func:`bitfold.torch.compile`):

* a sum or a mean (``scatter_sum``, ``segment_sum_csr``, ``spmm_mean``, ...) is
  *translated*: computed with ATen's own differentiable ops (``scatter_add_``,
  ``index_add_``, ``index_select``), which the rest of the mode (or the compiled
  graph pass) makes exact. Every output element is the correctly rounded sum of
  its terms (a term ``value * x`` of a sparse product rounded to the dtype, as
  the extension computes it); a mean is that sum divided once by the count.
  Gathers (``gather_csr``, ``gather_coo``) are translated too: their backward is
  a segment sum;
* an op that is no fold, or is exact in any order (minima, maxima, sampling,
  clustering, sorting ids, dense segment products), runs untouched;
* an op that sums in a way bitfold does not rewrite (``scatter_mul``, a segment
  softmax, spline weighting's weight gradient), or any op of these namespaces
  bitfold does not know, runs as it is and is recorded in ``passed`` (refused
  with ``strict=True``): no extension fold passes unseen.

The translations keep each op's documented semantics: ``dim_size`` and ``out``
(added into for scatters and COO segments, overwritten for CSR segments, as the
extensions do), an index broadcast as ``torch_scatter`` broadcasts it, empty
segments giving zeros. A few rare forms (a batched ``indptr`` with rows that
differ, ``segment_mean_coo`` into ``out``, batched sparse products) are passed,
not translated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .folds import bag_of_positions, divide_by_counts
from .handlers import UNTOUCHED, Leave

#: the namespaces of the extension packages whose ops are looked up here
NAMESPACES = ("torch_scatter", "torch_sparse", "pyg")


@dataclass(frozen=True)
class ExtensionRule:
    """What to do with one extension op: ``translate`` it (exact), or leave it to the extension,
    silently (no ``reason``: not a fold, or exact in any order) or recorded as passed."""

    translate: Callable[..., Any] | None = None
    reason: str | None = None


def qualified_name(func: Any) -> str | None:
    """``"torch_scatter::segment_sum_csr"`` for an op (overload or packet) of :data:`NAMESPACES`."""
    if isinstance(func, torch._ops.OpOverloadPacket):
        name = func._qualified_op_name
    elif isinstance(func, torch._ops.OpOverload):
        name = func._schema.name
    else:
        return None
    return name if name.split("::")[0] in NAMESPACES else None


# -- the translations: ATen ops only, differentiable ---------------------------------------------
def _broadcast(index: torch.Tensor, src: torch.Tensor, dim: int) -> torch.Tensor:
    """``index`` broadcast to ``src``'s shape along ``dim`` (torch_scatter's rule)."""
    if index.dim() == 1:
        index = index.view((1,) * dim + (-1,))
    while index.dim() < src.dim():
        index = index.unsqueeze(-1)
    return index.expand(src.shape)


def _zeros_along(src: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    shape = list(src.shape)
    shape[dim] = size
    return src.new_zeros(shape)


def _scatter_sum_counted(src: torch.Tensor, index: torch.Tensor, dim: int, out: Any,
                         dim_size: Any) -> tuple[torch.Tensor, torch.Tensor, int]:  # fmt: skip
    """(the scatter sum, index broadcast, dim >= 0); ``out`` is added into (in place)."""
    dim = dim % src.dim()
    full = _broadcast(index, src, dim)
    if out is None:
        if dim_size is None:
            dim_size = int(index.max()) + 1 if index.numel() else 0
        out = _zeros_along(src, dim, int(dim_size))
    return out.scatter_add_(dim, full, src), full, dim


def scatter_sum(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Any = None,
                dim_size: Any = None) -> torch.Tensor:  # fmt: skip
    """``scatter_sum``: ``out`` (or zeros of ``dim_size``) plus ``src`` scattered by ``index``."""
    return _scatter_sum_counted(src, index, dim, out, dim_size)[0]


def _counts(full: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """How many terms each position along ``dim`` receives (int64, exact)."""
    ones = torch.ones(full.shape, dtype=torch.int64, device=full.device)
    shape = list(full.shape)
    shape[dim] = size
    return torch.zeros(shape, dtype=torch.int64, device=full.device).scatter_add_(dim, full, ones)


def scatter_mean(src: torch.Tensor, index: torch.Tensor, dim: int = -1, out: Any = None,
                 dim_size: Any = None) -> torch.Tensor:  # fmt: skip
    """``scatter_mean``: the exact sum divided once by the number of terms (at least 1)."""
    summed, full, d = _scatter_sum_counted(src, index, dim, out, dim_size)
    counts = _counts(full, d, summed.shape[d]).clamp(min=1)
    if not summed.is_floating_point():
        return summed.div_(counts, rounding_mode="floor")
    mean = divide_by_counts(summed, counts)
    return mean if out is None else out.copy_(mean)


def _segments(indptr: torch.Tensor, dim: int, size: int) -> tuple[torch.Tensor, int]:
    """(the segment of each of ``size`` positions, -1 outside every segment; segment count)."""
    num = indptr.numel() - 1
    return bag_of_positions(indptr[:num], num, size, int(indptr[-1])), num


def _flat_indptr(indptr: torch.Tensor) -> torch.Tensor | None:
    """A CSR pointer with leading dims of size 1 as a vector, or None (rows that may differ)."""
    if any(s != 1 for s in indptr.shape[:-1]):
        return None
    return indptr.reshape(-1)


def segment_sum_csr(src: torch.Tensor, indptr: torch.Tensor, out: Any = None,
                    mean: bool = False) -> Any:  # fmt: skip
    """``segment_sum_csr`` (``mean``: ``segment_mean_csr``); ``out`` is overwritten."""
    dim = indptr.dim() - 1
    flat = _flat_indptr(indptr)
    if flat is None:
        return Leave("a batched indptr whose rows may differ")
    segment, num = _segments(flat, dim, src.shape[dim])
    inside = segment >= 0
    terms = src
    if not bool(inside.all()):
        positions = torch.nonzero(inside).reshape(-1)
        terms, segment = src.index_select(dim, positions), segment[inside]
    result = _zeros_along(src, dim, num).index_add_(dim, segment, terms)
    if mean and result.is_floating_point():
        shape = [1] * result.dim()
        shape[dim] = num
        result = divide_by_counts(result, flat.diff().clamp(min=1).view(shape))
    return result if out is None else out.copy_(result)


def segment_mean_csr(src: torch.Tensor, indptr: torch.Tensor, out: Any = None) -> Any:
    return segment_sum_csr(src, indptr, out, mean=True)


def _coo_index(src: torch.Tensor, index: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A COO segment index expanded over ``src``'s leading dims, and its segment dim."""
    dim = index.dim() - 1
    return index.expand(tuple(src.shape[: index.dim()])), dim


def segment_sum_coo(src: torch.Tensor, index: torch.Tensor, out: Any = None,
                    dim_size: Any = None) -> torch.Tensor:  # fmt: skip
    """``segment_sum_coo``: a scatter sum along the index's last dim; ``out`` is added into."""
    index, dim = _coo_index(src, index)
    return scatter_sum(src, index, dim, out, dim_size)


def segment_mean_coo(src: torch.Tensor, index: torch.Tensor, out: Any = None,
                     dim_size: Any = None) -> Any:  # fmt: skip
    if out is not None:
        return Leave("segment_mean_coo into out=")
    index, dim = _coo_index(src, index)
    return scatter_mean(src, index, dim, None, dim_size)


def gather_csr(src: torch.Tensor, indptr: torch.Tensor, out: Any = None) -> Any:
    """``gather_csr``: each position takes its segment's row (its backward: a segment sum)."""
    dim = indptr.dim() - 1
    flat = _flat_indptr(indptr)
    if flat is None or int(flat[0]) != 0:
        return Leave("gather_csr with a batched indptr or one not starting at 0 (its backward "
                     "is a segment sum)")  # fmt: skip
    segment, _ = _segments(flat, dim, int(flat[-1]))
    result = src.index_select(dim, segment)
    return result if out is None else out.copy_(result)


def gather_coo(src: torch.Tensor, index: torch.Tensor, out: Any = None) -> torch.Tensor:
    """``gather_coo``: ``src`` read at ``index`` along its last dim (its backward: a sum)."""
    dim = index.dim() - 1
    shape = list(src.shape)
    shape[dim] = index.shape[dim]
    full = index
    while full.dim() < src.dim():
        full = full.unsqueeze(-1)
    result = src.gather(dim, full.expand(shape))
    return result if out is None else out.copy_(result)


def spmm_sum(row: Any, rowptr: torch.Tensor, col: torch.Tensor, value: Any, colptr: Any,
             csr2csc: Any, other: torch.Tensor, rowcount: Any = None,
             mean: bool = False) -> Any:  # fmt: skip
    """``torch_sparse``'s CSR times dense: row r sums ``value[e] * other[col[e]]`` exactly."""
    if other.dim() != 2:
        return Leave("a sparse product with a batched dense operand")
    M = rowptr.numel() - 1
    if row is None:
        row = bag_of_positions(rowptr[:M], M, col.numel())
    terms = other.index_select(0, col)
    if value is not None:
        terms = terms * value.to(other.dtype).view(-1, 1)
    result = other.new_zeros((M, other.shape[1])).index_add_(0, row, terms)
    if mean:
        counts = rowptr.diff() if rowcount is None else rowcount
        result = divide_by_counts(result, counts.clamp(min=1).view(-1, 1))
    return result


def spmm_mean(row: Any, rowptr: torch.Tensor, col: torch.Tensor, value: Any, rowcount: Any,
              colptr: Any, csr2csc: Any, other: torch.Tensor) -> Any:  # fmt: skip
    return spmm_sum(row, rowptr, col, value, colptr, csr2csc, other, rowcount, mean=True)


# -- the table ------------------------------------------------------------------------------------
#: an op's name in its namespace -> its translation into ATen folds
TRANSLATIONS: dict[str, Callable[..., Any]] = {
    "scatter_sum": scatter_sum,
    "scatter_mean": scatter_mean,
    "segment_sum_csr": segment_sum_csr,
    "segment_mean_csr": segment_mean_csr,
    "segment_sum_coo": segment_sum_coo,
    "segment_mean_coo": segment_mean_coo,
    "gather_csr": gather_csr,
    "gather_coo": gather_coo,
    "spmm_sum": spmm_sum,
    "spmm_mean": spmm_mean,
}
_ORDER_FREE = (
    "scatter_min", "scatter_max", "segment_min_csr", "segment_max_csr", "segment_min_coo",
    "segment_max_coo", "spmm_min", "spmm_max",
)  # fmt: skip
_NOT_FOLDS = (
    "cuda_version", "ind2ptr", "ptr2ind", "partition", "partition2", "mt_partition",
    "neighbor_sample", "hetero_neighbor_sample", "hetero_temporal_neighbor_sample",
    "dist_neighbor_sample", "relabel", "relabel_one_hop", "relabel_neighborhood",
    "hetero_relabel_neighborhood", "random_walk", "saint_subgraph", "sample_adj",
    "ego_k_hop_sample_adj", "hgt_sample", "non_diag_mask", "index_sort", "grid_cluster",
    "edge_sample", "fps", "graclus_cluster", "knn", "nearest", "radius", "metis",
    "merge_sampler_outputs", "subgraph", "sampled_op", "spline_basis", "segment_matmul",
    "grouped_matmul",
)  # fmt: skip
_PASSED = {
    "scatter_mul": "a product, not a sum",
    "softmax_csr": "a segment softmax: its sums are the extension's",
    "softmax_csr_backward": "a segment softmax's backward: its sums are the extension's",
    "spline_basis_backward": "sums over the spline basis, the extension's",
    "spline_weighting": "sums over the spline kernels, the extension's",
    "spline_weighting_backward_x": "sums over the spline kernels, the extension's",
    "spline_weighting_backward_weight": "the kernel weights' gradient: a scatter-add of the "
    "extension's",
    "spline_weighting_backward_basis": "sums over the features, the extension's",
}


def rule_for(name: str) -> ExtensionRule:
    """The rule of the extension op ``name`` (``"pyg::scatter_sum"``); unknown ones are passed."""
    op = name.split("::")[-1]
    if op in TRANSLATIONS:
        return ExtensionRule(TRANSLATIONS[op])
    if op in _ORDER_FREE or op in _NOT_FOLDS:
        return ExtensionRule()
    return ExtensionRule(reason=_PASSED.get(op, "an op of an extension package bitfold does "
                                                "not know"))  # fmt: skip


def run(name: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The exact result of extension op ``name`` (a translation), or a :class:`Leave` verdict."""
    rule = rule_for(name)
    if rule.translate is None:
        return UNTOUCHED if rule.reason is None else Leave(rule.reason)
    return rule.translate(*args, **kwargs)


__all__ = ["NAMESPACES", "TRANSLATIONS", "ExtensionRule", "qualified_name", "rule_for", "run"]
