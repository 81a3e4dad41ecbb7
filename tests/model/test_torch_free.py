"""The run path is torch-free (numpy model protocol); torch is the optional
reference: `TorchModel` wraps the torch Decoder to the protocol, and every
feature that needs torch says which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lever.draft.model_drafter import top_k_ids
from lever.errors import LeverError
from lever.masks import causal_mask
from lever.model.loading import load_model
from lever.reference.torch_model import TorchModel, load_gguf_torch, require_torch
from lever.values import dtype_name
from lever.verify.rules import draw
from tiny_model import TOKENS, write_tiny_gguf
from waiting import deadline

RUN_PATH = ["lever.cli", "lever.api", "lever.engine", "lever.autoregressive", "lever.mode_lever",
            "lever.sampling", "lever.verify.target_pass", "lever.draft.model_drafter", "lever.draft.ngram",
            "lever.cost.profile", "lever.cost.measure", "lever.quant", "lever.model.loading",
            "lever.reference.torch_model", "lever.commands.generate", "lever.commands.bench",
            "lever.commands.profile", "lever.commands.serve_verifier", "lever.remote.client",
            "lever.remote.server", "lever.edge", "lever.remote.session", "lever.store.convert",
            "lever.commands.serve", "lever.serve.app", "lever.remote.batcher", "lever.remote.vllm_verifier"]


def test_run_path_imports_no_torch():
    code = (f"import importlib, sys\nfor m in {RUN_PATH!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_require_torch_names_the_extra(monkeypatch):
    assert require_torch("x") is torch
    monkeypatch.setitem(sys.modules, "torch", None)          # `import torch` now raises ImportError
    with pytest.raises(LeverError, match=r"torch is needed for Hugging Face checkpoints: "
                                         r"pip install torch==2\.13\.0 'safetensors>=0\.4' "
                                         r"\(lever-llm's torch extra\)$"):
        require_torch("Hugging Face checkpoints")


def test_dtype_names():
    for alias, name in [("bf16", "bfloat16"), ("BFloat16", "bfloat16"), ("fp32", "float32"), ("f32", "float32"),
                        ("float32", "float32"), (torch.bfloat16, "bfloat16"), (torch.float32, "float32")]:
        assert dtype_name(alias) == name
    for bad in ("float16", torch.float16, np.float32, None, 3):
        with pytest.raises(ValueError, match="unsupported compute dtype"):
            dtype_name(bad)


def test_causal_mask_is_numpy_and_causal():
    m = causal_mask(3, 2)
    assert m.dtype == bool and m.shape == (3, 5)
    np.testing.assert_array_equal(m, torch.ones(3, 5, dtype=torch.bool).tril(diagonal=2).numpy())
    assert causal_mask(0, 4).shape == (0, 4)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


def test_torch_model_speaks_the_protocol(tiny):
    model, _ = load_gguf_torch(tiny, "float32")
    assert isinstance(model, TorchModel) and model.dtype == "float32"
    n = len(TOKENS)
    tokens, positions = np.array(TOKENS, dtype=np.int64), np.arange(n, dtype=np.int64)
    cache = model.new_cache(capacity=n)
    logits = model(tokens, positions, causal_mask(n, 0), cache)
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    assert logits.shape == (n, model.config.vocab_size) and cache.length == n
    cache = model.new_cache(capacity=n)
    ids = model(tokens, positions, causal_mask(n, 0), cache, logits_rows=np.array([n - 1, 0]), head="argmax")
    assert ids.dtype == np.int64 and ids.tolist() == [int(logits[n - 1].argmax()), int(logits[0].argmax())]
    cache.compact(np.array([0, 2], dtype=np.int64))
    assert cache.length == 2
    with pytest.raises(ValueError, match="head"):
        model(tokens, positions, causal_mask(n, 0), model.new_cache(capacity=n), head="probs")


def test_load_model_entry_point(tiny, tmp_path):
    model, gguf = load_model(tiny, "fp32", kernels="torch")
    assert isinstance(model, TorchModel) and gguf is not None and model.dtype == "float32"
    assert model.resident_weight_bytes > 0
    with pytest.raises(LeverError, match="kernels must be one of native, torch"):
        load_model(tiny, kernels="cuda")
    with pytest.raises(LeverError, match="not a file or directory"):
        load_model(tmp_path / "missing.gguf")


def test_top_k_ids_order_ties_by_index():
    """Largest first; equal values in index order (column 0 is the first maximum),
    also when the k-th value ties with entries outside the top k."""
    rows = np.array([[1, 3, 3, 0, 3, 2], [5, 5, 5, 5, 5, 5], [0, 1, 2, 3, 4, 5]], dtype=np.float32)
    assert top_k_ids(rows, 2).tolist() == [[1, 2], [0, 1], [5, 4]]
    assert top_k_ids(rows, 4).tolist() == [[1, 2, 4, 5], [0, 1, 2, 3], [5, 4, 3, 2]]
    assert top_k_ids(rows, 10).shape == (3, 6)
    rng = np.random.default_rng(0)
    for _ in range(300):
        x = rng.integers(0, 4, (3, 17)).astype(np.float32)
        k = int(rng.integers(1, 20))
        ref = np.stack([np.argsort(-r, kind="stable")[:k] for r in x])
        np.testing.assert_array_equal(top_k_ids(x, k), ref)


def test_draw_follows_the_weights_and_skips_zeros():
    rng = np.random.default_rng(1)
    weights = np.array([0.0, 0.2, 0.0, 0.6, 0.2, 0.0], dtype=np.float32)
    counts = np.bincount([draw(weights, rng) for _ in range(20_000)], minlength=6)
    assert counts[[0, 2, 5]].sum() == 0
    np.testing.assert_allclose(counts / counts.sum(), weights, atol=0.015)
    assert draw(np.array([0.0, 0.0, 1e-30], dtype=np.float32), rng) == 2


# -- the commands themselves run without torch (native kernels) -----------------------

NO_TORCH_CLI = Path(__file__).resolve().parents[1] / "no_torch_cli.py"


def run_without_torch(*args: str) -> subprocess.CompletedProcess:
    """`lever ARGS` in a fresh interpreter (tests/no_torch_cli.py), waited for until it exits
    (a safety net of waiting.deadline(300) s against a hang): exit 3 means torch was imported."""
    return subprocess.run([sys.executable, str(NO_TORCH_CLI), *args], capture_output=True, text=True,
                          timeout=deadline(300))


def assert_ran_without_torch(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"


@pytest.mark.real
@pytest.mark.parametrize("draft", [["--mode", "tree", "--tree-budget", "4", "--draft", "ngram"],
                                   ["--mode", "lever", "--draft", "smollm2-135m", "--lever-max-nodes", "8"]],
                         ids=["tree-ngram", "lever-model-draft"])
def test_generate_runs_without_torch(smollm2_path, lever_cache, draft):
    out = run_without_torch("generate", "--model", str(smollm2_path), "--prompt", "def fib(n):",
                            "--max-new-tokens", "4", "--cache-dir", str(lever_cache), *draft)
    assert_ran_without_torch(out)
    assert "4 tokens" in out.stderr


@pytest.mark.real
def test_the_harness_sees_torch(smollm2_path, lever_cache):
    """--kernels torch imports torch: the runner must say so (exit 3), or the tests above prove nothing."""
    out = run_without_torch("generate", "--model", str(smollm2_path), "--prompt", "hi", "--max-new-tokens", "1",
                            "--kernels", "torch", "--cache-dir", str(lever_cache))
    assert out.returncode == 3, out.stderr[-4000:]
    assert "torch was imported" in out.stderr


@pytest.mark.real
def test_bench_runs_without_torch(smollm2_path, lever_cache, tmp_path):
    out = run_without_torch("bench", "--target", str(smollm2_path), "--quick", "--prompts", "1", "--new-tokens", "4",
                            "--modes", "ar", "tree:4", "--out", str(tmp_path), "--no-progress",
                            "--cache-dir", str(lever_cache))
    assert_ran_without_torch(out)
    assert (tmp_path / "bench.json").is_file()


@pytest.mark.real
def test_profile_runs_without_torch(smollm2_path, lever_cache):
    out = run_without_torch("profile", "--target", str(smollm2_path), "--draft", str(smollm2_path), "--max-n", "2",
                            "--force", "--no-progress", "--json", "--cache-dir", str(lever_cache))
    assert_ran_without_torch(out)
    assert "iteration_overhead_s" in out.stdout


@pytest.mark.real
def test_serve_verifier_runs_without_torch(smollm2_path, lever_cache):
    """Served on the runner's main thread; its second thread verifies one tree, then stops it."""
    out = run_without_torch("serve-verifier", "--model", str(smollm2_path), "--max-tree-nodes", "4",
                            "--cache-dir", str(lever_cache))
    assert_ran_without_torch(out)
    assert "serving" in out.stderr
