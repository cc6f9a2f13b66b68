"""PyTorch adapter: a gather whose backward is the plan's fold, and a hashed linear layer.

``expand(v, plan)`` is ``v[plan.index]`` in the index's shape (for ``v`` of
shape ``(K,) + trailing``: rows, as in an embedding lookup); its gradient
with respect to ``v`` is ``fold(grad, plan, strategy)``, by default the
*exact* fold: every bucket's exact real sum rounded once (see
:mod:`bitfold.exact`), so training gives the same bits on every run,
thread count and split of the work, where PyTorch's own backward of
``v[idx]`` (``index_put_`` with ``accumulate=True``) adds in whatever order
its threads finish.

Both are ``torch.library.custom_op`` operators (``bitfold::expand`` and
``bitfold::fold``) with registered autograd and fake (meta) implementations,
so they work in eager mode, under ``torch.compile(fullgraph=True)``, with
``torch.use_deterministic_algorithms(True)``, and pass
``torch.library.opcheck``. The plan, a Python object, cannot travel through
an operator: it is registered in a process-wide table under an integer key
on first use (``plan_key(plan)``) and the operators take the key. Plans are
held weakly; a plan lives as long as the caller (or a ``FoldedLinear``)
keeps it.

Numeric contract of the gradient
--------------------------------
The gradient of ``v`` has ``v``'s dtype:

* float32 / float64: ``plan(grad, strategy)``, i.e. with ``exact`` the
  correctly rounded float32 / float64 sum of each bucket;
* float16: the bucket sums rounded once to float16 (``out_dtype=float16``);
* bfloat16: with ``exact``, the exact sum rounded once to bfloat16
  (round-to-nearest-even, 8 significant bits, subnormals down to 2^-133,
  canonical NaN ``0x7FC0``); with ``ordered`` or ``atomic``, the float32
  fold of that strategy rounded to bfloat16.

Devices: CPU tensors fold with the Numba CPU kernels; CUDA tensors fold on
their device and stream with the numba-cuda kernels of :mod:`bitfold.backends.cuda`
(``exact`` gives the same bits as on the CPU; needs ``bitfold[cuda]``; not
yet run on a real GPU by this project). Other devices get a
:class:`bitfold.DeviceError`.
"""

from __future__ import annotations

import itertools
import math
import weakref
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from . import hashing
from .errors import DeviceError, FoldError, FoldTypeError, ShapeError
from .formats import resolve_out_dtype
from .plan import Fold
from .strategies import get_strategy
from .validate import check_expand_input, check_values

__all__ = ["FoldedLinear", "expand", "fold", "plan_key"]

_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_NP_OUT = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}

# -- the plan table -------------------------------------------------------------------------------
_KEYS: weakref.WeakKeyDictionary[Fold, int] = weakref.WeakKeyDictionary()
_PLANS: dict[int, weakref.ReferenceType[Fold]] = {}
_COUNTER = itertools.count(1)


def _forget(key: int) -> None:
    _PLANS.pop(key, None)


@torch.compiler.assume_constant_result
def plan_key(plan: Fold) -> int:
    """The integer key under which the operators find ``plan`` (registered on first use).

    Under ``torch.compile`` this runs at trace time and the key is a
    constant of the graph.
    """
    if not isinstance(plan, Fold):
        raise FoldTypeError(
            f"plan must be a bitfold.Fold; got {type(plan).__module__}.{type(plan).__qualname__}"
        )
    key = _KEYS.get(plan)
    if key is None:
        key = next(_COUNTER)
        _KEYS[plan] = key
        _PLANS[key] = weakref.ref(plan)
        weakref.finalize(plan, _forget, key)
    return key


def _plan(key: int) -> Fold:
    ref = _PLANS.get(key)
    plan = ref() if ref is not None else None
    if plan is None:
        raise FoldError(f"no live bitfold plan has key {key}; keep a reference to the plan")
    return plan


def _index_tensor(key: int, device: torch.device) -> torch.Tensor:
    plan = _plan(key)
    return plan.prepared(
        ("torch-index", str(device)),
        lambda: torch.from_numpy(plan.index.astype(np.int64)).to(device),
    )


