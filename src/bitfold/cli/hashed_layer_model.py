"""The hashed layer experiment's model and its one training loop (``bitfold probe``, ``train``).

The model of the hashed layer experiment that bitfold grew from (described on the
documentation's Concepts page, "The hashed layer experiment"; the user's script is not part of
the repository):
K shared parameters ``v``, a static map ``idx`` (D x hid, uniform in
[0, K)), the weight ``W = v[idx]``, one fixed random batch ``X`` (batch x D),
``h = relu(X @ W)`` and the loss ``sum((h - 1)^2) / (2 batch)``, trained
with Adam. Every input comes from ``numpy.random.default_rng(seed)``: the map
is the first draw of one generator (:meth:`HashedLayerModel.index`; for seed 0 the
original script's own draw), ``v`` and ``X`` the first draws of a second one
(:meth:`HashedLayerModel.start`).

:func:`train` is the one loop: each step asks a *gradient* function for the
gradient of the loss with respect to ``v`` and an *update* for the new ``v``.

* :func:`folded_gradient`: the backward written out, ``W``'s gradient folded
  into ``v`` by a bitfold strategy (NumPy arrays, or torch tensors on a GPU);
* :func:`autograd_gradient`: PyTorch's autograd of ``v[idx]``, whose backward
  is PyTorch's own fold (``index_put_`` with ``accumulate=True``);
* :class:`HashedLayerAdam`: the hashed layer's Adam formula, the same for NumPy and torch;
  ``bitfold train --model seed`` passes ``torch.optim.Adam``'s step instead,
  with the gradient of a :class:`bitfold.torch.FoldedLinear`.

No framework is imported here: torch is only used through the tensors a
caller passes in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

#: ``gradient(v, X) -> dL/dv`` and ``update(v, gradient, t) -> new v`` (``t`` counts from 1).
Gradient = Callable[[Any, Any], Any]
Update = Callable[[Any, Any, int], Any]

#: The original script's number of optimiser steps.
HASHED_LAYER_STEPS = 200


@dataclass(frozen=True)
class HashedLayerModel:
    """The hashed layer model's sizes, learning rate and seed (the original script's defaults)."""

    D: int = 768
    hid: int = 4096
    K: int = 433
    batch: int = 128
    lr: float = 1e-3
    seed: int = 0

    def index(self, rng: np.random.Generator | None = None) -> np.ndarray:
        """The map ``idx``, flat (``D * hid`` int64, row-major D x hid), drawn from ``rng``.

        By default a new ``default_rng(seed)``; ``bitfold probe`` passes its own
        generator and draws its test gradient from it next.
        """
        rng = np.random.default_rng(self.seed) if rng is None else rng
        return rng.integers(0, self.K, self.D * self.hid)

    def start(self) -> tuple[np.ndarray, np.ndarray]:
        """The initial ``v`` (K float32, normal(0, 0.05)) and the batch ``X`` (batch x D)."""
        r = np.random.default_rng(self.seed)
        v = r.normal(0, 0.05, self.K).astype(np.float32)
        X = r.normal(size=(self.batch, self.D)).astype(np.float32)
        return v, X

    def loss(self, h: Any) -> Any:
        """``sum((h - 1)^2) / (2 batch)`` for the hidden activations ``h``."""
        return ((h - 1.0) ** 2).sum() / (2 * self.batch)


def _is_numpy(x: Any) -> bool:
    return isinstance(x, np.ndarray | np.generic)


def _relu(x: Any) -> Any:
    return np.maximum(x, 0) if _is_numpy(x) else x.relu()


def _sqrt(x: Any) -> Any:
    return np.sqrt(x) if _is_numpy(x) else x.sqrt()


def _zeros_like(x: Any) -> Any:
    return np.zeros_like(x) if _is_numpy(x) else x.new_zeros(x.shape)


def folded_gradient(model: HashedLayerModel, plan: Any, strategy: str, idx: Any) -> Gradient:
    """The backward written out; ``W``'s gradient is folded by ``plan(gW, strategy)``.

    ``plan`` is a :class:`bitfold.plan.Fold` of the flat map and ``idx`` that
    map as an array of the same library and device as ``v`` (a NumPy array,
    or a torch tensor on the GPU).
    """
    D, hid, batch = model.D, model.hid, model.batch

    def gradient(v: Any, X: Any) -> Any:
        W = v[idx].reshape(D, hid)
        h = _relu(X @ W)
        d = (h - 1.0) / batch
        gW = X.T @ (d * (h > 0))
        return plan(gW.reshape(-1), strategy)  # the flat map: gW read in C order

    return gradient


def autograd_gradient(model: HashedLayerModel, idx: Any) -> Gradient:
    """PyTorch's gradient of the loss through ``v[idx]`` (``idx`` a tensor on ``v``'s device)."""
    D, hid = model.D, model.hid

    def gradient(v: Any, X: Any) -> Any:
        import torch  # v is a torch tensor: torch is loaded

        v = v.detach().requires_grad_()
        h = torch.relu(X @ v[idx].reshape(D, hid))
        (grad,) = torch.autograd.grad(model.loss(h), v)
        return grad

    return gradient


class HashedLayerAdam:
    """The Adam step (beta1 0.9, beta2 0.999, eps 1e-8), one formula for NumPy and torch."""

    def __init__(self, lr: float) -> None:
        self.lr = lr
        self.m: Any = None
        self.vv: Any = None

    def __call__(self, v: Any, g: Any, t: int) -> Any:
        if self.m is None:
            self.m, self.vv = _zeros_like(v), _zeros_like(v)
        self.m = 0.9 * self.m + 0.1 * g
        self.vv = 0.999 * self.vv + 0.001 * g * g
        m_hat = self.m / (1 - 0.9**t)
        return v - self.lr * m_hat / (_sqrt(self.vv / (1 - 0.999**t)) + 1e-8)


def train(
    v: Any,
    X: Any,
    steps: int,
    gradient: Gradient,
    update: Update,
    tick: Callable[[], None] | None = None,
) -> Any:
    """``steps`` optimiser steps from ``v`` on the batch ``X``; returns the final ``v``.

    Step ``t`` (from 1) is ``v = update(v, gradient(v, X), t)``, then ``tick()``.
    """
    for t in range(1, steps + 1):
        v = update(v, gradient(v, X), t)
        if tick is not None:
            tick()
    return v
