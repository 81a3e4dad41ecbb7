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
from .config import SUPPORTED_ARCHS, ModelConfig, config_problem, layer_shapes
from .decoder import Decoder
from .gguf_checks import check_layer_indices, check_tensor_shapes, meta_float, meta_int
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


# ModelConfig field -> the metadata key it comes from (after "<arch>.")
_FIELD_KEYS = {
    "hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
    "n_layers": "block_count", "n_heads": "attention.head_count",
    "n_kv_heads": "attention.head_count_kv", "head_dim": "attention.key_length",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon", "rope_theta": "rope.freq_base",
    "max_context": "context_length", "vocab_size": "vocab_size",
}


def config_from_gguf(g: GGUFFile) -> ModelConfig:
    """The decoder's hyperparameters from the metadata, checked (types, ranges,
    head counts) and checked against the tensors (layer count, every shape)."""
    arch = g.architecture
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(f"{g.path.name}: unsupported architecture {arch!r} "
                                    f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    meta = g.metadata
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None) or "rope_freqs.weight" in g.tensors:
        raise UnsupportedModelError(f"{g.path.name}: RoPE scaling {scaling!r} is not supported")
    if "token_embd.weight" not in g.tensors:
        raise ModelFormatError(f"{g.path}: tensor 'token_embd.weight' is missing")

    def num(key, default=None):
        return meta_int(g.path, meta, f"{arch}.{key}", default)

    hidden, n_heads = num("embedding_length"), num("attention.head_count")
    if f"{arch}.attention.key_length" not in meta and (n_heads <= 0 or hidden % n_heads):
        raise ModelFormatError(f"{g.path}: metadata {arch}.attention.head_count {n_heads} does not "
                               f"divide {arch}.embedding_length {hidden}")
    values = dict(
        arch=arch,
        vocab_size=num("vocab_size", g.tensors["token_embd.weight"].shape[0]),
        hidden_size=hidden,
        intermediate_size=num("feed_forward_length"),
        n_layers=num("block_count"),
        n_heads=n_heads,
        n_kv_heads=num("attention.head_count_kv", n_heads),
        head_dim=num("attention.key_length", hidden // n_heads if n_heads > 0 else 0),
        rms_norm_eps=meta_float(g.path, meta, f"{arch}.attention.layer_norm_rms_epsilon"),
        rope_theta=meta_float(g.path, meta, f"{arch}.rope.freq_base", 10000.0),
        max_context=num("context_length"),
        tie_word_embeddings="output.weight" not in g.tensors,
        attention_bias="blk.0.attn_q.bias" in g.tensors,
    )
    problem = config_problem(values)
    if problem:
        field = problem.split(" ")[0]
        key = f" (metadata {arch}.{_FIELD_KEYS[field]})" if field in _FIELD_KEYS else ""
        raise ModelFormatError(f"{g.path}: {problem}{key}")
    cfg = ModelConfig(**values)
    if num("rope.dimension_count", cfg.head_dim) != cfg.head_dim:
        raise ModelFormatError(f"{g.path}: metadata {arch}.rope.dimension_count {num('rope.dimension_count')} "
                               f"is not the head size {cfg.head_dim} (partial RoPE is not supported)")
    check_layer_indices(g.path, g.tensors, cfg.n_layers)
    check_tensor_shapes(g.path, g.tensors, expected_gguf_shapes(cfg))
    return cfg


def expected_gguf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> shape (outermost first) of every tensor the decoder needs."""
    to_gguf = {v: k for k, v in LAYER_TENSOR_NAMES.items()}
    shapes = {"token_embd.weight": (cfg.vocab_size, cfg.hidden_size), "output_norm.weight": (cfg.hidden_size,)}
    if not cfg.tie_word_embeddings:
        shapes["output.weight"] = (cfg.vocab_size, cfg.hidden_size)
    for i in range(cfg.n_layers):
        for name, shape in layer_shapes(cfg).items():
            shapes[f"blk.{i}.{to_gguf[name]}"] = shape
    return shapes


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
