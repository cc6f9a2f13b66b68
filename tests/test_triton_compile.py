"""Build the Triton kernels for sm_90 (H100/H200) and gfx942 (MI300) without a GPU; read the code.

The suite runs the Triton kernels in Triton's CPU interpreter (``TRITON_INTERPRET=1``),
which executes them with NumPy semantics and cannot see what a GPU does with
them: whether a kernel compiles at all, what its atomics become, whether float
arithmetic flushes subnormals to zero or a multiply-add is fused. The module
docstring of :mod:`bitfold.kernels.triton` lists these blind spots and how the
code closes them; this module checks the closing in the machine code. Each
kernel variant of ``kernel_targets.triton_all()`` is built with
``triton.compile(ASTSource(...), target=GPUTarget(...))`` in worker processes
without ``TRITON_INTERPRET`` (see ``triton_machine_code.py``) and read:

1. every variant builds for sm_90 (PTX for ``sm_90a`` and an ELF cubin);
2. the kernels that merge integer state (``hot[``, ``scatter[``) do it with
   native 64-bit integer atomic adds (PTX ``atom.global...add.u64``; in the
   SASS ``ATOMG.E.ADD.64`` or, its result unused, ``REDG.E.ADD.64``); no
   kernel has a compare-and-swap (PTX ``atom...cas``, SASS ``CAS`` or a
   ``SPIN`` loop), and the kernels that do not merge have no atomics at all
   (no program reads what another writes);
3. nothing is flushed to zero: no ``.ftz`` in any PTX, and the exact kernels'
   PTX has no float instruction (values are decoded from their bits with
   integers, never converted) but the lanes' float64 word of narrow values:
   exact widening conversions, plain float64 adds and a comparison with zero.
   In the SASS the only ``FTZ`` allowed is ``F2I.FTZ.U32.TRUNC.NTZ`` inside
   ptxas's expansion of a 32-bit unsigned integer division (after
   ``I2F.U32.RP`` and ``MUFU.RCP``, where a PTX ``div``/``rem`` is): it
   truncates the reciprocal of the divisor, an index (``round_rows``'
   ``r // D``), which is never subnormal, not a value;
4. the ordered kernels' float adds are plain round-to-nearest adds (PTX
   ``add.f32``/``add.f64`` without a rounding or saturation modifier, SASS
   ``FADD``/``DADD`` without one) and nothing can fuse them: no float
   multiply, no ``fma`` in the PTX, no ``FFMA``/``DFMA`` in the SASS;
5. AMD gfx942: merging kernels have 64-bit global atomic adds
   (``global_atomic_add_x2``), no kernel has a compare-and-swap (``cmpswap``),
   every kernel keeps float32 and float16/float64 subnormals
   (``.amdhsa_float_denorm_mode_32 3`` and ``_16_64 3``), and the ordered
   kernels have no fused multiply-add (``v_fma*``/``v_mad*`` on floats).
   Skipped, with what is missing, where the Triton wheel cannot build for AMD.

A covering subset is built by default (every kernel function with every value
dtype and every output dtype it takes, init on and off): under a minute on two
cores, about ten seconds when Triton's cache holds the builds. ``BITFOLD_ALL_TRITON_VARIANTS=1``
builds every variant (a few minutes).
"""

from __future__ import annotations

import importlib.util
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import machine_code
import pytest
import triton_machine_code as tmc

HAVE_TRITON = importlib.util.find_spec("triton") is not None
ALL = os.environ.get("BITFOLD_ALL_TRITON_VARIANTS") == "1"
pytestmark = pytest.mark.skipif(
    not HAVE_TRITON, reason="triton is not installed (pip install -e '.[triton]' or '.[test]')"
)

