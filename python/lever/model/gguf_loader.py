"""Load a Llama / Qwen2 decoder from a GGUF file.

Hyperparameters come from the metadata.  By default every matrix whose type
has a native matmul kernel (Q4_K, Q6_K, Q8_0, Q5_0, Q4_0) stays quantised in
memory, copied out of the file as its blocks; other tensors (norms, biases,
types without a kernel, and all weights with `quantized=False`) are
dequantised one at a time by the native core straight into the compute dtype.  llama.cpp stores the
q/k projections of *llama* models with rows permuted for its interleaved RoPE;
`unpermute_qk` undoes that so the rotate-half RoPE of `decoder.py` applies.
"""

from __future__ import annotations

import re
from typing import Iterator

import numpy as np
import torch

from ..errors import ModelFormatError, UnsupportedModelError
from .. import quant
from .config import SUPPORTED_ARCHS, ModelConfig
from .decoder import Decoder
from .gguf_file import GGUFFile
from .linear import QuantTensor, has_kernel
from .weights import build_decoder

_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSOR_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def decoder_name(gguf_name: str) -> str | None:
    """Decoder parameter name of a GGUF tensor name (None if it is not a weight we use)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m and m.group(2) in LAYER_TENSOR_NAMES:
        return f"layers.{m.group(1)}.{LAYER_TENSOR_NAMES[m.group(2)]}"
    return None


def config_from_gguf(g: GGUFFile) -> ModelConfig:
    arch = g.architecture
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(f"{g.path.name}: unsupported architecture {arch!r} "
                                    f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    meta = g.metadata

    def get(key, default=None):
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelFormatError(f"{g.path.name}: metadata key {arch}.{key} is missing")
        return value

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in g.tensors:
        raise UnsupportedModelError(f"{g.path.name}: RoPE scaling {scaling!r} is not supported")
    if "token_embd.weight" not in g.tensors:
        raise ModelFormatError(f"{g.path.name}: tensor 'token_embd.weight' is missing")
    hidden, n_heads = int(get("embedding_length")), int(get("attention.head_count"))
    vocab = int(meta.get(f"{arch}.vocab_size", g.tensors["token_embd.weight"].shape[0]))
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        n_layers=int(get("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", n_heads)),
        head_dim=int(meta.get(f"{arch}.attention.key_length", hidden // n_heads)),
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        max_context=int(get("context_length")),
        tie_word_embeddings="output.weight" not in g.tensors,
        attention_bias="blk.0.attn_q.bias" in g.tensors,
    )


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (interleaved -> rotate-half RoPE layout)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def gguf_tensors(g: GGUFFile, cfg: ModelConfig, dtype: torch.dtype,
                 quantized: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantTensor]]:
    """(decoder name, tensor in `dtype` or QuantTensor) for every weight in the file, one at a time."""
    for info in g.tensors.values():
        name = decoder_name(info.name)
        if name is None:
            continue
        if not quant.is_supported(info.qtype):
            raise UnsupportedModelError(f"{g.path.name}: tensor {info.name!r} uses quantisation type "
                                        f"{info.type_name}, which Lever cannot dequantise")
        heads = None
        if cfg.arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = cfg.n_heads
        elif cfg.arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = cfg.n_kv_heads
        if quantized and len(info.shape) == 2 and has_kernel(info.qtype):
            w = QuantTensor(np.array(g.raw(info.name)), info.qtype, tuple(info.shape))
            if heads:
                w = w.permute_rows(unpermute_qk(torch.arange(info.shape[0]), heads))
            yield name, w
            continue
        w = quant.dequantize(g.raw(info.name), info.qtype, info.shape, dtype)
        yield name, unpermute_qk(w, heads) if heads else w


def load_gguf_model(path, dtype: torch.dtype = torch.bfloat16,
                    quantized: bool = True) -> tuple[Decoder, GGUFFile]:
    """Read a GGUF file into a Decoder computing in `dtype`; also returns the
    parsed file (metadata).  quantized=False dequantises every weight into a
    dense torch tensor (the torch matmul path)."""
    g = GGUFFile(path)
    cfg = config_from_gguf(g)
    model = build_decoder(cfg, gguf_tensors(g, cfg, dtype, quantized), dtype, source=g.path.name)
    return model, g
