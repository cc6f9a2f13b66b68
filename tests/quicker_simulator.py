"""Quicker runs of the CUDA backend on numba-cuda's simulator: small fills, quick switches.

The simulator runs one Python thread per GPU thread, so a zero fill launched
without a shape (a state's or scratch buffer's first zeroing: one thread per
element) takes most of a run's time. :func:`small_fills` gives such fills a
small launch shape, whose grid-stride loop clears the same elements at a
fraction of the threads. ``tests/cuda_cases.py`` checks the default shape's
fill once; on a GPU nothing calls this.

Each simulated block also has a Python thread that polls its threads until
they end, and with the interpreter's default switch interval (5 ms) it keeps
the lock they wait for: :func:`quick_thread_switches` shortens the interval
(``tests/cuda_cases.py`` on the simulator: 52 -> 43 s) and makes that thread
hand the lock over once a round of its polls (three alternating runs: 38.4-41.5
-> 31.5-37.9 s, 27.4-29.7 -> 20.7-25.8 user-s). None of this changes what a
kernel computes.
"""

from __future__ import annotations

import builtins
import sys
import time
from collections.abc import Callable
from typing import Any

SMALL = (32, 3)  # threads a block, blocks: several blocks and a grid-stride loop
#: seconds between the interpreter's thread switches on the simulator (Python's default: 0.005)
SWITCH_INTERVAL = 0.001


def quick_thread_switches() -> None:
    """Switch between this process's Python threads every :data:`SWITCH_INTERVAL` seconds, and
    let the simulator's block threads run between two rounds of their manager's polls."""
    sys.setswitchinterval(SWITCH_INTERVAL)
    from numba.cuda.simulator import kernel

    kernel.set = _set_after_yielding


def _set_after_yielding(items: Any = ()) -> set[Any]:
    """``set(items)``, after handing the interpreter's lock to any thread waiting for it.

    The simulator's ``BlockManager.run`` polls its block's threads in a loop that
    never waits, and makes a new ``set`` of the live threads once a round: in its
    module this name stands for the builtin, so each round yields once
    (``time.sleep(0)``) instead of holding the lock for a whole switch interval.
    """
    time.sleep(0)
    return builtins.set(items)


def small_fills(launch_zero: Callable[..., None]) -> Callable[..., None]:
    """``launch_zero`` (:func:`bitfold.kernels.cuda.launch_zero`) with ``LaunchShape(*SMALL)``
    where its caller gives no shape."""
    from bitfold.kernels.cuda import LaunchShape

    small = LaunchShape(*SMALL)

    def launch(flat: Any, stream: Any, shape: Any = None) -> None:
        launch_zero(flat, stream, shape or small)

    launch.small_fills = True
    return launch


def quicker_simulator() -> None:
    """In this process: zero fills launched without a shape take ``LaunchShape(*SMALL)``, and
    threads switch quickly (:func:`quick_thread_switches`)."""
    from bitfold.kernels import cuda as kernels

    quick_thread_switches()
    if not getattr(kernels.launch_zero, "small_fills", False):
        kernels.launch_zero = small_fills(kernels.launch_zero)
