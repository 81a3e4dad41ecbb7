"""The quick device profile (lever.cost.quick): what a first mode lever run
estimates in seconds instead of measuring pass by pass; its byte budget, its
key, its progress lines, its online correction, and that `lever profile`
still measures in full."""

import json

import numpy as np
import pytest

from lever.cli import main
from lever.cost.cost_model import CostModel
from lever.cost.device_profile import DeviceProfile, Stage
from lever.cost.drift import DRIFT_FLOOR, CostDrift
from lever.cost.profile import FULL_N_GRIDS, full_key, load_or_estimate, load_or_measure, profile_key, profile_path, quick_key
from lever.cost.quick import QUICK_DRAFT_GRID, QUICK_N_GRID, estimate_profile, layer_groups, quick_supported
from lever.draft.gain_cost import GainCostPolicy
from lever.model.native_loader import load_gguf_native
from lever.model.streamed_decoder import StreamedDecoder
from lever.store.manifest import StoreManifest
from test_store import minimum_budget

PASSES = 5          # a quick profile reads at most this many passes' worth of the store


def pass_bytes(store) -> int:
    """Bytes one pass streams when nothing is pinned: every layer and head part."""
    m = StoreManifest.load(store)
    return sum(e.length for e in m.layers + m.head_parts)


def bytes_read(target) -> int:
    return target.reader.stats()["bytes_read"] + target.stats.embedding_bytes


@pytest.fixture(scope="module")
def smol_native(smollm2_path):
    return load_gguf_native(smollm2_path)[0]


def store_key(target, store, draft_path):
    return profile_key(target, target, target_id=store, draft_id=draft_path, kernels="native",
                       reader_backend="auto", read_limit_bytes_per_s=0.0, dtype="bfloat16")


# -- a streamed store ----------------------------------------------------------------

@pytest.mark.real
@pytest.mark.parametrize("pin", ["nothing", "half"])
def test_quick_profile_reads_at_most_five_passes(pin, smol_store, smollm2_path, smol_native, tmp_path, capsys):
    extra = 0 if pin == "nothing" else StoreManifest.load(smol_store).weights_bytes // 2
    target = StreamedDecoder(smol_store, minimum_budget(smol_store) + extra)
    try:
        assert quick_supported(target) and (bool(target.plan.pinned) == (pin == "half"))
        target.settle()
        before = bytes_read(target)
        key = store_key(target, smol_store, smollm2_path)
        p = load_or_estimate(target, smol_native, key, cache_dir=tmp_path)
        read = bytes_read(target) - before
        err = capsys.readouterr().err
        # the byte budget, counted by the reader itself
        assert 0 < p.read_bytes == read <= PASSES * pass_bytes(smol_store)
        # marked quick, in the key and the file, and cached under the quick key
        assert p.quick and p.key == quick_key(key) and p.key["measure"]["quick"] is True
        assert profile_path(p.key, tmp_path).is_file() and profile_path(p.key, tmp_path) != profile_path(
            full_key(key), tmp_path)
        # the progress lines: what is measured, then how long it took and what it read
        assert "profile: measuring this device (flash reads, one layer's compute per layer type" in err
        assert "profile: measured this device in " in err and "passes' worth" in err
        # the profile has a measured one's format: every stage, reads of the streamed extents
        m = target.manifest
        assert [s.name for s in p.stages] == [e.name for e in m.layers + m.head_parts]
        streamed = {e.name: e.length for e in target.plan.streamed}
        for s in p.stages:
            assert (s.io_bytes, s.io_s > 0) == ((streamed[s.name], True) if s.name in streamed else (0, False))
            assert len(s.compute_s) == len(QUICK_N_GRID) and min(s.compute_s) > 0
        assert p.n_grid == list(QUICK_N_GRID) and p.draft_grid == list(QUICK_DRAFT_GRID) and min(p.draft_s) > 0
        assert p.prefetch_depth == target.plan.prefetch_depth and p.validation == []
        assert DeviceProfile.from_json(json.loads(profile_path(p.key, tmp_path).read_text())) == p
        verify = CostModel(p).verify_s(64)
        assert np.all(np.diff(verify) >= 0) and verify[0] > 0
        # a second run reads it from the cache: nothing measured, nothing read
        again = load_or_estimate(target, smol_native, key, cache_dir=tmp_path)
        assert again == p and bytes_read(target) - before == read
        assert "using the cached profile" in capsys.readouterr().err
    finally:
        target.close()


@pytest.mark.real
def test_explicit_lever_profile_measures_in_full(smol_store, smollm2_path, tmp_path, capsys):
    """`lever profile` is the full measurement: whole passes at every grid point,
    repeated and validated, so it reads many passes' worth (the quick one at most 5)."""
    budget = minimum_budget(smol_store)
    rc = main(["profile", "--target-store", str(smol_store), "--dram-budget", str(budget), "--draft",
               str(smollm2_path), "--max-n", "1", "--cache-dir", str(tmp_path), "--no-progress", "--json"])
    assert rc == 0
    got = json.loads(capsys.readouterr().out)
    assert got["quick"] is False and "quick" not in got["key"]["measure"]
    assert got["key"]["measure"]["repeats"] == 5 and got["validation"]
    assert got["read_bytes"] > PASSES * sum(s["io_bytes"] for s in got["stages"]) > 0


