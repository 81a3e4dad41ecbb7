"""Export a Lever decoder as a Hugging Face transformers model with the same weights.

Used to check our decoder against transformers (tests) and to time
transformers on exactly our weights (benchmarks).  transformers is imported
only here and is not a runtime dependency.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

import torch

from ..errors import UnsupportedModelError
from .checkpoint_loader import HF_MODEL_TYPES
from .decoder import Decoder


def hf_from_ours(model: Decoder):
    """A `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM` sharing
    `model`'s weight tensors (no copy); UnsupportedModelError (one line) for
    a block those classes do not describe."""
    import transformers

    cfg = model.config
    extra = [f.name for f in fields(cfg) if f.default is not MISSING and f.name != "qk_norm"
             and getattr(cfg, f.name) != f.default]
    wanted = HF_MODEL_TYPES.get(cfg.arch)
    if wanted is None or extra or cfg.qk_norm != wanted.get("qk_norm", False) or \
            cfg.attention_bias != wanted.get("attention_bias", cfg.attention_bias):
        raise UnsupportedModelError(f"{cfg.arch}: no transformers export for this block"
                                    + (f" ({extra[0]} is not exported)" if extra else "")
                                    + f" (exported: {', '.join(HF_MODEL_TYPES)})")
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                  intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.n_layers,
                  num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                  head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
                  max_position_embeddings=cfg.max_context, tie_word_embeddings=cfg.tie_word_embeddings,
                  dtype=model.dtype)
    if cfg.arch == "llama":
        hf_cfg, cls = transformers.LlamaConfig(attention_bias=cfg.attention_bias, **common), transformers.LlamaForCausalLM
    elif cfg.arch == "qwen3":
        hf_cfg, cls = transformers.Qwen3Config(attention_bias=cfg.attention_bias, **common), transformers.Qwen3ForCausalLM
    else:
        hf_cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    with torch.device("meta"):
        hf = cls(hf_cfg)
    state = {}
    for name, p in model.named_parameters():
        state[name if name.startswith("lm_head") else f"model.{name}"] = p.detach()
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = model.embed_tokens.weight.detach()
    hf.load_state_dict(state, strict=True, assign=True)
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    hf.model.rotary_emb = type(hf.model.rotary_emb)(hf_cfg)   # rebuild the meta-device rope buffers
    return hf.eval()
