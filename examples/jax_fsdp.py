"""Sharded data parallelism (FSDP, ZeRO-3) in JAX: the same weights on 1, 2 or 4 devices.

The weights of a small MLP live in one flat float32 vector, cut between the
devices of a 1-D mesh (padded to a multiple of the device count): each device
holds and updates only its shard. A step, under ``jax.shard_map``, gathers the
full weights (``lax.all_gather``), takes one gradient per micro-batch of a
fixed size on the device's share of the global batch, and reduce-scatters the
sum of all the micro-batch gradients of all the devices so that each device
receives the rows of its shard; then it updates that shard (plain SGD).

With ``--reduce exact`` (the default) the reduce-scatter is
``bitfold.jax.psum_scatter(grads, "batch", axis=0, tiled=True)``: the exact real
sum over every micro-batch of every device, rounded once to float32, each
device rounding only its shard. With ``--reduce plain`` it is ``jnp.sum`` over
the device's micro-batches, then ``lax.psum_scatter``: float32 additions
grouped by device, so the device count changes the bits. The script prints a
digest of the final weights (``bitfold.digest``)::

    python examples/jax_fsdp.py --devices 1
    python examples/jax_fsdp.py --devices 4                 # same digest
    python examples/jax_fsdp.py --devices 1 --reduce plain
    python examples/jax_fsdp.py --devices 4 --reduce plain  # another

``--devices N`` asks XLA for N simulated CPU devices (``XLA_FLAGS`` set before
JAX is imported); ``--json`` prints one JSON line; ``--small`` is the tests' size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("--devices", type=int, help="simulate this many CPU devices")
    p.add_argument("--small", action="store_true", help="3 steps, a global batch of 64")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reduce", choices=("exact", "plain"), default="exact")
    p.add_argument("--batch", type=int, default=256, help="global batch (examples)")
    p.add_argument("--micro-batch", type=int, default=8, help="examples per micro-batch")
    p.add_argument("--hidden", type=int, default=37, help="hidden units (any count)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args(argv)
    if args.small:
        args.steps, args.batch = 3, 64
    if args.devices is not None and args.devices < 1:
        p.error(f"--devices takes a positive number; got {args.devices}")
    return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.devices and "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={ARGS.devices}"
    )
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import bitfold  # noqa: E402
import bitfold.jax  # noqa: E402

FEATURES = 8


def init(hidden: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The MLP's float32 weights, from a fixed seed (host arrays)."""
    rng = np.random.default_rng(seed)
    params = {
        "w1": rng.standard_normal((FEATURES, hidden)) / np.sqrt(FEATURES),
        "b1": np.zeros(hidden),
        "w2": rng.standard_normal((hidden, 1)) / np.sqrt(hidden),
        "b2": np.zeros(1),
    }
    return {k: v.astype(np.float32) for k, v in params.items()}


def data(batch: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A fixed global batch of a noisy regression."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, FEATURES)).astype(np.float32)
    y = np.sin(x @ rng.standard_normal(FEATURES)) + 0.1 * rng.standard_normal(batch)
    return x, y.astype(np.float32)


def loss(params, x, y):
    """Squared error *summed* over the examples, so that batch gradients add up."""
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.sum(((h @ params["w2"])[:, 0] + params["b2"][0] - y) ** 2)


def mean_loss(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    """The mean squared error, in float64 NumPy on the host (for the print: one value)."""
    p = {k: v.astype(np.float64) for k, v in params.items()}
    h = np.tanh(x @ p["w1"] + p["b1"])
    return float(np.mean(((h @ p["w2"])[:, 0] + p["b2"][0] - y) ** 2))


class Flat:
    """The weights as one flat vector padded to a multiple of the device count, and back."""

    def __init__(self, params: dict[str, np.ndarray], devices: int) -> None:
        self.names = sorted(params)
        self.shapes = [params[k].shape for k in self.names]
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        total = sum(self.sizes)
        self.padded = -(-total // devices) * devices

    def flatten(self, params):
        flat = jnp.concatenate([jnp.ravel(params[k]) for k in self.names])
        return jnp.pad(flat, (0, self.padded - flat.shape[0]))

    def unflatten(self, flat):
        out, at = {}, 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = flat[at : at + size].reshape(shape)
            at += size
        return out


def make_step(mesh, flat: Flat, reduce: str, batch: int, micro: int, lr: float):
    """One SGD step of the sharded weights on the global batch."""

    def step(shard, x, y):  # shard: this device's rows of the weights; x, y: its examples
        # The whole flat vector, typed as varying over "batch": jax.grad below then adds
        # nothing across devices itself, and the reduce-scatter is the only sum.
        params = flat.unflatten(lax.all_gather(shard, "batch", tiled=True))
        xs, ys = x.reshape(-1, micro, x.shape[-1]), y.reshape(-1, micro)
        # One gradient per micro-batch, by the same program on any device count.
        grads = jax.lax.map(lambda b: flat.flatten(jax.grad(loss)(params, *b)), (xs, ys))
        if reduce == "exact":  # (k, padded) -> this device's (padded / n,) rows, exact
            total = bitfold.jax.psum_scatter(grads, "batch", axis=0, tiled=True)
        else:
            total = lax.psum_scatter(grads.sum(axis=0), "batch", tiled=True)
        return shard - (lr / batch) * total

    specs = (P("batch"), P("batch"), P("batch"))
    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=P("batch")))


def train(
    devices: int | None = None,
    steps: int = 20,
    reduce: str = "exact",
    batch: int = 256,
    micro_batch: int = 8,
    hidden: int = 37,
    lr: float = 0.05,
) -> dict:
    n = devices or jax.device_count()
    if n > jax.device_count():
        raise SystemExit(f"--devices {n}: JAX has {jax.device_count()} devices here (it was "
                         "imported before XLA_FLAGS could ask for more)")  # fmt: skip
    if batch % (micro_batch * n):
        raise SystemExit(f"--batch {batch} must be a multiple of --micro-batch {micro_batch} "
                         f"times --devices {n}")  # fmt: skip
    mesh = jax.make_mesh((n,), ("batch",), devices=jax.devices()[:n])
    host_x, host_y = data(batch)
    start = init(hidden)
    flat = Flat(start, n)
    with jax.set_mesh(mesh):
        sharded = NamedSharding(mesh, P("batch"))
        x, y = (jax.device_put(a, sharded) for a in (host_x, host_y))
        shard = jax.device_put(flat.flatten(start), sharded)
        step = make_step(mesh, flat, reduce, batch, micro_batch, lr)
        for _ in range(steps):
            shard = step(shard, x, y)
        params = {k: np.asarray(v) for k, v in flat.unflatten(np.asarray(shard)).items()}
    return {
        "devices": n,
        "steps": steps,
        "reduce": reduce,
        "first_loss": mean_loss(start, host_x, host_y),
        "loss": mean_loss(params, host_x, host_y),
        "digest": bitfold.digest(params),
    }


def main() -> None:
    a = ARGS or parse_args()
    out = train(a.devices, a.steps, a.reduce, a.batch, a.micro_batch, a.hidden, a.lr)
    if a.json:
        print(json.dumps(out))
    else:
        devices = f"{out['devices']} device" + ("s" if out["devices"] != 1 else "")
        print(f"{devices}, {out['steps']} steps, {out['reduce']} psum_scatter: loss "
              f"{out['first_loss']:.6f} -> {out['loss']:.6f}, weights {out['digest']}")  # fmt: skip


if __name__ == "__main__":
    main()