#: The default selection: every kernel function, value dtype, output dtype and init setting.
SELECTED = [
    "lanes[float16->float32, init=False]",
    "lanes[bfloat16->float16, init=True]",
    "lanes[float32->bfloat16, init=False]",
    "lanes[float64->float64, init=True]",
    "round_rows[float16->float64, init=True]",
    "round_rows[bfloat16->bfloat16, init=False]",
    "round_rows[float32->float16, init=True]",
    "round_rows[float64->float32, init=False]",
    "hot[float16]",
    "hot[bfloat16]",
    "hot[float32]",
    "hot[float64]",
    "scatter[float16]",
    "scatter[bfloat16]",
    "scatter[float32]",
    "scatter[float64]",
    "ordered[float32->float16]",
    "ordered[float32->bfloat16]",
    "ordered[float32->float32]",
    "ordered[float32->float64]",
    "ordered[float64->float16]",
    "ordered[float64->bfloat16]",
    "ordered[float64->float32]",
    "ordered[float64->float64]",
    "bounds[float32]",
    "bounds[float64]",
    "words[float32]",
    "words[float64]",
    "decode[int64->float16, init=False]",
    "decode[int64->bfloat16, init=True]",
    "decode[int64->float32, init=False]",
    "decode[int64->float64, init=True]",
]


def _all_names() -> list[str]:
    from kernel_targets import triton_all

    return [t[0] for t in triton_all()]


NAMES = _all_names() if ALL and HAVE_TRITON else SELECTED
MERGING = ("hot[", "scatter[")
EXACT = ("lanes[", "round_rows[", "hot[", "scatter[", "bounds[", "words[", "decode[")


# -- building (once a module, shared by the tests) ----------------------------------------------
def _triton_nvdisasm() -> str | None:
    """The ``nvdisasm`` Triton's wheel ships, where the CUDA wheel's is not installed."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        found = Path(root) / "backends" / "nvidia" / "bin" / "nvdisasm"
        if found.is_file() and os.access(found, os.X_OK):
            return str(found)
    return None


@pytest.fixture(scope="module")
def sm90(tmp_path_factory) -> dict[str, object]:
    """name -> ``(Built, SASS opcodes or the error reading them)`` for compute capability 9.0."""
    out = tmp_path_factory.mktemp("sm90")
    builds = tmc.build(NAMES, "cuda", out / "build")
    assert builds.unavailable is None, builds.unavailable
    tool = machine_code.nvdisasm() or _triton_nvdisasm()

    def sass(name: str):
        built = builds.variants[name]
        if "cubin" not in built.code:
            return None
        where = out / f"sass{NAMES.index(name)}"
        where.mkdir()
        try:
            return machine_code.sass_opcodes(built.code["cubin"], where, tool)
        except Exception as err:  # nvdisasm missing or failing: the SASS tests fail with it
            return err

    with ThreadPoolExecutor(tmc.jobs()) as pool:
        opcodes = dict(zip(NAMES, pool.map(sass, NAMES), strict=True))
    slow = sorted(builds.variants.values(), key=lambda b: -b.seconds)[:3]
    print(f"\nsm_90: {len(NAMES)} variants built in {builds.wall_seconds:.1f} s "
          f"({tmc.jobs()} workers); slowest: "
          + ", ".join(f"{b.name} {b.seconds:.1f} s" for b in slow))  # fmt: skip
    return {name: (builds.variants[name], opcodes[name]) for name in NAMES}


@pytest.fixture(scope="module")
def gfx942(tmp_path_factory) -> tmc.Builds:
    builds = tmc.build(NAMES, "hip", tmp_path_factory.mktemp("gfx942"))
    if builds.unavailable is None:
        print(f"\ngfx942: {len(NAMES)} variants built in {builds.wall_seconds:.1f} s")
    return builds


def _ptx(sm90, name: str) -> str:
    built, _ops = sm90[name]
    assert built.error is None, f"{name} did not build for sm_90:\n{built.error}"
    return _instructions(built.code["ptx"])


def _sass(sm90, name: str) -> list[str]:
    built, ops = sm90[name]
    assert built.error is None, f"{name} did not build for sm_90:\n{built.error}"
    if isinstance(ops, Exception):
        raise ops
    assert ops, f"{name}: no SASS read"
    return ops


def _instructions(ptx: str) -> str:
    """The PTX's code: no comments, no debug locations or sections."""
    ptx = ptx.split(".section\t.debug", 1)[0].split(".section .debug", 1)[0]
    ptx = re.sub(r"//[^\n]*", "", ptx)
    return re.sub(r"^\s*\.(loc|file)\b[^\n]*", "", ptx, flags=re.M)


