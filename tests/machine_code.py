"""Reading GPU machine code without a GPU: find ``nvdisasm``, list a cubin's SASS opcodes.

Shared by the tests that build kernels for compute capability 9.0 and read
what the hardware would execute (``test_cuda_compile``, ``test_triton_compile``).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path


def nvdisasm() -> str | None:
    """``nvdisasm``: the wheel's, else on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin."""
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec else []:
        for found in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(found)
    on_path = shutil.which("nvdisasm")
    if on_path:
        return on_path
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")] + ["/usr/local/cuda"]
    for home in filter(None, homes):
        found = Path(home) / "bin" / "nvdisasm"
        if found.is_file() and os.access(found, os.X_OK):
            return str(found)
    return None


#: One instruction of ``nvdisasm -c``: its address (4 hex digits and more past 64 KiB), an
#: optional predicate, the opcode with its modifiers.
_OPCODE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


def sass_opcodes(cubin: bytes, tmp_path: Path, tool: str | None = None) -> list[str]:
    """The opcodes (with modifiers) of an sm_90 cubin's machine code, in order."""
    tool = tool or nvdisasm()
    assert tool, (
        "nvdisasm missing (looked in the nvidia-cuda-nvdisasm wheel, on PATH, in $CUDA_HOME/bin "
        "and /usr/local/cuda/bin): pip install nvidia-cuda-nvdisasm (in the cuda extra)"
    )
    path = tmp_path / "kernel.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run([tool, "-c", str(path)], capture_output=True, text=True, check=True)
    ops = _OPCODE.findall(sass.stdout)
    assert ops, f"no instructions read from nvdisasm's output:\n{sass.stdout[:2000]}"
    return ops
