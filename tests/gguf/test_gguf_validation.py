"""A GGUF is checked before use: counts and lengths against the file size
before anything is allocated, tensor data inside the file and not
overlapping, hyperparameters finite, positive and consistent with the
tensors. Each corruption of a tiny synthetic GGUF must end in exactly one
ModelFormatError naming the field -- no other exception, no hang, no
silent success -- and on the command line in one `lever: error:` line."""

from __future__ import annotations

import os
import shutil

import pytest

from lever.cli import main
from lever.errors import ModelFormatError
from tiny_model import gguf_logits, lever_error_of, peek, poke, poke_f32, write_tiny_gguf


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _set(label, value):
    return lambda p: poke(p, label, value)


def _float(label, value):
    return lambda p: poke_f32(p, label, value)


def _copy_field(label, source_label):
    return lambda p: poke(p, label, peek(p, source_label))


def _fifo(p):
    os.unlink(p)
    os.mkfifo(p)


def _truncate(p):
    with open(p, "r+b") as f:
        f.truncate(os.path.getsize(p) - 100)


Q = "blk.0.attn_q.weight"
CASES = {
    # counts and lengths, checked against the file size before any allocation
    "tensor count 2^60": (_set("tensor count", 1 << 60), "corrupt GGUF header"),
    "tensor count +1000": (lambda p: poke(p, "tensor count", peek(p, "tensor count") + 1000), "GGUF header"),
    "kv count 2^40": (_set("kv count", 1 << 40), "corrupt GGUF header"),
    "key length 2^50": (_set("llama.block_count key length", 1 << 50), "string of"),
    "string length 2^20": (_set("general.architecture string length", 1 << 20), "truncated GGUF header"),
    "array count 2^40": (_set("tokenizer.ggml.tokens array count", 1 << 40), "does not fit"),
    "array type 99": (_set("tokenizer.ggml.tokens array type", 99), "array of value type 99"),
    "value type 99": (_set("llama.block_count type", 99), "value type 99"),
    "n_dims 0": (_set(f"{Q} n_dims", 0), "0 dims"),
    "n_dims 9": (_set(f"{Q} n_dims", 9), "9 dims"),
    "dim 0": (_set(f"{Q} dim0", 0), "dimensions"),
    "dim 2^62": (_set(f"{Q} dim1", 1 << 62), "dimensions"),
    "unknown tensor type": (_set(f"{Q} type", 77), "unknown ggml type id 77"),
    # tensor data: aligned, inside the file, no overlaps
    "misaligned offset": (lambda p: poke(p, f"{Q} offset", peek(p, f"{Q} offset") + 8), "general.alignment"),
    "overlapping tensors": (_copy_field(f"{Q} offset", "blk.0.attn_k.weight offset"), "overlap"),
    "offset past the end": (_set(f"{Q} offset", 1 << 30), "truncated GGUF file"),
    "gap between tensors": (lambda p: open(p, "ab").write(bytes(32)) and poke(
        p, "output_norm.weight offset", peek(p, "output_norm.weight offset") + 32), "not at the end of tensor"),
    "bytes after the last tensor": (lambda p: open(p, "ab").write(bytes(64)), "data follows the last tensor"),
    "smaller tensor type": (_set(f"{Q} type", 2), "not at the end of tensor"),      # Q8_0 -> Q4_0
    "rows not whole blocks": (_set(f"{Q} type", 12), "whole Q4_K blocks"),
    "truncated data": (_truncate, "truncated GGUF file"),
    # hyperparameters
    "block_count 2^31": (_set("llama.block_count value", 1 << 31), "llama.block_count"),
    "block_count 3": (_set("llama.block_count value", 3), "block_count 3 does not match"),
    "block_count 1": (_set("llama.block_count value", 1), "block_count 1 does not match"),
    "block_count 0": (_set("llama.block_count value", 0), "llama.block_count"),
    "rope freq base NaN": (_float("llama.rope.freq_base value", float("nan")), "llama.rope.freq_base"),
    "rope freq base inf": (_float("llama.rope.freq_base value", float("inf")), "llama.rope.freq_base"),
    "rope freq base 0": (_float("llama.rope.freq_base value", 0.0), "llama.rope.freq_base"),
    "rms eps -1": (_float("llama.attention.layer_norm_rms_epsilon value", -1.0),
                   "llama.attention.layer_norm_rms_epsilon"),
    "rms eps NaN": (_float("llama.attention.layer_norm_rms_epsilon value", float("nan")),
                    "llama.attention.layer_norm_rms_epsilon"),
    "head_count 0": (_set("llama.attention.head_count value", 0), "llama.attention.head_count"),
    "head_count 5": (_set("llama.attention.head_count value", 5), "llama.attention.head_count"),
    "head_count 8": (_set("llama.attention.head_count value", 8), "blk.0.attn_k.weight"),
    "head_count_kv 0": (_set("llama.attention.head_count_kv value", 0), "llama.attention.head_count_kv"),
    "head_count_kv 3": (_set("llama.attention.head_count_kv value", 3), "n_kv_heads 3"),
    "embedding_length 128": (_set("llama.embedding_length value", 128), "has shape"),
    "feed_forward_length 2^30": (_set("llama.feed_forward_length value", 1 << 30), "llama.feed_forward_length"),
    "context_length 0": (_set("llama.context_length value", 0), "llama.context_length"),
    "vocab_size 65": (_set("llama.vocab_size value", 65), "token_embd.weight"),
    "block_count as float": (_set("llama.block_count type", 6), "llama.block_count must be an integer"),
    "rope base as an integer": (_set("llama.rope.freq_base type", 4), "llama.rope.freq_base must be a floating"),
    "eps as string": (_set("llama.attention.layer_norm_rms_epsilon type", 8), "GGUF"),
    # the file itself
    "FIFO": (_fifo, "not a regular file"),
    "not GGUF": (lambda p: poke(p, "tensor count", 0) or open(p, "r+b").write(b"GGML"), "not a GGUF file"),
}


def _corrupt(pristine, tmp_path, case):
    path = tmp_path / "bad.gguf"
    shutil.copyfile(pristine, path)
    CASES[case][0](path)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_corrupt_gguf_is_one_clear_error(pristine, tmp_path, case):
    path = _corrupt(pristine, tmp_path, case)
    err = lever_error_of(lambda: gguf_logits(path))
    assert err is not None, f"{case}: loaded without an error"
    assert isinstance(err, ModelFormatError), repr(err)
    assert CASES[case][1] in str(err) and str(path) in str(err), str(err)


@pytest.mark.parametrize("case", ["block_count 2^31", "rope freq base NaN", "overlapping tensors", "FIFO"])
def test_cli_prints_one_error_line(pristine, tmp_path, capsys, case):
    path = _corrupt(pristine, tmp_path, case)
    rc = main(["generate", "--model", str(path), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("lever: error: ") and len(err.splitlines()) == 1, err
    assert str(path) in err and (CASES[case][1] in err or case == "FIFO")   # api.load words the FIFO itself


def test_pristine_gguf_loads(pristine):
    assert gguf_logits(pristine).isfinite().all()


@pytest.mark.parametrize("case", ["block_count 2^31", "rms eps -1", "overlapping tensors"])
def test_convert_refuses_a_corrupt_gguf(pristine, tmp_path, capsys, case):
    """`lever convert` reads the GGUF through the same checks; it leaves no store behind."""
    path = _corrupt(pristine, tmp_path, case)
    out = tmp_path / "store"
    rc = main(["convert", str(path), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("lever: error: ") and len(err.splitlines()) == 1, err
    assert CASES[case][1] in err and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]
