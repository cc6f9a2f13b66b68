"""A backend added from outside the package: one registry entry and one table target.

The toy backend is the portable backend's functions under a new name, listing the CPU (so
the table's CPU tensors reach it) and a device type of its own, ``toy``. Registered, it is
tested by the backend table like any built-in backend, and ``bitfold probe`` and ``bitfold
bench`` offer its device; unregistered, it is gone from all three. Its collective library's
row names its device until it is removed. This is what a new backend (Metal for Apple's
GPUs, say) goes through: its module, its kernels, one ``register`` line (and a
``register_collective`` line for a device with collectives of its own) and one ``Target``
(docs/architecture.md, "Adding a backend").
"""

from __future__ import annotations

import dataclasses

import pytest
from backend_compare import TARGETS, run_problem, skip_reason, table

from bitfold import cli
from bitfold.backends import registry
from bitfold.cli import devices

NAME, DEVICE = "toy", "toy"
#: The toy device's own collective library (``torch.distributed`` backend), one registry row.
COLLECTIVE = "toyccl"
PROBLEMS = {p.name: p for p in table()}


@pytest.fixture
def toy(monkeypatch):
    """The toy backend registered, asked last, with its target in the table."""
    pytest.importorskip("torch")
    portable = registry.get_backend("portable")
    entry = dataclasses.replace(portable, name=NAME, devices=("cpu", DEVICE), priority=-1000)
    registry.register(entry)
    registry.register_collective(COLLECTIVE, DEVICE)
    monkeypatch.setitem(TARGETS, NAME, dataclasses.replace(
        TARGETS["portable"], options=lambda: {"backend": NAME}))  # fmt: skip
    yield entry
    registry.unregister(NAME)
    registry.unregister_collective(COLLECTIVE)


@pytest.mark.parametrize("problem", list(PROBLEMS))
def test_the_toy_backend_passes_the_backend_table(toy, problem):
    why = skip_reason(NAME, PROBLEMS[problem])
    if why:
        pytest.skip(why)
    assert run_problem(NAME, PROBLEMS[problem]) == []


def test_the_toy_backend_is_asked_last_and_takes_nothing_by_itself(toy):
    assert registry.backend_names()[-1] == NAME
    assert registry.backend_for("torch", "cpu").name == "host"
    assert registry.backend_for("torch", DEVICE).name == "portable"  # asked before the toy
    assert registry.backend_for("torch", DEVICE, name=NAME) is toy


def test_the_probe_offers_the_toy_device_while_it_is_registered(toy, capsys):
    assert DEVICE in registry.device_types("torch")
    assert devices.offered_devices()[0] == "cpu" and DEVICE in devices.offered_devices()
    assert cli.main(["probe", "--device", "nowhere"]) == 2
    err = capsys.readouterr().err
    assert "--device must be auto, " in err and "'nowhere'" in err
    assert ", ".join(devices.offered_devices()) in err  # every allowed device, named
    assert cli.main(["probe", "--device", DEVICE]) == 2  # offered, but torch has no such device
    assert f"--device {DEVICE} cannot fold here: torch sees no {DEVICE!r} device" in (
        capsys.readouterr().err
    )


def test_the_toy_devices_collectives_are_one_row_of_the_registry(toy):
    """A group whose library is the toy's takes its tensors on the toy device; removed, the
    library is one the registry does not list: CPU tensors."""
    assert registry.collective_device_type(COLLECTIVE) == DEVICE
    assert registry.collective_device_type("nccl") == "cuda"
    registry.unregister_collective(COLLECTIVE)
    assert registry.collective_device_type(COLLECTIVE) == "cpu"


def test_unregistering_the_toy_backend_removes_its_device(toy, capsys):
    registry.unregister(NAME)
    assert NAME not in registry.backend_names()
    assert DEVICE not in registry.device_types() and DEVICE not in devices.offered_devices()
    assert cli.main(["probe", "--device", DEVICE]) == 2
    assert f"--device must be auto, {', '.join(devices.offered_devices())}; got 'toy'" in (
        capsys.readouterr().err
    )


def test_the_probe_devices_are_the_registrys():
    """Without the toy: the CPU and the devices the built-in backends name for torch."""
    want = tuple(dict.fromkeys(("cpu", *registry.device_types("torch"))))
    assert devices.offered_devices() == want
    assert "cuda" in devices.offered_devices()


def test_the_bench_offers_the_toy_device_while_it_is_registered(toy, capsys, tmp_path):
    """``bitfold bench --device`` offers the probe's devices: the toy is known, and refused only
    because torch sees no such device; unregistered, it is unknown."""
    argv = ["bench", "--device", DEVICE, "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert f"--device {DEVICE}: torch sees no {DEVICE!r} device" in capsys.readouterr().err
    registry.unregister(NAME)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"unknown device {DEVICE!r}; choose {', '.join(devices.offered_devices())}" in err
