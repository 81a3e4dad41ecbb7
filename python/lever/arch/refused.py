"""Architectures Lever does not run, and the feature each one lacks here:
the second half of the one-line refusal (`lever.arch.family`)."""

MISSING = {
    "qwen35": "hybrid linear-attention layers are not supported",
    "qwen3next": "hybrid linear-attention layers are not supported",
    "qwen3moe": "mixture-of-experts layers are not supported",
    "qwen2moe": "mixture-of-experts layers are not supported",
    "llama4": "mixture-of-experts layers and chunked attention are not supported",
    "mixtral": "mixture-of-experts layers are not supported",
    "phimoe": "mixture-of-experts layers are not supported",
    "deepseek2": "multi-head latent attention and mixture-of-experts layers are not supported",
    "gemma": "Gemma 1's block (no q/k norms, no sandwich norms) is not described",
    "gemma2": "attention logit soft-capping is not supported",
    "gemma3n": "per-layer embeddings and AltUp layers are not supported",
    "gemma4": "Gemma 4's block is not described",
    "phi2": "parallel attention and MLP with LayerNorm are not supported",
    "mamba": "state-space layers are not supported",
    "mamba2": "state-space layers are not supported",
    "rwkv6": "recurrent layers are not supported",
    "rwkv7": "recurrent layers are not supported",
    "falcon-h1": "hybrid state-space layers are not supported",
    "granitehybrid": "hybrid state-space layers are not supported",
    "lfm2": "short convolution layers are not supported",
    "gpt2": "learned position embeddings and LayerNorm are not supported",
    "bert": "an encoder, not a decoder",
    "t5": "an encoder-decoder, not a decoder-only model",
}


def why_not(arch: str) -> str | None:
    """What Lever lacks to run `arch`, or None if nothing is recorded."""
    return MISSING.get(arch)
