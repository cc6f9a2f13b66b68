"""The portable backend: exact folds written once in the array library's own operations.

It folds torch tensors on any device (CPU, CUDA, ROCm, MPS, XPU), CuPy arrays
and JAX arrays on any backend (and NumPy arrays, when asked), with nothing
but the operations of their array family (:mod:`bitfold.arrays`): integer
views of float bits, shifts and masks, integer scatter-adds and maxima,
gathers, ``where``, reductions and a conditional; where libraries differ
(whether a flag is read without waiting, eager folds taken in chunks), the
family says so in a capability. There is no switch on the library: the same
lines run everywhere, so the CPU tests prove the code that runs on a device.

Integer addition is associative and commutative, so an integer scatter-add
gives the same bits in any order, atomics included. The modules, each with
one job, lower ones first:

* :mod:`.digits`: every value split into integer digits, scatter-added into
  a table, carried and rounded once with integer operations (any values,
  any span; also what :mod:`bitfold.jax_psum` sums across devices);
* :mod:`.terms` and :mod:`.flags`: what the one-word paths share (the
  values' bits, order-free scatters, chunks), and one of two paths by a
  flag without a host wait;
* :mod:`.narrow` and :mod:`.shared_unit`: the one-word paths, each term one
  int64 word of its element's unit or of one unit for the whole fold;
* :mod:`.paths`: the choice between them, first that serves
  (:func:`~.paths.exact_sums`), and the fold of traced ids without a plan
  (:func:`~.paths.segment_fold`);
* :mod:`.checks`: the families, dtypes and options taken;
  :mod:`.plan_constants`: what a plan gives the device, once per device;
* :mod:`.states`: the accumulator's int64 states beside the values;
* :mod:`.backend`: the folds (``exact``, ``ordered``, ``atomic``), the
  route and the registry's entry (:data:`BACKEND`).

Numeric contract: the host's (:mod:`bitfold.exact`). ``exact`` returns the
correctly rounded sum of every bucket, the same bits as the host path and
the Fraction oracle, on every device; NaN results are the canonical NaN of
:data:`bitfold.formats.FLOATS`. Nothing waits for the device inside a fold
(no ``.item()``, no shape that depends on the data): a torch fold traces with
fake tensors to ATen ops and compiles with ``torch.compile(fullgraph=True)``;
a JAX fold runs under ``jit``, ``grad`` and ``vmap``.
"""

from __future__ import annotations

from .backend import BACKEND, NAME

__all__ = ["BACKEND", "NAME"]
