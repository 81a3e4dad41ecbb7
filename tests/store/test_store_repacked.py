"""Flash stores in the repacked weight layout (format version 3): `lever convert`
writes every matrix with a repacked form in 8-row groups (csrc/kernels/repack.h)
unless `--weight-layout gguf`; the streamed decoder multiplies them in place.

Checked here: the manifest records the layout and the repacked type ids; the
bytes are a permutation of the GGUF-layout store's; logits at 1 and 8 rows and
greedy tokens are the same bits as a GGUF-layout store and the model loaded
resident; embedding rows of a tied head and the probe's lens rows come back in
the GGUF layout; the torch reference, the NPU layer weights and the memory
plan see the same model; a version 2 store still loads (read as GGUF layout);
a newer version, a damaged extent and a bad option are one clear error.
Logits are compared with this CPU's default kernels, whose GGUF-layout and
repacked forms both equal the scalar kernels bit for bit."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from lever.cli import main
from lever.errors import ChecksumError, StoreError
from lever.memory.plan import store_minimum
from lever.reference.decoder import causal_mask
from lever.model.native_loader import load_gguf_native
from lever.reference.store_loader import load_store_model
from lever.model.streamed_decoder import StreamedDecoder
from lever.npu.layers import layer_weights
from lever.probe.features import head_rows
from lever.quant import REPACKABLE_TYPES, base_type, in_ggml_layout, is_repacked
from lever.store.convert import convert
from lever.store.manifest import FORMAT_VERSION, MANIFEST, WEIGHTS, StoreManifest
from lever.store.manifest_json import CHECKSUM_FIELD, digest
from lever.store.residency import plan_residency
from test_store import minimum_budget
from tiny_model import TOKENS, causal, lever_error_of, store_logits, write_tiny_gguf

TINY = ("llama", "qwen2")          # tied head (embedding rows from the head parts), untied


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """arch -> (gguf, repacked store, gguf-layout store) of the tiny Q8_0 models."""
    d = tmp_path_factory.mktemp("tiny-repacked")
    out = {}
    for arch in TINY:
        g = write_tiny_gguf(d / f"{arch}.gguf", arch, tied=arch == "llama")
        out[arch] = (g, convert(str(g), d / f"{arch}-repacked", progress=False),
                     convert(str(g), d / f"{arch}-gguf", progress=False, weight_layout="gguf"))
    return out


@pytest.fixture(scope="module")
def real(smollm2_path, qwen05_path, tmp_path_factory):
    """name -> (gguf, repacked store, gguf-layout store): SmolLM2 (tied Q8_0 head,
    Q4_1 layers) and Qwen2.5-Coder-0.5B (Q4_K, Q6_K, Q5_0, Q8_0)."""
    d = tmp_path_factory.mktemp("real-repacked")
    return {name: (path, convert(str(path), d / f"{name}-repacked", progress=False),
                   convert(str(path), d / f"{name}-gguf", progress=False, weight_layout="gguf"))
            for name, path in (("smol", smollm2_path), ("qwen", qwen05_path))}


def sources(which, request):
    """(gguf, repacked store, gguf-layout store) of a tiny arch or a real model."""
    if which in TINY:
        return request.getfixturevalue("tiny")[which]
    return request.getfixturevalue("real")[which]


WHICH = [*TINY, pytest.param("smol", marks=pytest.mark.real), pytest.param("qwen", marks=pytest.mark.real)]


def tensor_bytes(store, m: StoreManifest):
    """(extent, tensor, its bytes as stored) of every tensor of a store."""
    weights = np.fromfile(store / WEIGHTS, dtype=np.uint8)
    for e in m.extents:
        for t in e.tensors:
            yield e, t, weights[e.offset + t.offset:e.offset + t.offset + t.nbytes]


def as_version_2(store, dst):
    """A copy of `store` with the manifest a version 2 Lever wrote: no
    weight_layout field, format_version 2, sealed again."""
    shutil.copytree(store, dst)
    raw = json.loads((dst / MANIFEST).read_text())
    del raw["weight_layout"]
    raw["format_version"] = 2
    raw[CHECKSUM_FIELD] = digest(raw)
    (dst / MANIFEST).write_text(json.dumps(raw, indent=1))
    return dst


def token_ids(vocab: int, rows: int) -> np.ndarray:
    return (np.arange(rows, dtype=np.int64) * 7919 + 3) % vocab


def first_pass(model, rows: int) -> np.ndarray:
    """Float32 logits of one pass over `rows` tokens into a fresh cache."""
    ids = token_ids(model.config.vocab_size, rows)
    return np.asarray(model(ids, np.arange(rows), causal(rows), model.new_cache()))


def budgets(store) -> tuple[int, int]:
    """Bytes: the least budget (every extent streamed) and one pinning everything."""
    low = minimum_budget(store, dtype_bytes=4)
    return low, low + StoreManifest.load(store).weights_bytes


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


# -- what convert writes ----------------------------------------------------------

@pytest.mark.parametrize("which", WHICH)
def test_manifest_records_layout_and_repacked_ids(which, request):
    """Every layer and head matrix with a repacked form carries its repacked id,
    embedding parts and vectors their ggml id; the bytes are the GGUF-layout
    store's, permuted within each matrix (same sizes, offsets, extents)."""
    _, repacked, gguf = sources(which, request)
    r, g = StoreManifest.load(repacked), StoreManifest.load(gguf)
    assert FORMAT_VERSION == 3
    assert (r.format_version, r.weight_layout, g.format_version, g.weight_layout) == (3, "repacked", 3, "gguf")
    assert json.loads((repacked / MANIFEST).read_text())["weight_layout"] == "repacked"
    assert r.weights_bytes == g.weights_bytes
    moved = set()
    for (e, t, rb), (f, u, gb) in zip(tensor_bytes(repacked, r), tensor_bytes(gguf, g), strict=True):
        assert (e.name, e.offset, e.length, t.name, t.shape, t.offset, t.nbytes) == \
               (f.name, f.offset, f.length, u.name, u.shape, u.offset, u.nbytes)
        assert not is_repacked(u.qtype)
        should = e.kind in ("layer", "head") and len(t.shape) == 2 and u.qtype in REPACKABLE_TYPES
        assert t.qtype == (1000 + u.qtype if should else u.qtype), (e.name, t.name, t.qtype)
        restored, qtype = in_ggml_layout(rb, t.qtype, t.shape)
        assert qtype == u.qtype and np.array_equal(restored, gb), (e.name, t.name)
        if should:
            moved.add(base_type(t.qtype))
            assert not np.array_equal(rb, gb), (e.name, t.name)          # the bytes did move
    assert moved, "nothing was repacked"
    if which == "qwen":
        assert moved >= {12, 14}                                         # Q4_K and Q6_K


