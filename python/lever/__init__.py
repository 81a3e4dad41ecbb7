"""Lever: speculative LLM inference for devices whose DRAM cannot hold the model."""

from .values import __version__  # noqa: F401 (the one version string; lever.values)


def load(*args, **kwargs):
    """See `lever.api.load`."""
    from .api import load as _load
    return _load(*args, **kwargs)


def generate(*args, **kwargs):
    """See `lever.api.generate`."""
    from .api import generate as _generate
    return _generate(*args, **kwargs)
