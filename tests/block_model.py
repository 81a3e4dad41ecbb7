"""Tiny decoders built from tensors, without a file: a `ModelConfig` with the
block features a test switches on, random float32 weights, and the same
weights on the native decoder (a `NativeDecoder` over `TensorWeights`) and
on the torch reference (`lever.reference`).  With float32 weights the native
forward is plain float32 arithmetic, so the two agree to float rounding.

    cfg = block_config(qk_norm=True, layer_kinds="lgl", sliding_window=5)
    tensors = random_tensors(cfg, seed=0)
    native, ref = native_decoder(cfg, tensors), reference_model(cfg, tensors)
"""

from __future__ import annotations

import numpy as np

from lever import _native
from lever.model.native_decoder import NativeDecoder
from lever.model.native_loader import aligned_buffer
from lever.model_config import ModelConfig, checked_config, layer_shapes

F32 = 0                         # ggml type id of float32
BASE = dict(arch="llama", vocab_size=97, hidden_size=64, intermediate_size=96, n_layers=3, n_heads=4,
            n_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, max_context=256,
            tie_word_embeddings=False, attention_bias=False)


def block_config(**fields) -> ModelConfig:
    """BASE (3 layers, hidden 64, 4 heads over 2 kv heads of 16) with `fields`
    replaced, checked as a GGUF's config is (ValueError naming a bad field)."""
    return checked_config({**BASE, **fields}, "block_config", ValueError)


def random_tensors(cfg: ModelConfig, seed: int = 0, std: float = 0.2) -> dict[str, np.ndarray]:
    """Decoder parameter name -> float32 values of every tensor of `cfg`: matrices
    and biases N(0, std^2), norm weights 1 + N(0, std^2)."""
    rng = np.random.default_rng(seed)

    def draw(name: str, shape) -> np.ndarray:
        x = (rng.standard_normal(shape) * std).astype(np.float32)
        return x + np.float32(1) if name.endswith("norm.weight") else x

    out = {"embed_tokens.weight": draw("embed", (cfg.vocab_size, cfg.hidden_size))}
    for i in range(cfg.n_layers):
        for name, shape in layer_shapes(cfg).items():
            out[f"layers.{i}.{name}"] = draw(name, shape)
    out["norm.weight"] = draw("norm.weight", (cfg.hidden_size,))
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = draw("lm_head", (cfg.vocab_size, cfg.hidden_size))
    return out


def _as_bytes(x: np.ndarray) -> np.ndarray:
    """float32 values as an aligned uint8 buffer (the native core's F32 tensor)."""
    raw = np.ascontiguousarray(x, dtype=np.float32).view(np.uint8).reshape(-1)
    out = aligned_buffer(raw.nbytes)
    out[:] = raw
    return out


def _no_release() -> None:
    pass


class TensorWeights:
    """A `NativeDecoder` weight source (see lever.model.native_decoder) over
    float32 tensors held in memory: one buffer per layer, every tensor F32."""

    def __init__(self, cfg: ModelConfig, tensors: dict[str, np.ndarray]):
        self.vocab_size = cfg.vocab_size
        self.buffers, self.layouts = [], []
        for i in range(cfg.n_layers):
            entries, parts, offset = [], [], 0
            for name, shape in layer_shapes(cfg).items():
                raw = tensors[f"layers.{i}.{name}"].astype(np.float32).reshape(-1).view(np.uint8)
                entries.append((name, offset, F32, tuple(shape)))
                parts.append((offset, raw))
                offset += -(-raw.nbytes // 64) * 64
            buffer = aligned_buffer(offset)
            for at, raw in parts:
                buffer[at:at + raw.nbytes] = raw
            self.buffers.append(buffer)
            self.layouts.append(_native.LayerLayout(entries))
        self.embedding = _as_bytes(tensors["embed_tokens.weight"])
        self.head = self.embedding if cfg.tie_word_embeddings else _as_bytes(tensors["lm_head.weight"])
        self.head_parts = [(0, cfg.vocab_size, F32)]
        self.norm = np.ascontiguousarray(tensors["norm.weight"], dtype=np.float32)

    def layer(self, i: int):
        return self.buffers[i], _no_release

    def head_part(self, k: int):
        return self.head, _no_release

    def embed(self, native, ids: np.ndarray, out: np.ndarray) -> None:
        native.embed(self.embedding, F32, self.vocab_size, ids, out)


def native_decoder(cfg: ModelConfig, tensors: dict[str, np.ndarray], dtype: str = "float32") -> NativeDecoder:
    """The native decoder over `tensors` (a `dtype` KV cache)."""
    model = NativeDecoder(cfg, TensorWeights(cfg, tensors), dtype)
    for layout, buffer in zip(model.weights.layouts, model.weights.buffers):
        model.native.check_layout(layout, buffer.nbytes)
    return model


def reference_model(cfg: ModelConfig, tensors: dict[str, np.ndarray]):
    """The torch reference over `tensors`, computing in float32, behind the
    numpy model protocol (`lever.reference.torch_model.TorchModel`)."""
    import torch

    from lever.reference.torch_model import TorchModel
    from lever.reference.weights import build_decoder
    named = ((name, torch.from_numpy(np.array(x, dtype=np.float32))) for name, x in tensors.items())
    return TorchModel(build_decoder(cfg, named, torch.float32, source="block_model"))
