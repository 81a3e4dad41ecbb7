"""Every block feature of `ModelConfig` on the static-shape graph (lever.npu):
a tiny float32 model with the feature on (tests/block_model.py, the feature
list of tests/reference/test_block_features.py), run bucket by bucket on
ONNX Runtime's CPU EP (float32), against the native decoder: within the
bound of the float32 static-vs-native test (test_npu_exact.EXACT_CPU_TOL)
over a prompt longer than the sliding window (prefilled as two chunks),
token-by-token decoding and a tree pass; one case of every feature at once
on the simulated HTP (float16) within test_npu_exact.EXACT_HTP_TOL."""

from __future__ import annotations

import numpy as np
import pytest

from block_model import block_config, native_decoder, random_tensors
from lever.npu.backend import use_static_backend
from lever.npu.buckets import BucketSet
from lever.npu.graph import input_shapes, layer_graph
from lever.npu.layers import kind_tables, window_mask
from test_block_features import FEATURES, rel_err, run
from test_npu_exact import EXACT_CPU_TOL, EXACT_HTP_TOL


def static_pair(feature: str, backend: str, root):
    cfg = block_config(**FEATURES[feature])
    tensors = random_tensors(cfg, seed=3)
    model = native_decoder(cfg, tensors)
    layers = use_static_backend(model, backend, BucketSet((1, 4, 8), (16, 32)), root=root)
    return native_decoder(cfg, tensors), model, layers


@pytest.mark.parametrize("feature", list(FEATURES))
def test_cpu_static_equals_native(feature, tmp_path):
    native, model, layers = static_pair(feature, "cpu-static", tmp_path)
    want, got = run(native), run(model)
    err = rel_err(got, want)
    print(f"cpu-static {feature}: {err:.2e}")
    assert err <= EXACT_CPU_TOL, f"{feature}: cpu-static differs from native by {err:.2e} of the largest logit"
    assert layers.splits >= 1 and layers.passes == 5        # the 12-token prompt ran as two chunks


def test_qnn_equals_native_with_every_feature(tmp_path):
    native, model, layers = static_pair("everything", "qnn", tmp_path)
    err = rel_err(run(model), run(native))
    print(f"qnn everything: {err:.2e}")
    assert err <= EXACT_HTP_TOL
    assert all(s.get_providers()[0] == "QNNExecutionProvider" for s in layers.graphs._sessions.values())


def test_graph_inputs_follow_the_block():
    cfg = block_config(qk_norm=True, sandwich_norms=True, rope_dims=8)
    shapes = input_shapes(cfg, 4, 16)
    assert shapes["cos"] == (4, 8) and shapes["q_norm"] == (16,) and shapes["ffn_post_norm"] == (64,)
    assert "q_norm" not in input_shapes(block_config(), 4, 16)
    ops = {n.op_type for n in layer_graph(block_config(activation="gelu_tanh"), 4, 16).graph.node}
    assert "Tanh" in ops and "Sigmoid" not in ops


def test_each_kind_gets_its_own_tables_and_mask():
    """NoPE rows: cos = 1, sin = 0; local rows: the local base; the window mask
    hides exactly the keys `window` or more positions back."""
    cfg = block_config(layer_kinds="lgn", sliding_window=3, rope_theta_local=100.0)
    positions = np.array([4, 5, 5, 6], dtype=np.int64)
    tables = kind_tables(cfg, positions)
    assert set(tables) == {"g", "l", "n"}
    assert np.all(tables["n"][0] == 1) and np.all(tables["n"][1] == 0)
    assert not np.allclose(tables["g"][0], tables["l"][0])
    mask = np.ones((4, 8), dtype=bool)
    narrowed = window_mask(mask, positions, 4, 3)
    keys = np.concatenate([np.arange(4), positions])
    assert np.array_equal(narrowed, positions[:, None] - keys[None, :] < 3)


def test_a_feature_the_graph_does_not_compute_is_refused_in_one_line(monkeypatch, tmp_path):
    """A block feature missing from graph.BLOCK_FIELDS (as one added to
    ModelConfig later would be), or an activation the graph lacks, is refused
    by name before any session is made -- never computed as something else."""
    from lever.errors import LeverError
    from lever.npu import graph
    cfg = block_config(qk_norm=True, activation="gelu_tanh")
    model = native_decoder(cfg, random_tensors(cfg))
    monkeypatch.setattr(graph, "BLOCK_FIELDS", graph.BLOCK_FIELDS - {"qk_norm"})
    with pytest.raises(LeverError) as e:
        use_static_backend(model, "cpu-static", BucketSet((4,), (16,)))
    assert str(e.value) == "--backend cpu-static: qk_norm is not supported"
    monkeypatch.undo()
    monkeypatch.setattr(graph, "GRAPH_ACTIVATIONS", ("silu",))
    with pytest.raises(LeverError, match=r"^--backend qnn: activation 'gelu_tanh' is not supported$"):
        use_static_backend(model, "qnn", BucketSet((4,), (16,)), root=tmp_path)
    with pytest.raises(LeverError, match="activation 'gelu_tanh' is not supported"):
        layer_graph(cfg, 4, 16)
