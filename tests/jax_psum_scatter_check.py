"""Run ``bitfold.jax.psum_scatter`` on simulated CPU devices; print each case's bits as JSON.

Run as a subprocess (XLA reads its device count once, at start-up):

    python tests/jax_psum_scatter_check.py DEVICES [--meshes 1,2,...] [--x64]

``DEVICES`` CPU devices (``--xla_force_host_platform_device_count``); ``--meshes``
runs every case on a mesh of each of those sizes (the first devices; default: one
mesh of every device), and the printed JSON maps each mesh size to its cases. Each
case's terms are cut between the devices along their first axis (cases in
``tests/psum_scatter_cases.py``); every device's piece of the sum is put
back together (``out_specs`` along the scattered dimension) and printed as
hex bit patterns, for the parent test to compare with the Fraction oracle
and across device counts. ``name:pmap`` repeats a case under ``jax.pmap``,
``name:grad`` gives its gradient.
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
    return p.parse_args()


ARGS = _args()
sys.path.insert(0, os.path.dirname(__file__))
from mesh_runs import bits_on_meshes, xla_flags  # noqa: E402

os.environ["XLA_FLAGS"] = xla_flags(ARGS.devices)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

if ARGS.x64:
    jax.config.update("jax_enable_x64", True)

from psum_scatter_cases import CASES, global_terms, weights  # noqa: E402

import bitfold.jax as bj  # noqa: E402


def main() -> None:
    runs = bits_on_meshes(CASES, _run_case, ARGS.meshes, ARGS.x64)
    print(json.dumps(runs))


def _terms(name: str, case: Any, n: int) -> np.ndarray:
    terms = global_terms(name)
    if not case.local:
        terms = terms[:n]  # one row a device
    if not case.tiled:  # the scattered dimension has one slice a device
        terms = np.take(terms, np.arange(n), axis=1 + case.scatter)
    return terms


def _run_case(name: str, case: Any, mesh: Any, n: int) -> dict[str, list[str]]:
    """One case's bits (under jit(shard_map) and pmap), and its gradient's if it has one."""
    terms = _terms(name, case, n)
    sd, tiled = case.scatter, case.tiled

    def body(t: Any) -> Any:
        if case.local:
            piece = bj.psum_scatter(t, "i", scatter_dimension=sd, tiled=tiled, axis=0)
        else:
            piece = bj.psum_scatter(t[0], "i", scatter_dimension=sd, tiled=tiled)
        return piece if tiled else jnp.expand_dims(piece, sd)  # put back together below

    spec = P(*([None] * sd), "i")
    x = jax.make_array_from_callback(terms.shape, NamedSharding(mesh, P("i")),
                                     lambda i: jnp.asarray(terms[i]))  # fmt: skip
    out = {}
    with jax.set_mesh(mesh):
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=spec))
        out[name] = _hex(np.asarray(f(x)))
        if case.grad:
            w = jnp.asarray(weights(terms.shape[1:]))
            g = jax.grad(lambda t: (f(t).astype(jnp.float32) * w).sum())(x)
            out[name + ":grad"] = _hex(np.asarray(g))
    if case.local and name in ("float32", "float32-x64"):
        local = terms.reshape(n, terms.shape[0] // n, *terms.shape[1:])
        pieces = jax.pmap(body, axis_name="i")(jnp.asarray(local))  # (n, piece...)
        out[name + ":pmap"] = _hex(np.concatenate(list(np.asarray(pieces)), axis=sd))
    return out


def _hex(a: np.ndarray) -> list[str]:
    a = np.ascontiguousarray(a)
    bits = a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])
    return [format(int(b), "x") for b in bits.reshape(-1)]


if __name__ == "__main__":
    main()
