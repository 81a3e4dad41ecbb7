"""The decoder of `lever.model_config.ModelConfig` in plain torch: the reference.

One forward takes a batch of new tokens of one sequence with explicit
position ids and an explicit boolean attention mask over (cached rows + new
tokens), appends their keys/values to a `KVCache`, and returns logits.
Plain decoding passes a causal mask; tree verification passes a tree mask.

Every block feature of the config is computed here once, switched on by its
field (never by the architecture's name), with the arithmetic of the native
decoder (csrc/model/decoder_layer.cpp), so that on float32 weights the two
agree to float rounding:

- q / k RMS norms over each head before RoPE (`qk_norm`);
- RMS norms after the attention output and after the MLP (`sandwich_norms`);
- the gate's activation: SiLU or GELU with the tanh approximation (`activation`);
- RoPE (rotate-half) on the first `rotary_dims` dims of each head, angles
  position * frequency in float32, frequencies from `rope_theta` (global
  layers) or `rope_theta_local` (sliding-window layers), divided by
  `rope_freq_factors` and, on global layers, by `rope_linear`; cos and sin
  multiplied by `rope_attn_factor`; none on "n" (NoPE) layers;
- queries scaled by `query_scale` (the attention kernel's scale);
- on "l" layers the pass's mask also hides keys `sliding_window` or more
  positions back (committed cache row c holds position c);
- embedding rows multiplied by `embed_scale`; logits soft-capped to
  c * tanh(logits / c) with c = `logit_softcap` > 0.

Linear layers and the embedding hold either dense torch weights or quantised
blocks (`lever.reference.linear`): quantised weights are multiplied by the native
kernels without being dequantised.

Parameter names follow Hugging Face (`embed_tokens`, `layers.N.self_attn.q_proj`,
...) minus the `model.` prefix, so checkpoints map onto it one to one; the
block's extra norms are `self_attn.q_norm`, `self_attn.k_norm` [head_dim],
`self_attn.post_norm` and `mlp.post_norm` [hidden] (`model_config.layer_shapes`).
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import UnsupportedModelError
from ..masks import causal_mask  # noqa: F401 (re-exported: the masks are numpy, torch-free)
from ..model_config import ModelConfig, unsupported_feature
from .attention import attend
from .kv_cache import KVCache
from .linear import Embedding, Linear, linear
from .threads import torch_threads


# The block features this decoder computes (lever.model_config.unsupported_feature refuses others).
BLOCK_FIELDS = frozenset({"qk_norm", "sandwich_norms", "activation", "rope_dims", "rope_theta_local",
                          "rope_scaling", "rope_linear", "rope_freq_factors", "rope_attn_factor",
                          "sliding_window", "layer_kinds", "attn_scale", "embed_scale", "logit_softcap"})
ACTIVATIONS = ("silu", "gelu_tanh")


def unsupported(cfg: ModelConfig) -> str | None:
    """The first block feature of `cfg` this decoder cannot compute, as a phrase, or None."""
    return unsupported_feature(cfg, BLOCK_FIELDS, ACTIVATIONS)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Over the last dim (elements) of x, in float32, the result in x's dtype."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def inv_freq(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """float32 [rotary_dims / 2]: `ModelConfig.inv_freq` as a tensor."""
    return torch.tensor(cfg.inv_freq(local), dtype=torch.float32)


def rope_cos_sin(positions: torch.Tensor, freqs: torch.Tensor, dtype: torch.dtype, attn_factor: float = 1.0):
    """cos and sin tables [T, len(freqs)] of the angles position * freq (float32),
    times `attn_factor`, in `dtype`."""
    angles = positions.float()[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    if attn_factor != 1.0:
        cos, sin = cos * attn_factor, sin * attn_factor
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [heads, T, head_dim] by per-token angles (cos / sin [T, half]):
    for i < half, (x[i], x[i + half]) becomes (a cos - b sin, b cos + a sin);
    the dims past 2 * half are left as they are (partial rotary)."""
    half = cos.shape[-1]
    a, b, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin, rest), dim=-1)


