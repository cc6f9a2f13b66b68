"""Errors newcomers met: each bad input gets one clear bitfold error, before any work.

Every test names the input, the error class and what its message must say:
the bad value and what is allowed (or the fix). "Before any work" is checked
by replacing the expensive function with one that fails the test when called.
"""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest

import bitfold
from bitfold.errors import DistributedError, FoldError, FoldTypeError


def _no_chain(err: BaseException) -> None:
    """One error, not printed after another: no cause, and any context suppressed."""
    assert err.__cause__ is None
    assert err.__suppress_context__ or err.__context__ is None


def _forbid(monkeypatch: pytest.MonkeyPatch, module: object, *names: str) -> None:
    """Replace ``module``'s functions ``names`` with ones that fail the test when called."""
    for name in names:

        def called(*args: object, _name: str = name, **kwargs: object) -> None:
            pytest.fail(f"{_name} ran: the bad input was not refused before any work")

        monkeypatch.setattr(module, name, called)


# -- torch.distributed -----------------------------------------------------------------------


def _distributed():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
    return torch, pytest.importorskip("bitfold.distributed", reason="needs torch")


def test_exact_all_reduce_without_a_process_group_is_refused_before_any_work(monkeypatch):
    torch, bd = _distributed()
    assert not torch.distributed.is_initialized()
    _forbid(monkeypatch, bd, "to_numpy", "array_bounds", "_all_reduce_array",
            "_all_reduce_on_device")  # fmt: skip
    _forbid(monkeypatch, bd.dense_device, "widened", "array_bounds")
    for words in (None, "host", "device"):
        with pytest.raises(DistributedError, match="init_process_group") as err:
            bd.exact_all_reduce(torch.ones(1000), words=words)
        assert "no" in str(err.value) and "initialised" in str(err.value)
        _no_chain(err.value)
    s = bd.DenseSum((3,), "float32").add(torch.ones(3))
    _forbid(monkeypatch, bd, "_exchange")
    with pytest.raises(DistributedError, match="init_process_group"):
        bd.exact_all_reduce(s)


def test_gradient_sum_of_no_parameters_is_refused_by_name(monkeypatch):
    torch, bd = _distributed()
    monkeypatch.setattr(bd.dist, "is_initialized", lambda: True)  # even with a group
    for empty in ([], (), iter([])):
        with pytest.raises(FoldError, match="no parameters: params is empty") as err:
            bd.GradientSum(empty)
        assert "model.parameters()" in str(err.value)
    model = torch.nn.Linear(2, 2)
    params = model.parameters()
    list(params)  # read once already, as an optimizer does
    with pytest.raises(FoldError, match="read once"):
        bd.GradientSum(params)


def test_gradient_sum_of_a_module_says_to_pass_its_parameters():
    torch, bd = _distributed()
    with pytest.raises(FoldTypeError, match=r"not the module: pass model\.parameters\(\)") as e:
        bd.GradientSum(torch.nn.Linear(2, 2))
    assert "Linear" in str(e.value)
    _no_chain(e.value)
    with pytest.raises(FoldTypeError, match=r"one tensor of shape \(2, 3\)"):
        bd.GradientSum(torch.nn.Parameter(torch.ones(2, 3)))
    with pytest.raises(FoldTypeError, match=r"iterable of parameters.* got int") as e:
        bd.GradientSum(3)
    _no_chain(e.value)


# -- bitfold.jax.psum ------------------------------------------------------------------------


def _jax():
    jax = pytest.importorskip("jax", reason="jax is not installed")
    return jax, pytest.importorskip("bitfold.jax_psum", reason="needs jax")


