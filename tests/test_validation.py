"""One validator for every entry point: the same refusals from NumPy, torch, JAX, the accumulator.

A transposed gradient (the index's size, another multi-dimensional shape)
would be folded into the wrong buckets; every entry point refuses it with
both shapes in the message. (The CUDA entry points are checked in
``tests/cuda_cases.py`` under the simulator.)
"""

from __future__ import annotations

import numpy as np
import pytest

import bitfold

INDEX = np.random.default_rng(0).integers(0, 5, size=(2, 3))
TRANSPOSED = np.ones((3, 2), np.float32)
MESSAGE = r"shape \(3, 2\) but the index has shape \(2, 3\)"


def _numpy(plan):
    return plan(TRANSPOSED)


def _accumulator(plan):
    return plan.accumulator().add(TRANSPOSED)


def _torch_plan(plan):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    return plan(torch.from_numpy(TRANSPOSED))


def _torch_fold(plan):
    pytest.importorskip("torch", reason="torch is not installed")
    import torch

    import bitfold.torch as bt

    return bt.fold(torch.from_numpy(TRANSPOSED), plan)


def _torch_fold_compiled_fake(plan):
    pytest.importorskip("torch", reason="torch is not installed")
    import torch

    import bitfold.torch as bt

    key = bt.plan_key(plan)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.empty(3, 2)
        return torch.ops.bitfold.fold(fake, key, "exact", torch.float32)


def _jax_plan(plan):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    return plan(jnp.asarray(TRANSPOSED))


def _jax_fold(plan):
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    import bitfold.jax as bj

    return bj.fold(jnp.asarray(TRANSPOSED), plan)


def _jax_fold_under_jit(plan):
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    import bitfold.jax as bj

    return jax.jit(lambda x: bj.fold(x, plan))(TRANSPOSED)


ENTRY_POINTS = [
    _numpy, _accumulator, _torch_plan, _torch_fold, _torch_fold_compiled_fake, _jax_plan,
    _jax_fold, _jax_fold_under_jit,
]  # fmt: skip


@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda f: f.__name__.strip("_"))
def test_a_transposed_gradient_is_refused_everywhere(entry):
    plan = bitfold.Fold(INDEX, 5)
    with pytest.raises(bitfold.ShapeError, match=MESSAGE):
        entry(plan)


def test_the_same_values_in_the_index_shape_or_flat_are_folded():
    plan = bitfold.Fold(INDEX, 5)
    want = np.bincount(INDEX.reshape(-1), minlength=5).astype(np.float32)
    assert plan(np.ones((2, 3), np.float32)).tolist() == want.tolist()
    assert plan(np.ones(6, np.float32)).tolist() == want.tolist()


# -- the plan: bugs of the first review ---------------------------------------------------------
def test_a_K_beyond_memory_is_refused_with_how_much_it_would_take():
    with pytest.raises(bitfold.FoldError, match=r"K = 1,000,000,000,000 buckets need 8\.0 TB"):
        bitfold.Fold([0, 1], K=10**12)


def test_an_empty_list_is_an_empty_index():
    plan = bitfold.Fold([], 3)
    assert plan.size == 0 and plan.shape == (0,)
    assert plan(np.zeros(0, np.float32)).view(np.uint32).tolist() == [0, 0, 0]


def test_a_list_of_non_integers_names_the_value():
    with pytest.raises(bitfold.FoldTypeError, match=r"non-integer numbers .* 0\.5"):
        bitfold.Fold([0.5, 1], 3)
    with pytest.raises(bitfold.FoldTypeError, match="float64"):
        bitfold.Fold(np.zeros(0, np.float64), 3)


# -- the accumulator returns the library of the values added ---------------------------------------
def test_accumulator_results_come_back_in_the_library_of_the_values_added():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    plan = bitfold.Fold([0, 1, 1], 2)
    acc = plan.accumulator().add(torch.tensor([1.0, 2.0, 3.0]))
    res = acc.result()
    assert isinstance(res, torch.Tensor) and res.tolist() == [1.0, 5.0]
    assert acc.result(out_dtype=torch.bfloat16).dtype == torch.bfloat16
    np_acc = plan.accumulator().add(np.array([1.0, 2.0, 3.0], np.float32))
    assert isinstance(np_acc.result(), np.ndarray)
    assert isinstance(plan.accumulator().result(), np.ndarray)  # nothing added: NumPy
    state = torch.from_numpy(acc.state.copy())
    rebuilt = bitfold.ExactAccumulator.from_state(plan, state)
    assert isinstance(rebuilt.result(), torch.Tensor)
    merged = plan.accumulator().merge(acc)  # an empty accumulator takes the other's library
    assert isinstance(merged.result(), torch.Tensor)


def test_accumulator_results_from_jax_values_are_jax_arrays():
    jax = pytest.importorskip("jax", reason="JAX is not installed")
    plan = bitfold.Fold([0, 1, 1], 2)
    res = plan.accumulator().add(jax.numpy.asarray([1.0, 2.0, 3.0], "float32")).result()
    assert isinstance(res, jax.Array) and res.tolist() == [1.0, 5.0]


def test_messages_name_only_what_the_user_passed():
    """add_at and torch's index_add have no K: their range errors name the bound they had."""
    import torch

    import bitfold.torch as bt

    with pytest.raises(bitfold.IndexRangeError, match=r"index < len\(a\) = 3$") as e:
        bitfold.add_at(np.zeros(3, np.float32), np.array([0, 5]), np.ones(2, np.float32))
    assert "K" not in str(e.value)
    with pytest.raises(bitfold.IndexRangeError, match=r"index < input.shape\[0\] = 3$") as e:
        bt.index_add(torch.zeros(3), 0, torch.tensor([0, 5]), torch.ones(2))
    assert "K" not in str(e.value) and "= 5" in str(e.value)
    with pytest.raises(bitfold.IndexRangeError, match=r"index < K = 3$"):
        bitfold.Fold(np.array([0, 5]), 3)


def test_a_one_dimensional_shape_mismatch_names_one_form():
    with pytest.raises(bitfold.ShapeError) as e:
        bitfold.segment_sum(np.ones(2, np.float32), np.array([0, 1, 2]), 3)
    msg = str(e.value)
    assert msg.endswith("pass values of shape (3,) + trailing") and " or " not in msg
    with pytest.raises(bitfold.ShapeError, match=r"\(2, 3\) \+ trailing or \(6,\) \+ trailing"):
        bitfold.Fold(np.zeros((2, 3), np.int64), 3)(np.ones(5, np.float32))


def test_an_index_range_error_is_also_an_index_error():
    """Code written for torch (IndexError) and for bitfold (FoldError, ValueError) catches it."""
    with pytest.raises(IndexError):
        bitfold.Fold(np.array([0, 9]), 3)
    with pytest.raises(ValueError):
        bitfold.Fold(np.array([0, 9]), 3)
