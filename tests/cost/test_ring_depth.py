"""The read ring's depth chosen from a profile (lever.cost.ring_depth) and the
streamed target re-planned to it (StreamedDecoder.replan)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from lever.cost.device_profile import DeviceProfile, Stage
from lever.cost.ring_depth import MIN_GAIN, choose_depth, derive_profile, flash_bandwidth, tune_ring
from lever.memory.plan import store_minimum
from lever.model.streamed_decoder import StreamedDecoder
from lever.store.manifest import StoreManifest
from lever.store.residency import plan_residency
from test_memory import MiB, _manifest
from test_overlap import forward
from lever.store.convert import convert
from tiny_model import write_tiny_gguf

LAYERS, LAYER_MIB, HEAD_MIB = 12, 30, 20


def manifest():
    return _manifest(n_layers=LAYERS, layer_bytes=LAYER_MIB * MiB, head_bytes=HEAD_MIB * MiB)


def measured(m: StoreManifest, plan, read_s_per_mib: float, compute_s: float, draft_s: float) -> DeviceProfile:
    """A profile of `plan` with every read at read_s_per_mib and every stage computing compute_s."""
    streamed = {e.name: e.length for e in plan.streamed}
    stages = [Stage(e.name, "layer" if e.kind == "layer" else "head",
                    streamed[e.name] / MiB * read_s_per_mib if e.name in streamed else 0.0,
                    streamed.get(e.name, 0), [compute_s, compute_s * 1.1])
              for e in m.layers + m.head_parts]
    return DeviceProfile(key={"plan": plan.prefetch_depth, "measure": {"repeats": 5}}, n_grid=[1, 16], stages=stages, embed_s=[0.0, 0.0],
                         draft_grid=[1, 2], draft_s=[draft_s, draft_s], iteration_overhead_s=0.0,
                         prefetch_depth=plan.prefetch_depth)


def budget_pinning_half(m):
    """A budget that pins the head and about half of the layers with a ring of 2."""
    return sum(store_minimum(m).values()) + (LAYERS // 2) * LAYER_MIB * MiB


def test_a_flash_bound_target_with_idle_reads_gets_a_deeper_ring():
    m = manifest()
    plan = plan_residency(m, budget_pinning_half(m), prefetch_depth="auto")
    assert plan.prefetch_depth == 2 and plan.pinned_layers > 0
    # reads 0.5 ms/MiB (15 ms a layer), compute 8 ms a stage, a 40 ms draft between passes
    choice = choose_depth(measured(m, plan, 0.5e-3, 8e-3, 10e-3), plan, m, 2, 2048)
    assert choice.changed and choice.depth > 2
    assert choice.predicted_s[choice.depth] <= (1 - MIN_GAIN) * choice.predicted_s[2]
    assert choice.pinned_layers[choice.depth] < choice.pinned_layers[2]
    assert "slots predict" in choice.rule()


def test_a_compute_bound_target_keeps_its_ring():
    m = manifest()
    plan = plan_residency(m, budget_pinning_half(m), prefetch_depth="auto")
    # reads far faster than compute: un-pinning only adds reads, nothing to hide
    choice = choose_depth(measured(m, plan, 1e-5, 50e-3, 10e-3), plan, m, 2, 2048)
    assert not choice.changed and choice.depth == plan.prefetch_depth


def test_nothing_streamed_keeps_the_plan():
    m = manifest()
    everything = 10**12
    plan = plan_residency(m, everything, prefetch_depth="auto")
    choice = choose_depth(measured(m, plan, 0.5e-3, 8e-3, 10e-3), plan, m, 2, 2048)
    assert not choice.changed


def test_a_derived_profile_prices_each_new_read_at_the_measured_bandwidth():
    m = manifest()
    plan = plan_residency(m, budget_pinning_half(m), prefetch_depth="auto")
    prof = measured(m, plan, 0.5e-3, 8e-3, 10e-3)
    deeper = plan_residency(m, plan.budget, prefetch_depth=8)
    derived = derive_profile(prof, deeper, {"new": "key"})
    derived.validate()
    bw = flash_bandwidth(prof)
    assert bw == pytest.approx(MiB / 0.5e-3)
    streamed = {e.name: e.length for e in deeper.streamed}
    for s, old in zip(derived.stages, prof.stages):
        assert s.compute_s == old.compute_s
        assert s.io_bytes == streamed.get(s.name, 0)
        assert s.io_s == pytest.approx(streamed.get(s.name, 0) / bw)
    assert derived.prefetch_depth == 8 and derived.key == {"new": "key"}
    assert sum(s.streamed for s in derived.stages) > sum(s.streamed for s in prof.stages)


@pytest.fixture(scope="module")
def six_layer_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("ring")
    return convert(str(write_tiny_gguf(d / "tiny.gguf", layers=6)), d / "store", progress=False)


def test_replan_trades_pins_for_slots_and_keeps_the_output(six_layer_store):
    tiny_store = six_layer_store
    m = StoreManifest.load(tiny_store)
    budget = sum(store_minimum(m, dtype_bytes=4, kv_tokens=64).values()) + 3 * max(e.length for e in m.layers)
    model = StreamedDecoder(tiny_store, budget, "float32", kv_tokens=64)
    try:
        before, pinned = forward(model), model.plan.pinned_layers
        assert model.plan.prefetch_depth == 2 and pinned > 0
        model.replan(4)
        assert model.plan.prefetch_depth == 4 and model.plan.pinned_layers < pinned
        assert model.plan.budget == budget and model.plan.used_bytes <= budget
        np.testing.assert_array_equal(forward(model), before)
    finally:
        model.close()


def test_tune_ring_caches_the_derived_profile(six_layer_store, tmp_path, monkeypatch):
    tiny_store = six_layer_store
    from lever.cost import ring_depth
    m = StoreManifest.load(tiny_store)
    budget = sum(store_minimum(m, dtype_bytes=4, kv_tokens=64).values()) + 3 * max(e.length for e in m.layers)
    model = StreamedDecoder(tiny_store, budget, "float32", kv_tokens=64)
    try:
        prof = measured(m, model.plan, 0.03, 5e-4, 2e-3)           # reads ~1 ms a layer, compute 0.5 ms, draft 2 ms
        keys = []

        def key_of(target):
            keys.append(target.plan.prefetch_depth)
            return {"depth": target.plan.prefetch_depth, "pinned": sorted(e.name for e in target.plan.pinned)}

        lines = []
        tuned = tune_ring(model, prof, key_of, cache_dir=tmp_path, say=lines.append)
        assert model.plan.prefetch_depth > 2 and tuned.prefetch_depth == model.plan.prefetch_depth
        assert lines and "read ring 2 ->" in lines[0]
        assert model.plan.depth_rule.startswith("profile:")
        assert len(list((tmp_path / "profiles").glob("*.json"))) == 1
        # never taken for a measurement of that plan: its key says what it was derived from
        from lever.cost.profile import cached_profile
        plain = {**key_of(model), "measure": prof.key["measure"]}
        assert cached_profile(plain, tmp_path) is None and "derived_from" in tuned.key
        # found again next time, not derived twice
        monkeypatch.setattr(ring_depth, "derive_profile", lambda *a: pytest.fail("derived twice"))
        model.replan(2)
        again = tune_ring(model, prof, key_of, cache_dir=tmp_path)
        assert again.prefetch_depth == tuned.prefetch_depth and again.key == tuned.key
        # a new measurement of the source plan derives anew
        monkeypatch.undo()
        model.replan(2)
        newer = tune_ring(model, replace(prof, created="later"), key_of, cache_dir=tmp_path)
        assert newer.key != tuned.key and len(list((tmp_path / "profiles").glob("*.json"))) == 2
    finally:
        model.close()


def test_a_failed_replan_is_one_clear_error_and_closes_cleanly(six_layer_store, monkeypatch):
    from lever.errors import StoreError
    from lever.model import streamed_decoder as streamed
    m = StoreManifest.load(six_layer_store)
    budget = sum(store_minimum(m, dtype_bytes=4, kv_tokens=64).values()) + 3 * max(e.length for e in m.layers)
    model = StreamedDecoder(six_layer_store, budget, "float32", kv_tokens=64)

    def broken(*args, **kwargs):
        raise OSError("the store went away")

    monkeypatch.setattr(streamed, "StreamedWeights", broken)
    with pytest.raises(StoreError, match="re-planning the ring to 4 slots failed.*the store went away"):
        model.replan(4)
    model.close()                   # nothing left open, nothing closed twice
    model.close()


def test_a_kept_depth_says_so():
    m = manifest()
    plan = plan_residency(m, budget_pinning_half(m), prefetch_depth="auto")
    choice = choose_depth(measured(m, plan, 1e-5, 50e-3, 10e-3), plan, m, 2, 2048)
    assert choice.rule().startswith(f"profile: {plan.prefetch_depth} slots kept")
