"""``Fold`` is what the backends are written against: every member of ``PlanView``."""

from __future__ import annotations

import inspect

import numpy as np

import bitfold
from bitfold.plan_view import AccumulatorPlan, PlanView


def _members(protocol: type) -> dict[str, object]:
    names = {n for c in protocol.__mro__ if c.__module__ == "bitfold.plan_view" for n in vars(c)}
    return {n: inspect.getattr_static(protocol, n) for n in names if not n.startswith("_")}


def test_fold_has_every_member_of_the_plan_view_in_its_kind():
    for name, member in _members(AccumulatorPlan).items():
        ours = inspect.getattr_static(bitfold.Fold, name)
        assert isinstance(ours, property) == isinstance(member, property), name
        if not isinstance(member, property):
            want = list(inspect.signature(member).parameters)
            assert list(inspect.signature(ours).parameters) == want, name
    assert set(_members(PlanView)) < set(_members(AccumulatorPlan))


def test_a_plan_reads_through_the_view():
    plan: PlanView = bitfold.Fold(np.array([1, 0, 1]), 2)
    assert (plan.K, plan.size, plan.shape, plan.once) == (2, 3, (3,), False)
    assert plan.counts.tolist() == [1, 2] and plan.device_tensors is None
    assert plan.prepared("x", lambda: 7) == 7


def test_cache_keys_of_two_caches_never_collide():
    """Frozen dataclasses compare equal only within their class, unlike tuples or NamedTuples."""
    from bitfold.backends import device_plan, host, host_buffers, triton

    assert device_plan.TensorsKey("cpu") != device_plan.IndexKey("cpu")
    assert triton.HotChunksKey("cpu", 64, 50) == triton.HotChunksKey("cpu", 64, 50)
    assert triton.HotChunksKey("cpu", 64, 50) != triton.HotChunksKey("cpu", 64, 10)
    assert triton.HotChunksKey("cpu", 64, 50) != device_plan.TensorsKey("cpu")
    assert hash(device_plan.TensorsKey("cpu")) == hash(device_plan.TensorsKey("cpu"))
    assert host_buffers.BuffersKey() == host_buffers.PREPARED_KEY != host.Index64Key()


def test_a_cached_value_names_the_arrays_it_holds():
    """``nbytes`` asks a value with ``held_arrays()``, whatever its key, each array once."""

    class Held:
        def __init__(self, *arrays: np.ndarray) -> None:
            self.arrays = arrays

        def held_arrays(self) -> tuple[np.ndarray, ...]:
            return self.arrays

    plan = bitfold.Fold(np.array([1, 0, 1]), 2)
    before = plan.host_nbytes
    block = np.zeros(1000)
    plan.prepared("anything", lambda: Held(block, block))
    plan.prepared("again", lambda: block)
    assert plan.host_nbytes == before + block.nbytes and plan.device_nbytes == 0
