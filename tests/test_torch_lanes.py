"""The lanes of ``exact_mode`` (small CPU folds taken before any argument is bound) give the
bits of the ops' rules, take the calls they are for, and leave every other call to the rule."""

from __future__ import annotations

import pytest

import bitfold

torch = pytest.importorskip("torch", reason="PyTorch is not installed (the 'torch' extra)")
bt = pytest.importorskip("bitfold.torch", reason="bitfold.torch needs PyTorch")
from bitfold.torch import handlers, mode  # noqa: E402  (after the importorskip above)

aten = torch.ops.aten


def _t(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 2.0 ** torch.randint(-30, 30, shape, generator=g)
            ).to(dtype)  # fmt: skip


IDX = torch.tensor([3, 0, 3, -1, 2, 3, 0])
POS = torch.tensor([3, 0, 3, 4, 2, 3, 0])
CASES = {
    # name: (op, args, kwargs, a lane takes it)
    "index_add_": (aten.index_add_.default, (_t(5, 3), 0, POS, _t(7, 3, seed=1)), {}, True),
    "index_add": (aten.index_add.default, (_t(5, 3), 0, POS, _t(7, 3, seed=1)), {}, True),
    "index_add_ float64": (aten.index_add_.default, (_t(5, 3, dtype=torch.float64), 0, POS,
                           _t(7, 3, seed=1, dtype=torch.float64)), {}, True),
    "index_add_ alpha": (aten.index_add_.default, (_t(5, 3), 0, POS, _t(7, 3, seed=1)),
                         {"alpha": 3}, False),
    "index_add_ dim 1": (aten.index_add_.default, (_t(3, 5), 1, POS, _t(3, 7, seed=1)), {},
                         False),
    "index_add_ float16": (aten.index_add_.default, (_t(5, 3, dtype=torch.float16), 0, POS,
                           _t(7, 3, seed=1, dtype=torch.float16)), {}, False),
    "index_put_": (aten.index_put_.default, (_t(5, 3), (IDX,), _t(7, 3, seed=2), True), {}, True),
    "index_put": (aten.index_put.default, (_t(5, 3), (IDX,), _t(7, 3, seed=2), True), {}, True),
    "_index_put_impl_ two ids": (aten._index_put_impl_.default, (_t(5, 2, 3), (IDX, POS % 2),
                                 _t(7, 3, seed=3), True, False), {}, True),
    "index_put_ broadcast": (aten.index_put_.default, (_t(5, 3), (IDX,), _t(3, seed=2), True),
                             {}, False),
    "index_put_ slice": (aten.index_put_.default, (_t(5, 3), (None, POS % 3), _t(5, 7, seed=2),
                         True), {}, False),
    "embedding backward": (aten.embedding_dense_backward.default, (_t(2, 7, 3, seed=4),
                           torch.stack([POS, POS.flip(0)]), 6, -1, False), {}, True),
    "embedding backward padded": (aten.embedding_dense_backward.default,
                                  (_t(7, 3, seed=4), POS, 6, 3, False), {}, False),
    "embedding backward scaled": (aten.embedding_dense_backward.default,
                                  (_t(7, 3, seed=4), POS, 6, -1, True), {}, False),
}  # fmt: skip


def _run(op, args, kwargs):
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    with bt.exact_mode() as m:
        out = op(*args, **kwargs)
    return out.clone(), dict(m.counts)


@pytest.mark.parametrize("name", list(CASES))
def test_a_lane_gives_the_rules_bits_and_counts(name, monkeypatch):
    op, args, kwargs, laned = CASES[name]
    taken = []
    lane = handlers.LANES[op]
    monkeypatch.setitem(mode.LANES, op, lambda *a: taken.append(lane(*a)) or taken[-1])
    got, counts = _run(op, args, kwargs)
    assert (taken[0] is not None) == laned  # the lane took the calls it is for, and only those
    monkeypatch.delitem(mode.LANES, op)
    want, want_counts = _run(op, args, kwargs)
    bits = {torch.float16: torch.int16, torch.float32: torch.int32, torch.float64: torch.int64}
    assert torch.equal(got.view(bits[got.dtype]), want.view(bits[want.dtype]))
    assert counts == want_counts and sum(counts.values()) == 1


def test_a_lane_leaves_an_id_out_of_range_to_the_rule():
    with bt.exact_mode(), pytest.raises(bitfold.IndexRangeError, match=r"= 9 .*shape\[0\] = 5"):
        torch.zeros(5, 3).index_add_(0, torch.tensor([0, 9]), torch.ones(2, 3))