@pytest.mark.real
def test_generate_estimates_on_its_first_run(smol_store, smollm2_path, tmp_path, capsys):
    args = ["generate", "--target-store", str(smol_store), "--dram-budget", str(minimum_budget(smol_store)),
            "--draft", str(smollm2_path), "--prompt", "def add(a, b):", "--max-new-tokens", "4",
            "--cache-dir", str(tmp_path), "--json"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "profile: measuring this device" in err and "profile: measured this device in" in err
    keys = [json.loads(p.read_text())["key"] for p in (tmp_path / "profiles").glob("*.json")
            if not p.name.startswith("calibration")]
    assert keys and all(k["measure"]["quick"] is True for k in keys)
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "profile: measuring" not in err and "(a quick estimate)" in err


@pytest.mark.real
def test_a_verifier_server_estimates_its_verify_cost(smol_store):
    from lever.commands.serve_verifier import measure_verify_cost
    target = StreamedDecoder(smol_store, minimum_budget(smol_store))
    try:
        target.settle()
        before = bytes_read(target)
        lines = []
        cost = measure_verify_cost(target, 64, lines.append)
        assert bytes_read(target) - before <= PASSES * pass_bytes(smol_store)
    finally:
        target.close()
    assert cost["n"] == [1, 2, 4, 8, 16, 32, 64]
    assert all(s > 0 for s in cost["s"]) and cost["s"] == sorted(cost["s"])
    assert lines[0].startswith("measuring the verify cost (flash reads") and "estimated in" in lines[1]


# -- a pair in DRAM --------------------------------------------------------------------

def test_quick_profile_of_a_resident_pair(tiny_pair, tmp_path, capsys):
    target, draft = tiny_pair
    p = estimate_profile(target, draft, {"pair": "tiny"}, progress=False)
    assert capsys.readouterr().err == ""
    assert [s.name for s in p.stages] == [f"layer.{i}" for i in range(target.config.n_layers)] + ["head"]
    assert all(not s.streamed and min(s.compute_s) > 0 for s in p.stages)
    assert p.read_bytes == 0 and p.prefetch_depth == 0 and p.quick
    assert len(p.draft_s) == len(QUICK_DRAFT_GRID) and min(p.draft_s) > 0 and p.iteration_overhead_s > 0
    assert layer_groups(target) == [list(range(target.config.n_layers))]


@pytest.mark.parametrize("grid", FULL_N_GRIDS, ids=["reprofile", "lever-profile"])
def test_a_cached_full_profile_is_preferred(grid, tiny_pair, tmp_path):
    """A full measurement (`--reprofile`, or `lever profile` with its default
    --max-n 256) wins over the quick estimate once it is cached; the two never
    share a file."""
    target, draft = tiny_pair
    key = {"pair": "tiny"}
    quick = load_or_estimate(target, draft, key, cache_dir=tmp_path, progress=False)
    full = load_or_measure(target, draft, key, cache_dir=tmp_path, progress=False, n_grid=grid)
    assert quick.quick and not full.quick and full.validation
    assert profile_path(quick.key, tmp_path) != profile_path(full.key, tmp_path)
    assert load_or_estimate(target, draft, key, cache_dir=tmp_path, progress=False) == full


# -- the online correction -------------------------------------------------------------

def synthetic(quick: bool, spread: float = 0.2) -> DeviceProfile:
    grid = [1, 8, 64]
    return DeviceProfile(key={}, n_grid=grid, stages=[Stage("layer.0", "layer", 0.01, 4096, [0.001, 0.004, 0.03])],
                         embed_s=[0.0] * 3, draft_grid=[1], draft_s=[0.001], iteration_overhead_s=0.0,
                         prefetch_depth=2, pass_spread=[spread] * 3, quick=quick)


def test_real_passes_correct_a_quick_profile_within_a_few_iterations():
    """A quick profile's passes refit at the drift floor (10 %), not at 3 spreads of
    its few one-layer timings: three passes 30 % dearer than estimated and the
    policy prices that range 30 % dearer; a measured profile with that spread
    keeps its curve (its threshold is 60 %)."""
    for quick, refits in ((True, True), (False, False)):
        policy = GainCostPolicy(CostModel(synthetic(quick)), max_nodes=15)
        assert policy.drift.threshold == pytest.approx(DRIFT_FLOOR if quick else 0.6)
        before = policy.verify_curve().copy()
        for _ in range(3):
            policy.drift.observe(2, float(before[1]), 1.3 * float(before[1]))
        assert (policy.verify_curve()[1] == pytest.approx(1.3 * before[1])) == refits
        assert (policy.drift.refits > 0) == refits
