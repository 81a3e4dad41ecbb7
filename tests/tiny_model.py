"""A tiny synthetic GGUF model (random weights) and a store of it, for fast
format tests: 2 layers, hidden size 64, vocabulary 64, Q8_0 matrices and F32
norms, written with the `gguf` package. Builds in well under a second."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import gguf
import numpy as np
import pytest

if TYPE_CHECKING:
    import torch

D, FF, VOCAB, HEADS, KV_HEADS, LAYERS = 64, 96, 64, 4, 2, 2
TOKENS = [1, 5, 9, 33, 2]


def write_tiny_gguf(path: Path, arch: str = "llama", tied: bool = True, seed: int = 0,
                    matrix_type: str = "Q8_0", *, vocab: int = VOCAB, hidden: int = D, ff: int = FF,
                    heads: int = HEADS, kv_heads: int = KV_HEADS, layers: int = LAYERS, context: int = 256,
                    std: float = 0.2, noise: float = 0.0, noise_seed: int = 1,
                    rope_theta: float = 10000.0) -> Path:
    """A 2-layer `arch` model; `tied`: no output.weight (the head is the embedding);
    matrix_type: the ggml type of every matrix ("Q8_0", "F32", "F16", "BF16", "Q4_1", ...).

    vocab, hidden, ff, heads, kv_heads, layers, context (tokens): the sizes
    (quantised matrices need hidden and ff to be multiples of the block, 32).
    std: the weights' standard deviation (norms and biases are 1 + that).
    noise > 0: a perturbed copy of the model `seed` gives -- every tensor plus
    Gaussian noise of `noise` times its standard deviation, drawn from
    `noise_seed` -- a weaker draft for that model with the same vocabulary."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(rope_theta)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(vocab)])
    w.add_token_types([1] * vocab)
    rng = np.random.default_rng(seed)
    perturb = np.random.default_rng(noise_seed) if noise > 0 else None
    hd = hidden // heads

    def add(name, shape, quantize=True):
        x = (rng.standard_normal(shape) * std).astype(np.float32)
        if perturb is not None:
            x = x + (perturb.standard_normal(shape) * noise * x.std()).astype(np.float32)
        if len(shape) == 1:
            x = 1.0 + x                     # norms near 1
        if quantize and len(shape) == 2 and matrix_type != "F32":
            qtype = gguf.GGMLQuantizationType[matrix_type]
            q = gguf.quants.quantize(x, qtype)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qtype)
        else:
            w.add_tensor(name, x)

    add("token_embd.weight", (vocab, hidden))
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", (hidden,))
        add(f"blk.{i}.attn_q.weight", (heads * hd, hidden))
        add(f"blk.{i}.attn_k.weight", (kv_heads * hd, hidden))
        add(f"blk.{i}.attn_v.weight", (kv_heads * hd, hidden))
        if arch == "qwen2":
            add(f"blk.{i}.attn_q.bias", (heads * hd,))
            add(f"blk.{i}.attn_k.bias", (kv_heads * hd,))
            add(f"blk.{i}.attn_v.bias", (kv_heads * hd,))
        add(f"blk.{i}.attn_output.weight", (hidden, heads * hd))
        add(f"blk.{i}.ffn_norm.weight", (hidden,))
        add(f"blk.{i}.ffn_gate.weight", (ff, hidden))
        add(f"blk.{i}.ffn_up.weight", (ff, hidden))
        add(f"blk.{i}.ffn_down.weight", (hidden, ff))
    add("output_norm.weight", (hidden,))
    if not tied:
        add("output.weight", (vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_logits(path) -> torch.Tensor:
    """Float32 logits of TOKENS through the in-memory GGUF decoder."""
    import torch

    from lever.reference.decoder import causal_mask
    from lever.reference.gguf_loader import load_gguf_model
    model, _ = load_gguf_model(path, torch.float32)
    n = len(TOKENS)
    return model(torch.tensor(TOKENS), torch.arange(n), causal_mask(n, 0), model.new_cache())


def causal(n_new: int, n_cached: int = 0) -> np.ndarray:
    """Bool mask [n_new, n_cached + n_new]: every token sees the cache and the tokens before it."""
    return np.tri(n_new, n_cached + n_new, n_cached, dtype=bool)


def native_logits(path) -> np.ndarray:
    """Float32 logits of TOKENS through the native decoder over the GGUF at `path`
    (float32 KV cache)."""
    from lever.model.native_loader import load_gguf_native
    model, _ = load_gguf_native(path, "float32")
    n = len(TOKENS)
    return model(np.array(TOKENS), np.arange(n), causal(n), model.new_cache())


def native_pair(directory, arch: str, tied: bool, seed: int, noise: float, dtype: str = "float32",
                matrix_type: str = "F32", **sizes):
    """A random GGUF target (write_tiny_gguf, model `seed`) and a weaker draft
    with the same vocabulary (the target plus relative noise `noise`), on the
    native decoder with a `dtype` KV cache.  sizes: write_tiny_gguf's keywords."""
    from lever.model.native_loader import load_gguf_native
    common = dict(arch=arch, tied=tied, seed=seed, matrix_type=matrix_type, **sizes)
    target = write_tiny_gguf(Path(directory) / "target.gguf", **common)
    draft = write_tiny_gguf(Path(directory) / "draft.gguf", noise=noise, noise_seed=seed + 1, **common)
    return load_gguf_native(target, dtype)[0], load_gguf_native(draft, dtype)[0]


def store_logits(store) -> np.ndarray:
    """Float32 logits of TOKENS through a StreamedDecoder over `store` (float32 KV
    cache; budget for everything but the minimum ring: both paths are exercised)."""
    from lever.model.streamed_decoder import StreamedDecoder
    model = StreamedDecoder(store, 64 << 20, "float32", kv_tokens=64)
    try:
        n = len(TOKENS)
        return model(np.array(TOKENS), np.arange(n), causal(n), model.new_cache())
    finally:
        model.close()


# -- GGUF header surgery -------------------------------------------------------

_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def header_fields(path) -> list[tuple[str, int, int]]:
    """(label, byte offset, size in bytes) of every integer field of the header
    of a well-formed GGUF: counts, key/name lengths, value types, scalar
    values, array types and counts, tensor dims, types and offsets."""
    import struct
    data = Path(path).read_bytes()
    out, pos = [], 8

    def u(fmt, label):
        nonlocal pos
        size = struct.calcsize(fmt)
        out.append((label, pos, size))
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += size
        return v

    def string(label):
        nonlocal pos
        n = u("<Q", f"{label} length")
        s = data[pos:pos + n].decode()
        pos += n
        return s

    def value(vtype, label):
        nonlocal pos
        if vtype in _SCALAR:
            u({1: "<B", 2: "<H", 4: "<I", 8: "<Q"}[_SCALAR[vtype]], f"{label} value")
        elif vtype == 8:
            string(f"{label} string")
        else:
            etype = u("<I", f"{label} array type")
            count = u("<Q", f"{label} array count")
            for i in range(count):
                value(etype, f"{label}[{i}]")

    n_tensors, n_kv = u("<Q", "tensor count"), u("<Q", "kv count")
    for _ in range(n_kv):
        key = string("key")
        out[-1] = (f"{key} key length", *out[-1][1:])
        value(u("<I", f"{key} type"), key)
    for _ in range(n_tensors):
        name = string("name")
        out[-1] = (f"{name} name length", *out[-1][1:])
        n_dims = u("<I", f"{name} n_dims")
        for i in range(n_dims):
            u("<Q", f"{name} dim{i}")
        u("<I", f"{name} type")
        u("<Q", f"{name} offset")
    return out


def field(path, label) -> tuple[int, int]:
    """(offset, size) of header field `label` (see header_fields)."""
    for name, off, size in header_fields(path):
        if name == label:
            return off, size
    raise KeyError(label)


def poke(path, label, value: int) -> None:
    """Overwrite integer header field `label` with `value` (little endian)."""
    off, size = field(path, label)
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(int(value).to_bytes(size, "little", signed=value < 0))


def peek(path, label) -> int:
    off, size = field(path, label)
    with open(path, "rb") as f:
        f.seek(off)
        return int.from_bytes(f.read(size), "little")


def poke_f32(path, label, value: float) -> None:
    """Overwrite the float32 header field `label` with `value`."""
    import struct
    off, _ = field(path, label)
    with open(path, "r+b") as f:
        f.seek(off)
        f.write(struct.pack("<f", value))


def run_with_alarm(fn, seconds: int = 20):
    """fn() with a SIGALRM safety net (waiting.deadline(seconds)): a hang fails as TimeoutError
    (not a LeverError)."""
    import math
    import signal

    from waiting import deadline
    limit = math.ceil(deadline(seconds))

    def on_alarm(signum, frame):
        raise TimeoutError(f"no answer within {limit} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def lever_error_of(fn, seconds: int = 20):
    """The LeverError fn() raises (None if it returns); any other exception propagates."""
    from lever.errors import LeverError
    try:
        run_with_alarm(fn, seconds)
    except LeverError as e:
        assert len(str(e).splitlines()) == 1, f"not one line: {e}"
        return e
    return None


def _cgroup_skip_reason():
    from lever.errors import CgroupUnavailableError
    from lever.memory import cgroup
    try:
        cgroup.find_controller()
    except CgroupUnavailableError as e:
        return str(e)
    return None


# Tests that run a process under a memory cgroup (root and a memory controller), else skipped with the reason.
needs_cgroup = pytest.mark.skipif(_cgroup_skip_reason() is not None, reason=f"{_cgroup_skip_reason()}")
