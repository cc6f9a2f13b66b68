"""The data and models of ``bitfold train``, shared by its single-process and data-parallel paths.

* :func:`digits_data`: scikit-learn's bundled digits, scaled to [0, 1], on a
  fixed 80/20 split drawn from ``numpy.random.default_rng(seed)``;
* :func:`digits_mlp`: ``layer(64, hidden) -> ReLU -> layer(hidden, 10)``,
  initialised from ``torch.manual_seed(seed)`` (``layer`` is
  :class:`bitfold.torch.FoldedLinear` or a twin of it);
* :func:`hashed_layer`: the hashed layer's model (:mod:`bitfold.cli.hashed_layer_model`) as one
  ``FoldedLinear`` over the hashed layer's own map, with the hashed layer's initial weights.

Both paths build the same model from the same arguments, so a run's
starting point does not depend on how it is trained.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FoldError
from .hashed_layer_model import HashedLayerModel


def digits_data(seed: int) -> dict[str, np.ndarray]:
    """Train and test arrays: ``Xtr``, ``ytr`` (1,437 images) and ``Xte``, ``yte`` (360)."""
    X, y = _digits()
    X = (X / 16.0).astype(np.float32)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = len(y) // 5
    test, train = perm[:n_test], perm[n_test:]
    return {"Xtr": X[train], "ytr": y[train].astype(np.int64), "Xte": X[test],
            "yte": y[test].astype(np.int64)}


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, ``load_digits(return_X_y=True)``: read from the package's CSV
    without importing scikit-learn (0.7 s on every rank of a training), where the file is."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:
        raise FoldError(
            "the digits model needs scikit-learn (pip install 'bitfold[train]' or "
            "pip install scikit-learn); or use --model seed"
        )
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz"
    if not csv.is_file():  # another layout: scikit-learn's own loader
        from sklearn.datasets import load_digits

        return load_digits(return_X_y=True)
    with gzip.open(csv, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def digits_mlp(torch: Any, layer: Any, hidden: int, buckets: int, seed: int,
               **kwargs: Any) -> Any:
    """The digits MLP of two ``layer``s (``FoldedLinear`` or a twin), initialised from ``seed``."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        layer(64, hidden, buckets, seed=seed, **kwargs),
        torch.nn.ReLU(),
        layer(hidden, 10, buckets, seed=seed + 1, **kwargs),
    )


def hashed_layer(torch: Any, layer: Any, spec: HashedLayerModel, **kwargs: Any) -> tuple[Any, Any]:
    """The hashed layer model as one ``layer`` over its map, with ``v0``; and its batch ``X``."""
    from ..plan import Fold

    idx = spec.index().reshape(spec.D, spec.hid)  # the hashed layer's map, W = v[idx] (D x hid)
    plan = Fold(np.ascontiguousarray(idx.T), spec.K)  # FoldedLinear holds W.T: (hid, D)
    model = layer(spec.D, spec.hid, spec.K, bias=False, plan=plan, **kwargs)
    v0, X0 = spec.start()
    with torch.no_grad():
        model.shared_weight.copy_(torch.from_numpy(v0))
    return model, torch.from_numpy(X0)
