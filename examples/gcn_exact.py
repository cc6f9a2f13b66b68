"""A PyTorch Geometric GCN whose training is exact: the same bits for any order of the edges.

A graph network sums messages along edges. PyG's ``GCNConv`` computes node
degrees and aggregates messages with scatter-adds, and its backward sums
gradients along the edges again. A float sum depends on the order of its
terms, so the same graph with its edge list in another order (another data
loader, another sort, a GPU's atomics) trains a different model. This script
trains one two-layer GCN on a random graph twice, the second time with the
edge list shuffled (the same graph), three ways:

* plain PyTorch: two different parameter digests;
* eager, inside ``bitfold.torch.exact_mode()``: every fold, forward and
  backward, is the correctly rounded sum, so both runs end with one digest;
* compiled with ``bitfold.torch.compile`` (``torch.compile`` with the folds
  rewritten into exact ops): one digest for both edge orders. The compiled
  step's other ops are inductor's, so its digest need not equal the eager one.

On a CPU, plain PyTorch gives the same bits for the same edge order run
after run; on a GPU its atomics reorder the sums by themselves.

Run (``--small`` took 1 to 2 minutes on this project's 2-core CPU machine, most of it compiling)::

    python examples/gcn_exact.py --small
    python examples/gcn_exact.py --nodes 20000 --edges 200000 --steps 50
    python examples/gcn_exact.py --small --no-compile   # eager runs only

Needs ``torch`` and ``torch_geometric``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch_geometric.nn import GCNConv

import bitfold
import bitfold.torch as bt


class GCN(torch.nn.Module):
    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = GCNConv(features, hidden)
        self.conv2 = GCNConv(hidden, classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x, edge_index).relu()
        return self.conv2(h, edge_index)


def make_graph(args: argparse.Namespace) -> tuple[torch.Tensor, ...]:
    """Random features, labels and edges; and the same edges in another order."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.nodes, args.features, generator=g)
    y = torch.randint(0, args.classes, (args.nodes,), generator=g)
    edge_index = torch.randint(0, args.nodes, (2, args.edges), generator=g)
    shuffled = edge_index[:, torch.randperm(args.edges, generator=g)]
    return x, y, edge_index, shuffled


def train(model, step_model, x, y, edge_index, steps: int) -> str:
    """``steps`` Adam steps from the same initial parameters; the parameters' digest."""
    torch.manual_seed(1)
    for m in model.modules():
        if isinstance(m, GCNConv):
            m.reset_parameters()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        out = step_model(x, edge_index)
        torch.nn.functional.cross_entropy(out, y).backward()
        opt.step()
    return bitfold.digest(model.state_dict())


def compare(label: str, run) -> bool:
    """Run once per edge order; print both digests and whether they agree."""
    t0 = time.perf_counter()
    given, shuffled = run("given"), run("shuffled")
    same = given == shuffled
    print(f"{label}: {'one digest' if same else 'two digests'} ({time.perf_counter() - t0:.1f} s)")
    print(f"  edges as given  {given}")
    print(f"  edges shuffled  {shuffled}")
    return same


SIZES = {"full": {"nodes": 5000, "edges": 50000, "features": 32, "hidden": 32, "steps": 30},
         "small": {"nodes": 500, "edges": 5000, "features": 16, "hidden": 16, "steps": 10}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="a tiny graph and few steps (the tests)")
    p.add_argument("--nodes", type=int, help="default 5000 (--small: 500)")
    p.add_argument("--edges", type=int, help="default 50000 (--small: 5000)")
    p.add_argument("--features", type=int, help="default 32 (--small: 16)")
    p.add_argument("--hidden", type=int, help="default 32 (--small: 16)")
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--steps", type=int, help="Adam steps (default 30; --small: 10)")
    p.add_argument("--no-compile", action="store_true", help="skip the compiled runs")
    args = p.parse_args()
    for name, value in SIZES["small" if args.small else "full"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    x, y, edge_index, shuffled = make_graph(args)
    edges = {"given": edge_index, "shuffled": shuffled}
    model = GCN(args.features, args.hidden, args.classes)
    print(f"GCN on {args.nodes} nodes, {args.edges} edges, {args.steps} Adam steps")

    compare("plain PyTorch", lambda order: train(model, model, x, y, edges[order], args.steps))

    def exact_eager(order: str) -> str:
        with bt.exact_mode(strict=True):  # strict: raise on any fold it cannot make exact
            return train(model, model, x, y, edges[order], args.steps)

    ok = compare("exact_mode (eager)", exact_eager)

    if not args.no_compile:
        compiled = bt.compile(model, strict=True)  # compiled once, used for both edge orders
        ok &= compare("bitfold.torch.compile", lambda order: train(
            model, compiled, x, y, edges[order], args.steps))
        print(f"  folds made exact in the compiled graphs: {dict(compiled.bitfold.counts)}")
    print("exact runs reproducible for any edge order:", "yes" if ok else "NO")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
