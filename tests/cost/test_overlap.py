"""Overlap of drafting with the target's flash reads (issue 14, "Overlap").

- The ring depth: `--prefetch-depth auto` pins first and spends only the
  leftover on slots (which is always less than one slot); an integer is kept.
- The cost model's credit for an idle gap between passes (the draft growing
  the next tree while the reader fills free slots): 0 with nothing streamed,
  more with more slots, never more than the gap.
- The native grower charges max(0, draft - hidden_draft_s) for drafting: no
  credit is today's growth bit for bit, a large one grows bigger trees.
- The reader's busy seconds (realised overlap): growing while a prefetch is in
  flight, still when nothing streams.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from lever._native import TreeGrower
from lever.cost.cost_model import CostModel, hidden_credit_s, simulate_passes
from lever.cost.device_profile import DeviceProfile, Stage
from lever.errors import DramBudgetError
from lever.memory.plan import MemoryPlan, store_minimum
from lever.model.streamed_decoder import StreamedDecoder
from lever.sampling import SamplingParams
from lever.store.convert import convert
from lever.store.flash_reader import FlashReader
from lever.store.manifest import StoreManifest
from lever.store.residency import (MAX_PREFETCH_DEPTH, MIN_AUTO_DEPTH, parse_prefetch_depth, slot_size,
                                   plan_residency)
from lever.verify.target_pass import TargetVerifier
from test_grow_tree import Universe, grow, realistic_case
from test_memory import MiB, _manifest
from tiny_model import TOKENS, causal, write_tiny_gguf
from waiting import wait_until

# -- the ring depth ------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [("auto", "auto"), (" AUTO ", "auto"), ("3", 3), (16, 16), (1, 1)])
def test_parse_prefetch_depth(text, expected):
    assert parse_prefetch_depth(text) == expected


@pytest.mark.parametrize("bad", ["0", 0, "17", -1, "two", "", True, 2.5])
def test_parse_prefetch_depth_refuses(bad):
    with pytest.raises(DramBudgetError, match="prefetch depth must be 'auto' or an integer"):
        parse_prefetch_depth(bad)


def budgets(m, kw):
    lo = sum(store_minimum(m, **kw).values())
    hi = lo + sum(e.length for e in m.layers + m.head_parts)
    return range(lo, hi, 3 * MiB + 4096)


@pytest.mark.parametrize("layer_mib,head_mib", [(8, 6), (8, 20), (5, 5)])
def test_auto_spends_only_the_leftover_and_it_is_under_one_slot(layer_mib, head_mib):
    m = _manifest(n_layers=6, layer_bytes=layer_mib * MiB, head_bytes=head_mib * MiB)
    kw = dict(dtype_bytes=2, kv_tokens=64, embed_cache_rows=16)
    seen = 0
    for budget in budgets(m, kw):
        auto = plan_residency(m, budget, prefetch_depth="auto", **kw)
        two = plan_residency(m, budget, prefetch_depth=2, **kw)
        assert auto.pinned == two.pinned                      # auto never takes a pin away
        assert auto.used_bytes <= budget
        if not auto.streamed:
            assert auto.prefetch_depth == 0 and auto.ring_bytes == 0
            continue
        seen += 1
        leftover = budget - auto.used_bytes
        assert 0 <= leftover < auto.slot_bytes                # pinning leaves less than a slot
        assert auto.prefetch_depth == MIN_AUTO_DEPTH
        assert auto.ring_bytes == MIN_AUTO_DEPTH * auto.slot_bytes
        s = auto.summary()
        assert s["prefetch_depth"] == MIN_AUTO_DEPTH and s["prefetch_depth_rule"].startswith("auto: 2 + 0 slots")
        assert s["unused_bytes"] == leftover and s["slot_bytes"] == auto.slot_bytes
    assert seen > 3


def test_an_integer_depth_is_kept_and_trades_pins_for_slots():
    m = _manifest(n_layers=6, layer_bytes=8 * MiB, head_bytes=6 * MiB)
    budget = sum(store_minimum(m, prefetch_depth=2).values()) + 30 * MiB
    two, five = plan_residency(m, budget, prefetch_depth=2), plan_residency(m, budget, prefetch_depth=5)
    assert (two.prefetch_depth, five.prefetch_depth) == (2, 5)
    assert five.summary()["prefetch_depth_rule"] == "given: 5"
    assert five.pinned_bytes < two.pinned_bytes and five.ring_bytes == 5 * 8 * MiB <= budget - five.pinned_bytes


def test_the_memory_plan_counts_the_auto_ring():
    m = _manifest(n_layers=6, layer_bytes=8 * MiB, head_bytes=6 * MiB)
    kw = dict(kv_tokens=256, embed_cache_rows=64)
    assert store_minimum(m, prefetch_depth="auto", **kw) == store_minimum(m, prefetch_depth=2, **kw)
    plan = MemoryPlan.build(130 * MiB, draft_weight_bytes=50 * MiB, target_minimum=store_minimum(m, **kw),
                            baseline_bytes=30 * MiB, margin_bytes=10 * MiB)
    res = plan.plan_store(m, **kw)
    assert res.streamed and res.prefetch_depth == MIN_AUTO_DEPTH
    assert res.used_bytes <= plan.store_budget_bytes
    assert plan.target_minimum["ring"] == MIN_AUTO_DEPTH * slot_size(m.layers + m.head_parts)


def test_the_cap_is_the_cli_range():
    from lever.commands.limits import MAX_PREFETCH_DEPTH as CLI_MAX
    assert MAX_PREFETCH_DEPTH == CLI_MAX


# -- the cost model's credit -----------------------------------------------------------

def profile(stages, depth):
    """stages: (io_s, compute_s); io_s > 0 = streamed."""
    out = [Stage(f"layer.{i}", "layer", float(io), 1000 if io > 0 else 0, [float(c)]) for i, (io, c) in
           enumerate(stages)]
    return DeviceProfile(key={}, n_grid=[1], stages=out, embed_s=[0.0], draft_grid=[1], draft_s=[0.01],
                         iteration_overhead_s=0.0, prefetch_depth=depth)


IO_BOUND = [(1.0, 0.2)] * 6


def test_no_streamed_stage_hides_nothing():
    assert CostModel(profile([(0.0, 0.5)] * 4, 0)).hidden_draft_s() == 0.0
    assert CostModel(profile([(0.0, 0.5)] * 4, 2)).hidden_draft_s() == 0.0


def test_more_slots_hide_more_draft_time():
    credit = [CostModel(profile(IO_BOUND, d)).hidden_draft_s() for d in range(1, 7)]
    assert all(b > a + 0.1 for a, b in zip(credit, credit[1:])), credit
    # a ring as deep as the pass hides every stall of it: reads 6 s, compute 1.2 s
    assert credit[-1] == pytest.approx(6.0 - 1.2, rel=1e-9)


@pytest.mark.parametrize("depth", [1, 2, 3, 6])
def test_the_credit_never_exceeds_the_gap_and_grows_with_it(depth):
    io = [t for t, _ in IO_BOUND]
    compute = [np.array([c]) for _, c in IO_BOUND]
    gaps = [0.0, 0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 12.0]
    credit = [float(hidden_credit_s(io, compute, [True] * 6, depth, g)[0]) for g in gaps]
    for g, c in zip(gaps, credit):
        assert -1e-9 <= c <= g + 1e-9
    assert all(b >= a - 1e-9 for a, b in zip(credit, credit[1:])), credit
    assert credit[2] == pytest.approx(0.5, rel=1e-9)         # flash-bound: a short gap is hidden whole
    saturated = CostModel(profile(IO_BOUND, depth)).hidden_draft_s()
    assert saturated == pytest.approx(credit[-1], abs=1e-9)  # the method's long gap has saturated


def test_a_compute_bound_pass_has_nothing_to_hide():
    """The pinned tail already lets the next pass's reads land: no stall, no credit."""
    stages = [(1.0, 0.5)] * 3 + [(0.0, 1.0)] * 3
    assert CostModel(profile(stages, 2)).hidden_draft_s() == pytest.approx(0.0, abs=1e-12)


