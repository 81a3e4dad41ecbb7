"""Resident weights repacked for the batched kernels (csrc/kernels/repack.h):
the model's outputs are bit-identical to the same model in the GGUF layout,
every embedding and head row can be restored, bad shapes are refused.

The kernel-level checks (every type, Isa and M in 1..64 against the scalar
kernel) are the native tests; these are the model-level ones."""

from __future__ import annotations

import numpy as np
import pytest

from lever import _native
from lever.model.native_loader import load_gguf_native
from lever.quant import repack_at_load_types

needs_repack = pytest.mark.skipif(not _native.should_repack(),
                                  reason="this CPU's kernel isa does not repack resident weights")


def _load(path, monkeypatch, repack: bool):
    monkeypatch.setenv("LEVER_REPACK", "1" if repack else "0")
    model, _ = load_gguf_native(path, "float32")
    return model


def _logits(model, T: int) -> np.ndarray:
    tokens = np.arange(200, 200 + T, dtype=np.int64)
    mask = np.tril(np.ones((T, T), dtype=bool))
    return np.asarray(model.forward(tokens, np.arange(T, dtype=np.int64), mask, model.new_cache(64)))


@needs_repack
def test_repacked_smollm2_logits_bit_equal_to_gguf_layout(smollm2_path, monkeypatch):
    packed = _load(smollm2_path, monkeypatch, True)
    plain = _load(smollm2_path, monkeypatch, False)
    packed_types = {t for _, _, t, _ in packed.weights.layouts[0].entries}
    plain_types = {t for _, _, t, _ in plain.weights.layouts[0].entries}
    assert any(_native.base_type(t) != t for t in packed_types), packed_types
    assert all(_native.base_type(t) == t for t in plain_types), plain_types
    assert {_native.base_type(t) for t in packed_types} == plain_types
    for T in (1, 8, 32):
        a, b = _logits(packed, T), _logits(plain, T)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"T={T}"
    # A tied, repacked head: the embedding rows and the probe's lens rows are restored.
    head_type = packed.weights.head_parts[0][2]
    assert _native.base_type(head_type) in repack_at_load_types() and head_type != _native.base_type(head_type)
    ids = np.array([0, 1, 7, 8, 12345, packed.weights.vocab_size - 1], dtype=np.int64)
    rows_a, type_a = packed.weights.head_rows(ids)
    rows_b, type_b = plain.weights.head_rows(ids)
    assert type_a == type_b and np.array_equal(rows_a, rows_b)


@needs_repack
def test_repacked_greedy_tokens_equal_gguf_layout(smollm2_path, monkeypatch):
    out = []
    for repack in (True, False):
        model = _load(smollm2_path, monkeypatch, repack)
        cache, token, tokens = model.new_cache(64), np.array([1], dtype=np.int64), []
        for i in range(12):
            mask = np.ones((1, cache.length + 1), dtype=bool)
            token = np.asarray(model.forward(token, np.array([i]), mask, cache, head="argmax")).reshape(1)
            tokens.append(int(token[0]))
        out.append(tokens)
    assert out[0] == out[1]


def test_repack_rejects_bad_shapes_and_rows():
    w = np.zeros(7 * 144, dtype=np.uint8)
    with pytest.raises(ValueError, match="cannot be repacked"):
        _native.repack_rows(w, 12, 7, 256)               # Q4_K, 7 rows: not whole groups of 8
    with pytest.raises(ValueError, match="cannot be repacked"):
        _native.repack_rows(np.zeros(8 * 2, dtype=np.uint8), 0, 8, 1)  # F32 has no repacked form
    with pytest.raises(ValueError, match="bytes, expected"):
        _native.repack_rows(np.zeros(100, dtype=np.uint8), 12, 8, 256)
    w = np.zeros(8 * 34, dtype=np.uint8)
    t = _native.repack_rows(w, 8, 8, 32)                  # Q8_0
    assert _native.base_type(t) == 8
    with pytest.raises(ValueError, match="outside the 8 rows"):
        _native.unpack_rows(w, t, 8, 32, [8])
    with pytest.raises(ValueError, match="not a repacked type"):
        _native.unpack_rows(w, 8, 8, 32, [0])


def test_repack_round_trip_every_type():
    rng = np.random.default_rng(3)
    for qtype, block_bytes, block in ((12, 144, 256), (14, 210, 256), (8, 34, 32), (6, 22, 32),
                                      (2, 18, 32), (3, 20, 32)):
        rows, cols = 16, 2 * block
        w = rng.integers(0, 256, size=rows * 2 * block_bytes, dtype=np.uint8)
        packed = w.copy()
        t = _native.repack_rows(packed, qtype, rows, cols)
        assert not np.array_equal(packed, w)              # the bytes did move
        back = _native.unpack_rows(packed, t, rows, cols, list(range(rows)))
        assert np.array_equal(back.reshape(-1), w), qtype
