"""Every block feature of `ModelConfig` in the torch reference (lever.reference)
against the native decoder, on tiny float32 models built from tensors
(tests/block_model.py): the same logits to float rounding (the bound of the
F32 native-vs-reference test in tests/model/test_native_decoder.py) over a
prompt longer than the sliding window, token-by-token decoding after it and
a tree-shaped pass (the window composed with a tree mask).  Each feature
must also move the logits well beyond that bound (against the same weights
without it), so a reference that ignored it would fail."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from block_model import block_config, native_decoder, random_tensors, reference_model
from lever.model_config import layer_shapes
from lever.tree import TokenTree

REL = 1e-4                 # |logit diff| / max |logit|: test_tiny_native_equals_torch_reference's F32 bound
WINDOW = 5
PROMPT = [3, 17, 42, 5, 88, 61, 9, 23, 71, 30, 2, 54]       # 12 tokens: longer than the window
LOCAL = dict(layer_kinds="lgl", sliding_window=WINDOW, rope_theta_local=100.0)
FACTORS = (1.0, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)         # one per rotated pair of head_dim 16

FEATURES = {
    "qk_norm": dict(qk_norm=True),
    "sandwich_norms": dict(sandwich_norms=True),
    "gelu_tanh": dict(activation="gelu_tanh"),
    "partial_rotary": dict(rope_dims=8),
    "sliding_window": LOCAL,
    "local_rope_base": dict(layer_kinds="lll", sliding_window=64, rope_theta_local=50.0),
    "nope": dict(layer_kinds="gng"),
    "freq_factors": dict(rope_scaling="llama3", rope_freq_factors=FACTORS),
    "linear": dict(rope_scaling="linear", rope_linear=4.0),
    "attn_factor": dict(rope_attn_factor=1.3),
    "attn_scale": dict(attn_scale=0.6),
    "embed_scale": dict(embed_scale=8.0),
    "logit_softcap": dict(logit_softcap=1.5),
    "everything": dict(qk_norm=True, sandwich_norms=True, activation="gelu_tanh", rope_dims=8,
                       rope_freq_factors=FACTORS[:4], rope_scaling="linear", rope_linear=2.0,
                       rope_attn_factor=1.1, attn_scale=0.3, embed_scale=4.0, logit_softcap=2.0,
                       n_layers=4, layer_kinds="lgnl", sliding_window=WINDOW, rope_theta_local=100.0),
}


def causal(n: int, cached: int) -> np.ndarray:
    return np.tri(n, cached + n, cached, dtype=bool)


def tree_after(cached: int, root: int) -> TokenTree:
    """Seven nodes, three deep past the root, two branches."""
    tree = TokenTree(root)
    for parent, token in [(0, 11), (1, 12), (2, 13), (3, 14), (0, 21), (5, 22)]:
        tree.add(parent, token, -1.0)
    return tree


def run(model) -> np.ndarray:
    """Logits of: the prompt in one pass, three tokens one at a time, then a
    tree over that cache -- every row, concatenated."""
    cache = model.new_cache(64)
    n = len(PROMPT)
    rows = [model(np.array(PROMPT), np.arange(n), causal(n, 0), cache)]
    for i, token in enumerate([7, 8, 9]):
        rows.append(model(np.array([token]), np.array([n + i]), causal(1, n + i), cache))
    tree = tree_after(cache.length, 4)
    rows.append(model(tree.tokens().astype(np.int64), tree.positions(cache.length), tree.mask(cache.length), cache))
    return np.concatenate(rows)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max()) / float(np.abs(ref).max())


@pytest.mark.parametrize("feature", list(FEATURES))
def test_reference_equals_native(feature):
    cfg = block_config(**FEATURES[feature])
    tensors = random_tensors(cfg, seed=3)
    want = run(native_decoder(cfg, tensors))
    got = run(reference_model(cfg, tensors))
    assert got.shape == want.shape and np.all(np.isfinite(got))
    err = rel_err(got, want)
    print(f"{feature}: reference vs native {err:.2e}")
    assert err <= REL, f"{feature}: reference differs from native by {err:.2e} of the largest logit"

    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    off = dataclasses.replace(cfg, **{k: defaults[k] for k in FEATURES[feature] if k != "n_layers"})
    names = {f"layers.{i}.{n}" for i in range(off.n_layers) for n in layer_shapes(off)}
    off = run(reference_model(off, {k: v for k, v in tensors.items() if k in names or not k.startswith("layers.")}))
    assert rel_err(off, want) > 100 * REL, f"{feature} does not change the logits: the test would mean little"


def test_sliding_window_hides_old_keys_in_a_tree():
    """On a model of local layers only, a tree row's logits do not depend on
    cache rows WINDOW or more positions behind it (changing the oldest
    prompt tokens leaves the deep tree rows alone), and do depend on the
    rows inside the window -- for the native decoder and the reference alike."""
    cfg = block_config(layer_kinds="lll", sliding_window=WINDOW, n_layers=3)
    tensors = random_tensors(cfg, seed=4)
    for make in (native_decoder, reference_model):
        model = make(cfg, tensors)

        def tree_logits(prompt):
            cache = model.new_cache(32)
            n = len(prompt)
            model(np.array(prompt), np.arange(n), causal(n, 0), cache)
            tree = tree_after(n, 4)
            return model(tree.tokens().astype(np.int64), tree.positions(n), tree.mask(n), cache), tree.positions(n)

        a, pos = tree_logits(PROMPT)
        b, _ = tree_logits([50, 51] + PROMPT[2:])        # positions 0, 1 changed
        c, _ = tree_logits(PROMPT[:-1] + [60])           # position 11 changed
        # a row at position p sees positions p - WINDOW + 1 .. p in each of 3 layers: p - 3 (WINDOW - 1) > 1
        far = pos - 3 * (WINDOW - 1) > 1
        assert far.any() and not far.all()
        assert np.array_equal(a[far], b[far]), make.__name__
        assert not np.allclose(a[~far], b[~far]), make.__name__
        assert not np.allclose(a, c), make.__name__


def test_a_feature_the_reference_does_not_compute_is_refused_in_one_line(monkeypatch):
    """A block feature missing from the reference's BLOCK_FIELDS (as one added
    to ModelConfig later would be) is refused by name, never ignored."""
    from lever.errors import UnsupportedModelError
    from lever.reference import decoder
    cfg = block_config(sandwich_norms=True)
    monkeypatch.setattr(decoder, "BLOCK_FIELDS", decoder.BLOCK_FIELDS - {"sandwich_norms"})
    with pytest.raises(UnsupportedModelError) as e:
        reference_model(cfg, random_tensors(cfg))
    assert str(e.value) == "the torch reference: sandwich_norms is not supported"
    monkeypatch.setattr(decoder, "ACTIVATIONS", ("silu",))
    with pytest.raises(UnsupportedModelError, match="activation 'gelu_tanh' is not supported"):
        decoder.Decoder(block_config(activation="gelu_tanh"))
