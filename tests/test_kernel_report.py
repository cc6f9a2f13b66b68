"""``scripts/kernel_report.py`` (``make kernel-report``) on a small selection, without a GPU.

Two variants are built for sm_90 (the float32 lanes kernel as the backend launches it,
``WORD=True``, and its limb path alone, ``WORD=False``) and read: registers and spills
from ``ptxas -v``, STL/LDL in the SASS, shared memory, occupancy on an H200, the loops
mapped to their Triton source loops and their instructions a value. Both must have
no spills. The reading of loops and occupancy is also checked on known inputs, and
the model of one small GPU-check configuration runs on the built code. About
half a minute on two cores (Triton's cache makes a rerun faster).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAVE_TRITON = importlib.util.find_spec("triton") is not None
pytestmark = pytest.mark.skipif(
    not HAVE_TRITON, reason="triton is not installed (pip install -e '.[triton]' or '.[test]')"
)
WORD = "lanes[float32->float32, init=False]"
LIMBS = "lanes[float32->float32, init=False, WORD=False]"


def _kernel_report():
    if "kernel_report" in sys.modules:
        return sys.modules["kernel_report"]
    path = ROOT / "scripts" / "kernel_report.py"
    spec = importlib.util.spec_from_file_location("kernel_report", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernel_report"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kr():
    return _kernel_report()


@pytest.fixture(scope="module")
def rep(kr, tmp_path_factory):
    return kr.report([WORD, LIMBS], arches=("cuda",), with_model=False,
                     work=tmp_path_factory.mktemp("kernel_report"))  # fmt: skip


def test_every_variant_is_named_and_the_lanes_come_both_ways(kr):
    names = {v.name: v for v, _fn, _sig in kr.targets()}
    assert WORD in names and names[WORD].launched and names[WORD].const["WORD"] is True
    assert LIMBS in names and not names[LIMBS].launched and names[LIMBS].const["WORD"] is False
    # the launch shapes of a scalar fold and of rows of 64 are among them
    assert 1 in names[WORD].shape_of
    assert any(v.kernel == "hot" and 1 in v.shape_of for v in names.values())
    assert any(v.kernel == "lanes" and 64 in v.shape_of for v in names.values())
    assert set(kr.model_variants()) <= set(names)


def test_report_fields(rep):
    assert set(rep["variants"]) == {WORD, LIMBS}
    for name, v in rep["variants"].items():
        s = v["sm90"]
        assert "error" not in s, f"{name}: {s.get('error')}"
        p = s["ptxas"]
        assert isinstance(p["registers"], int) and 0 < p["registers"] <= 255, (name, p)
        for key in ("spill_store_bytes", "spill_load_bytes", "stack_bytes"):
            assert isinstance(p[key], int), (name, key, p)
        assert isinstance(s["stl"], int) and isinstance(s["ldl"], int)
        assert s["num_warps"] == 4 and s["shared_dynamic"] >= 0
        occ = s["occupancy"]
        assert 1 <= occ["blocks_per_sm"] <= 32 and occ["warps_per_sm"] <= 64
        assert occ["limited_by"] in ("registers", "shared", "warps", "blocks")
        assert s["sass_instructions"] > s["straight"]["instructions"] > 0
        json.dumps(v)  # the report's JSON holds it
    word = rep["variants"][WORD]["sm90"]["loops"]
    limbs = rep["variants"][LIMBS]["sm90"]["loops"]
    assert {"word", "limbs"} <= set(word), sorted(word)
    assert set(limbs) == {"limbs"}, sorted(limbs)
    for loop in (*word.values(), limbs["limbs"]):
        assert loop["per_value"] > 0 and loop["values_per_iteration"] == 128
        assert loop["loads_per_iteration"] == 2 and loop["load_depth"] == 2  # order, then values
        assert sum(loop["by_function"].values()) == pytest.approx(loop["per_iteration"])


def test_float32_lanes_have_no_spills(rep):
    for name in (WORD, LIMBS):
        s = rep["variants"][name]["sm90"]
        assert s["ptxas"]["spill_store_bytes"] == 0 and s["ptxas"]["spill_load_bytes"] == 0, name
        assert s["stl"] == 0 and s["ldl"] == 0, name
    assert rep["goals"]["spills"]["met"] and rep["goals"]["spills"]["judged"] == 1


def test_word_path_against_the_limbs(rep):
    row = rep["goals"]["word_path"]["variants"][WORD]
    loops = rep["variants"][WORD]["sm90"]["loops"]
    assert row["word_path"] == pytest.approx(loops["word"]["per_value"])
    assert row["limbs"] == rep["variants"][LIMBS]["sm90"]["loops"]["limbs"]["per_value"]
    assert row["ratio"] == pytest.approx(row["word_path"] / row["limbs"])


def test_markdown_has_the_goals_and_every_variant(kr, rep):
    text = kr.markdown(rep)
    assert "## Goals" in text and "0 spills in every kernel variant" in text
    for name in (WORD, LIMBS):
        assert f"`{name}`" in text


def test_occupancy_on_an_h200(kr):
    assert kr.occupancy(78, 32, 4)["blocks_per_sm"] == 6  # 80 registers a thread: 20,480 a block
    assert kr.occupancy(255, 32, 4)["blocks_per_sm"] == 2
    assert kr.occupancy(24, 32, 4) == {"blocks_per_sm": 16, "warps_per_sm": 64, "occupancy": 1.0,
                                       "limited_by": "warps"}  # fmt: skip
    assert kr.occupancy(32, 100_000, 4)["limited_by"] == "shared"


def test_loops_are_read_from_sass_with_their_source_and_unrolling(kr):
    """A loop unrolled four times and its remainder map to one source loop; an iteration's
    instructions are the unrolled body over four; the load chain is order, then values."""
    line = (kr.SRC / kr.KERNEL_FILES[0]).read_text().splitlines()
    word_for = next(i + 1 for i, t in enumerate(line) if "signs = _add_float(" in t)
    src = f'\t//## File "/x/src/{kr.KERNEL_FILES[0]}", line {word_for}'
    body = ["        /*{:04x}*/                   LDG.E R2, desc[UR4][R4.64] ;",
            "        /*{:04x}*/                   IMAD.WIDE R6, R2, 0x4, R8 ;",
            "        /*{:04x}*/                   LDG.E R10, desc[UR4][R6.64] ;",
            "        /*{:04x}*/                   IADD3 R12, R12, R10, RZ ;"]  # fmt: skip
    text, addr = [], 0

    def emit(lines):
        nonlocal addr
        for t in lines:
            text.append(t.format(addr))
            addr += 16

    text.append(".L_x_1:")
    text.append(src)
    emit(body * 4)
    emit(["        /*{:04x}*/               @P0 BRA `(.L_x_1) ;"])
    text.append(".L_x_2:")
    emit(body)
    emit(["        /*{:04x}*/               @P1 BRA `(.L_x_2) ;", "        /*{:04x}*/  EXIT ;"])
    code = kr.read_sass("\n".join(text))
    const = {"BLOCK_K": 128, "BLOCK_D": 1}
    loops = kr.loops_of(code, const, 128, kr.source_loops())
    assert [lp["label"] for lp in loops] == ["word", "word"]
    assert [lp["unroll"] for lp in loops] == [4, 1]
    summary = kr.summarize_loops(loops)["word"]
    assert summary["per_iteration"] == pytest.approx(17 / 4)
    assert summary["remainder"] == 5 and summary["load_depth"] == 2


def test_the_limb_branch_is_skipped_by_programs_without_refused_lanes(kr):
    """The straight-line code after a predicated exit that holds the limbs loop (and no other
    value loop) is charged only to programs with limb trips."""
    line = (kr.SRC / kr.KERNEL_FILES[0]).read_text().splitlines()
    word = next(i + 1 for i, t in enumerate(line) if "signs = _add_float(" in t)
    limbs = next(i + 1 for i, t in enumerate(line) if "n_ninf = _take(" in t)
    src = '\t//## File "/x/src/{}", line {}'
    op = "        /*{:04x}*/                   IADD3 R12, R12, R10, RZ ;"
    text, addr = [], 0

    def emit(lines):
        nonlocal addr
        for t in lines:
            text.append(t.format(addr) if t.startswith(" ") else t)
            addr += 16 if t.startswith(" ") else 0

    emit([op] * 3 + [".L_x_1:", src.format(kr.KERNEL_FILES[0], word), op, op,
                     "        /*{:04x}*/               @P0 BRA `(.L_x_1) ;", op,
                     "        /*{:04x}*/               @!P1 EXIT ;", op, op, ".L_x_2:",
                     src.format(kr.KERNEL_FILES[0], limbs), op,
                     "        /*{:04x}*/               @P0 BRA `(.L_x_2) ;", op, op, op,
                     "        /*{:04x}*/  EXIT ;"])  # fmt: skip
    code = kr.read_sass("\n".join(text))
    loops = kr.loops_of(code, {"BLOCK_K": 128, "BLOCK_D": 1}, 128, kr.source_loops())
    assert [lp["label"] for lp in loops] == ["word", "limbs"]
    guarded = kr.guarded_regions(code, loops)["limbs"]
    assert guarded["straight_instructions"] == 6  # two before the loop, four after it
    rec = {"straight": {"instructions": len(kr.straight_line(code, loops)), "load_depth": 0,
                        "barriers": 0}, "guarded": {"limbs": guarded},
           "machine_loops": loops}  # fmt: skip
    costs = kr.program_costs(rec, {"word": [4, 4], "limbs": [0, 2]}, 2, {"L": 10})
    assert rec["straight"]["instructions"] == 11 and [lp["instructions"] for lp in loops] == [3, 2]
    assert list(costs["instructions"]) == [11 - 6 + 4 * 3, 11 + 4 * 3 + 2 * 2]


def test_model_of_a_small_configuration(kr, rep):
    """The lanes launch of the GPU check's smoke configuration, modelled on the built code."""
    gpu_check = kr._module("gpu_check", ROOT / "scripts" / "gpu_check.py")
    cfg = next(c for c in gpu_check.SMOKE if c.name == "K=1e6")
    pm = kr.plan_model(cfg)
    launch = kr.lanes_launch(pm, kr.lanes_shape("float32", cfg.D))
    assert launch["values"] == cfg.N and launch["programs"] == -(-cfg.K // 128)
    variant = {v.name: v for v, _fn, _sig in kr.targets()}[WORD]
    t = kr.kernel_time(variant, rep["variants"][WORD]["sm90"], launch)
    assert t["us"] > kr.MODEL["launch_us"] and t["bound"] in t["roofs_us"]
    assert t["instructions_per_value"] > rep["variants"][WORD]["sm90"]["loops"]["word"][
        "per_value"]  # fmt: skip
    assert not t["unmodelled_loops"]
