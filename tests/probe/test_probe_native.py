"""The early-exit probe's native pieces (issue 16): `_native.probe_scores` against a
numpy reference on the same dequantised head rows, `_native.prune_closure`, and
`NativeModel.keep_rows` -- a pass pruned between layers gives every surviving
row, and its keys / values in every layer, the same bits as the unpruned pass."""

import numpy as np
import pytest

from lever import _native
from lever.model.native_loader import load_gguf_native
from tiny_model import D, LAYERS, VOCAB, write_tiny_gguf

# A draft tree (node: parent) verified after PREFIX committed tokens.
PARENTS = np.array([-1, 0, 0, 1, 2, 3, 1, 4, 6], dtype=np.int64)
TOKENS = np.array([5, 9, 33, 2, 17, 40, 8, 61, 12], dtype=np.int64)
PREFIX = [1, 5, 9, 33]
N_FEATURES = 5


@pytest.fixture(scope="module", params=[("llama", True), ("qwen2", False)], ids=["llama-tied", "qwen2"])
def model(request, tmp_path_factory):
    arch, tied = request.param
    path = write_tiny_gguf(tmp_path_factory.mktemp("probe") / f"{arch}.gguf", arch, tied)
    decoder, _ = load_gguf_native(path, "float32")
    return decoder


def depths(parents: np.ndarray) -> np.ndarray:
    d = np.zeros(len(parents), dtype=np.int64)
    for j in range(1, len(parents)):
        d[j] = d[parents[j]] + 1
    return d


def tree_mask(parents: np.ndarray, n_cached: int) -> np.ndarray:
    """bool [n, n_cached + n]: every node sees the cache, itself and its ancestors."""
    n = len(parents)
    mask = np.zeros((n, n_cached + n), dtype=bool)
    mask[:, :n_cached] = True
    for j in range(n):
        a = j
        while a >= 0:
            mask[j, n_cached + a] = True
            a = parents[a]
    return mask


def head_rows(decoder, tokens: np.ndarray) -> tuple[np.ndarray, int]:
    """The head rows of `tokens` in their ggml layout (uint8 [n, row bytes];
    restored where the resident head is repacked) and their ggml type."""
    rows, qtype = decoder.weights.head_rows(np.asarray(tokens, dtype=np.int64))
    return np.ascontiguousarray(rows), qtype


def prefilled_cache(decoder):
    cache = decoder.new_cache(32)
    n = len(PREFIX)
    decoder(np.array(PREFIX), np.arange(n), np.tri(n, n, 0, dtype=bool), cache)
    return cache


def run_pass(decoder, cache, prunes: dict[int, np.ndarray]):
    """The tree pass layer by layer through NativeModel; prunes[i]: the keep given
    after layer i.  Returns (final live rows, each layer's (k, v) cache rows)."""
    native, w = decoder.native, decoder.weights
    n, n_cached = len(TOKENS), cache.length
    x = np.empty((n, D), dtype=np.float32)
    w.embed(native, TOKENS, x)
    native.begin_pass(n_cached + depths(PARENTS), tree_mask(PARENTS, n_cached), cache)
    for i, layout in enumerate(w.layouts):
        buffer, release = w.layer(i)
        native.layer(x, layout, buffer, cache, i)
        release()
        if i in prunes:
            native.keep_rows(x, prunes[i])
            x = x[:len(prunes[i])]
            assert native.live_rows == len(prunes[i])
    native.end_pass(cache)
    return x, [cache.layer_rows(i) for i in range(LAYERS)]


# -- keep_rows -------------------------------------------------------------------------------

def test_keep_rows_surviving_rows_are_bitwise_unchanged(model):
    want_x, want_kv = run_pass(model, prefilled_cache(model), {})
    # After layer 0 drop node 2's subtree (2, 4, 7): live nodes 0 1 3 5 6 8.
    # Then (a second call, indices into the live rows) drop node 5, a leaf.
    assert LAYERS == 2
    cache = prefilled_cache(model)
    native = model.native
    n, n_cached = len(TOKENS), cache.length
    x = np.empty((n, D), dtype=np.float32)
    model.weights.embed(native, TOKENS, x)
    native.begin_pass(n_cached + depths(PARENTS), tree_mask(PARENTS, n_cached), cache)
    buffer, _ = model.weights.layer(0)
    native.layer(x, model.weights.layouts[0], buffer, cache, 0)
    native.keep_rows(x, np.array([0, 1, 3, 5, 6, 8]))
    x = x[:6]
    native.keep_rows(x, np.array([0, 1, 2, 4, 5]))
    x = x[:5]
    buffer, _ = model.weights.layer(1)
    native.layer(x, model.weights.layouts[1], buffer, cache, 1)
    native.end_pass(cache)
    got_kv = [cache.layer_rows(i) for i in range(LAYERS)]

    survivors = np.array([0, 1, 3, 6, 8])
    assert cache.length == n_cached + n                 # end_pass commits all T rows
    assert np.array_equal(x.view(np.uint32), want_x[survivors].view(np.uint32))
    live_at = [np.arange(n), survivors]                 # rows each layer ran
    for layer, rows in enumerate(live_at):
        slots = np.concatenate([np.arange(n_cached), n_cached + rows])
        for got, want in zip(got_kv[layer], want_kv[layer]):
            assert np.array_equal(got[:, slots].view(np.uint32), want[:, slots].view(np.uint32)), layer


