"""Data-parallel training in JAX whose weights are the same bits on 1, 2, 4 or 8 devices.

A small MLP learns a regression with plain SGD. Every step uses one global
batch, cut between the devices of a 1-D mesh by ``jax.shard_map``. Each
device splits its share into micro-batches of a fixed size and takes each
micro-batch's gradient on its own; the step's gradient is the sum of all the
micro-batch gradients of all the devices, which the devices then agree on
with a ``psum``.

With ``--reduce plain`` that sum is ``jnp.sum`` over the device's own
micro-batches, then ``jax.lax.psum`` over the devices: float32 additions whose
grouping follows the device count, so 1, 2, 4 and 8 devices round
differently, and after a few steps the weights differ in their last bits.
With ``--reduce exact`` (the default) it is ``bitfold.jax.psum(grads,
"batch", axis=0)``: the exact real sum over the micro-batches and the
devices, rounded once to float32. A micro-batch's gradient is the same
computation on any device count (which is why the gradients are taken per
micro-batch, not per device share), so the sum, the step and every later
step are the same bits on any device count. The script prints a digest of
the final weights (``bitfold.digest``); compare it between runs:

    python examples/jax_data_parallel.py --devices 1
    python examples/jax_data_parallel.py --devices 8            # same digest
    python examples/jax_data_parallel.py --devices 1 --reduce plain
    python examples/jax_data_parallel.py --devices 8 --reduce plain   # another

``--devices N`` asks XLA for N simulated CPU devices (it sets ``XLA_FLAGS``
before JAX is imported), so this runs on any machine; without it the script
uses every device JAX finds. The global batch must divide into micro-batches
evenly shared between the devices. The exact sum costs bandwidth: each
float32 value travels as several integer words.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--devices", type=int, help="simulate this many CPU devices")
    p.add_argument("--small", action="store_true",
                   help="3 steps, a global batch of 128, 16 hidden units (the tests)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--reduce", choices=("exact", "plain"), default="exact")
    p.add_argument("--batch", type=int, default=256, help="global batch (examples)")
    p.add_argument("--micro-batch", type=int, default=8, help="examples per micro-batch")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args(argv)
    if args.small:
        args.steps, args.batch, args.hidden = 3, 128, 16
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
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import bitfold  # noqa: E402
import bitfold.jax  # noqa: E402


def init(features: int, hidden: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The MLP's float32 weights, from a fixed seed (host arrays)."""
    rng = np.random.default_rng(seed)
    params = {
        "w1": rng.standard_normal((features, hidden)) / np.sqrt(features),
        "b1": np.zeros(hidden),
        "w2": rng.standard_normal((hidden, 1)) / np.sqrt(hidden),
        "b2": np.zeros(1),
    }
    return {k: v.astype(np.float32) for k, v in params.items()}


def data(batch: int, features: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """A fixed global batch of a noisy regression."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, features)).astype(np.float32)
    y = np.sin(x @ rng.standard_normal(features)) + 0.1 * rng.standard_normal(batch)
    return x, y.astype(np.float32)


def loss(params, x, y):
    """Squared error *summed* over the examples, so that batch gradients add up."""
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return jnp.sum(((h @ params["w2"])[:, 0] + params["b2"][0] - y) ** 2)


def make_step(mesh, reduce: str, batch: int, micro: int, lr: float):
    """One SGD step on the global batch, its gradient summed over the mesh's devices."""

    def step(params, x, y):  # x, y: this device's examples
        # Take the gradient with respect to this device's copy of the weights, so that
        # jax.grad adds nothing across devices itself: the psum below is the only sum.
        mine = jax.tree.map(lambda p: jax.lax.pcast(p, "batch", to="varying"), params)
        # One gradient per micro-batch, by the same program whatever the device count, so
        # its bits do not depend on the device count either; only their sum could.
        xs = x.reshape(-1, micro, x.shape[-1])
        ys = y.reshape(-1, micro)
        grads = jax.lax.map(lambda b: jax.grad(loss)(mine, *b), (xs, ys))  # leaves (k, ...)
        if reduce == "exact":
            total = bitfold.jax.psum(grads, "batch", axis=0)
        else:
            total = jax.tree.map(lambda g: jax.lax.psum(g.sum(axis=0), "batch"), grads)
        return jax.tree.map(lambda p, g: p - (lr / batch) * g, params, total)

    return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("batch"), P("batch")),
                                 out_specs=P()))  # fmt: skip


def train(
    devices: int | None = None,
    steps: int = 20,
    reduce: str = "exact",
    batch: int = 256,
    micro_batch: int = 8,
    hidden: int = 64,
    lr: float = 0.05,
) -> dict:
    n = devices or jax.device_count()
    if n > jax.device_count():
        raise SystemExit(
            f"--devices {n}: JAX has {jax.device_count()} devices here (it was "
            "imported before XLA_FLAGS could ask for more)"
        )
    if batch % (micro_batch * n):
        raise SystemExit(
            f"--batch {batch} must be a multiple of --micro-batch {micro_batch} times --devices {n}"
        )
    mesh = jax.make_mesh((n,), ("batch",), devices=jax.devices()[:n])
    x, y = data(batch, features=8)
    params = init(features=8, hidden=hidden)
    with jax.set_mesh(mesh):
        x, y = (jax.device_put(a, NamedSharding(mesh, P("batch"))) for a in (x, y))
        params = jax.device_put(params, NamedSharding(mesh, P()))
        step = make_step(mesh, reduce, batch, micro_batch, lr)
        first_loss = float(loss(params, x, y)) / batch
        for _ in range(steps):
            params = step(params, x, y)
        final_loss = float(loss(params, x, y)) / batch
    params = {k: np.asarray(v) for k, v in params.items()}
    return {
        "devices": n,
        "steps": steps,
        "reduce": reduce,
        "first_loss": first_loss,
        "loss": final_loss,
        "digest": bitfold.digest(params),
    }


def main() -> None:
    a = ARGS or parse_args()
    out = train(a.devices, a.steps, a.reduce, a.batch, a.micro_batch, a.hidden, a.lr)
    if a.json:
        print(json.dumps(out))
    else:
        devices = f"{out['devices']} device" + ("s" if out["devices"] != 1 else "")
        print(
            f"{devices}, {out['steps']} steps, {out['reduce']} psum: loss "
            f"{out['first_loss']:.6f} -> {out['loss']:.6f}, weights {out['digest']}"
        )


if __name__ == "__main__":
    main()
