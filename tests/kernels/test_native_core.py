"""The native model core (csrc/model via lever._native): one decoder layer
against the torch reference `DecoderLayer`, bitwise row independence (a
token verified in a tree gets the numbers it gets decoded alone), the KV
cache (compact / truncate / reserve / overflow), embedding, final norm,
head linear, running argmax and running top-k, and the layer layout checks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from lever import _native
from lever.reference.decoder import DecoderLayer, RMSNorm, inv_freq, rope_cos_sin
from lever.reference.kv_cache import KVCache as TorchKVCache
from lever.reference.linear import QuantTensor
from lever.topk_head import EMPTY_ID, topk_result, topk_state
from lever.model_config import ModelConfig
from lever.sampling import log_softmax

F32, F16, Q8_0, BF16 = 0, 1, 8, 30
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FF = 64, 4, 2, 32, 96
EPS, THETA = 1e-5, 10000.0

MATRICES = {  # name -> (rows, cols)
    "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
    "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
    "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
    "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
    "mlp.gate_proj.weight": (FF, HIDDEN),
    "mlp.up_proj.weight": (FF, HIDDEN),
    "mlp.down_proj.weight": (HIDDEN, FF),
}
NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight")
BIASES = {"self_attn.q_proj.bias": HEADS * HEAD_DIM, "self_attn.k_proj.bias": KV_HEADS * HEAD_DIM,
          "self_attn.v_proj.bias": KV_HEADS * HEAD_DIM}


# -- building layers ----------------------------------------------------------

def bf16_bytes(x: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16 (nearest even), as uint16 bits."""
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def encode(x: np.ndarray, qtype: int) -> tuple[np.ndarray, np.ndarray]:
    """(bytes of x as ggml `qtype`, the fp32 values those bytes hold)."""
    if qtype == F32:
        raw = np.ascontiguousarray(x, np.float32)
        return raw.view(np.uint8).reshape(-1), raw
    if qtype == F16:
        raw = x.astype(np.float16)
        return raw.view(np.uint8).reshape(-1), raw.astype(np.float32)
    if qtype == BF16:
        raw = bf16_bytes(x)
        return raw.view(np.uint8).reshape(-1), (raw.astype(np.uint32) << 16).view(np.float32)
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType(qtype))
    values = np.empty(x.size, np.float32)
    _native.dequantize(raw.reshape(-1), qtype, values)
    return raw.reshape(-1), values.reshape(x.shape)


class Layer:
    """Random weights of one layer: a packed byte buffer + LayerLayout for the
    native core, and the same values for the torch reference."""

    def __init__(self, seed: int, matrix_type: int = Q8_0, vector_type: int = F32, bias: bool = False):
        rng = np.random.default_rng(seed)
        self.tensors = {}   # name -> (bytes, ggml type, shape, fp32 values)
        for name, shape in MATRICES.items():
            raw, values = encode((rng.standard_normal(shape) * 0.15).astype(np.float32), matrix_type)
            self.tensors[name] = (raw, matrix_type, shape, values)
        vectors = {n: (HIDDEN,) for n in NORMS}
        if bias:
            vectors.update({n: (rows,) for n, rows in BIASES.items()})
        for name, shape in vectors.items():
            x = (rng.standard_normal(shape) * 0.2).astype(np.float32)
            if name in NORMS:
                x += 1.0
            raw, values = encode(x, vector_type)
            self.tensors[name] = (raw, vector_type, shape, values)
        entries, parts, offset = [], [], 0
        for name, (raw, qtype, shape, _) in self.tensors.items():
            offset += -offset % 32                      # 32-byte aligned, like the loader
            parts.append((offset, raw))
            entries.append((name, offset, qtype, shape))
            offset += raw.nbytes
        self.buffer = np.zeros(offset, np.uint8)
        for at, raw in parts:
            self.buffer[at:at + raw.nbytes] = raw
        self.entries = entries
        self.layout = _native.LayerLayout(entries)

    def torch_layer(self) -> DecoderLayer:
        cfg = ModelConfig(arch="qwen2" if "self_attn.q_proj.bias" in self.tensors else "llama",
                          vocab_size=64, hidden_size=HIDDEN, intermediate_size=FF, n_layers=1,
                          n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, rms_norm_eps=EPS,
                          rope_theta=THETA, max_context=256, tie_word_embeddings=True,
                          attention_bias="self_attn.q_proj.bias" in self.tensors)
        layer = DecoderLayer(cfg)
        layer.config = cfg
        modules = dict(layer.named_modules())
        with torch.no_grad():
            for name, (raw, qtype, shape, values) in self.tensors.items():
                module, attr = modules[name.rsplit(".", 1)[0]], name.rsplit(".", 1)[1]
                if attr == "weight" and len(shape) == 2 and qtype == Q8_0:
                    module.set_quantized(QuantTensor(raw, qtype, shape))
                else:
                    getattr(module, attr).copy_(torch.from_numpy(values.reshape(shape)))
        return layer


