"""`gemma3` (the text decoder): sliding-window local layers with their own
RoPE base between global layers, an RMS norm over each q / k head, norms
before and after both attention and MLP (the GGUF norm weights already hold
Gemma's 1 + w), GELU-tanh GeGLU, embeddings scaled by sqrt(hidden), queries
scaled by 1/sqrt(head size) (27B: 1/sqrt(hidden / heads)), a tied head and
an optional final logit soft-cap.

Local layers: those the `attention.sliding_window_pattern` array marks, or,
without one, every layer but each sixth (i % 6 < 5), as llama.cpp and
transformers lay Gemma 3 out.  A local layer's query at position p sees the
keys at positions p - window + 1 .. p."""

import math

from .base import Family, Meta, rope_scaling_fields

PATTERN = 6                 # one global layer in every six, the last of each group
LOCAL_THETA = 10000.0       # RoPE base of the local layers when the file records none
LAYERS_27B = 62             # Gemma 3 27B scales queries by 1/sqrt(hidden / heads)


def layer_kinds(meta: Meta, n_layers: int) -> str:
    """"l" / "g" per layer (see the module docstring)."""
    flags = meta.array("attention.sliding_window_pattern")
    if flags is not None:
        if len(flags) != n_layers:
            raise meta.refuse(f"attention.sliding_window_pattern has {len(flags)} entries for {n_layers} layers")
        return "".join("l" if f else "g" for f in flags)
    every = meta.int("attention.sliding_window_pattern", PATTERN)
    return "".join("l" if i % every < every - 1 else "g" for i in range(n_layers))


def describe(meta: Meta) -> dict:
    n, hidden, heads = meta.int("block_count"), meta.int("embedding_length"), meta.int("attention.head_count")
    window = meta.int("attention.sliding_window", 0)
    out = dict(qk_norm=True, sandwich_norms=True, activation="gelu_tanh",
               embed_scale=math.sqrt(hidden), logit_softcap=meta.float("final_logit_softcapping", 0.0))
    if window > 0:
        out.update(sliding_window=window, layer_kinds=layer_kinds(meta, n),
                   rope_theta_local=meta.float("rope.freq_base_swa", LOCAL_THETA))
    if n == LAYERS_27B and heads > 0:
        out["attn_scale"] = 1.0 / math.sqrt(hidden // heads)
    out.update(rope_scaling_fields(meta, ("linear",)))
    return out


FAMILY = Family("gemma3", "gemma3_text", describe)
