"""Hyperparameters of a Llama/Qwen2-family decoder, and their sanity checks."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

SUPPORTED_ARCHS = ("llama", "qwen2")

# Upper bounds (inclusive) on the integer fields: anything larger is a corrupt
# file, and checking first keeps a corrupt value from sizing an allocation.
INT_LIMITS = {
    "vocab_size": 1 << 22,          # tokens
    "hidden_size": 1 << 16,         # elements
    "intermediate_size": 1 << 18,   # elements
    "n_layers": 1024,
    "n_heads": 1024,
    "n_kv_heads": 1024,
    "head_dim": 1024,               # elements
    "max_context": 1 << 22,         # tokens: 4 Mi, the longest context a Llama/Qwen2 GGUF declares
}
BOOL_FIELDS = ("tie_word_embeddings", "attention_bias")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only transformer of the Llama/Qwen2 family.

    Sizes are in elements; `max_context` is in tokens.
    """

    arch: str                      # "llama" or "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_context: int
    tie_word_embeddings: bool
    attention_bias: bool           # q/k/v projections carry a bias (Qwen2)

    def __post_init__(self) -> None:
        if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")


def config_problem(values: dict) -> str | None:
    """None if `values` (ModelConfig field -> value) describe a decoder Lever can
    run, else one phrase naming the first bad field. Checks types, ranges
    (INT_LIMITS), head counts, and that rms_norm_eps and rope_theta are finite
    and positive."""
    names = [f.name for f in fields(ModelConfig)]
    missing = [n for n in names if n not in values]
    if missing:
        return f"{missing[0]} is missing"
    extra = sorted(set(values) - set(names))
    if extra:
        return f"unknown field {extra[0]!r}"
    if values["arch"] not in SUPPORTED_ARCHS:
        return f"arch {values['arch']!r} is not one of {', '.join(SUPPORTED_ARCHS)}"
    for name, limit in INT_LIMITS.items():
        v = values[name]
        if type(v) is not int:
            return f"{name} must be an integer, got {v!r}"
        if not 1 <= v <= limit:
            return f"{name} {v} is outside 1..{limit}"
    for name in BOOL_FIELDS:
        if type(values[name]) is not bool:
            return f"{name} must be true or false, got {values[name]!r}"
    if values["n_heads"] % values["n_kv_heads"]:
        return f"n_heads {values['n_heads']} is not a multiple of n_kv_heads {values['n_kv_heads']}"
    if values["head_dim"] % 2:
        return f"head_dim {values['head_dim']} is odd (rotary embeddings need an even head size)"
    eps = values["rms_norm_eps"]
    if type(eps) not in (int, float) or not (math.isfinite(eps) and 0 < eps < 1):
        return f"rms_norm_eps must be a finite number in (0, 1), got {eps!r}"
    theta = values["rope_theta"]
    if type(theta) not in (int, float) or not (math.isfinite(theta) and theta > 1):
        return f"rope_theta must be a finite number > 1, got {theta!r}"
    return None


def checked_config(values: dict, source: str, error: type[Exception]) -> ModelConfig:
    """A ModelConfig from `values`, or `error` naming `source` and the bad field."""
    problem = config_problem(values)
    if problem:
        raise error(f"{source}: {problem}")
    return ModelConfig(**{**values, "rms_norm_eps": float(values["rms_norm_eps"]),
                          "rope_theta": float(values["rope_theta"])})


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Decoder parameter name (without "layers.N.") -> shape (outermost first) of
    every tensor of one decoder layer."""
    h, q, kv, ff = cfg.hidden_size, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, \
        cfg.intermediate_size
    shapes = {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (ff, h),
        "mlp.up_proj.weight": (ff, h),
        "mlp.down_proj.weight": (h, ff),
    }
    if cfg.attention_bias:
        shapes.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,),
                       "self_attn.v_proj.bias": (kv,)})
    return shapes