def test_keep_rows_then_compact_equals_decoding_the_survivors(model):
    """Pruned after layer 0, the committed cache compacted to the survivors equals
    the cache of a pass over the survivors alone (bitwise), and so do their rows."""
    survivors = np.array([0, 1, 3, 6])
    cache = prefilled_cache(model)
    x, _ = run_pass(model, cache, {0: survivors})
    n_cached = len(PREFIX)
    cache.compact(np.concatenate([np.arange(n_cached), n_cached + survivors]))

    sub_parents = np.array([-1, 0, 1, 1], dtype=np.int64)  # the survivors' own tree
    alone = prefilled_cache(model)
    y = np.empty((len(survivors), D), dtype=np.float32)
    native, w = model.native, model.weights
    w.embed(native, TOKENS[survivors], y)
    native.begin_pass(n_cached + depths(sub_parents), tree_mask(sub_parents, n_cached), alone)
    for i, layout in enumerate(w.layouts):
        native.layer(y, layout, w.layer(i)[0], alone, i)
    native.end_pass(alone)
    assert np.array_equal(x.view(np.uint32), y.view(np.uint32))
    for i in range(LAYERS):
        for got, want in zip(cache.layer_rows(i), alone.layer_rows(i)):
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_forward_with_a_pruning_hook_matches_the_full_pass(model):
    """Through NativeDecoder.forward(layer_hook=...): surviving rows' logits unchanged."""
    mask = tree_mask(PARENTS, len(PREFIX))
    positions = len(PREFIX) + depths(PARENTS)
    want = model(TOKENS, positions, mask, prefilled_cache(model))
    keep = np.array([0, 1, 3, 5, 6, 8])
    got = model(TOKENS, positions, mask, prefilled_cache(model),
                layer_hook=lambda i, x: keep if i == 0 else None)
    assert np.array_equal(got.view(np.uint32), want[keep].view(np.uint32))


@pytest.mark.parametrize("keep, match", [
    ([], "row 0"), ([1, 2], "row 0"), ([0, 2, 2], "strictly increasing"),
    ([0, 3, 1], "strictly increasing"), ([0, len(TOKENS)], "outside"),
])
def test_keep_rows_rejects_a_bad_keep(model, keep, match):
    cache = prefilled_cache(model)
    native = model.native
    x = np.zeros((len(TOKENS), D), dtype=np.float32)
    native.begin_pass(cache.length + depths(PARENTS), tree_mask(PARENTS, cache.length), cache)
    with pytest.raises(ValueError, match=match):
        native.keep_rows(x, np.array(keep, dtype=np.int64))
    assert native.live_rows == len(TOKENS)
    with pytest.raises(ValueError, match="rows"):
        native.keep_rows(x[:3], np.array([0, 1], dtype=np.int64))   # x is not the live rows
    with pytest.raises(ValueError, match="keep"):
        native.keep_rows(x, np.array([0, 1], dtype=np.int32))
    native.end_pass(cache)
    with pytest.raises(ValueError, match="no pass"):
        native.keep_rows(x, np.array([0, 1], dtype=np.int64))


# -- probe_scores ------------------------------------------------------------------------------

def probe_inputs(decoder, seed: int = 0):
    """Scores for nodes 1.. of the tree from a random x [n, D] (row j: node j)."""
    rng = np.random.default_rng(seed)
    nodes = np.arange(1, len(TOKENS))
    x = (rng.standard_normal((len(TOKENS), D)) * 2).astype(np.float32)
    table, qtype = head_rows(decoder, TOKENS[nodes])
    parents = PARENTS[nodes]
    return dict(x=x, parent_rows=parents.copy(), parents=parents, table=table, qtype=qtype,
                norm_w=decoder.weights.norm, eps=decoder.config.rms_norm_eps,
                draft_logp=-rng.uniform(0, 5, len(nodes)).astype(np.float32),
                sibling_rank=(nodes % 3).astype(np.float32),
                depth=depths(PARENTS)[nodes].astype(np.float32),
                weights=np.array([0.3, 0.7, 1.1, 0.9, -0.4, -0.2]),
                lens_out=np.zeros(len(nodes), dtype=np.float32),
                logit_out=np.zeros(len(nodes), dtype=np.float32))


