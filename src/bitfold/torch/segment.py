"""``torch.segment_reduce`` "sum" and "mean", exact: the fold of consecutive segments.

``segment_reduce(data, reduce, lengths=... | offsets=..., axis=a,
initial=...)`` cuts ``data`` along ``axis`` into consecutive segments (one
set of segments for each index of the dimensions before ``axis``: ``lengths``
has shape ``data.shape[:axis] + (S,)``, ``offsets`` ``data.shape[:axis] +
(S + 1,)``) and reduces each. It is the aggregation torch_geometric runs
when deterministic algorithms are on. Numeric contract:

* "sum": each output element is the **correctly rounded sum of ``initial``
  (when given, rounded to the dtype as torch reads it) and the segment's
  elements**, one rounding; an empty segment gives ``initial``, or ``+0.0``.
* "mean": that correctly rounded sum divided once by the segment's length
  (the rule of every exact mean in :mod:`bitfold.torch.mode`); an empty
  segment gives ``initial``, or NaN (the canonical ``0x7FC00000`` pattern in
  float32) without one, as torch does.

The backward of both (``_segment_reduce_backward``) gathers the output
gradient, divided by the length for "mean": elementwise, no sum, the same
bits in any order; ATen's stays.
"""

from __future__ import annotations

import math

import torch

from .folds import divide_by_counts, fold_rows


def _offsets(lengths: torch.Tensor | None, offsets: torch.Tensor | None) -> torch.Tensor:
    """Offsets ``(B, S + 1)`` from ``lengths`` ``(..., S)`` or ``offsets`` ``(..., S + 1)``."""
    if offsets is not None:
        return offsets.to(torch.int64).reshape(-1, offsets.shape[-1])
    assert lengths is not None
    lens = lengths.to(torch.int64).reshape(-1, lengths.shape[-1])
    return torch.nn.functional.pad(lens.cumsum(1), (1, 0))


def problem(
    data: torch.Tensor,
    lengths: torch.Tensor | None,
    offsets: torch.Tensor | None,
    axis: int,
    unsafe: bool,
) -> str | None:
    """What torch would refuse in this ``segment_reduce`` (None: nothing); the mode then lets it."""
    if (lengths is None) == (offsets is None):
        return "exactly one of lengths and offsets"
    given = lengths if lengths is not None else offsets
    assert given is not None
    if data.dim() == 0 or not 0 <= axis < data.dim():
        return f"axis {axis} for a tensor of {data.dim()} dimensions"
    if given.dim() != axis + 1 or tuple(given.shape[:axis]) != tuple(data.shape[:axis]):
        return "lengths/offsets must have shape data.shape[:axis] + (segments,)"
    if given.dtype.is_floating_point or given.dtype.is_complex or given.dtype == torch.bool:
        return "lengths/offsets must be integers"
    if unsafe:
        return None
    bounds = _offsets(lengths, offsets)
    if bounds.numel() and bool(
        (bounds[:, 1:] < bounds[:, :-1]).any() or (bounds[:, 0] != 0).any()
        or (bounds[:, -1] != data.shape[axis]).any()
    ):  # fmt: skip
        return "segments must cover data along axis"
    return None


def segment_reduce(
    data: torch.Tensor,
    reduce: str,
    lengths: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    axis: int = 0,
    initial: float | None = None,
) -> torch.Tensor:
    """``torch.segment_reduce`` with reduce "sum" or "mean", exact (module docstring).

    The caller checks the arguments (:func:`problem`); elements past the last
    segment (possible with ``unsafe=True``) belong to no segment.
    """
    bounds = _offsets(lengths, offsets)
    B, S = bounds.shape[0], bounds.shape[1] - 1
    lead = tuple(data.shape[:axis])
    trailing = tuple(data.shape[axis + 1 :])
    out_shape = (*lead, S, *trailing)
    if B * S == 0:
        return data.new_zeros(out_shape)
    A = data.shape[axis]
    rows = data.detach().reshape(B, A, math.prod(trailing))
    positions = torch.arange(A, device=data.device, dtype=torch.int64).expand(B, A).contiguous()
    seg = torch.searchsorted(bounds.to(data.device).contiguous(), positions, right=True) - 1
    inside = (seg >= 0) & (seg < S)
    ids = (torch.arange(B, device=data.device).view(B, 1) * S + seg)[inside]
    init = None
    if initial is not None:
        init = data.new_full((B * S, rows.shape[2]), float(initial))
    summed = fold_rows(ids, rows[inside], B * S, init=init, out_dtype=data.dtype)
    if reduce == "mean":
        counts = bounds.diff(dim=1).reshape(B * S, 1).to(data.device)
        empty = initial if initial is not None else math.nan
        divided = divide_by_counts(summed, counts.clamp(min=1))
        summed = torch.where(counts > 0, divided, torch.full_like(summed, empty))
    return summed.reshape(out_shape)


__all__ = ["problem", "segment_reduce"]
