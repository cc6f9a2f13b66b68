"""``bitfold digest PATH... [--per-tensor] [--json] [--model]``: digests of checkpoints.

What a checkpoint's digest covers, and which formats are read, is
:mod:`bitfold.repro.checkpoint`'s to say; this module prints the digests. By
default a digest covers every tensor in the file (for a checkpoint of
``bitfold train --save``: model, optimiser state, random state); ``--model``
digests the model's state dict alone, the digest ``bitfold train`` reports.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import FoldError
from ..repro.checkpoint import load_torch_file, read_checkpoint

HELP = (
    "print the canonical digest of checkpoints (.npy/.npz, safetensors, PyTorch): of every "
    "tensor in the file, or with --model of the model alone (what `bitfold train` reports)"
)


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``bitfold digest``."""
    parser.add_argument("paths", metavar="PATH", nargs="+", help="checkpoint files")
    parser.add_argument("--per-tensor", action="store_true", help="list each tensor's digest")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--model",
        action="store_true",
        help="for a checkpoint of `bitfold train --save`: the digest of the model's state dict "
        "alone, the one train reports (default: every tensor in the file)",
    )
    parser.epilog = ("exit status: 0 all digested, 2 when any file was refused (each refusal "
                     "is on stderr; with --json also in the file's entry)")


def main(args: argparse.Namespace) -> int:
    """Digest every path; refused files are reported on stderr and give exit status 2."""
    results: list[dict[str, Any]] = []
    failed = 0
    if args.model:
        return _model_digests(args)
    for path in args.paths:
        try:
            info = read_checkpoint(path)
        except FoldError as err:
            failed += 1
            results.append({"path": path, "error": str(err)})
            print(f"bitfold digest: error: {err}", file=sys.stderr)
            continue
        results.append(info.as_dict(per_tensor=args.per_tensor))
        if args.json:
            continue
        kind = "1 array" if info.single else f"{len(info.tensors)} tensors"
        print(f"{info.digest}  {path}" + (f"  ({info.format}, {kind})" if args.per_tensor else ""))
        if args.per_tensor:
            for e in info.tensors:
                shape = ",".join(map(str, e.shape))
                print(f"  {e.digest}  {e.name or '(array)'}  {e.dtype}[{shape}]")
            if info.ignored:
                print(f"  ignored (not tensors): {', '.join(info.ignored)}")
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 2 if failed else 0


def _model_digest(path: str) -> dict[str, Any]:
    """The model digest of one checkpoint of ``bitfold train --save`` (a FoldError otherwise)."""
    from ..repro.digest import digest

    state = load_torch_file(path)
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise FoldError(
            f"{path} is not a checkpoint of `bitfold train --save` (no 'model' state "
            "dict in it); drop --model to digest every tensor in the file"
        )
    return {"path": path, "digest": digest(state["model"]), "covers": "model"}


def _model_digests(args: argparse.Namespace) -> int:
    """``--model``: each training checkpoint's model digest (refusals give exit status 2)."""
    results: list[dict[str, Any]] = []
    failed = 0
    for path in args.paths:
        try:
            results.append(_model_digest(path))
        except FoldError as err:
            failed += 1
            results.append({"path": path, "error": str(err)})
            print(f"bitfold digest: error: {err}", file=sys.stderr)
            continue
        if not args.json:
            print(f"{results[-1]['digest']}  {path}  (model)")
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 2 if failed else 0
