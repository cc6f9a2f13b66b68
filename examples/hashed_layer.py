"""A hashed (folded) layer trained with bitfold: the weight-gradient fold is exact.

A HashedNets-style layer keeps ``K`` shared weights and expands them into a
``(hid, D)`` weight through a fixed hash map: ``W = v[h]``. Its backward folds
the ``hid * D`` weight gradients into the ``K`` shared ones, a scatter-add. A
float scatter-add depends on the order in which the terms arrive, and a GPU's
atomics pick that order anew on every call, so two runs of the same training
end with different models. ``bitfold.torch.FoldedLinear`` computes the fold
as the correctly rounded sum: the same bits whatever the order.

Part 1 folds one weight gradient the usual way (``index_add_``) and with a
``bitfold.Fold`` plan, once with the terms in position order and once
shuffled (as atomics would add them), and times both. Part 2 trains the
layer (``relu(x @ W.T)`` towards 1, Adam) from the same start several ways:

* ``FoldedLinear``, twice: one digest;
* plain PyTorch (``v[h]``, whose backward is torch's scatter-add), with the
  positions listed in their order and in a shuffled order (the same layer,
  the same forward bits): two digests;
* the same two runs with the gather ``bitfold.torch.expand`` (the fold
  inside ``FoldedLinear``): one digest, ``FoldedLinear``'s.

On a CPU torch's scatter-add is sequential, so its bits repeat for one
order; the shuffled order stands in for a GPU's atomics. The exact digest
differs from the plain ones: it is the correctly rounded sum, theirs are
float sums.

Run (the defaults are the experiment's sizes: D=768, hid=4096, K=433)::

    python examples/hashed_layer.py --small          # 10 to 20 s on a 2-core CPU
    python examples/hashed_layer.py                  # 20 steps at the sizes above

Needs ``torch``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import bitfold
import bitfold.torch as bt
from bitfold.hashing import bucket_map


class HashedLinear(torch.nn.Module):
    """``FoldedLinear`` written out: ``W = v[h]`` gathered from a flat list of positions.

    ``order`` lists the positions of ``W`` in another order (the same weight); ``fold``
    says whether the gather's backward is torch's scatter-add or bitfold's exact fold.
    """

    def __init__(self, D: int, hid: int, K: int, seed: int, order: torch.Tensor, fold: str):
        super().__init__()
        self.shape = (hid, D)
        index = torch.from_numpy(bucket_map(seed, self.shape, K)).reshape(-1)
        self.order, self.inverse = order, torch.argsort(order)
        self.listed = index[order]  # the positions' buckets, in the listed order
        self.plan = bitfold.Fold(self.listed, K) if fold == "exact" else None
        self.shared_weight = torch.nn.Parameter(torch.empty(K))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.shared_weight
        listed = bt.expand(v, self.plan) if self.plan is not None else v[self.listed]
        W = listed[self.inverse].view(self.shape)  # back in row-major order: the same W
        return torch.nn.functional.linear(x, W)


def train(layer: torch.nn.Module, X: torch.Tensor, v0: torch.Tensor, steps: int, lr: float):
    with torch.no_grad():
        layer.shared_weight.copy_(v0)
    opt = torch.optim.Adam(layer.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        h = torch.relu(layer(X))
        ((h - 1.0).square().sum() / (2 * X.shape[0])).backward()
        opt.step()
    return bitfold.digest(layer.shared_weight.detach())


def timeit(f, n: int = 10) -> float:
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


def part1(args, index: torch.Tensor, shuffle: torch.Tensor) -> bool:
    print("\n1. One fold of a weight gradient, terms in position order and shuffled\n")
    g = torch.Generator().manual_seed(2)
    grad = torch.randn(index.numel(), generator=g)

    def usual(idx, val):
        return torch.zeros(args.K).index_add_(0, idx, val)

    plan = bitfold.Fold(index, args.K)
    t0 = time.perf_counter()
    plan_shuffled = bitfold.Fold(index[shuffle], args.K)
    build = (time.perf_counter() - t0) * 1e3
    a, b = usual(index, grad), usual(index[shuffle], grad[shuffle])
    e, f = plan(grad), plan_shuffled(grad[shuffle])
    print(f"   index_add_  same bits in both orders: {bitfold.bits_equal(a, b)}"
          f"  (largest difference {float((a - b).abs().max()):.3e})")
    print(f"   bitfold     same bits in both orders: {bitfold.bits_equal(e, f)}")
    t_usual, t_exact = timeit(lambda: usual(index, grad)), timeit(lambda: plan(grad))
    print(f"   cost: index_add_ {t_usual:.2f} ms, bitfold {t_exact:.2f} ms a fold "
          f"({t_exact / t_usual:.2f}x); the plan took {build:.0f} ms, once for the run")
    if index.numel() < 1_000_000:
        print(f"   (a fold of {index.numel():,} values costs little either way, so bitfold's "
              "fixed cost a call (choosing a route, starting its threads) sets this ratio; "
              "at the experiment's size, 3,145,728 values, the two cost about the same: run "
              "without --small)")
    return bitfold.bits_equal(e, f)


def part2(args, shuffle: torch.Tensor) -> bool:
    print(f"\n2. Training, {args.steps} Adam steps\n")
    g = torch.Generator().manual_seed(1)
    X = torch.randn(args.batch, args.D, generator=g)
    v0 = torch.randn(args.K, generator=g) * 0.05
    given = torch.arange(args.D * args.hid)
    runs = {}

    def run(label, layer):
        t0 = time.perf_counter()
        runs[label] = train(layer, X, v0, args.steps, args.lr)
        print(f"   {label:<32} {runs[label]}  ({time.perf_counter() - t0:.1f} s)")

    for i in (1, 2):
        run(f"FoldedLinear, run {i}", bt.FoldedLinear(args.D, args.hid, args.K, bias=False))
    for fold in ("plain", "exact"):
        for name, order in (("given", given), ("shuffled", shuffle)):
            run(f"{fold} v[h], positions {name}",
                HashedLinear(args.D, args.hid, args.K, 0, order, fold))
    plain_same = runs["plain v[h], positions given"] == runs["plain v[h], positions shuffled"]
    exact = {v for k, v in runs.items() if not k.startswith("plain")}
    print(f"\n   plain PyTorch: one digest for both orders: {'yes' if plain_same else 'no'}")
    print(f"   bitfold: one digest for all {len(runs) - 2} exact runs: "
          f"{'yes' if len(exact) == 1 else 'NO'}")
    return len(exact) == 1


SIZES = {"full": {"D": 768, "hid": 4096, "batch": 128, "steps": 20},
         "small": {"D": 64, "hid": 256, "batch": 32, "steps": 20}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="a small layer and few steps (the tests)")
    p.add_argument("--D", type=int, help="input features (default 768; --small: 64)")
    p.add_argument("--hid", type=int, help="output features (default 4096; --small: 256)")
    p.add_argument("--K", type=int, default=433, help="shared weights (buckets)")
    p.add_argument("--batch", type=int, help="default 128 (--small: 32)")
    p.add_argument("--steps", type=int, help="Adam steps (default 20; --small: 20)")
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()
    for name, value in SIZES["small" if args.small else "full"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    print(f"hashed layer: D={args.D}, hid={args.hid}, K={args.K}, batch {args.batch}")
    index = torch.from_numpy(bucket_map(0, (args.hid, args.D), args.K)).reshape(-1)
    shuffle = torch.from_numpy(np.random.default_rng(3).permutation(index.numel()))
    ok = part1(args, index, shuffle)
    ok &= part2(args, shuffle)
    print("\nexact runs reproducible:", "yes" if ok else "NO")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
