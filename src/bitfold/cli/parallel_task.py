"""What a data-parallel ``bitfold train`` run trains: model, examples, micro-batch loss, readout.

The loss of a micro-batch is *summed* over its examples, and the step's
gradient is the sum over every micro-batch divided by the global batch
(``GradientSum.reduce(mean_over=batch)``): the gradient's definition does not
depend on how the micro-batches are spread over processes.

* ``digits``: the MLP of :func:`bitfold.cli.train_models.digits_mlp`
  (``FoldedLinear`` layers, exact folds), cross-entropy, a new shuffle of
  the 1,437 training images every epoch; readout: mean training loss and
  test accuracy of the final model.
* ``seed``: the hashed layer's one ``FoldedLinear`` (:func:`bitfold.cli.train_models.hashed_layer`)
  on its fixed batch of 128 rows, in order; loss ``sum((relu(XW) - 1)^2) / 2``
  a micro-batch (the hashed layer's loss times the batch); readout: the hashed layer's loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .data_order import DataOrder
from .hashed_layer_model import HashedLayerModel
from .train_models import digits_data, digits_mlp, hashed_layer


@dataclass
class Task:
    """A model, its examples and how to score them."""

    model: Any
    order: DataOrder
    loss: Any  # loss(examples: int64 tensor) -> summed loss of those examples
    readout: Any  # readout() -> {"final_loss": float, "test_accuracy": float | None}


def build(torch: Any, config: dict[str, Any]) -> Task:
    """The task of ``config`` (``model``, ``seed``, ``batch`` and the model's sizes)."""
    from ..torch import FoldedLinear

    seed = int(config["seed"])
    if config["model"] == "digits":
        data = digits_data(seed)
        model = digits_mlp(torch, FoldedLinear, config["hidden"], config["buckets"], seed)
        X, y = torch.from_numpy(data["Xtr"]), torch.from_numpy(data["ytr"])
        Xte = torch.from_numpy(data["Xte"])
        ce = torch.nn.functional.cross_entropy

        def loss(ex: Any) -> Any:
            return ce(model(X[ex]), y[ex], reduction="sum")

        def readout() -> dict[str, Any]:
            with torch.no_grad():
                train_loss = float(ce(model(X), y))
                pred = model(Xte).argmax(dim=1).numpy()
            return {"final_loss": train_loss, "test_accuracy": float(np.mean(pred == data["yte"]))}

        order = DataOrder(len(y), config["batch"], seed + 1, shuffle=True)
        return Task(model, order, loss, readout)

    spec = HashedLayerModel(lr=config["lr"], seed=seed)
    model, Xs = hashed_layer(torch, FoldedLinear, spec)

    def seed_loss(ex: Any) -> Any:
        return ((torch.relu(model(Xs[ex])) - 1.0) ** 2).sum() / 2

    def seed_readout() -> dict[str, Any]:
        with torch.no_grad():
            return {"final_loss": float(spec.loss(torch.relu(model(Xs)))), "test_accuracy": None}

    order = DataOrder(spec.batch, config["batch"], seed, shuffle=False)
    return Task(model, order, seed_loss, seed_readout)
