"""llama.cpp's vocab goldens for the tokenizer tests: the vocab-only GGUFs in
vendor/llama.cpp/models of the llama-cpp-python sdist (tests/llamacpp_source.py
fetches it into $LEVER_LLAMACPP_DIR, default ~/.cache/lever/llamacpp), each
with `<name>.gguf.inp` (the inputs, separated by SEPARATOR) and
`<name>.gguf.out` (one line of space-separated ids per input, encoded without
special tokens: no BOS, special-token text not parsed).  The files are read
as llama.cpp's tests/test-tokenizer-0.cpp reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamacpp_source import DEFAULT_CACHE, SourceUnavailable, llama_source

SEPARATOR = "\n__ggml_vocab_test__\n"


def vocab_dir() -> Path:
    """vendor/llama.cpp/models, fetched when absent; a skip only when pip cannot
    reach an index (no network), any other failure fails."""
    try:
        return llama_source(DEFAULT_CACHE) / "models"
    except SourceUnavailable as e:
        if e.offline:
            pytest.skip(f"llama.cpp's vocab goldens cannot be downloaded (no network?): {e}")
        raise


def vocab_file(models: Path, name: str) -> Path:
    return models / f"ggml-vocab-{name}.gguf"


def goldens(models: Path, name: str) -> list[tuple[str, list[int]]]:
    """(input text, golden ids) of the vocab `name`: the inputs split at each
    SEPARATOR (a separator at the very end ends the last input), the ids one
    line each."""
    raw = Path(f"{vocab_file(models, name)}.inp").read_bytes().decode("utf-8")
    inputs = raw.split(SEPARATOR)
    if raw.endswith(SEPARATOR):
        inputs.pop()
    lines = Path(f"{vocab_file(models, name)}.out").read_text(encoding="utf-8").splitlines()
    assert len(inputs) == len(lines), f"{name}: {len(inputs)} inputs, {len(lines)} lines of ids"
    return [(text, [int(i) for i in line.split()]) for text, line in zip(inputs, lines)]
