"""Lever: speculative LLM inference for devices whose DRAM cannot hold the model."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# The native dequantisation pool and torch's OpenMP threads share the cores;
# OpenMP's default spin-waiting after every torch op steals them from the pool
# (measured: streamed dequantisation 1.4x slower). Ask OpenMP to sleep instead,
# unless the user chose a policy or torch (and its OpenMP runtime) is already up.
if "torch" not in _sys.modules:
    _os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def load(*args, **kwargs):
    """See `lever.api.load`."""
    from .api import load as _load
    return _load(*args, **kwargs)


def generate(*args, **kwargs):
    """See `lever.api.generate`."""
    from .api import generate as _generate
    return _generate(*args, **kwargs)
