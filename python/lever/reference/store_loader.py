"""The torch resident reference of a flash store (tests, benchmarks): the
whole store read into an in-memory `lever.reference.decoder.Decoder`.

Kept apart from `streamed_decoder.py` so that the streamed (native) path never imports torch.
Matrices of a repacked store (lever.store.manifest) are restored to the GGUF
layout as they are read (`quant.in_ggml_layout`): the torch decoder gathers
embedding rows and dequantises whole matrices in that layout.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..quant import in_ggml_layout
from ..store.flash_reader import FlashReader, aligned_empty
from ..store.manifest import WEIGHTS, Extent, StoreManifest
from .decoder import Decoder
from .linear import QuantTensor, dequantize_tensor, has_kernel
from .weights import build_decoder, parse_dtype

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
            blocks = [_gguf_layout(read(e), e.tensors[0]) for e in parts]
            qtype, cols = blocks[0][1], parts[0].tensors[0].shape[1]
            rows = sum(e.tensors[0].shape[0] for e in parts)
            if quantized and has_kernel(qtype):
                return QuantTensor(np.concatenate([r for r, _ in blocks]), qtype, (rows, cols))
            return torch.cat([dequantize_tensor(r, q, e.tensors[0].shape, dtype)
                              for (r, q), e in zip(blocks, parts)])

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


def _gguf_layout(raw: np.ndarray, t) -> tuple[np.ndarray, int]:
    """(bytes, ggml type) of tensor `t` of the extent read into `raw`, in the GGUF
    layout (a repacked matrix's rows restored)."""
    return in_ggml_layout(raw[t.offset:t.offset + t.nbytes], t.qtype, t.shape)


def _tensor(raw: np.ndarray, t, dtype: torch.dtype, quantized: bool):
    src, qtype = _gguf_layout(raw, t)
    if quantized and len(t.shape) == 2 and has_kernel(qtype):
        return QuantTensor(np.array(src), qtype, tuple(t.shape))
    return dequantize_tensor(src, qtype, t.shape, dtype)
