"""`lever tokenize`: llama.cpp's vocab goldens through the command line (a
SentencePiece and a byte-level vocabulary, vocab-only GGUFs: no tensors, no
hyperparameters), the default encoding (BOS, special tokens parsed), and
every bad input as one `lever: error:` line with exit status 2.

The goldens come from the llama-cpp-python sdist (tests/llamacpp_vocabs.py:
fetched at test time, a skip only without network).  The spawned `lever`
is the installed one (`python -m lever.cli`, no PYTHONPATH set here)."""

from __future__ import annotations

import json
import subprocess
import sys

import gguf
import pytest

from lever.cli import main
from llamacpp_vocabs import goldens, vocab_dir, vocab_file
from waiting import deadline


@pytest.fixture(scope="module")
def models():
    return vocab_dir()


def lever_tokenize(args: list, cache_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lever.cli", "tokenize", *args, "--cache-dir", str(cache_dir)],
                          capture_output=True, timeout=deadline(120))


def one_error_line(rc: int, out: str, err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("lever: error: ")
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.mark.parametrize("name", ["llama-spm", "qwen2"])
def test_goldens_through_the_command_line(models, name, tmp_path, capsys):
    """A few goldens each (the library meets all of them: tests/model/test_tokenizer_goldens.py):
    two through a spawned `lever`, three in this process."""
    cases = goldens(models, name)
    spawned, here = [cases[0], cases[-1]], [c for c in cases if c[0].strip()][5::12]
    argv = ["--model", str(vocab_file(models, name)), "--json", "--no-bos"]
    for text, ids in spawned:
        p = lever_tokenize([*argv, "--text", text], tmp_path)
        assert p.returncode == 0, p.stderr.decode()
        got = json.loads(p.stdout)
        assert got["ids"] == ids and len(got["tokens"]) == len(ids), (name, text)
    for text, ids in here:
        assert main(["tokenize", *argv, "--text", text, "--cache-dir", str(tmp_path)]) == 0
        assert json.loads(capsys.readouterr().out)["ids"] == ids, (name, text)
    assert len(list(tmp_path.iterdir())) == 1                 # the tokenizer cache, built once


def test_plain_output_and_defaults(models, tmp_path, capsys):
    spm = str(vocab_file(models, "llama-spm"))
    text = "Hello world<s>"
    assert main(["tokenize", "--model", spm, "--text", text, "--cache-dir", str(tmp_path)]) == 0
    default = [int(i) for i in capsys.readouterr().out.split()]
    assert main(["tokenize", "--model", spm, "--text", text, "--no-bos", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n") and out.count("\n") == 1
    alone = [int(i) for i in out.split()]
    # default: BOS (the file's add_bos_token) and "<s>" parsed as BOS; --no-bos: neither
    assert default[0] == 1 and default[-1] == 1 and default[1:-1] == alone[:2] == [15043, 3186]
    assert 1 not in alone and len(alone) > 3
    assert main(["tokenize", "--model", spm, "--text", "", "--cache-dir", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ids": [1], "tokens": ["<s>"]}


def vocab_only_gguf(path, **tokenizer):
    """A GGUF with no tensors and only the given tokenizer keys (model, pre)."""
    w = gguf.GGUFWriter(str(path), "llama")
    if "model" in tokenizer:
        w.add_tokenizer_model(tokenizer["model"])
        w.add_token_list(["a", "b", "ab"])
        w.add_token_types([1, 1, 1])
        w.add_token_merges(["a b"])
    if "pre" in tokenizer:
        w.add_tokenizer_pre(tokenizer["pre"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_small_vocab_only_file(tmp_path, capsys):
    path = vocab_only_gguf(tmp_path / "v.gguf", model="gpt2", pre="gpt-2")
    assert main(["tokenize", "--model", str(path), "--text", "abba", "--cache-dir", str(tmp_path / "c")]) == 0
    assert capsys.readouterr().out == "2 1 0\n"


@pytest.mark.parametrize("case", ["missing", "not_gguf", "directory", "no_tokenizer", "unknown_pre", "wordpiece",
                                  "not_utf8"])
def test_bad_input_is_one_error_line(case, models, tmp_path):
    text: bytes | str = "x"
    if case == "missing":
        model, fragments = tmp_path / "nope.gguf", ["unknown model", "nope.gguf"]
    elif case == "not_gguf":
        model = tmp_path / "junk.gguf"
        model.write_bytes(b"not a model at all")
        fragments = [str(model), "not a GGUF file"]
    elif case == "directory":
        model, fragments = tmp_path, [str(tmp_path), "no tokenizer.json"]
    elif case == "no_tokenizer":
        model = vocab_only_gguf(tmp_path / "bare.gguf")
        fragments = [str(model), "tokenizer.ggml.model is missing"]
    elif case == "unknown_pre":
        model = vocab_only_gguf(tmp_path / "pre.gguf", model="gpt2", pre="chameleon-xyz")
        fragments = [str(model), "pre-tokenizer 'chameleon-xyz' is not supported"]
    elif case == "wordpiece":
        model = vocab_file(models, "bert-bge")
        fragments = [str(model), "tokenizer type 'bert' is not supported"]
    else:
        model, text = vocab_file(models, "qwen2"), b"caf\xe9"
        fragments = ["--text is not UTF-8 text"]
    p = lever_tokenize(["--model", str(model), "--text", text], tmp_path / "cache")
    one_error_line(p.returncode, p.stdout.decode(), p.stderr.decode(), *fragments)
