"""The torch reference decoder behind the numpy model protocol.

`lever.reference.decoder.Decoder` is the plain-torch reference implementation
(tests, Hugging Face checkpoints, `--kernels torch`).  `TorchModel` wraps it
to the protocol every run-path caller speaks (see lever.model.loading):

    model.forward(tokens int64 [T], positions int64 [T], mask bool [T, L + T], cache,
                  logits_rows int64 [R] | None = None, head="logits" | "argmax" | "topk",
                  topk=K) -> numpy

converting numpy <-> torch at the edge.  head="argmax" is the first index
of each logits row's maximum (int64 [R]); head="topk" is (ids int64 [R, K],
logprobs float32 [R, K]) as lever.topk_head defines it; the reference
makes the logits anyway.  Its KV cache (lever.reference.kv_cache.KVCache) already has the
protocol's length / capacity / nbytes / truncate / compact / reserve.

torch is an optional extra: this module imports it only inside its
functions, after `require_torch` has named the extra to install.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import LeverError
from ..extras import install_hint
from ..gguf.file import GGUFFile
from ..model_config import ModelConfig
from ..values import dtype_name
from ..topk_head import check_topk, topk_of_logits

HEADS = ("logits", "argmax", "topk")


def require_torch(what: str):
    """The torch module, or a LeverError saying that `what` needs the torch extra."""
    try:
        import torch
    except ImportError:
        raise LeverError(f"torch is needed for {what}: {install_hint('torch')}") from None
    return torch


def torch_dtype(dtype, what: str = "the torch reference decoder (--kernels torch)"):
    """torch.float32 / torch.bfloat16 for a dtype name (or a torch dtype);
    `what` names the feature in the error raised without torch."""
    torch = require_torch(what)
    return getattr(torch, dtype_name(dtype))


class TorchModel:
    """A torch `Decoder` speaking the numpy model protocol."""

    def __init__(self, decoder):
        self.decoder = decoder
        self.config: ModelConfig = decoder.config

    @property
    def dtype(self) -> str:
        """"float32" or "bfloat16": the decoder's activation and KV cache dtype."""
        return dtype_name(self.decoder.dtype)

    @property
    def stage_times(self) -> list | None:
        """The profiler's hook (see Decoder.stage_times)."""
        return self.decoder.stage_times

    @stage_times.setter
    def stage_times(self, value: list | None) -> None:
        self.decoder.stage_times = value

    @property
    def resident_weight_bytes(self) -> int:
        """Bytes of weights held in memory (dense parameters + quantised blocks)."""
        from .linear import resident_bytes
        return resident_bytes(self.decoder)

    def new_cache(self, capacity: int = 256):
        return self.decoder.new_cache(capacity=capacity)

    def forward(self, tokens: np.ndarray, positions: np.ndarray, mask: np.ndarray, cache,
                logits_rows: np.ndarray | None = None, head: str = "logits", topk: int | None = None):
        """Run T new tokens and append them to `cache` (committed).  Returns
        float32 logits [R, vocab] (head "logits"), int64 argmax ids [R]
        (head "argmax") or (ids int64 [R, K], logprobs float32 [R, K]) (head
        "topk", topk=K); R = len(logits_rows), or T."""
        import torch

        if head not in HEADS:
            raise ValueError(f"head must be one of {', '.join(HEADS)}, got {head!r}")
        n_top = check_topk(topk, self.config.vocab_size) if head == "topk" else 0
        rows = None if logits_rows is None else torch.from_numpy(np.asarray(logits_rows, dtype=np.int64))
        logits = self.decoder(torch.from_numpy(np.asarray(tokens, dtype=np.int64)),
                              torch.from_numpy(np.asarray(positions, dtype=np.int64)),
                              torch.from_numpy(np.ascontiguousarray(mask, dtype=bool)), cache,
                              logits_rows=rows).numpy()
        if head == "topk":
            return topk_of_logits(logits, n_top)
        return np.argmax(logits, axis=-1).astype(np.int64) if head == "argmax" else logits

    __call__ = forward


def load_gguf_torch(path, dtype="bfloat16", quantized: bool = True) -> tuple[TorchModel, GGUFFile]:
    """lever.reference.gguf_loader.load_gguf_model (a torch Decoder computing in
    `dtype`; quantized: matrices with a native kernel stay quantised, False
    dequantises every weight -- the torch matmul path) wrapped to the numpy
    protocol; also returns the parsed file."""
    dtype = torch_dtype(dtype)
    from .gguf_loader import load_gguf_model
    model, g = load_gguf_model(path, dtype, quantized)
    return TorchModel(model), g


def load_checkpoint_torch(directory: Path, dtype="bfloat16") -> TorchModel:
    """A Hugging Face checkpoint directory (config.json + *.safetensors) as a TorchModel."""
    dtype = torch_dtype(dtype, "Hugging Face checkpoints")
    from .checkpoint_loader import load_checkpoint_model
    return TorchModel(load_checkpoint_model(directory, dtype))
