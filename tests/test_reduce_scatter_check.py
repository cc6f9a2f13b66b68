"""``exact_reduce_scatter``'s check: one all-reduce with the bounds while the size stays.

Two local gloo ranks make a run of calls — sizes that stay, change and differ
between the ranks — counting the all-reduces each call makes: the check carries
every shard's block bounds where the group's previous call had the same size,
and ranks whose inputs differ in size (so in the length of their bounds) still
meet in one check of the agreed length and are refused on both ranks.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bitfold.cli.launch import leave

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch.distributed is not available")
pytest.importorskip("bitfold.distributed", reason="needs torch")

#: (elements on rank 0, elements on rank 1) of each call, in order.
CALLS = [(600, 600), (600, 600), (1280, 1280), (1280, 1280), (600, 256), (600, 600), (64, 64)]


def _rank(rank: int, world: int, init: str, out: str) -> None:
    from bitfold import distributed
    from bitfold.errors import DistributedError

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    counted = {"all_reduce": 0}
    all_reduce = dist.all_reduce

    def counting(*args, **kwargs):
        counted["all_reduce"] += 1
        return all_reduce(*args, **kwargs)

    distributed.dist.all_reduce = counting  # the module's collectives go through dist
    rng = np.random.default_rng(rank)
    said = []
    for sizes in CALLS:
        n = sizes[rank]
        x = torch.from_numpy((rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(
            np.float32))  # fmt: skip
        output = torch.full((sizes[0] // world,), 7.0)
        before = counted["all_reduce"]
        try:
            distributed.exact_reduce_scatter(output, x)
            made = counted["all_reduce"] - before
            want = distributed.exact_all_reduce(x)[rank * n // world : (rank + 1) * n // world]
            same = torch.equal(output.view(torch.int32), want.view(torch.int32))
            got = "same" if same else "diff"
        except DistributedError as err:
            made = counted["all_reduce"] - before
            got = "refused" if (output == 7.0).all() else "refused, output written"
            got += " (sizes)" if "different shapes" in str(err) else ""
        said.append([got, made])
    with open(f"{out}-{rank}.json", "w") as f:
        json.dump(said, f)
    dist.destroy_process_group()
    leave(0)


@pytest.mark.slow
def test_the_check_carries_the_bounds_while_the_size_stays(tmp_path):
    from test_distributed import _spawn_ranks

    out = str(tmp_path / "said")
    _spawn_ranks(_rank, 2, tmp_path, out)
    said = [json.loads(open(f"{out}-{r}.json").read()) for r in range(2)]
    assert said[0] == said[1]
    assert said[0] == [  # [what came of the call, its all-reduces: the check, the bounds]
        ["same", 2],  # the group's first call: the check, then the bounds
        ["same", 1],  # the same size: the bounds in the check
        ["same", 2],  # a new size
        ["same", 1],
        ["refused (sizes)", 1],  # bounds of two lengths: refused in a check of the agreed one
        ["same", 2],  # a new size again
        ["same", 2],
    ]
