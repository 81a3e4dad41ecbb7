"""`--draft-head q4_0`: the draft's output head re-quantised to Q4_0 as it loads.

The quantiser against gguf's reference (bit for bit), the loader on an untied
(Qwen2.5-Coder-0.5B, Q8_0 head) and a tied model (SmolLM2-135M), greedy output
still the target's own with such a draft, and the command-line option."""

import json

import gguf
import numpy as np
import pytest

from lever.autoregressive import generate_tokens
from lever.cli import main
from lever.draft.model_drafter import ModelDrafter
from lever.memory.plan import gguf_weight_bytes
from lever.model.native_loader import load_gguf_native
from lever.model.tokenizer import Tokenizer
from lever.model import native_loader
from lever.quant import Q4_0, dequantize, quantize_q4_0
from test_speculative import SPECS, run_spec
from tiny_model import write_tiny_gguf

Q8_0 = int(gguf.GGMLQuantizationType.Q8_0)


def reference_q4_0(x: np.ndarray) -> np.ndarray:
    return gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0).view(np.uint8).reshape(x.shape[0], -1)


def edge_rows() -> np.ndarray:
    """Blocks that stress the rules: all zero, a tie in magnitude (+a, -a: the
    first wins), a negative extreme, one spike, values at code boundaries."""
    rows = np.zeros((6, 64), dtype=np.float32)
    rows[1, 3], rows[1, 9] = 2.0, -2.0
    rows[1, 40], rows[1, 33] = -2.0, 2.0
    rows[2] = np.linspace(-5, 1, 64)
    rows[3, 17] = 1e4
    rows[4] = np.arange(64, dtype=np.float32) / 4 - 8
    rows[5] = np.float32(1e-30)
    return rows


def test_quantize_q4_0_equals_the_gguf_reference():
    x = np.random.default_rng(0).standard_normal((33, 256)).astype(np.float32) * 3
    for rows in (x, edge_rows()):
        assert np.array_equal(quantize_q4_0(rows), reference_q4_0(rows))
    got = dequantize(quantize_q4_0(x), Q4_0, x.shape)
    scale = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True) / 8
    assert np.all(np.abs(got.reshape(-1, 32) - x.reshape(-1, 32)) <= scale * (1 + 1e-3))


@pytest.fixture(autouse=True)
def gguf_layout(monkeypatch):
    """These tests compare the loaded head bytes with the GGUF's: load without
    repacking (the repacked layout is tested in test_repacked_model.py)."""
    monkeypatch.setenv("LEVER_REPACK", "0")


@pytest.mark.parametrize("tied", [False, True])
def test_head_read_in_chunks_equals_one_go(tmp_path, monkeypatch, tied):
    """The loader re-quantises the head chunk by chunk straight from the file:
    the same bytes as quantising the whole dequantised head at once."""
    path = write_tiny_gguf(tmp_path / "m.gguf", tied=tied, matrix_type="Q8_0")
    stored, g = load_gguf_native(path)
    head = g.tensors["token_embd.weight" if tied else "output.weight"]
    expected = quantize_q4_0(dequantize(stored.weights.head, head.qtype, head.shape)).reshape(-1)
    monkeypatch.setattr(native_loader, "Q4_0_CHUNK_ROWS", 3)
    q4, _ = load_gguf_native(path, head_type="q4_0")
    assert q4.weights.head_parts == [(0, head.shape[0], Q4_0)]
    assert np.array_equal(q4.weights.head, expected)
    assert (q4.weights.embedding is q4.weights.head) == tied
    assert q4.weights.embedding_qtype == (Q4_0 if tied else g.tensors["token_embd.weight"].qtype)
    with pytest.raises(ValueError, match="head_type"):
        load_gguf_native(path, head_type="q2")


@pytest.mark.parametrize("shape", [(4, 30), (96,), (2, 3, 32)])
def test_quantize_q4_0_refuses_other_shapes(shape):
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_q4_0(np.zeros(shape, dtype=np.float32))


