"""The CPU's caches as the operating system reports them, read once a process.

The host's routes for rows choose between gathering each bucket's rows and
reading them in position order by whether the rows fit in the last-level
cache. Every route gives the same bits, so what is read here changes speed
only, never a result.
"""

from __future__ import annotations

import functools
from pathlib import Path

#: Where Linux lists the caches of CPU 0, one ``index*`` folder a cache.
SYSFS_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")

_SCALES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes of a size as sysfs writes it: ``"491520K"``, ``"2M"``, ``"65536"``."""
    text = text.strip().upper()
    scale = _SCALES.get(text[-1:], 1)
    return int(text[:-1] if scale != 1 else text) * scale


@functools.cache
def last_level_cache_bytes() -> int:
    """The size in bytes of the largest data or unified cache CPU 0 reports, 0 when the
    operating system reports none (not Linux, or no ``sysfs``)."""
    largest = 0
    for entry in SYSFS_CACHES.glob("index*"):
        try:
            if (entry / "type").read_text().strip() == "Instruction":
                continue
            largest = max(largest, parse_size((entry / "size").read_text()))
        except (OSError, ValueError):
            continue
    return largest


__all__ = ["SYSFS_CACHES", "last_level_cache_bytes", "parse_size"]