# -- checks at the public boundary ----------------------------------------------------------------
def _check_tensor(t: Any, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise FoldTypeError(f"{what} must be a torch.Tensor; got {type(t).__qualname__}")
    if t.dtype not in _FLOATING:
        raise FoldTypeError(
            f"{what} must be floating point (float16, bfloat16, float32, float64); "
            f"got {str(t.dtype).replace('torch.', '')}"
        )
    if t.device.type not in ("cpu", "cuda"):
        raise DeviceError(
            f"{what} is on {t.device}; bitfold.torch folds CPU and CUDA tensors: "
            "use .cpu() or .cuda()"
        )


def _check_strategy(strategy: str) -> str:
    return get_strategy(strategy).name  # unknown names list the valid ones


def _out_dtype(values_dtype: torch.dtype, out_dtype: Any) -> torch.dtype:
    return getattr(torch, resolve_out_dtype(_NP_OUT[values_dtype], out_dtype))


# -- folds ----------------------------------------------------------------------------------------
def _fold_tensor(plan: Fold, g: torch.Tensor, strategy: str, out: torch.dtype) -> torch.Tensor:
    """The fold of ``g`` in dtype ``out`` (module docstring), on ``g``'s device."""
    g = g.detach()
    if out == torch.bfloat16 and strategy != "exact":  # only exact rounds to bfloat16 directly
        return plan(g, strategy).to(torch.bfloat16)
    return plan(g, strategy, out_dtype=_NP_OUT[out])


# -- the operators --------------------------------------------------------------------------------
@torch.library.custom_op("bitfold::expand", mutates_args=())
def _expand_op(v: torch.Tensor, key: int, strategy: str) -> torch.Tensor:
    plan = _plan(key)
    return v[_index_tensor(key, v.device)].reshape(plan.shape + tuple(v.shape[1:]))


@_expand_op.register_fake
def _expand_fake(v: torch.Tensor, key: int, strategy: str) -> torch.Tensor:
    plan = _plan(key)
    trailing = check_expand_input(plan.K, tuple(v.shape))
    return v.new_empty(plan.shape + trailing)


@torch.library.custom_op("bitfold::fold", mutates_args=())
def _fold_op(g: torch.Tensor, key: int, strategy: str, out_dtype: torch.dtype) -> torch.Tensor:
    return _fold_tensor(_plan(key), g, strategy, out_dtype).to(g.device)


@_fold_op.register_fake
def _fold_fake(g: torch.Tensor, key: int, strategy: str, out_dtype: torch.dtype) -> torch.Tensor:
    plan = _plan(key)
    spec = check_values(plan.shape, tuple(g.shape), g.dtype)
    return g.new_empty((plan.K, *spec.trailing), dtype=out_dtype)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.key, ctx.strategy = inputs[1], inputs[2]
    ctx.plan = _plan(inputs[1])  # keeps the plan alive until the backward has run
    ctx.in_dtype = inputs[0].dtype
    ctx.in_shape = tuple(inputs[0].shape)


def _expand_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return _fold_op(grad, ctx.key, ctx.strategy, ctx.in_dtype), None, None


def _fold_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    gv = _expand_op(grad.to(ctx.in_dtype), ctx.key, ctx.strategy).reshape(ctx.in_shape)
    return gv, None, None, None


_expand_op.register_autograd(_expand_backward, setup_context=_setup)
_fold_op.register_autograd(_fold_backward, setup_context=_setup)


# -- public functions -----------------------------------------------------------------------------
def expand(v: torch.Tensor, plan: Fold, strategy: str = "exact") -> torch.Tensor:
    """``v[plan.index]`` in the plan's shape; the gradient of ``v`` is the plan's fold.

    ``v`` is a floating CPU or CUDA tensor of shape ``(plan.K,)``, or
    ``(plan.K,) + trailing`` (a table of rows: the result is
    ``plan.shape + trailing``). The gradient has ``v``'s dtype and follows the
    module docstring's contract (``exact``: correctly rounded, the same bits
    on every run).

    >>> import numpy as np, torch, bitfold, bitfold.torch as bt
    >>> plan = bitfold.Fold(np.array([[0, 1], [1, 1]]), K=2)
    >>> v = torch.tensor([1.0, 2.0], requires_grad=True)
    >>> W = bt.expand(v, plan)
    >>> W.tolist()
    [[1.0, 2.0], [2.0, 2.0]]
    >>> W.sum().backward(); v.grad.tolist()
    [1.0, 3.0]
    """
    key = plan_key(plan)
    _check_tensor(v, "v")
    check_expand_input(plan.K, tuple(v.shape))
    return _expand_op(v, key, _check_strategy(strategy))


def fold(
    values: torch.Tensor, plan: Fold, strategy: str = "exact", *, out_dtype: Any = None
) -> torch.Tensor:
    """The bucket sums of ``values`` as a tensor of shape ``(K,) + trailing``.

    ``values`` have the index's shape or ``(N,)``, followed by a trailing
    (row) shape, as in ``plan(values)``.

    ``out_dtype`` defaults to float32 (float64 for float64 values), as in
    ``plan(values)``; ``torch.bfloat16`` rounds the exact sum once to
    bfloat16. Differentiable: the gradient of ``values`` is the expanded
    output gradient.
    """
    key = plan_key(plan)
    _check_tensor(values, "values")
    check_values(plan.shape, tuple(values.shape), values.dtype)
    return _fold_op(values, key, _check_strategy(strategy), _out_dtype(values.dtype, out_dtype))


# -- the layer ------------------------------------------------------------------------------------
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
        self.strategy = _check_strategy(strategy)
        shape = (out_features, in_features)
        if plan is None:
            plan = Fold(hashing.bucket_map(seed, shape, buckets), buckets)
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
        if dtype not in _FLOATING:
            raise FoldTypeError(
                f"dtype must be floating point (float16, bfloat16, float32, float64); got {dtype}"
            )
        factory = {"device": device, "dtype": dtype}
        self.shared_weight = nn.Parameter(torch.empty(self.buckets, **factory))
        self.bias = nn.Parameter(torch.empty(out_features, **factory)) if bias else None
        sign = None
        if self.signed:
            sign = torch.from_numpy(hashing.sign_map(seed, shape)).to(**factory)
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
        if v.dtype not in _FLOATING:
            raise FoldTypeError(f"shared_weight must be floating point; got {v.dtype}")
        W = self._gather(v)
        return W * self.sign if self.sign is not None else W

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
