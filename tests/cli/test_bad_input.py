"""Every kind of bad input named in the foundation issue ends in one clear
`lever: error:` line and exit status 2, never a traceback."""

import shutil

import gguf
import numpy as np
import pytest

from lever.cli import main


def run_cli(capsys, *argv):
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def assert_one_error_line(rc, err, *fragments):
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("lever: error: ")
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def write_tiny_gguf(path, arch="llama", bad_qtype=None):
    """A 1-layer model of the given architecture with random F32 weights;
    `bad_qtype` stores the q projection in that ggml type instead."""
    d, ff, vocab = 64, 96, 32
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,),
              "blk.0.attn_norm.weight": (d,), "blk.0.attn_q.weight": (d, d),
              "blk.0.attn_k.weight": (d // 2, d), "blk.0.attn_v.weight": (d // 2, d),
              "blk.0.attn_output.weight": (d, d), "blk.0.ffn_norm.weight": (d,),
              "blk.0.ffn_gate.weight": (ff, d), "blk.0.ffn_up.weight": (ff, d),
              "blk.0.ffn_down.weight": (d, ff)}
    for name, shape in shapes.items():
        if name == "blk.0.attn_q.weight" and bad_qtype is not None:
            block, size = gguf.GGML_QUANT_SIZES[bad_qtype]
            raw = rng.integers(0, 255, size=(shape[0], shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=bad_qtype)
        else:
            w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_model_name(capsys):
    rc, _, err = run_cli(capsys, "generate", "--model", "no-such-model-xyz", "--prompt", "hi")
    assert_one_error_line(rc, err, "unknown model 'no-such-model-xyz'", "smollm2-135m")


def test_truncated_gguf(capsys, tmp_path, smollm2_path):
    bad = tmp_path / "truncated.gguf"
    with open(smollm2_path, "rb") as src, open(bad, "wb") as dst:
        dst.write(src.read(40_000_000))
    rc, _, err = run_cli(capsys, "generate", "--model", str(bad), "--prompt", "hi")
    assert_one_error_line(rc, err, "truncated GGUF file", "98,362,432", "40,000,000")


def test_truncated_inside_the_header(capsys, tmp_path, smollm2_path):
    bad = tmp_path / "header.gguf"
    with open(smollm2_path, "rb") as src, open(bad, "wb") as dst:
        dst.write(src.read(5000))
    rc, _, err = run_cli(capsys, "generate", "--model", str(bad), "--prompt", "hi")
    assert_one_error_line(rc, err, "truncated GGUF header")


def test_not_a_gguf_file(capsys, tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04" + bytes(1000))
    rc, _, err = run_cli(capsys, "generate", "--model", str(bad), "--prompt", "hi")
    assert_one_error_line(rc, err, "not a GGUF file")


def test_corrupt_header_counts(capsys, tmp_path, smollm2_path):
    bad = tmp_path / "corrupt.gguf"
    shutil.copyfile(smollm2_path, bad)
    with open(bad, "r+b") as f:          # tensor count := 2**60
        f.seek(8)
        f.write((1 << 60).to_bytes(8, "little"))
    rc, _, err = run_cli(capsys, "generate", "--model", str(bad), "--prompt", "hi")
    assert_one_error_line(rc, err, "corrupt GGUF header")


@pytest.mark.parametrize("arch, what", [("qwen35", "hybrid linear-attention layers are not supported"),
                                        ("falcon", "supported: llama, qwen2, qwen3, gemma3, phi3, smollm3")])
def test_unsupported_architecture(capsys, tmp_path, arch, what):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", arch=arch)
    rc, _, err = run_cli(capsys, "generate", "--model", str(path), "--prompt", "hi")
    assert_one_error_line(rc, err, f"unsupported architecture '{arch}'", what)


def test_unsupported_quantisation_type(capsys, tmp_path):
    path = write_tiny_gguf(tmp_path / "iq.gguf", bad_qtype=gguf.GGMLQuantizationType.Q8_1)
    rc, _, err = run_cli(capsys, "generate", "--model", str(path), "--prompt", "hi")
    assert_one_error_line(rc, err, "Q8_1", "blk.0.attn_q.weight")


def test_prompt_longer_than_context(capsys, smollm2_path):
    prompt = "word " * 9000                       # > 8192 tokens of SmolLM2's context
    rc, _, err = run_cli(capsys, "generate", "--model", str(smollm2_path), "--prompt", prompt,
                         "--max-new-tokens", "4")
    assert_one_error_line(rc, err, "exceeds the model's context of 8192 tokens")


def test_bad_sampling_option(capsys, smollm2_path):
    rc, _, err = run_cli(capsys, "generate", "--model", str(smollm2_path), "--prompt", "hi", "--top-p", "0")
    assert_one_error_line(rc, err, "top_p")


def test_unreadable_model_file(capsys, tmp_path, smollm2_path):
    import os
    if os.geteuid() == 0:       # root reads anything: use a directory entry that is not a file instead
        bad = tmp_path / "fifo.gguf"
        os.mkfifo(bad)
        rc, _, err = run_cli(capsys, "generate", "--model", str(bad), "--prompt", "hi")
        assert_one_error_line(rc, err, "fifo.gguf")
    else:
        bad = tmp_path / "locked.gguf"
        shutil.copyfile(smollm2_path, bad)
        bad.chmod(0)
        rc, _, err = run_cli(capsys, "generate", "--model", str(bad), "--prompt", "hi")
        assert_one_error_line(rc, err, "Permission denied")


def test_missing_model_part(capsys, monkeypatch, tmp_path):
    """A registered model one of whose part packages is not installed."""
    import dataclasses

    from lever.gguf import registry
    real = registry.KNOWN_MODELS["qwen2.5-coder-0.5b"]
    parts = list(real.parts)
    parts[2] = dataclasses.replace(parts[2], dist="lever-test-absent-part3")
    fake = dataclasses.replace(real, name="fake-qwen", aliases=(), parts=tuple(parts))
    monkeypatch.setitem(registry.KNOWN_MODELS, "fake-qwen", fake)
    rc, _, err = run_cli(capsys, "generate", "--model", "fake-qwen", "--prompt", "hi",
                         "--cache-dir", str(tmp_path))
    assert_one_error_line(rc, err, "part 3 of 6", "lever-test-absent-part3==0.9.0", "pip install")


def test_convert_into_a_directory_that_cannot_be_made(capsys, smollm2_path):
    """/proc refuses new entries: the error says what failed, not a bare errno."""
    rc, _, err = run_cli(capsys, "convert", str(smollm2_path), "--out", "/proc/x")
    assert_one_error_line(rc, err, "cannot create the output directory /proc/x: ")
    assert "[Errno" not in err
