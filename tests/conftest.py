"""Shared test set-up: the oracle on the path, hypothesis profiles."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "default")


@pytest.fixture(autouse=True)
def _jax_in_its_default_mode():
    """Every test starts with JAX (when loaded) in its default 32-bit mode, and leaves it so:
    a test that turns ``jax_enable_x64`` on (the bench's float64 contender does) must not
    change what later tests of the same process see."""
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", False)
    yield
    jax = sys.modules.get("jax")
    if jax is not None:
        jax.config.update("jax_enable_x64", False)