def native_model() -> _native.NativeModel:
    return _native.NativeModel(HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FF, EPS, THETA)


def causal(t: int, cached: int) -> np.ndarray:
    return np.tril(np.ones((t, cached + t), bool), k=cached)


def tree_mask(parents: list[int], cached: int) -> np.ndarray:
    """Bool [T, cached + T]: each node sees the cache, its ancestors and itself."""
    t = len(parents)
    mask = np.zeros((t, cached + t), bool)
    mask[:, :cached] = True
    for i in range(t):
        j = i
        while j >= 0:
            mask[i, cached + j] = True
            j = parents[j]
    return mask


def run_pass(model, layers, x, positions, mask, cache):
    """One native pass through `layers`; returns the final residual stream."""
    x = np.ascontiguousarray(x, np.float32).copy()
    model.begin_pass(np.asarray(positions, np.int64), mask, cache)
    for i, layer in enumerate(layers):
        model.layer(x, layer.layout, layer.buffer, cache, i)
    model.end_pass(cache)
    return x


def inputs(seed: int, t: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((t, HIDDEN)).astype(np.float32)


# -- one layer against the torch reference -------------------------------------

PASSES = [  # (positions, mask builder) -- a causal prefill, then a tree over it
    (np.arange(5), lambda cached: causal(5, cached)),
    (np.array([5, 6, 6, 7]), lambda cached: tree_mask([-1, 0, 0, 1], cached)),
]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("matrix_type,vector_type,tol", [
    (Q8_0, F32, 2e-4), (F32, F32, 2e-5), (BF16, BF16, 2e-5), (F16, F16, 2e-5)])
def test_layer_matches_torch(arch, matrix_type, vector_type, tol):
    layer = Layer(1, matrix_type, vector_type, bias=arch == "qwen2")
    ref = layer.torch_layer()
    model = native_model()
    cache = _native.KVCache(1, KV_HEADS, HEAD_DIM, 16, "float32")
    ref_cache = TorchKVCache(1, KV_HEADS, HEAD_DIM, torch.float32, 16)
    for step, (positions, make_mask) in enumerate(PASSES):
        x = inputs(step, len(positions))
        mask = make_mask(cache.length)
        got = run_pass(model, [layer], x, positions, mask, cache)
        rope = rope_cos_sin(torch.from_numpy(positions), inv_freq(ref.config), torch.float32)
        with torch.no_grad():
            want = ref(torch.from_numpy(x), rope, torch.from_numpy(mask), ref_cache, 0)
        ref_cache.advance(len(positions))
        scale = float(want.abs().max())
        np.testing.assert_allclose(got, want.numpy(), rtol=tol, atol=tol * scale)
        assert cache.length == ref_cache.length
        k, v = cache.layer_rows(0)
        np.testing.assert_allclose(k, ref_cache._k[0, :, :cache.length].numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(v, ref_cache._v[0, :, :cache.length].numpy(), rtol=tol, atol=tol)


def test_bf16_cache_holds_the_rounded_fp32_rows():
    layer = Layer(2)
    x, positions = inputs(0, 6), np.arange(6)
    caches = {d: _native.KVCache(1, KV_HEADS, HEAD_DIM, 8, d) for d in ("float32", "bfloat16")}
    out = {d: run_pass(native_model(), [layer], x, positions, causal(6, 0), c) for d, c in caches.items()}
    k32, v32 = caches["float32"].layer_rows(0)
    k16, v16 = caches["bfloat16"].layer_rows(0)
    round_bf16 = lambda a: (bf16_bytes(a).astype(np.uint32) << 16).view(np.float32)
    assert np.array_equal(k16, round_bf16(k32)) and np.array_equal(v16, round_bf16(v32))
    assert caches["bfloat16"].nbytes * 2 == caches["float32"].nbytes
    assert caches["bfloat16"].dtype == "bfloat16"
    scale = float(np.abs(out["float32"]).max())
    np.testing.assert_allclose(out["bfloat16"], out["float32"], rtol=2e-2, atol=2e-2 * scale)


# -- bitwise row independence ---------------------------------------------------

@pytest.mark.parametrize("matrix_type,kv_dtype", [(Q8_0, "float32"), (BF16, "bfloat16")])
def test_tree_rows_equal_sequential_decoding(matrix_type, kv_dtype):
    """Node 4 of the tree (path 0 -> 2 -> 4) gets bitwise the output it gets
    when the path is decoded token by token, through two layers."""
    layers = [Layer(10, matrix_type), Layer(11, matrix_type)]
    prefix, parents = inputs(0, 7), [-1, 0, 0, 1, 2, 3]
    tree_x = inputs(1, len(parents))
    depth = [0, 1, 1, 2, 2, 3]
    model = native_model()

    def prefilled():
        cache = _native.KVCache(2, KV_HEADS, HEAD_DIM, 8, kv_dtype)
        cache.reserve(32)
        run_pass(model, layers, prefix, np.arange(7), causal(7, 0), cache)
        return cache

    tree_cache = prefilled()
    tree_out = run_pass(model, layers, tree_x, 7 + np.array(depth), tree_mask(parents, 7), tree_cache)

    seq_cache = prefilled()
    for node in (0, 2, 4):
        out = run_pass(model, layers, tree_x[node:node + 1], [7 + depth[node]], causal(1, seq_cache.length), seq_cache)
        assert np.array_equal(out[0], tree_out[node]), f"node {node} differs"
    # the path's cache rows match too, after compacting the tree's cache to the path
    tree_cache.compact(np.array([*range(7), 7, 9, 11], np.int64))
    for i in range(2):
        for a, b in zip(tree_cache.layer_rows(i), seq_cache.layer_rows(i)):
            assert np.array_equal(a, b)


def test_head_rows_are_independent():
    rng = np.random.default_rng(3)
    h = rng.standard_normal((9, HIDDEN)).astype(np.float32)
    for qtype in (Q8_0, BF16, F32):
        w, _ = encode((rng.standard_normal((301, HIDDEN)) * 0.1).astype(np.float32), qtype)
        many = np.empty((9, 301), np.float32)
        _native.linear(h, w, qtype, 301, many)
        for r in range(9):
            one = np.empty((1, 301), np.float32)
            _native.linear(h[r:r + 1], w, qtype, 301, one)
            assert np.array_equal(one[0], many[r])


# -- KV cache --------------------------------------------------------------------

def filled_cache(n: int = 8, capacity: int = 8, dtype: str = "float32"):
    layers = [Layer(20), Layer(21)]
    cache = _native.KVCache(2, KV_HEADS, HEAD_DIM, capacity, dtype)
    run_pass(native_model(), layers, inputs(5, n), np.arange(n), causal(n, 0), cache)
    return cache


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_compact_moves_only_displaced_rows(dtype):
    cache = filled_cache(dtype=dtype)
    before = [cache.layer_rows(i) for i in range(2)]
    cache.compact(np.array([0, 1, 2], np.int64))         # a prefix: nothing moves
    assert cache.length == 3 and cache.rows_moved == 0
    cache = filled_cache(dtype=dtype)
    keep = np.array([0, 1, 2, 5, 7], np.int64)
    cache.compact(keep)
    assert cache.length == 5 and cache.rows_moved == 2
    for i in range(2):
        for got, old in zip(cache.layer_rows(i), before[i]):
            assert np.array_equal(got, old[:, keep])


@pytest.mark.parametrize("keep", [[0, 2, 2], [3, 1], [0, 8], [-1, 2]])
def test_compact_rejects_bad_keep(keep):
    cache = filled_cache()
    before = cache.layer_rows(0)
    with pytest.raises(ValueError):
        cache.compact(np.array(keep, np.int64))
    assert cache.length == 8 and cache.rows_moved == 0
    assert all(np.array_equal(a, b) for a, b in zip(cache.layer_rows(0), before))


def test_truncate_reserve_and_overflow():
    cache = filled_cache(n=6, capacity=6)
    before = cache.layer_rows(1)
    assert cache.nbytes == 2 * 2 * KV_HEADS * 6 * HEAD_DIM * 4
    cache.truncate(4)
    assert cache.length == 4
    with pytest.raises(ValueError):
        cache.truncate(5)
    with pytest.raises(ValueError):
        cache.truncate(-1)
    model = native_model()
    with pytest.raises(RuntimeError, match="KV cache overflow: 7 rows > capacity 6"):
        model.begin_pass(np.arange(3, dtype=np.int64), causal(3, 4), cache)
    cache.reserve(7)
    assert cache.capacity >= 7 and cache.length == 4
    assert cache.nbytes == 2 * 2 * KV_HEADS * cache.capacity * HEAD_DIM * 4
    assert all(np.array_equal(a, b[:, :4]) for a, b in zip(cache.layer_rows(1), before))
    cache.reserve(3)                                      # never shrinks
    assert cache.capacity >= 7


def test_pass_misuse_is_rejected():
    layer = Layer(30)
    model = native_model()
    cache = _native.KVCache(1, KV_HEADS, HEAD_DIM, 8)
    x = inputs(0, 2)
    with pytest.raises(ValueError, match="begin_pass"):
        model.layer(x, layer.layout, layer.buffer, cache, 0)
    with pytest.raises(ValueError, match="mask"):
        model.begin_pass(np.arange(2, dtype=np.int64), causal(2, 1), cache)
    model.begin_pass(np.arange(2, dtype=np.int64), causal(2, 0), cache)
    with pytest.raises(ValueError, match="x"):
        model.layer(inputs(0, 3), layer.layout, layer.buffer, cache, 0)
    with pytest.raises(ValueError, match="layer index"):
        model.layer(x, layer.layout, layer.buffer, cache, 1)
    other = _native.KVCache(1, KV_HEADS, HEAD_DIM, 8)
    with pytest.raises(ValueError, match="cache"):
        model.layer(x, layer.layout, layer.buffer, other, 0)
    with pytest.raises(ValueError, match="kv heads"):
        model.begin_pass(np.arange(2, dtype=np.int64), causal(2, 0), _native.KVCache(1, 1, HEAD_DIM, 8))


# -- embed, norm, head -------------------------------------------------------------

def test_embed_rows():
    rng = np.random.default_rng(4)
    table = (rng.standard_normal((50, HIDDEN))).astype(np.float32)
    model = native_model()
    ids = np.array([3, 0, 49, 3], np.int64)
    for qtype in (Q8_0, BF16, F16, F32):
        raw, values = encode(table, qtype)
        out = np.empty((4, HIDDEN), np.float32)
        model.embed(raw, qtype, 50, ids, out)
        assert np.array_equal(out, values[ids])
    raw, _ = encode(table, Q8_0)
    with pytest.raises(ValueError, match="token id 50"):
        model.embed(raw, Q8_0, 50, np.array([50], np.int64), np.empty((1, HIDDEN), np.float32))
    with pytest.raises(ValueError, match="table"):
        model.embed(raw[:-1], Q8_0, 50, ids, np.empty((4, HIDDEN), np.float32))


def test_rms_norm_matches_torch():
    x = inputs(7, 5) * 3
    w = (1 + np.random.default_rng(0).standard_normal(HIDDEN) * 0.2).astype(np.float32)
    out = np.empty_like(x)
    native_model().rms_norm(x, w, out)
    ref = RMSNorm(HIDDEN, EPS)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(w))
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_linear_writes_a_strided_slice():
    rng = np.random.default_rng(5)
    h = rng.standard_normal((3, HIDDEN)).astype(np.float32)
    w = (rng.standard_normal((100, HIDDEN)) * 0.1).astype(np.float32)
    logits = np.full((3, 250), -7.0, np.float32)
    raw, values = encode(w, F32)
    _native.linear(h, raw, F32, 100, logits[:, 100:200])
    np.testing.assert_allclose(logits[:, 100:200], h @ values.T, rtol=1e-5, atol=1e-5)
    assert (logits[:, :100] == -7).all() and (logits[:, 200:] == -7).all()
    raw, _ = encode(w, Q8_0)
    want = np.empty((3, 100), np.float32)
    _native.quant_matmul(h, raw, Q8_0, want)
    got = np.empty((3, 100), np.float32)
    _native.linear(h, raw, Q8_0, 100, got)
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="bytes"):
        _native.linear(h, raw[:-34], Q8_0, 100, got)


