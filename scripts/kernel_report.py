#!/usr/bin/env python3
"""``make kernel-report``: the Triton kernels' performance budget, read from their machine code.

No GPU is needed. Every kernel variant the folds and the all-reduce launch
(``triton_all()`` of ``tests/kernel_targets.py``: the variants of
:mod:`bitfold.kernels.triton` and :mod:`bitfold.kernels.triton_words`), the
lanes kernel also with ``WORD=False`` (its limb path alone), and the launch
shapes the backend picks for scalar folds and rows of 64
(``BLOCK_K``/``BLOCK_D``/``BLOCK_N`` differ from those variants' there) is
built with ``triton.compile(ASTSource(...), target=GPUTarget(...))`` in worker
processes (as ``tests/triton_machine_code.py`` does) for sm_90, and for AMD
gfx942 where Triton's wheel builds it. For each:

* registers, spill stores and loads (``ptxas -arch=sm_90a -v`` on the PTX: the
  ptxas in Triton's wheel, with the flags Triton builds the cubin with, and the
  CUDA toolkit's ``ptxas`` on PATH beside it), local-memory instructions in the
  SASS (``STL``/``LDL``, read with ``nvdisasm``), shared memory (Triton's dynamic
  shared memory plus the 1 KiB a block the driver reserves on sm_90);
* occupancy on an H200 (65,536 registers, 228 KiB shared memory, 64 warps and
  32 blocks an SM);
* its loops: a backward branch and its target in the SASS, mapped to the
  Triton source loop whose lines its instructions carry (``nvdisasm -gi``);
  instructions an iteration (an unrolled body divided by its unroll factor, the
  ratio of its global loads to the one-iteration copy's), and instructions a
  value: an iteration's instructions times the program's threads divided by the
  values it handles (thread instructions a value: a lane kernel whose block is
  smaller than its threads repeats the work in every warp);
* gfx942: VGPRs, SGPRs, spills, scratch and LDS from the code object's
  metadata, and the loops' instructions the same way.

Then a model of each configuration of ``scripts/gpu_check.py`` (float32
values, float32 output: what that check times), from the plan's real shape
(the same index and values, ``default_rng(0)``) and the machine code: every
launch of :func:`bitfold.backends.triton.fold_exact`, its bytes, instructions,
occupancy and an estimated time, against torch's atomic ``index_add_`` timed
on an H200 (``benchmarks/results/gpu-2026-12-04*-h200/gpu_bench.json``). The
assumptions are in :data:`H200` and :data:`ASSUMPTIONS` and written into the
report. Output: ``README.md`` (tables, goals, assumptions) and ``report.json``
in ``benchmarks/results/DATE-kernel-report-sm90/`` (``--out``).

    python scripts/kernel_report.py [--out DIR] [--only NAME ...] [--no-amd] [--no-model]

As a worker: ``python scripts/kernel_report.py --worker OUT ARCH`` with ``[[index, name],
...]`` (JSON) on stdin builds those variants into OUT (``{index}.json``, ``.ptx``,
``.cubin``, ``.amdgcn``).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import functools
import glob
import importlib.util
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
KERNEL_FILES = ("bitfold/kernels/triton.py", "bitfold/kernels/triton_words.py")
RESULTS = ROOT / "benchmarks" / "results"


def _module(name: str, path: Path) -> Any:
    """A module of tests/ or scripts/, loaded by path (once)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _tmc() -> Any:
    return _module("triton_machine_code", ROOT / "tests" / "triton_machine_code.py")


def _machine_code() -> Any:
    return _module("machine_code", ROOT / "tests" / "machine_code.py")


def _kernel_targets() -> Any:
    return _module("kernel_targets", ROOT / "tests" / "kernel_targets.py")


def _src_on_path() -> None:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))


# -- the variants -----------------------------------------------------------------------------
#: Row sizes whose launch shapes are built beside the listed variants: scalar folds and rows of 64
#: (the GPU check's configurations), and for float32 the hot kernel's other shapes.
SHAPE_DS = (1, 64)
DTYPES = ("float16", "bfloat16", "float32", "float64")
HOT_SWEEP_DS = (2, 4, 8, 16, 32, 256, 512)
NAME = re.compile(r"^(\w+)\[([^\]]*)\]$")


@dataclass(frozen=True)
class Variant:
    """One kernel variant: its name, kernel function and constexpr arguments."""

    name: str
    kernel: str  # the family: lanes, round_rows, hot, scatter, ordered, bounds, words, decode
    values: str  # value dtype (decode: int64)
    out: str | None
    init: bool | None
    const: dict[str, Any]
    launched: bool  # False: built for comparison only (lanes with WORD=False)
    shape_of: tuple[int, ...] = ()  # row sizes D whose launch this shape is (extra shapes)


def parse(name: str) -> tuple[str, str, str | None, bool | None, dict[str, str]]:
    """``(kernel, values, out, init, extra constexprs)`` of a variant's name."""
    found = NAME.match(name)
    assert found, f"unexpected variant name {name!r}"
    kernel, inside = found.groups()
    parts = [p.strip() for p in inside.split(",")]
    values, _, out = parts[0].partition("->")
    init, extra = None, {}
    for p in parts[1:]:
        key, _, value = p.partition("=")
        if key == "init":
            init = value == "True"
        else:
            extra[key] = value
    return kernel, values, out or None, init, extra


def _named(base: str, extra: dict[str, Any]) -> str:
    return base[:-1] + "".join(f", {k}={v}" for k, v in extra.items()) + "]"