def _shard_mapped(jax, body):
    """``body`` under ``jax.shard_map`` over every device of this process, on axis ``"i"``,
    called on its argument cut between the devices."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("i",))
    mapped = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P())
    return lambda x: mapped(jax.device_put(x, NamedSharding(mesh, P("i"))))


UNBOUND = "axis_name='nowhere': no mapped axis of that name is bound here"


def test_psum_outside_shard_map_or_over_an_unknown_axis_is_one_error(monkeypatch):
    jax, jp = _jax()
    jnp = jax.numpy
    _forbid(monkeypatch, jp, "_exact_psum", "_psum")
    with pytest.raises(FoldError, match=UNBOUND) as err:
        jp.psum(jnp.ones(3), "nowhere")
    assert "jax.shard_map or jax.pmap" in str(err.value)
    _no_chain(err.value)
    f = _shard_mapped(jax, lambda t: jp.psum(t, "nowhere"))
    with pytest.raises(FoldError, match=UNBOUND) as err:
        f(jnp.ones(2 * jax.device_count()))
    _no_chain(err.value)


def test_psum_of_integer_leaves_outside_a_mapped_axis_is_the_float_error():
    jax, jp = _jax()
    jnp = jax.numpy
    for x in (jnp.ones(3, jnp.int32), jnp.ones(3, bool), {"w": jnp.ones(3), "n": 3}):
        with pytest.raises(FoldError, match=UNBOUND) as err:
            jp.psum(x, "nowhere")
        _no_chain(err.value)
    f = _shard_mapped(jax, lambda t: jp.psum(t, "nowhere"))
    with pytest.raises(FoldError, match=UNBOUND) as err:  # was an AssertionError in JAX
        f(jnp.ones(2 * jax.device_count(), jnp.int32))
    _no_chain(err.value)


def test_a_complex_leaf_of_psum_is_named_by_its_path(monkeypatch):
    jax, jp = _jax()
    jnp = jax.numpy
    _forbid(monkeypatch, jp, "_devices", "_exact_psum")  # refused before the axis is asked
    tree = {"w": jnp.ones(3), "z": [jnp.ones(2), jnp.ones(3, jnp.complex64)]}
    with pytest.raises(FoldTypeError, match=r"the leaf x\['z'\]\[1\] has dtype complex64"):
        jp.psum(tree, "i")
    with pytest.raises(FoldTypeError, match="the leaf x has dtype complex64"):
        jp.psum(jnp.ones(2, jnp.complex64), "i")
    with pytest.raises(FoldTypeError, match="float16, bfloat16, float32, float64"):
        jp.psum((jnp.ones(2), jnp.ones(2, jnp.complex64)), "i")


#: Run in a process of two simulated CPU devices (XLA fixes the count when it starts): an
#: unknown axis under a two-device shard_map, for a float and an integer leaf.
TWO_DEVICES = """
import jax, jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import bitfold.jax as bj
from bitfold.errors import FoldError
assert jax.device_count() == 2
mesh = jax.make_mesh((2,), ("i",))
for dtype in (jnp.float32, jnp.int32):
    f = jax.shard_map(lambda t: bj.psum(t, "j"), mesh=mesh, in_specs=P("i"), out_specs=P())
    try:
        f(jax.device_put(jnp.ones(4, dtype), jax.sharding.NamedSharding(mesh, P("i"))))
    except FoldError as e:
        assert "axis_name='j'" in str(e) and e.__cause__ is None and e.__suppress_context__
        print("refused", dtype.__name__)
"""


def test_psum_over_an_unknown_axis_on_two_simulated_devices_is_one_error():
    import os
    import subprocess
    import sys
    from pathlib import Path

    _jax()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "src"),
                                         env.get("PYTHONPATH", "")])  # fmt: skip
    done = subprocess.run([sys.executable, "-c", TWO_DEVICES], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["refused", "float32", "refused", "int32"]


# -- forced backends on the CPU --------------------------------------------------------------


def test_triton_on_cpu_tensors_says_they_run_only_in_the_interpreter(monkeypatch):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("triton", reason="Triton is not installed")
    from bitfold.backends import triton

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _forbid(monkeypatch, triton, "_kernels", "plan_tensors")
    plan = bitfold.Fold([0, 1, 0, 2, 1, 0], 3)
    calls = [lambda v: plan(v, backend="triton"),
             lambda v: plan(v, "ordered", backend="triton"),
             lambda v: plan.accumulator("float32", backend="triton").add(v)]  # fmt: skip
    for call in calls:
        with pytest.raises(bitfold.DeviceError, match="triton backend") as err:
            call(torch.ones(6))
        message = str(err.value)
        assert "device 'cpu'" in message
        assert "CPU tensors run the Triton kernels only under TRITON_INTERPRET=1" in message
        assert "for tests" in message and "it serves" not in message
        _no_chain(err.value)


def test_cuda_backend_on_the_cpu_is_refused_before_any_work(monkeypatch):
    from bitfold.backends import cuda

    _forbid(monkeypatch, cuda, "numba_cuda_loads", "uploaded_plan", "device_values")
    plan = bitfold.Fold([0, 1, 0, 2, 1, 0], 3)
    values = [np.ones(6, np.float32)]
    if importlib.util.find_spec("torch") is not None:
        import torch

        values.append(torch.ones(6))
    for v in values:
        start = time.perf_counter()
        with pytest.raises(bitfold.DeviceError, match="cuda backend does not fold") as err:
            plan(v, backend="cuda")
        assert time.perf_counter() - start < 0.5
        assert "on device 'cpu'" in str(err.value) and "arrays on cuda" in str(err.value)
        assert "cannot run here" not in str(err.value)  # it never could: cpu is not listed
        _no_chain(err.value)


# -- bitfold probe ---------------------------------------------------------------------------


def test_probe_on_cuda_without_a_gpu_says_no_gpu_is_visible(monkeypatch, capsys):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("triton", reason="Triton is not installed")  # the GPU kernels are here
    from bitfold import cli
    from bitfold.cli import probe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _forbid(monkeypatch, probe, "make_device", "Probe")
    assert cli.main(["probe", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "no GPU is visible to PyTorch" in err
    assert "pip install" not in err and "--device cpu" in err