def test_no_gap_is_the_back_to_back_simulation():
    rng = np.random.default_rng(0)
    io = list(rng.random(8))
    compute = [rng.random(5) for _ in range(8)]
    streamed = [bool(b) for b in rng.integers(0, 2, 8)]
    for depth in (1, 2, 4):
        assert np.array_equal(simulate_passes(io, compute, streamed, depth),
                              simulate_passes(io, compute, streamed, depth, gap_s=0.0))


def test_the_credit_scales_with_the_verify_factor():
    model = CostModel(profile(IO_BOUND, 3))
    assert model.scaled(2.0, 1.0).hidden_draft_s() == pytest.approx(2.0 * model.hidden_draft_s())


# -- the grower's credit ------------------------------------------------------------------

def drive(universe, verify, draft, max_nodes, max_depth, table, **kw):
    g, selection, _ = grow(universe, verify, draft, max_nodes, max_depth, table, overhead_s=0.003,
                           root_extra_s=0.002, **kw)
    return g, selection


@pytest.mark.parametrize("seed", range(6))
def test_no_credit_is_todays_growth_bit_for_bit(seed):
    universe, compute, draft = realistic_case(seed)
    table = [[0.55, 0.12, 0.05, 0.03]] * 6
    for io in (0.0, 0.2, 0.8):
        verify = np.maximum(io, compute) + 0.2 * compute
        g0, (t0, p0, e0, s0) = drive(universe, verify, draft, 255, 6, table)
        g1, (t1, p1, e1, s1) = drive(universe, verify, draft, 255, 6, table, hidden_draft_s=0.0)
        assert g1.hidden_draft_s == 0.0
        assert np.array_equal(t0.tokens(), t1.tokens()) and np.array_equal(p0, p1)
        assert (e0, s0, g0.expansions, g0.draft_spent_s) == (e1, s1, g1.expansions, g1.draft_spent_s)


