"""Which devices the torch adapter folds on: one answer, asked of the backend registry.

Every entry point of :mod:`bitfold.torch` — the custom ops' checks, the
drop-in functions' index checks, the handlers of ``exact_mode()``, the
sparse products and the plan cache — decides with :func:`folds_on`
whether a tensor's device is one bitfold folds on. The answer is the
registry's (:mod:`bitfold.backends.registry`): yes when some registered
backend serves torch tensors on that device type here and now (its entry
lists the device, its ``available()`` and ``runs_on(device)`` allow it).
CPU tensors are the host backend's, CUDA tensors the GPU backends' (or the
portable path's without them), and every other device torch runs on (MPS,
XPU, ...) the portable path's, so they fold there too; a device no
registered backend serves is refused with a :class:`bitfold.DeviceError`
saying which backends serve what. A device that holds no data (``meta``)
is never one bitfold folds on, whatever serves it.
"""

from __future__ import annotations

import torch

from ..arrays import NO_DATA_DEVICES, check_has_data
from ..backends import registry

#: The array family the torch adapter's tensors belong to (:func:`bitfold.arrays.family_of`).
FAMILY = "torch"


def device_type(device: torch.device | str) -> str:
    """The device type of ``device``: ``"cuda"`` for ``torch.device("cuda:1")`` or ``"cuda:1"``
    (a string is cut at its colon, not parsed by torch: any name is a device type)."""
    if isinstance(device, torch.device):
        return device.type
    return device.split(":", 1)[0]


def folds_on(device: torch.device | str) -> bool:
    """True when bitfold can fold torch tensors living on ``device`` here.

    ``device`` is a ``torch.device``, a device string (``"cuda:0"``) or a
    device type (``"xpu"``). True when a registered backend serves torch
    tensors on that device type (:meth:`bitfold.backends.registry.Backend.serves`:
    listed, available, and able to run there now); False for a device that
    holds no data (``meta``). Never raises for a device torch knows.
    """
    kind = device_type(device)
    if kind in NO_DATA_DEVICES:
        return False
    return any(b.serves(FAMILY, kind) for b in registry.backends())


def check_device(t: torch.Tensor, what: str) -> None:
    """Refuse ``t`` unless bitfold folds torch tensors on its device, naming ``what`` it is.

    A tensor on a device without data raises :func:`bitfold.arrays.check_has_data`'s
    :class:`bitfold.DeviceError`; one on a device no registered backend serves
    raises the registry's :class:`bitfold.DeviceError`, which lists what each
    backend serves. Returns None exactly when :func:`folds_on` says yes.
    """
    check_has_data(t, what)
    registry.backend_for(FAMILY, t.device.type, what)  # the highest-priority server, or a refusal


__all__ = ["FAMILY", "check_device", "device_type", "folds_on"]
