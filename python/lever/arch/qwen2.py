"""`qwen2`: Qwen2 / Qwen2.5 (q/k/v projections with biases)."""

from .base import Family, Meta, rope_scaling_fields


def describe(meta: Meta) -> dict:
    return {"attention_bias": meta.has_tensor("blk.0.attn_q.bias"), **rope_scaling_fields(meta, ("linear",))}


FAMILY = Family("qwen2", "qwen2", describe)
