"""The block description of a decoder-only transformer, and its sanity checks.

`ModelConfig` is the one description every implementation of the forward
pass reads: the native decoder (csrc/model, through
`lever.model.native_decoder.native_model`), the torch reference
(`lever.reference`) and the static-shape graph (`lever.npu.graph`).  The
architecture modules (`lever.arch`) fill it in from a GGUF file; each
feature below is implemented once per forward pass and switched on by its
field, never by the architecture's name.

A block (one decoder layer), for the residual stream x:

    h = rms_norm(x, attn_norm)
    q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)       attention_bias
    q, k = rms_norm per head (q_norm, k_norm)                  qk_norm
    q, k rotated by RoPE on their first rope_dims dims         rope_* (not on "n" layers)
    a = attention(q * attn_scale, keys, values, mask)          sliding window on "l" layers
    a = a Wo^T ; a = rms_norm(a, attn_post_norm)               sandwich_norms
    x = x + a
    h = rms_norm(x, ffn_norm)
    m = (act(h Wgate^T) * h Wup^T) Wdown^T                     activation
    m = rms_norm(m, ffn_post_norm)                             sandwich_norms
    x = x + m

and around the blocks: x0 = embedding * embed_scale; logits = head(rms_norm(x)),
capped to logit_softcap * tanh(logits / logit_softcap) when logit_softcap > 0.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields

import numpy as np

# The architectures `lever.arch` registers (kept here, at the bottom layer, so
# every layer can name them without importing the family modules).
SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3", "phi3", "smollm3")
ACTIVATIONS = ("silu", "gelu_tanh")        # the gate's activation: SwiGLU, GeGLU (tanh approximation)
LAYER_KINDS = "gln"                         # g: global attention + RoPE; l: sliding window + RoPE; n: global, no RoPE
ROPE_SCALINGS = ("none", "linear", "llama3", "longrope")

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
    "max_context": 1 << 22,         # tokens: 4 Mi, the longest context a GGUF we run declares
}
BOOL_FIELDS = ("tie_word_embeddings", "attention_bias", "qk_norm", "sandwich_norms")


@dataclass(frozen=True)
class ModelConfig:
    """One decoder's shape and block features (see the module docstring).

    Sizes are in elements; `max_context` and `sliding_window` in tokens;
    RoPE bases are the base of the frequency ladder (theta).  Every field
    after `attention_bias` has the Llama default, so a Llama / Qwen2
    description needs none of them.
    """

    arch: str                      # one of SUPPORTED_ARCHS (for messages and records; features come from the fields)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float              # RoPE base of global layers
    max_context: int
    tie_word_embeddings: bool
    attention_bias: bool           # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False          # RMS norm over each q / k head before RoPE (Qwen3, Gemma 3)
    sandwich_norms: bool = False   # RMS norms after attention and after the MLP too (Gemma 3)
    activation: str = "silu"       # one of ACTIVATIONS
    rope_dims: int = 0             # dims rotated per head, the first ones (0: all of head_dim; Phi-4-mini: 96 of 128)
    rope_theta_local: float = 0.0  # RoPE base of sliding-window layers (0: rope_theta)
    rope_scaling: str = "none"     # one of ROPE_SCALINGS (what the factors below came from)
    rope_linear: float = 1.0       # positions of global layers divided by this (linear scaling)
    rope_freq_factors: tuple = ()  # per rotated pair (rope_dims / 2): its frequency divided by the factor (llama3, LongRoPE)
    rope_attn_factor: float = 1.0  # cos and sin multiplied by this (LongRoPE's attention factor)
    sliding_window: int = 0        # tokens an "l" layer's query sees, itself included (0: no local layers)
    layer_kinds: str = ""          # one of LAYER_KINDS per layer ("": every layer "g")
    attn_scale: float = 0.0        # queries multiplied by this before q k^T (0: 1 / sqrt(head_dim))
    embed_scale: float = 1.0       # embedding rows multiplied by this (Gemma: sqrt(hidden_size))
    logit_softcap: float = 0.0     # final logits capped to c * tanh(logits / c) (0: no cap)

    def __post_init__(self) -> None:
        if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        object.__setattr__(self, "rope_freq_factors", tuple(float(f) for f in self.rope_freq_factors))

    @property
    def rotary_dims(self) -> int:
        """Dims rotated per head (elements)."""
        return self.rope_dims or self.head_dim

    @property
    def query_scale(self) -> float:
        """What queries are multiplied by before q k^T."""
        return self.attn_scale or 1.0 / math.sqrt(self.head_dim)

    def kind(self, layer: int) -> str:
        """Layer `layer`'s kind: "g", "l" or "n" (see LAYER_KINDS)."""
        return self.layer_kinds[layer] if self.layer_kinds else "g"

    def local_layers(self) -> list[int]:
        """Indices of the sliding-window layers."""
        return [i for i in range(self.n_layers) if self.kind(i) == "l"]

    def inv_freq(self, local: bool = False) -> list[float]:
        """The RoPE frequency of each rotated pair (radians per position,
        rotary_dims / 2 of them) of a global (or, `local`, a sliding-window)
        layer, computed in float32 as the native core computes it:
        1 / theta^(2i / rotary_dims), divided by the frequency factors and, on
        global layers, by the linear factor.  The torch reference and the static
        graph's tables take these values (each a float32, exactly)."""
        theta = np.float32((self.rope_theta_local or self.rope_theta) if local else self.rope_theta)
        d = self.rotary_dims
        f = np.float32(1) / np.power(theta, np.arange(d // 2, dtype=np.float32) * np.float32(2) / np.float32(d))
        if self.rope_freq_factors:
            f = f / np.asarray(self.rope_freq_factors, dtype=np.float32)
        if not local and self.rope_linear != 1.0:
            f = f / np.float32(self.rope_linear)
        return f.astype(np.float32).tolist()


# The block features of the description (the ModelConfig fields with a
# default).  Each forward pass names the features it computes in its own
# BLOCK_FIELDS and refuses a description using another (`unsupported_feature`):
# a field added here later is refused by every pass until that pass computes
# it, never silently ignored (tests/arch/test_families.py holds the native
# decoder to all of them).
BLOCK_FEATURES = frozenset({"qk_norm", "sandwich_norms", "activation", "rope_dims", "rope_theta_local",
                            "rope_scaling", "rope_linear", "rope_freq_factors", "rope_attn_factor",
                            "sliding_window", "layer_kinds", "attn_scale", "embed_scale", "logit_softcap"})


def unsupported_feature(cfg: ModelConfig, computed: frozenset = BLOCK_FEATURES,
                        activations: tuple = ACTIVATIONS) -> str | None:
    """The first block feature `cfg` uses that an implementation computing
    `computed` (field names) and `activations` cannot, as a phrase ("<field>",
    "activation '<name>'"), or None."""
    for f in fields(cfg):
        if f.default is not MISSING and f.name not in computed and getattr(cfg, f.name) != f.default:
            return f.name
    if cfg.activation not in activations:
        return f"activation {cfg.activation!r}"
    return None


def config_problem(values: dict) -> str | None:
    """None if `values` (ModelConfig field -> value; fields with a default may
    be left out) describe a decoder Lever can run, else one phrase naming the
    first bad field."""
    names = [f.name for f in fields(ModelConfig)]
    required = [f.name for f in fields(ModelConfig) if f.default is MISSING]
    missing = [n for n in required if n not in values]
    if missing:
        return f"{missing[0]} is missing"
    extra = sorted(set(values) - set(names))
    if extra:
        return f"unknown field {extra[0]!r}"
    v = {f.name: values.get(f.name, f.default) for f in fields(ModelConfig)}
    if v["arch"] not in SUPPORTED_ARCHS:
        return f"arch {v['arch']!r} is not one of {', '.join(SUPPORTED_ARCHS)}"
    for name, limit in INT_LIMITS.items():
        x = v[name]
        if type(x) is not int:
            return f"{name} must be an integer, got {x!r}"
        if not 1 <= x <= limit:
            return f"{name} {x} is outside 1..{limit}"
    for name in BOOL_FIELDS:
        if type(v[name]) is not bool:
            return f"{name} must be true or false, got {v[name]!r}"
    if v["n_heads"] % v["n_kv_heads"]:
        return f"n_heads {v['n_heads']} is not a multiple of n_kv_heads {v['n_kv_heads']}"
    rope_dims = v["rope_dims"]
    if type(rope_dims) is not int or not 0 <= rope_dims <= v["head_dim"]:
        return f"rope_dims must be an integer in 0..head_dim {v['head_dim']}, got {rope_dims!r}"
    if (rope_dims or v["head_dim"]) % 2:
        return f"{'rope_dims' if rope_dims else 'head_dim'} {rope_dims or v['head_dim']} is odd " \
               f"(rotary embeddings rotate pairs)"
    eps = v["rms_norm_eps"]
    if type(eps) not in (int, float) or not (math.isfinite(eps) and 0 < eps < 1):
        return f"rms_norm_eps must be a finite number in (0, 1), got {eps!r}"
    for name in ("rope_theta", "rope_theta_local"):
        theta = v[name]
        if type(theta) not in (int, float) or not math.isfinite(theta) or \
                not (theta > 1 or (name == "rope_theta_local" and theta == 0)):
            return f"{name} must be a finite number > 1, got {theta!r}"
    for name in ("rope_linear", "rope_attn_factor", "embed_scale"):
        x = v[name]
        if type(x) not in (int, float) or not (math.isfinite(x) and x > 0):
            return f"{name} must be a finite number > 0, got {x!r}"
    for name in ("attn_scale", "logit_softcap"):
        x = v[name]
        if type(x) not in (int, float) or not (math.isfinite(x) and x >= 0):
            return f"{name} must be a finite number >= 0, got {x!r}"
    if v["activation"] not in ACTIVATIONS:
        return f"activation {v['activation']!r} is not one of {', '.join(ACTIVATIONS)}"
    if v["rope_scaling"] not in ROPE_SCALINGS:
        return f"rope_scaling {v['rope_scaling']!r} is not one of {', '.join(ROPE_SCALINGS)}"
    factors = v["rope_freq_factors"]
    if not isinstance(factors, (list, tuple)) or (factors and len(factors) != (rope_dims or v["head_dim"]) // 2):
        return f"rope_freq_factors must hold rope_dims / 2 = {(rope_dims or v['head_dim']) // 2} numbers"
    if any(type(f) not in (int, float) or not (math.isfinite(f) and f > 0) for f in factors):
        return "rope_freq_factors must be finite numbers > 0"
    kinds = v["layer_kinds"]
    if type(kinds) is not str or (kinds and (len(kinds) != v["n_layers"] or set(kinds) - set(LAYER_KINDS))):
        return f"layer_kinds must be empty or {v['n_layers']} letters of {LAYER_KINDS!r}, got {kinds!r}"
    window = v["sliding_window"]
    if type(window) is not int or window < 0 or ("l" in kinds and window < 1):
        return f"sliding_window must be a positive number of tokens where a layer is local, got {window!r}"
    return None


def checked_config(values: dict, source: str, error: type[Exception]) -> ModelConfig:
    """A ModelConfig from `values`, or `error` naming `source` and the bad field."""
    problem = config_problem(values)
    if problem:
        raise error(f"{source}: {problem}")
    floats = {n: float(values[n]) for n in ("rms_norm_eps", "rope_theta", "rope_theta_local", "rope_linear",
                                            "rope_attn_factor", "attn_scale", "embed_scale", "logit_softcap")
              if n in values}
    return ModelConfig(**{**values, **floats})


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
    if cfg.qk_norm:
        shapes.update({"self_attn.q_norm.weight": (cfg.head_dim,), "self_attn.k_norm.weight": (cfg.head_dim,)})
    if cfg.sandwich_norms:
        shapes.update({"self_attn.post_norm.weight": (h,), "mlp.post_norm.weight": (h,)})
    return shapes
