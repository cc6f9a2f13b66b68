"""Reproducibility tools built on the engine: digests, checkpoint readers, run manifests and the
environment fingerprint. Nothing here imports :mod:`bitfold.cli`."""
