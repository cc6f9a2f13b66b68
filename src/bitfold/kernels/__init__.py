"""Compiled kernels: ``ieee`` (the arithmetic, once), ``cpu`` (Numba) and ``cuda`` (numba-cuda).

Kernels know nothing about plans, accumulators or frameworks: they take flat
arrays and the format facts of :mod:`bitfold.formats`. ``cuda`` is imported
only when a GPU fold is asked for. A kernel's first compilation in a process
says so on stderr (:mod:`bitfold.kernels.compiling`, registered here, before
any kernel can compile).
"""

from . import compiling as compiling