@pytest.mark.parametrize("qtype", [Q8_0, F32, BF16])
def test_argmax_update_equals_argmax_of_logits(qtype):
    rng = np.random.default_rng(6)
    vocab = 12000
    h = rng.standard_normal((4, HIDDEN)).astype(np.float32)
    w = (rng.standard_normal((vocab, HIDDEN)) * 0.1).astype(np.float32)
    w[11600] = w[200] = h[1] * 0.5     # row 1: a tie between 200 and 11600 (first one wins)
    raw, _ = encode(w, qtype)
    logits = np.empty((4, vocab), np.float32)
    _native.linear(h, raw, qtype, vocab, logits)
    assert logits[1, 200] == logits[1, 11600] == logits[1].max()
    best_val = np.full(4, -np.inf, np.float32)
    best_idx = np.full(4, -1, np.int64)
    split, row_bytes = 6800, raw.nbytes // vocab       # two parts, each over the 4096-row chunk size
    _native.argmax_update(h, raw[:split * row_bytes], qtype, split, 0, best_val, best_idx)
    _native.argmax_update(h, raw[split * row_bytes:], qtype, vocab - split, split, best_val, best_idx)
    assert best_idx.tolist() == np.argmax(logits, axis=1).tolist()
    assert best_idx[1] == 200
    assert np.array_equal(best_val, logits.max(axis=1))



