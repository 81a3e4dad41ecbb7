"""Turn a stream of named tensors into a `Decoder` without a second copy.

The model is built on the meta device and each tensor is assigned as it
arrives, so peak memory is the finished model plus one tensor in flight.
"""

from __future__ import annotations

from typing import Iterable

import torch

from ..errors import ModelFormatError
from .config import ModelConfig
from .decoder import Decoder


def build_decoder(cfg: ModelConfig, named_tensors: Iterable[tuple[str, torch.Tensor]],
                  dtype: torch.dtype, source: str = "model") -> Decoder:
    """Assemble a Decoder from (name, tensor) pairs in Decoder parameter names."""
    with torch.device("meta"):
        model = Decoder(cfg)
    expected = dict(model.named_parameters())
    seen = set()
    for name, tensor in named_tensors:
        if name not in expected:
            raise ModelFormatError(f"{source}: unexpected tensor {name!r}")
        param = expected[name]
        if tuple(tensor.shape) != tuple(param.shape):
            raise ModelFormatError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                                   f"expected {tuple(param.shape)}")
        _assign(model, name, tensor.to(dtype))
        seen.add(name)
    missing = sorted(set(expected) - seen)
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ModelFormatError(f"{source}: missing tensors {', '.join(missing[:3])}{more}")
    return model.eval()


def _assign(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    *path, leaf = name.split(".")
    module = model
    for part in path:
        module = getattr(module, part)
    setattr(module, leaf, torch.nn.Parameter(tensor, requires_grad=False))


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bf16' / 'bfloat16' / 'fp32' / 'float32' (or a torch dtype) -> torch dtype."""
    if isinstance(name, torch.dtype):
        if name in (torch.float32, torch.bfloat16):
            return name
        raise ValueError(f"unsupported compute dtype {name} (use float32 or bfloat16)")
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported compute dtype {name!r} (use float32 or bfloat16)") from None
