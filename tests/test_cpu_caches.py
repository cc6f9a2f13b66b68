"""The last-level cache size read from sysfs, as the host's routes for rows use it."""

from __future__ import annotations

import pytest

from bitfold.backends import cpu_caches


@pytest.mark.parametrize("text, size", [("491520K\n", 491520 << 10), ("2M", 2 << 20),
                                        ("65536", 65536), ("1G", 1 << 30)])  # fmt: skip
def test_sizes_as_sysfs_writes_them(text, size):
    assert cpu_caches.parse_size(text) == size


def _cache(root, name, level, kind, size):
    entry = root / name
    entry.mkdir()
    (entry / "level").write_text(f"{level}\n")
    (entry / "type").write_text(f"{kind}\n")
    (entry / "size").write_text(f"{size}\n")


def test_largest_data_or_unified_cache(tmp_path, monkeypatch):
    _cache(tmp_path, "index0", 1, "Data", "48K")
    _cache(tmp_path, "index1", 1, "Instruction", "64M")  # never the answer
    _cache(tmp_path, "index2", 2, "Unified", "2048K")
    _cache(tmp_path, "index3", 3, "Unified", "32M")
    (tmp_path / "index4").mkdir()  # unreadable: skipped
    monkeypatch.setattr(cpu_caches, "SYSFS_CACHES", tmp_path)
    cpu_caches.last_level_cache_bytes.cache_clear()
    try:
        assert cpu_caches.last_level_cache_bytes() == 32 << 20
    finally:
        cpu_caches.last_level_cache_bytes.cache_clear()


def test_no_sysfs_reports_no_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_caches, "SYSFS_CACHES", tmp_path / "missing")
    cpu_caches.last_level_cache_bytes.cache_clear()
    try:
        assert cpu_caches.last_level_cache_bytes() == 0
    finally:
        cpu_caches.last_level_cache_bytes.cache_clear()
