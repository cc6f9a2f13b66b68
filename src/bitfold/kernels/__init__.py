"""Compiled kernels. ``cpu`` holds the Numba CPU kernels; GPU kernels live beside it.

Kernels know nothing about frameworks or plans: they take flat NumPy arrays.
"""
