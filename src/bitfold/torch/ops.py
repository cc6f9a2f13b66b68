"""The operators of the PyTorch adapter: the plan table and ``torch.library`` custom ops.

Two families of ``torch.library.custom_op`` operators live here, each with a
fake (meta) implementation and a registered autograd formula, so that they
work in eager mode, under ``torch.compile(fullgraph=True)``, with
``torch.use_deterministic_algorithms(True)``, and pass
``torch.library.opcheck``:

* over a static plan: ``bitfold::expand`` (``v[plan.index]``) and
  ``bitfold::fold`` (the plan's fold), each the other's gradient. The plan, a
  Python object, cannot travel through an operator: it is registered in a
  process-wide table under an integer key on first use (``plan_key(plan)``)
  and the operators take the key. Plans are held weakly; a plan lives as long
  as the caller (or a ``FoldedLinear``) keeps it.
* over an index tensor that may change every call (a batch of token ids, the
  edges of a graph): ``bitfold::embedding`` (rows ``weight[indices]``, whose
  gradient is the exact fold), ``bitfold::segment_sum`` (the exact fold,
  whose gradient is the gather), ``bitfold::index_add`` and
  ``bitfold::scatter_add``. Each call builds its plan (O(N + K)); the
  arithmetic is :mod:`bitfold.torch.folds`.

Numeric contract of the plan's gradient
---------------------------------------
The gradient of ``v`` in ``expand(v, plan)`` has ``v``'s dtype:

* float32 / float64: ``plan(grad, strategy)``, i.e. with ``exact`` the
  correctly rounded float32 / float64 sum of each bucket;
* float16: the bucket sums rounded once to float16 (``out_dtype=float16``);
* bfloat16: with ``exact``, the exact sum rounded once to bfloat16
  (round-to-nearest-even, 8 significant bits, subnormals down to 2^-133,
  canonical NaN ``0x7FC0``); with ``ordered`` or ``atomic``, the float32
  fold of that strategy rounded to bfloat16.

Devices: a tensor folds on its device by the backend of highest priority
that serves it (:func:`bitfold.torch.devices.folds_on` says whether one
does): CPU tensors with the Numba CPU kernels; CUDA tensors on their device
with the GPU kernels (numba-cuda's need ``bitfold[cuda]``), or else the
portable path; tensors on other devices (MPS, XPU, ...) with the portable
path. ``exact`` gives the same bits everywhere. A device without data
(``meta``) or without a serving backend gets a :class:`bitfold.DeviceError`.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from ..backends import device_plan
from ..errors import FoldError, FoldTypeError, IndexRangeError
from ..formats import resolve_out_dtype
from ..plan import Fold
from ..strategies import get_strategy
from ..validate import check_expand_input, check_has_data, check_values, checked_options, type_label
from . import folds
from .devices import check_device
from .folds import FLOATING, NAMES

# -- the plan table -------------------------------------------------------------------------------
_KEYS: weakref.WeakKeyDictionary[Fold, int] = weakref.WeakKeyDictionary()
_PLANS: dict[int, weakref.ReferenceType[Fold]] = {}
_COUNTER = itertools.count(1)


def _forget(key: int) -> None:
    _PLANS.pop(key, None)


def _constant_under_compile(fn: Any) -> Any:
    """``torch.compiler.assume_constant_result(fn)`` without importing Dynamo (about a second of
    start-up in every process that imports this module): the same mark, set on ``fn``."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_under_compile
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
    """The plan's int64 index on ``device``: its one torch copy there (device_plan.index_tensor)."""
    return device_plan.index_tensor(_plan(key), device)


# -- checks at the public boundary ----------------------------------------------------------------
def check_tensor(t: Any, what: str) -> None:
    """Refuse anything but a floating tensor on a device bitfold folds on, naming ``what``.

    The device is judged by :func:`bitfold.torch.devices.check_device`: ``meta``,
    or a device no registered backend serves, is a :class:`bitfold.DeviceError`.
    """
    if not isinstance(t, torch.Tensor):
        raise FoldTypeError(
            f"{what} must be a torch.Tensor; got a {type_label(t)} (convert it with "
            "torch.as_tensor, or use the function of its own library: bitfold.jax for JAX)"
        )
    check_has_data(t, what)  # meta first: named as a device without data, whatever its dtype
    if t.dtype not in FLOATING:
        raise FoldTypeError(
            f"{what} must be floating point (float16, bfloat16, float32, float64); "
            f"got {str(t.dtype).replace('torch.', '')}"
        )
    check_device(t, what)


def check_strategy(strategy: str) -> str:
    """The strategy's registered name, or a refusal that lists the valid ones."""
    return get_strategy(strategy).name  # unknown names list the valid ones


def _out_dtype(values_dtype: torch.dtype, out_dtype: Any) -> torch.dtype:
    return getattr(torch, resolve_out_dtype(NAMES[values_dtype], out_dtype))


