"""Process settings around PyTorch that bitfold's commands share (no torch import here).

* :func:`passive_openmp_before_torch`: PyTorch's wheel carries its own OpenMP
  runtime, whose idle workers spin after every operation and take the cores
  from bitfold's Numba kernels; ``OMP_WAIT_POLICY=PASSIVE`` puts them to
  sleep instead. It changes timings only, never results, and must be set
  before torch is imported; a value the user set is kept.
* :func:`deterministic_algorithms`: ``torch.use_deterministic_algorithms`` for
  one block, then the previous setting.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def passive_openmp_before_torch() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the user chose, if torch is not loaded yet."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@contextmanager
def deterministic_algorithms(torch: Any, enabled: bool = True) -> Iterator[None]:
    """``torch.use_deterministic_algorithms(enabled)`` for the block, then the previous setting."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(enabled)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
