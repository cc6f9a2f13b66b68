"""A sharded transformer (FSDP2) whose trained weights are the same bits on 1, 2 or 4 processes.

A small decoder-only transformer — causal attention and a mixture-of-experts
feed-forward layer whose token combine is a fold (``index_add`` of every
(token, expert) output into its token) — learns a next-token task, its
blocks and itself sharded with ``torch.distributed.fsdp.fully_shard``. Each
step's global batch is cut into micro-batches of a fixed size, dealt
round-robin to the processes: with 4 micro-batches a step, 1 process runs 4
of them, 2 run 2 each, 4 run 1 each. A micro-batch's gradient has the same
bits on any process (one thread each; forward and backward run under
``bitfold.torch.exact_mode()``, so the expert combine and the embedding and
gather backwards are exact folds too); what decides whether the world size
changes the model is how those gradients are summed:

* ``--reduce exact``: ``bitfold.distributed.exact_fsdp(model)`` makes FSDP's
  gradient reduce-scatter (and HSDP's replicate all-reduce, ``--mesh RxS``)
  an exact sum over every micro-batch of every process, rounded once; a
  process's earlier micro-batches are held back in exact sums
  (``handle.no_reduce()``). The same digest on every world size and mesh.
* ``--reduce plain``: FSDP2 as usual — micro-batch gradients accumulated in
  float32 (``set_requires_gradient_sync(False)``), then a float32
  reduce-scatter: the sums are grouped by process, so the digest changes
  with the world size.

The optimizer is an Adam written with one rounding an operation (no fused
multiply-add whose use could depend on where a shard's elements fall).

Run (gloo on the CPU; rank 0 prints; ``--reduce exact,plain`` is the default)::

    python examples/fsdp_transformer.py                      # one process
    python examples/fsdp_transformer.py --spawn 2            # two local processes
    torchrun --nproc-per-node 4 examples/fsdp_transformer.py
    torchrun --nproc-per-node 4 examples/fsdp_transformer.py --mesh 2x2   # HSDP

and compare the ``digest`` lines. ``--small`` trains a smaller model for
fewer steps (the tests). Needs ``torch`` with ``torch.distributed`` (gloo).
"""

from __future__ import annotations

import argparse
import os
import socket
from contextlib import nullcontext

# One thread a process for bitfold's kernels too: the processes fill the cores. Bits unchanged.
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import bitfold
import bitfold.torch
from bitfold.cli.launch import leave
from bitfold.distributed import exact_fsdp

SIZES = {
    "full": {"steps": 20, "dim": 64, "layers": 4, "seq": 32},
    "small": {"steps": 4, "dim": 16, "layers": 2, "seq": 8},
}


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class MixtureOfExperts(nn.Module):
    """Top-``k`` routing to ``experts`` two-layer MLPs; each token's output is the gated sum of
    its experts' outputs, combined with one ``index_add`` (a fold: ``k`` terms a token)."""

    def __init__(self, dim: int, hidden: int, experts: int, k: int) -> None:
        super().__init__()
        self.k = k
        self.router = nn.Linear(dim, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, dim, hidden) / dim**0.5)
        self.w2 = nn.Parameter(torch.randn(experts, hidden, dim) / hidden**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        gate, chosen = F.softmax(self.router(flat), dim=-1).topk(self.k, dim=-1)
        tokens, outputs = [], []
        for e in range(self.w1.shape[0]):
            tok, slot = (chosen == e).nonzero(as_tuple=True)
            h = F.gelu(flat[tok] @ self.w1[e]) @ self.w2[e]
            tokens.append(tok)
            outputs.append(h * gate[tok, slot, None])
        combined = torch.zeros_like(flat).index_add(0, torch.cat(tokens), torch.cat(outputs))
        return combined.view_as(x)


class Block(nn.Module):
    def __init__(self, dim: int, experts: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads=2)
        self.moe = MixtureOfExperts(dim, 2 * dim, experts, k=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.moe(self.ln2(x))


class Decoder(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, seq: int, experts: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)  # vocab rows that no world size here divides
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, experts) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x).flatten(0, 1))  # (tokens, vocab): not a view


