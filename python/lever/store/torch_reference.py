"""The torch resident reference of a flash store (tests, benchmarks): the
whole store read into an in-memory `lever.model.decoder.Decoder`.

Kept apart from `streamed.py` so that the streamed (native) path never imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..model.decoder import Decoder
from ..model.linear import QuantTensor, dequantize_tensor, has_kernel
from ..model.weights import build_decoder, parse_dtype
from .flash_reader import FlashReader, aligned_empty
from .manifest import WEIGHTS, Extent, StoreManifest

_ALIGN = 4096


def load_store_model(store_dir: str | os.PathLike, dtype: str | torch.dtype = torch.bfloat16,
                     backend: str = "auto", quantized: bool = False) -> Decoder:
    """The whole store read into an in-memory `Decoder` (the resident reference)
    computing in `dtype` ("bfloat16", "float32" or the torch dtype): dequantised,
    or with `quantized` its kernel-ready matrices kept as blocks."""
    dtype = parse_dtype(dtype)
    m = StoreManifest.load(store_dir)
    reader = FlashReader(Path(store_dir) / WEIGHTS, slot_bytes=_ALIGN, n_slots=1, backend=backend,
                         chunk_bytes=m.chunk_bytes)
    try:
        def read(e: Extent) -> np.ndarray:
            buf = aligned_empty(e.length)
            reader.read(e.offset, e.length, buf, list(e.chunk_crc32c), e.name)
            return buf

        def matrix(parts: list[Extent]):
            """One matrix stored as row groups (head / embedding parts)."""
            t = parts[0].tensors[0]
            raws = [read(e)[e.tensors[0].offset:][:e.tensors[0].nbytes] for e in parts]
            rows = sum(e.tensors[0].shape[0] for e in parts)
            if quantized and has_kernel(t.qtype):
                return QuantTensor(np.concatenate(raws), t.qtype, (rows, t.shape[1]))
            return torch.cat([dequantize_tensor(r, e.tensors[0].qtype, e.tensors[0].shape, dtype)
                              for r, e in zip(raws, parts)])

        def tensors():
            for e in m.layers:
                raw = read(e)
                for t in e.tensors:
                    yield f"layers.{e.index}.{t.name}", _tensor(raw, t, dtype, quantized)
            head = matrix(m.head_parts)
            if m.config.tie_word_embeddings:
                yield "embed_tokens.weight", head
            else:
                yield "lm_head.weight", head
                yield "embed_tokens.weight", matrix(m.embedding_parts)
            g = m.globals
            yield "norm.weight", _tensor(read(g), g.tensors[0], dtype, False)

        return build_decoder(m.config, tensors(), dtype, source=str(store_dir))
    finally:
        reader.close()


def _tensor(raw: np.ndarray, t, dtype: torch.dtype, quantized: bool):
    src = raw[t.offset:t.offset + t.nbytes]
    if quantized and len(t.shape) == 2 and has_kernel(t.qtype):
        return QuantTensor(np.array(src), t.qtype, tuple(t.shape))
    return dequantize_tensor(src, t.qtype, t.shape, dtype)