@pytest.mark.real
def test_untied_head_is_q4_0_and_smaller(qwen05_path):
    stored, g = load_gguf_native(qwen05_path)
    q4, _ = load_gguf_native(qwen05_path, head_type="q4_0")
    head = g.tensors["output.weight"]
    assert head.qtype == Q8_0 and stored.weights.head_parts[0][2] == Q8_0
    assert q4.weights.head_parts == [(0, head.shape[0], Q4_0)]
    assert q4.weights.embedding_qtype == g.tensors["token_embd.weight"].qtype      # lookups as stored
    expected = quantize_q4_0(dequantize(stored.weights.head, Q8_0, head.shape))
    assert np.array_equal(q4.weights.head, expected.reshape(-1))
    saved = stored.resident_weight_bytes - q4.resident_weight_bytes
    assert saved == pytest.approx(head.nbytes * (1 - 18 / 34), abs=4096)            # 34 -> 18 bytes a block
    # --memory-limit sizes the draft from its header the same way
    assert gguf_weight_bytes(qwen05_path) - gguf_weight_bytes(qwen05_path, "q4_0") == head.nbytes * 16 // 34
    # 39 tokens of text (10 were too few: one near-tie moved the rate by 0.1)
    text = ("The capital of France is Paris. The capital of Germany is Berlin. "
            "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)")
    ids = np.array(Tokenizer.from_gguf(g).encode(text), dtype=np.int64)
    t = len(ids)
    mask = np.tril(np.ones((t, t), dtype=bool))
    a = stored(ids, np.arange(t), mask, stored.new_cache(t))
    b = q4(ids, np.arange(t), mask, q4.new_cache(t))
    assert np.corrcoef(a.reshape(-1), b.reshape(-1))[0, 1] > 0.99
    top3 = np.argsort(-a, axis=-1)[:, :3]
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.8                     # measured 0.92
    assert np.mean([b.argmax(-1)[i] in top3[i] for i in range(t)]) >= 0.9   # measured 0.97


@pytest.mark.real
def test_tied_table_serves_both_uses_as_q4_0(smollm2_path):
    stored, g = load_gguf_native(smollm2_path)
    q4, _ = load_gguf_native(smollm2_path, head_type="q4_0")
    table = g.tensors["token_embd.weight"]
    assert "output.weight" not in g.tensors
    if table.nbytes / np.prod(table.shape) <= 18 / 32:
        pytest.fail("SmolLM2's table is expected above Q4_0's 4.5 bits per weight")
    assert q4.weights.head_parts[0][2] == Q4_0 and q4.weights.embedding_qtype == Q4_0
    assert q4.weights.embedding is q4.weights.head
    assert q4.resident_weight_bytes < stored.resident_weight_bytes


@pytest.mark.real
def test_a_q4_0_head_draft_keeps_greedy_output_exact(smollm2_path, lever_cache):
    """SmolLM2 drafting for itself through a Q4_0 head: every mode's tokens are
    the target's own, and most drafts are still accepted."""
    from lever.model.tokenizer import Tokenizer

    target, g = load_gguf_native(smollm2_path, "float32")
    draft, _ = load_gguf_native(smollm2_path, "float32", head_type="q4_0")
    tok = Tokenizer.from_gguf(g, cache_dir=lever_cache / "tokenizers")
    stop = frozenset(tok.eos_token_ids)
    for text in ("def fibonacci(n):", "Explain what a linked list is.", "The capital of France is"):
        ids = tok.encode(text)
        ref = generate_tokens(target, ids, 24, stop_ids=stop).token_ids
        for mode in ("chain4", "tree6x2x3", "lever"):
            got, stats = run_spec(target, ModelDrafter(draft), ids, 24, SPECS[mode], stop_ids=stop)
            assert got == ref, f"{mode} {text!r}"
            assert stats.accepted > 0, f"{mode} {text!r}: no draft accepted"


@pytest.mark.real
def test_cli_draft_head(smollm2_path, capsys):
    argv = ["generate", "--model", str(smollm2_path), "--prompt", "def add(a, b):", "--max-new-tokens", "12",
            "--draft", str(smollm2_path), "--mode", "chain", "--json"]
    outs = []
    for head in ("stored", "q4_0"):
        assert main([*argv, "--draft-head", head]) == 0
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert outs[0]["token_ids"] == outs[1]["token_ids"]
    stored, q4 = (o["kernels"]["draft_resident_weight_bytes"] for o in outs)
    assert q4 < stored                                   # the option reached the loader
    assert main([*argv, "--draft-head", "q8"]) == 2
    assert "--draft-head" in capsys.readouterr().err
    assert main([*argv, "--draft-head", "q4_0", "--kernels", "torch"]) == 2
    assert "needs the native kernels" in capsys.readouterr().err
