"""The block features against transformers, the independent reference: tiny
random Gemma 3 (text), SmolLM3, Phi-3 (partial rotary; LongRoPE) and
Llama 3 (llama3 RoPE scaling) models in transformers, their weights mapped
onto Lever's decoder names and their configs onto `ModelConfig` by hand
(what lever.arch reads from a GGUF of the same model), then the logits of a
prompt longer than Gemma's sliding window from transformers, the torch
reference and the native decoder: within 1e-4 of the largest logit
(float32 everywhere; transformers runs eager attention)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from block_model import block_config, native_decoder, reference_model
from test_block_features import PROMPT, causal, rel_err

import transformers

TOL = 1e-4
SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, rms_norm_eps=1e-6, max_position_embeddings=256, attn_implementation="eager")
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


def randomised(model):
    """`model` with every parameter redrawn: N(0, 0.2^2), plus 1 for the vectors
    (these models' only vectors are RMS norm weights)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
    return model.eval()


def lever_names(state: dict, norm_offset: float = 0.0, renames: dict | None = None) -> dict[str, np.ndarray]:
    """transformers' state dict -> Lever's decoder names (lever.model_config.layer_shapes):
    "model." dropped, `renames` (suffix -> suffix) applied, fused phi3 tensors split,
    `norm_offset` added to every RMS norm weight (Gemma stores w for 1 + w)."""
    out = {}
    for key, value in state.items():
        name, x = key.removeprefix("model."), value.detach().float().numpy().copy()
        for old, new in (renames or {}).items():
            if name.endswith(old):
                name = name[:-len(old)] + new
        if name.endswith("norm.weight"):
            x = x + np.float32(norm_offset)
        out[name] = x
    return out


def split_phi3(t: dict, cfg) -> dict:
    q, kv, ff = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.intermediate_size
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        qkv = t.pop(p + "self_attn.qkv_proj.weight")
        t[p + "self_attn.q_proj.weight"], t[p + "self_attn.k_proj.weight"], t[p + "self_attn.v_proj.weight"] = \
            qkv[:q], qkv[q:q + kv], qkv[q + kv:]
        gate_up = t.pop(p + "mlp.gate_up_proj.weight")
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = gate_up[:ff], gate_up[ff:]
    return t


def gemma3():
    hf = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **SIZES, **IDS, num_hidden_layers=6, sliding_window=4, query_pre_attn_scalar=24,
        final_logit_softcapping=3.0, tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}))
    cfg = block_config(arch="gemma3", n_layers=6, rms_norm_eps=1e-6, tie_word_embeddings=True, qk_norm=True,
                       sandwich_norms=True, activation="gelu_tanh", rope_theta=1e6, rope_theta_local=1e4,
                       rope_scaling="linear", rope_linear=2.0, sliding_window=4, layer_kinds="lllllg",
                       attn_scale=24 ** -0.5, embed_scale=math.sqrt(64), logit_softcap=3.0)
    renames = {"post_attention_layernorm.weight": "self_attn.post_norm.weight",
               "pre_feedforward_layernorm.weight": "post_attention_layernorm.weight",
               "post_feedforward_layernorm.weight": "mlp.post_norm.weight"}
    return hf, cfg, lambda state: lever_names(state, 1.0, renames)


def smollm3():
    hf = transformers.SmolLM3ForCausalLM(transformers.SmolLM3Config(
        **SIZES, **IDS, num_hidden_layers=4, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 2e6}))
    assert hf.config.no_rope_layers == [1, 1, 1, 0]
    cfg = block_config(arch="smollm3", n_layers=4, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       rope_theta=2e6, layer_kinds="gggn")
    return hf, cfg, lever_names


def phi3(longrope: bool):
    rope = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.75}
    short = [1.0, 1.2, 1.5, 2.0, 3.0, 4.0]
    extra = {}
    if longrope:
        rope.update(rope_type="longrope", short_factor=short, long_factor=[f * 2 for f in short],
                    original_max_position_embeddings=128)
        extra = dict(rope_scaling="longrope", rope_freq_factors=tuple(short),
                     rope_attn_factor=math.sqrt(1 + math.log(256 / 128) / math.log(128)))
    hf = transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZES, **IDS, num_hidden_layers=3, tie_word_embeddings=True, partial_rotary_factor=0.75,
        original_max_position_embeddings=128, rope_parameters=rope))
    cfg = block_config(arch="phi3", n_layers=3, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_dims=12,
                       rope_theta=1e4, **extra)
    return hf, cfg, lambda state: split_phi3(lever_names(state), cfg)


def llama3():
    rope = {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SIZES, **IDS, num_hidden_layers=3, tie_word_embeddings=False, rope_parameters=rope))
    # the factors llama.cpp's converter writes to rope_freqs: the default frequency over the scaled one
    base = 1.0 / 1e4 ** (np.arange(0, 16, 2) / 16)
    factors = tuple(float(f) for f in base / hf.model.rotary_emb.inv_freq.double().numpy())
    assert max(factors) > 7 and min(factors) == pytest.approx(1.0)
    cfg = block_config(arch="llama", n_layers=3, rms_norm_eps=1e-6, rope_scaling="llama3",
                       rope_freq_factors=factors)
    return hf, cfg, lever_names


CASES = {"gemma3": gemma3, "smollm3": smollm3, "phi3": lambda: phi3(False), "phi3-longrope": lambda: phi3(True),
         "llama3": llama3}


@pytest.mark.parametrize("case", list(CASES))
def test_reference_and_native_equal_transformers(case):
    hf, cfg, mapping = CASES[case]()
    hf = randomised(hf)
    tensors = mapping(hf.state_dict())
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    n = len(PROMPT)
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].float().numpy()
    for make in (reference_model, native_decoder):
        model = make(cfg, tensors)
        got = model(np.array(PROMPT), np.arange(n), causal(n, 0), model.new_cache(32))
        err = rel_err(got, want)
        print(f"{case} {make.__name__}: {err:.2e} of the largest logit from transformers")
        assert err <= TOL, f"{case}: {make.__name__} differs from transformers by {err:.2e}"
