"""The native decoder (lever.model.native_decoder / native_loader) and the streamed
store on top of it: against the torch reference, streamed == resident bit for bit,
tree rows == the same tokens decoded alone, the argmax and top-k heads, and the loader's memory."""

import mmap
import tracemalloc

import numpy as np
import pytest
import torch

from lever.errors import UnsupportedModelError
from lever.gguf.file import GGUFFile
from lever.reference.gguf_loader import load_gguf_model
from lever.model.native_loader import load_gguf_native
from lever.model.streamed_decoder import EMBED_CACHE_ROWS, StreamedDecoder
from lever.reference.torch_model import load_gguf_torch
from lever.sampling import log_softmax
from lever.store.convert import convert
from lever.store.manifest import StoreManifest
from lever.store.residency import fixed_costs, pass_order, slot_size
from tiny_model import TOKENS, causal, write_tiny_gguf

PROMPT = [1, 504, 3290, 314, 253, 1345, 282, 260, 4004, 30]        # 10 SmolLM2 token ids
ARCHS = [("llama", True), ("qwen2", False)]                         # (arch, tied head)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """{arch: path of a tiny Q8_0 GGUF} (llama tied, qwen2 untied with biases)."""
    d = tmp_path_factory.mktemp("native")
    return {arch: write_tiny_gguf(d / f"{arch}.gguf", arch, tied) for arch, tied in ARCHS}


