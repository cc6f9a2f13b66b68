"""The ``bitfold`` command line: ``bitfold probe | bench | train | diff | digest``.

Each subcommand lives in its own module (:data:`COMMANDS`), which exposes
``HELP`` (one line), ``configure(parser)`` and ``main(args) -> int``.
Modules are imported here only to build the parser; they import frameworks
only when they run. Beside the commands: ``hashed_layer_model`` (the hashed layer's model and
its one training loop, for probe and train), ``probe_devices`` and
``probe_report`` (the probe's CPU/CUDA backends and its printed report),
``train_models`` (the digits data and models of ``train``), the data-parallel
``train --world-size`` path (``parallel``: options and readout; ``launch``:
local processes or torchrun; ``parallel_rank``: one rank's training;
``parallel_task``: model, loss and readout; ``data_order``: shuffles and the
dealing of micro-batches; ``checkpoints``: atomic ``--save``/``--resume``),
``devices`` (the devices ``--device`` offers, from the registry, for probe and bench),
``json_report``, ``progress``, ``timing`` and ``torch_env`` (small helpers of the
commands).
The tools import the engine and :mod:`bitfold.repro`, never the reverse.
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from .._version import __version__
from ..errors import FoldError

#: subcommand -> module that implements it
COMMANDS = {
    "probe": "bitfold.cli.probe",
    "bench": "bitfold.cli.bench.command",
    "train": "bitfold.cli.train",
    "diff": "bitfold.cli.diff",
    "digest": "bitfold.cli.digest",
}


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, one subparser per available subcommand."""
    parser = argparse.ArgumentParser(
        prog="bitfold",
        description=(
            "Exact, bit-reproducible folds: the scatter-adds that sum a gradient into shared "
            "parameters (hashed layers, embeddings, graphs) through a fixed index, correctly "
            "rounded and the same bits on every run, thread count and device."
        ),
    )
    parser.add_argument("--version", action="version", version=f"bitfold {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS.items():
        if importlib.util.find_spec(module_name) is None:
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.configure(p)
        p.set_defaults(_module=module, _parser=p)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; a flag the subcommand does not know is refused with its own usage."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


@contextlib.contextmanager
def _interrupts_reach_main() -> Iterator[None]:
    """Deliver a Ctrl-C that Python would drop.

    A Ctrl-C that lands while C code has called back into Python (Numba's
    compiler does, through ctypes) cannot leave the callback: Python prints it
    as "Exception ignored ... KeyboardInterrupt" and carries on. Here it is
    silenced and raised again in the main thread a moment later.
    """
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            timer = threading.Timer(0.05, _thread.interrupt_main)
            timer.daemon = True
            timer.start()
            return
        previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous


def _stdout_closed() -> int:
    """The reader of stdout went away (``bitfold ... | head``): exit quietly, as Unix tools do."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail
    return 141  # 128 + SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for refused input, 130 on Ctrl-C)."""
    name = "bitfold"
    try:
        with _interrupts_reach_main():
            args = _parse(build_parser(), argv)
            name = f"bitfold {args.command}"
            return int(args._module.main(args) or 0)
    except FoldError as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _stdout_closed()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