def _found(pattern: str, code: str) -> list[str]:
    return sorted(set(re.findall(pattern, code, re.M)))


# -- the selection -------------------------------------------------------------------------------
def test_selection_covers_every_kernel_dtype_and_init():
    """Every kernel function with each value dtype, output dtype and init it is built with."""
    everything = _all_names()
    assert set(NAMES) <= set(everything), f"unknown variants {sorted(set(NAMES) - set(everything))}"
    for field, what in ((0, "kernel"), (1, "value dtype"), (2, "output dtype"), (3, "init")):
        for kernel in {tmc.parse(n)[0] for n in everything}:
            want = {tmc.parse(n)[field] for n in everything if tmc.parse(n)[0] == kernel}
            have = {tmc.parse(n)[field] for n in NAMES if tmc.parse(n)[0] == kernel}
            assert want == have, (f"{kernel}: SELECTED misses the {what}(s) "
                                  f"{sorted(map(str, want - have))}: add a variant")  # fmt: skip


# -- 1. it builds ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_builds_for_sm90(sm90, name):
    built, _ops = sm90[name]
    assert built.error is None, f"{name} did not build for sm_90:\n{built.error}"
    ptx, cubin = built.code.get("ptx", ""), built.code.get("cubin", b"")
    assert re.search(r"^\.target sm_90a?\b", ptx, re.M), f"{name}: PTX not for sm_90"
    kernel = tmc.parse(name)[0] + "_kernel"
    assert re.search(rf"\.entry {kernel}\(", ptx), f"{name}: no .entry {kernel} in the PTX"
    assert isinstance(cubin, bytes) and cubin[:4] == b"\x7fELF", f"{name}: no cubin"


# -- 2. merges: native 64-bit integer atomic adds, never a compare-and-swap ------------------------
@pytest.mark.parametrize("name", NAMES)
def test_ptx_merges_with_64bit_integer_atomic_adds_and_no_cas(sm90, name):
    code = _ptx(sm90, name)
    atomics = _found(r"\b(?:atom|red)\.[.\w]+", code)
    _judge_atomics(
        name, "PTX", _found(r"\b(?:atom|red)(?:\.\w+)*\.cas\b[.\w]*", code), atomics,
        [a for a in atomics if re.fullmatch(r"(atom|red)\.global(\.\w+)*\.add\.[us]64", a)],
    )


@pytest.mark.parametrize("name", NAMES)
def test_sass_merges_with_64bit_integer_atomic_adds_and_no_cas(sm90, name):
    ops = _sass(sm90, name)
    atomics = sorted({o for o in ops if re.match(r"(ATOM|RED)[GS]?\.", o)})
    _judge_atomics(
        name, "SASS", sorted({o for o in ops if "CAS" in o or "SPIN" in o}), atomics,
        [o for o in atomics if re.match(r"(ATOMG?|REDG?)\.E\.ADD\.(S|U)?64\b", o)],
    )


def _judge_atomics(name: str, where: str, cas: list, atomics: list, adds: list) -> None:
    """No compare-and-swap; merging kernels: 64-bit integer atomic adds and nothing else;
    the others: no atomics at all."""
    assert not cas, f"{name}: compare-and-swap in the {where}: {cas}"
    if name.startswith(MERGING):
        assert adds, f"{name}: no 64-bit integer atomic add in the {where} (atomics: {atomics})"
        others = sorted(set(atomics) - set(adds))
        assert not others, f"{name}: atomics other than 64-bit integer adds: {others}"
    else:
        assert not atomics, f"{name}: atomics in a kernel that merges nothing: {atomics}"


