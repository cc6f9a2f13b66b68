"""Small zero fills on numba-cuda's simulator, for the runs of the CUDA backend there.

The simulator runs one Python thread per GPU thread, so a zero fill launched
without a shape (a state's or scratch buffer's first zeroing: one thread per
element) takes most of a run's time. :func:`small_fills` gives such fills a
small launch shape, whose grid-stride loop clears the same elements at a
fraction of the threads. ``tests/cuda_cases.py`` checks the default shape's
fill once; on a GPU nothing calls this.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SMALL = (32, 3)  # threads a block, blocks: several blocks and a grid-stride loop


def small_fills(launch_zero: Callable[..., None]) -> Callable[..., None]:
    """``launch_zero`` (:func:`bitfold.kernels.cuda.launch_zero`) with ``LaunchShape(*SMALL)``
    where its caller gives no shape."""
    from bitfold.kernels.cuda import LaunchShape

    small = LaunchShape(*SMALL)

    def launch(flat: Any, stream: Any, shape: Any = None) -> None:
        launch_zero(flat, stream, shape or small)

    launch.small_fills = True
    return launch


def use_small_zero_fills() -> None:
    """Zero fills launched without a shape take ``LaunchShape(*SMALL)`` in this process."""
    from bitfold.kernels import cuda as kernels

    if not getattr(kernels.launch_zero, "small_fills", False):
        kernels.launch_zero = small_fills(kernels.launch_zero)
