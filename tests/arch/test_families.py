"""Each family module maps its metadata onto the block description as
llama.cpp reads the same keys; an architecture or feature Lever does not run
is refused in one line naming it."""

from __future__ import annotations

import math

import pytest

from lever.arch import FAMILIES, family
from lever.arch.base import common_fields
from lever.errors import UnsupportedModelError
from lever.model_config import SUPPORTED_ARCHS, ModelConfig, config_problem


class FakeMeta:
    """A `lever.arch.base.Meta` over a dict (keys without the arch prefix)."""

    def __init__(self, arch: str, keys: dict, tensors: dict | None = None):
        self.arch, self.source, self.keys, self.tensors = arch, "model.gguf", keys, tensors or {}

    def has(self, key):
        return key in self.keys

    def int(self, key, default=None):
        v = self.keys.get(key, default)
        assert v is not None, key
        return v

    float = int

    def str(self, key, default=None):
        return self.keys.get(key, default)

    def array(self, key):
        v = self.keys.get(key)
        return v if isinstance(v, list) else None

    def has_tensor(self, name):
        return name in self.tensors

    def tensor_values(self, name):
        return self.tensors[name]

    def refuse(self, what):
        return UnsupportedModelError(f"{self.source}: {what}")


BASE = {"embedding_length": 64, "feed_forward_length": 128, "block_count": 12, "attention.head_count": 4,
        "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon": 1e-6, "rope.freq_base": 1e4,
        "context_length": 4096}


def config(arch: str, keys: dict | None = None, tensors: dict | None = None) -> ModelConfig:
    meta = FakeMeta(arch, {**BASE, **(keys or {})}, tensors)
    values = common_fields(meta)
    values.update(vocab_size=100, tie_word_embeddings=True, attention_bias=False)
    values.update(FAMILIES[arch].describe(meta))
    assert config_problem(values) is None, config_problem(values)
    return ModelConfig(**values)


def test_the_registry_is_the_list_of_supported_architectures():
    assert tuple(FAMILIES) == SUPPORTED_ARCHS


def test_gemma3_local_layers_follow_the_pattern_of_six_or_the_files_array():
    cfg = config("gemma3", {"attention.sliding_window": 512, "attention.key_length": 32})
    assert cfg.layer_kinds == "lllllglllllg"
    assert cfg.sliding_window == 512 and cfg.rope_theta_local == 10000.0
    assert cfg.embed_scale == math.sqrt(64) and cfg.activation == "gelu_tanh"
    assert cfg.qk_norm and cfg.sandwich_norms and cfg.query_scale == 1 / math.sqrt(32)
    flags = [True, False] * 6
    cfg = config("gemma3", {"attention.sliding_window": 8, "attention.sliding_window_pattern": flags,
                            "rope.freq_base_swa": 5e4})
    assert cfg.layer_kinds == "lg" * 6 and cfg.rope_theta_local == 5e4
    with pytest.raises(UnsupportedModelError, match="12 layers"):
        config("gemma3", {"attention.sliding_window": 8, "attention.sliding_window_pattern": [True] * 5})


def test_gemma3_without_a_window_has_only_global_layers():
    assert config("gemma3").layer_kinds == "" and config("gemma3").sliding_window == 0


def test_smollm3_drops_rope_on_every_fourth_layer():
    assert config("smollm3").layer_kinds == "gggn" * 3
    assert FAMILIES["smollm3"].permutes_qk and FAMILIES["llama"].permutes_qk
    assert not FAMILIES["qwen3"].permutes_qk


def test_llama3_scaling_comes_from_rope_freqs():
    factors = [1.0] * 4 + [2.0] * 4
    cfg = config("llama", {"attention.key_length": 16}, {"rope_freqs.weight": factors})
    assert cfg.rope_scaling == "llama3" and cfg.rope_freq_factors == tuple(factors)
    base = config("llama", {"attention.key_length": 16})
    assert cfg.inv_freq()[:4] == base.inv_freq()[:4]
    assert cfg.inv_freq()[4:] == pytest.approx([f / 2 for f in base.inv_freq()[4:]])


def test_linear_scaling_divides_global_frequencies_only():
    cfg = config("gemma3", {"attention.sliding_window": 8, "rope.scaling.type": "linear", "rope.scaling.factor": 8.0})
    assert cfg.rope_linear == 8.0
    assert cfg.inv_freq()[1] == pytest.approx(1e4 ** (-2 / 16) / 8)
    assert cfg.inv_freq(local=True)[1] == pytest.approx(1e4 ** (-2 / 16))


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "phi3", "smollm3", "gemma3"])
def test_yarn_is_refused_in_one_line(arch):
    with pytest.raises(UnsupportedModelError) as e:
        config(arch, {"rope.scaling.type": "yarn"})
    assert "RoPE scaling 'yarn' is not supported" in str(e.value) and "\n" not in str(e.value)


