"""Build bitfold's Triton kernels for GPUs that are not here, in worker processes.

``triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget(...))``
builds a kernel variant (from ``kernel_targets.triton_all()``, beside this file)
for a named GPU without one: ``cuda`` is compute capability 9.0 (PTX and an
sm_90a cubin, assembled by the ``ptxas`` in Triton's wheel), ``hip`` is AMD's
gfx942 (AMDGCN assembly; the wheel links the code object itself, no ROCm needed).

The builds never run in the test process: with ``TRITON_INTERPRET=1`` set when
:mod:`bitfold.kernels.triton` is imported, its ``@triton.jit`` functions are
``InterpretedFunction`` objects, which ``triton.compile`` cannot build
(``'InterpretedFunction' object has no attribute 'cache_key'``). Workers start
without ``TRITON_INTERPRET`` whatever the test process has, and share the
variants (one a core). Triton's own on-disk cache keeps a rebuild of unchanged
kernels cheap.

As a script: ``python triton_machine_code.py OUT ARCH`` with ``[[index, name], ...]``
(JSON) on stdin builds those variants for ARCH into OUT: ``{index}.json``
(name, seconds, error) and the code, ``{index}.ptx`` and ``{index}.cubin`` or
``{index}.amdgcn``. A target the wheel cannot build for at all (a trivial
kernel fails too) is written to ``OUT/unavailable.txt`` instead.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
#: arch -> (GPUTarget arguments, the code kept, its file suffixes)
ARCHES = {
    "cuda": (("cuda", 90, 32), ("ptx", "cubin")),
    "hip": (("hip", "gfx942", 64), ("amdgcn",)),
}
NAME = re.compile(r"^(\w+)\[(\w+)(?:->(\w+))?(?:, init=(True|False))?\]$")


def parse(name: str) -> tuple[str, str, str | None, bool | None]:
    """``(kernel, value dtype, output dtype or None, init or None)`` of a variant's name."""
    found = NAME.match(name)
    assert found, f"unexpected variant name {name!r}"
    kernel, values, out, init = found.groups()
    return kernel, values, out, None if init is None else init == "True"


@dataclass
class Built:
    """One variant's build for one target: its code, or the error."""

    name: str
    seconds: float
    error: str | None
    code: dict[str, str | bytes]


@dataclass
class Builds:
    """The builds of some variants for one target, or why the target cannot be built for."""

    arch: str
    variants: dict[str, Built]
    unavailable: str | None
    wall_seconds: float


def jobs() -> int:
    """Worker processes: one a core this process may use, at most 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


def _weight(name: str) -> float:
    """A rough build cost (seconds on one core) to share the variants out evenly."""
    kernel, values, _out, _init = parse(name)
    if kernel == "round_rows":
        return 12.0 if values == "float64" else 3.0
    return {"hot": 2.5, "lanes": 1.0}.get(kernel, 0.6)


def build(names: list[str], arch: str, out: Path, workers: int | None = None,
          timeout: float = 1800.0) -> Builds:  # fmt: skip
    """Build ``names`` for ``arch`` in ``workers`` processes; read back what they wrote."""
    workers = max(1, min(workers or jobs(), len(names)))
    shares: list[list[tuple[int, str]]] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for i, name in sorted(enumerate(names), key=lambda t: -_weight(t[1])):
        w = loads.index(min(loads))
        shares[w].append((i, name))
        loads[w] += _weight(name)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    procs = []
    for w, share in enumerate(shares):
        log = (out / f"worker{w}.log").open("w")
        proc = subprocess.Popen([sys.executable, __file__, str(out), arch], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(share))
        proc.stdin.close()
        procs.append((proc, log))
    failed = []
    for w, (proc, log) in enumerate(procs):
        try:
            rc = proc.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
        if rc != 0:
            tail = (out / f"worker{w}.log").read_text()[-3000:]
            failed.append(f"worker {w} exited {rc}:\n{tail}")
    wall = time.perf_counter() - t0
    unavailable = out / "unavailable.txt"
    if unavailable.exists():
        return Builds(arch, {}, unavailable.read_text(), wall)
    variants: dict[str, Built] = {}
    for i, name in enumerate(names):
        meta = out / f"{i}.json"
        if not meta.exists():
            variants[name] = Built(name, 0.0, "no result: " + "\n".join(failed), {})
            continue
        info = json.loads(meta.read_text())
        code: dict[str, str | bytes] = {}
        for kind in ARCHES[arch][1]:
            path = out / f"{i}.{kind}"
            if path.exists():
                code[kind] = path.read_bytes() if kind == "cubin" else path.read_text()
        variants[name] = Built(name, info["seconds"], info["error"], code)
    return Builds(arch, variants, None, wall)


# -- the worker --------------------------------------------------------------------------------
def _probe(arch: str) -> str | None:
    """Why the wheel cannot build for ``arch`` here (a trivial kernel), or None when it can."""
    import triton
    from triton.backends import backends
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    args, _kinds = ARCHES[arch]
    backend = "amd" if args[0] == "hip" else "nvidia"
    if backend not in backends:
        return f"the triton {triton.__version__} wheel has no {backend!r} backend"
    sig = {"x_ptr": "*i64", "n": "i32"}
    try:
        triton.compile(ASTSource(_trivial_kernel(), sig, {}), target=GPUTarget(*args))
    except Exception as err:  # the whole message: which tool or library is missing
        return (f"triton {triton.__version__} cannot build even a trivial kernel for "
                f"{args[1]} here: {type(err).__name__}: {err}")  # fmt: skip
    return None


def _trivial_kernel():
    """A kernel that is not bitfold's: a failure to build it is the toolchain's."""
    import triton
    import triton.language as tl

    @triton.jit
    def trivial(x_ptr, n):
        i = tl.arange(0, 64)
        tl.atomic_add(x_ptr + i, i.to(tl.int64), mask=i < n, sem="relaxed")

    return trivial


def _worker(out: Path, arch: str, share: list[tuple[int, str]]) -> None:
    import triton
    from kernel_targets import triton_all
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    why = _probe(arch)
    if why:
        (out / "unavailable.txt").write_text(why)
        return
    args, kinds = ARCHES[arch]
    variants = {name: (kernel, sig, const) for name, kernel, sig, const in triton_all()}
    for i, name in share:
        t0 = time.perf_counter()
        error = None
        try:
            kernel, sig, const = variants[name]
            ck = triton.compile(ASTSource(kernel, sig, const), target=GPUTarget(*args))
            for kind in kinds:
                code = ck.asm[kind]
                path = out / f"{i}.{kind}"
                path.write_bytes(code) if isinstance(code, bytes) else path.write_text(code)
        except Exception:
            error = traceback.format_exc()[-4000:]
        info = {"name": name, "seconds": time.perf_counter() - t0, "error": error}
        (out / f"{i}.json").write_text(json.dumps(info))


if __name__ == "__main__":
    _worker(Path(sys.argv[1]), sys.argv[2], [tuple(t) for t in json.load(sys.stdin)])
