"""``import bitfold`` loads no tool; the tools' names on the root load on first use.

The tools are ``bitfold.cli`` (one module per command, ``bench/`` a package)
and ``bitfold.repro`` (digests, checkpoints, manifests, the fingerprint). Where
they sit in the import graph is checked in ``tests/test_layers.py``.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import bitfold


def test_import_bitfold_loads_no_tool_and_no_argparse():
    code = (
        "import sys, bitfold; "
        "print(' '.join(sorted(m for m in sys.modules if m == 'argparse' "
        "or m.startswith(('bitfold.cli', 'bitfold.repro')))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_tool_names_of_the_root_load_on_first_use():
    code = (
        "import sys, bitfold; from bitfold import digest; "
        "import bitfold.repro.digest as d, bitfold.repro.manifest as m; "
        "assert digest is d.digest and bitfold.bits_equal is d.bits_equal; "
        "assert bitfold.record is m.record and 'record' in dir(bitfold); "
        "assert 'argparse' not in sys.modules; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        bitfold.nonesuch  # noqa: B018
