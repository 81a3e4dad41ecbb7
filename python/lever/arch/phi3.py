"""`phi3`: Phi-3 / Phi-3.5-mini and Phi-4-mini.  q, k and v are the row blocks
of one `attn_qkv` tensor and gate / up the two halves of `ffn_up` (gate
first); Phi-4-mini rotates only the first rope.dimension_count dims of each
head (partial rotary) and ties its head.

LongRoPE (the rope_factors_short / rope_factors_long tensors): Lever runs
the short factors, and caps the context at the original context
(rope.scaling.original_context_length), where the short factors hold:
the long ones change every position's rotation once a sequence is longer,
which a KV cache cannot follow.  cos and sin are scaled by
rope.scaling.attn_factor, as in llama.cpp and transformers.  Phi's sliding
window is ignored, as llama.cpp does."""

from .base import Family, Meta, rope_scaling_fields


def describe(meta: Meta) -> dict:
    if not meta.has_tensor("rope_factors_short.weight"):
        return rope_scaling_fields(meta, ("linear",))
    context = meta.int("context_length")
    return dict(rope_scaling="longrope", rope_freq_factors=tuple(meta.tensor_values("rope_factors_short.weight")),
                rope_attn_factor=meta.float("rope.scaling.attn_factor", 1.0),
                max_context=min(context, meta.int("rope.scaling.original_context_length", context)))


FAMILY = Family("phi3", "phi3", describe, fused_qkv=True, fused_gate_up=True)
