"""Quicker runs of the CUDA backend on numba-cuda's simulator: small fills, blocks as greenlets.

The simulator runs one Python thread per GPU thread, so a zero fill launched
without a shape (a state's or scratch buffer's first zeroing: one thread per
element) takes most of a run's time. :func:`small_fills` gives such fills a
small launch shape, whose grid-stride loop clears the same elements at a
fraction of the threads. ``tests/cuda_cases.py`` checks the default shape's
fill once; on a GPU nothing calls this.

The simulator starts an operating-system thread for every simulated thread,
and one more thread a block polls them until they end or all wait at a
barrier. :func:`blocks_as_greenlets` runs a block's simulated threads as
greenlets in the launching thread instead: each runs until it ends or reaches
``syncthreads()`` (there it hands control back), and once every live one has
done so, those waiting resume: the barrier rule of the simulator's own block
manager (a barrier releases when every thread still alive has reached it), in
a fixed order. Each simulated thread keeps its ``threadIdx``, ``blockIdx``,
lane and barrier reductions; an exception in one is raised naming its thread
and block, as the simulator does. No kernel computes anything else; only the
interleaving between two barriers changes, which a correct kernel does not
depend on (and the simulator's threads never gave any particular one).
``tests/cuda_cases.py`` on the simulator, two alternating runs each: 56.9 and
60.2 s with a thread per simulated thread, 23.6 and 17.5 s as greenlets (the
same 117 cases passed).
``tests/test_quicker_simulator.py`` checks the barrier, the indices, lanes and
barrier counts, threads that end before a barrier, the error, and that one
operating-system thread runs them all.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable
from typing import Any

SMALL = (32, 3)  # threads a block, blocks: several blocks and a grid-stride loop

_current = threading.local()  # .thread: the simulated thread running here, if any


class _Threading(types.ModuleType):
    """The ``threading`` module as the simulator's kernel API sees it: ``current_thread()``
    is the simulated thread running on this thread, when there is one."""

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)

    @staticmethod
    def current_thread() -> Any:
        simulated = getattr(_current, "thread", None)
        return threading.current_thread() if simulated is None else simulated


class _SimulatedThread:
    """One simulated GPU thread of a block: its indices, and a greenlet that runs the kernel
    (the attributes the simulator's kernel API reads of its own thread objects)."""

    def __init__(self, manager: Any, block: tuple[int, ...], thread: tuple[int, ...],
                 run: Callable[[], None]) -> None:  # fmt: skip
        import greenlet
        from numba.cuda.simulator.kernelapi import Dim3

        self._manager = manager
        self.blockIdx = Dim3(*block)
        self.threadIdx = Dim3(*thread)
        x, y, _ = manager._block_dim
        self.thread_id = self.threadIdx.x + x * (self.threadIdx.y + y * self.threadIdx.z)
        self.exception: tuple[BaseException, Any] | None = None
        self.greenlet = greenlet.greenlet(run)

    def syncthreads(self) -> None:
        self.greenlet.parent.switch()  # back to the block's loop, until every thread is here


def _run_block(manager: Any, grid_point: tuple[int, ...], *args: Any) -> None:
    """``BlockManager.run``: the block's threads as greenlets, barrier by barrier."""
    import numpy as np

    def kernel() -> None:
        me = _current.thread
        try:
            manager._f(*args)
        except Exception as e:  # as the simulator's threads report it
            where = f"tid={list(me.threadIdx)} ctaid={list(me.blockIdx)}"
            me.exception = (type(e)(f"{where}: {e}" if str(e) else where), sys.exc_info()[2])

    live = [_SimulatedThread(manager, grid_point, point, kernel)
            for point in np.ndindex(*manager._block_dim)]  # fmt: skip
    outer = getattr(_current, "thread", None)
    try:
        while live:  # each round: every live thread runs to its next barrier or its end
            waiting = []
            for t in live:
                _current.thread = t
                t.greenlet.switch()
                if t.exception is not None:
                    raise t.exception[0].with_traceback(t.exception[1])
                if not t.greenlet.dead:
                    waiting.append(t)
            live = waiting
    finally:
        _current.thread = outer


def blocks_as_greenlets() -> None:
    """In this process, the simulator runs each block's threads as greenlets
    (:func:`_run_block`), not as one operating-system thread each. A block manager in debug
    mode keeps the simulator's threads."""
    from numba.cuda.simulator import kernel, kernelapi

    if getattr(kernel.BlockManager.run, "as_greenlets", False):
        return
    threads_run = kernel.BlockManager.run

    def run(self: Any, grid_point: tuple[int, ...], *args: Any) -> None:
        if self._debug:
            return threads_run(self, grid_point, *args)
        return _run_block(self, grid_point, *args)

    run.as_greenlets = True  # type: ignore[attr-defined]
    for name in ("syncthreads_count", "syncthreads_and", "syncthreads_or"):
        setattr(_SimulatedThread, name, getattr(kernel.BlockThread, name))
    kernelapi.threading = _Threading("threading")
    kernel.BlockManager.run = run


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
    blocks run as greenlets (:func:`blocks_as_greenlets`)."""
    from bitfold.kernels import cuda as kernels

    blocks_as_greenlets()
    if not getattr(kernels.launch_zero, "small_fills", False):
        kernels.launch_zero = small_fills(kernels.launch_zero)
