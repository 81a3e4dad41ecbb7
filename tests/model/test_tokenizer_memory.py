"""What a tokenizer costs in resident memory: `import lever`, then a GGUF's
tokenizer loaded from the tokenizer cache, measured as the process's peak
(VmHWM, lever.memory.rss) in a fresh interpreter; and the laziness that keeps
it low (GGUFFile leaves big metadata arrays in the file, the cache key hashes
raw bytes, a cache hit decodes no vocabulary).

Measured warm (cache hit; tokenizers 0.23, Python 3.11): `import lever` 12 MB;
SmolLM2-135M (49,152 tokens) 41 MB; Qwen2.5-Coder (151,936 tokens) 79 MB from
the GGUF and 79 MB from a store's tokenizer_metadata.json.  Qwen cannot meet
60 MB with the `tokenizers` BPE model: its imports (interpreter and lever 12,
tokenizers 6, hashlib/json and the stdlib the tokenizer modules use 8) come to
~26 MB and the Rust BPE model of a 151,646-entry vocabulary holds ~42 MB
resident (+53 MB at its peak while `BPE.from_file` reads vocab.json and
merges.txt).  The bars sit ~10% above the measurements, so a regression
(decoding the vocabulary on a cache hit: +31 MB for Qwen; importing numpy or
gguf on the tokenizer path: +16 MB; the cache going back to one
tokenizer.json: +76 MB) fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from lever.errors import ModelFormatError
from lever.gguf import file as gguf_file
from lever.gguf.file import GGUFFile, LazyArray
from lever.model import tokenizer_gguf
from lever.model.tokenizer import Tokenizer
from waiting import deadline

MB = 1_000_000

MEASURE = """
import json, sys
import lever
from lever.memory.rss import read_status
after_import = read_status()["VmHWM"]
from lever.gguf.file import GGUFFile
from lever.model.tokenizer import Tokenizer
kind, path, cache = sys.argv[1:4]
if kind == "gguf":
    tok = Tokenizer.from_gguf(GGUFFile(path), cache_dir=cache)
else:
    tok = Tokenizer.from_metadata_file(path, cache_dir=cache)
assert tok.encode("def fib(n): return n")
print(json.dumps({"import": after_import, "peak": read_status()["VmHWM"],
                  "heavy": sorted(m for m in ("torch", "aiohttp", "transformers", "matplotlib", "tqdm", "jinja2",
                                              "numpy", "gguf") if m in sys.modules)}))
"""


def measure(kind: str, path, cache_dir) -> dict:
    """Peak RSS (bytes) after `import lever` and after the tokenizer of `path` (kind "gguf" or
    "json": a store's tokenizer_metadata.json), in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", MEASURE, kind, str(path), str(cache_dir)], capture_output=True,
                         text=True, check=True, timeout=deadline(300))
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_metadata_json(gguf, path):
    """The tokenizer metadata of `gguf` as a flash store keeps it (lever.store.convert)."""
    md = GGUFFile(gguf).metadata
    path.write_text(json.dumps({k: v for k, v in md.items() if k.startswith("tokenizer.")}))
    return path


@pytest.mark.real
@pytest.mark.parametrize("model, kind, bar_mb", [
    ("smollm2_path", "gguf", 60),           # the embedded default: the bar
    ("qwen05_path", "gguf", 88),            # 151k vocabulary: ~26 MB imports + ~42 MB Rust BPE (see above)
    ("qwen05_path", "json", 88),
])
def test_tokenizer_memory(model, kind, bar_mb, request, tmp_path):
    path = request.getfixturevalue(model)
    if kind == "json":
        path = write_metadata_json(path, tmp_path / "tokenizer_metadata.json")
    cache = tmp_path / "cache"
    measure(kind, path, cache)                 # builds and caches the tokenizer
    m = measure(kind, path, cache)             # the usual case: a cache hit
    assert m["import"] <= 20 * MB, m
    assert m["peak"] <= bar_mb * MB, f"{m['peak'] / MB:.1f} MB > {bar_mb} MB"
    assert m["heavy"] == [], m


def test_api_import_is_light():
    """`import lever.api` pulls in no server, plotting, progress-bar, GGUF or torch packages
    (the GGUF machinery is imported when a model is looked up or loaded)."""
    code = ("import sys, lever.api\nfrom lever.memory.rss import read_status\n"
            "print([m for m in ('torch', 'aiohttp', 'transformers', 'matplotlib', 'tqdm', 'gguf') if m in sys.modules],"
            " read_status()['VmHWM'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=deadline(120)).stdout.split("]")
    assert out[0] + "]" == "[]"
    assert int(out[1]) <= 45 * MB


# --------------------------------------------------------------------------- laziness


@pytest.fixture(scope="module")
def big_vocab_gguf(tmp_path_factory):
    """A tiny model whose 5,000-token vocabulary is over `LAZY_ARRAY_MIN`."""
    from tiny_model import write_tiny_gguf
    return write_tiny_gguf(tmp_path_factory.mktemp("lazy") / "tiny.gguf", vocab=5000)


