"""Log every Numba compile of every Python process started with this folder on ``PYTHONPATH``.

    PYTHONPATH=$PWD/benchmarks/numba_census NUMBA_CENSUS_LOG=/tmp/census.jsonl make test
    python benchmarks/numba_census/census_summary.py /tmp/census.jsonl

Both paths absolute: the processes a run starts may work in other folders.

Each process appends, at exit, one JSON line per signature its dispatchers
took: the function, the signature, whether Numba compiled it (a cache miss)
or loaded it from its cache (a signature it already held is not logged), the
CPU seconds of this process it took, and how deep it was nested in another
compile (a kernel's callees compile inside its own compile: only depth 0 adds
up to the process's compile time). A
``sitecustomize`` of the interpreter's own (some distributions ship one) is
shadowed while this folder is on the path: use it for measurements only.
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import json
import os
import sys
import threading
import time

_LOG = os.environ.get("NUMBA_CENSUS_LOG", "numba_census.jsonl")
_rows: list[dict] = []
_depth = threading.local()


def _instrument(dispatcher_module) -> None:
    compile_ = dispatcher_module.Dispatcher.compile

    def compile(self, sig):
        misses, hits = sum(self._cache_misses.values()), sum(self._cache_hits.values())
        depth = getattr(_depth, "n", 0)
        _depth.n = depth + 1
        start = time.process_time()
        try:
            return compile_(self, sig)
        finally:
            _depth.n = depth
            compiled = sum(self._cache_misses.values()) > misses
            # a signature this dispatcher already held is neither compiled nor loaded: not logged
            if compiled or sum(self._cache_hits.values()) > hits:
                _log(self.py_func, sig, compiled, depth, time.process_time() - start)

    dispatcher_module.Dispatcher.compile = compile


def _log(func, sig, compiled: bool, depth: int, cpu_s: float) -> None:
    _rows.append({
        "pid": os.getpid(), "process": " ".join(sys.argv)[:160],
        "function": f"{func.__module__}.{func.__qualname__}", "signature": str(sig),
        "compiled": compiled, "depth": depth, "cpu_s": round(cpu_s, 4),
    })  # fmt: skip


class _WhenNumbaLoads(importlib.abc.MetaPathFinder):
    """Instrument ``numba.core.dispatcher`` as it is imported (nothing else is imported early)."""

    def find_spec(self, name, path, target=None):
        if name != "numba.core.dispatcher":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def load(module):
            exec_module(module)
            _instrument(module)

        spec.loader.exec_module = load
        return spec


sys.meta_path.insert(0, _WhenNumbaLoads())


@atexit.register
def _write() -> None:
    if _rows:
        with open(_LOG, "a") as log:
            log.writelines(json.dumps(row) + "\n" for row in _rows)
