"""Run ``bitfold.jax.psum`` on simulated CPU devices and print each case's result bits as JSON.

Run as a subprocess (XLA reads its device count once, at start-up):

    python tests/jax_psum_check.py DEVICES [--meshes 1,2,...] [--x64]
                                   [--process I --processes P --port N]

``DEVICES`` CPU devices in this process (``--xla_force_host_platform_device_count``);
``--meshes`` runs every case on a mesh of each of those sizes (the first devices;
default: one mesh of every device), one process for several device counts. With
``--processes`` the processes join one ``jax.distributed`` group over
JAX's CPU collectives (gloo) and the mesh spans all their devices. Every
case's terms are the same whatever the device and process counts: the
global array is cut between the devices along its first axis. The printed
JSON maps each mesh size to a map of case name to the hex bit patterns of the
result (process 0's copy), for the parent test to compare with the Fraction oracle and across
device counts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("devices", type=int)
    p.add_argument("--meshes", type=lambda s: [int(n) for n in s.split(",")], default=None)
    p.add_argument("--x64", action="store_true")
    p.add_argument("--process", type=int, default=0)
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--port", type=int, default=0)
    return p.parse_args()


ARGS = _args()
sys.path.insert(0, os.path.dirname(__file__))
from mesh_runs import bits_on_meshes, xla_flags  # noqa: E402

os.environ["XLA_FLAGS"] = xla_flags(ARGS.devices)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental.multihost_utils import process_allgather  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if ARGS.x64:
    jax.config.update("jax_enable_x64", True)
if ARGS.processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{ARGS.port}",
        num_processes=ARGS.processes,
        process_id=ARGS.process,
    )

from psum_cases import CASES, global_terms  # noqa: E402

import bitfold.jax as bj  # noqa: E402


def main() -> None:
    runs = bits_on_meshes(CASES, _run_case, ARGS.meshes, ARGS.x64)
    if ARGS.process == 0:
        print(json.dumps(runs))


def _run_case(name: str, case: Any, mesh: Any, n: int) -> dict[str, list[str]]:
    """One case's result bits (and its gradient's, if the case has one)."""
    terms = global_terms(name)  # (rows, ...) cut along rows between the devices
    if not case.local_axis:
        terms = terms[:n]  # one row a device
    sharding = NamedSharding(mesh, P("i"))
    x = jax.make_array_from_callback(terms.shape, sharding, lambda i: jnp.asarray(terms[i]))
    if case.local_axis:
        body = lambda t: bj.psum(t, "i", axis=0)  # noqa: E731
    else:
        body = lambda t: bj.psum(t[0], "i")  # noqa: E731
    out = {}
    with jax.set_mesh(mesh):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P()))
        out[name] = _hex(np.asarray(f(x)))
        if case.grad:
            w = jnp.linspace(0.1, 3.7, terms.shape[1], dtype=jnp.float32)
            g = jax.grad(lambda t: (f(t).astype(jnp.float32) * w).sum())(x)
            out[name + ":grad"] = _hex(np.asarray(process_allgather(g, tiled=True)))
    return out


def _hex(a: np.ndarray) -> list[str]:
    a = np.ascontiguousarray(a)
    bits = a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])
    return [format(int(b), "x") for b in bits.reshape(-1)]


if __name__ == "__main__":
    main()
