"""The torch fold rules: one table, ATen op -> exact handler -> bitfold custom op.

Every way bitfold makes an existing PyTorch model's folds exact reads this
table:

* :func:`bitfold.torch.exact_mode` looks up every ATen op that runs
  (:func:`rule_for`) and calls the rule's handler in its place;
* :func:`bitfold.torch.compile` rewrites the fold nodes that reach inductor
  (the overloads in :attr:`Rule.compiled`) into the rule's custom op
  (``bitfold::exact_<op>``, :mod:`bitfold.torch.aten_ops`): the same schema as
  the ATen overload, the same handler inside, so a compiled fold gives the
  bits of the same fold under ``exact_mode()``.

A handler (:mod:`bitfold.torch.handlers`) returns the exact result: every
element the correctly rounded sum of its old value (where the op adds into
one) and all its terms, one rounding, the same bits for any order of the
terms; or a :class:`~bitfold.torch.handlers.Leave` verdict that runs ATen's
op (with a reason when the fold stays inexact: ``passed``). A rule's
``verdict`` decides from dtypes, devices and flags alone (fake tensors
included) whether the compile path can rewrite a node.

>>> import bitfold.torch.rules as r, torch
>>> rule = r.rule_for(torch.ops.aten.index_add_.default)
>>> rule.kind, rule.drop_in
('index_add', 'bitfold.torch.index_add')
>>> r.op_name(torch.ops.aten.scatter_reduce.two)
'exact_scatter_reduce_two'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import handlers as h
from .handlers import Handler, Leave

aten = torch.ops.aten
Verdict = Callable[[dict[str, Any]], Leave | None]


@dataclass(frozen=True)
class Rule:
    """One kind of fold: the ATen ops that are it, its exact handler, and how it compiles.

    ``kind``: the name counted in ``counts`` and ``passed``; ``ops``: ATen
    overload packets (every overload: functional, ``_`` and ``out=``);
    ``handler``: bound arguments -> exact result or verdict; ``verdict``: the
    handler's decision from metadata alone (``None`` when the compile path
    does not rewrite this kind); ``compiled``: the functional overloads that
    reach inductor's post-grad graphs and are rewritten into
    ``bitfold::<op_name(overload)>``; ``drop_in``: the function with the
    op's signature that is exact without a mode; ``description``: what is
    exact.
    """

    kind: str
    ops: tuple[Any, ...]
    handler: Handler
    description: str
    verdict: Verdict | None = None
    compiled: tuple[Any, ...] = ()
    drop_in: str | None = None


def _present(*names: str) -> tuple[Any, ...]:
    """The overloads ``packet.overload`` this torch has (torch 2.11 and 2.13 differ a little)."""
    found = []
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload or "default", None)
        if op is not None:
            found.append(op)
    return tuple(found)


_MASKED_PUT = _present("_unsafe_masked_index_put_accumulate")

#: every torch fold rule; the documentation's coverage table is generated from this list
RULES: tuple[Rule, ...] = (
    Rule("scatter_add", (aten.scatter_add, aten.scatter_add_), h.scatter_add,
         "exact, any dim; an index expanded along the trailing dims folds whole rows",
         h.scatter_add_verdict, _present("scatter_add"), "bitfold.torch.scatter_add"),
    Rule("scatter_add", (aten.scatter, aten.scatter_), h.scatter,
         'scatter(reduce="add") exact (tensor or scalar src); "multiply" passed',
         h.scatter_verdict, _present("scatter.reduce", "scatter.value_reduce")),
    Rule("scatter_reduce", (aten.scatter_reduce, aten.scatter_reduce_), h.scatter_reduce,
         '"sum" and "mean" exact (include_self either way); "amax"/"amin" exact already; '
         '"prod" passed', h.scatter_reduce_verdict, _present("scatter_reduce.two")),
    Rule("index_add", (aten.index_add, aten.index_add_), h.index_add,
         "exact, any dim, alpha", h.index_add_verdict, _present("index_add"),
         "bitfold.torch.index_add"),
    Rule("index_reduce", (aten.index_reduce, aten.index_reduce_), h.index_reduce,
         '"mean" exact (include_self either way); "prod" passed', h.index_reduce_verdict,
         _present("index_reduce")),
    Rule("index_put",
         (aten.index_put, aten.index_put_, aten._index_put_impl_, aten._unsafe_index_put),
         h.index_put, "exact with accumulate=True (the backward of x[idx]); a write otherwise",
         h.index_put_verdict, _present("index_put", "_unsafe_index_put")),
    Rule("embedding_dense_backward", tuple(op.overloadpacket for op in _MASKED_PUT),
         h.masked_index_put, "_unsafe_masked_index_put_accumulate, inductor's decomposition "
         "of the embedding backward: exact", h.masked_index_put_verdict, _MASKED_PUT),
    Rule("put", (aten.put, aten.put_), h.put, "exact with accumulate=True (the backward of "
         "x.take(idx))", h.put_verdict, _present("put")),
    Rule("embedding_dense_backward", (aten.embedding_dense_backward,), h.embedding_dense_backward,
         "exact (padding_idx, scale_grad_by_freq)", h.embedding_dense_backward_verdict,
         _present("embedding_dense_backward"), "bitfold.torch.embedding"),
    Rule("embedding_bag_backward",
         (aten._embedding_bag_backward, aten._embedding_bag_dense_backward),
         h.embedding_bag_backward, "exact: modes sum, mean and max, per_sample_weights, "
         "padding_idx; sparse=True passed", h.embedding_bag_backward_verdict,
         _present("_embedding_bag_backward", "_embedding_bag_dense_backward"),
         "bitfold.torch.embedding_bag"),
    Rule("embedding_bag", (aten._embedding_bag,), h.embedding_bag,
         "the forward's bag sums exact: modes sum and mean (one division by the bag's size), "
         "per_sample_weights (each product rounded as torch), padding_idx, include_last_offset; "
         "max exact already", h.embedding_bag_verdict, _present("_embedding_bag"),
         "bitfold.torch.embedding_bag"),
    Rule("embedding_bag", (aten._embedding_bag_forward_only,), h.embedding_bag_forward_only,
         "as _embedding_bag", h.embedding_bag_verdict, _present("_embedding_bag_forward_only"),
         "bitfold.torch.embedding_bag"),
    Rule("max_pool_backward", (aten.max_pool2d_with_indices_backward,
         aten.adaptive_max_pool2d_backward, aten.fractional_max_pool2d_backward),
         h.max_pool2d_backward, "exact: each output's gradient into the element its window took "
         "(overlapping windows summed once)", h.max_pool_backward_verdict,
         _present("max_pool2d_with_indices_backward", "adaptive_max_pool2d_backward",
                  "fractional_max_pool2d_backward")),
    Rule("max_pool_backward", (aten.max_pool3d_with_indices_backward,
         aten.adaptive_max_pool3d_backward, aten.fractional_max_pool3d_backward),
         h.max_pool3d_backward, "as the 2-D poolings", h.max_pool_backward_verdict,
         _present("max_pool3d_with_indices_backward", "adaptive_max_pool3d_backward",
                  "fractional_max_pool3d_backward")),
    Rule("grid_sampler_backward", tuple(getattr(aten, name) for name in (
         "grid_sampler_2d_backward", "grid_sampler_3d_backward", "cudnn_grid_sampler_backward",
         "_grid_sampler_2d_cpu_fallback_backward") if hasattr(aten, name)),
         h.grid_sampler_backward, "passed: the input gradient sums interpolated gradients at "
         "the positions the grid picks", h.grid_sampler_backward,
         _present("grid_sampler_2d_backward", "grid_sampler_3d_backward")),
    Rule("bincount", (aten.bincount,), h.bincount, "floating weights exact (float32 or "
         "float64, as torch)", h.bincount_verdict, _present("bincount")),
    Rule("histogram", (aten.histogram,), h.histogram, "with weight: each bin the correctly "
         "rounded sum of its weights (torch's edges; density normalised as torch)",
         h.histogram_verdict, _present("histogram.bin_ct", "histogram.bins_tensor")),
    Rule("histogram", (aten._histogramdd_from_bin_cts, aten._histogramdd_from_bin_tensors),
         h.histogramdd, "histogramdd with weight: as histogram", h.histogram_verdict,
         _present("_histogramdd_from_bin_cts", "_histogramdd_from_bin_tensors")),
    Rule("coalesce", (aten._coalesce,), h.coalesce, "each repeated coordinate's values "
         "folded once"),
    Rule("coalesce", (aten._to_sparse_csr,), h.to_sparse_csr, "an uncoalesced COO tensor "
         "coalesced exactly, then converted"),
    Rule("coalesce", (aten._to_sparse_csc,), h.to_sparse_csc, "as _to_sparse_csr"),
    Rule("coalesce", (aten._to_sparse,), h.to_sparse, "as _to_sparse_csr (to CSR/CSC)"),
    Rule("coalesce", (aten._to_dense,), h.to_dense, "to_dense of an uncoalesced COO tensor: "
         "coalesced exactly, then converted"),
    Rule("sparse_sum", (aten._sparse_sum,), h.sparse_sum, "torch.sparse.sum over dims of a "
         "COO tensor: each element the correctly rounded sum of its stored values"),
    Rule("segment_reduce", (aten.segment_reduce,), h.segment_reduce,
         '"sum" and "mean" exact (lengths or offsets, any axis, initial); its backward is a '
         "gather", h.segment_reduce_verdict, _present("segment_reduce")),
    Rule("sparse_mm", (aten.mm,), h.mm, "exact when one factor is COO, CSR or CSC: each "
         "product rounded as torch rounds it, their sum rounded once (products='exact': the "
         "exact dot product)"),
    Rule("sparse_mm", (aten.addmm, aten._sparse_addmm), h.addmm,
         "beta * C + alpha * (A @ B) with a sparse factor, one rounding"),
    Rule("sparse_mm", (aten._sparse_mm,), h.sparse_mm, "exact with a sparse factor, as mm"),
    Rule("sparse_mm", (aten.mv,), h.mv, "a COO, CSR or CSC matrix times a vector, as mm"),
    Rule("sparse_mm", (aten.addmv,), h.addmv, "beta * b + alpha * (A @ x) with a sparse A, "
         "one rounding"),
    Rule("sparse_mm", (aten._sparse_mm_reduce_impl,), h.sparse_mm_reduce,
         '"sum" and "mean" exact'),
    Rule("sparse_sampled_addmm", (aten.sparse_sampled_addmm,), h.sampled_addmm,
         "exact (the CSR backward's sampled product)"),
)  # fmt: skip

_BY_PACKET: dict[Any, Rule] = {packet: rule for rule in RULES for packet in rule.ops}
#: functional overload reaching inductor -> its rule (what :func:`bitfold.torch.compile` rewrites)
COMPILED: dict[Any, Rule] = {op: rule for rule in RULES for op in rule.compiled}


def rule_for(func: Any) -> Rule | None:
    """The rule of an ATen overload or overload packet, or None when the op is not a fold."""
    return _BY_PACKET.get(getattr(func, "overloadpacket", func))


def op_name(overload: Any) -> str:
    """The name of the bitfold custom op that stands for ``overload`` in compiled graphs."""
    packet = overload._schema.name.split("::")[-1].lstrip("_")
    suffix = "" if overload._overloadname == "default" else f"_{overload._overloadname}"
    return f"exact_{packet}{suffix}"


__all__ = ["COMPILED", "RULES", "Rule", "op_name", "rule_for"]
