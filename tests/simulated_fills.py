"""Small zero fills on numba-cuda's simulator, for scripts that run the CUDA backend there.

The simulator runs one Python thread per GPU thread, so a zero fill launched
without a shape (a state's or scratch buffer's first zeroing: one thread per
element) takes most of a run's time. :func:`use_small_zero_fills` makes such
fills take a small launch shape, whose grid-stride loop clears the same
elements at a fraction of the threads. ``tests/cuda_cases.py`` checks the
default shape's fill once; on a GPU nothing calls this.
"""

from __future__ import annotations

SMALL = (32, 3)  # threads a block, blocks: several blocks and a grid-stride loop


def use_small_zero_fills() -> None:
    """Zero fills launched without a shape take ``LaunchShape(*SMALL)`` in this process."""
    from bitfold.kernels import cuda as kernels

    real = kernels.launch_zero
    if getattr(real, "small_fills", False):
        return
    small = kernels.LaunchShape(*SMALL)

    def launch_zero(flat, stream, shape=None):
        real(flat, stream, shape or small)

    launch_zero.small_fills = True
    kernels.launch_zero = launch_zero
