"""Hyperparameters of a Llama/Qwen2-family decoder."""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_ARCHS = ("llama", "qwen2")


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
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
