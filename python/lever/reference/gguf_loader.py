"""Load any registered family's decoder (lever.arch) from a GGUF file into the torch reference.

Hyperparameters come from the metadata (`gguf_config`, torch-free).  By default every matrix whose type
has a native matmul kernel (Q4_K, Q6_K, Q8_0, Q5_0, Q4_0) stays quantised in
memory, copied out of the file as its blocks; other tensors (norms, biases,
types without a kernel, and all weights with `quantized=False`) are
dequantised one at a time by the native core straight into the compute dtype.  llama.cpp stores the
q/k projections of *llama* models with rows permuted for its interleaved RoPE;
`gguf_config.qk_row_order` undoes that so the rotate-half RoPE of `decoder.py`
applies.  The torch reference: imported only through lever.reference.torch_model.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

from .. import quant
from ..errors import UnsupportedModelError
from ..gguf.config import config_from_gguf, decoder_name, layer_parts, part_info, part_row_order
from ..gguf.file import GGUFFile
from ..gguf.finite import check_finite
from ..model_config import ModelConfig
from .decoder import Decoder
from .linear import QuantTensor, dequantize_tensor, has_kernel
from .weights import build_decoder, parse_dtype


def gguf_tensors(g: GGUFFile, cfg: ModelConfig, dtype: torch.dtype,
                 quantized: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantTensor]]:
    """(decoder name, tensor in `dtype` or QuantTensor) for every weight in the file, one at a time."""
    named = [(decoder_name(n), g.tensors[n], None) for n in g.tensors if decoder_name(n)]
    parts = layer_parts(cfg, g)
    named += [(f"layers.{i}.{p.name}", part_info(g, i, p), p) for i in range(cfg.n_layers) for p in parts]
    for name, info, part in named:
        if not quant.is_supported(info.qtype):
            raise UnsupportedModelError(f"{g.path.name}: tensor {info.name!r} uses quantisation type "
                                        f"{info.type_name}, which Lever cannot dequantise")
        raw = g.raw(info.name)
        if part is not None and part.rows is not None:
            row_bytes = raw.nbytes // g.tensors[info.name].shape[0]
            raw = raw[part.rows[0] * row_bytes:part.rows[1] * row_bytes]
        check_finite(g.path, info.name, raw, info.qtype)      # lever.gguf.finite
        order = part_row_order(part, info.shape[0]) if part is not None else None
        if quantized and len(info.shape) == 2 and has_kernel(info.qtype):
            w = QuantTensor(np.array(raw), info.qtype, tuple(info.shape))
            yield name, w.permute_rows(order) if order is not None else w
            continue
        w = dequantize_tensor(raw, info.qtype, info.shape, dtype)
        yield name, w[torch.from_numpy(order)] if order is not None else w


def load_gguf_model(path, dtype: str | torch.dtype = torch.bfloat16,
                    quantized: bool = True) -> tuple[Decoder, GGUFFile]:
    """Read a GGUF file into a Decoder computing in `dtype`; also returns the
    parsed file (metadata).  quantized=False dequantises every weight into a
    dense torch tensor (the torch matmul path)."""
    dtype = parse_dtype(dtype)
    g = GGUFFile(path)
    cfg = config_from_gguf(g)
    model = build_decoder(cfg, gguf_tensors(g, cfg, dtype, quantized), dtype, source=g.path.name)
    return model, g
