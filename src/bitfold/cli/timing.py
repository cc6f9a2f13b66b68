"""Small timing and memory helpers shared by the probe and the benchmarks."""

from __future__ import annotations

import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Timing:
    """First-call time (includes compilation), and the median of later calls, in seconds."""

    first_s: float
    median_s: float
    repeats: int

    @property
    def compile_s(self) -> float:
        """First call minus a typical call: roughly the one-time compile cost."""
        return max(0.0, self.first_s - self.median_s)


def time_call(
    fn: Callable[[], Any], repeats: int = 7, sync: Callable[[], None] | None = None
) -> Timing:
    """Time ``fn``: once cold, then ``repeats`` times; report the median of the latter."""
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    first = time.perf_counter() - t0
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        samples.append(time.perf_counter() - t0)
    return Timing(first, statistics.median(samples), repeats)


def machine_load() -> float | None:
    """The one-minute load average (runnable processes; compare with the cores), or None
    where the system does not report one."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run ``fn`` and return its result and the peak of NumPy/Python allocations during it."""
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was_tracing:
            tracemalloc.stop()
    return result, int(max(peak, 0))