def lanes_shape(dtype: str, D: int) -> dict[str, int]:
    """The lanes kernel's block of a fold of rows of ``D`` (the backend's ``exact_launch``)."""
    from bitfold.backends import triton as backend
    from bitfold.formats import limb_format_for

    block_d = min(_next_pow2(D), 64)
    return {"BLOCK_K": max(1, backend.LANES[limb_format_for(dtype).name] // block_d),
            "BLOCK_D": block_d}  # fmt: skip


def hot_shape(D: int) -> dict[str, int]:
    """The hot kernel's block of a fold of rows of ``D`` with the default chunk."""
    from bitfold.backends import triton as backend

    block_d = min(_next_pow2(D), 64)
    chunk = max(16, backend.CHUNK_VALUES // max(D, 1))
    return {"BLOCK_N": max(1, min(_next_pow2(chunk), backend.HOT_TILE // block_d)),
            "BLOCK_D": block_d}


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def targets() -> list[tuple[Variant, Any, dict[str, str]]]:
    """Every variant: ``(Variant, kernel function, signature)``."""
    _src_on_path()
    out: list[tuple[Variant, Any, dict[str, str]]] = []
    seen: set[tuple[str, str]] = set()

    def add(name: str, fn: Any, sig: dict[str, str], const: dict[str, Any],
            launched: bool) -> None:  # fmt: skip
        key = (name.split("[")[0], json.dumps({k: const[k] for k in sorted(const)}, default=str))
        if key in seen:  # a launch shape triton_all() already builds
            return
        seen.add(key)
        kernel, values, o, init, _ = parse(name)
        out.append((Variant(name, kernel, values, o, init, dict(const), launched), fn, sig))

    listed = _kernel_targets().triton_all()
    for name, fn, sig, const in listed:
        add(name, fn, sig, const, True)
    for name, fn, sig, const in listed:
        if name.startswith("lanes["):
            add(_named(name, {"WORD": False}), fn, sig, {**const, "WORD": False}, False)
    by_name = {name: (fn, sig, const) for name, fn, sig, const in listed}
    wanted: list[tuple[str, dict[str, int], int]] = []  # (triton_all() name, shape, D)
    for dtype in DTYPES:
        for D in SHAPE_DS:
            wanted.append((f"lanes[{dtype}->{dtype}, init=False]", lanes_shape(dtype, D), D))
        for D in SHAPE_DS + (HOT_SWEEP_DS if dtype == "float32" else ()):
            wanted.append((f"hot[{dtype}]", hot_shape(D), D))
    for base, shape, _D in wanted:
        fn, sig, const = by_name[base]
        add(_named(base, shape), fn, sig, {**const, **shape}, True)
    shapes: dict[str, set[int]] = {}
    for base, shape, D in wanted:
        shapes.setdefault(str(variant_for(out, base, shape)), set()).add(D)
    return [(Variant(v.name, v.kernel, v.values, v.out, v.init, v.const, v.launched,
                     tuple(sorted(shapes.get(v.name, ())))), fn, sig) for v, fn, sig in out]


def variant_for(variants: list[tuple[Variant, Any, dict[str, str]]] | list[Variant], base: str,
                shape: dict[str, int]) -> str | None:  # fmt: skip
    """The name of the variant built for ``base`` (a triton_all() name) at ``shape``."""
    vs = [v[0] if isinstance(v, tuple) else v for v in variants]
    const = next((v.const for v in vs if v.name == base), None)
    if const is None:
        return None
    want = {**const, **shape}
    for v in vs:
        if v.launched and v.const == want and parse(v.name)[:4] == parse(base)[:4]:
            return v.name
    return None


# -- building -----------------------------------------------------------------------------------
ARCHES = {"cuda": (("cuda", 90, 32), ("ptx", "cubin")), "hip": (("hip", "gfx942", 64), ("amdgcn",))}


def _weight(name: str) -> float:
    kernel, values, _out, _init, extra = parse(name)
    if kernel == "round_rows":
        return 12.0 if values == "float64" else 3.0
    if kernel == "hot":
        return 8.0 if extra.get("BLOCK_D") == "1" else 2.5
    return {"lanes": 1.5}.get(kernel, 0.6)


def build(names: list[str], arch: str, out: Path, workers: int | None = None,
          timeout: float = 3600.0) -> dict[str, Any]:  # fmt: skip
    """Build ``names`` for ``arch`` in worker processes; ``{"unavailable": why or None,
    "wall_seconds": s, "variants": {name: {seconds, error, shared, num_warps, files}}}``."""
    tmc = _tmc()
    workers = max(1, min(workers or tmc.jobs(), len(names)))
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
        proc = subprocess.Popen([sys.executable, __file__, "--worker", str(out), arch], env=env,
                                text=True, stdin=subprocess.PIPE, stdout=log,
                                stderr=subprocess.STDOUT)  # fmt: skip
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
    result: dict[str, Any] = {"unavailable": None, "wall_seconds": time.perf_counter() - t0,
                              "variants": {}}  # fmt: skip
    if (out / "unavailable.txt").exists():
        result["unavailable"] = (out / "unavailable.txt").read_text()
        return result
    for i, name in enumerate(names):
        meta = out / f"{i}.json"
        if not meta.exists():
            result["variants"][name] = {"error": "no result: " + "\n".join(failed), "files": {}}
            continue
        info = json.loads(meta.read_text())
        info["files"] = {kind: str(out / f"{i}.{kind}") for kind in ARCHES[arch][1]
                         if (out / f"{i}.{kind}").exists()}  # fmt: skip
        result["variants"][name] = info
    return result


def _worker(out: Path, arch: str, share: list[tuple[int, str]]) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    why = _tmc()._probe(arch)
    if why:
        (out / "unavailable.txt").write_text(why)
        return
    args, kinds = ARCHES[arch]
    table = {v.name: (fn, sig, v.const) for v, fn, sig in targets()}
    for i, name in share:
        t0 = time.perf_counter()
        info: dict[str, Any] = {"name": name, "error": None}
        try:
            fn, sig, const = table[name]
            ck = triton.compile(ASTSource(fn, sig, const), target=GPUTarget(*args))
            for kind in kinds:
                code = ck.asm[kind]
                path = out / f"{i}.{kind}"
                path.write_bytes(code) if isinstance(code, bytes) else path.write_text(code)
            info.update(shared=int(ck.metadata.shared), num_warps=int(ck.metadata.num_warps),
                        num_stages=int(ck.metadata.num_stages))  # fmt: skip
        except Exception:
            info["error"] = traceback.format_exc()[-4000:]
        info["seconds"] = time.perf_counter() - t0
        (out / f"{i}.json").write_text(json.dumps(info))


# -- reading the machine code -----------------------------------------------------------------
@dataclass
class Inst:
    op: str  # opcode with modifiers
    text: str  # the whole instruction (predicate dropped)
    src: tuple[str, int] | None  # (kernel file, line) where it is one of bitfold's kernel files


@dataclass
class Code:
    insts: list[Inst]
    labels: dict[str, int]  # label -> index of the instruction after it
    branches: dict[int, str]  # instruction index -> target label


_SASS_LINE = re.compile(r'^\s*//## File "([^"]+)", line (\d+)')
_SASS_LABEL = re.compile(r"^(\.L_x_\d+):")
_SASS_INST = re.compile(
    r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
_SASS_BRANCH = re.compile(r"`\((\.L_x_\d+)\)")


def _kernel_file(path: str) -> str | None:
    path = path.replace("\\", "/")
    for name in KERNEL_FILES:
        if path.endswith(name):
            return name
    return None


def read_sass(text: str) -> Code:
    """``nvdisasm -c -gi`` output -> instructions with source lines, labels, branches."""
    insts: list[Inst] = []
    labels: dict[str, int] = {}
    branches: dict[int, str] = {}
    src: tuple[str, int] | None = None
    for line in text.splitlines():
        found = _SASS_LINE.match(line)
        if found:
            f = _kernel_file(found.group(1))
            src = (f, int(found.group(2))) if f else None
            continue
        found = _SASS_LABEL.match(line)
        if found:
            labels[found.group(1)] = len(insts)
            continue
        found = _SASS_INST.match(line)
        if found:
            op, rest = found.group(1), found.group(2)
            if op.startswith("BRA") or op.startswith("BRX"):
                target = _SASS_BRANCH.search(rest)
                if target:
                    branches[len(insts)] = target.group(1)
            insts.append(Inst(op, f"{op}{rest}", src))
    return Code(insts, labels, branches)


_AMD_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s+"([^"]*)")?')
_AMD_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)")
_AMD_LABEL = re.compile(r"^(\.LBB\d+_\d+):")
_AMD_INST = re.compile(r"^\s+([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*)\b(.*)$")
_AMD_BRANCH = re.compile(r"^s_(?:c?branch\w*)$")


def read_amdgcn(text: str) -> Code:
    """The kernel's AMDGCN text (up to ``.Lfunc_end``) -> instructions, labels, branches."""
    files: dict[str, str] = {}
    insts: list[Inst] = []
    labels: dict[str, int] = {}
    branches: dict[int, str] = {}
    src: tuple[str, int] | None = None
    started = False
    for line in text.splitlines():
        found = _AMD_FILE.match(line)
        if found:
            files[found.group(1)] = "/".join(filter(None, [found.group(2), found.group(3)]))
            continue
        if not started:
            started = bool(re.match(r"^\w+:", line)) and not line.startswith(".")
            continue
        if line.startswith(".Lfunc_end"):
            break
        found = _AMD_LOC.match(line)
        if found:
            f = _kernel_file(files.get(found.group(1), ""))
            src = (f, int(found.group(2))) if f else None
            continue
        found = _AMD_LABEL.match(line)
        if found:
            labels[found.group(1)] = len(insts)
            continue
        line = line.split(";", 1)[0]
        found = _AMD_INST.match(line)
        if found and not line.strip().startswith("."):
            op, rest = found.group(1), found.group(2)
            if _AMD_BRANCH.match(op):
                target = re.search(r"(\.LBB\d+_\d+)", rest)
                if target:
                    branches[len(insts)] = target.group(1)
            insts.append(Inst(op, f"{op}{rest}", src))
    return Code(insts, labels, branches)


@dataclass(frozen=True)
class SourceLoop:
    file: str
    function: str
    ordinal: int  # its place among the function's non-static loops
    line: int
    end: int


@functools.cache
def source_loops() -> list[SourceLoop]:
    """Every ``for`` loop of the kernel files that can stay a loop (``tl.static_range`` is
    unrolled by Triton), with the function it is written in."""
    found: list[SourceLoop] = []
    for name in KERNEL_FILES:
        tree = ast.parse((SRC / name).read_text())
        for fn in tree.body:
            if not isinstance(fn, ast.FunctionDef):
                continue
            loops = [n for n in ast.walk(fn) if isinstance(n, ast.For)
                     and "static_range" not in ast.unparse(n.iter)]  # fmt: skip
            for i, n in enumerate(sorted(loops, key=lambda n: n.lineno)):
                found.append(SourceLoop(name, fn.name, i, n.lineno, n.end_lineno or n.lineno))
    return found


@functools.cache
def source_functions() -> dict[str, list[tuple[int, int, str]]]:
    """Each kernel file's functions: ``(first line, last line, name)``."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    for name in KERNEL_FILES:
        tree = ast.parse((SRC / name).read_text())
        found[name] = [(fn.lineno, fn.end_lineno or fn.lineno, fn.name) for fn in tree.body
                       if isinstance(fn, ast.FunctionDef)]  # fmt: skip
    return found


def by_function(body: list[Inst], functions: dict[str, list[tuple[int, int, str]]]) -> dict[
        str, int]:  # fmt: skip
    """How many of ``body``'s instructions each source function accounts for (inlined helpers
    by their own name; Triton's library code and unattributed ones as ``(triton)``)."""
    counts: Counter[str] = Counter()
    for x in body:
        name = "(triton)"
        if x.src:
            f, line = x.src
            name = next((n for a, b, n in functions.get(f, []) if a <= line <= b), "(other)")
        counts[name] += 1
    return dict(counts.most_common())


#: Source loops that handle values: (function, ordinal) -> (label, values an iteration).
VALUE_LOOPS: dict[tuple[str, int], tuple[str, Any]] = {
    ("lanes_kernel", 0): ("word", lambda c: c["BLOCK_K"] * c["BLOCK_D"]),  # float64 values
    ("lanes_kernel", 1): ("word", lambda c: c["BLOCK_K"] * c["BLOCK_D"]),  # the narrow ones
    ("lanes_kernel", 2): ("limbs", lambda c: c["BLOCK_K"] * c["BLOCK_D"]),
    ("hot_kernel", 0): ("chunk", lambda c: c["BLOCK_N"] * c["BLOCK_D"]),
    ("hot_kernel", 1): ("limb pass", lambda c: c["BLOCK_N"] * c["BLOCK_D"]),  # float64 values
    ("hot_kernel", 2): ("limb pass", lambda c: c["BLOCK_N"] * c["BLOCK_D"]),  # the narrow ones
    ("hot_kernel", 3): ("merge", None),
    ("ordered_kernel", 0): ("run", lambda c: c["BLOCK_K"] * c["BLOCK_D"]),
    ("_carry", 0): ("carry", None),
}
#: Kernels without a value loop: the values (round_rows: rows) a program handles once each.
STRAIGHT_VALUES: dict[str, Any] = {
    "scatter": lambda c: c["BLOCK_N"] * c["BLOCK_D"],
    "round_rows": lambda c: c["BLOCK"],
    "bounds": lambda c: c["BLOCK"] * c["BLOCKS"],
    "words": lambda c: c["BLOCK"] * c["BLOCKS"],
    "decode": lambda c: c["BLOCK"] * c["BLOCKS"],
}
_GLOBAL_LOAD = re.compile(r"^(LDG|global_load|buffer_load|flat_load)")
_BARRIER = re.compile(r"^(BAR\.|s_barrier)")
_REG = re.compile(r"\bR(\d+)(\.64)?\b")


def _regs(operand: str, wide: bool) -> list[int]:
    regs = []
    for n, pair in _REG.findall(operand):
        regs.append(int(n))
        if pair or wide:
            regs.append(int(n) + 1)
    return regs


def load_depth(insts: list[Inst]) -> int:
    """The longest chain of dependent global loads in straight-line SASS (a load whose address
    comes from an earlier load's value is one deeper); branches and predicates ignored."""
    depth: dict[int, int] = {}
    deepest = 0
    for inst in insts:
        operands = [o.strip() for o in inst.text[len(inst.op):].split(",")]
        if not operands or not operands[0]:
            continue
        stores = inst.op.startswith(("ST", "RED", "ATOM", "BRA", "BAR", "EXIT", "RET", "CALL"))
        wide = ".64" in inst.op or ".WIDE" in inst.op
        dests = [] if stores else _regs(operands[0], wide)
        sources = [r for o in (operands if stores else operands[1:]) for r in _regs(o, False)]
        d = max((depth.get(r, 0) for r in sources), default=0)
        if _GLOBAL_LOAD.match(inst.op):
            d += 1
            deepest = max(deepest, d)
            if ".128" in inst.op:
                dests = [r + i for r in dests[:1] for i in range(4)]
        for r in dests:
            depth[r] = d
    return deepest


def loops_of(code: Code, consts: dict[str, Any], threads: int,
             known: list[SourceLoop]) -> list[dict[str, Any]]:  # fmt: skip
    """Every loop of the machine code: its span, own instructions (nested loops excluded), the
    source loop it belongs to, loads, load depth, barriers, values an iteration."""
    functions = source_functions()
    spans: dict[int, int] = {}
    for i, label in code.branches.items():
        s = code.labels.get(label)
        if s is not None and s < i:  # a backward branch: a loop [s, i]
            spans[s] = max(spans.get(s, i), i)
    loops = [{"start": s, "end": e} for s, e in sorted(spans.items())]
    for lp in loops:
        inner = [o for o in loops if o is not lp and lp["start"] <= o["start"]
                 and o["end"] <= lp["end"]]  # fmt: skip
        direct = [o for o in inner if not any(o is not x and x["start"] <= o["start"]
                  and o["end"] <= x["end"] for x in inner)]  # fmt: skip
        own = [i for i in range(lp["start"], lp["end"] + 1)
               if not any(o["start"] <= i <= o["end"] for o in direct)]  # fmt: skip
        body = [code.insts[i] for i in own if code.insts[i].op != "NOP"]
        lp["instructions"] = len(body)
        lp["children"] = [(o["start"], o["end"]) for o in direct]
        lp["loads"] = sum(1 for x in body if _GLOBAL_LOAD.match(x.op))
        lp["load_depth"] = load_depth(body)
        lp["barriers"] = sum(1 for x in body if _BARRIER.match(x.op))
        lp["atomics"] = sum(1 for x in body if x.op.startswith(("RED", "ATOM", "global_atomic")))
        lp["by_function"] = by_function(body, functions)
        lines = Counter(x.src for x in body if x.src)
        # a loop inside another maps to a source loop inside the outer one's, where its lines
        # allow (ptxas may move or rematerialise outer code into an inner loop)
        outer = [o for o in loops if o is not lp and o["start"] <= lp["start"]
                 and lp["end"] <= o["end"] and o.get("_sl")]  # fmt: skip
        parent = min(outer, key=lambda o: o["end"] - o["start"])["_sl"] if outer else None
        inside = [sl for sl in known if parent and sl.file == parent.file
                  and parent.line < sl.line and sl.end <= parent.end]  # fmt: skip
        sl = _best_source(lines, inside) or _best_source(lines, known)
        lp["_sl"] = sl
        lp["source"] = f"{sl.function}:{sl.line}" if sl else None
        label, per = VALUE_LOOPS.get((sl.function, sl.ordinal), (None, None)) if sl else (None,
                                                                                          None)
        lp["label"] = label or (f"{sl.function}#{sl.ordinal}" if sl else "unmapped")
        lp["values_per_iteration"] = per(consts) if per else None
    for lp in loops:
        del lp["_sl"]
    # one source loop, several machine loops: an unrolled body and its one-iteration remainder
    groups: dict[str, list[dict[str, Any]]] = {}
    for lp in loops:
        if lp["end"] - lp["start"] >= 1 and lp["source"]:
            groups.setdefault(lp["source"], []).append(lp)
    for lps in groups.values():
        smallest = min(lps, key=lambda x: x["instructions"])
        for lp in lps:
            if lp is smallest or smallest["instructions"] == 0:
                lp["unroll"] = 1
            elif lp["loads"] and smallest["loads"]:
                lp["unroll"] = max(1, round(lp["loads"] / smallest["loads"]))
            else:
                lp["unroll"] = max(1, round(lp["instructions"] / smallest["instructions"]))
            lp["per_iteration"] = lp["instructions"] / lp["unroll"]
            v = lp["values_per_iteration"]
            lp["per_value"] = lp["per_iteration"] * threads / v if v else None
    return [lp for lp in loops if lp["end"] - lp["start"] >= 1 and "unroll" in lp]


def _best_source(lines: Counter, candidates: list[SourceLoop]) -> SourceLoop | None:
    """The source loop holding most of ``lines`` (instructions by line); ties: the innermost."""
    best: tuple[int, int, SourceLoop] | None = None
    for sl in candidates:
        n = sum(c for (f, ln), c in lines.items() if f == sl.file and sl.line <= ln <= sl.end)
        if n and (best is None or (n, -(sl.end - sl.line)) > best[:2]):
            best = (n, -(sl.end - sl.line), sl)
    return best[2] if best else None


def straight_line(code: Code, loops: list[dict[str, Any]]) -> list[Inst]:
    inside = {i for lp in loops for i in range(lp["start"], lp["end"] + 1)}
    return [x for i, x in enumerate(code.insts) if i not in inside and x.op != "NOP"]


#: Loops whose code (with the straight-line code around them) sits under a branch that a
#: program takes only when it has trips for them: the lanes' limbs, which a program whose lanes
#: all hold the word's certificate skips (``if tl.max(walk_limbs) > 0``).
GUARDED = ("limbs",)


def guarded_regions(code: Code, loops: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """For each :data:`GUARDED` loop: the largest span a forward branch jumps over (or that
    follows an ``EXIT``: ptxas turns a branch around the kernel's tail into a predicated
    exit) that holds it and no other value loop, and the straight-line instructions in that
    span (a program without trips for the loop runs none of them)."""
    out: dict[str, dict[str, int]] = {}
    jumps = [(i, code.labels.get(target)) for i, target in code.branches.items()]
    jumps += [(i, len(code.insts)) for i, x in enumerate(code.insts) if x.op == "EXIT"]
    for label in GUARDED:
        mine = [lp for lp in loops if lp["label"] == label]
        others = [lp for lp in loops if lp["label"] not in (label, "carry")
                  and lp["values_per_iteration"]]  # fmt: skip
        if not mine:
            continue
        best: tuple[int, int] | None = None
        for i, j in jumps:
            if j is None or j <= i:
                continue
            holds = all(i < lp["start"] and lp["end"] < j for lp in mine)
            clear = not any(i < lp["end"] and lp["start"] < j for lp in others)
            if holds and clear and (best is None or j - i > best[1] - best[0]):
                best = (i, j)
        if best is None:
            continue
        inside = {k for lp in loops for k in range(lp["start"], lp["end"] + 1)}
        n = sum(1 for k in range(best[0] + 1, best[1])
                if k not in inside and code.insts[k].op != "NOP")  # fmt: skip
        out[label] = {"start": best[0], "end": best[1], "straight_instructions": n}
    return out


def summarize_loops(loops: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per source loop: the steady state (the largest body, unrolled, per iteration) and the
    remainder's body."""
    out: dict[str, dict[str, Any]] = {}
    for lp in loops:
        key = lp["label"]
        entry = out.setdefault(key, {"source": lp["source"], "machine_loops": 0})
        entry["machine_loops"] += 1
        big = entry.get("_big")
        if big is None or lp["instructions"] > big["instructions"]:
            entry["_big"] = lp
        small = entry.get("_small")
        if small is None or lp["instructions"] < small["instructions"]:
            entry["_small"] = lp
    for entry in out.values():
        big, small = entry.pop("_big"), entry.pop("_small")
        entry.update(
            per_iteration=round(big["per_iteration"], 2), unroll=big["unroll"],
            per_value=None if big["per_value"] is None else round(big["per_value"], 2),
            loads_per_iteration=big["loads"] / big["unroll"],
            load_depth=big["load_depth"], barriers=big["barriers"],
            remainder=small["instructions"] if small is not big else None,
            by_function={k: round(n / big["unroll"], 2) for k, n in big["by_function"].items()},
            values_per_iteration=big["values_per_iteration"],
        )  # fmt: skip
    return out


# -- per variant -------------------------------------------------------------------------------
#: An H200 (GH100, SXM): what occupancy and the model use.
H200 = {
    "sms": 132,
    "registers_per_sm": 65536,
    "register_granule_per_warp": 256,
    "max_registers_per_thread": 255,
    "shared_per_sm": 233472,  # 228 KiB
    "reserved_shared_per_block": 1024,
    "max_warps_per_sm": 64,
    "max_blocks_per_sm": 32,
    "dram_bytes_per_s": 4.8e12,
    "l2_bytes": 50 * 2**20,
    "clock_hz": 1.98e9,
}
#: The model's other assumptions (see ASSUMPTIONS for the words).
MODEL = {
    "l2_bytes_per_s": 7.0e12,
    "warp_instructions_per_clock_per_sm": 2.0,
    "global_load_latency_cycles": 500,
    "barrier_cycles": 100,
    "launch_us": 2.0,
    "same_address_atomic_ns": 1.0,
    "sector_bytes": 32,
}
ASSUMPTIONS = [
    "Device time only: the host's share of a call (dispatch, launches; the GPU check's "
    "`host_us`) is not modelled. torch's `index_add_` times are the GPU check's wall times "
    "(`us`), which for it are device-bound except perhaps at K = 10^6 (host 22-31 us of 40).",
    "Every launch costs {launch_us} us (back-to-back kernels on one stream), plus the largest "
    "of five roofs: DRAM bytes at 4.8 TB/s; L2 traffic at {l2_tb} TB/s; instruction issue at "
    "{ipc} warp instructions a clock an SM (integer code: the 64 INT32 lanes of an SM) at "
    "{ghz} GHz on 132 SMs; the programs' critical paths; same-address atomics at "
    "{atomic_ns} ns each.",
    "DRAM bytes: every array a kernel touches, once (the GPU check's arrays fit the 50 MB L2 "
    "once read, and a second pass over a lane's run hits L2). L2 traffic: 32-byte sectors a "
    "warp's load touches, counted from the plan (a gather of a scalar value is a sector a "
    "value; rows of 64 float32 are 4 bytes a value), stores and atomics 8 bytes each.",
    "Critical path of a program: its instructions at one a clock, plus {lat} cycles for each "
    "level of dependent global loads (order, then the values it points to: the SASS's chain; "
    "an unrolled loop body overlaps its iterations' loads) and {bar} cycles a barrier. A "
    "kernel's programs run in the slots occupancy gives (blocks an SM times 132): the path "
    "time is the programs' total over the slots, or the longest program if longer.",
    "Instructions a program: the SASS outside loops once (forward branches that skip code are "
    "not followed, an upper bound, but for the lanes' limb branch: a program whose lanes all "
    "hold the word's certificate skips it, and its straight-line code is counted only for the "
    "programs with a refused lane), each loop's body times its trips; trips from the plan "
    "(the longest run among a program's lanes, per pass; the hot kernel's tiles and the "
    "limbs their values touch), carry loops L - 1.",
    "Values: standard normal float32 (the check's), every lane's certificate computed from "
    "them (so the word and limb passes take the lanes they would); K = 1: the tiles' limb "
    "spans from the first 2^23 values (the same distribution).",
]


def occupancy(regs: int, shared: int, warps: int) -> dict[str, Any]:
    """Blocks and warps an SM of an H200 holds for a kernel, and what limits them."""
    h = H200
    per_warp = math.ceil(regs * 32 / h["register_granule_per_warp"]) * h[
        "register_granule_per_warp"]  # fmt: skip
    limits = {
        "registers": h["registers_per_sm"] // max(per_warp * warps, 1),
        "shared": h["shared_per_sm"] // (shared + h["reserved_shared_per_block"]),
        "warps": h["max_warps_per_sm"] // warps,
        "blocks": h["max_blocks_per_sm"],
    }
    blocks = min(limits.values())
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps,
            "occupancy": blocks * warps / h["max_warps_per_sm"],
            "limited_by": min(limits, key=lambda k: limits[k])}  # fmt: skip


_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _triton_tool(name: str) -> str | None:
    spec = importlib.util.find_spec("triton")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = Path(root) / "backends" / "nvidia" / "bin" / name
        if found.is_file() and os.access(found, os.X_OK):
            return str(found)
    return None


def ptxas_info(ptx_path: str, ptxas: str, triton_flags: bool) -> dict[str, Any]:
    """``ptxas -arch=sm_90a -v`` on the PTX: registers, stack, spill bytes."""
    flags = ["-lineinfo", "--regAllocOptLevel=2"] if triton_flags else []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [ptxas, *flags, "-arch=sm_90a", "-v", ptx_path, "-o", str(Path(tmp) / "k.cubin")]
        run = subprocess.run(cmd, capture_output=True, text=True)
    log = run.stdout + run.stderr
    if run.returncode != 0:
        return {"error": log[-2000:]}
    regs = _PTXAS_REGS.search(log)
    spill = _PTXAS_SPILL.search(log)
    return {"registers": int(regs.group(1)) if regs else None,
            "stack_bytes": int(spill.group(1)) if spill else None,
            "spill_store_bytes": int(spill.group(2)) if spill else None,
            "spill_load_bytes": int(spill.group(3)) if spill else None}  # fmt: skip


def analyse_cuda(v: Variant, built: dict[str, Any], tools: dict[str, str | None],
                 known: list[SourceLoop]) -> dict[str, Any]:  # fmt: skip
    """Registers, spills, shared memory, occupancy and loops of one sm_90 build."""
    if built.get("error"):
        return {"error": built["error"]}
    files = built["files"]
    rec: dict[str, Any] = {"num_warps": built["num_warps"], "shared_dynamic": built["shared"]}
    rec["ptxas"] = ptxas_info(files["ptx"], tools["ptxas"], True) if tools["ptxas"] else {}
    if tools.get("ptxas_path"):
        rec["ptxas_path"] = ptxas_info(files["ptx"], tools["ptxas_path"], False)
    sass = subprocess.run([tools["nvdisasm"], "-c", "-gi", files["cubin"]], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip
    Path(files["cubin"]).with_suffix(".sass").write_text(sass)
    code = read_sass(sass)
    ops = [x.op for x in code.insts]
    rec["sass_instructions"] = sum(1 for o in ops if o != "NOP")
    rec["stl"] = sum(1 for o in ops if o.startswith("STL"))
    rec["ldl"] = sum(1 for o in ops if o.startswith("LDL"))
    threads = 32 * built["num_warps"]
    loops = loops_of(code, v.const, threads, known)
    rec["loops"] = summarize_loops(loops)
    rec["machine_loops"] = [{k: lp[k] for k in ("start", "end", "label", "source", "instructions",
                                                 "unroll", "loads", "load_depth", "barriers")}
                            for lp in loops]  # fmt: skip
    flat = straight_line(code, loops)
    rec["straight"] = {"instructions": len(flat), "load_depth": load_depth(flat),
                       "barriers": sum(1 for x in flat if _BARRIER.match(x.op)),
                       "loads": sum(1 for x in flat if _GLOBAL_LOAD.match(x.op))}  # fmt: skip
    rec["guarded"] = guarded_regions(code, loops)
    per_program = STRAIGHT_VALUES.get(v.kernel)
    if per_program:  # kernels without a value loop: each program's values once
        rec["straight"]["per_value"] = round(len(flat) * threads / per_program(v.const), 2)
    regs = rec["ptxas"].get("registers") or 0
    rec["occupancy"] = occupancy(regs, built["shared"], built["num_warps"])
    return rec


_AMD_META = {
    "vgprs": r"\.vgpr_count:\s+(\d+)",
    "sgprs": r"\.sgpr_count:\s+(\d+)",
    "vgpr_spills": r"\.vgpr_spill_count:\s+(\d+)",
    "sgpr_spills": r"\.sgpr_spill_count:\s+(\d+)",
    "scratch_bytes": r"\.private_segment_fixed_size:\s+(\d+)",
    "lds_bytes": r"\.group_segment_fixed_size:\s+(\d+)",
}


def analyse_amd(v: Variant, built: dict[str, Any], known: list[SourceLoop]) -> dict[str, Any]:
    if built.get("error"):
        return {"error": built["error"]}
    text = Path(built["files"]["amdgcn"]).read_text()
    rec: dict[str, Any] = {"num_warps": built["num_warps"], "shared_dynamic": built["shared"]}
    for key, pattern in _AMD_META.items():
        found = re.search(pattern, text)
        rec[key] = int(found.group(1)) if found else None
    code = read_amdgcn(text)
    rec["instructions"] = len(code.insts)
    rec["scratch_instructions"] = sum(1 for x in code.insts if x.op.startswith("scratch_"))
    loops = loops_of(code, v.const, 64 * built["num_warps"], known)
    rec["loops"] = summarize_loops(loops)
    return rec


# -- the goals ---------------------------------------------------------------------------------
#: The families a float32, bfloat16 or float16 fold launches (ordered: float32 values, which the
#: narrow ordered folds are widened to); the all-reduce's are reported, not judged.
FOLD_KERNELS = ("lanes", "round_rows", "hot", "scatter", "ordered")
NARROW_VALUES = ("float16", "bfloat16", "float32")
WORD_LIMIT = 0.25


def spills_of(rec: dict[str, Any]) -> int:
    p = rec.get("ptxas") or {}
    return (p.get("spill_store_bytes") or 0) + (p.get("spill_load_bytes") or 0) + rec.get(
        "stl", 0) + rec.get("ldl", 0)  # fmt: skip


def judge_spills(variants: dict[str, Variant], cuda: dict[str, Any]) -> dict[str, Any]:
    judged = [n for n, v in variants.items() if v.launched and v.kernel in FOLD_KERNELS
              and v.values in NARROW_VALUES and n in cuda]  # fmt: skip
    bad = {n: {"spill_store_bytes": cuda[n].get("ptxas", {}).get("spill_store_bytes"),
               "spill_load_bytes": cuda[n].get("ptxas", {}).get("spill_load_bytes"),
               "stl": cuda[n].get("stl"), "ldl": cuda[n].get("ldl")}
           for n in judged if "error" in cuda[n] or spills_of(cuda[n])}  # fmt: skip
    others = {n: spills_of(r) for n, r in cuda.items() if n not in judged and "error" not in r
              and spills_of(r)}  # fmt: skip
    return {"goal": "0 spills in every kernel variant a float32, bfloat16 or float16 fold uses "
                    "(ptxas spill bytes and SASS STL/LDL)",
            "judged": len(judged), "met": not bad and bool(judged), "spilling": bad,
            "spilling_not_judged": others}  # fmt: skip


def word_paths(variants: dict[str, Variant], cuda: dict[str, Any]) -> dict[str, Any]:
    """Each lanes variant: the word path's instructions a value (its one pass, the bounds kept
    as it goes) against the limb path's (WORD=False's limb loop)."""
    rows: dict[str, Any] = {}
    for n, v in variants.items():
        limbs_name = _named(n, {"WORD": False})
        if v.kernel != "lanes" or not v.launched or limbs_name not in cuda or n not in cuda:
            continue
        if "error" in cuda[n] or "error" in cuda[limbs_name]:
            rows[n] = {"error": "build failed"}
            continue
        loops, limb_loops = cuda[n]["loops"], cuda[limbs_name]["loops"]
        if "word" not in loops or "limbs" not in limb_loops:
            rows[n] = {"error": f"loops not found: {sorted(loops)} / {sorted(limb_loops)}"}
            continue
        word = loops["word"]["per_value"]
        limbs = limb_loops["limbs"]["per_value"]
        rows[n] = {"word_path": word, "limbs": limbs, "ratio": word / limbs}
    ratios = [r["ratio"] for r in rows.values() if "ratio" in r]
    return {"goal": f"the one-word path's inner loop at most {WORD_LIMIT:g}x the limb path's "
                    "instructions a value (its one pass against WORD=False's limbs)",
            "met": bool(ratios) and max(ratios) <= WORD_LIMIT,
            "worst": max(ratios) if ratios else None, "best": min(ratios) if ratios else None,
            "variants": rows}  # fmt: skip


# -- the model ----------------------------------------------------------------------------------
def index_add_times() -> dict[str, Any]:
    """torch's atomic ``index_add_`` wall times (us) of the committed H200 GPU checks."""
    found: dict[str, list[float]] = {}
    runs = []
    for path in sorted(glob.glob(str(RESULTS / "gpu-2026-12-04*-h200" / "gpu_bench.json"))):
        data = json.loads(Path(path).read_text())
        runs.append(str(Path(path).relative_to(ROOT)))
        for cfg, entry in data.get("configs", {}).items():
            t = entry.get("timings", {}).get("torch_index_add", {})
            if isinstance(t, dict) and t.get("us"):
                found.setdefault(cfg, []).append(float(t["us"]))
    return {"runs": runs, "us": {c: {"median": statistics.median(v), "min": min(v),
                                     "max": max(v), "n": len(v)} for c, v in found.items()}}


def _exponents(bits: Any) -> tuple[Any, Any]:
    """float32 bits -> (p, finite): the kernels' limb shift of each value (``SHIFT`` = 0)."""
    import numpy as np

    e = (bits >> 23) & 0xFF
    frac = bits & 0x7FFFFF
    finite = (e != 0xFF) & ~((e == 0) & (frac == 0))
    p = np.where(e == 0, 0, e - 1).astype(np.int64)
    return p, finite


def plan_model(cfg: Any, rng_seed: int = 0) -> dict[str, Any]:
    """The plan of a GPU-check configuration and what each launch of the exact fold does."""
    import numpy as np

    _src_on_path()
    from bitfold.backends import triton as backend

    gpu_check = _module("gpu_check", ROOT / "scripts" / "gpu_check.py")
    N, K, D = cfg.N, cfg.K, cfg.D
    sample = None
    if cfg.mapping == "one":  # 10^8 values: a sample for the value-dependent counts
        sample = 2**23
        _, g = gpu_check.make_inputs(gpu_check.Config(cfg.name, sample, 1, 1, "one"),
                                     np.random.default_rng(rng_seed))  # fmt: skip
        counts = np.array([N])
        order = None
        sorted_bits = g.view(np.uint32).astype(np.int64).reshape(-1, 1)
    else:
        idx, g = gpu_check.make_inputs(cfg, np.random.default_rng(rng_seed))
        counts = np.bincount(idx, minlength=K)
        order = np.argsort(idx, kind="stable")
        sorted_bits = g.reshape(N, D)[order].view(np.uint32).astype(np.int64)
        del idx
    offsets = np.concatenate([[0], np.cumsum(counts)])
    hot = counts >= backend.HOT_MIN
    run = np.where(hot, 0, counts)
    p, finite = _exponents(sorted_bits)
    return {"N": N, "K": K, "D": D, "counts": counts, "offsets": offsets, "hot": hot,
            "run": run, "p": p, "finite": finite, "order": order, "sample": sample}  # fmt: skip


def _bit_length(x: Any) -> Any:
    import numpy as np

    out = np.zeros_like(x)
    nz = x > 0
    out[nz] = np.floor(np.log2(x[nz])).astype(np.int64) + 1
    return out


def lanes_launch(pm: dict[str, Any], shape: dict[str, int]) -> dict[str, Any]:
    """Trips of the lanes kernel's passes a program, and its bytes and sectors."""
    import numpy as np

    K, D = pm["K"], pm["D"]
    bk, bd = shape["BLOCK_K"], shape["BLOCK_D"]
    run, counts, offsets = pm["run"], pm["counts"], pm["offsets"]
    # the certificate, a lane (bucket, column): bit_length(terms) + (p_hi - p_lo) + 24 <= 53
    if pm["sample"] is None and run.any():
        p, finite = pm["p"], pm["finite"]
        starts = offsets[:-1][counts > 0]
        big = np.where(finite, p, 1 << 20)
        small = np.where(finite, p, -1)
        lo = np.full((K, D), 1 << 20, np.int64)
        hi = np.full((K, D), -1, np.int64)
        lo[counts > 0] = np.minimum.reduceat(big, starts, axis=0)
        hi[counts > 0] = np.maximum.reduceat(small, starts, axis=0)
        lo = np.maximum(np.minimum(lo, hi), 0)
        fits = _bit_length(run)[:, None] + (hi - lo) + 24 <= 53  # a float64 sum
    else:
        fits = np.ones((K, D), bool)
    programs_k = -(-K // bk)
    pad = programs_k * bk - K

    def per_program(x: Any) -> Any:  # (K, D) -> the max over each program's lanes
        x = np.pad(x, ((0, pad), (0, (-D) % bd)))
        return x.reshape(programs_k, bk, -1, bd).max(axis=(1, 3)).reshape(-1)

    lanes_run = np.broadcast_to(run[:, None], (K, D))
    # one pass reads every lane's run (the word and its bounds together); the limbs the refused
    trips = {"word": per_program(lanes_run), "limbs": per_program(np.where(fits, 0, lanes_run))}
    cold = int(run.sum())
    word_values = int(np.where(fits, lanes_run, 0).sum())
    # L2 sectors: D = 1 from the plan (a warp is 32 neighbouring buckets); rows of D >= 32: a
    # warp reads 32 columns of one row (4 sectors of float32) and one order entry (broadcast)
    passes = 1 if word_values == cold * D else 2
    if cold == 0:
        order_sectors = value_sectors = 0
    elif D == 1:
        live = run > 0
        ks = np.nonzero(live)[0]
        reps = run[ks]
        lane_k = np.repeat(ks, reps)
        t = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
        warp = lane_k // 32
        pos = offsets[lane_k] + t
        key_o = (warp * (1 << 20) + t) * (1 << 24) + (pos * 4 // 32) % (1 << 24)
        order_sectors = len(np.unique(key_o))
        rows = pm["order"][pos]
        key_v = (warp * (1 << 20) + t) * (1 << 26) + (rows * 4 // 32) % (1 << 26)
        value_sectors = len(np.unique(key_v))
    else:
        order_sectors = cold * (D // 32)
        value_sectors = cold * (D // 32) * (32 * 4 // 32)
    sector = MODEL["sector_bytes"]
    return {
        "programs": programs_k * (-(-D // bd)), "trips": trips,
        "values": cold * D, "word_values": word_values,
        "dram_bytes": 8 * (K + 1) + 4 * cold + 4 * cold * D + 4 * int((~pm["hot"]).sum()) * D,
        "l2_bytes": sector * (order_sectors + value_sectors) * passes
        + 8 * (K + 1) + 4 * int((~pm["hot"]).sum()) * D,
    }  # fmt: skip


def hot_launch(pm: dict[str, Any], shape: dict[str, int], L: int) -> dict[str, Any]:
    """The hot kernel's chunks, tiles, the limbs each tile's values touch, bytes and atomics."""
    import numpy as np

    from bitfold.backends import triton as backend

    D = pm["D"]
    bn, bd = shape["BLOCK_N"], shape["BLOCK_D"]
    chunk = max(16, backend.CHUNK_VALUES // max(D, 1))
    counts, offsets, hot = pm["counts"], pm["offsets"], pm["hot"]
    hk = np.nonzero(hot)[0]
    per = -(-counts[hk] // chunk)
    nchunks = int(per.sum())
    lengths = np.concatenate([np.minimum(chunk, counts[k] - chunk * np.arange(n))
                              for k, n in zip(hk, per, strict=True)])  # fmt: skip
    tiles_per_chunk = -(-lengths // bn)
    # the limb span of a tile: j = p >> 5 over its finite values; trips j_hi - j_lo + 2 (a
    # float32 value is one word, two 32-bit pieces)
    j = pm["p"] >> 5
    jlo = np.where(pm["finite"], j, L).min(axis=1)
    jhi = np.where(pm["finite"], j, -2).max(axis=1)
    if pm["sample"] is not None:
        n = (len(jlo) // bn) * bn
        spans = jhi[:n].reshape(-1, bn).max(1) - jlo[:n].reshape(-1, bn).min(1) + 2
        mean_span = float(np.maximum(spans, 0).mean())
        limb_trips = np.round(tiles_per_chunk * mean_span).astype(np.int64)
    else:
        starts = []
        for k, n in zip(hk, per, strict=True):
            for c in range(n):
                s0 = offsets[k] + c * chunk
                e0 = min(s0 + chunk, offsets[k + 1])
                starts.extend(range(s0, e0, bn))
        starts = np.array(starts)
        tl = np.minimum.reduceat(jlo, starts)
        th = np.maximum.reduceat(jhi, starts)
        spans = np.maximum(th - tl + 2, 0)
        owner = np.repeat(np.arange(nchunks), tiles_per_chunk)
        limb_trips = np.bincount(owner, weights=spans, minlength=nchunks).astype(np.int64)
    hot_positions = int(counts[hk].sum())
    gather = D == 1 and pm["order"] is not None  # scalar values in sorted order: gathered
    value_l2 = hot_positions * (MODEL["sector_bytes"] if gather else 4) * D
    merges = nchunks * (-(-D // bd))
    return {
        "programs": merges, "chunks": nchunks, "trips": {"chunk": tiles_per_chunk,
        "limb pass": limb_trips, "merge": np.full(nchunks, L)},
        "values": hot_positions * D, "hot_buckets": len(hk),
        "dram_bytes": 4 * hot_positions + 4 * hot_positions * D + 24 * nchunks,
        "l2_bytes": 4 * hot_positions + value_l2 + 24 * nchunks + 8 * (L + 4) * merges * bd,
        "same_address_atomics": int(per.max()) if len(per) else 0,
    }  # fmt: skip


def program_costs(rec: dict[str, Any], trips: dict[str, Any], programs: int,
                  const: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Instructions and critical-path cycles a program, from the machine code and the trips
    (a loop whose trips the model does not know: once, and named in ``unmodelled``)."""
    import numpy as np

    lat, bar = MODEL["global_load_latency_cycles"], MODEL["barrier_cycles"]
    s = rec["straight"]
    instr = np.full(programs, float(s["instructions"]))
    for label, region in rec.get("guarded", {}).items():
        t = trips.get(label)
        if t is not None:  # a program with no trips skips the branch's straight-line code
            skip = np.resize(np.asarray(t, dtype=np.float64), programs) == 0
            instr = instr - skip * region["straight_instructions"]
    cycles = instr + s["load_depth"] * lat + s["barriers"] * bar
    unmodelled = []
    for lp in rec["machine_loops"]:
        t = trips.get(lp["label"])
        if t is None and lp["label"] == "carry":
            t = const["L"] - 1
        elif t is None:
            unmodelled.append(lp["label"])
            t = 1
        t = np.resize(np.asarray(t, dtype=np.float64), programs)
        group = [x for x in rec["machine_loops"] if x["label"] == lp["label"]]
        u = max(x["unroll"] for x in group)
        if u > 1:  # an unrolled body and its remainder share the trips
            n = np.floor(t / u) if lp["unroll"] == u else np.mod(t, u)
        else:  # one loop, or a loop written once and called twice (each runs every trip)
            n = t
        instr = instr + n * lp["instructions"]
        cycles = cycles + n * (lp["instructions"] + lp["load_depth"] * lat + lp["barriers"] * bar)
    return {"instructions": instr, "cycles": cycles, "unmodelled": unmodelled}


def kernel_time(variant: Variant, rec: dict[str, Any], launch: dict[str, Any]) -> dict[str, Any]:
    """The model's time of one launch: launch cost plus the largest roof."""
    h, m = H200, MODEL
    costs = program_costs(rec, launch["trips"], launch["programs"], variant.const)
    warps = rec["num_warps"]
    occ = rec["occupancy"]
    slots = max(occ["blocks_per_sm"], 1) * h["sms"]
    clock = h["clock_hz"]
    programs = launch["programs"]
    per_sm = math.ceil(programs / h["sms"]) * float(costs["instructions"].mean()) * warps
    roofs = {
        "dram": launch["dram_bytes"] / h["dram_bytes_per_s"],
        "l2": launch["l2_bytes"] / m["l2_bytes_per_s"],
        "issue": per_sm / (m["warp_instructions_per_clock_per_sm"] * clock),
        "latency": max(math.ceil(programs / slots) * float(costs["cycles"].mean()),
                       float(costs["cycles"].max())) / clock,
        "atomics": launch.get("same_address_atomics", 0) * m["same_address_atomic_ns"] * 1e-9,
    }  # fmt: skip
    bound = max(roofs, key=lambda k: roofs[k])
    us = m["launch_us"] + roofs[bound] * 1e6
    values = launch.get("values") or 0
    thread_instr = float(costs["instructions"].sum()) * 32 * warps
    return {
        "variant": variant.name, "programs": programs, "blocks_per_sm": occ["blocks_per_sm"],
        "waves": programs / slots, "dram_bytes": launch["dram_bytes"],
        "l2_bytes": launch["l2_bytes"], "warp_instructions": float(costs["instructions"].sum())
        * warps, "instructions_per_value": thread_instr / values if values else None,
        "roofs_us": {k: round(v * 1e6, 3) for k, v in roofs.items()}, "bound": bound,
        "us": us, "unmodelled_loops": costs["unmodelled"],
    }  # fmt: skip


def model(cuda: dict[str, Any], variants: dict[str, Variant]) -> dict[str, Any]:
    """Every GPU-check configuration's exact fold, launch by launch, against index_add_."""
    _src_on_path()
    from bitfold.formats import limb_format_for

    gpu_check = _module("gpu_check", ROOT / "scripts" / "gpu_check.py")
    baseline = index_add_times()
    vlist = list(variants.values())
    L = limb_format_for("float32").limbs
    W = limb_format_for("float32").width
    out: dict[str, Any] = {"baseline": baseline, "configs": {}}
    for cfg in gpu_check.FULL:
        pm = plan_model(cfg)
        launches = []
        lshape = lanes_shape("float32", cfg.D)
        name = variant_for(vlist, "lanes[float32->float32, init=False]", lshape)
        launches.append(kernel_time(variants[name], cuda[name], lanes_launch(pm, lshape)))
        if pm["hot"].any():
            hshape = hot_shape(cfg.D)
            name = variant_for(vlist, "hot[float32]", hshape)
            hl = hot_launch(pm, hshape, L)
            rows = int(pm["hot"].sum()) * cfg.D
            state = 8 * W * rows
            launches.insert(1, {"variant": "torch.zeros (the hot state)", "programs": None,
                                "dram_bytes": state, "l2_bytes": state, "us":
                                MODEL["launch_us"] + state / H200["dram_bytes_per_s"] * 1e6,
                                "roofs_us": {"dram": state / H200["dram_bytes_per_s"] * 1e6},
                                "bound": "dram"})  # fmt: skip
            launches.append(kernel_time(variants[name], cuda[name], hl))
            name = "round_rows[float32->float32, init=False]"
            rr = {"programs": -(-rows // 128), "trips": {}, "values": rows,
                  "dram_bytes": state + 4 * rows + 16 * int(pm["hot"].sum()),
                  "l2_bytes": state + 4 * rows + 16 * int(pm["hot"].sum())}  # fmt: skip
            launches.append(kernel_time(variants[name], cuda[name], rr))
        total = sum(x["us"] for x in launches)
        base = baseline["us"].get(cfg.name, {}).get("median")
        out["configs"][cfg.name] = {
            "N": cfg.N, "K": cfg.K, "D": cfg.D, "index": cfg.mapping,
            "hot_buckets": int(pm["hot"].sum()), "cold_values": int(pm["run"].sum()) * cfg.D,
            "launches": launches, "estimate_us": total,
            "dram_bytes": sum(x["dram_bytes"] for x in launches),
            "warp_instructions": sum(x.get("warp_instructions") or 0 for x in launches),
            "index_add_us": base, "ratio": total / base if base else None,
            "met": bool(base) and total <= base,
        }  # fmt: skip
        del pm
    configs = out["configs"].values()
    out["goal"] = {"goal": "the model's estimate at or under torch's atomic index_add_ (median of "
                           "the committed H200 runs) at every configuration",
                   "met": all(c["met"] for c in configs),
                   "missed": [n for n, c in out["configs"].items() if not c["met"]]}  # fmt: skip
    return out


# -- the report ---------------------------------------------------------------------------------
def tools() -> dict[str, str | None]:
    mc = _machine_code()
    return {"nvdisasm": mc.nvdisasm() or _triton_tool("nvdisasm"),
            "ptxas": _triton_tool("ptxas") or shutil.which("ptxas"),
            "ptxas_path": shutil.which("ptxas")}  # fmt: skip


def _tool_version(path: str | None) -> str | None:
    if not path:
        return None
    run = subprocess.run([path, "--version"], capture_output=True, text=True)
    lines = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.strip()]
    return lines[-1] if lines else None


def report(names: list[str] | None = None, arches: tuple[str, ...] = ("cuda", "hip"),
           with_model: bool = True, work: Path | None = None,
           workers: int | None = None) -> dict[str, Any]:  # fmt: skip
    """Build ``names`` (default: every variant) and read them; the model where asked."""
    import triton

    every = {v.name: v for v, _, _ in targets()}
    names = names or list(every)
    unknown = sorted(set(names) - set(every))
    assert not unknown, f"unknown variants {unknown}"
    variants = {n: every[n] for n in names}
    found = tools()
    assert found["nvdisasm"], "nvdisasm missing (nvidia-cuda-nvdisasm wheel or Triton's wheel)"
    known = source_loops()
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="kernel_report_")) if work is None else work
    t0 = time.perf_counter()
    rep: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "commit": _git("rev-parse", "--short", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--", "src")),
        "triton": triton.__version__,
        "ptxas": {"triton": _tool_version(found["ptxas"]), "path": _tool_version(
            found["ptxas_path"])}, "nvdisasm": found["nvdisasm"],
        "h200": H200, "model_assumptions": MODEL, "variants": {}, "build_seconds": {},
    }  # fmt: skip
    try:
        cuda_build = build(names, "cuda", work / "cuda", workers)
        rep["build_seconds"]["cuda"] = round(cuda_build["wall_seconds"], 1)
        assert cuda_build["unavailable"] is None, cuda_build["unavailable"]

        def one(name: str) -> tuple[str, dict[str, Any]]:
            return name, analyse_cuda(variants[name], cuda_build["variants"][name], found, known)

        # CPython 3.11's AST constructor is not thread-safe ("recursion depth mismatch" when
        # two threads parse at once): parse the kernel sources before the pool starts.
        source_functions()
        with ThreadPoolExecutor(_tmc().jobs()) as pool:
            cuda = dict(pool.map(one, names))
        amd: dict[str, Any] = {}
        if "hip" in arches:
            hip_build = build(names, "hip", work / "hip", workers)
            rep["build_seconds"]["hip"] = round(hip_build["wall_seconds"], 1)
            if hip_build["unavailable"]:
                rep["gfx942_unavailable"] = hip_build["unavailable"]
            else:
                amd = {n: analyse_amd(variants[n], hip_build["variants"][n], known) for n in names}
        for n in names:
            v = variants[n]
            rep["variants"][n] = {
                "kernel": v.kernel, "values": v.values, "out": v.out, "init": v.init,
                "launched": v.launched, "launch_shape_of_D": list(v.shape_of),
                "constexprs": {k: v.const[k] for k in ("BLOCK_K", "BLOCK_D", "BLOCK_N", "BLOCK",
                                                       "BLOCKS", "L", "L_PAD", "WORD")
                               if k in v.const},
                "sm90": cuda[n], "gfx942": amd.get(n),
            }  # fmt: skip
        rep["goals"] = {"spills": judge_spills(variants, cuda),
                        "word_path": word_paths(variants, cuda)}  # fmt: skip
        if with_model:
            rep["model"] = model(cuda, variants)
            rep["goals"]["model"] = rep["model"]["goal"]
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    rep["seconds"] = round(time.perf_counter() - t0, 1)
    return rep


def model_variants() -> list[str]:
    """The variants the model of the GPU check's configurations reads."""
    every = [v for v, _, _ in targets()]
    names = {"round_rows[float32->float32, init=False]"}
    for D in SHAPE_DS:
        names.add(variant_for(every, "lanes[float32->float32, init=False]",
                              lanes_shape("float32", D)))  # fmt: skip
        names.add(variant_for(every, "hot[float32]", hot_shape(D)))
    return sorted(n for n in names if n)


def _git(*args: str) -> str:
    run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return run.stdout.strip()


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def _loops_cell(loops: dict[str, Any], straight: dict[str, Any]) -> str:
    parts = []
    if straight.get("per_value") is not None:
        parts.append(f"straight-line {straight['per_value']:.1f}")
    for label, lp in loops.items():
        if lp.get("per_value") is not None:
            unroll = f" (x{lp['unroll']})" if lp["unroll"] > 1 else ""
            parts.append(f"{label} {lp['per_value']:.1f}{unroll}")
    return ", ".join(parts) or "–"


def markdown(rep: dict[str, Any]) -> str:
    g = rep["goals"]
    lines = [
        f"# Kernel report, sm_90 (H100/H200) and gfx942, {rep['date']}",
        "",
        f"Built without a GPU from commit {rep['commit']}"
        + (" (with uncommitted changes under src/)" if rep["dirty"] else "")
        + f", Triton {rep['triton']}; ptxas: Triton's wheel ({rep['ptxas']['triton']}), "
        f"PATH ({rep['ptxas']['path']}). Regenerate with `make kernel-report` "
        f"(`python scripts/kernel_report.py`; {rep['seconds']:.0f} s here, builds "
        + ", ".join(f"{k} {v:.0f} s" for k, v in rep["build_seconds"].items()) + ").",
        "",
        "## Goals",
        "",
        "| goal | result | verdict |",
        "|---|---|---|",
    ]
    sp = g["spills"]
    lines.append(f"| {sp['goal']} | {sp['judged']} variants judged; spilling: "
                 + (", ".join(f"`{n}` ({r['spill_store_bytes']}/{r['spill_load_bytes']} bytes, "
                              f"{r['stl']} STL, {r['ldl']} LDL)" for n, r in sp["spilling"].items())
                    or "none") + f" | **{'met' if sp['met'] else 'missed'}** |")  # fmt: skip
    wp = g["word_path"]
    worst = wp["worst"]
    lines.append(f"| {wp['goal']} | word path / limbs: {_fmt(wp['best'], 2)} to {_fmt(worst, 2)} "
                 "(table below) | " + f"**{'met' if wp['met'] else 'missed'}** |")  # fmt: skip
    if "model" in rep:
        mg = rep["model"]["goal"]
        ratios = ", ".join(f"{n} {c['ratio']:.2f}x" for n, c in rep["model"]["configs"].items()
                           if c["ratio"] is not None)  # fmt: skip
        lines.append(f"| {mg['goal']} | estimate / index_add_: {ratios} | "
                     f"**{'met' if mg['met'] else 'missed'}** |")  # fmt: skip
    if "model" in rep:
        m = rep["model"]
        lines += ["", "## The GPU check's configurations, modelled (float32, H200)", "",
                  "| configuration | launches | DRAM bytes | warp instructions | estimate | "
                  "bound by | torch `index_add_` (H200) | ratio |", "|---|---|---:|---:|---:|---|"
                  "---:|---:|"]  # fmt: skip
        for n, c in m["configs"].items():
            kern = [x for x in c["launches"] if x.get("programs")]
            bounds = ", ".join(f"{x['variant'].split('[')[0]} {x['bound']}" for x in kern)
            base = m["baseline"]["us"].get(n, {})
            lines.append(
                f"| {n} (N={c['N']:,}, K={c['K']:,}, D={c['D']}) | {len(c['launches'])} | "
                f"{c['dram_bytes'] / 1e6:,.1f} MB | {c['warp_instructions'] / 1e6:,.2f} M | "
                f"{c['estimate_us']:,.1f} us | {bounds} | {_fmt(base.get('median'))} us "
                f"({_fmt(base.get('min'))}-{_fmt(base.get('max'))}, {base.get('n')} runs) | "
                f"{_fmt(c['ratio'], 2)}x |")  # fmt: skip
        lines += ["", "Launch by launch (roofs in us; instructions a value are thread "
                  "instructions over the values the launch sums, for `round_rows` over the rows "
                  "it rounds):", "",
                  "| configuration | launch | programs | blocks/SM | waves | instr/value | "
                  "DRAM | L2 | issue | latency | atomics | estimate |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for n, c in m["configs"].items():
            for x in c["launches"]:
                r = x.get("roofs_us", {})
                lines.append(
                    f"| {n} | `{x['variant']}` | {_fmt(x.get('programs'))} | "
                    f"{_fmt(x.get('blocks_per_sm'))} | {_fmt(x.get('waves'), 2)} | "
                    f"{_fmt(x.get('instructions_per_value'))} | {_fmt(r.get('dram'), 2)} | "
                    f"{_fmt(r.get('l2'), 2)} | {_fmt(r.get('issue'), 2)} | "
                    f"{_fmt(r.get('latency'), 2)} | {_fmt(r.get('atomics'), 2)} | "
                    f"{x['us']:,.1f} us |")  # fmt: skip
        lines += ["", "Baseline: " + ", ".join(f"`{r}`" for r in m["baseline"]["runs"]) + "."]
    lines += ["", "## The one-word path against the limbs (sm_90 SASS)", "",
              "Instructions a value in the inner loops: the word path is its one pass (the "
              "word, its unit and the exponent bounds together; `WORD=True`, what the backend "
              "launches), the limb path the limb loop of the same variant built with "
              "`WORD=False`.", "",
              "| variant | word path | limbs (WORD=False) | word path / limbs |",
              "|---|---:|---:|---:|"]  # fmt: skip
    for n, r in wp["variants"].items():
        if "error" in r:
            lines.append(f"| `{n}` | {r['error']} | | |")
            continue
        lines.append(f"| `{n}` | {r['word_path']:.1f} | {r['limbs']:.1f} | {r['ratio']:.2f} |")
    shown = "lanes[float32->float32, init=False]"
    if shown in rep["variants"] and "error" not in rep["variants"][shown]["sm90"]:
        loops = dict(rep["variants"][shown]["sm90"]["loops"])
        limbs = rep["variants"].get(_named(shown, {"WORD": False}), {}).get("sm90", {})
        if "loops" in limbs and "limbs" in limbs["loops"]:
            loops["limbs (WORD=False)"] = limbs["loops"]["limbs"]
        lines += ["", f"Where an iteration's instructions go in `{shown}` (SASS instructions "
                  "by the source function their line is in; `lanes_kernel`: the loop's own "
                  "lines, loads and addresses):", "",
                  "| loop | instructions an iteration | by function |", "|---|---:|---|"]
        for label in ("word", "limbs (WORD=False)"):
            if label in loops:
                lp = loops[label]
                parts = ", ".join(f"{k} {n:g}" for k, n in lp["by_function"].items())
                lines.append(f"| {label} | {lp['per_iteration']:g} | {parts} |")
    lines += ["", "## Every variant", "",
              "Registers and spills from `ptxas -arch=sm_90a -v` (Triton's ptxas and flags; in "
              "brackets the PATH ptxas's registers where they differ), STL/LDL counted in the "
              "SASS, shared memory Triton's dynamic bytes, occupancy on an H200 (blocks and "
              "warps an SM, and the limit). Loops: instructions a value in the steady state "
              "(thread instructions: an iteration's body times the program's threads over the "
              "values it handles; x4: ptxas unrolled 4 iterations); kernels without a value "
              "loop: their straight-line code a value (`round_rows`: a row). gfx942: VGPRs/SGPRs, "
              "spills (VGPR+SGPR), LDS bytes.", "",
              "| variant | regs | spill st/ld (B) | STL/LDL | smem (B) | blocks (warps)/SM | "
              "SASS instr | loops: instr/value | gfx942 VGPR/SGPR | gfx942 spills | "
              "gfx942 LDS |", "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]  # fmt: skip
    for n, v in rep["variants"].items():
        s = v["sm90"]
        name = f"`{n}`" + ("" if v["launched"] else " (compared, not launched)") + (
            f" (launched at D={','.join(map(str, v['launch_shape_of_D']))})"
            if v["launch_shape_of_D"] else "")  # fmt: skip
        if "error" in s:
            lines.append(f"| {name} | build failed | | | | | | | | | |")
            continue
        p, pp = s["ptxas"], s.get("ptxas_path") or {}
        regs = f"{p.get('registers')}" + (f" ({pp['registers']})" if pp.get("registers") not in (
            None, p.get("registers")) else "")  # fmt: skip
        o = s["occupancy"]
        a = v.get("gfx942") or {}
        amd_ok = a and "error" not in a
        lines.append(
            f"| {name} | {regs} | {p.get('spill_store_bytes')}/{p.get('spill_load_bytes')} | "
            f"{s['stl']}/{s['ldl']} | {s['shared_dynamic']} | {o['blocks_per_sm']} "
            f"({o['warps_per_sm']}, {o['limited_by']}) | {s['sass_instructions']:,} | "
            f"{_loops_cell(s['loops'], s['straight'])} | "
            + (f"{a['vgprs']}/{a['sgprs']} | {(a['vgpr_spills'] or 0) + (a['sgpr_spills'] or 0)} "
               f"| {a['lds_bytes']} |" if amd_ok else "– | – | – |"))  # fmt: skip
    if rep.get("gfx942_unavailable"):
        lines += ["", f"gfx942 not built here: {rep['gfx942_unavailable']}"]
    lines += ["", "## The model's assumptions", ""]
    words = {"launch_us": MODEL["launch_us"], "l2_tb": MODEL["l2_bytes_per_s"] / 1e12,
             "ipc": MODEL["warp_instructions_per_clock_per_sm"], "ghz": H200["clock_hz"] / 1e9,
             "atomic_ns": MODEL["same_address_atomic_ns"],
             "lat": MODEL["global_load_latency_cycles"], "bar": MODEL["barrier_cycles"]}
    lines += [f"- {a.format(**words)}" for a in ASSUMPTIONS]
    lines += ["- Occupancy: registers rounded up to 256 a warp, 65,536 an SM; shared memory "
              "Triton's plus 1 KiB reserved a block, 228 KiB an SM; at most 64 warps and 32 "
              "blocks an SM.", ""]
    return "\n".join(lines)


def _jsonable(x: Any) -> Any:
    import numpy as np

    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, float):
        return round(x, 4)
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for README.md and report.json (default: "
                         "benchmarks/results/DATE-kernel-report-sm90)")  # fmt: skip
    ap.add_argument("--only", nargs="*", default=None, help="variant names (default: all)")
    ap.add_argument("--no-amd", action="store_true", help="skip the gfx942 builds")
    ap.add_argument("--no-model", action="store_true", help="skip the configurations' model")
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--work", type=Path, default=None, help="keep the builds and SASS here")
    ap.add_argument("--worker", nargs=2, metavar=("OUT", "ARCH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(Path(args.worker[0]), args.worker[1], [tuple(t) for t in json.load(sys.stdin)])
        return 0
    names = args.only
    if names and not args.no_model:
        names = sorted(set(names) | set(model_variants()))
    rep = report(names, ("cuda",) if args.no_amd else ("cuda", "hip"), not args.no_model,
                 work=args.work, workers=args.workers)  # fmt: skip
    out = args.out or RESULTS / f"{rep['date']}-kernel-report-sm90"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(_jsonable(rep), indent=1) + "\n")
    (out / "README.md").write_text(markdown(rep))
    print(f"wrote {out / 'README.md'} and report.json")
    for key, goal in rep["goals"].items():
        print(f"  {key}: {'met' if goal['met'] else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
