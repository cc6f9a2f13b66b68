"""Compile every GPU kernel for compute capability 9.0 (H100/H200): check its PTX and its SASS.

Passing the simulator does not prove a kernel compiles, nor what the hardware
will execute; this does, without a GPU: ``numba.cuda.compile_ptx(..., cc=(9,
0))`` through NVVM (the ``numba-cuda[cu13]`` extra), then nvJitLink assembles
the PTX into an sm_90 cubin, as numba-cuda does when it loads a kernel on a
device, and ``nvdisasm`` (the ``nvidia-cuda-nvdisasm`` wheel) prints its
machine code. The PTX must hold the instructions the design relies on; the
SASS decides what they became:

* no exact kernel has a compare-and-swap loop (``CAS``, ``ATOMS.CAST.SPIN``):
  PTX's ``atom.shared.add.u64`` is such a loop on sm_90, so ``exact_shared``
  builds its 64-bit limbs from native 32-bit shared atomics (``ATOMS.ADD``)
  and merges them with native 64-bit global atomics (``ATOMG.E.ADD.64``);
* the float32 atomic of the ``atomic`` strategy (``ATOMG.E.ADD.F32.FTZ``,
  documented) is the only instruction that flushes a *value* to zero. The
  one other ``.FTZ`` that ptxas emits is ``F2I.FTZ.U32.TRUNC`` inside its
  unsigned integer division (the reciprocal estimate of the divisor, after
  ``I2F.U32.RP`` and ``MUFU.RCP``): its operand is ``1/divisor``, never a
  value, and the exact kernels have no division at all.

numba-cuda compiles a device function that a kernel calls for the *current*
device; with no GPU here, the compile tells it the current device is the
compute capability 9.0 that the kernel itself is compiled for.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from machine_code import sass_opcodes as _sass_opcodes

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
REQUIRED = os.environ.get("BITFOLD_REQUIRE_CUDA") == "1"
DEVICE = os.environ.get("BITFOLD_CUDA_DEVICE") == "1"
CC = (9, 0)

if not HAVE_NUMBA_CUDA:
    WHY_NOT = "numba-cuda is not installed (pip install -e '.[cuda]')"
elif SIM:
    WHY_NOT = "NUMBA_ENABLE_CUDASIM=1: the simulator cannot compile PTX"
else:
    WHY_NOT = ""

# (name pattern, instructions that must appear, instructions that must not)
EXPECTED = [
    (r"exact_shared", ["atom.shared.add.u32", "atom.global.add.u64", ".extern .shared"],
     ["atom.shared.add.u64", "atom.shared.cas", "atom.global.cas", ".f32", ".f64", "div."]),
    (r"exact_global", ["atom.global.add.u64"],
     ["atom.shared", "atom.global.cas", ".f32", ".f64", "div."]),
    (r"round\[", ["st.global"], ["atom.", "cvt.rn", ".f32", ".f64"]),
    (r"settle\[", ["shr.s64"], ["atom.", ".f32", ".f64"]),
    (r"ordered\[", [], ["atom.", "fma.", "call"]),
    (r"ordered\[\w+->float32\]", ["add.f32"], []),
    (r"ordered\[\w+->float64\]", ["add.f64"], []),
    (r"ordered\[float32->float16\]", ["add.f32", "cvt.rn.f16.f32"], []),
    (r"ordered\[float32->float64\]", ["cvt.f64.f32"], []),
    (r"(ordered|atomic)\[float16->", ["cvt.f32.f16"], []),
    (r"atomic\[", [], ["atom.global.cas", "atom.shared"]),
    (r"atomic\[\w+->float32\]", ["atom.global.add.f32"], []),
    (r"atomic\[\w+->float64\]", ["atom.global.add.f64"], []),
    (r"buckets\[", ["st.global", "add.f64", "sub.f64"], ["atom.", "fma."]),
    (r"hot_segments\[", ["atom.global.add.u64", "add.f64", "sub.f64"],
     ["atom.shared", "atom.global.cas", "fma.", "div.rn.f"]),
    (r"hot_round\[", ["st.global"], ["atom.", "fma.", "add.f"]),
    (r"gather_rows", ["st.global"], ["atom.", "add.f", "fma."]),
    (r"cast_f32_to_f16", ["cvt.rn.f16.f32"], ["atom."]),
    (r"zero_fill", ["st.global"], ["atom."]),
    (r"add_fill", ["add.s64", "st.global"], ["atom.", ".f32", ".f64"]),
]  # fmt: skip


def _targets():
    if WHY_NOT:
        return [pytest.param(None, marks=pytest.mark.skip(reason=WHY_NOT), id="no-numba-cuda")]
    from kernel_targets import cuda_targets

    return [pytest.param(t, id=t[0]) for t in cuda_targets()]


_PTX: dict[tuple[object, tuple], str] = {}  # one compile a kernel, for both checks


def _compile_ptx(fn, sig):
    if (fn, sig) not in _PTX:
        _PTX[fn, sig] = _compile_ptx_now(fn, sig)
    return _PTX[fn, sig]


def _compile_ptx_now(fn, sig):
    from numba import cuda
    from numba.cuda import dispatcher

    class _CC90:
        compute_capability = CC

    if DEVICE:
        return cuda.compile_ptx(fn, sig, cc=CC)[0]
    with mock.patch.object(dispatcher, "get_current_device", lambda: _CC90()):
        return cuda.compile_ptx(fn, sig, cc=CC)[0]


@functools.cache  # one assembly a kernel, for both checks
def _assemble(ptx: str) -> tuple[bytes, str]:
    """PTX -> sm_90 cubin with nvJitLink; returns (cubin, info log)."""
    from cuda.bindings import nvjitlink

    options = [f"-arch=sm_{CC[0]}{CC[1]}", "-verbose"]
    handle = nvjitlink.create(len(options), options)
    try:
        data = ptx.encode()
        nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), "kernel.ptx")
        nvjitlink.complete(handle)
        cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
        nvjitlink.get_linked_cubin(handle, cubin)
        log = bytearray(nvjitlink.get_info_log_size(handle))
        nvjitlink.get_info_log(handle, log)
        return bytes(cubin), log.decode(errors="replace")
    finally:
        nvjitlink.destroy(handle)


# (kernel name pattern, SASS opcodes that must appear, opcode fragments that must not)
SASS_EXPECTED = [
    (r"exact_", [], ["CAS", "SPIN", "FTZ", "MUFU"]),
    (r"exact_shared", ["ATOMS.ADD", "ATOMG.E.ADD.64"], ["ATOMS.ADD.64"]),
    (r"exact_global", ["ATOMG.E.ADD.64"], ["ATOMS"]),
    (r"hot_segments", ["ATOMG.E.ADD.64"], ["CAS", "SPIN", "ATOMS"]),
    (r"hot_round", [], ["ATOM", "RED"]),
    (r"round\[|settle\[", [], ["ATOM", "RED", "FTZ"]),
    (r"atomic\[\w+->float32\]", ["ATOMG.E.ADD.F32.FTZ.RN"], ["CAS"]),
    (r"atomic\[\w+->float64\]", ["ATOMG.E.ADD.F64.RN"], ["CAS", "ADD.F64.FTZ"]),
]
#: The only FTZ opcodes allowed: the float32 atomic (of ``atomic`` kernels) and the
#: reciprocal step of ptxas's unsigned integer division.
FTZ_ALLOWED = {"ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU", "F2I.FTZ.U32.TRUNC.NTZ"}
DIVISION = ("I2F.U32.RP", "MUFU.RCP")


def _instructions(ptx: str) -> str:
    """The PTX without comments and the (long, mangled) names."""
    body = re.sub(r"//[^\n]*", "", ptx)
    return re.sub(r"_Z\w+", "NAME", body)


@pytest.mark.parametrize("target", _targets())
def test_kernel_compiles_for_cc90_with_the_instructions_it_relies_on(target):
    name, fn, sig = target
    ptx = _compile_ptx(fn, sig)
    assert ".target sm_90" in ptx
    code = _instructions(ptx)
    assert ".ftz" not in code, f"{name}: flush-to-zero would lose subnormals"
    rules = [(must, must_not) for pattern, must, must_not in EXPECTED if re.search(pattern, name)]
    assert rules, f"no PTX expectations for kernel {name}: add them to EXPECTED"
    for must, must_not in rules:
        for ins in must:
            assert ins in code, f"{name}: expected {ins!r} in the PTX"
        for ins in must_not:
            assert ins not in code, f"{name}: did not expect {ins!r} in the PTX"
    cubin, log = _assemble(ptx)
    assert cubin[:4] == b"\x7fELF", f"{name}: nvJitLink gave no sm_90 cubin\n{log}"
    assert "error" not in log.lower(), log


@pytest.mark.parametrize("target", _targets())
def test_kernel_machine_code_has_no_cas_loop_and_flushes_no_value(target, tmp_path):
    """The sm_90 SASS: what the hardware runs (see the module docstring for the rules)."""
    name, fn, sig = target
    cubin, _log = _assemble(_compile_ptx(fn, sig))
    ops = _sass_opcodes(cubin, tmp_path)
    text = " ".join(ops)
    for pattern, must, must_not in SASS_EXPECTED:
        if not re.search(pattern, name):
            continue
        for op in must:
            assert any(o.startswith(op) for o in ops), f"{name}: expected {op} in the SASS"
        for frag in must_not:
            bad = sorted({o for o in ops if frag in o})
            assert not bad, f"{name}: did not expect {bad} in the SASS"
    flushes = sorted({o for o in ops if "FTZ" in o} - FTZ_ALLOWED)
    assert not flushes, f"{name}: flush-to-zero in {flushes}"
    if "F2I.FTZ.U32.TRUNC.NTZ" in ops:  # only as the reciprocal of an integer division
        assert all(d in text for d in DIVISION), f"{name}: F2I.FTZ outside a division"
    if any(o.startswith("ATOMG.E.ADD.F32.FTZ") for o in ops):
        assert name.startswith("atomic["), f"{name}: a float32 atomic outside 'atomic'"


#: A NumPy without ``row_stack`` (removed in NumPy 2.5) simulated here, then a kernel compiled.
_WITHOUT_ROW_STACK = """
import sys
from unittest import mock
import numpy as np
if hasattr(np, "row_stack"):  # a NumPy that still has it (below 2.5): take it away
    del np.row_stack
    np.__all__ = [name for name in np.__all__ if name != "row_stack"]
