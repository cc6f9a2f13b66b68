"""The backend registry: complete entries only, options checked, selection by family and device,
and every registered backend compared with the oracle and the host (``backend_compare.py``)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from backend_compare import ENVIRONMENT, TARGETS, compare

import bitfold
from bitfold import dispatch
from bitfold.backends import host, registry
from bitfold.backends.registry import FOLDS, OPERATIONS

COMPARE = Path(__file__).with_name("backend_compare.py")
REQUIRED = os.environ.get("BITFOLD_REQUIRE_CUDA") == "1"


#: every backend this package registers, in the order they are asked (by priority)
ASKED = ("host", "triton", "cuda", "portable")


def test_backend_names_lists_the_registry():
    names = bitfold.backend_names()
    assert {"host", "cuda", "portable"} <= set(names) <= set(ASKED)
    assert names == tuple(n for n in ASKED if n in names)  # highest priority first
    assert "backend_names" in bitfold.__all__
    assert bitfold.backends.__name__ == "bitfold.backends"  # the subpackage, not a function


def test_the_registry_names_the_device_type_of_each_collective_library(monkeypatch):
    """Which device's tensors a ``torch.distributed`` backend's collectives take is a table
    of the registry, one row a library; one it does not list takes CPU tensors."""
    assert registry.collective_device_type("gloo") == "cpu"
    assert registry.collective_device_type("nccl") == "cuda"
    assert registry.collective_device_type("xccl") == "xpu"
    assert registry.collective_device_type("mpi") == "cpu"
    assert registry.collective_device_type("cpu:gloo,cuda:nccl") == "cpu"
    monkeypatch.setattr(registry, "_COLLECTIVES", registry.collective_libraries())
    registry.register_collective("toyccl", "toy")  # a new device type's library: one row
    assert registry.collective_device_type("toyccl") == "toy"
    assert registry.collective_libraries()["toyccl"] == "toy"


@pytest.mark.slow
@pytest.mark.parametrize("name", bitfold.backend_names())
def test_every_backend_agrees_with_the_oracle_and_the_host(name):
    """The table of backend_compare.py: here for a backend that needs a process of its own;
    the others run it problem by problem in test_backend_table.py."""
    if name not in ENVIRONMENT:
        from test_backend_table import IN_PROCESS

        if name not in TARGETS:
            assert compare(name) == []  # fails, asking for the backend's Target
        names = [getattr(n, "values", (n,))[0] for n in IN_PROCESS]  # pytest.param or a name
        assert name in names, f"add {name!r} to test_backend_table.IN_PROCESS"
        return
    if name == "cuda" and importlib.util.find_spec("numba_cuda") is None:
        if REQUIRED:
            pytest.fail("BITFOLD_REQUIRE_CUDA=1 but numba-cuda is not installed")
        pytest.skip("numba-cuda is not installed")
    env = {**os.environ, **ENVIRONMENT[name]}
    env["PYTHONPATH"] = os.pathsep.join([str(COMPARE.parent.parent / "src"),
                                         env.get("PYTHONPATH", "")])  # fmt: skip
    proc = subprocess.run([sys.executable, "-W", "ignore", str(COMPARE), name], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


@pytest.mark.parametrize("piece", [*FOLDS, *OPERATIONS])
def test_an_incomplete_backend_is_refused_by_name(piece):
    entry = host.BACKEND
    if piece in FOLDS:
        broken = dataclasses.replace(
            entry, name="partial", folds={k: v for k, v in entry.folds.items() if k != piece}
        )
    else:
        broken = dataclasses.replace(entry, name="partial", **{piece: None})
    with pytest.raises(bitfold.FoldError, match="'partial'") as info:
        registry.register(broken)
    assert piece in str(info.value)
    assert "partial" not in bitfold.backend_names()


def test_a_new_backend_is_selected_by_family_and_device_without_touching_dispatch():
    calls = []

    def exact(plan, values, spec, out_name, **options):
        calls.append(options)
        return host.fold_exact(plan, values, spec, out_name)

    mps = dataclasses.replace(
        host.BACKEND, name="fake-mps", families=("numba",), devices=("mps",),
        folds={**host.BACKEND.folds, "exact": exact}, options={"exact": ("tile",)},
    )  # fmt: skip
    registry.register(mps)
    try:
        names = bitfold.backend_names()  # host's priority: asked right after host
        assert names.index("fake-mps") == names.index("host") + 1
        assert registry.backend_for("numba", "mps") is mps
        assert registry.backend_for("numpy", "cpu") is host.BACKEND
        with pytest.raises(bitfold.FoldError, match="valid options: tile="):
            dispatch.check_options(mps, "exact", {"route": "limbs"})
    finally:
        registry.unregister("fake-mps")
    assert "fake-mps" not in bitfold.backend_names()


@contextlib.contextmanager
def _registered(*entries):
    """``entries`` registered for the duration (each a replaced host entry), then removed."""
    try:
        for entry in entries:
            registry.register(entry)
        yield entries
    finally:
        for entry in entries:
            registry.unregister(entry.name)


def _fake(name, priority, families=("fakefam",), devices=("fakedev",), **fields):
    return dataclasses.replace(host.BACKEND, name=name, families=families, devices=devices,
                               priority=priority, **fields)  # fmt: skip


def test_the_built_in_backends_are_asked_by_priority_with_room_between():
    """host before cuda (numba) before portable, by their entries' numbers, with room for a
    backend between host and cuda (a GPU backend preferred to the numba-cuda kernels)."""
    from bitfold.backends import cuda, portable

    prios = [b.BACKEND.priority for b in (host, cuda, portable)]
    assert prios == sorted(prios, reverse=True) and len(set(prios)) == 3
    assert prios[0] - prios[1] >= 2  # an integer strictly between host and cuda
    asked = [b.name for b in registry.backends()]
    assert asked == list(bitfold.backend_names())
    assert [b.priority for b in registry.backends()] == sorted(
        (b.priority for b in registry.backends()), reverse=True
    )


def test_the_highest_priority_serving_backend_is_chosen_whatever_the_registration_order():
    low, high = _fake("fake-low", 5), _fake("fake-high", 10)
    with _registered(low, high):  # registered low first
        names = bitfold.backend_names()
        assert names.index("fake-high") < names.index("fake-low")
        assert registry.backend_for("fakefam", "fakedev") is high
    with _registered(_fake("fake-only-other-dev", 50, devices=("otherdev",)), low):
        assert registry.backend_for("fakefam", "fakedev") is low  # the higher one does not serve
    assert not {"fake-low", "fake-high"} & set(bitfold.backend_names())


def test_equal_priorities_keep_the_registration_order():
    first, second, third = _fake("fake-a", 7), _fake("fake-b", 7), _fake("fake-c", 7)
    with _registered(second, first, third):
        names = [n for n in bitfold.backend_names() if n.startswith("fake-")]
        assert names == ["fake-b", "fake-a", "fake-c"]
        assert registry.backend_for("fakefam", "fakedev") is second
        assert [b.name for b in registry.backends() if b.name.startswith("fake-")] == names


def test_the_order_asked_follows_every_change_of_the_table(monkeypatch):
    """The order is kept between changes (asked before every small fold) and made again after
    any change, a test's ``monkeypatch`` of the table included."""
    entry = _fake("fake-first", 10_000)
    assert registry.backends() is registry.backends()  # kept
    monkeypatch.setitem(registry._REGISTRY, entry.name, entry)
    assert registry.backends()[0] is entry
    monkeypatch.delitem(registry._REGISTRY, entry.name)
    assert entry not in registry.backends()
    with _registered(entry):
        assert registry.backends()[0] is entry
    assert entry not in registry.backends()


