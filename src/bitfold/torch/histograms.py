"""Weighted histograms, exact: ``torch.histogram`` and ``torch.histogramdd`` with ``weight``.

A weighted histogram is a fold: each element's weight is added into the bin
its coordinates fall in. ATen's CPU kernel adds them per thread and sums the
threads' histograms, so its bits depend on the thread count and on the order
of the elements. Here every bin is the **correctly rounded sum of the weights
of its elements**, in the input's dtype, one rounding: the same bits for any
order of the elements.

The bins are ATen's own. The edges are the ones torch returns (computed by
torch from a bin count and a range, or given as tensors), and an element falls
in bin ``j`` of a dimension when ``edges[j] <= x < edges[j + 1]``, the last bin
including its right edge; an element outside ``[edges[0], edges[-1]]`` in any
dimension, or NaN, falls in no bin and its weight is not added. That is what
ATen's kernel computes (its linear estimate of the bin is corrected against
the edges). With ``density=True`` the exact histogram is then normalised by
the operations torch uses: divided by its sum, then by each bin's width.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .folds import fold_rows


def bin_of(
    coords: torch.Tensor, edges: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the flat bin of each row of ``coords`` (M, D), whether the row falls in a bin at all).

    Flat bins count in row-major order over the D dimensions' bins; a row
    outside the edges of any dimension (or NaN there) falls in none.
    """
    rows = coords.shape[0]
    flat = torch.zeros(rows, dtype=torch.int64, device=coords.device)
    inside = torch.ones(rows, dtype=torch.bool, device=coords.device)
    for d, e in enumerate(edges):
        x = coords[:, d].contiguous()
        e = e.contiguous()
        inside &= (x >= e[0]) & (x <= e[-1])
        count = e.numel() - 1
        pos = torch.searchsorted(e, x, right=True) - 1
        flat = flat * count + pos.clamp(0, count - 1)
    return flat, inside


def weighted_histogram(
    coords: torch.Tensor, edges: Sequence[torch.Tensor], weight: torch.Tensor, density: bool
) -> torch.Tensor:
    """The histogram of the rows of ``coords`` (M, D) over ``edges`` (D tensors), weighted, exact.

    Each bin is the correctly rounded sum of the ``weight`` (M values, the
    dtype of ``coords``) of the rows in it (module docstring); the result has
    one dimension of ``len(e) - 1`` bins per edge tensor.
    """
    shape = [e.numel() - 1 for e in edges]
    flat, inside = bin_of(coords, edges)
    weight = weight.reshape(-1)
    if not bool(inside.all()):
        flat, weight = flat[inside], weight[inside]
    hist = fold_rows(flat, weight, math.prod(shape)).view(shape)
    if density:  # torch's normalisation, step for step
        hist.div_(hist.sum().item())
        for d, e in enumerate(edges):
            widths = [1] * len(shape)
            widths[d] = shape[d]
            hist.div_(e.diff().reshape(widths))
    return hist


__all__ = ["bin_of", "weighted_histogram"]
