"""Flash store: conversion round trip, streamed forward == in-memory forward,
reader backends, and every way a store or a budget can be wrong."""

import json
import shutil

import numpy as np
import pytest
import torch

from lever.cli import main
from lever.errors import ChecksumError, DramBudgetError, StoreError
from lever.reference.gguf_loader import load_gguf_model
from lever.model.native_loader import load_gguf_native
from lever.reference.store_loader import load_store_model
from lever.model.streamed_decoder import StreamedDecoder
from lever.store import convert as convert_mod
from lever.store.convert import convert
from lever.store.manifest import MANIFEST, WEIGHTS, StoreManifest
from lever.store.residency import plan_residency
from lever.values import parse_size
from tiny_model import causal

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def qwen_store(qwen05_path, tmp_path_factory):
    """Qwen2.5-Coder-0.5B (qwen2, untied head, q/k/v bias, Q4_K/Q5_0/Q6_K/Q8_0 blocks)."""
    return convert(str(qwen05_path), tmp_path_factory.mktemp("stores") / "qwen", progress=False)


@pytest.fixture(scope="module")
def smol_bf16_store(smollm2_path, tmp_path_factory):
    return convert(str(smollm2_path), tmp_path_factory.mktemp("stores") / "smol-bf16", storage="bf16",
                   progress=False)


def minimum_budget(store, **kw) -> int:
    with pytest.raises(DramBudgetError) as e:
        plan_residency(StoreManifest.load(store), 0, **kw)
    return parse_size(str(e.value).split("minimum of ")[1].split(" MB")[0].replace(",", "") + "MB") + 10**6


def full_budget(store) -> int:
    m = StoreManifest.load(store)
    return 10 * m.weights_bytes


# -- conversion -------------------------------------------------------------------

@pytest.mark.parametrize("which", ["smol", "qwen"])
def test_store_round_trip_equals_source(which, request, smollm2_path, qwen05_path):
    """Every tensor read back from the store equals the source's (dequantised, fp32, exact)."""
    store = request.getfixturevalue(f"{which}_store")
    source = smollm2_path if which == "smol" else qwen05_path
    ref, _ = load_gguf_model(source, torch.float32, quantized=False)
    got = load_store_model(store, torch.float32)
    ref_params, got_params = dict(ref.named_parameters()), dict(got.named_parameters())
    assert ref_params.keys() == got_params.keys()
    for name, p in ref_params.items():
        assert torch.equal(p, got_params[name]), name


def test_bf16_store_round_trip(smol_bf16_store, smollm2_path):
    ref, _ = load_gguf_model(smollm2_path, torch.bfloat16, quantized=False)
    got = load_store_model(smol_bf16_store, "bfloat16")
    for (name, p), (_, q) in zip(ref.named_parameters(), got.named_parameters()):
        assert torch.equal(p, q), name


def test_store_layout(qwen_store):
    m = StoreManifest.load(qwen_store)
    assert len(m.layers) == m.config.n_layers == 24
    for e in m.extents:
        assert e.offset % 4096 == 0 and e.length % 4096 == 0
    # one layer = one contiguous extent, back to back in file order
    offsets = [e.offset for e in m.layers]
    assert offsets == sorted(offsets)
    assert all(a.offset + a.length == b.offset for a, b in zip(m.layers, m.layers[1:]))
    assert m.storage == "source"
    assert m.weight_layout == "repacked"
    assert {t.qtype for e in m.layers for t in e.tensors} >= {1012, 1014}   # Q4_K and Q6_K kept as blocks, repacked