def test_big_arrays_stay_in_the_file_until_read(big_vocab_gguf, monkeypatch):
    g = GGUFFile(big_vocab_gguf)
    assert isinstance(g.metadata._values["tokenizer.ggml.tokens"], LazyArray)
    assert not g.metadata.is_loaded("tokenizer.ggml.tokens")
    assert not g.metadata.is_loaded("tokenizer.ggml.token_type")
    tokens = g.metadata["tokenizer.ggml.tokens"]
    assert g.metadata.is_loaded("tokenizer.ggml.tokens") and g.metadata["tokenizer.ggml.tokens"] is tokens
    monkeypatch.setattr(gguf_file, "LAZY_ARRAY_MIN", 1 << 62)       # the eager parse gives the same values
    eager = GGUFFile(big_vocab_gguf).metadata
    assert not isinstance(eager._values["tokenizer.ggml.tokens"], LazyArray)
    assert dict(eager) == dict(g.metadata)
    assert tokens[:3] == ["t0", "t1", "t2"] and len(tokens) == 5000
    assert g.metadata["tokenizer.ggml.token_type"] == [1] * 5000


def test_corrupt_string_in_a_lazy_array_fails_at_parse(big_vocab_gguf, tmp_path):
    bad = shutil.copy(big_vocab_gguf, tmp_path / "bad.gguf")
    start = GGUFFile(bad).metadata._values["tokenizer.ggml.tokens"].start
    with open(bad, "r+b") as f:                       # the 100th token's length: past the end of the file
        f.seek(start)
        for _ in range(100):
            n = int.from_bytes(f.read(8), "little")
            f.seek(n, os.SEEK_CUR)
        f.write((1 << 29).to_bytes(8, "little"))
    with pytest.raises(ModelFormatError, match="truncated GGUF header"):
        GGUFFile(bad)


def test_metadata_digest_hashes_raw_bytes(big_vocab_gguf, tmp_path):
    keys = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.merges")
    g = GGUFFile(big_vocab_gguf)
    digest = g.metadata_digest(keys)
    assert not g.metadata.is_loaded("tokenizer.ggml.tokens")
    assert GGUFFile(shutil.copy(big_vocab_gguf, tmp_path / "copy.gguf")).metadata_digest(keys) == digest
    assert g.metadata_digest(keys[:2]) != digest                  # an absent key still counts
    edited = shutil.copy(big_vocab_gguf, tmp_path / "edited.gguf")
    start = g.metadata._values["tokenizer.ggml.tokens"].start
    with open(edited, "r+b") as f:                                 # token 0: "t0" -> "x0"
        f.seek(start + 8)
        f.write(b"x")
    e = GGUFFile(edited)
    assert e.metadata_digest(keys) != digest and e.metadata["tokenizer.ggml.tokens"][0] == "x0"


@pytest.mark.real
def test_cache_hit_decodes_no_vocabulary(qwen05_path, tmp_path, monkeypatch):
    first = Tokenizer.from_gguf(GGUFFile(qwen05_path), cache_dir=tmp_path)
    g = GGUFFile(qwen05_path)
    hit = Tokenizer.from_gguf(g, cache_dir=tmp_path)
    assert not any(g.metadata.is_loaded(k) for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                                      "tokenizer.ggml.token_type"))
    assert hit.encode("Hello world") == first.encode("Hello world") == [9707, 1879]
    assert (hit.eos_token_ids, hit.chat_template, hit.vocab_size) == \
           (first.eos_token_ids, first.chat_template, first.vocab_size)
    # A store's metadata file: hashed as bytes on a hit, never parsed.
    meta = write_metadata_json(qwen05_path, tmp_path / "tokenizer_metadata.json")
    built = Tokenizer.from_metadata_file(meta, cache_dir=tmp_path / "store")
    monkeypatch.setattr(tokenizer_gguf.MetadataFile, "metadata",
                        property(lambda self: pytest.fail("parsed the metadata on a cache hit")))
    again = Tokenizer.from_metadata_file(meta, cache_dir=tmp_path / "store")
    assert again.encode("Hello world") == built.encode("Hello world") == [9707, 1879]


def test_metadata_file_errors(tmp_path):
    with pytest.raises(ModelFormatError, match="no such file"):
        Tokenizer.from_metadata_file(tmp_path / "missing.json", cache_dir=tmp_path)
    (tmp_path / "bad.json").write_text("{ not json")
    with pytest.raises(ModelFormatError, match="cannot read the tokenizer metadata"):
        Tokenizer.from_metadata_file(tmp_path / "bad.json", cache_dir=tmp_path)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ModelFormatError, match="not a JSON object"):
        Tokenizer.from_metadata_file(tmp_path / "list.json")


def test_ggml_type_table_matches_gguf():
    from gguf.constants import GGML_QUANT_SIZES
    assert {int(t): (t.name, *sizes) for t, sizes in GGML_QUANT_SIZES.items()} == gguf_file.GGML_TYPES
