"""The ``bitfold::exact_<op>`` ops that stand for ATen's folds in compiled graphs, called directly.

Each gives the bits of ``exact_mode()``'s fold of the same ATen call, as a
new contiguous tensor sharing no memory with an input (what the ops' fake
implementations tell inductor), whether the mode's lane for the overload
takes the call (a small CPU fold; ``_unsafe_index_put`` takes ``index_put``'s)
or the rule's handler does (``alpha``).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import bitfold.torch as bt  # noqa: E402
from bitfold.torch.aten_ops import EXACT_OPS  # noqa: E402

aten = torch.ops.aten


def _wide(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values over 2^(+-30): sums that round, and differ with the order of their terms."""
    g = torch.Generator().manual_seed(sum(shape))
    scale = torch.exp2(torch.randint(-30, 30, shape, generator=g).to(torch.float64))
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(dtype)


def _ids(n: int, K: int) -> torch.Tensor:
    return torch.randint(0, K, (n,), generator=torch.Generator().manual_seed(n + K))


CALLS = {
    "index_put, accumulate": (aten.index_put.default,
                              lambda: (_wide(16, 8), [_ids(60, 16)], _wide(60, 8), True)),
    "_unsafe_index_put, accumulate": (aten._unsafe_index_put.default,
                                      lambda: (_wide(16, 8), [_ids(60, 16)], _wide(60, 8), True)),
    "index_add": (aten.index_add.default, lambda: (_wide(16, 8), 0, _ids(60, 16), _wide(60, 8))),
    "index_add, alpha=2": (aten.index_add.default,
                           lambda: (_wide(16, 8), 0, _ids(60, 16), _wide(60, 8), 2)),
    "embedding_dense_backward": (aten.embedding_dense_backward.default,
                                 lambda: (_wide(4, 15, 8), _ids(60, 16).view(4, 15), 16, -1,
                                          False)),
}  # fmt: skip


def _exact_mode_result(overload, args):
    """The same ATen call under ``exact_mode()``."""
    x, *rest = args
    with bt.exact_mode():
        if overload is aten.index_add.default and len(rest) == 4:
            return overload(x, *rest[:3], alpha=rest[3])
        return overload(x, *rest)


@pytest.mark.parametrize("name", list(CALLS))
def test_an_exact_op_gives_exact_modes_bits_in_a_new_tensor(name):
    overload, make = CALLS[name]
    args = make()
    got = EXACT_OPS[overload](*args)
    want = _exact_mode_result(overload, args)
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), name
    assert got.is_contiguous()
    inputs = [t for a in args for t in (a if isinstance(a, list) else [a])]
    for t in inputs:
        if isinstance(t, torch.Tensor):
            assert got.untyped_storage().data_ptr() != t.untyped_storage().data_ptr()
