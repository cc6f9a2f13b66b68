"""An EmbeddingBag recommender made exact: the same bits for any order of the ids in a bag.

A two-tower recommender: a user is the mean of the embeddings of the items in
their history (``nn.EmbeddingBag(mode="mean")``), an item the sum of the
embeddings of its tags (``nn.EmbeddingBag(mode="sum")``), and the score their
dot product. Every bag is a float sum in the forward, and every table's
gradient a fold of rows in the backward, so listing a user's history in
another order (another database query, another join) changes the bits of
the trained tables. This script trains the model a few steps twice, the
second time with the ids inside every bag shuffled (the same bags), three ways:

* plain PyTorch: two different parameter digests;
* the unchanged model inside ``bitfold.torch.exact_mode()``: each bag and
  each gradient row the correctly rounded sum, so one digest for both orders;
* the drop-in ``bitfold.torch.EmbeddingBag`` in place of ``torch.nn.EmbeddingBag``
  (same arguments, same state dict): one digest for both orders too.

On a CPU, plain PyTorch gives the same bits for the same order run after run;
on a GPU its atomics reorder the sums by themselves.

Run (``--small`` took 10 to 20 s on this project's 2-core CPU machine; a first run also
compiles the kernels)::

    python examples/embedding_bag_recommender.py --small
    python examples/embedding_bag_recommender.py --items 1000000 --dim 64 --batch 4096

Needs ``torch``.
"""

from __future__ import annotations

import argparse
import time

import torch

import bitfold
import bitfold.torch as bt


class TwoTower(torch.nn.Module):
    def __init__(self, items: int, tags: int, dim: int, bag=torch.nn.EmbeddingBag) -> None:
        super().__init__()
        self.history = bag(items, dim, mode="mean")
        self.tags = bag(tags, dim, mode="sum")

    def forward(self, hist, hist_offsets, tag_ids, tag_offsets) -> torch.Tensor:
        user = self.history(hist, hist_offsets)
        item = self.tags(tag_ids, tag_offsets)
        return (user * item).sum(-1)


def bags(g: torch.Generator, batch: int, vocab: int, longest: int) -> tuple[torch.Tensor, ...]:
    """``batch`` bags of 1 to ``longest`` ids: (ids, offsets, ids shuffled inside each bag)."""
    lengths = torch.randint(1, longest + 1, (batch,), generator=g)
    ids = torch.randint(0, vocab, (int(lengths.sum()),), generator=g)
    offsets = torch.cumsum(lengths, 0) - lengths
    bag_of = torch.repeat_interleave(torch.arange(batch), lengths)
    noise = torch.rand(ids.numel(), generator=g, dtype=torch.double)
    within = torch.argsort(bag_of.double() + noise)  # a random order inside each bag
    return ids, offsets, ids[within]


def make_batches(args: argparse.Namespace) -> list[dict[str, tuple]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(args.steps):
        hist, hist_off, hist_shuffled = bags(g, args.batch, args.items, args.history)
        tag, tag_off, tag_shuffled = bags(g, args.batch, args.tags, 8)
        label = torch.randint(0, 2, (args.batch,), generator=g).float()
        out.append({"given": (hist, hist_off, tag, tag_off, label),
                    "shuffled": (hist_shuffled, hist_off, tag_shuffled, tag_off, label)})
    return out


def train(model: torch.nn.Module, batches, order: str) -> str:
    torch.manual_seed(1)
    for bag in (model.history, model.tags):
        bag.reset_parameters()
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    for batch in batches:
        hist, hist_off, tag, tag_off, label = batch[order]
        opt.zero_grad()
        score = model(hist, hist_off, tag, tag_off)
        torch.nn.functional.binary_cross_entropy_with_logits(score, label).backward()
        opt.step()
    return bitfold.digest(model.state_dict())


def compare(label: str, run) -> tuple[bool, str]:
    """Run once per order of the ids; print both digests and whether they agree."""
    t0 = time.perf_counter()
    given, shuffled = run("given"), run("shuffled")
    same = given == shuffled
    print(f"{label}: {'one digest' if same else 'two digests'} ({time.perf_counter() - t0:.1f} s)")
    print(f"  bags as given  {given}")
    print(f"  ids shuffled   {shuffled}")
    return same, given


SIZES = {"full": {"items": 100_000, "tags": 1_000, "dim": 32, "batch": 1024, "steps": 10},
         "small": {"items": 2_000, "tags": 100, "dim": 16, "batch": 256, "steps": 5}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--small", action="store_true", help="small tables and batches (the tests)")
    p.add_argument("--items", type=int, help="default 100000 (--small: 2000)")
    p.add_argument("--tags", type=int, help="default 1000 (--small: 100)")
    p.add_argument("--dim", type=int, help="default 32 (--small: 16)")
    p.add_argument("--batch", type=int, help="users a step (default 1024; --small: 256)")
    p.add_argument("--history", type=int, default=50, help="longest user history")
    p.add_argument("--steps", type=int, help="Adagrad steps (default 10; --small: 5)")
    args = p.parse_args()
    for name, value in SIZES["small" if args.small else "full"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)

    batches = make_batches(args)
    print(f"two-tower recommender: {args.items} items, {args.tags} tags, dim {args.dim}, "
          f"{args.steps} Adagrad steps of {args.batch} users")
    model = TwoTower(args.items, args.tags, args.dim)
    compare("plain torch.nn.EmbeddingBag", lambda order: train(model, batches, order))

    counts: dict[str, int] = {}

    def exact(order: str) -> str:
        with bt.exact_mode(strict=True) as mode:  # strict: raise on a fold it cannot make exact
            digest = train(model, batches, order)
        counts.update(mode.counts)  # what the mode made exact, by op
        return digest

    ok_mode, in_mode = compare("exact_mode()", exact)
    print(f"  folds made exact a run: {counts}")
    drop_in = TwoTower(args.items, args.tags, args.dim, bag=bt.EmbeddingBag)
    ok_drop, dropped = compare("bitfold.torch.EmbeddingBag", lambda order: train(
        drop_in, batches, order))
    print("exact_mode and the drop-in give the same bits:", "yes" if in_mode == dropped else "no")
    ok = ok_mode and ok_drop
    print("exact runs reproducible for any order of the ids:", "yes" if ok else "NO")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
