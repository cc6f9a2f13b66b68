"""PyTorch adapter: exact folds as torch operators, drop-in functions and modules, and a mode.

Every sum here is *exact*: each output element is the correctly rounded sum
of its terms (and of its old value, where the op adds into one), one
rounding, so the bits do not depend on the order of the contributions,
the thread count or the device, where torch's scatter-adds add in whatever
order their threads or atomics finish.

* ``exact_mode()`` (:mod:`bitfold.torch.mode`): a context manager (Python
  kernels for the fold ops alone) inside which every fold that reaches
  ATen — ``scatter_add``, ``index_add``, ``index_put(accumulate=True)``
  (the backward of ``x[idx]``), the embedding-bag forward and the embedding and embedding-bag
  backwards, ``scatter_reduce`` and ``segment_reduce`` sum/mean, weighted
  ``bincount`` and histograms, max-pooling gradients, products with a sparse
  COO/CSR/CSC factor, and the sums of ``torch_scatter``, ``torch_sparse`` and
  ``pyg_lib`` ops — is exact, in the forward and the backward;
  ``mode.counts`` says what it saw.
* ``compile(model, **kwargs)`` (:mod:`bitfold.torch.compiled`):
  ``torch.compile`` whose folds reaching inductor, forward and backward, are
  rewritten into exact custom ops by a post-grad graph pass; the same bits
  as the eager exact folds, at compiled speed. The table both read is
  :mod:`bitfold.torch.rules`.
* Drop-ins with torch's signatures (:mod:`bitfold.torch.functional`,
  :mod:`bitfold.torch.layers`): ``index_add``, ``scatter_add``,
  ``segment_sum``, ``embedding``, ``embedding_bag``, and the modules
  ``Embedding`` and ``EmbeddingBag`` (subclasses of torch's, same state
  dicts). Differentiable; ``torch.compile`` keeps them whole.
* Plans of the index tensors these folds meet again are kept
  (:mod:`bitfold.torch.plan_cache`) and reused after a check, on every call,
  that the index still holds their ids; ``clear_plan_cache()`` forgets them.
* Over a static plan (:mod:`bitfold.torch.ops`): ``expand(v, plan)``
  (``v[plan.index]``, whose gradient is the plan's fold), ``fold(values,
  plan)`` and the hashed layer ``FoldedLinear``.

The operators are ``torch.library`` custom ops (``bitfold::expand``,
``bitfold::fold``, ``bitfold::embedding``, ``bitfold::segment_sum``,
``bitfold::index_add``, ``bitfold::scatter_add``) with fake implementations
and autograd, so they work in eager mode, under
``torch.compile(fullgraph=True)``, with
``torch.use_deterministic_algorithms(True)``, and pass
``torch.library.opcheck``. CPU tensors fold with the Numba CPU kernels,
CUDA tensors on their device, tensors on other devices (MPS, XPU, ...) by
the portable path: whichever registered backend serves the device
(:func:`bitfold.torch.devices.folds_on`). A device without data (``meta``)
or without a serving backend gets a :class:`bitfold.DeviceError`.

>>> import numpy as np, torch, bitfold, bitfold.torch as bt
>>> plan = bitfold.Fold(np.array([[0, 1], [1, 1]]), K=2)
>>> v = torch.tensor([1.0, 2.0], requires_grad=True)
>>> W = bt.expand(v, plan)
>>> W.sum().backward(); v.grad.tolist()
[1.0, 3.0]
>>> table = torch.zeros(3, 2, requires_grad=True)
>>> with bt.exact_mode() as mode:
...     torch.nn.functional.embedding(torch.tensor([2, 0, 2]), table).sum().backward()
>>> table.grad.tolist(), mode.counts["embedding_dense_backward"]
([[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]], 1)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..validate import checked_options
from .functional import embedding, embedding_bag, index_add, scatter_add, segment_sum
from .layers import Embedding, EmbeddingBag, FoldedLinear
from .mode import ExactMode, exact_mode
from .ops import expand, fold, plan_key
from .plan_cache import PLANS as _PLANS

if TYPE_CHECKING:
    from .compiled import compile


def __getattr__(name: str) -> Any:
    """``compile`` on first use: its graph pass loads torch's compiler (Dynamo and Inductor,
    about a second of start-up), which a process that only folds or sums gradients never needs."""
    if name == "compile":
        from .compiled import compile

        return compile
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@checked_options
def clear_plan_cache() -> None:
    """Forget the plans kept for index tensors met again (:mod:`bitfold.torch.plan_cache`)."""
    _PLANS.clear()


__all__ = [
    "Embedding",
    "EmbeddingBag",
    "ExactMode",
    "FoldedLinear",
    "clear_plan_cache",
    "compile",
    "embedding",
    "embedding_bag",
    "exact_mode",
    "expand",
    "fold",
    "index_add",
    "plan_key",
    "scatter_add",
    "segment_sum",
]