def topk_in_parts(h, raw, qtype, vocab, k, cuts):
    """topk_update over the head's rows split at `cuts` (0 < ... < vocab): the final state."""
    state = topk_state(h.shape[0], k)
    row_bytes = raw.nbytes // vocab
    for a, b in zip([0, *cuts], [*cuts, vocab]):
        _native.topk_update(h, raw[a * row_bytes:b * row_bytes], qtype, b - a, a, *state)
    return state


@pytest.mark.parametrize("qtype", [Q8_0, F32, BF16])
def test_topk_update_equals_numpy(qtype):
    rng = np.random.default_rng(7)
    vocab, k = 12000, 6
    h = rng.standard_normal((5, HIDDEN)).astype(np.float32)
    w = (rng.standard_normal((vocab, HIDDEN)) * 0.1).astype(np.float32)
    w[11600] = w[4800] = w[200] = h[1] * 0.5          # row 1: a 3-way tie for the top, across parts
    for i, c in enumerate([1.0, 0.9, 0.8, 0.7, 0.6]):  # row 3: 5 clear leaders, then a tie for the
        w[400 + 1200 * i] = h[3] * c                  # 6th place (10000 and 6000 equal: 6000 wins)
    w[10000] = w[6000] = h[3] * 0.5
    raw, _ = encode(w, qtype)
    logits = np.empty((5, vocab), np.float32)
    _native.linear(h, raw, qtype, vocab, logits)
    assert logits[1, 200] == logits[1, 4800] == logits[1, 11600] == logits[1].max()
    assert logits[3, 6000] == logits[3, 10000]
    best_val, best_idx, run_max, run_sum = topk_in_parts(h, raw, qtype, vocab, k, [4000, 6800])
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]     # value descending, then id
    assert np.array_equal(best_idx, order)
    assert best_idx[1, :3].tolist() == [200, 4800, 11600] and best_idx[3, 5] == 6000
    assert np.array_equal(best_val, np.take_along_axis(logits, order, axis=1))
    assert np.array_equal(run_max, logits.max(axis=1))
    wide = logits.astype(np.float64)
    lse = wide.max(axis=1) + np.log(np.exp(wide - wide.max(axis=1, keepdims=True)).sum(axis=1))
    np.testing.assert_allclose(run_max + np.log(run_sum), lse, rtol=0, atol=1e-6)
    ids, logprobs = topk_result(best_val, best_idx, run_max, run_sum)
    np.testing.assert_allclose(logprobs, np.take_along_axis(log_softmax(logits), order, axis=1), rtol=0, atol=2e-6)
    # however the vocabulary is split, and whichever rows run together: the same bits
    for got in (topk_in_parts(h, raw, qtype, vocab, k, []), topk_in_parts(h, raw, qtype, vocab, k, [1, 11999])):
        for a, b in zip(got, (best_val, best_idx, run_max, run_sum)):
            assert np.array_equal(a, b)
    for r in range(5):
        alone = topk_in_parts(h[r:r + 1], raw, qtype, vocab, k, [4000, 6800])
        for a, b in zip(alone, (best_val, best_idx, run_max, run_sum)):
            assert np.array_equal(a[0], b[r])


