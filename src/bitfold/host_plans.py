"""Plans of host index arrays met again: kept, and reused only after an entry-for-entry check.

A training step folds by the same ids every call (an edge list, bag ids),
and a plan of them sorts the index: building one per call costs more than
the fold it serves. :class:`HostPlans` keeps the plans of the last few
index arrays and hands one out again only when the array given *now* holds
its ids entry for entry (:meth:`bitfold.Fold.same_index`: one parallel read
of the index, no copy), whatever buffer the ids lie in: a buffer reused for
other ids, or ids changed in place, are never folded with a stale plan.
The result is the same bits with or without the cache; only the time
differs. This is the idea of :mod:`bitfold.torch.plan_cache` for NumPy
arrays (an XLA buffer read by :mod:`bitfold.xla_host_call`, concrete JAX
ids), without a framework: ``bitfold.jax.segment_sum`` keeps its plans here.

Small indices (below :data:`MIN_POSITIONS`) are planned afresh: their plans
cost about their check. At most :data:`MAX_PLANS` plans and
:data:`MAX_POSITIONS` positions over all of them are kept, the least
recently used going first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from .plan import Fold

#: Indices with fewer positions are planned afresh: a plan of them costs about its check.
MIN_POSITIONS = 1 << 12
#: Plans kept at most, and positions over all of them (a plan holds about 10 to 20 bytes a
#: position and the outputs it reuses: at most a few hundred MB are kept).
MAX_PLANS = 8
MAX_POSITIONS = 1 << 24
#: Positions compared first, spread over the index: most other ids differ in one of them, and
#: are told apart without reading the whole index (a plan is reused only after a full check).
PROBES = 64


class HostPlans:
    """The plans of recently seen host index arrays, reused only for an index equal to the
    plan's, entry for entry."""

    def __init__(self, max_plans: int = MAX_PLANS, max_positions: int = MAX_POSITIONS) -> None:
        self._plans: OrderedDict[int, Fold] = OrderedDict()  # id(plan) -> plan, oldest first
        self._lock = threading.Lock()
        self.max_plans = max_plans
        self.max_positions = max_positions
        self.hits = 0
        self.misses = 0

    def plan(self, index: Any, K: int) -> Fold:
        """A plan of the flat host ``index`` into K buckets: a kept one whose ids are the
        index's, entry for entry, else a new one (then kept). Bad ids raise as
        :class:`bitfold.Fold` does (:class:`bitfold.IndexRangeError`, ...), before anything is
        kept."""
        flat = np.asarray(index).reshape(-1)
        n = flat.size
        if n < MIN_POSITIONS or n > self.max_positions or flat.dtype.kind not in "iu":
            return Fold(flat, K)  # planned afresh (and refused there when it is no index)
        with self._lock:
            candidates = [p for p in reversed(self._plans.values()) if p.K == K and p.size == n]
        probes = np.linspace(0, n - 1, min(n, PROBES)).astype(np.int64)
        for plan in candidates:
            if np.array_equal(flat[probes], plan.index[probes]) and plan.same_index(flat):
                with self._lock:
                    if id(plan) in self._plans:
                        self._plans.move_to_end(id(plan))
                    self.hits += 1
                return plan
        plan = Fold(flat, K)
        with self._lock:
            self.misses += 1
            self._plans[id(plan)] = plan
            self._evict()
        return plan

    def clear(self) -> None:
        """Forget every kept plan."""
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)

    def _evict(self) -> None:
        total = sum(p.size for p in self._plans.values())
        while self._plans and (len(self._plans) > self.max_plans or total > self.max_positions):
            _, old = self._plans.popitem(last=False)
            total -= old.size