def window_mask(mask: torch.Tensor, positions: torch.Tensor, cached: int, window: int) -> torch.Tensor:
    """`mask` [T, cached + T] with every key `window` or more positions behind
    its row hidden: a row at position p sees a key at position k only if
    p - k < window (cache row c < cached holds position c; new row j, positions[j])."""
    keys = torch.cat((torch.arange(cached, dtype=torch.int64), positions.to(torch.int64)))
    return mask & ((positions.to(torch.int64)[:, None] - keys[None, :]) < window)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.scale = cfg.query_scale
        self.qk_norm, self.sandwich_norms = cfg.qk_norm, cfg.sandwich_norms
        self.q_proj = Linear(cfg.hidden_size, cfg.n_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.k_proj = Linear(cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.v_proj = Linear(cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.o_proj = Linear(cfg.n_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        if cfg.sandwich_norms:
            self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, rope, mask, cache: KVCache, layer: int) -> torch.Tensor:
        """rope: (cos, sin) tables of the layer's kind, None on a NoPE layer."""
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(t, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(t, self.n_kv_heads, self.head_dim).transpose(0, 1)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 1), k.transpose(0, 1)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k_all, v_all = cache.write(layer, k, v)
        out = self.o_proj(attend(q, k_all, v_all, mask, self.scale))
        return self.post_norm(out) if self.sandwich_norms else out


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gelu, self.sandwich_norms = cfg.activation == "gelu_tanh", cfg.sandwich_norms
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        if cfg.sandwich_norms:
            self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        out = self.down_proj(gate * self.up_proj(x))
        return self.post_norm(out) if self.sandwich_norms else out


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, mask, cache: KVCache, layer: int) -> torch.Tensor:
        """rope: (cos, sin) [T, rotary_dims / 2] of this layer's kind, or None
        (NoPE); mask: bool [T, cache.length + T] of this layer's kind."""
        x = x + self.self_attn(self.input_layernorm(x), rope, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """The whole model: embedding, decoder layers, final norm, output head.

    `stage_times`: None (default), or a list to which every forward appends
    (stage, seconds) for "embed" (rotary tables, masks + embedding lookup), each
    "layer.N" and "head" (final norm + output projection) -- the profiler's
    hook (`lever.cost.profile`); None costs one `if` per stage.
    """

    stage_times: list | None = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        problem = unsupported(cfg)
        if problem:
            raise UnsupportedModelError(f"the torch reference: {problem} is not supported")
        self.config = cfg
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.compute_dtype = torch.float32   # set by the loader; the dtype of activations
        self.torch_threads: int | None = None  # torch threads during forward (threads.py); None: torch's
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if not cfg.tie_word_embeddings:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    @property
    def dtype(self) -> torch.dtype:
        """Activation dtype: the dense embedding's, else what the loader chose."""
        w = self.embed_tokens.weight
        return w.dtype if w is not None else self.compute_dtype

    def new_cache(self, capacity: int = 256) -> KVCache:
        """A full cache: every layer keeps every row, sliding-window layers too
        (the native cache keeps only their last rows; the numbers are the same)."""
        cfg = self.config
        return KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, self.dtype, capacity)

    def output_weight(self):
        """[vocab, hidden] rows of the output head (the embedding when tied): a
        torch tensor or a `QuantTensor`."""
        if self.config.tie_word_embeddings:
            return self.embed_tokens.table()
        return self.lm_head.qweight if self.lm_head.qweight is not None else self.lm_head.weight

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                cache: KVCache, logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        """Run `T` new tokens through the model and append them to `cache`.

        tokens, positions: int64 [T].  mask: bool [T, cache.length + T] (a
        torch tensor or a numpy array, as `causal_mask` makes), True
        where a new token may attend to a cached row (first `cache.length`
        columns) or to a new token (last T columns); sliding-window layers
        narrow it further.  `logits_rows` picks the rows whose logits are
        wanted (default: all).  Returns float32 logits [len(logits_rows) or
        T, vocab], soft-capped when the config says so.
        """
        with torch_threads(self.torch_threads):
            return self._forward(tokens, positions, mask, cache, logits_rows)

    def layer_inputs(self, positions: torch.Tensor, mask: torch.Tensor, cached: int) -> dict:
        """Layer kind ("g", "l", "n") -> (rope tables or None, mask) of a pass
        at `positions` over `cached` committed rows, for the kinds the model has."""
        cfg = self.config
        kinds = set(cfg.layer_kinds or "g")
        out = {}
        if "g" in kinds:
            out["g"] = (rope_cos_sin(positions, inv_freq(cfg), self.dtype, cfg.rope_attn_factor), mask)
        if "l" in kinds:
            out["l"] = (rope_cos_sin(positions, inv_freq(cfg, local=True), self.dtype, cfg.rope_attn_factor),
                        window_mask(mask, positions, cached, cfg.sliding_window))
        if "n" in kinds:
            out["n"] = (None, mask)
        return out

    def _forward(self, tokens, positions, mask, cache, logits_rows):
        mask = torch.as_tensor(mask)
        t = tokens.shape[0]
        if mask.shape != (t, cache.length + t):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected ({t}, {cache.length + t})")
        cfg = self.config
        cache.reserve(cache.length + t)
        times = self.stage_times
        t0 = time.perf_counter() if times is not None else 0.0
        inputs = self.layer_inputs(positions, mask, cache.length)
        x = self.embed_tokens(tokens, self.dtype)
        if cfg.embed_scale != 1.0:
            x = x * cfg.embed_scale
        if times is not None:
            t0 = lap(times, "embed", t0)
        for i, layer in enumerate(self.layers):
            x = layer(x, *inputs[cfg.kind(i)], cache, i)
            if times is not None:
                t0 = lap(times, f"layer.{i}", t0)
        cache.advance(t)
        if logits_rows is not None:
            x = x[logits_rows]
        logits = linear(self.norm(x), self.output_weight()).float()
        if cfg.logit_softcap > 0:
            logits = torch.tanh(logits / cfg.logit_softcap) * cfg.logit_softcap
        if times is not None:
            lap(times, "head", t0)
        return logits


def lap(times: list, stage: str, t0: float) -> float:
    """Append (stage, seconds since t0) to `times`; returns the current time (seconds)."""
    now = time.perf_counter()
    times.append((stage, now - t0))
    return now
