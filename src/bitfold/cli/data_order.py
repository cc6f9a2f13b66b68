"""Which examples each step of a data-parallel run trains on; which rank computes each micro-batch.

:class:`DataOrder` gives the global batch of every step: the training set is
shuffled once an epoch by a NumPy generator (or kept in order), cut into
batches of ``batch`` examples, and the incomplete last batch is dropped, so
every step has the same size. Its state (the generator and the current
epoch's order) goes into a checkpoint, so a resumed run sees the same
examples at the same steps.

:func:`deal` splits a step's micro-batches between ranks, round-robin: rank
``r`` of ``W`` computes micro-batches ``r, r + W, r + 2W, ...``. Uneven
shares are allowed, and a rank may get none.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def deal(micro_batches: int, world_size: int, rank: int) -> list[int]:
    """The micro-batches of a step that ``rank`` computes (round-robin)."""
    return list(range(rank, micro_batches, world_size))


def micro_batch_shares(micro_batches: int, world_size: int) -> list[int]:
    """How many of a step's micro-batches each rank computes."""
    return [len(deal(micro_batches, world_size, r)) for r in range(world_size)]


class DataOrder:
    """The examples of every step: a permutation an epoch (``shuffle``) or the data's own order."""

    def __init__(self, n: int, batch: int, seed: int, shuffle: bool = True) -> None:
        if batch > n:
            raise ValueError(f"a batch of {batch} needs at least that many examples; got {n}")
        self.n = n
        self.batch = batch
        self.steps_per_epoch = n // batch
        self.shuffle = shuffle
        self._generator = np.random.default_rng(seed)
        self.epoch = -1
        self.order = np.arange(n, dtype=np.int64)

    def step(self, step: int) -> np.ndarray:
        """The global batch of ``step`` (steps are taken in increasing order)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch < self.epoch:
            raise ValueError(f"step {step} is in epoch {epoch}, before the current {self.epoch}")
        while self.epoch < epoch:
            self.epoch += 1
            if self.shuffle:
                self.order = self._generator.permutation(self.n).astype(np.int64)
        return self.order[k * self.batch : (k + 1) * self.batch]

    def state_dict(self) -> dict[str, Any]:
        """The position: epoch, that epoch's order and the generator's state (plain containers)."""
        import torch

        return {"epoch": self.epoch, "order": torch.from_numpy(self.order.copy()),
                "generator": self._generator.bit_generator.state}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`."""
        self.epoch = int(state["epoch"])
        self.order = state["order"].numpy().astype(np.int64)
        self._generator.bit_generator.state = state["generator"]