# -- folds ----------------------------------------------------------------------------------------
def _fold_tensor(plan: Fold, g: torch.Tensor, strategy: str, out: torch.dtype) -> torch.Tensor:
    """The fold of ``g`` in dtype ``out`` (module docstring), on ``g``'s device."""
    g = g.detach()
    if out == torch.bfloat16 and strategy != "exact":  # only exact rounds to bfloat16 directly
        return plan(g, strategy).to(torch.bfloat16)
    return plan(g, strategy, out_dtype=NAMES[out])


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
@checked_options
def expand(v: torch.Tensor, plan: Fold, strategy: str = "exact") -> torch.Tensor:
    """``v[plan.index]`` in the plan's shape; the gradient of ``v`` is the plan's fold.

    ``v`` is a floating tensor (CPU, CUDA, or another served device) of shape ``(plan.K,)``, or
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
    check_tensor(v, "v")
    check_expand_input(plan.K, tuple(v.shape))
    return _expand_op(v, key, check_strategy(strategy))


@checked_options
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
    check_tensor(values, "values")
    check_values(plan.shape, tuple(values.shape), values.dtype)
    return _fold_op(values, key, check_strategy(strategy), _out_dtype(values.dtype, out_dtype))


# -- operators over an index tensor ---------------------------------------------------------------
# The index arrives as a tensor at every call (ids change every step); each call builds its plan.
# Fake implementations give the output's shape, dtype and (contiguous) layout without the data.
@torch.library.custom_op("bitfold::embedding", mutates_args=())
def _embedding_op(
    weight: torch.Tensor, indices: torch.Tensor, padding_idx: int, scale_grad_by_freq: bool
) -> torch.Tensor:
    rows = f"weight.shape[0] = {weight.shape[0]}"  # the bound as the caller knows it
    folds.check_range(indices, weight.shape[0], rows, name="input")  # bitfold's error, not torch's
    rows = weight.index_select(0, indices.reshape(-1))
    return rows.reshape((*indices.shape, *weight.shape[1:]))


@_embedding_op.register_fake
def _embedding_fake(
    weight: torch.Tensor, indices: torch.Tensor, padding_idx: int, scale_grad_by_freq: bool
) -> torch.Tensor:
    return weight.new_empty((*indices.shape, *weight.shape[1:]))


@torch.library.custom_op("bitfold::segment_sum", mutates_args=())
def _segment_sum_op(values: torch.Tensor, index: torch.Tensor, K: int) -> torch.Tensor:
    return folds.fold_rows(index, values, K)


@_segment_sum_op.register_fake
def _segment_sum_fake(values: torch.Tensor, index: torch.Tensor, K: int) -> torch.Tensor:
    return values.new_empty((K, *values.shape[1:]))


@torch.library.custom_op("bitfold::index_add", mutates_args=())
def _index_add_op(
    input: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, alpha: float
) -> torch.Tensor:
    return folds.index_add(input, dim, index, source, alpha)


@_index_add_op.register_fake
def _index_add_fake(
    input: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, alpha: float
) -> torch.Tensor:
    return torch.empty_like(input, memory_format=torch.contiguous_format)


@torch.library.custom_op("bitfold::scatter_add", mutates_args=())
def _scatter_add_op(
    input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor
) -> torch.Tensor:
    try:
        return folds.scatter_add(input, dim, index, src)
    except IndexRangeError:  # an id out of range: named below in the caller's words, one error
        pass
    size = input.shape[dim]
    folds.check_range(index, size, f"input.shape[{dim}] = {size}")  # the first bad entry, as given
    raise AssertionError("unreachable: check_range raises for the id folds.scatter_add refused")


@_scatter_add_op.register_fake
def _scatter_add_fake(
    input: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor
) -> torch.Tensor:
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _setup_embedding(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    weight, indices, ctx.padding_idx, ctx.scale = inputs
    ctx.num_weights = weight.shape[0]
    ctx.save_for_backward(indices)


def _embedding_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (indices,) = ctx.saved_tensors
    ids = indices.reshape(-1)
    rows = grad.reshape((ids.numel(), *grad.shape[indices.dim() :]))
    terms = folds.embedding_terms(rows, ids, ctx.num_weights, ctx.padding_idx, ctx.scale)
    return _segment_sum_op(terms, ids, ctx.num_weights), None, None, None


def _setup_segment_sum(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(inputs[1])


def _segment_sum_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (index,) = ctx.saved_tensors
    return _embedding_op(grad, index, -1, False), None, None


def _setup_add(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.dim = inputs[1]
    ctx.alpha = inputs[4] if len(inputs) > 4 else 1.0
    ctx.src_shape = tuple(inputs[3].shape)
    ctx.save_for_backward(inputs[2])


def _index_add_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (index,) = ctx.saved_tensors
    d = ctx.dim % grad.dim()
    rows = _embedding_op(grad.movedim(d, 0), index.reshape(-1), -1, False).movedim(0, d)
    if ctx.alpha != 1:
        rows = rows * ctx.alpha
    return grad, None, None, rows.reshape(ctx.src_shape), None


def _scatter_add_backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    (index,) = ctx.saved_tensors
    taken = grad.gather(ctx.dim, index)
    if tuple(taken.shape) != ctx.src_shape:  # an index smaller than src: the rest gets zeros
        pad = [
            p
            for i, s in zip(reversed(taken.shape), reversed(ctx.src_shape), strict=True)
            for p in (0, s - i)
        ]
        taken = torch.nn.functional.pad(taken, pad)
    return grad, None, None, taken


_embedding_op.register_autograd(_embedding_backward, setup_context=_setup_embedding)
_segment_sum_op.register_autograd(_segment_sum_backward, setup_context=_setup_segment_sum)
_index_add_op.register_autograd(_index_add_backward, setup_context=_setup_add)
_scatter_add_op.register_autograd(_scatter_add_backward, setup_context=_setup_add)

#: the operators over an index tensor, for the functions and layers above this module
embedding_op = _embedding_op
segment_sum_op = _segment_sum_op
index_add_op = _index_add_op
scatter_add_op = _scatter_add_op

__all__ = [
    "check_strategy",
    "check_tensor",
    "embedding_op",
    "expand",
    "fold",
    "index_add_op",
    "plan_key",
    "scatter_add_op",
    "segment_sum_op",
]