def test_topk_update_arguments():
    rng = np.random.default_rng(8)
    h = rng.standard_normal((2, HIDDEN)).astype(np.float32)
    raw, _ = encode((rng.standard_normal((5, HIDDEN)) * 0.1).astype(np.float32), F32)
    best_val, best_idx, run_max, run_sum = topk_state(2, 8)        # k larger than the 5 rows
    _native.topk_update(h, raw, F32, 5, 0, best_val, best_idx, run_max, run_sum)
    assert sorted(best_idx[:, :5].ravel().tolist()) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert (best_idx[:, 5:] == EMPTY_ID).all() and (best_val[:, 5:] == -np.inf).all()
    bad = [((best_val, best_idx[:, :4], run_max, run_sum), "best_idx"),
           ((best_val, best_idx.astype(np.int32), run_max, run_sum), "best_idx"),
           ((best_val[:1], best_idx[:1], run_max, run_sum), "best_val"),
           ((best_val[:, :0], best_idx[:, :0], run_max, run_sum), "best_val"),
           ((best_val, best_idx, run_max, run_sum.astype(np.float32)), "run_sum"),
           ((best_val, best_idx, run_max[:1], run_sum), "run_max")]
    for args, name in bad:
        with pytest.raises(ValueError, match=name):
            _native.topk_update(h, raw, F32, 5, 0, *args)
    with pytest.raises(ValueError, match="bytes"):
        _native.topk_update(h, raw[:-4], F32, 5, 0, best_val, best_idx, run_max, run_sum)