# -- 3. nothing flushed to zero --------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_ptx_flushes_nothing_and_exact_kernels_have_no_float_instruction(sm90, name):
    code = _ptx(sm90, name)
    ftz = _found(r"\b\w+(?:\.\w+)*\.ftz\b[.\w]*", code)
    assert not ftz, f"{name}: flush-to-zero in the PTX: {ftz}"
    to_int = _found(r"\bcvt(?:\.\w+)*\.[su]\d+\.(?:b?f)\d+\b", code)
    assert not to_int, f"{name}: float-to-integer conversions in the PTX: {to_int}"
    if name.startswith(EXACT):
        floats = _found(r"\S*\.b?f(?:16|32|64)\b\S*", code)
        allowed = set() if name.startswith(("lanes[float64", *EXACT[1:])) else WORD_SUM
        wrong = sorted(set(floats) - allowed)
        assert not wrong, f"{name}: float instructions in an exact kernel's PTX: {wrong}"


#: The float instructions an exact kernel may hold: the lanes' float64 word of float32,
#: bfloat16 and float16 values (widening, exact and without ``.ftz``; plain adds, exact by the
#: lanes' certificate; the sum compared with zero; its one rounding to a float32 output, to
#: nearest even). No multiply, so nothing can fuse.
WORD_SUM = {"cvt.f64.f32", "cvt.f64.f16", "add.f64", "setp.eq.f64", "setp.ne.f64",
            "cvt.rn.f32.f64"}


#: The only FTZ opcode allowed: ptxas's 32-bit unsigned division (the divisor's reciprocal).
DIVISION_FTZ = "F2I.FTZ.U32.TRUNC.NTZ"


@pytest.mark.parametrize("name", NAMES)
def test_sass_flushes_nothing(sm90, name):
    ops = _sass(sm90, name)
    ftz = sorted({o for o in ops if "FTZ" in o} - {DIVISION_FTZ})
    assert not ftz, f"{name}: flush-to-zero in the SASS: {ftz}"
    n = ops.count(DIVISION_FTZ)
    if n:
        divisions = _found(r"\b(?:div|rem)\.[su](?:32|64)\b", _ptx(sm90, name))
        assert divisions, f"{name}: {DIVISION_FTZ} but no integer division in the PTX"
        assert ops.count("I2F.U32.RP") >= n and "MUFU.RCP" in ops, (
            f"{name}: {DIVISION_FTZ} outside ptxas's division (I2F.U32.RP, MUFU.RCP)")


# -- 4. ordered: round-to-nearest adds, nothing fused --------------------------------------------
ORDERED = [n for n in NAMES if n.startswith("ordered[")]


@pytest.mark.parametrize("name", ORDERED)
def test_ordered_adds_round_to_nearest_and_nothing_fuses(sm90, name):
    out = tmc.parse(name)[2]
    code = _ptx(sm90, name)
    width = "64" if out == "float64" else "32"
    adds = _found(r"\badd(?:\.\w+)*\.f(?:16|32|64)\b", code)
    assert adds == [f"add.f{width}"] or adds == [f"add.rn.f{width}"], (
        f"{name}: expected plain float{width} adds in the PTX, found {adds}")
    fused = _found(r"\b(?:fma|mad|mul|sub|div|rcp|sqrt)(?:\.\w+)*\.f(?:16|32|64)\b", code)
    assert not fused, f"{name}: float arithmetic besides the adds in the PTX: {fused}"
    ops = _sass(sm90, name)
    sass_adds = sorted({o for o in ops if re.match(r"[FDH]ADD", o)})
    assert sass_adds == [("DADD" if width == "64" else "FADD")], (
        f"{name}: expected plain round-to-nearest adds in the SASS, found {sass_adds}")
    # HFMA2.MMA (-RZ, RZ, immediate) is how ptxas puts constants in registers: a move
    fused = sorted({o for o in ops if re.match(r"[FDH](FMA|MUL)", o) and o != "HFMA2.MMA"})
    assert not fused, f"{name}: fused or multiplying float instructions in the SASS: {fused}"


