"""`--probes on|off|auto` on generate, bench and profile, the bench's `+probes`
modes, the pruned cost model and the gain-cost policy's survival forecast."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lever.cli import main
from lever.commands.bench_modes import parse_mode, parse_modes, with_probe_twins
from lever.cost.cost_model import CostModel
from lever.cost.pruning import PruneForecast, PrunedCostModel, stage_layer
from lever.errors import LeverError
from lever.model.native_loader import load_gguf_native
from lever.probe.choice import probe_forecast, probe_pruner
from lever.probe.prune import ProbePruner, PruneStats
from lever.probe.store import ProbeModel, probe_key_for, probe_path, save_probe
from tiny_model import write_tiny_gguf

WEIGHTS = [0.0, 0.05, 0.05, 1.0, 0.0, 0.0]


def probe_of(key: str, layer: int = 1, auto: bool = True, survive: float = 0.6) -> ProbeModel:
    return ProbeModel(layer=layer, weights=np.asarray(WEIGHTS), threshold=float(np.log(0.2)), key=key,
                      metrics={"auto": auto, "survive": survive})


@pytest.fixture
def toy(tmp_path):
    path = write_tiny_gguf(tmp_path / "t.gguf", layers=4)
    return path, load_gguf_native(path, "float32")[0]


# --- choosing ---------------------------------------------------------------------------

def test_off_never_prunes_and_on_needs_a_probe(toy, tmp_path):
    path, target = toy
    assert probe_pruner(target, "off", path, tmp_path) is None
    assert probe_pruner(target, "auto", path, tmp_path) is None             # no probe: silently off
    with pytest.raises(LeverError, match="no probe is trained"):
        probe_pruner(target, "on", path, tmp_path)
    with pytest.raises(LeverError, match="--probes must be"):
        probe_pruner(target, "sometimes", path, tmp_path)


def test_auto_follows_what_training_found(toy, tmp_path):
    path, target = toy
    key = probe_key_for(target, path)
    save_probe(probe_of(key, auto=False), tmp_path)
    assert probe_pruner(target, "auto", path, tmp_path) is None
    assert isinstance(probe_pruner(target, "on", path, tmp_path), ProbePruner)
    save_probe(probe_of(key, auto=True), tmp_path)
    pruner = probe_pruner(target, "auto", path, tmp_path)
    assert isinstance(pruner, ProbePruner) and pruner.probe.layer == 1


def test_a_probe_of_another_target_is_not_used(toy, tmp_path, capsys):
    path, target = toy
    key = probe_key_for(target, path)
    stale = probe_of("0" * 64)
    p = probe_path(key, tmp_path)
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps(stale.to_json()))
    assert probe_pruner(target, "auto", path, tmp_path) is None
    assert "another target" in capsys.readouterr().err
    with pytest.raises(LeverError, match="no probe is trained"):
        probe_pruner(target, "on", path, tmp_path)


def test_the_torch_reference_cannot_prune(tmp_path):
    class NotNative:
        pass
    assert probe_pruner(NotNative(), "auto", tmp_path / "x", tmp_path) is None
    with pytest.raises(LeverError, match="native decoder"):
        probe_pruner(NotNative(), "on", tmp_path / "x", tmp_path)


# --- cost and forecast ---------------------------------------------------------------------

def profile_model(tmp_path) -> CostModel:
    from lever.cost.device_profile import DeviceProfile, Stage
    grid = [1, 8, 32]
    stages = [Stage(f"layer.{i}", "layer", 0.0, 0, [0.001 * n for n in grid]) for i in range(4)]
    stages.append(Stage("head", "head", 0.0, 0, [0.002 * n for n in grid]))
    return CostModel(DeviceProfile(key={}, n_grid=grid, stages=stages, embed_s=[0.0] * 3, draft_grid=[1, 8],
                                   draft_s=[0.001, 0.002], iteration_overhead_s=0.0001, prefetch_depth=0))


def test_pruned_cost_runs_later_layers_on_surviving_rows(tmp_path):
    base = profile_model(tmp_path)
    full = base.verify_s(32)
    half = PrunedCostModel(base, after_layer=1, survive=0.5).verify_s(32)
    none = PrunedCostModel(base, after_layer=1, survive=1.0).verify_s(32)
    np.testing.assert_allclose(none, full)
    n = 31                                       # 30 draft rows, 15 survive
    expect = 2 * 0.001 * 31 + 2 * 0.001 * 16 + 0.002 * 16
    assert half[n - 1] == pytest.approx(expect, rel=1e-9)
    assert np.all(half <= full + 1e-12) and half[0] == pytest.approx(full[0])
    assert stage_layer("layer.12") == 12 and stage_layer("head.3") is None
    with pytest.raises(ValueError):
        PrunedCostModel(base, 1, 1.5)


def test_forecast_moves_from_the_prior_to_what_the_pruner_sees():
    stats = PruneStats()
    f = PruneForecast(stats, after_layer=3, prior_survive=0.5)
    assert f.survive == 0.5
    stats.nodes, stats.pruned = 6400, 640            # 90% survive in practice
    assert 0.88 < f.survive < 0.9


def test_gain_cost_policy_rereads_its_curves_when_the_forecast_moves(tmp_path):
    from lever.draft.gain_cost import GainCostPolicy
    stats = PruneStats()
    policy = GainCostPolicy(profile_model(tmp_path), max_nodes=16,
                            pruning=PruneForecast(stats, after_layer=1, prior_survive=0.2))
    cheap = policy.verify_curve().copy()
    plain = GainCostPolicy(profile_model(tmp_path), max_nodes=16).verify_curve()
    assert cheap[-1] < plain[-1]
    stats.nodes, stats.pruned = 10_000, 0
    policy._read_curves()
    np.testing.assert_allclose(policy.verify_curve(), plain, rtol=0.01)
    assert policy.report()["iterations"] == 0


def test_probe_forecast_of_a_pruner(toy):
    _, target = toy
    pruner = ProbePruner(probe_of("k", survive=0.3), target)
    f = probe_forecast(pruner)
    assert f.after_layer == 1 and f.survive == pytest.approx(0.3)
    assert probe_forecast(None) is None


# --- bench modes -----------------------------------------------------------------------------

def test_probe_mode_specs():
    m = parse_mode("tree:32+probes")
    assert m.probes and m.label == "tree:32+probes" and m.base_label == "tree:32"
    m = parse_mode("lever+ahead+probes")
    assert m.probes and m.draft_ahead and m.base_label == "lever+ahead"
    for bad in ("ar+probes", "tree:32+probes+ahead", "chain+probes"):
        with pytest.raises(LeverError):
            parse_mode(bad)
    modes, _ = parse_modes(["ar", "chain:4", "lever", "lever+probes"])
    labels = [m.label for m in with_probe_twins(modes)]
    assert labels == ["ar", "chain:4", "chain:4+probes", "lever", "lever+probes"]


def smol_probe(smollm2_path, cache, auto=True):
    from lever.model.native_loader import load_gguf_native
    target = load_gguf_native(smollm2_path, "bfloat16")[0]
    save_probe(probe_of(probe_key_for(target, smollm2_path), layer=7, auto=auto), cache)


@pytest.mark.real
def test_bench_runs_probe_modes_side_by_side(smollm2_path, tmp_path, capsys):
    cache = tmp_path / "cache"
    smol_probe(smollm2_path, cache)
    out = tmp_path / "res"
    rc = main(["bench", "--target", str(smollm2_path), "--draft", str(smollm2_path), "--modes", "ar", "tree:16",
               "--probes", "on", "--prompts", "2", "--new-tokens", "12", "--out", str(out), "--no-progress",
               "--cache-dir", str(cache), "--no-plot"])
    text = capsys.readouterr().out
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    assert list(data["modes"]) == ["ar", "tree:16", "tree:16+probes"]
    a = data["modes"]["tree:16+probes"]
    assert a["mismatches"] == 0
    pr = a["probes"]
    assert pr["passes"] == a["target_passes"] and 0 < pr["pruned"] < pr["nodes"]
    assert pr["vs_without"]["mode"] == "tree:16" and pr["vs_without"]["tokens_per_s_ratio"] > 0
    assert "# probes tree:16+probes [in memory]" in text
    assert "probes" not in data["modes"]["tree:16"]


@pytest.mark.real
def test_bench_probes_auto_without_a_worthwhile_probe_runs_as_written(smollm2_path, tmp_path, capsys):
    cache = tmp_path / "cache"
    smol_probe(smollm2_path, cache, auto=False)
    out = tmp_path / "res"
    rc = main(["bench", "--target", str(smollm2_path), "--draft", "ngram", "--modes", "ar", "tree:8",
               "--probes", "auto", "--prompts", "1", "--new-tokens", "4", "--out", str(out), "--no-progress",
               "--cache-dir", str(cache), "--no-plot"])
    assert rc == 0
    assert "running without the +probes twins" in capsys.readouterr().err
    assert list(json.loads((out / "bench.json").read_text())["modes"]) == ["ar", "tree:8"]


@pytest.mark.real
def test_generate_with_probes_on(smollm2_path, tmp_path, capsys):
    cache = tmp_path / "cache"
    argv = ["generate", "--model", str(smollm2_path), "--draft", str(smollm2_path), "--mode", "tree",
            "--max-new-tokens", "12", "--prompt", "def add(a, b):", "--no-chat", "--cache-dir", str(cache)]
    assert main(argv + ["--probes", "on"]) == 2
    assert "no probe is trained" in capsys.readouterr().err
    smol_probe(smollm2_path, cache)
    assert main(argv + ["--probes", "off", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(argv + ["--probes", "on", "--json"]) == 0
    pruned = json.loads(capsys.readouterr().out)
    assert plain["probes"] is None and pruned["probes"]["passes"] > 0
    assert pruned["token_ids"] == plain["token_ids"]


def test_generate_remote_refuses_probes_on(capsys):
    assert main(["generate", "--remote", "http://127.0.0.1:9", "--draft", "x", "--probes", "on",
                 "--prompt", "hi"]) == 2
    assert "--probes on" in capsys.readouterr().err


def test_memory_cap_runs_each_probe_twin_in_its_own_child():
    from lever.cli import build_parser
    from lever.commands.bench_capped import capped_modes, child_command

    args = build_parser().parse_args(["bench", "--memory-cap", "900MB", "--draft", "x", "--modes", "ar", "tree:8",
                                      "--probes", "on"])
    modes = capped_modes(args)
    assert [m.label for m in modes] == ["ar", "tree:8", "tree:8+probes"]
    argv = child_command(args, modes[2], "/tmp/x")
    assert "--probes" not in argv and argv[argv.index("--modes") + 1] == "tree:8+probes"
    auto = build_parser().parse_args(["bench", "--memory-cap", "900MB", "--probes", "auto"])
    with pytest.raises(LeverError, match="--probes auto cannot be combined with --memory-cap"):
        capped_modes(auto)


def test_pruning_pays_only_where_the_pass_gets_faster(toy, tmp_path):
    from lever.cost.device_profile import DeviceProfile, Stage
    from lever.probe.choice import MIN_SAVING, pruning_pays

    _, target = toy
    pruner = ProbePruner(probe_of("k", layer=1, survive=0.5), target)
    compute_bound = profile_model(tmp_path)
    pays = pruning_pays(compute_bound, pruner)
    assert not pays(1) and pays(16) and pays(1000)
    grid = [1, 8, 32]                       # every layer streamed, reads far slower than compute
    stages = [Stage(f"layer.{i}", "layer", 0.05, 10**7, [1e-5 * n for n in grid]) for i in range(4)]
    io_bound = CostModel(DeviceProfile(key={}, n_grid=grid, stages=stages, embed_s=[0.0] * 3, draft_grid=[1, 8],
                                       draft_s=[0.001, 0.002], iteration_overhead_s=0.0001, prefetch_depth=2))
    pays = pruning_pays(io_bound, pruner)
    assert not any(pays(n) for n in (2, 16, 32, 256)) and MIN_SAVING > 0


def test_an_unscored_pass_runs_whole(toy):
    from lever.draft.model_drafter import ModelDrafter
    from lever.draft.base import TreeShape
    from lever.engine import SpecConfig, speculative_generate

    _, target = toy
    pruner = ProbePruner(probe_of("k", layer=1), target, pays=lambda n: False)
    spec = SpecConfig("tree", tree=TreeShape(budget=8, topk=2, depth=4), pruner=pruner)
    _, stats = speculative_generate(target, ModelDrafter(target), [1, 2, 3], 8, spec=spec)
    drafted = sum(1 for n in stats.tree_sizes if n > 0)     # a root-only pass (the last token) has nothing to score
    assert pruner.stats.passes == stats.iterations and pruner.stats.unscored == drafted > 0
    assert pruner.stats.pruned == 0