@pytest.fixture(scope="module")
def tiny_stores(tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("native-stores")
    return {arch: convert(str(g), d / arch, progress=False) for arch, g in tiny.items()}


def decode(forward, ids, steps: int) -> tuple[np.ndarray, list[int]]:
    """Prefill `ids`, then `steps` greedy tokens one at a time through
    forward(tokens, positions, mask) -> float32 logits; returns (every row's
    logits [len(ids) + steps, vocab], the greedy tokens)."""
    n = len(ids)
    rows = [forward(np.array(ids), np.arange(n), causal(n))]
    tokens = []
    for i in range(steps):
        tokens.append(int(np.argmax(rows[-1][-1])))
        rows.append(forward(np.array(tokens[-1:]), np.array([n + i]), causal(1, n + i)))
    return np.concatenate(rows), tokens


def native_forward(model):
    cache = model.new_cache(8)
    return lambda tokens, positions, mask: model(tokens, positions, mask, cache)


def torch_forward(model):
    cache = model.new_cache()
    return lambda tokens, positions, mask: model(torch.from_numpy(tokens), torch.from_numpy(positions),
                                                 torch.from_numpy(mask), cache).numpy()


def assert_close(got: np.ndarray, ref: np.ndarray, rel: float) -> None:
    """Every logit within `rel` of the reference's largest magnitude."""
    scale = float(np.abs(ref).max())
    err = float(np.abs(got - ref).max())
    assert err <= rel * scale, f"max |diff| {err:.4g} > {rel} * {scale:.4g}"


# -- against the torch reference -----------------------------------------------------------

@pytest.mark.parametrize("arch", [a for a, _ in ARCHS])
@pytest.mark.parametrize("matrix_type", ["Q8_0", "Q4_1", "F32", "F16", "BF16"])
def test_tiny_native_equals_torch_reference(tmp_path, arch, matrix_type):
    """llama (tied, q/k rows unpermuted) and qwen2 (untied, q/k/v biases), each
    matrix type the native decoder takes: logits close to the torch decoder's."""
    path = write_tiny_gguf(tmp_path / "m.gguf", arch, tied=arch == "llama", matrix_type=matrix_type)
    ref, _ = load_gguf_model(path, torch.float32, quantized=True)
    model, _ = load_gguf_native(path, "float32")
    want, want_tokens = decode(torch_forward(ref), TOKENS, 6)
    got, got_tokens = decode(native_forward(model), TOKENS, 6)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert_close(got, want, 1e-4)
    assert got_tokens == want_tokens


@pytest.mark.real
def test_smollm2_native_equals_torch_reference(smollm2_path):
    """The real SmolLM2 (llama, tied, Q4_1/Q8_0 blocks): 16 greedy tokens the same,
    logits close.  Both multiply the blocks with 8-bit activations, quantised at
    different points, and where a value lands on a rounding boundary of the 8-bit
    grid depends on torch's own summation order (its CPU kernels differ by ISA).
    Measured: up to ~1.2 of logits up to ~34 on an AVX-512 host, up to 1.84 on an
    AVX2-only host (row maxima 0.5-1.8; the torch quantised and dense paths
    differ by up to 1.4 before their tokens part); a wrong row order or tensor
    differs by 15-30."""
    ref, _ = load_gguf_model(smollm2_path, torch.float32, quantized=True)
    model, _ = load_gguf_native(smollm2_path, "float32")
    want, want_tokens = decode(torch_forward(ref), PROMPT, 16)
    got, got_tokens = decode(native_forward(model), PROMPT, 16)
    assert got_tokens == want_tokens
    assert_close(got, want, 8e-2)


def test_bfloat16_cache_is_close_to_float32(tiny):
    f32, _ = load_gguf_native(tiny["qwen2"], "float32")
    bf16, _ = load_gguf_native(tiny["qwen2"], "bfloat16")
    assert bf16.new_cache(4).dtype == "bfloat16" and f32.new_cache(4).dtype == "float32"
    assert_close(decode(native_forward(bf16), TOKENS, 4)[0], decode(native_forward(f32), TOKENS, 4)[0], 5e-2)


# -- streamed == resident ------------------------------------------------------------------

def budgets(store) -> list[int]:
    """Bytes: the minimum (no layer pinned; two read buffers of `slot_size`), that plus half
    the weights, everything pinned (float32 KV cache for StreamedDecoder's default kv_tokens)."""
    m = StoreManifest.load(store)
    base = sum(fixed_costs(m, 4, 2048, EMBED_CACHE_ROWS).values())
    lo = base + 2 * slot_size(pass_order(m))
    return [lo, lo + m.weights_bytes // 2, base + m.weights_bytes]


def streamed_equals_resident(path, store, steps: int = 3) -> list[int]:
    """Streamed logits == resident native logits, bit for bit, at every budget;
    returns the pinned layer counts."""
    ids = TOKENS if StoreManifest.load(store).config.vocab_size <= 64 else PROMPT
    model, _ = load_gguf_native(path, "float32")
    want, _ = decode(native_forward(model), ids, steps)
    pinned = []
    for budget in budgets(store):
        streamed = StreamedDecoder(store, budget, "float32")
        try:
            got, _ = decode(native_forward(streamed), ids, steps)
            pinned.append(streamed.plan.pinned_layers)
        finally:
            streamed.close()
        assert got.dtype == np.float32
        assert np.array_equal(got, want), f"budget {budget}: max diff {np.abs(got - want).max()}"
    return pinned


@pytest.mark.parametrize("arch", [a for a, _ in ARCHS])
def test_tiny_streamed_equals_resident_bitwise(tiny, tiny_stores, arch):
    pinned = streamed_equals_resident(tiny[arch], tiny_stores[arch])
    assert pinned[0] == 0 and pinned[-1] == 2


@pytest.mark.real
def test_smollm2_streamed_equals_resident_bitwise(smollm2_path, tmp_path_factory):
    store = convert(str(smollm2_path), tmp_path_factory.mktemp("smol") / "store", progress=False)
    assert len(StoreManifest.load(store).head_parts) > 1            # the head is split into parts
    pinned = streamed_equals_resident(smollm2_path, store, steps=2)
    assert pinned[0] == 0 and 0 < pinned[1] < 30 and pinned[2] == 30


def test_bf16_store_streams_its_bf16_matrices(tiny, tmp_path):
    """A bf16 store's dense matrices are multiplied in place, the same at every budget."""
    store = convert(str(tiny["qwen2"]), tmp_path / "bf16", storage="bf16", progress=False)
    outs = []
    for budget in budgets(store)[::2]:
        model = StreamedDecoder(store, budget, "float32")
        outs.append(decode(native_forward(model), TOKENS, 2)[0])
        model.close()
    assert np.array_equal(outs[0], outs[1])
    ref, _ = load_gguf_native(tiny["qwen2"], "float32")
    assert_close(outs[0], decode(native_forward(ref), TOKENS, 2)[0], 5e-2)


def test_streamed_surface(tiny_stores):
    """stats, report(), stage_times, settle(), reset_stats() on the native path."""
    store = tiny_stores["qwen2"]
    model = StreamedDecoder(store, budgets(store)[0], "float32")
    model.stage_times = []
    decode(native_forward(model), TOKENS, 2)
    model.settle()
    stages = [s for s, _ in model.stage_times]
    assert stages[:4] == ["embed", "layer.0", "layer.1", "head"] and len(stages) == 12
    r = model.report()
    assert r["passes"] == 3 and model.stats.tokens == len(TOKENS) + 2 and model.resident_weight_bytes is None
    assert r["bytes_read_per_pass"] > 0 and r["compute_s"] > 0 and r["dequantized_bytes_per_pass"] == 0
    model.reset_stats()
    assert model.stats.passes == 0 and model.report()["bytes_read"] == 0
    model.close()


# -- the model protocol: tree rows and the argmax head ------------------------------------

def tree_rows_equal_alone(model, prefix) -> None:
    """A token tree verified in one pass gives every token the logits it gets decoded
    alone (one token at a time after the prefix), bit for bit."""
    n = len(prefix)
    #          a     b     c     d         (b, c children of a; d child of b)
    tree = np.array([7, 11, 13, 17])
    parents = [-1, 0, 0, 1]
    depth = [0, 1, 1, 2]
    mask = np.zeros((4, n + 4), dtype=bool)
    mask[:, :n] = True
    for i in range(4):
        j = i
        while j >= 0:
            mask[i, n + j] = True
            j = parents[j]
    cache = model.new_cache(4)
    model(np.array(prefix), np.arange(n), causal(n), cache)
    got = model(tree, n + np.array(depth), mask, cache)
    assert cache.length == n + 4
    for leaf_path in ([0, 1, 3], [0, 2]):
        alone = model.new_cache(4)
        model(np.array(prefix), np.arange(n), causal(n), alone)
        for k, i in enumerate(leaf_path):
            row = model(tree[i:i + 1], np.array([n + k]), causal(1, n + k), alone)
            assert np.array_equal(row[0], got[i]), f"tree row {i}"


def argmax_equals_logits(model, ids) -> None:
    n = len(ids)
    for rows in (None, np.array([n - 1]), np.array([0, 2, n - 1])):
        logits = model(np.array(ids), np.arange(n), causal(n), model.new_cache(), logits_rows=rows)
        best = model(np.array(ids), np.arange(n), causal(n), model.new_cache(), logits_rows=rows, head="argmax")
        assert best.dtype == np.int64 and np.array_equal(best, logits.argmax(axis=-1))


def topk_equals_logits(model, ids, k: int = 5) -> None:
    """head="topk": the first k of the stable argsort of -log_softmax(head="logits")
    (largest first, ties by token id), log-probs within float32 rounding."""
    n = len(ids)
    for rows in (None, np.array([n - 1]), np.array([0, 2, n - 1])):
        logits = model(np.array(ids), np.arange(n), causal(n), model.new_cache(), logits_rows=rows)
        top, lp = model(np.array(ids), np.arange(n), causal(n), model.new_cache(), logits_rows=rows,
                        head="topk", topk=k)
        ref = log_softmax(logits)
        order = np.argsort(-ref, axis=-1, kind="stable")[:, :k]
        assert top.dtype == np.int64 and lp.dtype == np.float32 and top.shape == lp.shape == (len(logits), k)
        assert np.array_equal(top, order)
        np.testing.assert_allclose(lp, np.take_along_axis(ref, order, axis=-1), rtol=0, atol=2e-6)
    whole, _ = model(np.array(ids), np.arange(n), causal(n), model.new_cache(), head="topk", topk=10_000)
    assert whole.shape == (n, model.config.vocab_size)                # k is clipped to the vocabulary


@pytest.mark.parametrize("arch", [a for a, _ in ARCHS])
def test_tiny_tree_rows_and_argmax(tiny, arch):
    model, _ = load_gguf_native(tiny[arch], "bfloat16")
    tree_rows_equal_alone(model, TOKENS)
    argmax_equals_logits(model, TOKENS)
    topk_equals_logits(model, TOKENS)


def test_torch_reference_topk(tiny):
    model, _ = load_gguf_torch(tiny["qwen2"], "float32")
    topk_equals_logits(model, TOKENS)


@pytest.mark.real
def test_smollm2_tree_rows_and_argmax(smollm2_path):
    model, _ = load_gguf_native(smollm2_path)
    tree_rows_equal_alone(model, PROMPT)
    argmax_equals_logits(model, PROMPT)


def test_streamed_argmax_over_head_parts(tiny_stores):
    store = tiny_stores["llama"]
    model = StreamedDecoder(store, budgets(store)[0], "float32")
    argmax_equals_logits(model, TOKENS)
    topk_equals_logits(model, TOKENS)
    model.close()


def test_streamed_topk_over_many_head_parts_equals_resident(tmp_path):
    """A 3000-token vocabulary streams its head in several parts: the top-k
    state carried across them gives the resident model's (one part) bits."""
    path = write_tiny_gguf(tmp_path / "wide.gguf", "llama", True, vocab=3000)
    store = convert(str(path), tmp_path / "wide", progress=False)
    model = StreamedDecoder(store, budgets(store)[0], "float32")
    resident, _ = load_gguf_native(path, "float32")
    try:
        assert len(model.weights.head_parts) > 2
        topk_equals_logits(model, TOKENS)
        n = len(TOKENS)
        got = model(np.array(TOKENS), np.arange(n), causal(n), model.new_cache(), head="topk", topk=7)
        want = resident(np.array(TOKENS), np.arange(n), causal(n), resident.new_cache(), head="topk", topk=7)
        assert all(np.array_equal(x, y) for x, y in zip(got, want))
    finally:
        model.close()


def test_bad_arguments(tiny):
    model, _ = load_gguf_native(tiny["llama"], "float32")
    cache = model.new_cache()
    with pytest.raises(ValueError, match="head must be"):
        model(np.array([1]), np.array([0]), causal(1), cache, head="top")
    for topk in (None, 0, 2.0):
        with pytest.raises(ValueError, match="topk >= 1"):
            model(np.array([1]), np.array([0]), causal(1), cache, head="topk", topk=topk)
    with pytest.raises(ValueError, match="mask has shape"):
        model(np.array([1, 2]), np.arange(2), causal(1), cache)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(np.array([64]), np.array([0]), causal(1), cache)
    with pytest.raises(ValueError, match=r"unsupported compute dtype .float16. \(use float32 or bfloat16\)"):
        load_gguf_native(tiny["llama"], "float16")
    assert cache.length == 0


def test_cache_grows_on_demand(tiny):
    model, _ = load_gguf_native(tiny["llama"], "float32")
    cache = model.new_cache(1)
    model(np.array(TOKENS), np.arange(len(TOKENS)), causal(len(TOKENS)), cache)
    assert cache.length == len(TOKENS) <= cache.capacity


# -- the loader ------------------------------------------------------------------------------

def test_type_without_kernel_is_refused(tmp_path):
    """Q5_1 has no kernel: refused by the loader and by a source store (whose
    message points to a bf16 store, which then works)."""
    path = write_tiny_gguf(tmp_path / "q51.gguf", matrix_type="Q5_1")
    with pytest.raises(UnsupportedModelError, match=r"'blk\.0\.attn_q\.weight' uses Q5_1"):
        load_gguf_native(path)
    source = convert(str(path), tmp_path / "source", progress=False)
    with pytest.raises(UnsupportedModelError, match=r"uses Q5_1.*--dtype bf16"):
        StreamedDecoder(source, budgets(source)[-1], "float32")
    bf16 = convert(str(path), tmp_path / "bf16", storage="bf16", progress=False)
    model = StreamedDecoder(bf16, budgets(bf16)[-1], "float32")
    assert np.isfinite(decode(native_forward(model), TOKENS, 1)[0]).all()
    model.close()


def tensor_bytes(path) -> int:
    """Bytes of every weight the decoder uses, the final norm as float32."""
    g = GGUFFile(path)
    return sum(t.nbytes for n, t in g.tensors.items() if n != "output_norm.weight") + \
        4 * g.tensors["output_norm.weight"].n_elements


@pytest.mark.parametrize("arch", [a for a, _ in ARCHS])
def test_weight_bytes_and_no_mmap(tiny, monkeypatch, arch):
    def no_mmap(*a, **kw):
        raise AssertionError("the native loader mapped the file")
    monkeypatch.setattr(mmap, "mmap", no_mmap)
    monkeypatch.setattr(GGUFFile, "raw", no_mmap)
    model, g = load_gguf_native(tiny[arch])
    w = model.weights
    assert model.resident_weight_bytes == w.weight_bytes
    assert w.tensor_bytes == tensor_bytes(tiny[arch])
    n_tensors = len(g.tensors)
    assert w.tensor_bytes <= w.weight_bytes <= w.tensor_bytes + 64 * 2 * n_tensors
    assert all(b.ctypes.data % 64 == 0 for b in w.buffers + [w.embedding, w.head])


@pytest.mark.real
def test_smollm2_load_peak_memory(smollm2_path):
    """Weights are read straight into their buffers: the loader's peak allocation is
    the weights themselves plus well under one tensor's worth (no transient copies)."""
    tracemalloc.start()
    try:
        model, g = load_gguf_native(smollm2_path)
        current, peak = tracemalloc.get_traced_memory()      # bytes held after loading, at most
    finally:
        tracemalloc.stop()
    w = model.weights
    assert w.tensor_bytes == tensor_bytes(smollm2_path)
    assert w.tensor_bytes <= w.weight_bytes <= w.tensor_bytes + 64 * 2 * len(g.tensors)
    assert current >= w.weight_bytes
    largest = max(t.nbytes for t in g.tensors.values())
    assert peak - current < min(4 << 20, largest // 4), (peak, current)