# -- 5. AMD gfx942 -------------------------------------------------------------------------------
def _amdgcn(gfx942, name: str) -> str:
    if gfx942.unavailable:
        pytest.skip(f"no AMD build here: {gfx942.unavailable}")
    built = gfx942.variants[name]
    assert built.error is None, f"{name} did not build for gfx942:\n{built.error}"
    return re.sub(r";[^\n]*", "", built.code["amdgcn"])


@pytest.mark.parametrize("name", NAMES)
def test_amd_merges_with_64bit_atomic_adds_and_no_cmpswap(gfx942, name):
    asm = _amdgcn(gfx942, name)
    atomics = _found(r"\b(?:global|flat|buffer|ds)_atomic\w*", asm)
    _judge_atomics(name, "gfx942 code", _found(r"\b\w*cmpswap\w*", asm), atomics,
                   [a for a in atomics if a == "global_atomic_add_x2"])  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_amd_keeps_subnormals_and_fuses_nothing(gfx942, name):
    asm = _amdgcn(gfx942, name)
    for mode in ("32", "16_64"):
        found = _found(rf"\.amdhsa_float_denorm_mode_{mode}\s+(\d+)", asm)
        assert found == ["3"], (f"{name}: .amdhsa_float_denorm_mode_{mode} is {found}, "
                                "not 3 (subnormal inputs and outputs kept)")  # fmt: skip
    if name.startswith("ordered["):
        fused = _found(r"\bv_(?:pk_)?(?:fma|fmac|mad|mac|mul)\w*_f(?:16|32|64)\w*", asm)
        assert not fused, f"{name}: fused or multiplying float instructions: {fused}"
        width = "64" if tmc.parse(name)[2] == "float64" else "32"
        assert f"v_add_f{width}" in asm, f"{name}: no v_add_f{width} in the gfx942 code"


# -- 6. offsets: the x program id never enters 32-bit arithmetic ----------------------------------
#: 32-bit integer arithmetic (a product or sum that wraps past 2^31); ``.wide`` forms are 64-bit.
ARITH32 = re.compile(r"(?:add|sub|mul|mad|shl|or|xor)(?:\.(?:lo|hi|cc))?\.[bsu]32")
#: A PTX instruction (its predicate dropped): ``(opcode, operands)``.
INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+([^;]*);", re.M)


@pytest.mark.parametrize("name", NAMES)
def test_ptx_widens_the_program_id_before_its_offsets(sm90, name):
    """A grid has up to 2^31 - 1 programs along x, so ``program_id(0) * BLOCK`` in int32 wraps
    past 2^31 elements. The kernels widen the id to int64 first: in the PTX the register read
    from ``%ctaid.x`` is only widened (``cvt`` to 64 bits, ``mul.wide``/``mad.wide``) or
    compared, never an operand of 32-bit arithmetic. (``%ctaid.y`` is below 65,536, so ptxas
    may keep its small products in 32 bits.)"""
    code = _ptx(sm90, name)
    ids = set(re.findall(r"mov\.u32\s+(%r\d+),\s*%ctaid\.x;", code))
    assert ids, f"{name}: no read of %ctaid.x in the PTX"
    narrow = [f"{op} {operands}" for op, operands in INSTRUCTION.findall(code)
              if ARITH32.fullmatch(op) and ids & {a.strip() for a in operands.split(",")[1:]}]
    assert not narrow, f"{name}: the x program id in 32-bit arithmetic: {narrow}"