@pytest.mark.parametrize("seed", range(6))
def test_a_large_credit_grows_bigger_trees_when_drafting_is_expensive(seed):
    universe = Universe(np.random.default_rng(seed), width=3, depth=5)
    verify = 0.3 + 0.002 * np.arange(1, 129)                  # flash-bound: nodes are cheap to verify
    draft = np.full(128, 0.25)                                 # ... but each draft forward is expensive
    table = [[0.6, 0.2, 0.1]] * 5
    g0, (t0, *_, s0) = drive(universe, verify, draft, 127, 5, table)
    g1, (t1, *_, s1) = drive(universe, verify, draft, 127, 5, table, hidden_draft_s=10.0)
    assert g1.expansions >= g0.expansions and len(t1) >= len(t0)
    assert len(t1) > len(t0), (len(t0), len(t1))
    # the credited drafting is not charged: predicted = verify + overhead
    assert g1.draft_spent_s > 0 and s1 == pytest.approx(verify[len(t1) - 1] + 0.003)
    assert s0 == pytest.approx(g0.draft_spent_s + verify[len(t0) - 1] + 0.003)


def test_a_partial_credit_is_subtracted_from_the_drafting():
    universe = Universe(np.random.default_rng(3), width=3, depth=4)
    verify = 0.3 + 0.002 * np.arange(1, 65)
    draft = np.full(64, 0.01)
    g, (tree, *_, predicted) = drive(universe, verify, draft, 63, 4, [[0.6, 0.2, 0.1]] * 4, hidden_draft_s=0.015)
    assert g.draft_spent_s > 0.015
    assert predicted == pytest.approx(g.draft_spent_s - 0.015 + verify[len(tree) - 1] + 0.003)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_a_bad_credit_is_refused(bad):
    with pytest.raises(ValueError, match="hidden_draft_s"):
        TreeGrower(np.ones(4), np.ones(4), 0.0, 3, 2, hidden_draft_s=bad)


# -- realised overlap: the reader's busy seconds --------------------------------------------

def test_busy_seconds_grow_while_a_read_is_in_flight(tmp_path):
    """The clock runs while the read is in flight (sampled as it moves, not after set
    sleeps), stops when it lands, and has counted at least the throttled read's time."""
    path = tmp_path / "data.bin"
    np.random.default_rng(0).integers(0, 256, 2 * MiB, dtype=np.uint8).tofile(path)
    rate = 2e6
    with FlashReader(path, 2 * MiB, 1, max_bytes_per_s=rate) as reader:    # 2 MiB: ~1 s
        assert reader.stats()["busy_s"] == 0.0
        reader.submit(0, 0, 2 * MiB)
        first = wait_until(lambda: reader.stats()["busy_s"], 10, "the busy clock to start")
        second = wait_until(lambda: (b := reader.stats()["busy_s"]) > first and b, 10, "the busy clock to run on")
        assert 0 < first < second
        reader.wait(0)
        done = reader.stats()["busy_s"]
        time.sleep(0.05)
        assert reader.stats()["busy_s"] == done >= 0.9 * 2 * MiB / rate


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("overlap")
    return convert(str(write_tiny_gguf(d / "tiny.gguf")), d / "store", progress=False)


def forward(model):
    n = len(TOKENS)
    return model(np.array(TOKENS), np.arange(n), causal(n), model.new_cache())


def test_streamed_busy_seconds_follow_the_ring(tiny_store):
    m = StoreManifest.load(tiny_store)
    budget = sum(store_minimum(m, dtype_bytes=4, kv_tokens=64).values())
    rate = 2 * max(e.length for e in m.layers) / 1.2            # two extents: ~1.2 s
    model = StreamedDecoder(tiny_store, budget, "float32", kv_tokens=64, max_read_bytes_per_s=rate)
    try:
        assert model.plan.streamed and model.plan.prefetch_depth == MIN_AUTO_DEPTH
        model.settle()
        forward(model)                                           # the ring now prefetches the next pass
        before = model.io_busy_s()
        # reads in flight while nothing computes: the clock moves on its own
        wait_until(lambda: model.io_busy_s() > before + 0.05, 10, "the busy clock to run while reads are in flight")
        model.settle()
        settled = model.io_busy_s()
        time.sleep(0.05)
        assert model.io_busy_s() == settled                      # nothing in flight: the clock stops
        verifier = TargetVerifier(model, SamplingParams(), capacity=32, seed=1)
        assert verifier.io_busy_s() == settled
    finally:
        model.close()


def test_busy_seconds_stay_zero_when_nothing_streams(tiny_store):
    m = StoreManifest.load(tiny_store)
    model = StreamedDecoder(tiny_store, 10 * m.weights_bytes, "float32", kv_tokens=64)
    try:
        assert not model.plan.streamed and model.plan.prefetch_depth == 0
        model.reset_stats()
        forward(model)
        forward(model)
        assert model.io_busy_s() == 0.0
    finally:
        model.close()
    from lever.model.native_loader import load_gguf_native
    resident, _ = load_gguf_native(write_tiny_gguf(tiny_store.parent / "again.gguf"), "float32")
    verifier = TargetVerifier(resident, SamplingParams(), capacity=32, seed=1)
    verifier.start([1, 2, 3])
    assert verifier.io_busy_s() == 0.0