def test_one_list_of_repacked_types():
    """Stores and resident models take their types from one list (lever.quant),
    which names exactly the types the native core can repack."""
    from lever import _native, quant
    from lever.model import native_loader
    at_load = quant.repack_at_load_types()
    assert native_loader.repack_at_load_types is quant.repack_at_load_types
    assert at_load == (REPACKABLE_TYPES if _native.kernel_isa() == "avx512" else REPACKABLE_TYPES - {14})
    assert REPACKABLE_TYPES == {t for t in _native.supported_types()
                                if _native.can_repack(t, 8, _native.block_size(t))}


# -- the same model, bit for bit --------------------------------------------------

@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("which", WHICH)
def test_repacked_store_logits_equal_gguf_store_and_resident(which, rows, request, monkeypatch):
    """Streamed (every extent through the ring) and pinned, the repacked store gives
    the logits of the GGUF-layout store and of the model loaded resident (repacked
    at load where this CPU does that, and not)."""
    path, repacked, gguf = sources(which, request)
    ref = first_pass(load_gguf_native(path, "float32")[0], rows)
    monkeypatch.setenv("LEVER_REPACK", "0")
    assert np.array_equal(bits(first_pass(load_gguf_native(path, "float32")[0], rows)), bits(ref))
    for store in (repacked, gguf):
        for budget in budgets(store):
            model = StreamedDecoder(store, budget, "float32")
            try:
                assert np.array_equal(bits(first_pass(model, rows)), bits(ref)), (store.name, budget)
            finally:
                model.close()


@pytest.mark.real
def test_repacked_store_greedy_tokens_equal(real):
    path, repacked, gguf = real["smol"]
    runs = []
    for model in (load_gguf_native(path, "float32")[0], StreamedDecoder(repacked, budgets(repacked)[0], "float32"),
                  StreamedDecoder(gguf, budgets(gguf)[0], "float32")):
        cache, token, tokens = model.new_cache(64), np.array([1], dtype=np.int64), []
        for i in range(16):
            mask = np.ones((1, cache.length + 1), dtype=bool)
            token = np.asarray(model.forward(token, np.array([i]), mask, cache, head="argmax")).reshape(1)
            tokens.append(int(token[0]))
        runs.append(tokens)
        if isinstance(model, StreamedDecoder):
            model.close()
    assert runs[1] == runs[0] and runs[2] == runs[0]


