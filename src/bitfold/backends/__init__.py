"""Backends: one module per place values can live, each with one implementation per strategy.

``host`` serves NumPy arrays, CPU tensors and CPU JAX arrays with the Numba
CPU kernels; ``cuda`` serves GPU arrays with the numba-cuda kernels (loaded
only when GPU values arrive). :mod:`bitfold.dispatch` picks the backend from
where the values live.
"""
