"""The Numba compile census (benchmarks/numba_census): what it logs and how it sums up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CENSUS = Path(__file__).resolve().parents[1] / "benchmarks" / "numba_census"
sys.path.insert(0, str(CENSUS))
import census_summary as summary  # noqa: E402  (the census folder, put on the path above)


def _row(function, signature="(int64,)", compiled=True, depth=0, cpu_s=1.0, pid=1):
    return {"pid": pid, "process": f"p{pid}", "function": function, "signature": signature,
            "compiled": compiled, "depth": depth, "cpu_s": cpu_s}  # fmt: skip


def test_the_summary_counts_top_level_compiles_and_repeats_across_processes():
    rows = [
        _row("k.outer", cpu_s=3.0),
        _row("k.inner", depth=1, cpu_s=2.0),  # inside outer's 3 s: not counted again
        _row("k.outer", cpu_s=2.5, pid=2),  # the same signature in another process
        _row("k.outer", signature="(float64,)", cpu_s=1.5),
        _row("k.small", compiled=False, cpu_s=0.1),
    ]
    got = summary.summarise(rows, top=5)
    assert got["compiled"] == {"signatures": 3, "distinct": 2, "cpu_s": 7.0}
    assert got["loaded_from_cache"] == {"signatures": 1, "cpu_s": 0.1}
    assert got["repeated"] == {"signatures": 1, "cpu_s": 2.5}
    assert got["by_function"] == [{"function": "k.outer", "compiles": 3, "cpu_s": 7.0}]
    assert [p["process"] for p in got["by_process"]] == ["p1", "p2"]


def test_a_process_with_the_census_on_its_path_logs_its_compiles(tmp_path):
    log = tmp_path / "census.jsonl"
    code = (
        "from numba import njit\n"
        "@njit\ndef inner(x):\n    return x + 1\n"
        "@njit\ndef outer(x):\n    return inner(x) * 2\n"
        "assert outer(3) == 8\n"
    )
    env = dict(os.environ, PYTHONPATH=str(CENSUS), NUMBA_CENSUS_LOG=str(log))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    depth = {r["function"].rsplit(".", 1)[-1]: r["depth"] for r in rows}
    assert depth == {"outer": 0, "inner": 1}, rows
    assert all(r["compiled"] and r["signature"] == "(int64,)" for r in rows), rows
    got = summary.summarise(rows, top=5)
    assert got["compiled"]["signatures"] == 1 and got["by_function"][0]["function"].endswith(
        "outer"
    )