def test_a_backend_that_cannot_run_on_a_listed_device_does_not_serve_it():
    """``runs_on(device)`` False: the next backend is asked; forced, a clear DeviceError."""
    seen = []

    def runs_on(device):
        seen.append(device)
        return device == "xpu"  # a GPU kernel library without its CPU interpreter

    gpu = _fake("fake-gpu", 10_000, families=("torch",), devices=("cpu", "xpu"),
                runs_on=runs_on)  # fmt: skip
    with _registered(gpu):
        assert not gpu.serves("torch", "cpu") and gpu.serves("torch", "xpu")
        assert gpu.lists("torch", "cpu") and not gpu.can_run("cpu")
        assert registry.backend_for("torch", "cpu") is host.BACKEND  # the next one asked
        assert registry.backend_for("torch", "xpu") is gpu
        assert "cpu" in seen and "xpu" in seen
        with pytest.raises(bitfold.DeviceError, match=r"fake-gpu backend .* cannot run here"):
            registry.backend_for("torch", "cpu", name="fake-gpu")
        with pytest.raises(bitfold.DeviceError, match=r"fake-gpu backend .*on cpu, xpu$"):
            registry.backend_for("torch", "mps", name="fake-gpu")  # unlisted: not "run here"
        tensor = pytest.importorskip("torch").ones(3)
        with pytest.raises(bitfold.DeviceError, match="cannot run here"):
            bitfold.Fold([0, 1, 0], 2)(tensor, backend="fake-gpu")
        assert bitfold.Fold([0, 1, 0], 2)(tensor).tolist() == [2.0, 1.0]  # the host's