# -- layout errors ---------------------------------------------------------------------

def with_entry(entries, name, **change):
    out = []
    for n, off, qtype, shape in entries:
        if n == name:
            off, qtype, shape = change.get("offset", off), change.get("qtype", qtype), change.get("shape", shape)
        out.append((n, off, qtype, shape))
    return out


def test_good_layouts_pass_the_check():
    model = native_model()
    for layer in (Layer(40), Layer(41, BF16, F16, bias=True)):
        model.check_layout(layer.layout, layer.buffer.nbytes)
        assert [e[0] for e in layer.layout.entries] == [e[0] for e in layer.entries]


@pytest.mark.parametrize("make,match", [
    (lambda e: [x for x in e if x[0] != "mlp.up_proj.weight"], "mlp.up_proj.weight: missing"),
    (lambda e: with_entry(e, "self_attn.k_proj.weight", shape=(HEADS * HEAD_DIM, HIDDEN)),
     "self_attn.k_proj.weight: shape"),
    (lambda e: with_entry(e, "input_layernorm.weight", qtype=Q8_0), "input_layernorm.weight: type"),
    (lambda e: with_entry(e, "mlp.down_proj.weight", qtype=3000), "mlp.down_proj.weight: type"),
    (lambda e: with_entry(e, "mlp.down_proj.weight", offset=10 ** 9), "mlp.down_proj.weight: bytes"),
    (lambda e: e + [("self_attn.q_proj.bias", 0, F32, (HEADS * HEAD_DIM,))], "self_attn.k_proj.bias: missing"),
])
def test_bad_layouts_name_the_tensor(make, match):
    layer = Layer(42)
    layout = _native.LayerLayout(make(layer.entries))
    with pytest.raises(ValueError, match=match):
        native_model().check_layout(layout, layer.buffer.nbytes)


