"""Which device a command folds on: the devices the command line offers, and why one is not
usable here.

The offer is the registry's (:func:`bitfold.backends.registry.device_types`): the CPU and
every device type a registered backend folds torch tensors on, so a new backend's device
reaches ``bitfold probe --device`` and ``bitfold bench --device`` with its registry row.
Nothing here imports torch unless it is installed and a device other than the CPU is asked.
"""

from __future__ import annotations

import importlib.util
import os

from ..errors import DeviceError, FoldError
from .torch_env import passive_openmp_before_torch


def cuda_available() -> bool:
    """True when torch sees a CUDA device and a GPU backend's kernels are installed (Triton or
    numba-cuda; checked without CUDA init where possible: torch is imported only if it is
    installed)."""
    if importlib.util.find_spec("torch") is None:
        return False
    if all(importlib.util.find_spec(m) is None for m in ("triton", "numba_cuda")):
        return False
    passive_openmp_before_torch()
    import torch

    return bool(torch.cuda.is_available())


def offered_devices() -> tuple[str, ...]:
    """The device types ``--device`` takes (besides the probe's ``auto``): the CPU (NumPy
    values) and every device a registered backend names for torch tensors
    (:func:`bitfold.backends.registry.device_types`), whether or not one is usable here
    (:func:`resolve_device` and :func:`why_not_usable` check)."""
    from ..backends.registry import device_types

    return tuple(dict.fromkeys(("cpu", *device_types("numpy"), *device_types("torch"))))


def resolve_device(requested: str) -> str:
    """A device type of :func:`offered_devices`: ``auto`` takes a CUDA GPU when one is usable,
    else the CPU; another device is refused unless torch sees it and a backend serves it."""
    allowed = offered_devices()
    if requested != "auto" and requested not in allowed:
        raise FoldError(f"--device must be auto, {', '.join(allowed)}; got {requested!r}")
    if requested == "cpu":
        return "cpu"
    if requested not in ("auto", "cuda"):
        why = why_not_usable(requested)
        if why:
            raise DeviceError(f"--device {requested} cannot fold here: {why} — run with "
                              "--device cpu")  # fmt: skip
        return requested
    usable = cuda_available()
    if requested == "cuda" and not usable:
        raise DeviceError(
            f"--device cuda needs a CUDA device: {why_no_cuda()} — run with --device cpu"
        )
    return "cuda" if usable else "cpu"


def why_not_usable(device: str) -> str:
    """Why torch tensors on ``device`` (not ``cpu`` or ``cuda``) cannot be folded here by the
    probe or the bench, or ``""``: torch must see the device and a registered backend fold
    there."""
    from ..backends.registry import backend_for

    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed"
    passive_openmp_before_torch()
    import torch

    module = getattr(torch, device, None)
    if module is None or not getattr(module, "is_available", lambda: False)():
        return f"torch sees no {device!r} device"
    try:
        backend_for("torch", device)
    except DeviceError as err:
        return str(err)
    return ""


def why_no_cuda() -> str:
    """What :func:`cuda_available` lacks here, and what would give it (for ``--device cuda``)."""
    if importlib.util.find_spec("torch") is None:
        return "PyTorch is not installed (pip install 'bitfold[triton]')"
    if all(importlib.util.find_spec(m) is None for m in ("triton", "numba_cuda")):
        return ("neither Triton nor numba-cuda is installed, and a GPU needs one of them "
                "(pip install 'bitfold[triton]')")  # fmt: skip
    passive_openmp_before_torch()
    import torch

    if torch.cuda.is_available():  # a GPU came after cuda_available() asked
        return "a GPU is visible now: run again"
    build = torch.version.cuda or torch.version.hip
    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    return (
        "no GPU is visible to PyTorch (torch.cuda.is_available() is False"
        + (f"; torch {torch.__version__} is built without CUDA" if build is None else "")
        + (f"; CUDA_VISIBLE_DEVICES={seen!r}" if seen is not None else "")
        + ")"
    )
