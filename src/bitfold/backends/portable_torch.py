"""The portable exact fold's way out of a ``torch.compile`` graph on the CPU.

Traced into a graph, the portable fold cannot read a flag, so it would make
every path it might take and select one (:func:`bitfold.backends.portable.flags.choose`).
On the CPU nothing waits to read a flag: the graph folds by the shared unit
(inductor fuses its passes), and one custom operator,
``bitfold::portable_exact_unless``, keeps that result unless a flag says the
unit did not serve or a sum is zero (whose sign needs a look at the terms);
then it makes the eager fold (:func:`bitfold.backends.portable.paths.exact_sums`),
which reads its flags and takes the first path that serves. Same bits as the
eager fold. Imported only by a fold of torch tensors (``import bitfold``
loads no torch); the eager fold is handed in by the portable backend's first
eager torch fold (:func:`use_eager_fold`), which ``torch.compile`` needs
before it anyway (it keeps the plan's constants on the device).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import FoldError

_EAGER_FOLD: list[Callable[..., Any]] = []


def use_eager_fold(fold: Callable[..., Any]) -> None:
    """Make ``fold`` (``(values, index, counts, init, K, D, bound, out_dtype) -> (K·D,)``)
    the fold the operator makes where the graph's result does not serve."""
    if not _EAGER_FOLD:
        _EAGER_FOLD.append(fold)


@torch.library.custom_op("bitfold::portable_exact_unless", mutates_args=())
def portable_exact_unless(
    quick: torch.Tensor,
    redo: torch.Tensor,
    values: torch.Tensor,
    index: torch.Tensor,
    counts: torch.Tensor,
    init: torch.Tensor | None,
    K: int,
    D: int,
    bound: int,
    out_dtype: str,
) -> torch.Tensor:
    """``quick`` ((K·D,)) unless the 0-d ``redo`` is set, else
    :func:`bitfold.backends.portable.paths.exact_sums` of the torch CPU tensors."""
    if not bool(redo):
        return quick.clone()
    if not _EAGER_FOLD:
        raise FoldError("fold a plan's values once eagerly before torch.compile folds them")
    return _EAGER_FOLD[0](values, index, counts, init, K, D, bound, out_dtype)


@portable_exact_unless.register_fake
def _(quick, redo, values, index, counts, init, K, D, bound, out_dtype):  # type: ignore[no-untyped-def]
    return torch.empty_like(quick)