def reference_scores(a) -> tuple[np.ndarray, np.ndarray]:
    """numpy (float64) lens and logits on the same dequantised head rows."""
    n = len(a["parents"])
    rows = np.empty((n, D), dtype=np.float32)
    _native.dequantize(a["table"].reshape(-1), a["qtype"], rows.reshape(-1))
    h = a["x"][a["parent_rows"]].astype(np.float64)
    h = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + a["eps"]) * a["norm_w"]
    lens = (h * rows).sum(axis=1)
    best = np.array([lens[a["parents"] == p].max() for p in a["parents"]])
    feats = np.stack([lens, lens - best, a["draft_logp"], a["sibling_rank"], a["depth"]], axis=1)
    return lens, a["weights"][0] + feats @ a["weights"][1:]


def test_probe_scores_match_numpy_reference(model):
    a = probe_inputs(model)
    _native.probe_scores(**a)
    lens, logit = reference_scores(a)
    scale = max(1.0, float(np.abs(lens).max()))
    np.testing.assert_allclose(a["lens_out"], lens, rtol=1e-4, atol=1e-4 * scale)
    np.testing.assert_allclose(a["logit_out"], logit, rtol=1e-4, atol=1e-4 * scale)
    # The best of each sibling group has margin 0; node 8 (parent 6) is alone.
    alone = list(PARENTS[1:]).index(6)
    w = a["weights"]
    assert a["logit_out"][alone] == pytest.approx(
        w[0] + w[1] * a["lens_out"][alone] + w[3] * a["draft_logp"][alone] + w[4] * a["sibling_rank"][alone]
        + w[5] * a["depth"][alone], rel=1e-6)


def test_probe_scores_on_a_2d_table_and_f32_rows(model):
    """table may be [n, row bytes] or flat; an F32 head works as well as a quantised one."""
    a = probe_inputs(model, seed=1)
    rows = np.empty((len(a["parents"]), D), dtype=np.float32)
    _native.dequantize(a["table"].reshape(-1), a["qtype"], rows.reshape(-1))
    b = dict(a, table=rows.view(np.uint8), qtype=0, lens_out=np.zeros_like(a["lens_out"]),
             logit_out=np.zeros_like(a["logit_out"]))
    _native.probe_scores(**b)
    a["table"] = a["table"].reshape(-1)
    _native.probe_scores(**a)
    assert np.array_equal(b["lens_out"], a["lens_out"])      # the same fp32 rows


@pytest.mark.parametrize("name, value, match", [
    ("x", np.zeros((9, D), dtype=np.float64), "x"),
    ("parent_rows", np.array([0, 0, 0, 1, 2, 3, 1, 40]), "parent_rows"),
    ("parents", np.zeros(3, dtype=np.int64), "parents"),
    ("table", np.zeros(5, dtype=np.uint8), "table"),
    ("table", np.zeros((8, 40), dtype=np.float32), "table"),
    ("qtype", 99, "type"),
    ("norm_w", np.ones(D + 1, dtype=np.float32), "norm_w"),
    ("draft_logp", np.zeros(8, dtype=np.float64), "draft_logp"),
    ("sibling_rank", np.zeros(7, dtype=np.float32), "sibling_rank"),
    ("depth", np.zeros(9, dtype=np.float32), "depth"),
    ("weights", np.zeros(5), "weights"),
    ("lens_out", np.zeros(8, dtype=np.float64), "lens_out"),
    ("logit_out", np.zeros(7, dtype=np.float32), "logit_out"),
])
def test_probe_scores_rejects_bad_arguments(model, name, value, match):
    a = probe_inputs(model)
    a[name] = value
    with pytest.raises(ValueError, match=match):
        _native.probe_scores(**a)


# -- prune_closure -----------------------------------------------------------------------------

def test_prune_closure_drops_descendants_of_dropped_nodes():
    keep_self = np.array([0, 1, 0, 1, 1, 1, 1, 1, 0], dtype=bool)
    kept = _native.prune_closure(PARENTS, keep_self)
    assert kept.dtype == bool
    # 0 always; 2 dropped takes 4 and 7; 8 dropped itself.
    assert kept.tolist() == [True, True, False, True, False, True, True, False, False]
    assert _native.prune_closure(PARENTS, keep_self.astype(np.uint8)).tolist() == kept.tolist()
    assert _native.prune_closure(np.array([-1]), np.array([False])).tolist() == [True]


@pytest.mark.parametrize("parents, keep_self, match", [
    ([0, 0, 1], [1, 1, 1], "parents"),
    ([-1, 2, 0], [1, 1, 1], "parents"),
    ([-1, 0, -1], [1, 1, 1], "parents"),
    ([-1, 0, 1], [1, 1], "keep_self"),
])
def test_prune_closure_rejects_bad_input(parents, keep_self, match):
    with pytest.raises(ValueError, match=match):
        _native.prune_closure(np.array(parents, dtype=np.int64), np.array(keep_self, dtype=bool))
