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
    "index_put_ scalars two ids": (aten._index_put_impl_.default, (_t(5, 2, 1), (IDX, POS % 2),
                                   _t(7, 1, seed=3), True, False), {}, True),
    # a strided target is written by the rule (a reshape of it would be a copy)
    "_index_put_impl_ two ids, strided target": (aten._index_put_impl_.default,
                                                 (_t(2, 5, 3).transpose(0, 1), (IDX, POS % 2),
                                                  _t(7, 3, seed=3), True, False), {}, False),
    "index_put_ strided target": (aten.index_put_.default, (_t(3, 5).t(), (IDX,), _t(7, 3, seed=2),
                                  True), {}, False),
    "index_add_ strided target": (aten.index_add_.default, (_t(3, 5).t(), 0, POS,
                                  _t(7, 3, seed=1)), {}, False),
    "index_put strided input": (aten.index_put.default, (_t(3, 5).t(), (IDX,), _t(7, 3, seed=2),
                                True), {}, True),
    "index_add_ 1-d": (aten.index_add_.default, (_t(5), 0, POS, _t(7, seed=1)), {}, True),
    "embedding backward of negative zeros": (aten.embedding_dense_backward.default,
                                             (-torch.zeros(7, 3), POS, 6, -1, False), {}, True),
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


@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case[3] and n.startswith(
    ("index_add_", "index_put_", "_index_put_impl_"))])  # fmt: skip
def test_an_in_place_lane_writes_into_its_target(name):
    op, args, kwargs, _ = CASES[name]
    args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    target, before = args[0], args[0].data_ptr()
    with bt.exact_mode():
        assert mode.LANES[op](args, kwargs) is target  # no result to copy back
    assert target.data_ptr() == before


def test_an_in_place_lane_leaves_the_target_as_it_was_for_an_id_out_of_range():
    x = torch.arange(15.0).reshape(5, 3)
    with bt.exact_mode(), pytest.raises(bitfold.IndexRangeError, match=r"= 9 "):
        x.index_add_(0, torch.tensor([0, 9]), torch.ones(2, 3))
    assert torch.equal(x, torch.arange(15.0).reshape(5, 3))


def test_an_in_place_lane_leaves_values_that_share_the_targets_memory_to_the_rule():
    x = torch.arange(12.0).reshape(4, 3)
    with bt.exact_mode() as m:
        x.index_add_(0, torch.tensor([0, 0]), x[1:3])  # the terms are read before any write
    assert x[0].tolist() == [9.0, 12.0, 15.0] and x[1:].flatten().tolist() == list(
        map(float, range(3, 12)))  # fmt: skip
    assert dict(m.counts) == {"index_add": 1}


@pytest.mark.parametrize("op", [aten.index_add_.default, aten.index_add.default])
@pytest.mark.parametrize("columns", [2, 1])
def test_a_lane_keeps_an_untouched_nan_as_the_canonical_one_and_signs_zero_sums(op, columns):
    nan = 0x7FC0_0123  # a NaN with a payload, in a row no id reaches
    x = torch.tensor([[-0.0, 0.0], [1.0, 0.0], [0.0, -0.0]])[:, :columns].contiguous()
    x.view(torch.int32)[1, columns - 1] = nan
    v = torch.tensor([[-0.0, -0.0], [-0.0, 0.0], [-0.0, -0.0]])[:, :columns].contiguous()
    if columns == 1:  # 1-d: one value a position
        x, v = x.view(-1), v.view(-1)
    with bt.exact_mode() as m:
        got = op(x, 0, torch.tensor([0, 0, 2]), v)
    zero, neg_zero, canonical, one = 0, -(1 << 31), 0x7FC0_0000, 0x3F80_0000
    want = [[neg_zero, zero], [one, canonical], [zero, neg_zero]]  # -0 -0 -0; +0 -0 +0; ...
    if columns == 1:
        want = [neg_zero, canonical, zero]
    assert got.view(torch.int32).tolist() == want and dict(m.counts) == {"index_add": 1}


def test_a_lane_without_an_old_value_gives_positive_zero_where_no_id_reaches():
    for _ in range(3):  # the result's memory is reused: stale contents must not show
        with bt.exact_mode() as m:
            got = aten.embedding_dense_backward(-torch.zeros(7, 3), POS, 6, -1, False)
        want = [[0 if k in (1, 5) else -(1 << 31)] * 3 for k in range(6)]  # only -0.0 terms
        assert got.view(torch.int32).tolist() == want
        assert dict(m.counts) == {"embedding_dense_backward": 1}
        torch.full((6, 3), float("nan")).add_(1)  # leave NaN-filled memory about
