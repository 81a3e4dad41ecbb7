"""A store is checked before use: the manifest's own checksum, every field of
it, and its files (regular files inside the store only). Each corruption of
a tiny store must end in exactly one LeverError naming the field -- no
other exception, no hang, no silent success -- and on the command line in
one `lever: error:` line with exit status 2."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from lever.cli import main
from lever.errors import ChecksumError, StoreError
from lever.store.convert import convert
from lever.store.manifest import FORMAT_VERSION, MANIFEST, TOKENIZER, WEIGHTS, StoreManifest
from lever.store.manifest_json import CHECKSUM_FIELD, digest
from tiny_model import lever_error_of, native_logits, store_logits, write_tiny_gguf


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """(gguf, store) of a tied llama and an untied qwen2 tiny model."""
    d = tmp_path_factory.mktemp("tiny")
    out = {}
    for arch, tied in (("llama", True), ("qwen2", False)):
        g = write_tiny_gguf(d / f"{arch}.gguf", arch, tied)
        out[arch] = (g, convert(str(g), d / f"store-{arch}", progress=False))
    return out


def copy_of(sources, tmp_path, arch="qwen2"):
    dst = tmp_path / "store"
    shutil.copytree(sources[arch][1], dst)
    return dst


# -- manifest edits ------------------------------------------------------------------

def edit(fn, reseal=False):
    """A corruption that rewrites manifest.json after fn(raw); `reseal` recomputes
    its checksum (a forged manifest: only the field checks can catch it)."""
    def apply(store):
        raw = json.loads((store / MANIFEST).read_text())
        fn(raw)
        if reseal:
            raw[CHECKSUM_FIELD] = digest(raw)
        (store / MANIFEST).write_text(json.dumps(raw))
    return apply


def layer(raw, i):
    return next(e for e in raw["extents"] if e["name"] == f"layer.{i}")


def extent(raw, name):
    return next(e for e in raw["extents"] if e["name"] == name)


def swap_layer_data(raw):
    a, b = layer(raw, 0), layer(raw, 1)
    for key in ("offset", "chunk_crc32c"):
        a[key], b[key] = b[key], a[key]


def swap_layer_entries(raw):
    ex = raw["extents"]
    ex[0], ex[1] = ex[1], ex[0]


def setter(path, value):
    def fn(raw):
        obj = raw
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return fn


def delete(key):
    return lambda raw: raw.pop(key)


def write_text(text):
    return lambda store: (store / MANIFEST).write_text(text)


def nested(depth):
    return write_text('{"format": "lever-store", "format_version": 2, "source": ' + "[" * depth + "]" * depth + "}")


T0 = ("extents", 0, "tensors", 1)          # layer.0's q projection
CHECKSUM = "manifest_sha256 does not match"
MANIFEST_CASES = {
    "rope_theta edited": (edit(setter(("config", "rope_theta"), 20000.0)), CHECKSUM),
    "rms_norm_eps edited": (edit(setter(("config", "rms_norm_eps"), 1e-4)), CHECKSUM),
    "max_context edited": (edit(setter(("config", "max_context"), 128)), CHECKSUM),
    "source name edited": (edit(setter(("source", "name"), "x")), CHECKSUM),
    "two layers swapped with their CRCs": (edit(swap_layer_data), "extent layer.0 is inconsistent"),
    "two layer entries swapped, resealed": (edit(swap_layer_entries, reseal=True), "extents[0] is 'layer.1'"),
    "two layers swapped with their CRCs, resealed": (edit(swap_layer_data, reseal=True), "extents[0].offset"),
    "tensor offset +64": (edit(setter(T0 + ("offset",), 64 + 64 * 0)), "tensors[1]"),
    "tensor offset +64, resealed": (edit(lambda r: r["extents"][0]["tensors"][1].update(
        offset=r["extents"][0]["tensors"][1]["offset"] + 64), reseal=True), "extents[0].tensors[1]"),
    "extent offset +4096": (edit(lambda r: layer(r, 1).update(offset=layer(r, 1)["offset"] + 4096)),
                            "extent layer.1 is inconsistent"),
    "chunk_bytes 0": (edit(setter(("chunk_bytes",), 0)), "chunk_bytes 0 is outside"),
    "alignment 0": (edit(setter(("alignment",), 0)), "alignment 0 is outside"),
    "chunk_bytes 3000": (edit(setter(("chunk_bytes",), 3000), reseal=True), "chunk_bytes 3000"),
    "alignment 64": (edit(setter(("alignment",), 64), reseal=True), "alignment 64"),
    "weights_bytes +4096": (edit(lambda r: r.update(weights_bytes=r["weights_bytes"] + 4096)), "weights_bytes"),
    "storage removed": (edit(delete("storage")), "storage is missing"),
    "storage unknown": (edit(setter(("storage",), "q2"), reseal=True), "storage 'q2'"),
    "offset as a string": (edit(lambda r: layer(r, 1).update(offset=str(layer(r, 1)["offset"]))),
                           "extents[1].offset must be an integer"),
    "offset as a float": (edit(lambda r: layer(r, 1).update(offset=float(layer(r, 1)["offset"]))),
                          "extents[1].offset must be an integer"),
    "qtype as a bool": (edit(setter(T0 + ("qtype",), True)), "tensors[1].qtype must be an integer"),
    "extents as an object": (edit(setter(("extents",), {})), "extents must be a list"),
    "checksum removed": (edit(delete(CHECKSUM_FIELD)), "manifest_sha256 is missing"),
    "checksum edited": (edit(setter((CHECKSUM_FIELD,), "0" * 64)), CHECKSUM),
    "format version 1": (edit(setter(("format_version",), 1)), "version 1 is not supported"),
    "unknown field": (edit(setter(("extra",), 1), reseal=True), "extra is not a field"),
    "NaN": (write_text('{"format": "lever-store", "format_version": 2, "x": NaN}'), "not valid JSON"),
    "not JSON": (write_text("{not json"), "not valid JSON"),
    "a JSON list": (write_text("[1, 2]"), "not an object"),
    "deep nesting": (nested(100000), "malformed manifest"),
    "layer removed": (edit(lambda r: r["extents"].remove(layer(r, 1))), "missing layer.1"),
    "n_layers 2^31, resealed": (edit(setter(("config", "n_layers"), 1 << 31), reseal=True), "n_layers"),
    "n_layers 3, resealed": (edit(setter(("config", "n_layers"), 3), reseal=True), "missing layer.2"),
    "n_kv_heads 0, resealed": (edit(setter(("config", "n_kv_heads"), 0), reseal=True), "n_kv_heads 0"),
    "rope_theta -1, resealed": (edit(setter(("config", "rope_theta"), -1.0), reseal=True), "rope_theta"),
    "rms_norm_eps -1, resealed": (edit(setter(("config", "rms_norm_eps"), -1.0), reseal=True), "rms_norm_eps"),
    "hidden_size 128, resealed": (edit(setter(("config", "hidden_size"), 128), reseal=True), "shape"),
    "qtype 99, resealed": (edit(setter(T0 + ("qtype",), 99), reseal=True), "qtype 99"),
    "qtype F16 for Q8_0, resealed": (edit(setter(T0 + ("qtype",), 1), reseal=True), "nbytes"),
    "shape edited, resealed": (edit(setter(T0 + ("shape",), [32, 64]), reseal=True), "shape [32, 64]"),
    "nbytes edited, resealed": (edit(setter(T0 + ("nbytes",), 10), reseal=True), "nbytes 10"),
    "head rows edited, resealed": (edit(lambda r: next(e for e in r["extents"] if e["name"] == "head.0")
                                        .update(rows=[0, 32]), reseal=True), "head parts end at row 32"),
    "CRC dropped, resealed": (edit(lambda r: layer(r, 0)["chunk_crc32c"].append(1), reseal=True),
                              "chunk_crc32c holds"),
    "CRC out of range": (edit(lambda r: layer(r, 0).update(chunk_crc32c=[1 << 33])), "chunk_crc32c"),
    "format version 4": (edit(setter(("format_version",), 4)), "version 4 is newer than this Lever reads"),
    "version 2 with a weight_layout, resealed": (edit(setter(("format_version",), 2), reseal=True),
                                                 "weight_layout is not a field"),
    "weight_layout removed": (edit(delete("weight_layout")), "weight_layout is missing"),
    "weight_layout unknown, resealed": (edit(setter(("weight_layout",), "r8"), reseal=True), "weight_layout 'r8'"),
    "max_context 2^24, resealed": (edit(setter(("config", "max_context"), 1 << 24), reseal=True),
                                   "max_context 16777216 is outside 1..4194304"),
    "source path /dev/zero, resealed": (edit(setter(("source", "path"), "/dev/zero"), reseal=True),
                                        "source.path '/dev/zero' is a character device, not a GGUF file"),
    "source path a directory, resealed": (edit(setter(("source", "path"), "/"), reseal=True),
                                          "source.path '/' is a directory"),
    "source path a FIFO, resealed": (lambda store: (os.mkfifo(store.parent / "source.fifo"), edit(
        setter(("source", "path"), str(store.parent / "source.fifo")), reseal=True)(store)), "is a FIFO, not a GGUF"),
    "source path a number, resealed": (edit(setter(("source", "path"), 7), reseal=True),
                                       "source.path must be a string"),
    "source a list, resealed": (edit(setter(("source",), []), reseal=True), "source must be an object"),
    "repacked ids in a gguf-layout store, resealed": (edit(setter(("weight_layout",), "gguf"), reseal=True),
                                                      "repacked type in a store whose weight_layout is 'gguf'"),
    "repacked id in an embedding part, resealed": (edit(lambda r: extent(r, "embed.0")["tensors"][0].update(qtype=1008),
                                                        reseal=True), "repacked type in an embedding part"),
    "repacked id of F32, resealed": (edit(setter(("extents", 0, "tensors", 0, "qtype"), 1000), reseal=True),
                                     "qtype 1000 is not a type"),
}


# -- file-level corruptions ------------------------------------------------------------

def truncate_weights(store):
    with open(store / WEIGHTS, "r+b") as f:
        f.truncate(os.path.getsize(store / WEIGHTS) - 4096)


def fifo(name):
    def apply(store):
        os.unlink(store / name)
        os.mkfifo(store / name)
    return apply


def outside_link(name):
    def apply(store):
        outside = store.parent / f"outside-{name}"
        shutil.copyfile(store / name, outside)
        os.unlink(store / name)
        os.symlink(outside, store / name)
    return apply


def directory(name):
    def apply(store):
        os.unlink(store / name)
        os.mkdir(store / name)
    return apply


def link_loop(name, *chain):
    """`name` replaced by a symbolic link into a loop: name -> chain[0] -> ... -> chain[-1] -> chain[0]."""
    def apply(store):
        os.unlink(store / name)
        links = [name, *chain]
        for here, there in zip(links, links[1:] + [chain[0]]):
            if not os.path.lexists(store / here):
                os.symlink(there, store / here)
    return apply


def edit_tokenizer(store):
    raw = json.loads((store / TOKENIZER).read_text())
    raw["tokenizer.ggml.tokens"][3] = "edited"
    (store / TOKENIZER).write_text(json.dumps(raw))


FILE_CASES = {
    "weights truncated": (truncate_weights, "does not match the manifest"),
    "tokenizer edited": (edit_tokenizer, "tokenizer_sha256"),
    "weights is a FIFO": (fifo(WEIGHTS), "not a regular file (a FIFO)"),
    "manifest is a FIFO": (fifo(MANIFEST), "not a regular file (a FIFO)"),
    "tokenizer is a FIFO": (fifo(TOKENIZER), "not a regular file (a FIFO)"),
    "weights links out of the store": (outside_link(WEIGHTS), "symbolic link out of the store"),
    "manifest links out of the store": (outside_link(MANIFEST), "symbolic link out of the store"),
    "weights is a directory": (directory(WEIGHTS), "not a regular file (a directory)"),
    "weights is a symlink loop": (link_loop(WEIGHTS, WEIGHTS), "a symbolic link that cannot be resolved"),
    "weights is a two-link loop": (link_loop(WEIGHTS, "a", "b"), "a symbolic link that cannot be resolved"),
    "manifest is a symlink loop": (link_loop(MANIFEST, MANIFEST), "a symbolic link that cannot be resolved"),
    "weights missing": (lambda s: os.unlink(s / WEIGHTS), "weights.bin is missing"),
    "manifest missing": (lambda s: os.unlink(s / MANIFEST), "not a Lever store"),
}
CASES = {**MANIFEST_CASES, **FILE_CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_corrupt_store_is_one_clear_error(sources, tmp_path, case):
    store = copy_of(sources, tmp_path)
    corrupt, fragment = CASES[case]
    corrupt(store)
    err = lever_error_of(lambda: store_logits(store))
    assert err is not None, f"{case}: loaded without an error"
    assert isinstance(err, StoreError), repr(err)
    assert fragment in str(err) and str(store) in str(err), str(err)


@pytest.mark.parametrize("case", ["rope_theta edited", "two layers swapped with their CRCs", "chunk_bytes 0",
                                  "weights is a FIFO", "deep nesting", "weights is a symlink loop",
                                  "max_context 2^24, resealed", "source path /dev/zero, resealed"])
def test_cli_prints_one_error_line(sources, tmp_path, capsys, case):
    store = copy_of(sources, tmp_path)
    CASES[case][0](store)
    rc = main(["generate", "--target-store", str(store), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("lever: error: ") and len(err.splitlines()) == 1, err
    assert CASES[case][1] in err


# -- weights.bin edits that keep its size: the per-chunk CRC32C ------------------------

@pytest.mark.parametrize("arch,extent,where", [("qwen2", "layer.1", 100), ("qwen2", "embed.0", 300),
                                               ("qwen2", "head.0", 5), ("llama", "head.0", 5),
                                               ("qwen2", "globals", 10), ("qwen2", "layer.0", -1)])
def test_flipped_weights_byte_is_a_checksum_error(sources, tmp_path, arch, extent, where):
    """Anywhere in weights.bin, padding included (where=-1: the extent's last byte);
    embedding rows, read on demand, are checked too."""
    store = copy_of(sources, tmp_path, arch)
    e = next(x for x in StoreManifest.load(store).extents if x.name == extent)
    pos = e.offset + (where if where >= 0 else e.length - 1)
    with open(store / WEIGHTS, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))
    err = lever_error_of(lambda: store_logits(store))
    assert isinstance(err, ChecksumError) and extent in str(err), repr(err)


# -- what must still work ----------------------------------------------------------------

@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_store_equals_its_gguf(sources, arch):
    g, store = sources[arch]
    assert (store_logits(store) == native_logits(g)).all()


@pytest.mark.parametrize("source_path", ["gone", "regular"])
def test_a_source_gguf_deleted_or_in_place_is_fine(sources, tmp_path, source_path):
    """source.path only has to be a regular file if it exists: a converted GGUF may be deleted."""
    store = copy_of(sources, tmp_path)
    path = tmp_path / "gone.gguf" if source_path == "gone" else sources["qwen2"][0]
    edit(setter(("source", "path"), str(path)), reseal=True)(store)
    assert StoreManifest.load(store).source["path"] == str(path)


def test_reformatted_manifest_still_loads(sources, tmp_path):
    """The checksum covers the content, not its spacing or key order."""
    store = copy_of(sources, tmp_path)
    raw = json.loads((store / MANIFEST).read_text())
    (store / MANIFEST).write_text(json.dumps(dict(reversed(list(raw.items()))), indent=4))
    assert (store_logits(store) == store_logits(sources["qwen2"][1])).all()


def test_symlink_inside_the_store_is_followed(sources, tmp_path):
    store = copy_of(sources, tmp_path)
    os.rename(store / WEIGHTS, store / "data.bin")
    os.symlink("data.bin", store / WEIGHTS)
    assert (store_logits(store) == store_logits(sources["qwen2"][1])).all()


def test_manifest_records_its_checksum(sources):
    raw = json.loads((sources["qwen2"][1] / MANIFEST).read_text())
    assert raw["format_version"] == FORMAT_VERSION == 3 and raw[CHECKSUM_FIELD] == digest(raw)
