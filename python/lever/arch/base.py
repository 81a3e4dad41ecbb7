"""What a family module provides: a `Family`, built from a `Meta`.

A family maps its GGUF file onto `ModelConfig` in two parts:
- `describe(meta) -> dict`: the ModelConfig fields its metadata sets beyond
  the common ones every family shares (`common_fields`);
- its tensor layout: which GGUF tensors of a layer hold which decoder
  tensors (`layer_parts`), including fused ones split by rows (Phi-3's
  attn_qkv and gate+up ffn_up) and the q/k rows llama.cpp interleaves for
  `llama` files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from ..model_config import ModelConfig, layer_shapes

# GGUF tensor name within a layer -> decoder tensor name (one to one)
STANDARD_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "post_attention_norm.weight": "self_attn.post_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "mlp.post_norm.weight",
}
GLOBAL_TENSORS = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}


class Meta(Protocol):
    """The metadata of one GGUF file, as the reader hands it to a family.
    Keys are given without the "<arch>." prefix."""

    arch: str
    source: str                                          # the file's name, for messages

    def has(self, key: str) -> bool: ...
    def int(self, key: str, default=None) -> int: ...
    def float(self, key: str, default=None) -> float: ...
    def str(self, key: str, default=None) -> str: ...
    def array(self, key: str) -> list | None: ...
    def has_tensor(self, name: str) -> bool: ...
    def tensor_values(self, name: str) -> list[float]: ...   # a small F32 / F16 tensor's values
    def refuse(self, what: str) -> Exception: ...            # UnsupportedModelError naming the file


@dataclass(frozen=True)
class TensorPart:
    """Rows `rows` (first, end; None: all) of GGUF tensor blk.N.`gguf` are the
    decoder tensor layers.N.`name`; `permuted_heads`: llama.cpp interleaved
    the rows of each of that many heads for its RoPE (undo with
    lever.gguf.config.qk_row_order), None if not."""

    gguf: str
    name: str
    rows: tuple[int, int] | None = None
    permuted_heads: int | None = None


@dataclass(frozen=True)
class Family:
    """One architecture (see the module docstring).

    name: the GGUF `general.architecture`; hf_model_type: transformers'
    model_type for the same decoder (the reference checks).
    describe(meta) -> the ModelConfig fields beyond `common_fields`.
    fused_qkv: q, k, v may be the row blocks of one `attn_qkv` tensor (when
    the file has one); fused_gate_up: gate and up may be the two halves of
    `ffn_up`, gate first (when the file has no `ffn_gate`).
    permutes_qk: llama.cpp stored q / k rows interleaved per head."""

    name: str
    hf_model_type: str
    describe: Callable[[Meta], dict]
    fused_qkv: bool = False
    fused_gate_up: bool = False
    permutes_qk: bool = False

    def layer_parts(self, cfg: ModelConfig, present: Callable[[str], bool]) -> list[TensorPart]:
        """Every decoder tensor of one layer and where it lies in the GGUF
        layer; present(gguf name within a layer) tells whether the file has
        an optional tensor (biases)."""
        names = dict(STANDARD_LAYER)
        q, kv, ff = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.intermediate_size
        parts = []
        wanted = set(_layer_names(cfg))
        if self.fused_qkv and present("attn_qkv.weight"):
            for name, rows in (("q", (0, q)), ("k", (q, q + kv)), ("v", (q + kv, q + 2 * kv))):
                parts.append(TensorPart("attn_qkv.weight", f"self_attn.{name}_proj.weight", rows))
            for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight"):
                names.pop(n)
        if self.fused_gate_up and not present("ffn_gate.weight"):
            parts.append(TensorPart("ffn_up.weight", "mlp.gate_proj.weight", (0, ff)))
            parts.append(TensorPart("ffn_up.weight", "mlp.up_proj.weight", (ff, 2 * ff)))
            names.pop("ffn_gate.weight")
            names.pop("ffn_up.weight")
        for gguf, name in names.items():
            if name not in wanted:
                continue
            heads = None
            if self.permutes_qk and name.startswith("self_attn.q_proj."):
                heads = cfg.n_heads
            elif self.permutes_qk and name.startswith("self_attn.k_proj."):
                heads = cfg.n_kv_heads
            parts.append(TensorPart(gguf, name, None, heads))
        order = {n: i for i, n in enumerate(_layer_names(cfg))}
        return sorted(parts, key=lambda p: order[p.name])


def _layer_names(cfg: ModelConfig) -> list[str]:
    return list(layer_shapes(cfg))


def common_fields(meta: Meta) -> dict:
    """The ModelConfig fields every family reads the same way (Llama's keys)."""
    hidden, n_heads = meta.int("embedding_length"), meta.int("attention.head_count")
    head_dim = meta.int("attention.key_length", hidden // n_heads if n_heads > 0 and hidden % n_heads == 0 else 0)
    rope_dims = meta.int("rope.dimension_count", head_dim)
    return dict(
        arch=meta.arch,
        hidden_size=hidden,
        intermediate_size=meta.int("feed_forward_length"),
        n_layers=meta.int("block_count"),
        n_heads=n_heads,
        n_kv_heads=meta.int("attention.head_count_kv", n_heads),
        head_dim=head_dim,
        rms_norm_eps=meta.float("attention.layer_norm_rms_epsilon"),
        rope_theta=meta.float("rope.freq_base", 10000.0),
        max_context=meta.int("context_length"),
        rope_dims=0 if rope_dims == head_dim else rope_dims,
    )


def rope_scaling_fields(meta: Meta, allowed: tuple[str, ...]) -> dict:
    """The ModelConfig fields of `rope.scaling.*` and a `rope_freqs` tensor;
    a scaling type outside `allowed` is refused in one line."""
    kind = meta.str("rope.scaling.type", "none") or "none"
    out = {}
    if meta.has_tensor("rope_freqs.weight"):
        out.update(rope_scaling="llama3", rope_freq_factors=tuple(meta.tensor_values("rope_freqs.weight")))
        if "llama3" not in allowed:
            raise meta.refuse("a rope_freqs tensor (llama3 RoPE scaling) is not supported for this architecture")
        if kind not in ("none", "llama3"):
            raise meta.refuse(f"RoPE scaling {kind!r} together with rope_freqs is not supported")
        return out
    if kind == "none":
        return out
    if kind not in allowed:
        raise meta.refuse(f"RoPE scaling {kind!r} is not supported (supported: "
                          f"{', '.join(k for k in allowed)})")
    if kind == "linear":
        factor = meta.float("rope.scaling.factor", 1.0)
        if factor != 1.0:
            out.update(rope_scaling="linear", rope_linear=factor)
    return out
