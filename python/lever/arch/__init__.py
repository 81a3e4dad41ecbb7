"""The architectures Lever runs, one module per family.

Each family module maps its GGUF metadata keys and tensor names onto the one
block description, `lever.model_config.ModelConfig`: it returns a `Family`
(`base.py`).  `FAMILIES` is the registry; `family(name)` looks one up and
refuses, in one line, an architecture Lever does not run (naming what it
lacks where we know, `refused.py`).  Nothing here reads files: the GGUF
reader hands a family the metadata through a `base.Meta`.

To add an architecture: docs/adding-a-model.md.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from ..model_config import SUPPORTED_ARCHS
from . import gemma3, llama, phi3, qwen2, qwen3, smollm3
from .base import Family, Meta, TensorPart  # noqa: F401 (re-exported)
from .refused import why_not

FAMILIES: dict[str, Family] = {f.name: f for f in (llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY, gemma3.FAMILY,
                                                   phi3.FAMILY, smollm3.FAMILY)}
assert tuple(FAMILIES) == SUPPORTED_ARCHS, "model_config.SUPPORTED_ARCHS must list the registered families"


def family(name: str, source: str) -> Family:
    """The registered family `name`, or UnsupportedModelError naming `source`,
    the architecture and, where known, the feature Lever lacks for it."""
    if name in FAMILIES:
        return FAMILIES[name]
    reason = why_not(name)
    raise UnsupportedModelError(f"{source}: unsupported architecture {name!r}"
                                + (f": {reason}" if reason else "")
                                + f" (supported: {', '.join(FAMILIES)})")
