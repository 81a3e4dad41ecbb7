"""A Llama / Qwen2 decoder in plain torch.

One forward takes a batch of new tokens of one sequence with explicit
position ids and an explicit boolean attention mask over (cached rows + new
tokens), appends their keys/values to a `KVCache`, and returns logits.
Plain decoding passes a causal mask; tree verification passes a tree mask.

Linear layers and the embedding hold either dense torch weights or quantised
blocks (`lever.reference.linear`): quantised weights are multiplied by the native
kernels without being dequantised.

Parameter names follow Hugging Face (`embed_tokens`, `layers.N.self_attn.q_proj`,
...) minus the `model.` prefix, so checkpoints map onto it one to one.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from ..masks import causal_mask  # noqa: F401 (re-exported: the masks are numpy, torch-free)
from ..model_config import ModelConfig
from .attention import attend
from .kv_cache import KVCache
from .linear import Embedding, Linear, linear
from .threads import torch_threads


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos and sin tables [T, head_dim] for the given positions (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [heads, T, head_dim] by per-token angles (cos/sin [T, head_dim])."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = Linear(cfg.hidden_size, cfg.n_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.k_proj = Linear(cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.v_proj = Linear(cfg.hidden_size, cfg.n_kv_heads * cfg.head_dim, bias=cfg.attention_bias)
        self.o_proj = Linear(cfg.n_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask, cache: KVCache, layer: int) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.n_heads, self.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(t, self.n_kv_heads, self.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(t, self.n_kv_heads, self.head_dim).transpose(0, 1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k_all, v_all = cache.write(layer, k, v)
        return self.o_proj(attend(q, k_all, v_all, mask))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, cache: KVCache, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """The whole model: embedding, decoder layers, final norm, output head.

    `stage_times`: None (default), or a list to which every forward appends
    (stage, seconds) for "embed" (rotary tables + embedding lookup), each
    "layer.N" and "head" (final norm + output projection) -- the profiler's
    hook (`lever.cost.profile`); None costs one `if` per stage.
    """

    stage_times: list | None = None

    def __init__(self, cfg: ModelConfig):
        super().__init__()
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
        columns) or to a new token (last T columns).  `logits_rows` picks the
        rows whose logits are wanted (default: all).  Returns float32 logits
        [len(logits_rows) or T, vocab].
        """
        with torch_threads(self.torch_threads):
            return self._forward(tokens, positions, mask, cache, logits_rows)

    def _forward(self, tokens, positions, mask, cache, logits_rows):
        mask = torch.as_tensor(mask)
        t = tokens.shape[0]
        if mask.shape != (t, cache.length + t):
            raise ValueError(f"mask has shape {tuple(mask.shape)}, expected ({t}, {cache.length + t})")
        cache.reserve(cache.length + t)
        times = self.stage_times
        t0 = time.perf_counter() if times is not None else 0.0
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, self.dtype)
        x = self.embed_tokens(tokens, self.dtype)
        if times is not None:
            t0 = lap(times, "embed", t0)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, mask, cache, i)
            if times is not None:
                t0 = lap(times, f"layer.{i}", t0)
        cache.advance(t)
        if logits_rows is not None:
            x = x[logits_rows]
        logits = linear(self.norm(x), self.output_weight()).float()
        if times is not None:
            lap(times, "head", t0)
        return logits


def lap(times: list, stage: str, t0: float) -> float:
    """Append (stage, seconds since t0) to `times`; returns the current time (seconds)."""
    now = time.perf_counter()
    times.append((stage, now - t0))
    return now

