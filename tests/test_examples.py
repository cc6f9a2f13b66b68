"""The scripts in examples/ run at their small sizes, and each shows what it claims.

Every example trains a model twice or more and prints the digests of the
trained parameters: the exact runs must print one digest (for any order of the
edges, of the ids in a bag, of a hashed layer's positions; for 1, 2 and 4
processes), and the plain PyTorch runs next to them two, or the example
would show nothing. The digests are read from the output and compared here,
not taken from the script's own verdict.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _output(proc: subprocess.Popen, timeout: float = 300) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{proc.args} ran past {timeout} s\n{out}\n{err}")
    assert proc.returncode == 0, f"{proc.args} exited with {proc.returncode}\n{out}\n{err}"
    return out


def _run(script: str, *args: str) -> str:
    return _output(_start(str(EXAMPLES / script), *args))


def _sections(out: str) -> dict[str, list[str]]:
    """``label: ...`` lines followed by indented digest lines -> {label: [digests]}."""
    found: dict[str, list[str]] = {}
    label = None
    for line in out.splitlines():
        if line and not line[0].isspace():
            label = line.split(":")[0]
        elif label is not None and (m := DIGEST.search(line)):
            found.setdefault(label, []).append(m.group())
    return found


def _distinct(digests: list[str]) -> int:
    assert len(digests) >= 2, digests
    return len(set(digests))


@pytest.mark.skipif(importlib.util.find_spec("torch_geometric") is None,
                    reason="torch_geometric is not installed")  # fmt: skip
def test_gcn_eager_and_compiled_give_one_digest_for_any_edge_order():
    found = _sections(_run("gcn_exact.py", "--small"))
    assert _distinct(found["exact_mode (eager)"]) == 1, found
    assert _distinct(found["bitfold.torch.compile"]) == 1, found
    assert _distinct(found["plain PyTorch"]) == 2, found  # the edge order changes plain sums


def test_embedding_bag_recommender_gives_one_digest_for_any_order_of_the_ids():
    found = _sections(_run("embedding_bag_recommender.py", "--small"))
    exact = found["exact_mode()"] + found["bitfold.torch.EmbeddingBag"]
    assert len(exact) == 4 and _distinct(exact) == 1, found  # the drop-in's bits are the mode's
    assert _distinct(found["plain torch.nn.EmbeddingBag"]) == 2, found


def test_hashed_layer_gives_one_digest_for_any_order_of_its_positions():
    out = _run("hashed_layer.py", "--small", "--steps", "8")
    runs = {line.split("sha256:")[0].strip(): DIGEST.search(line).group()
            for line in out.splitlines() if DIGEST.search(line)}  # fmt: skip
    exact = [d for label, d in runs.items() if not label.startswith("plain")]
    assert len(runs) == 6 and len(exact) == 4, out
    assert _distinct(exact) == 1, out
    assert runs["plain v[h], positions given"] != runs["plain v[h], positions shuffled"], out
    assert "bitfold     same bits in both orders: True" in out
    assert "index_add_  same bits in both orders: False" in out


def _gloo_available() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


@pytest.mark.skipif(not _gloo_available(), reason="torch.distributed with gloo is not available")
def test_torchrun_gives_one_digest_on_1_2_and_4_processes():
    """Three torchrun launches at once (they mostly wait for their rendezvous and imports)."""
    worlds = {1: "exact,plain", 2: "exact,plain", 4: "exact,ddp"}
    procs = {
        n: _start("-m", "torch.distributed.run", f"--nproc_per_node={n}", "--standalone",
                  str(EXAMPLES / "torchrun_data_parallel.py"), "--small", "--steps", "4",
                  "--reduce", modes)
        for n, modes in worlds.items()
    }  # fmt: skip
    digests = {}
    for n, proc in procs.items():
        out = _output(proc)
        digests[n] = dict(re.findall(r"--reduce (\w+)\s+digest (sha256:[0-9a-f]{64})", out))
        assert set(digests[n]) == set(worlds[n].split(",")), out
    assert len({digests[n]["exact"] for n in worlds}) == 1, digests
    # float32 sums grouped by process: ((g0 + g1) + g2) + g3 on one, (g0 + g2) + (g1 + g3) on two
    assert digests[1]["plain"] != digests[2]["plain"], digests
    # DDP with the exact hook, one micro-batch of a power-of-two size per process: the same bits
    assert digests[4]["ddp"] == digests[4]["exact"], digests


@pytest.mark.skipif(not _gloo_available(), reason="torch.distributed with gloo is not available")
def test_fsdp_transformer_gives_one_digest_on_every_world_size_and_mesh():
    """One process (4 micro-batches each), torchrun with 2 (2 each) and --spawn 4 (1 each):
    one exact digest; plain FSDP2's float sums give others. (HSDP meshes, 2x2 among them:
    ``tests/test_fsdp_meshes.py``, one launch a world size.)"""
    small = [str(EXAMPLES / "fsdp_transformer.py"), "--small"]
    procs = {
        "1": _start(*small),
        "2": _start("-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone", *small),
        "4": _start(*small, "--spawn", "4"),
    }
    digests = {}
    for label, proc in procs.items():
        out = _output(proc)
        digests[label] = dict(re.findall(r"--reduce (\w+)\s+digest (sha256:[0-9a-f]{64})", out))
        assert set(digests[label]) == ({"exact"} if "x" in label else {"exact", "plain"}), out
        assert ("HSDP" if "x" in label else "FSDP") in out.splitlines()[0], out
    assert len({d["exact"] for d in digests.values()}) == 1, digests
    plain = {label: d["plain"] for label, d in digests.items() if "plain" in d}
    assert len(set(plain.values())) == 3, digests  # float sums grouped by process differ
    assert digests["1"]["plain"] != digests["1"]["exact"], digests
