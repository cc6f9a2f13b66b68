"""``bitfold digest PATH... [--per-tensor] [--json]``: the canonical digest of checkpoints.

What a checkpoint's digest covers, and which formats are read, is
:mod:`bitfold.repro.checkpoint`'s to say; this module prints the digests.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import FoldError
from ..repro.checkpoint import read_checkpoint

HELP = "print the canonical digest of checkpoints (.npy/.npz, safetensors, PyTorch)"


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``bitfold digest``."""
    parser.add_argument("paths", metavar="PATH", nargs="+", help="checkpoint files")
    parser.add_argument("--per-tensor", action="store_true", help="list each tensor's digest")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.epilog = "exit status: 0 all digested, 2 when any file was refused"


def main(args: argparse.Namespace) -> int:
    """Digest every path; refused files are reported on stderr and give exit status 2."""
    results: list[dict[str, Any]] = []
    failed = 0
    for path in args.paths:
        try:
            info = read_checkpoint(path)
        except FoldError as err:
            failed += 1
            results.append({"path": path, "error": str(err)})
            if not args.json:
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