def test_conversion_is_atomic(smollm2_path, tmp_path, monkeypatch):
    calls = {"n": 0}
    real_add = convert_mod._StoreWriter.add

    def crashing_add(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("simulated crash")
        return real_add(self, *a, **kw)

    monkeypatch.setattr(convert_mod._StoreWriter, "add", crashing_add)
    out = tmp_path / "store"
    with pytest.raises(RuntimeError, match="simulated crash"):
        convert(str(smollm2_path), out, progress=False)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []        # no half-written temp directory left


def test_convert_refuses_to_overwrite(smol_store, smollm2_path):
    with pytest.raises(StoreError, match="already exists"):
        convert(str(smollm2_path), smol_store, progress=False)


# -- streaming ----------------------------------------------------------------------

def run_passes(model, ids, steps=3):
    """Prefill + `steps` single-token passes of a model of the numpy protocol; returns all logits."""
    cache = model.new_cache()
    n = len(ids)
    out = [model(np.array(ids), np.arange(n), causal(n), cache)]
    for i in range(steps):
        tok = int(out[-1][-1].argmax())
        out.append(model(np.array([tok]), np.array([n + i]), causal(1, n + i), cache))
    return np.concatenate(out)


@pytest.mark.parametrize("which", ["smol", "qwen", "smol_bf16"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_streamed_equals_in_memory(which, dtype, request, smollm2_path, qwen05_path):
    """Every matrix is multiplied straight from its read buffer (kernel blocks of a
    source store, repacked where they have a repacked form, BF16 of a bf16 store);
    the logits are the same bits whatever the budget pins, and for a source store
    the same as the native model of its GGUF."""
    store = request.getfixturevalue(f"{which}_store")
    ids = [1, 100, 2000, 300, 42, 7, 999, 5]
    m = StoreManifest.load(store)
    lo = minimum_budget(store, dtype_bytes=4 if dtype == "float32" else 2)
    hi = full_budget(store)
    if which == "smol_bf16":
        ref = None
    else:
        ref = run_passes(load_gguf_native(smollm2_path if which == "smol" else qwen05_path, dtype)[0], ids)
    pinned_counts = []
    for budget in (hi, lo, (lo + m.weights_bytes // 2)):      # everything, nothing, about half pinned
        model = StreamedDecoder(store, budget, dtype)
        got = run_passes(model, ids)
        pinned_counts.append(model.plan.pinned_layers)
        ref = got if ref is None else ref
        assert np.array_equal(got, ref), f"budget {budget}: max diff {np.abs(got - ref).max()}"
        assert model.report()["dequantized_bytes_per_pass"] == 0
        model.close()
    assert pinned_counts[1] == 0 and 0 < pinned_counts[2] < m.config.n_layers
    assert pinned_counts[0] == m.config.n_layers


def test_pread_backend_equals_io_uring(qwen_store):
    ids = [10, 20, 30, 40]
    budget = minimum_budget(qwen_store)
    outs, backends = [], []
    for backend in ("io_uring", "pread"):
        model = StreamedDecoder(qwen_store, budget, "bfloat16", backend=backend)
        outs.append(run_passes(model, ids, steps=2))
        backends.append(model.report()["reader"]["backend"])
        model.close()
    assert backends == ["io_uring", "pread"]
    assert np.array_equal(outs[0], outs[1])


def test_stats_count_streamed_bytes(qwen_store):
    budget = minimum_budget(qwen_store)
    model = StreamedDecoder(qwen_store, budget, "bfloat16")
    run_passes(model, [1, 2, 3], steps=2)
    r = model.report()
    assert r["passes"] == 3
    per_pass = model.plan.streamed_bytes_per_pass
    # pinned extents were read once when the model was made; every pass read every streamed
    # extent; the ring may already hold the next pass's first extents
    base = model.plan.pinned_bytes + 3 * per_pass
    assert base <= r["bytes_read"] <= base + 2 * model.plan.slot_bytes + 3 * 10**6
    assert r["reader"]["backend"] in ("io_uring", "pread") and r["reader"]["direct"] is True
    assert r["peak_rss_bytes"] > 0 and r["stall_s"] >= 0
    model.close()


@pytest.mark.parametrize("huge", ["1", "0"])
def test_plan_counts_the_memory_the_ring_takes(qwen_store, monkeypatch, huge):
    """The plan's ring is what the reader's slot buffers take (whole 2 MiB pages for slots
    of 2 MiB and more, counted whether or not the kernel gives huge pages)."""
    monkeypatch.setenv("LEVER_HUGE_PAGES", huge)
    model = StreamedDecoder(qwen_store, minimum_budget(qwen_store), "bfloat16")
    try:
        r = model.report()["reader"]
        plan = model.plan
        assert plan.slot_bytes >= max(e.length for e in plan.streamed)
        if max(e.length for e in plan.streamed) >= 2 << 20:
            assert plan.slot_bytes % (2 << 20) == 0
        assert plan.slot_bytes - max(e.length for e in plan.streamed) < 2 << 20
        assert r["slot_buffer_bytes"] == plan.ring_bytes
        assert r["huge_page_bytes"] <= r["slot_buffer_bytes"] and (huge == "1" or r["huge_page_bytes"] == 0)
    finally:
        model.close()


def test_forced_io_uring_unavailable_falls_back(qwen_store, monkeypatch):
    monkeypatch.setenv("LEVER_IO_URING", "0")
    model = StreamedDecoder(qwen_store, minimum_budget(qwen_store), "bfloat16")
    run_passes(model, [5, 6], steps=1)
    reader = model.report()["reader"]
    assert reader["backend"] == "pread"
    assert "LEVER_IO_URING" in reader["fallback_reason"]
    model.close()


# -- bad stores and budgets -------------------------------------------------------------

def copy_store(store, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(store, dst)
    return dst


def test_flipped_byte_names_the_layer(qwen_store, tmp_path):
    bad = copy_store(qwen_store, tmp_path)
    layer = StoreManifest.load(bad).layers[3]
    with open(bad / WEIGHTS, "r+b") as f:
        f.seek(layer.offset + 12345)
        b = f.read(1)
        f.seek(layer.offset + 12345)
        f.write(bytes([b[0] ^ 0x40]))
    model = StreamedDecoder(bad, minimum_budget(bad), "bfloat16")
    with pytest.raises(ChecksumError, match=r"layer\.3") as e:
        run_passes(model, [1, 2], steps=0)
    assert f"{layer.offset:,}" in str(e.value) or str(layer.offset) in str(e.value)
    model.close()


def test_truncated_weights_is_an_error_at_open(qwen_store, tmp_path):
    bad = copy_store(qwen_store, tmp_path)
    with open(bad / WEIGHTS, "r+b") as f:
        f.truncate(StoreManifest.load(bad).weights_bytes - 8192)
    with pytest.raises(StoreError, match="does not match the manifest"):
        StreamedDecoder(bad, full_budget(bad))


def test_manifest_mismatch_is_an_error_at_open(qwen_store, tmp_path):
    bad = copy_store(qwen_store, tmp_path)
    raw = json.loads((bad / MANIFEST).read_text())
    raw["extents"] = [e for e in raw["extents"] if e["name"] != "layer.5"]
    (bad / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(StoreError, match=r"incomplete store \(missing layer\.5"):
        StoreManifest.load(bad)
    raw = json.loads((qwen_store / MANIFEST).read_text())
    raw["extents"][2]["offset"] += 4096 * 1000000
    (bad / MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(StoreError, match="extent layer.2 is inconsistent"):
        StoreManifest.load(bad)
    (bad / MANIFEST).write_text("{not json")
    with pytest.raises(StoreError, match="malformed manifest"):
        StoreManifest.load(bad)
    (bad / MANIFEST).unlink()
    with pytest.raises(StoreError, match="not a Lever store"):
        StoreManifest.load(bad)


def test_budget_too_small_states_the_minimum(qwen_store):
    with pytest.raises(DramBudgetError, match=r"DRAM budget 10\.0 MB is below this store's minimum of [\d,.]+ MB"):
        StreamedDecoder(qwen_store, parse_size("10MB"))


def test_more_budget_pins_more(qwen_store):
    m = StoreManifest.load(qwen_store)
    lo = minimum_budget(qwen_store)
    pinned = [plan_residency(m, lo + k * 50 * 10**6).pinned_bytes for k in range(12)]
    assert pinned == sorted(pinned) and pinned[-1] > pinned[0]


@pytest.mark.parametrize("text,expected", [("600MB", 600 * 10**6), ("1.5GiB", int(1.5 * 2**30)),
                                           ("512M", 512 * 2**20), ("12345", 12345)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


def test_parse_size_rejects_garbage():
    with pytest.raises(DramBudgetError, match="cannot read the size"):
        parse_size("six hundred")


# -- the CLI ---------------------------------------------------------------------------

def test_cli_convert_and_streamed_generate_equal_in_memory(smollm2_path, tmp_path, capsys):
    store = tmp_path / "cli-store"
    assert main(["convert", str(smollm2_path), "--out", str(store)]) == 0
    capsys.readouterr()
    prompt = ["--prompt", "Write a haiku about flash memory.", "--max-new-tokens", "12", "--json"]
    assert main(["generate", "--model", str(smollm2_path), *prompt]) == 0
    ref = json.loads(capsys.readouterr().out)
    budget = str(minimum_budget(store))
    assert main(["generate", "--target-store", str(store), "--dram-budget", budget, "--mode", "ar",
                 *prompt]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["token_ids"] == ref["token_ids"]
    flash = got["flash"]
    assert flash["reader"]["backend"] == "io_uring"
    assert flash["bytes_read_per_token"] > 0.9 * StoreManifest.load(store).weights_bytes / 2
    for key in ("stall_s", "compute_s", "io_busy_s", "achieved_gib_s", "peak_rss_bytes"):
        assert key in flash


def test_cli_budget_too_small(smol_store, capsys):
    rc = main(["generate", "--target-store", str(smol_store), "--dram-budget", "1MB", "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("lever: error: DRAM budget 1.0 MB is below") and len(err.splitlines()) == 1


def test_cli_missing_store(tmp_path, capsys):
    rc = main(["generate", "--target-store", str(tmp_path / "nope"), "--prompt", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "no such store directory" in err


def test_plan_reserves_no_workspace(qwen_store):
    """The native decoder multiplies every matrix in place, so the budget's fixed
    costs are the norm, the KV cache and the embedding row cache only."""
    m = StoreManifest.load(qwen_store)
    budget = minimum_budget(qwen_store) + 60 * 10**6
    plan = plan_residency(m, budget)
    assert set(plan.fixed) == {"globals", "kv_cache", "embedding_rows"}
    model = StreamedDecoder(qwen_store, budget, "bfloat16")
    assert model.plan.fixed == plan.fixed
    model.close()