def test_phi3_longrope_runs_the_short_factors_within_the_original_context():
    short, long = [1.0, 1.5, 2.0, 3.0], [4.0] * 4
    cfg = config("phi3", {"attention.key_length": 16, "rope.dimension_count": 8, "context_length": 131072,
                          "rope.scaling.original_context_length": 4096, "rope.scaling.attn_factor": 1.19},
                 {"rope_factors_short.weight": short, "rope_factors_long.weight": long})
    assert cfg.rope_scaling == "longrope" and cfg.rope_freq_factors == tuple(short)
    assert cfg.max_context == 4096 and cfg.rope_attn_factor == 1.19 and cfg.rotary_dims == 8


def test_phi3_fused_tensors_split_by_rows():
    cfg = config("phi3", {"attention.key_length": 16})
    parts = FAMILIES["phi3"].layer_parts(cfg, lambda name: name in ("attn_qkv.weight",))
    rows = {p.name: (p.gguf, p.rows) for p in parts}
    q, kv, ff = 4 * 16, 2 * 16, 128
    assert rows["self_attn.q_proj.weight"] == ("attn_qkv.weight", (0, q))
    assert rows["self_attn.k_proj.weight"] == ("attn_qkv.weight", (q, q + kv))
    assert rows["self_attn.v_proj.weight"] == ("attn_qkv.weight", (q + kv, q + 2 * kv))
    assert rows["mlp.gate_proj.weight"] == ("ffn_up.weight", (0, ff))
    assert rows["mlp.up_proj.weight"] == ("ffn_up.weight", (ff, 2 * ff))
    # a file with separate tensors keeps them
    separate = FAMILIES["phi3"].layer_parts(cfg, lambda name: name == "ffn_gate.weight")
    assert {p.gguf for p in separate} >= {"attn_q.weight", "ffn_gate.weight", "ffn_up.weight"}
    assert all(p.rows is None for p in separate)


@pytest.mark.parametrize("arch, feature", [("qwen35", "hybrid linear-attention layers are not supported"),
                                            ("gemma2", "soft-capping"), ("mamba", "state-space"),
                                            ("someday", None)])
def test_an_unsupported_architecture_is_one_line_naming_what_is_missing(arch, feature):
    with pytest.raises(UnsupportedModelError) as e:
        family(arch, "x.gguf")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"x.gguf: unsupported architecture {arch!r}")
    assert (feature in msg) if feature else ": " not in msg.split(f"{arch!r}")[1].split(" (")[0]
    assert "(supported: llama, qwen2, qwen3, gemma3, phi3, smollm3)" in msg


@pytest.mark.parametrize("field, value, words", [
    ("layer_kinds", "gx", "layer_kinds"), ("layer_kinds", "l", "sliding_window"),
    ("activation", "relu", "activation"), ("rope_dims", 3, "odd"), ("rope_freq_factors", (1.0,), "rope_freq_factors"),
    ("logit_softcap", -1.0, "logit_softcap"), ("rope_theta_local", 0.5, "rope_theta_local")])
def test_block_description_problems_name_the_field(field, value, words):
    values = dict(arch="llama", vocab_size=10, hidden_size=8, intermediate_size=8, n_layers=1, n_heads=2,
                  n_kv_heads=1, head_dim=4, rms_norm_eps=1e-5, rope_theta=1e4, max_context=10,
                  tie_word_embeddings=True, attention_bias=False)
    assert config_problem(values) is None
    assert words in config_problem({**values, field: value})


def test_every_block_feature_is_computed_by_every_forward_pass():
    """A ModelConfig field with a default is a block feature: each forward pass
    names the ones it computes, and refuses the others (never ignores them)."""
    from dataclasses import MISSING, fields

    from lever.model.native_decoder import BLOCK_FIELDS as NATIVE
    from lever.model_config import BLOCK_FEATURES, unsupported_feature
    from lever.npu.graph import BLOCK_FIELDS as STATIC
    from lever.reference.decoder import BLOCK_FIELDS as REFERENCE
    features = {f.name for f in fields(ModelConfig) if f.default is not MISSING}
    assert features == set(BLOCK_FEATURES)
    assert set(NATIVE) == features                   # the run path computes every feature
    assert set(REFERENCE) == features and set(STATIC) == features   # today; else they refuse (test_arch_walk)
    cfg = config("gemma3", {"attention.sliding_window": 8})
    assert unsupported_feature(cfg) is None
    assert unsupported_feature(cfg, frozenset(BLOCK_FEATURES - {"sandwich_norms"})) == "sandwich_norms"
    assert unsupported_feature(cfg, activations=("silu",)) == "activation 'gelu_tanh'"