@pytest.mark.parametrize("which", ["llama", pytest.param("smol", marks=pytest.mark.real)])
def test_tied_head_rows_come_back_in_gguf_layout(which, request):
    """A tied model's embedding rows and the probe's lens rows are read from the
    repacked head parts and restored (pread from flash, and from pinned parts)."""
    path, repacked, gguf = sources(which, request)
    assert StoreManifest.load(repacked).config.tie_word_embeddings
    resident = load_gguf_native(path, "float32")[0]
    vocab, hidden = resident.config.vocab_size, resident.config.hidden_size
    ids = np.unique(np.array([0, 1, 7, 8, 9, 63, 64, vocab // 2 + 5, vocab - 8, vocab - 1], dtype=np.int64) % vocab)
    want_rows, want_type = resident.weights.head_rows(ids)
    want_embed = np.zeros((len(ids), hidden), np.float32)
    resident.weights.embed(resident.native, ids, want_embed)
    for store in (repacked, gguf):
        for budget in budgets(store):
            model = StreamedDecoder(store, budget, "float32")
            try:
                rows, qtype = model.weights.head_rows(ids)
                assert qtype == want_type and np.array_equal(rows, want_rows), (store.name, budget)
                assert np.array_equal(head_rows(model.weights, ids), head_rows(resident.weights, ids))
                got = np.zeros_like(want_embed)
                model.weights.embed(model.native, ids, got)
                assert np.array_equal(bits(got), bits(want_embed)), (store.name, budget)
            finally:
                model.close()


def test_torch_reference_reads_repacked_stores(tiny):
    """The torch reference restores the GGUF layout: dequantised and quantised
    models of the two stores are the same."""
    for arch in TINY:
        _, repacked, gguf = tiny[arch]
        for quantized in (False, True):
            a, b = (load_store_model(s, torch.float32, quantized=quantized) for s in (repacked, gguf))
            for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
                assert torch.equal(p, q), name
            n = len(TOKENS)
            args = (torch.tensor(TOKENS), torch.arange(n), causal_mask(n, 0))
            with torch.no_grad():
                assert torch.equal(a(*args, a.new_cache()), b(*args, b.new_cache())), (arch, quantized)


def test_npu_layer_weights_restore_the_gguf_layout(tiny):
    """A static backend dequantises each layer from the store's buffer: the same
    values from a repacked and a GGUF-layout store."""
    _, repacked, gguf = tiny["qwen2"]
    models = [StreamedDecoder(s, budgets(s)[1], "float32") for s in (repacked, gguf)]
    try:
        for i in range(models[0].config.n_layers):
            a, b = (layer_weights(m.config, m.weights.layouts[i], m.weights.layer(i)[0], "float32") for m in models)
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a), i
    finally:
        for m in models:
            m.close()


def test_memory_plan_counts_the_same_bytes(tiny):
    """Repacked matrices take exactly their GGUF bytes: the same minimum and plans."""
    _, repacked, gguf = tiny["qwen2"]
    r, g = StoreManifest.load(repacked), StoreManifest.load(gguf)
    assert store_minimum(r) == store_minimum(g)
    low = sum(store_minimum(r).values())
    for budget in (low, low + 40_000, low + 10**6):
        a, b = plan_residency(r, budget), plan_residency(g, budget)
        assert a.summary() == b.summary()


# -- version 2 stores -------------------------------------------------------------

@pytest.mark.parametrize("arch", TINY)
def test_version_2_store_reads_as_gguf_layout(tiny, arch, tmp_path):
    """A store a version 2 Lever wrote loads as before (GGUF-layout kernels), its
    manifest checksum unchanged, and the stats say it is not repacked."""
    _, repacked, gguf = tiny[arch]
    old = as_version_2(gguf, tmp_path / "v2")
    m = StoreManifest.load(old)
    assert (m.format_version, m.weight_layout, m.repacked) == (2, "gguf", False)
    assert m.to_json()[CHECKSUM_FIELD] == json.loads((old / MANIFEST).read_text())[CHECKSUM_FIELD]
    logits = store_logits(old)
    assert np.array_equal(bits(logits), bits(store_logits(gguf)))
    assert np.array_equal(bits(logits), bits(store_logits(repacked)))
    model = StreamedDecoder(old, budgets(old)[0], "float32")
    try:
        report = model.report()
        assert (report["store_format_version"], report["weight_layout"]) == (2, "gguf")
    finally:
        model.close()


@pytest.mark.real
def test_cli_version_2_and_repacked_stores_generate_the_same(real, tmp_path, capsys):
    """`lever generate --json` on a version 2 store and on a repacked one: the same
    greedy tokens as the model in memory; the flash stats name each store's layout."""
    path, repacked, gguf = real["smol"]
    prompt = ["--prompt", "Write a haiku about flash memory.", "--max-new-tokens", "12", "--json"]
    assert main(["generate", "--model", str(path), *prompt]) == 0
    ref = json.loads(capsys.readouterr().out)["token_ids"]
    for store, version, layout in ((as_version_2(gguf, tmp_path / "v2"), 2, "gguf"), (repacked, 3, "repacked")):
        assert main(["generate", "--target-store", str(store), "--dram-budget", str(budgets(store)[0]),
                     "--mode", "ar", *prompt]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["token_ids"] == ref, store
        assert (out["flash"]["store_format_version"], out["flash"]["weight_layout"]) == (version, layout)


def test_version_2_manifest_with_repacked_ids_is_refused(tiny, tmp_path):
    old = as_version_2(tiny["qwen2"][1], tmp_path / "v2")
    with pytest.raises(StoreError, match="repacked type in a store whose weight_layout is 'gguf'"):
        StoreManifest.load(old)


@pytest.mark.parametrize("version", [4, 99])
def test_newer_version_is_one_error_line(tiny, tmp_path, capsys, version):
    store = tmp_path / "new"
    shutil.copytree(tiny["qwen2"][1], store)
    raw = json.loads((store / MANIFEST).read_text())
    raw["format_version"] = version
    (store / MANIFEST).write_text(json.dumps(raw))
    rc = main(["generate", "--target-store", str(store), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("lever: error: ") and f"store format version {version} is newer than this Lever" in err


# -- damage and bad options ---------------------------------------------------------

def damage_repacked_matrix(source, dst, extent: str):
    """A copy of store `source` with one bit flipped in the middle of the first
    repacked matrix of `extent`."""
    shutil.copytree(source, dst)
    e = next(x for x in StoreManifest.load(dst).extents if x.name == extent)
    t = next(t for t in e.tensors if is_repacked(t.qtype))
    pos = e.offset + t.offset + t.nbytes // 2
    with open(dst / WEIGHTS, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x04]))
    return dst


@pytest.mark.parametrize("arch,extent", [("qwen2", "layer.1"), ("qwen2", "head.0"), ("llama", "head.0")])
def test_damaged_repacked_extent_is_a_checksum_error(tiny, tmp_path, arch, extent):
    """The checksums cover the bytes as stored: a flipped bit in a repacked matrix
    (for the tied llama, in the head parts its embedding rows come from) is the
    usual checksum error naming the extent."""
    store = damage_repacked_matrix(tiny[arch][1], tmp_path / "bad", extent)
    err = lever_error_of(lambda: store_logits(store))
    assert isinstance(err, ChecksumError) and extent in str(err), repr(err)


@pytest.mark.real
def test_cli_damaged_repacked_extent_is_one_error_line(real, tmp_path, capsys):
    store = damage_repacked_matrix(real["smol"][1], tmp_path / "bad", "layer.1")
    rc = main(["generate", "--target-store", str(store), "--dram-budget", str(budgets(store)[0]),
               "--prompt", "hi", "--max-new-tokens", "2", "--mode", "ar"])
    lines = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("lever: error: "), lines
    assert "checksum mismatch in layer.1" in lines[0], lines


def test_bf16_store_records_the_gguf_layout(tiny, tmp_path):
    m = StoreManifest.load(convert(str(tiny["qwen2"][0]), tmp_path / "bf16", storage="bf16", progress=False))
    assert m.weight_layout == "gguf" and not any(is_repacked(t.qtype) for e in m.extents for t in e.tensors)


def test_convert_weight_layout_option(tiny, tmp_path, capsys):
    g = tiny["qwen2"][0]
    assert main(["convert", str(g), "--out", str(tmp_path / "s"), "--weight-layout", "gguf"]) == 0
    assert "gguf layout" in capsys.readouterr().err
    assert StoreManifest.load(tmp_path / "s").weight_layout == "gguf"
    for bad in ("r8", "", "GGUF", "repacked,gguf"):
        rc = main(["convert", str(g), "--out", str(tmp_path / "t"), "--weight-layout", bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1, err
        assert err[0].startswith("lever: error: argument --weight-layout: expected one of repacked, gguf"), err
    assert not (tmp_path / "t").exists()
    with pytest.raises(StoreError, match="unknown weight layout 'r8'"):
        convert(str(g), tmp_path / "u", progress=False, weight_layout="r8")
