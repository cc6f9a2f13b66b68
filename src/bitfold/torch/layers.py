"""Layers: ``FoldedLinear`` (hashed) and drop-ins for ``nn.Embedding`` and ``nn.EmbeddingBag``.

``Embedding`` and ``EmbeddingBag`` subclass torch's modules: the same
constructor arguments, ``from_pretrained``, attributes, initialisation and
state dicts (``weight``), interchangeable with torch's both ways. Only the
arithmetic of the sums changes: the weight gradient is the exact fold
(:func:`bitfold.torch.embedding`, :func:`bitfold.torch.embedding_bag`), the
same bits for any order of the ids, and ``EmbeddingBag``'s bag sums are
correctly rounded too. Arguments whose sums bitfold does not make are
refused when the module is built: ``sparse=True`` (a sparse gradient sums
its duplicates when coalesced) and ``EmbeddingBag(mode="max")`` (use torch's
``nn.EmbeddingBag`` under :func:`bitfold.torch.exact_mode`, whose max
gradient is exact).
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import FoldError, FoldTypeError, ShapeError
from ..hashing import bucket_map, sign_map
from ..plan import Fold
from ..validate import check_K, checked_options, refuse_unknown_options, type_label
from .folds import FLOATING
from .functional import BAG_MODES, embedding, embedding_bag, refuse_sparse
from .ops import check_strategy, expand


# -- FoldedLinear ---------------------------------------------------------------------------------
class FoldedLinear(nn.Module):
    """A HashedNets-style linear layer: ``out_features * in_features`` weights share ``buckets``.

    The weight is ``W[i, j] = s[i, j] * shared_weight[h[i, j]]`` (shape
    ``(out_features, in_features)``, as in ``nn.Linear``) and the output is
    ``x @ W.T + bias``. The bucket map ``h`` and, with ``signed=True``, the
    sign map ``s`` (else ``s = 1``) come from :mod:`bitfold.hashing`:
    ``h[i, j] = bucket_map(seed, (out, in), buckets)[i, j]`` and
    ``s[i, j] = sign_map(seed, (out, in))[i, j]``, a fixed integer hash of
    ``(seed, i, j)``, never a framework's random generator, so the same
    arguments give the same maps on every device, platform and version.

    The gradient of ``shared_weight`` is the plan's fold of ``s * dW``
    (``strategy``, by default ``exact``: correctly rounded, the same bits on
    every run). ``shared_weight`` and ``bias`` are initialised like
    ``nn.Linear``'s (uniform in ``±1/sqrt(in_features)``, from torch's
    generator), so each weight has ``nn.Linear``'s initial distribution.

    ``plan=`` replaces the hashed map with any ``Fold`` of shape
    ``(out_features, in_features)`` and ``K = buckets`` (e.g. k-means weight
    sharing). The state dict holds ``shared_weight`` and ``bias``; the maps
    are rebuilt from the constructor's arguments.
    """

    @checked_options
    def __init__(
        self,
        in_features: int,
        out_features: int,
        buckets: int,
        bias: bool = True,
        seed: int = 0,
        signed: bool = False,
        strategy: str = "exact",
        *,
        plan: Fold | None = None,
        device: Any = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, val in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise FoldError(f"{name} must be a positive integer; got {val!r}")
        self.in_features = in_features
        self.out_features = out_features
        self.seed = seed
        self.signed = bool(signed)
        self.strategy = check_strategy(strategy)
        shape = (out_features, in_features)
        buckets = check_K(buckets, "buckets")
        if plan is None:
            plan = Fold(bucket_map(seed, shape, buckets), buckets)
        elif not isinstance(plan, Fold):
            raise FoldTypeError(f"plan must be a bitfold.Fold; got {type(plan).__qualname__}")
        elif plan.shape != shape or plan.K != buckets:
            raise ShapeError(
                f"the plan (index shape {plan.shape}, K = {plan.K}) does not fit this layer: "
                f"it needs index shape (out_features, in_features) = {shape} and K = buckets = "
                f"{buckets}"
            )
        self.plan = plan
        self.buckets = plan.K
        dtype = torch.get_default_dtype() if dtype is None else dtype
        if dtype not in FLOATING:
            raise FoldTypeError(
                f"dtype must be floating point (float16, bfloat16, float32, float64); got {dtype}"
            )
        factory = {"device": device, "dtype": dtype}
        self.shared_weight = nn.Parameter(torch.empty(self.buckets, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        sign = None
        if self.signed:
            sign = torch.from_numpy(sign_map(seed, shape)).to(**factory)
        self.register_buffer("sign", sign, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """``nn.Linear``'s initialisation: uniform in ``±1/sqrt(in_features)``."""
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.shared_weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def _gather(self, v: torch.Tensor) -> torch.Tensor:
        return expand(v, self.plan, self.strategy)

    @property
    def weight(self) -> torch.Tensor:
        """The expanded ``(out_features, in_features)`` weight (differentiable)."""
        v = self.shared_weight
        if v.dtype not in FLOATING:
            raise FoldTypeError(f"shared_weight must be floating point; got {v.dtype}")
        W = self._gather(v)
        return W * self.sign if self.sign is not None else W

    @checked_options
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ weight.T + bias`` for ``x`` of shape ``(..., in_features)``."""
        if not isinstance(x, torch.Tensor):
            raise FoldTypeError(f"FoldedLinear takes a torch.Tensor; got a {type_label(x)}")
        if x.shape[-1:] != (self.in_features,):
            raise ShapeError(
                f"FoldedLinear expects inputs of shape (..., {self.in_features}); "
                f"got {tuple(x.shape)}"
            )
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"buckets={self.buckets}, bias={self.bias is not None}, seed={self.seed}, "
            f"signed={self.signed}, strategy={self.strategy!r}"
        )


# -- embeddings -----------------------------------------------------------------------------------
class Embedding(nn.Embedding):
    """``nn.Embedding`` whose weight gradient is the exact fold.

    Same constructor, ``from_pretrained``, attributes and state dict as
    ``torch.nn.Embedding`` (``isinstance(layer, nn.Embedding)`` holds). The
    forward is :func:`bitfold.torch.embedding`: the lookup is torch's; row k
    of the weight gradient is the correctly rounded sum of the output
    gradient's rows at id k (divided by the id's frequency first with
    ``scale_grad_by_freq``), ``+0.0`` for ``padding_idx``: the same bits for
    any order of the ids in the batch. ``max_norm`` is supported as in
    torch; ``sparse=True`` is refused.

    >>> import torch, bitfold.torch as bt
    >>> emb = bt.Embedding(10, 3, padding_idx=0)
    >>> emb(torch.tensor([[1, 0, 4]])).shape
    torch.Size([1, 3, 3])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *args: Any, **kwargs: Any) -> None:
        sizes = {"num_embeddings": num_embeddings, "embedding_dim": embedding_dim}
        _check_arguments("Embedding()", nn.Embedding.__init__, sizes, args, kwargs)
        super().__init__(num_embeddings, embedding_dim, *args, **kwargs)
        refuse_sparse(self.sparse, "Embedding")

    @checked_options
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The rows ``weight[input]`` (:func:`bitfold.torch.embedding`)."""
        refuse_sparse(self.sparse, "Embedding")
        return embedding(
            input, self.weight, self.padding_idx, self.max_norm, self.norm_type,
            self.scale_grad_by_freq,
        )  # fmt: skip


class EmbeddingBag(nn.EmbeddingBag):
    """``nn.EmbeddingBag`` (modes "sum" and "mean") with exact bag sums and weight gradient.

    Same constructor, ``from_pretrained``, attributes and state dict as
    ``torch.nn.EmbeddingBag``; ``forward(input, offsets=None,
    per_sample_weights=None)`` as torch's (bags from a 2-D input or from
    ``offsets``, ``include_last_offset``, ``padding_idx``,
    ``per_sample_weights`` with mode "sum", ``max_norm``). Each bag's output
    is the correctly rounded sum of its (weighted) rows, divided once by its
    size for "mean"; the weight gradient is the exact fold
    (:func:`bitfold.torch.embedding_bag`). ``mode="max"`` and
    ``sparse=True`` are refused.

    >>> import torch, bitfold.torch as bt
    >>> bag = bt.EmbeddingBag(10, 3, mode="sum")
    >>> bag(torch.tensor([1, 2, 4, 5]), torch.tensor([0, 2])).shape
    torch.Size([2, 3])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *args: Any, **kwargs: Any) -> None:
        sizes = {"num_embeddings": num_embeddings, "embedding_dim": embedding_dim}
        _check_arguments("EmbeddingBag()", nn.EmbeddingBag.__init__, sizes, args, kwargs)
        super().__init__(num_embeddings, embedding_dim, *args, **kwargs)
        self._check_arguments()

    def _check_arguments(self) -> None:
        refuse_sparse(self.sparse, "EmbeddingBag")
        if self.mode not in BAG_MODES:
            raise FoldError(
                f"EmbeddingBag mode {self.mode!r} is not supported: bitfold's EmbeddingBag sums "
                "(modes 'sum' and 'mean'); for 'max', keep torch.nn.EmbeddingBag and train under "
                "bitfold.torch.exact_mode(), which makes its gradient exact"
            )

    @checked_options
    def forward(
        self,
        input: torch.Tensor,
        offsets: torch.Tensor | None = None,
        per_sample_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The bag sums or means (:func:`bitfold.torch.embedding_bag`)."""
        self._check_arguments()
        return embedding_bag(
            input, self.weight, offsets, self.max_norm, self.norm_type,
            self.scale_grad_by_freq, self.mode, self.sparse, per_sample_weights,
            self.include_last_offset, self.padding_idx,
        )  # fmt: skip


def _check_arguments(
    call: str, init: Any, sizes: dict[str, Any], args: tuple, kwargs: dict[str, Any]
) -> None:
    """Refuse a keyword, or more positional arguments, than torch's ``init`` takes after
    ``num_embeddings`` and ``embedding_dim``, and sizes that are no integers >= 0, before the
    module is built: a bitfold error where torch raises a bare ``TypeError`` or
    ``RuntimeError``."""
    params = list(inspect.signature(init).parameters)[3:]  # self, num_embeddings, embedding_dim
    refuse_unknown_options(call, kwargs, ("num_embeddings", "embedding_dim", *params))
    for name in ("num_embeddings", "embedding_dim"):
        size = sizes[name]
        if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 0:
            raise FoldError(f"{call[:-2]}'s {name} must be an integer >= 0; got {size!r}")
    if len(args) > len(params):
        raise FoldTypeError(
            f"{call} takes at most {len(params) + 2} positional arguments (num_embeddings, "
            f"embedding_dim, {', '.join(params)}); got {len(args) + 2}"
        )


__all__ = ["Embedding", "EmbeddingBag", "FoldedLinear"]
