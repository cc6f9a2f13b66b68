"""Start the ranks of a data-parallel run: W local processes, or this process under ``torchrun``.

:func:`torchrun_rank` reads the environment that ``torchrun`` (or any
launcher following its convention) sets: ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``; the rank then joins the group with
``init_method="env://"`` and runs in this process.

:func:`run_local` starts ``world_size`` Python processes that meet through a file
rendezvous in a temporary folder, runs ``target(rank, world_size,
init_method, job)`` in each, and collects what every rank returned or
raised. When a rank fails, the launcher waits for the others to stop on
their own (they raise within their collectives' timeout: a rank that died
is noticed within it, one that raised at once, sooner) and then stops what
is left, so a run never hangs and never returns a partial result: any
failure is one :class:`bitfold.errors.FoldError` naming what happened to
each rank. On Linux the ranks are forked from ``multiprocessing``'s fork
server, which imports torch and bitfold once, at the first launch of a
command (about 1 CPU-second a rank to start instead of 3 to 4 for a fresh
interpreter); the server has run no threads' work, so forking it is safe, and
it keeps the command's environment. Elsewhere each rank is a fresh
interpreter (*spawn*).

:func:`leave` ends a rank's process once its result is on disk, without the
interpreter's teardown: torch's gloo worker threads may still be releasing a
finished collective then, the release needs the interpreter, and during
teardown it aborts the process (SIGABRT, "terminate called without an active
exception") after all the work was done.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from ..errors import DistributedError, FoldError

#: Seconds the launcher waits for the other ranks after one raised an error itself.
GRACE = 5.0
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` when a launcher such as ``torchrun`` started this process."""
    if not all(k in os.environ for k in _ENV):
        return None
    try:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    except ValueError:
        raise FoldError(
            f"RANK={os.environ['RANK']!r} and WORLD_SIZE={os.environ['WORLD_SIZE']!r} must be "
            "integers (they are set by torchrun)"
        ) from None


def leave(code: int = 0) -> NoReturn:
    """End this process now with exit status ``code``: flush stdout and stderr, skip the teardown.

    For a rank whose results are written: a normal interpreter exit can abort the process when
    a gloo worker thread of torch releases its last finished collective (the release takes the
    interpreter's lock, which teardown no longer grants). Files the caller opened must be closed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def as_spawned() -> None:
    """Make a forked rank start further processes as *spawn* does (a rank starts none): a
    forked process's first Numba parallel kernel guards its thread pool with a named semaphore,
    which :func:`leave` would leave behind (a warning about leaked semaphores at the launcher's
    exit); under *spawn* Numba needs none."""
    import multiprocessing

    multiprocessing.set_start_method("spawn", force=True)


def _child(target: Callable[..., dict[str, Any]], rank: int, world_size: int, init: str,
           job: Any, out: str) -> None:
    """A rank: run ``target`` and leave its result or its error in the file ``out``."""
    as_spawned()
    try:
        result = {"ok": target(rank, world_size, init, job)}
        code = 0
    except BaseException as err:  # every failure is reported to the launcher
        if not isinstance(err, FoldError | KeyboardInterrupt):
            traceback.print_exc()
        text = str(err).strip() or type(err).__name__
        result = {"error": text, "type": type(err).__name__,
                  "refusal": isinstance(err, FoldError) and not isinstance(err, DistributedError)}
        code = 1
    tmp = f"{out}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(tmp, out)
    leave(code)  # also after a failure: a broken process group must not hang the exit


def _exit_story(code: int | None) -> str:
    if code is None:
        return "did not stop"
    if code < 0:
        try:
            return f"died (killed by signal {signal.Signals(-code).name})"
        except ValueError:
            return f"died (killed by signal {-code})"
    return f"died (exit status {code}) without reporting an error"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _wait(procs: list[Any], files: list[Path], timeout: float) -> list[str | None]:
    """Wait for every process; after a failure, stop the ones left. Returns who was stopped."""
    deadline = None
    stopped: list[str | None] = [None] * len(procs)
    while any(p.is_alive() for p in procs):
        if deadline is None:
            failed = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed:  # a rank that died unreported leaves the others their whole timeout
                died = any(_read(files[i]) is None for i in failed)
                deadline = time.monotonic() + (timeout + GRACE if died else GRACE)
        elif time.monotonic() > deadline:
            for i, p in enumerate(procs):
                if p.is_alive():
                    p.terminate()
                    stopped[i] = ("still running after the others had stopped (hung?); stopped by "
                                  "the launcher")  # fmt: skip
            break
        time.sleep(0.1)
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
    return stopped


def _failure(world_size: int, stories: list[tuple[int, str, bool]]) -> FoldError:
    """One error for a failed run: a plain refusal (bad option) as it is; otherwise every rank."""
    if stories and all(refusal for _, _, refusal in stories) and stories[0][0] == 0:
        return FoldError(stories[0][1])
    first = [s for s in stories if s[1].startswith(("died", "still running"))]
    ordered = first + [s for s in stories if s not in first]
    lines = [f"rank {r}: {text if len(text) < 600 else text[:600] + '...'}"
             for r, text, _ in ordered]  # fmt: skip
    return DistributedError(
        f"the run on {world_size} processes stopped:\n  " + "\n  ".join(lines)
    )


#: What every rank imports, imported once by the fork server.
PRELOAD = ("torch", "torch.distributed", "torch._dynamo", "torch.optim", "bitfold.torch",
           "bitfold.distributed", __name__)  # fmt: skip


def _context(target: Callable[..., Any]) -> Any:
    """The fork server's context on Linux (the modules every rank needs preloaded), else spawn's."""
    import multiprocessing

    if not sys.platform.startswith("linux"):
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, target.__module__])  # read when the server starts
    return ctx


def run_local(target: Callable[..., dict[str, Any]], world_size: int, job: Any,
              timeout: float) -> list[dict[str, Any]]:
    """Run ``target`` on ``world_size`` local processes; every rank's result, by rank."""
    ctx = _context(target)
    folder = Path(tempfile.mkdtemp(prefix="bitfold-train-"))
    init = (folder / "rendezvous").as_uri()
    files = [folder / f"rank{r}.json" for r in range(world_size)]
    procs = [ctx.Process(target=_child, name=f"bitfold-train-rank{r}",
                         args=(target, r, world_size, init, job, str(files[r])))
             for r in range(world_size)]  # fmt: skip
    try:
        for p in procs:
            p.start()
        stopped = _wait(procs, files, timeout)
        results: list[dict[str, Any]] = []
        stories: list[tuple[int, str, bool]] = []
        for r, p in enumerate(procs):
            got = _read(files[r])
            if got is not None and "ok" in got:
                results.append(got["ok"])
            elif got is not None:
                refusal = bool(got["refusal"])
                text = got["error"] if refusal else f"{got['type']}: {got['error']}"
                stories.append((r, text, refusal))
            else:
                stories.append((r, stopped[r] or _exit_story(p.exitcode), False))
        if stories:
            raise _failure(world_size, stories)
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(folder, ignore_errors=True)
