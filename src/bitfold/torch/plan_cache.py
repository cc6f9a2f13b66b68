"""Plans of the index tensors the exact ops meet again: built once, checked on every call.

Every exact fold of the torch adapter (:func:`bitfold.torch.folds.fold_rows`:
the ops under ``exact_mode()``, the custom ops of ``bitfold.torch.compile``,
the drop-ins) is given an index tensor, and ids may change from one call to
the next. A training loop, though, folds by the same edge list or bag ids
every step, and building a plan sorts the index (a device index on its
device: :mod:`bitfold.backends.device_plan`; when plans were built on the
host, an H200 run spent 14 ms of a 15 ms exact-mode step copying the index
there and the plan's arrays back). :class:`PlanCache` keeps the plans of the last few
index tensors, keyed by where their data lives (device, dtype, size, data
pointer) and K, and reuses one only after checking, on every call, that the
index still holds the plan's ids entry for entry:

* an index on a device (CUDA) is compared there (``torch.equal``) with a
  copy kept there: the plan's own int64 index for an int64 index (no extra
  memory), else a copy of the index as given (one read of each);
* a CPU index is compared with the plan's own compact copy
  (:meth:`bitfold.Fold.same_index`, one parallel read, no copy).

An index changed in place by any means (torch ops, a NumPy view, DLPack) is
therefore never folded with a stale plan: its comparison fails and a new plan
is built. The result is the same bits with or without the cache; only the
time differs. Small indices (below :data:`MIN_POSITIONS`) are not cached:
their plans cost less than the check (a small CPU fold does not build a plan
at all: :func:`bitfold.torch.folds.fold_rows`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ..plan import Fold
from .devices import folds_on

#: Indices with fewer positions are planned afresh: a plan of them costs about its check.
MIN_POSITIONS = 1 << 12
#: Plans kept at most, and positions over all of them (the least recently used go first): a
#: plan holds about 10 to 20 bytes a position, so at most a few hundred MB are kept.
MAX_PLANS = 8
MAX_POSITIONS = 1 << 24
#: Keys remembered after one meeting: a plan is kept the second time its key is met, so indices
#: made afresh every call (``torch.unique``'s inverse, a concatenation) do not push kept plans out.
SEEN_KEYS = 64


@dataclass
class _Entry:
    plan: Fold
    device_copy: torch.Tensor | None  # a device index's copy on its device; None on the CPU


class PlanCache:
    """The plans of recently seen index tensors, reused only for an index equal to the plan's."""

    def __init__(self, max_plans: int = MAX_PLANS, max_positions: int = MAX_POSITIONS) -> None:
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._seen: OrderedDict[tuple, None] = OrderedDict()  # keys met once, not yet kept
        self._lock = threading.Lock()
        self.max_plans = max_plans
        self.max_positions = max_positions
        self.hits = 0
        self.misses = 0

    def plan(self, index: torch.Tensor, K: int) -> Fold:
        """A plan of the flat ``index`` into K buckets: a kept one when the index still holds
        its ids, else a new one (kept when its key was met before). Bad indices raise as
        :class:`bitfold.Fold` does."""
        flat = index.detach().reshape(-1)
        n = flat.numel()
        if (
            n < MIN_POSITIONS
            or n > self.max_positions
            or not folds_on(flat.device)
            or flat.dtype.is_floating_point
            or flat.dtype.is_complex
        ):
            return Fold(flat, K)  # planned afresh (and refused there when it is no index)
        key = (str(flat.device), flat.dtype, n, flat.data_ptr(), int(K))
        with self._lock:
            entry = self._entries.get(key)
        if entry is not None and self._matches(entry, flat):
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                self.hits += 1
            return entry.plan
        with self._lock:
            self.misses += 1
            # kept the second time a key is met (one-off indices pass by), or replacing a kept
            # plan whose index changed in place
            again = entry is not None or key in self._seen
            if not again:
                self._seen[key] = None
                while len(self._seen) > SEEN_KEYS:
                    self._seen.popitem(last=False)
        if not again:
            return Fold(flat, K)
        plan, copy = _planned(flat, K)
        with self._lock:
            self._entries[key] = _Entry(plan, copy)
            self._entries.move_to_end(key)
            self._evict()
        return plan

    def clear(self) -> None:
        """Forget every kept plan (and its device copy)."""
        with self._lock:
            self._entries.clear()
            self._seen.clear()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _matches(entry: _Entry, flat: torch.Tensor) -> bool:
        if entry.device_copy is not None:
            return bool(torch.equal(flat, entry.device_copy))
        return entry.plan.same_index(flat.contiguous().numpy())

    def _evict(self) -> None:
        total = sum(e.plan.size for e in self._entries.values())
        while self._entries and (len(self._entries) > self.max_plans or total > self.max_positions):
            _, old = self._entries.popitem(last=False)
            total -= old.plan.size


def _planned(flat: torch.Tensor, K: int) -> tuple[Fold, torch.Tensor | None]:
    """The plan of ``flat`` and what a later index is compared with (None: the plan itself).

    A device index's plan is built on its device from the very ids kept for the
    comparison: an int64 index's are the plan's own int64 copy; another's, a
    copy of it as given.
    """
    if flat.device.type == "cpu":
        return Fold(flat, K), None
    if flat.dtype == torch.int64:
        plan = Fold(flat, K)
        built = plan.device_tensors
        if built is not None and built.device == flat.device:
            return plan, built.index
        return plan, flat.clone()  # pragma: no cover - a device index is always built there
    copy = flat.clone()
    return Fold(copy, K), copy


#: The cache of the torch adapter's exact folds (``bitfold.torch.clear_plan_cache()`` empties it).
PLANS = PlanCache()
