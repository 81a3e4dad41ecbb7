"""Tiny GGUF files of every architecture family Lever registers (lever.arch),
written with the `gguf` package's GGUFWriter: the family's metadata keys and
tensor names exactly as its module reads them, random weights.

    path = write_arch_gguf(tmp_path / "g.gguf", "gemma3")
    path = write_arch_gguf(tmp_path / "p.gguf", "phi3", longrope=True, matrix_type="Q8_0")

Per family (the block features each turns on, see lever/arch/<family>.py):

- llama: separate q / k / v, gate / up (q / k rows as llama.cpp stores them:
  the loaders undo the interleave, so random rows are as good as any);
  `rope_freqs=True` adds the llama3 `rope_freqs` tensor;
- qwen2: q / k / v biases;
- qwen3: q / k head norms, attention.key_length (head_dim 32, not hidden / heads);
- gemma3: q / k norms, post-attention and post-FFN norms, a tied head, six
  layers whose last is global (the default pattern) under a sliding window,
  the local RoPE base (rope.freq_base_swa), linear RoPE scaling, a final
  logit soft-cap;
- phi3: fused attn_qkv and gate+up ffn_up, partial rotary
  (rope.dimension_count 12 of head_dim 16), a tied head; `longrope=True`
  adds rope_factors_short / rope_factors_long, rope.scaling.attn_factor and
  rope.scaling.original_context_length;
- smollm3: Llama's layout over four layers (the fourth is NoPE).

Sizes are small (vocabulary 97, hidden 64, four heads over two kv heads);
norm weights are 1 + noise, everything else noise of `std`.  matrix_type:
the ggml type of every matrix ("F32" by default: the decoders then agree to
float rounding; "Q8_0" etc. need the matrices' columns to be multiples of
32, which these sizes are).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

VOCAB, HIDDEN, FF, HEADS, KV_HEADS, CONTEXT = 97, 64, 96, 4, 2, 256
LAYERS = {"llama": 3, "qwen2": 3, "qwen3": 3, "gemma3": 6, "phi3": 3, "smollm3": 4}
WINDOW = 4                       # gemma3's sliding window (tokens)
PHI3_ROPE_DIMS = 12              # phi3's rotated dims per head (of 16)
QWEN3_HEAD_DIM = 32              # qwen3's attention.key_length (hidden / heads is 16)
LLAMA3_FACTORS = (1.0, 1.0, 1.0, 2.0, 2.5, 4.0, 6.0, 8.0)        # rope_freqs, one per rotated pair of 16


def write_arch_gguf(path: Path, arch: str, *, seed: int = 0, matrix_type: str = "F32", std: float = 0.2,
                    rope_freqs: bool = False, longrope: bool = False, layers: int | None = None) -> Path:
    """A tiny GGUF of family `arch` at `path` (see the module docstring); returns `path`.
    layers: the block count (default LAYERS[arch])."""
    if arch not in LAYERS:
        raise ValueError(f"no tiny GGUF recipe for architecture {arch!r} (known: {', '.join(LAYERS)})")
    if rope_freqs and arch != "llama":
        raise ValueError("rope_freqs (llama3 RoPE scaling) is a llama file's tensor")
    if longrope and arch != "phi3":
        raise ValueError("longrope is a phi3 file's")
    n_layers = layers or LAYERS[arch]
    head_dim = QWEN3_HEAD_DIM if arch == "qwen3" else HIDDEN // HEADS
    rope_dims = PHI3_ROPE_DIMS if arch == "phi3" else head_dim
    tied = arch in ("gemma3", "phi3")
    rng = np.random.default_rng(seed)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(n_layers)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6 if arch == "gemma3" else 1e-5)
    w.add_rope_freq_base(1e6 if arch in ("gemma3", "qwen3") else 10000.0)
    w.add_vocab_size(VOCAB)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "phi3":
        w.add_rope_dimension_count(rope_dims)
    if arch == "gemma3":
        w.add_sliding_window(WINDOW)
        w.add_rope_freq_base_swa(10000.0)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)
        w.add_final_logit_softcapping(3.0)
    if longrope:
        w.add_rope_scaling_attn_factors(1.19)
        w.add_rope_scaling_orig_ctx_len(CONTEXT // 2)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)

    def add(name: str, shape: tuple, norm: bool = False) -> None:
        x = (rng.standard_normal(shape) * std).astype(np.float32)
        if norm:
            x += np.float32(1)
        if len(shape) == 2 and matrix_type != "F32":
            qtype = gguf.GGMLQuantizationType[matrix_type]
            q = gguf.quants.quantize(x, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, x)

    def add_values(name: str, values) -> None:
        w.add_tensor(name, np.asarray(values, dtype=np.float32))

    q, kv = HEADS * head_dim, KV_HEADS * head_dim
    add("token_embd.weight", (VOCAB, HIDDEN))
    if rope_freqs:
        add_values("rope_freqs.weight", LLAMA3_FACTORS[:rope_dims // 2])
    if longrope:
        add_values("rope_factors_short.weight", np.linspace(1.0, 3.0, rope_dims // 2))
        add_values("rope_factors_long.weight", np.linspace(2.0, 9.0, rope_dims // 2))
    for i in range(n_layers):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (HIDDEN,), norm=True)
        if arch == "phi3":
            add(b + "attn_qkv.weight", (q + 2 * kv, HIDDEN))
        else:
            add(b + "attn_q.weight", (q, HIDDEN))
            add(b + "attn_k.weight", (kv, HIDDEN))
            add(b + "attn_v.weight", (kv, HIDDEN))
        if arch == "qwen2":
            add(b + "attn_q.bias", (q,))
            add(b + "attn_k.bias", (kv,))
            add(b + "attn_v.bias", (kv,))
        if arch in ("qwen3", "gemma3"):
            add(b + "attn_q_norm.weight", (head_dim,), norm=True)
            add(b + "attn_k_norm.weight", (head_dim,), norm=True)
        add(b + "attn_output.weight", (HIDDEN, q))
        if arch == "gemma3":
            add(b + "post_attention_norm.weight", (HIDDEN,), norm=True)
        add(b + "ffn_norm.weight", (HIDDEN,), norm=True)
        if arch == "phi3":
            add(b + "ffn_up.weight", (2 * FF, HIDDEN))
        else:
            add(b + "ffn_gate.weight", (FF, HIDDEN))
            add(b + "ffn_up.weight", (FF, HIDDEN))
        add(b + "ffn_down.weight", (HIDDEN, FF))
        if arch == "gemma3":
            add(b + "post_ffw_norm.weight", (HIDDEN,), norm=True)
    add("output_norm.weight", (HIDDEN,), norm=True)
    if not tied:
        add("output.weight", (VOCAB, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