from numba import cuda
from numba.cuda import dispatcher
from kernel_targets import cuda_targets

class CC90:
    compute_capability = (9, 0)

name, fn, sig = cuda_targets()[0]
with mock.patch.object(dispatcher, "get_current_device", lambda: CC90()):
    ptx = cuda.compile_ptx(fn, sig, cc=(9, 0))[0]
assert ".target sm_90" in ptx, ptx[:500]
assert not hasattr(np, "row_stack"), "bitfold left its stand-in np.row_stack behind"
print("compiled", name)
"""


@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "numba-cuda compiles here")
def test_kernels_compile_under_a_numpy_without_row_stack():
    """numba-cuda 0.30 registers ``np.row_stack``, which NumPy 2.5 removed: with that NumPy no
    kernel compiled on the first GPU run (2026-12-04, H200). bitfold loads the registry with a
    stand-in and takes it away again (``bitfold.kernels.numba_cuda_compat``)."""
    if DEVICE:
        pytest.skip("on the device its own NumPy decides; this simulates one without row_stack")
    here = Path(__file__).resolve().parent
    paths = [str(here.parent / "src"), str(here)]  # bitfold, and kernel_targets beside this file
    paths += [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_ROW_STACK], capture_output=True,
                          text=True, env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("compiled"), done.stdout


def test_cuda_backend_loads_when_required():
    """With BITFOLD_REQUIRE_CUDA=1, a missing or broken numba-cuda fails instead of skipping."""
    if not REQUIRED:
        pytest.skip("set BITFOLD_REQUIRE_CUDA=1 to require the CUDA backend (CI and gpu_check do)")
    assert HAVE_NUMBA_CUDA, "BITFOLD_REQUIRE_CUDA=1 but numba-cuda is not installed"
    assert not SIM, "BITFOLD_REQUIRE_CUDA=1 needs the real numba.cuda, not the simulator"
    from kernel_targets import cuda_targets

    _name, fn, sig = cuda_targets()[0]
    assert "atom.shared.add.u32" in _compile_ptx(fn, sig)
    if DEVICE:
        from numba import cuda

        assert cuda.is_available(), "BITFOLD_CUDA_DEVICE=1 but numba.cuda sees no usable GPU"