def micro_batches(args: argparse.Namespace, step: int) -> list[torch.Tensor]:
    """The step's micro-batches of token sequences, the same on every rank: each sequence
    counts up by a stride of its own (mod vocab), so the next token can be learned."""
    g = torch.Generator().manual_seed(1000 + step)
    n = args.micro_batches * args.micro_batch
    start = torch.randint(0, args.vocab, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    seqs = (start + stride * torch.arange(args.seq + 1)) % args.vocab
    return list(seqs.split(args.micro_batch))


def adam(params: list[nn.Parameter], state: dict, step: int, lr: float) -> None:
    """Adam (betas 0.9, 0.99), one rounding an operation: the same bits on any shard layout."""
    with torch.no_grad():
        for p in params:
            m, v = state.setdefault(id(p), (torch.zeros_like(p), torch.zeros_like(p)))
            m.mul_(0.9).add_(p.grad * 0.1)
            v.mul_(0.99).add_((p.grad * p.grad) * 0.01)
            m_hat = m / (1 - 0.9**step)
            v_hat = v / (1 - 0.99**step)
            p.sub_((m_hat / (v_hat.sqrt() + 1e-8)) * lr)


def train(args: argparse.Namespace, reduce: str, mesh) -> tuple[str, float, float]:
    """Train from the same start with one way of summing the gradients: the weights' digest and
    the mean loss of the first and the last step."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)  # the same initial weights on every rank
    model = Decoder(args.vocab, args.dim, args.layers, args.seq, args.experts)
    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=args.reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=args.reshard)
    params = list(model.parameters())
    state: dict = {}
    tokens = args.micro_batches * args.micro_batch * args.seq  # the global batch's targets
    handle = exact_fsdp(model, mean_over=tokens, timeout=120) if reduce == "exact" else None
    if handle is None:  # FSDP's float sums, divided by nobody: the loss carries the mean
        model.set_force_sum_reduction_for_comms(True)
        model.set_gradient_divide_factor(1.0)
    rank, world = dist.get_rank(), dist.get_world_size()
    losses = []
    for step in range(args.steps):
        mine = micro_batches(args, step)[rank::world]  # round-robin: micro-batch m to rank m % W
        total = torch.zeros(())
        for i, seqs in enumerate(mine):
            last = i == len(mine) - 1
            if handle is not None:
                hold = nullcontext() if last else handle.no_reduce()
            else:  # FSDP's gradient accumulation: float32 sums of the unsharded gradients
                model.set_requires_gradient_sync(last)
                hold = nullcontext()
            with hold, bitfold.torch.exact_mode():
                logits = model(seqs[:, :-1])
                loss = F.cross_entropy(logits, seqs[:, 1:].reshape(-1), reduction="sum")
                (loss if handle is not None else loss / tokens).backward()
            total += loss.detach()
        dist.all_reduce(total)  # for the print only
        losses.append(float(total) / tokens)
        adam(params, state, step + 1, args.lr)
        model.zero_grad(set_to_none=True)
    weights = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return bitfold.digest(weights), losses[0], losses[-1]


def parse_mesh(text: str | None, world: int) -> tuple[int, ...]:
    """``--mesh`` ("S" or "RxS") as a mesh shape of ``world`` ranks (None: ``(world,)``)."""
    if text is None:
        return (world,)
    try:
        shape = tuple(int(n) for n in text.lower().split("x"))
    except ValueError:
        shape = ()
    if len(shape) not in (1, 2) or min(shape) < 1:
        raise SystemExit(f"--mesh takes S (FSDP) or RxS (HSDP: replicas x shards); got {text!r}")
    if shape[0] * (shape[-1] if len(shape) == 2 else 1) != world:
        raise SystemExit(f"--mesh {text}: {'x'.join(map(str, shape))} ranks, but the world "
                         f"has {world} processes")  # fmt: skip
    return shape


def run(args: argparse.Namespace) -> None:
    """One process's part: join the group, train each way, print on rank 0."""
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)  # the thread count can change a micro-batch's bits: fix it
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = parse_mesh(args.mesh, world)
    if args.micro_batches % world:
        raise SystemExit(f"--micro-batches {args.micro_batches} must be a multiple of the "
                         f"{world} processes (one share each)")  # fmt: skip
    names = ("replicate", "shard")[-len(shape) :]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    if rank == 0:
        print(f"world size {world}, mesh {'x'.join(map(str, shape))} "
              f"({'HSDP' if len(shape) == 2 else 'FSDP'}): {args.steps} steps of "
              f"{args.micro_batches} micro-batches x {args.micro_batch} sequences of "
              f"{args.seq} tokens, {args.micro_batches // world} a process")  # fmt: skip
    for reduce in args.reduce.split(","):
        digest, first, last = train(args, reduce, mesh)
        if rank == 0:
            print(f"--reduce {reduce:<6} digest {digest}  (loss {first:.4f} -> {last:.4f})",
                  flush=True)  # fmt: skip
    dist.destroy_process_group()
    leave(0)  # no interpreter teardown: a gloo thread can abort it after all the work is done


def _spawned(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
    run(args)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reduce", default="exact,plain",
                   help="exact or plain, or both separated by a comma (default: both)")
    p.add_argument("--spawn", type=int, metavar="N",
                   help="start N local processes (instead of torchrun)")
    p.add_argument("--mesh", help="S (FSDP, the default: S = world size) or RxS (HSDP)")
    p.add_argument("--small", action="store_true", help="a smaller model, fewer steps (tests)")
    p.add_argument("--steps", type=int, help="default 20 (--small: 4)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches a step")
    p.add_argument("--micro-batch", type=int, default=2, help="sequences a micro-batch")
    p.add_argument("--seq", type=int, help="tokens a sequence (default 32; --small: 8)")
    p.add_argument("--dim", type=int, help="model width (default 64; --small: 16)")
    p.add_argument("--layers", type=int, help="blocks (default 4; --small: 2)")
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--vocab", type=int, default=61)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--no-reshard", dest="reshard", action="store_false",
                   help="reshard_after_forward=False (keep the gathered weights for backward)")
    args = p.parse_args()
    for name, value in SIZES["small" if args.small else "full"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    for mode in args.reduce.split(","):
        if mode not in ("exact", "plain"):
            p.error(f"--reduce takes exact or plain (or both); got {mode!r}")
    if args.spawn is not None:
        if args.spawn < 1:
            p.error(f"--spawn takes a positive number of processes; got {args.spawn}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(_spawned, args=(args.spawn, port, args), nprocs=args.spawn)
        return
    if "RANK" not in os.environ:  # one process, no launcher: a group of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))  # fmt: skip
    run(args)


if __name__ == "__main__":
    main()
