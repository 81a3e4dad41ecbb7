"""GGUF tensor names and hyperparameters of a Llama / Qwen2 decoder (torch-free).

`config_from_gguf` reads and checks the `ModelConfig` of a parsed GGUF file;
`decoder_name` maps GGUF tensor names to the decoder's parameter names.
llama.cpp stores the q/k projections of *llama* models with rows permuted for
its interleaved RoPE; `qk_row_order` gives the row order that undoes it (the
rotate-half RoPE layout the decoders use).  Used by the native loader, the
store converter and the torch reference loader alike.
"""

from __future__ import annotations

import re

import numpy as np

from ..errors import ModelFormatError, UnsupportedModelError
from ..model_config import SUPPORTED_ARCHS, ModelConfig, config_problem, layer_shapes
from .checks import check_layer_indices, check_tensor_shapes, meta_float, meta_int
from .file import GGUFFile

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


def qk_row_order(rows: int, n_heads: int) -> np.ndarray:
    """int64 [rows]: row i of the rotate-half layout is row order[i] of llama.cpp's
    interleaved q/k layout (`n_heads` heads of rows // n_heads rows each)."""
    return np.arange(rows, dtype=np.int64).reshape(n_heads, rows // n_heads // 2, 2).transpose(0, 2, 1).reshape(-1)


def permuted_heads(cfg: ModelConfig, name: str) -> int | None:
    """Heads whose q/k rows llama.cpp permuted in decoder tensor `name`
    (a q/k projection weight or bias of a llama model), else None."""
    if cfg.arch != "llama":
        return None
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return cfg.n_heads
    if name.endswith(("k_proj.weight", "k_proj.bias")):
        return cfg.n_kv_heads
    return None
