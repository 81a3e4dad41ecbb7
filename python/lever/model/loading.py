"""Loading a model that runs in this process: the one entry point.

    model, gguf = load_model(path, dtype="bfloat16", kernels="native")

The model speaks the numpy model protocol every run-path caller uses:

    model.config                                   # lever.model_config.ModelConfig
    model.new_cache(capacity) -> cache             # .length .capacity .nbytes .truncate .compact .reserve
    model.forward(tokens int64 [T], positions int64 [T], mask bool [T, cache.length + T], cache,
                  logits_rows int64 [R] | None = None, head="logits" | "argmax") -> numpy
    model(...) == model.forward(...)

head "logits": float32 [R, vocab]; head "argmax": int64 [R], each row's first
maximum, without a [R, vocab] array.  A forward appends the T rows to the
cache and commits them.

kernels "native": a GGUF file on the native decoder (lever.model.native_loader;
no torch).  kernels "torch": the torch reference with every weight
dequantised to `dtype` and torch matmul (lever.reference.torch_model; needs
the torch extra).  A Hugging Face checkpoint directory always loads on the
torch reference.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import LeverError, ModelFormatError
from ..values import dtype_name
from ..reference.torch_model import load_checkpoint_torch, load_gguf_torch

KERNELS = ("native", "torch")


def load_model(path: str | os.PathLike, dtype="bfloat16", kernels: str = "native", head_type: str = "stored",
               parsed=None):
    """(model, parsed GGUFFile or None for a checkpoint directory) for the model
    file or directory at `path`.  dtype: "bfloat16" or "float32" (aliases as in
    lever.values.dtype_name): the KV cache's element type on the native
    decoder, the compute dtype on the torch reference.  head_type "q4_0":
    the output head re-quantised to Q4_0 (native kernels and a GGUF file only;
    lever.model.native_loader.ResidentWeights).  parsed: the GGUFFile of
    `path` when the caller has already parsed its header (native kernels)."""
    if kernels not in KERNELS:
        raise LeverError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    if head_type != "stored" and (kernels != "native" or Path(path).is_dir()):
        raise LeverError(f"a {head_type} head needs the native kernels and a GGUF file, "
                         f"not {'a checkpoint directory' if Path(path).is_dir() else 'kernels ' + kernels}")
    dtype = dtype_name(dtype)
    path = Path(path)
    if path.is_dir():
        return load_checkpoint_torch(path, dtype), None
    if not path.is_file():
        raise ModelFormatError(f"{path}: not a file or directory")
    if kernels == "torch":
        return load_gguf_torch(path, dtype, quantized=False)
    from .native_loader import load_gguf_native
    return load_gguf_native(parsed if parsed is not None else path, dtype, head_type)
