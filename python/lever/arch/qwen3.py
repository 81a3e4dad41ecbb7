"""`qwen3` (dense): Qwen2's layout without the q/k/v biases, an RMS norm over
each query and key head before RoPE, and a head size that need not be
hidden / heads (attention.key_length)."""

from .base import Family, Meta, rope_scaling_fields


def describe(meta: Meta) -> dict:
    return {"qk_norm": True, **rope_scaling_fields(meta, ("linear",))}


FAMILY = Family("qwen3", "qwen3", describe)
