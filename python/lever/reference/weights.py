"""Turn a stream of named tensors into a `Decoder` without a second copy.

The model is built on the meta device and each tensor is assigned as it
arrives, so peak memory is the finished model plus one tensor in flight.
A weight may arrive as a `QuantTensor` (ggml blocks): its `Linear` /
`Embedding` then keeps it quantised for the native kernels.
"""

from __future__ import annotations

from typing import Iterable

import torch

from ..errors import ModelFormatError
from ..model_config import ModelConfig
from ..values import dtype_name
from .decoder import Decoder
from .linear import QuantTensor


def build_decoder(cfg: ModelConfig, named_tensors: Iterable[tuple[str, torch.Tensor | QuantTensor]],
                  dtype: torch.dtype, source: str = "model") -> Decoder:
    """Assemble a Decoder from (name, tensor) pairs in Decoder parameter names;
    `dtype` is the compute dtype of dense weights and activations."""
    with torch.device("meta"):
        model = Decoder(cfg)
    model.compute_dtype = dtype
    expected = dict(model.named_parameters())
    seen = set()
    for name, tensor in named_tensors:
        if name not in expected:
            raise ModelFormatError(f"{source}: unexpected tensor {name!r}")
        param = expected[name]
        if tuple(tensor.shape) != tuple(param.shape):
            raise ModelFormatError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                                   f"expected {tuple(param.shape)}")
        if isinstance(tensor, QuantTensor):
            _module_of(model, name).set_quantized(tensor)
        else:
            _assign(model, name, tensor.to(dtype))
        seen.add(name)
    if any(isinstance(m.qweight, QuantTensor) for m in model.modules() if hasattr(m, "qweight")):
        model.torch_threads = 1     # native kernels do the matrix work (see threads.py)
    missing = sorted(set(expected) - seen)
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise ModelFormatError(f"{source}: missing tensors {', '.join(missing[:3])}{more}")
    return model.eval()


def _module_of(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """The module that owns parameter `name` ("layers.0.mlp.up_proj.weight")."""
    module = model
    for part in name.split(".")[:-1]:
        module = getattr(module, part)
    return module


def _assign(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    setattr(_module_of(model, name), name.rsplit(".", 1)[-1], torch.nn.Parameter(tensor, requires_grad=False))


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bf16' / 'bfloat16' / 'fp32' / 'float32' (or a torch dtype) -> torch dtype
    (see lever.values.dtype_name; anything else raises ValueError)."""
    return getattr(torch, dtype_name(name))
