"""Where an accumulator's state lives, and merges across places, against the Fraction oracle.

The state lives with the backend of the first values added (``backend=``
forces one): the portable backend keeps it beside CPU torch tensors here, as
it does on any device. A host state and a portable state merge in either
direction to the bits of one accumulator fed everything. Bit for bit
(``.view(np.uint32)``), never a tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import UINT, exact_fold_oracle

import bitfold

torch = pytest.importorskip("torch", reason="torch is not installed")


def _problem(dtype: str = "float32", n: int = 240, K: int = 9, D: int = 1, seed: int = 3):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, K, n)
    shape = (n,) if D == 1 else (n, D)
    spread = 100 if dtype == "float32" else 600
    vals = (rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread, shape)).astype(dtype)
    flat = vals.reshape(-1)
    flat[:4] = [-0.0, 2.0**-149 if dtype == "float32" else 5e-324, 1.0, -1.0]
    return bitfold.Fold(idx, K), idx, vals


def _oracle_bits(idx, vals, K, out):
    cols = vals.reshape(len(idx), -1)
    want = np.stack([exact_fold_oracle(idx, cols[:, d], K, out) for d in range(cols.shape[1])], 1)
    return want.reshape((K, *vals.shape[1:])).view(UINT[out])


def _bits(result, out):
    arr = result.numpy() if isinstance(result, torch.Tensor) else np.asarray(result)
    return arr.view(UINT[out])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("D", [1, 3])
def test_a_portable_accumulator_keeps_its_state_beside_its_tensors(dtype, D):
    plan, idx, vals = _problem(dtype, D=D)
    t = torch.from_numpy(vals)
    trailing = () if D == 1 else (D,)
    acc = plan.accumulator(dtype, trailing=trailing, backend="portable")
    assert acc.backend == "host"  # nothing added yet: an empty host state
    acc.add(t[:100], start=0).add(t[100:], start=100)
    assert acc.backend == "portable"
    assert isinstance(acc._state, torch.Tensor) and acc._state.dtype == torch.int64
    assert acc.state.shape == (plan.K, *trailing, bitfold.formats.limb_format_for(dtype).width)
    result = acc.result()
    assert isinstance(result, torch.Tensor)
    assert np.array_equal(_bits(result, dtype), _oracle_bits(idx, vals, plan.K, dtype))
    # the state read on the host is the host accumulator's state, bit for bit once rounded
    rebuilt = bitfold.ExactAccumulator.from_state(plan, acc.state.copy(), dtype)
    assert np.array_equal(_bits(rebuilt.result(), dtype), _bits(result, dtype))


@pytest.mark.parametrize("receiver", ["host", "portable"])
@pytest.mark.parametrize("D", [1, 2])
def test_host_and_portable_states_merge_either_way(receiver, D):
    plan, idx, vals = _problem("float32", D=D, seed=5 + D)
    trailing = () if D == 1 else (D,)
    host = plan.accumulator(trailing=trailing).add(vals[:130], start=0)
    port = plan.accumulator(trailing=trailing, backend="portable")
    port.add(torch.from_numpy(vals[130:]), start=130)
    assert (host.backend, port.backend) == ("host", "portable")
    into, other = (host, port) if receiver == "host" else (port, host)
    before = other.state.copy()
    into.merge(other)
    assert into.backend == receiver  # the merged state lives where the receiver's did
    assert np.array_equal(other.state, before)  # the other is unchanged
    want = _oracle_bits(idx, vals, plan.K, "float32")
    assert np.array_equal(_bits(into.result(), "float32"), want)
    one = plan.accumulator(trailing=trailing).add(vals)
    assert np.array_equal(_bits(one.result(), "float32"), want)


def test_an_empty_accumulator_takes_the_place_of_what_it_merges():
    plan, idx, vals = _problem("float64", seed=8)
    port = plan.accumulator("float64", backend="portable").add(torch.from_numpy(vals))
    merged = plan.accumulator("float64").merge(port)
    assert merged.backend == "portable" and isinstance(merged.result(), torch.Tensor)
    merged += plan.accumulator("float64").add(vals)  # a host state, copied beside the tensors
    assert merged.backend == "portable"
    twice = _oracle_bits(np.concatenate([idx, idx]), np.concatenate([vals, vals]), plan.K,
                         "float64")  # fmt: skip
    assert np.array_equal(_bits(merged.result(), "float64"), twice)


def test_values_of_another_backend_are_summed_apart_and_added_in():
    plan, idx, vals = _problem("float32", seed=12)
    want = _oracle_bits(idx, vals, plan.K, "float32")
    # a portable state, then host values (NumPy arrays go to the host backend)
    port = plan.accumulator()
    port.add(torch.from_numpy(vals[:90]), start=0)  # CPU tensors: the host backend
    assert port.backend == "host"
    forced = plan.accumulator(backend="portable").add(torch.from_numpy(vals[:90]), start=0)
    forced.options.pop("backend")  # later values go to their own backend
    forced.add(vals[90:], start=90)
    assert forced.backend == "portable"
    assert np.array_equal(_bits(forced.result(), "float32"), want)
    # a host state, then portable values
    host = plan.accumulator().add(vals[:90], start=0)
    host.options["backend"] = "portable"
    host.add(torch.from_numpy(vals[90:]), start=90)
    assert host.backend == "host"
    assert np.array_equal(_bits(host.result(), "float32"), want)


def test_copy_and_reset_keep_the_place():
    plan, idx, vals = _problem("float32", seed=21)
    acc = plan.accumulator(backend="portable").add(torch.from_numpy(vals))
    twin = acc.copy()
    acc.reset()
    assert acc.backend == twin.backend == "portable"
    assert isinstance(acc._state, torch.Tensor) and not acc.state.any()
    want = _oracle_bits(idx, vals, plan.K, "float32")
    assert np.array_equal(_bits(twin.result(), "float32"), want)
    acc.add(torch.from_numpy(vals))
    assert np.array_equal(_bits(acc.result(), "float32"), want)


def test_many_portable_merges_stay_carried():
    """Each merge carries, so the limbs stay below 2^32 and never near int64 overflow."""
    plan = _problem("float32", n=64, K=2, seed=30)[0]
    big = np.full(64, np.finfo(np.float32).max / 4, np.float32)
    part = plan.accumulator(backend="portable").add(torch.from_numpy(big))
    total = plan.accumulator(backend="portable").add(torch.from_numpy(big))
    for _ in range(40):
        total.merge(part)
    limbs = total.state[..., : bitfold.formats.limb_format_for("float32").limbs]
    assert (np.abs(limbs[..., :-1]) < 2**32).all()
    got = _bits(total.result(), "float32")
    assert (got == np.float32(np.inf).view(np.uint32)).all()  # 41 * 64 * max/4: beyond range


def test_jax_without_int64_keeps_a_portable_state_on_the_host():
    """JAX in 32-bit mode has no int64: its 16-bit digits arrive in a host state."""
    jnp = pytest.importorskip("jax.numpy", reason="JAX is not installed")
    plan, idx, vals = _problem("float32", seed=40)
    acc = plan.accumulator(backend="portable")
    acc.add(jnp.asarray(vals[:70]), start=0).add(jnp.asarray(vals[70:]), start=70)
    assert acc.backend == "portable" and isinstance(acc._state, np.ndarray)
    got = np.asarray(acc.result())
    assert np.array_equal(got.view(np.uint32), _oracle_bits(idx, vals, plan.K, "float32"))


def test_which_backends_share_states():
    """Each backend keeps its own states: CUDA's on the GPU beside its values, the portable
    backend's beside its tensors; states of two backends merge by an exact copy."""
    from bitfold.backends.registry import get_backend

    host, gpu, port = (get_backend(n) for n in ("host", "cuda", "portable"))
    assert not host.shares_states(gpu) and not gpu.shares_states(host)
    assert not port.shares_states(host) and not port.shares_states(gpu)
    assert port.shares_states(port) and gpu.shares_states(gpu)