def test_layout_construction_and_buffer_errors():
    layer = Layer(43)
    with pytest.raises(ValueError, match="unknown"):
        _native.LayerLayout(layer.entries + [("self_attn.rotary.weight", 0, F32, (HIDDEN,))])
    with pytest.raises(ValueError, match="twice"):
        _native.LayerLayout(layer.entries + [layer.entries[0]])
    model = native_model()
    last = max(layer.entries, key=lambda e: e[1])[0]
    with pytest.raises(ValueError, match=last):
        model.check_layout(layer.layout, layer.buffer.nbytes - 1)
    cache = _native.KVCache(1, KV_HEADS, HEAD_DIM, 8)
    model.begin_pass(np.arange(1, dtype=np.int64), causal(1, 0), cache)
    with pytest.raises(ValueError, match=last):
        model.layer(inputs(0, 1), layer.layout, layer.buffer[:-1], cache, 0)
    with pytest.raises(ValueError, match="uint8"):
        model.layer(inputs(0, 1), layer.layout, layer.buffer.view(np.int8), cache, 0)
    assert cache.length == 0


def test_bad_model_and_cache_arguments():
    with pytest.raises(ValueError, match="multiple"):
        _native.NativeModel(HIDDEN, 3, 2, HEAD_DIM, FF, EPS, THETA)
    with pytest.raises(ValueError, match="even"):
        _native.NativeModel(HIDDEN, HEADS, KV_HEADS, 15, FF, EPS, THETA)
    with pytest.raises(ValueError, match="dtype"):
        _native.KVCache(1, KV_HEADS, HEAD_DIM, 8, "float16")
    with pytest.raises(ValueError):
        _native.KVCache(0, KV_HEADS, HEAD_DIM, 8)