def test_an_unavailable_backend_serves_nothing_even_at_the_top():
    top = _fake("fake-top", 10_000, families=("numpy",), devices=("cpu",),
                available=lambda: False)  # fmt: skip
    with _registered(top):
        assert registry.backend_for("numpy", "cpu") is host.BACKEND
        with pytest.raises(bitfold.DeviceError, match="cannot run here"):
            registry.backend_for("numpy", "cpu", name="fake-top")


def test_jax_arrays_on_a_gpu_take_the_portable_backend(monkeypatch):
    """The CUDA backend serves torch, CuPy, numba and interface arrays: not JAX's, which (and
    every other device's arrays) the portable backend folds; numba's own arrays only CUDA."""
    from bitfold.backends import cuda, triton

    monkeypatch.setattr(triton, "triton_loads", lambda: True)
    assert registry.backend_for("torch", "cuda").name == "triton"  # Triton first
    assert registry.backend_for("jax", "cuda").name == "portable"  # it reads no JAX arrays
    monkeypatch.setattr(triton, "triton_loads", lambda: False)
    monkeypatch.setattr(cuda, "numba_cuda_loads", lambda: True)
    assert registry.backend_for("torch", "cuda").name == "cuda"
    monkeypatch.setattr(cuda, "numba_cuda_loads", lambda: False)  # no numba-cuda: portable
    assert registry.backend_for("torch", "cuda").name == "portable"
    assert registry.backend_for("jax", "cuda").name == "portable"
    assert registry.backend_for("torch", "mps").name == "portable"
    with pytest.raises(bitfold.DeviceError, match=r"numba arrays on device 'meta'"):
        registry.backend_for("numba", "meta")


def test_an_unknown_option_is_a_fold_error_listing_the_valid_ones():
    plan = bitfold.Fold([0, 1, 0], 2)
    vals = np.ones(3, np.float32)
    with pytest.raises(bitfold.FoldError) as info:
        dispatch.fold(plan, vals, launch=None)  # a CUDA option, on the host
    for word in ("launch=", "route=", "kernel=", "carry_every="):
        assert word in str(info.value)
    with pytest.raises(bitfold.FoldError, match="valid options: none"):
        dispatch.fold(plan, vals, "ordered", route="limbs")
    with pytest.raises(bitfold.FoldError, match="carry_every=, kernel=, launch="):
        plan.accumulator(lanch=1)
    with pytest.raises(bitfold.FoldError, match="valid options"):
        plan.route(vals, kernel_path="x")


def test_accumulator_options_go_to_the_backend_that_takes_them():
    """``launch=`` tunes GPU adds; host values in the same accumulator are added without it."""
    plan = bitfold.Fold([0, 1, 0], 2)
    acc = plan.accumulator("float32", launch=None, kernel="limbs")
    acc.add(np.array([1.0, 2.0, 2.0**-20], np.float32))
    assert acc.result().tolist() == [1.0 + 2.0**-20, 2.0]


def test_init_rules_are_declared_per_backend():
    """The host folds into init with every strategy and any float dtype; CUDA with exact only,
    in the values' dtype (docs/architecture.md, "Modules"). backend_compare.py checks
    both against the running code."""
    host_rule, cuda_rule = (registry.get_backend(n).init for n in ("host", "cuda"))
    assert host_rule.strategies == FOLDS and host_rule.mixed_dtypes
    assert cuda_rule.strategies == ("exact",) and not cuda_rule.mixed_dtypes
