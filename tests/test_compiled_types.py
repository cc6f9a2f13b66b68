"""A kernel compiles once for a read-only and a writable array of one dtype.

Numba compiles a kernel for every distinct tuple of argument types, and a
read-only array is a type apart from a writable one (as a literal ``False`` is
apart from a ``bool``): a caller's writable ids and a read-only copy of them
would each cost a compilation of several seconds. The planning kernels take
their inputs read-only whatever the caller's flag
(:func:`bitfold.kernels.compiling.read_only`), so both give one signature.
"""

from __future__ import annotations

import numpy as np
from numba import types

import bitfold
from bitfold.kernels import planning


def _as_one_type(t):
    t = types.unliteral(t)
    return t.copy(readonly=False) if isinstance(t, types.Array) else t


def _same_but_for_flags(kernel) -> list[list[str]]:
    """Groups of the kernel's signatures that differ only in writability or literal-ness."""
    groups: dict[tuple, list[str]] = {}
    for sig in kernel.signatures:
        groups.setdefault(tuple(map(_as_one_type, sig)), []).append(str(sig))
    return [g for g in groups.values() if len(g) > 1]


def test_read_only_and_writable_ids_take_one_compiled_plan_kernel():
    rng = np.random.default_rng(5)
    K = 1 << 21  # past 2^16 buckets and more than the positions: the radix sort, in two passes
    ids = rng.integers(0, K, 3000)
    vals = rng.standard_normal(3000).astype(np.float32)
    assert planning.prefer_radix(ids.size, K) and planning.radix_passes(K) == 2
    results = []
    for writable in (True, False):
        held = ids.copy()
        held.flags.writeable = writable
        plan = bitfold.Fold(held, K)
        assert plan.order.shape == ids.shape  # the stable order: the radix sort's passes
        results.append(plan(vals).view(np.uint32))
        results.append(bitfold.segment_sum(vals, held, K).view(np.uint32))  # one pass: check
    assert all(np.array_equal(r, results[0]) for r in results)
    for kernel in (planning._digit_counts_chunks, planning._digit_place_chunks,
                   planning._scan_chunk):  # fmt: skip
        assert kernel.signatures, kernel
        assert _same_but_for_flags(kernel) == [], kernel
