"""KV caches whose sliding-window layers keep only their window (csrc/model/kv_cache.h).

A tiny native pair (tests/tiny_model.py's weights) run as a block with
sliding-window layers ("l", window WINDOW) decodes greedily for several
windows in the speculative modes, over windowed caches (NativeLayers.new_cache)
and over full ones: the same tokens, and plain greedy decoding's; the
windowed caches of the target and of the draft really slid.  A windowed
cache's nbytes is what lever.store.residency.kv_bytes counts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lever import _native
from lever.autoregressive import generate_tokens
from lever.draft.base import TreeShape
from lever.draft.model_drafter import ModelDrafter
from lever.engine import SpecConfig, run_speculative, verifier_capacity
from lever.model.native_decoder import NativeDecoder, NativeLayers
from lever.model.native_loader import load_gguf_native
from lever.sampling import SamplingParams
from lever.store.residency import kv_bytes, kv_layer_rows, window_rows
from lever.verify.target_pass import TargetVerifier
from tiny_model import causal, write_tiny_gguf

WINDOW = 8                      # tokens a sliding-window layer sees, itself included
KINDS = "llg"                   # two sliding-window layers, then a global one
SIZES = dict(vocab=211, hidden=64, ff=128, heads=8, kv_heads=2, layers=len(KINDS), context=512)
PROMPT, NEW = 24, 25 * WINDOW   # tokens: the windowed layers slide several times
KEEP = WINDOW - 1 + max(WINDOW, _native.KVCache.MIN_ROLLBACK)   # rows kept below a pass (kv_cache.h)


class FullCacheLayers(NativeLayers):
    """The native layers over caches that keep every row of every layer."""

    def new_cache(self, capacity: int) -> "_native.KVCache":
        cfg = self.config
        return _native.KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, max(1, int(capacity)), self.dtype)


def windowed(model: NativeDecoder, full_cache: bool = False) -> NativeDecoder:
    """`model`'s weights as a block with sliding-window layers (KINDS, WINDOW); its
    caches windowed (the default) or, with `full_cache`, full."""
    cfg = dataclasses.replace(model.config, layer_kinds=KINDS, sliding_window=WINDOW)
    out = NativeDecoder(cfg, model.weights, model.dtype)
    if full_cache:
        out.run_layers_on(FullCacheLayers(cfg, out.native, out.dtype))
    return out


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """{"window": (target, draft), "full": (target, draft)}: a random target and its
    noisy copy as the draft, with sliding-window layers, over windowed and over full caches."""
    d = tmp_path_factory.mktemp("kv-window")
    common = dict(arch="llama", tied=False, seed=31, matrix_type="Q8_0", std=0.08, **SIZES)
    target = load_gguf_native(write_tiny_gguf(d / "target.gguf", **common), "float32")[0]
    draft = load_gguf_native(write_tiny_gguf(d / "draft.gguf", noise=0.15, noise_seed=32, **common), "float32")[0]
    return {"window": (windowed(target), windowed(draft)),
            "full": (windowed(target, True), windowed(draft, True))}


SPECS = {
    "chain": SpecConfig("chain", draft_len=4),
    "tree": SpecConfig("tree", tree=TreeShape(budget=12, topk=3, depth=4)),
    "tree-ahead": SpecConfig("tree", tree=TreeShape(budget=12, topk=3, depth=4), draft_ahead=True),
}


def run(target, draft, prompt, spec):
    """Greedy speculative decoding of NEW tokens: (token ids, stats, target cache, draft cache)."""
    params = SamplingParams()
    verifier = TargetVerifier(target, params, capacity=verifier_capacity(len(prompt), NEW, spec))
    drafter = ModelDrafter(draft)
    result, stats = run_speculative(verifier, drafter, prompt, NEW, params, spec)
    return result.token_ids, stats, verifier.cache, drafter.cache


@pytest.mark.parametrize("mode", list(SPECS))
def test_windowed_caches_decode_the_tokens_of_full_caches(pairs, mode):
    target, draft = pairs["window"]
    full_target, full_draft = pairs["full"]
    prompt = np.random.default_rng(7).integers(0, SIZES["vocab"], PROMPT).tolist()
    got, stats, t_cache, d_cache = run(target, draft, prompt, SPECS[mode])
    want, _, full_t, full_d = run(full_target, full_draft, prompt, SPECS[mode])
    assert got == want
    assert got == generate_tokens(full_target, prompt, NEW).token_ids
    assert stats.accepted > 0, "no draft token accepted: the compactions kept only roots"
    for cache, full in ((t_cache, full_t), (d_cache, full_d)):
        assert cache.length == full.length
        assert cache.slides > 0 and cache.base(0) == cache.base(1) > 0 and cache.base(2) == 0
        assert full.slides == 0 and full.base(0) == 0
        assert cache.nbytes < full.nbytes
        for layer in range(len(KINDS)):     # the rows a windowed layer holds are the full cache's rows
            b = cache.base(layer)
            for got_rows, full_rows in zip(cache.layer_rows(layer), full.layer_rows(layer)):
                assert np.array_equal(got_rows, full_rows[:, b:])
    print(f"{mode}: {stats.accepted} draft tokens accepted; target cache base {t_cache.base(0)}, "
          f"{t_cache.slides} slides, {t_cache.nbytes} of {full_t.nbytes} bytes")


def test_windowed_cache_nbytes_is_what_the_plan_counts(pairs):
    target = pairs["window"][0]
    cfg, capacity = target.config, 300
    per_row = 2 * cfg.n_kv_heads * cfg.head_dim * 4                     # keys and values, float32
    cache = target.new_cache(capacity)
    assert [cache.window(i) for i in range(3)] == [WINDOW, WINDOW, 0]
    assert cache.nbytes == (capacity + 2 * (KEEP + WINDOW + 1)) * per_row   # per windowed layer, to start
    assert cache.nbytes == kv_bytes(cfg, capacity, 4, pass_rows=1)
    # Passes of 40 rows (more than W + 1): the third one, after more than K rows,
    # does not fit with the K rows kept below it and grows them to K + W + 40 rows.
    chunk, n = 40, 120
    for start in range(0, n, chunk):
        target(np.arange(start, start + chunk) % cfg.vocab_size, np.arange(start, start + chunk),
               causal(chunk, start), cache, head="argmax")
        grown = start + chunk > KEEP + WINDOW + 1
        assert cache.layer_capacity(0) == (KEEP + WINDOW + chunk if grown else KEEP + WINDOW + 1)
    assert [cache.layer_capacity(i) for i in range(3)] == [KEEP + WINDOW + chunk] * 2 + [capacity]
    assert kv_layer_rows(cfg, capacity, chunk) == [window_rows(WINDOW, capacity, chunk)] * 2 + [capacity]
    assert cache.nbytes == kv_bytes(cfg, capacity, 4, pass_rows=chunk) == \
        (capacity + 2 * (KEEP + WINDOW + chunk)) * per_row
    # Decoding on, one token a pass: slides every W + 1 tokens or so, no growth.
    slides = cache.slides
    for pos in range(n, n + 15 * WINDOW):
        target(np.array([pos % cfg.vocab_size]), np.array([pos]), causal(1, pos), cache, head="argmax")
    assert cache.slides > slides and cache.nbytes == kv_bytes(cfg, capacity, 4, pass_rows=chunk)
    # Cut back below the rows the windowed layers kept: one clear error, the cache unchanged.
    length = cache.length
    with pytest.raises(RuntimeError, match="sliding-window layers .* dropped the rows below"):
        cache.truncate(cache.base(0))
    assert cache.length == length
    cache.truncate(0)
    assert cache.base(0) == 0 and cache.length == 0
