"""Start the local gloo ranks of a test: forked from a server that has imported torch and bitfold.

``torch.multiprocessing.spawn`` starts each rank as a fresh interpreter, which
imports torch, Dynamo (torch's optimizers load it) and bitfold again: 2 to 4
CPU-seconds a rank before any work, the largest share of the distributed
tests' time. Here each rank is forked from ``multiprocessing``'s fork server,
one per test process, which imports those modules once when it starts. The
server is a fresh interpreter that has run no OpenMP or Numba parallel code, so
forking it is safe; it keeps the environment of its first launch (no test
changes the environment of its ranks).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import torch

from bitfold.cli import launch
from bitfold.cli.launch import as_spawned

#: What every rank imports anyway, imported once by the fork server: bitfold train's ranks'
#: modules, and the all-reduce's dense words.
PRELOAD = [*launch.PRELOAD, "bitfold.dense"]


def start_ranks(fn: Callable[..., Any], nprocs: int, args: tuple = ()) -> None:
    """``torch.multiprocessing.spawn(fn, args, nprocs, join=True)``, the ranks forked from the
    fork server; a rank's error is raised here as ``spawn`` raises it."""
    module = getattr(fn, "func", fn).__module__  # a functools.partial's function's module
    multiprocessing.set_forkserver_preload([*PRELOAD, module])  # read when the server starts
    torch.multiprocessing.start_processes(_rank, args=(fn, *args), nprocs=nprocs, join=True,
                                          start_method="forkserver")  # fmt: skip


def _rank(rank: int, fn: Callable[..., Any], *args: Any) -> None:
    as_spawned()
    fn(rank, *args)

