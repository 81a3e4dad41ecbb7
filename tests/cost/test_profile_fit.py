"""A robust profile (issue 14): the fitted cost curve, the measurement's
repeats / outliers / validation, and the online per-n-range drift.

The bar: a profile with one injected spike (n = 4 compute x3, as a busy
machine produced once) gives the native tree grower exactly the tree sizes
the clean profile gives -- where a running maximum of the raw points made
the spike permanent for every larger n and shrank the trees.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from lever._native import TreeGrower
from lever.cost import measure
from lever.cost.cost_model import CostModel, interpolate
from lever.cost.device_profile import DeviceProfile, Stage
from lever.cost.drift import MIN_OBSERVATIONS, CostDrift, profile_spread
from lever.cost.fit import convex_curve, fit_curve, isotonic, reject_spikes
from lever.errors import LeverError, ProfileError

GRID = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]


def layer_compute(n) -> np.ndarray:
    """Seconds of one layer: flat while memory-bound, then linear, slightly convex."""
    n = np.asarray(n, dtype=np.float64)
    return 0.0015 + 0.00004 * np.maximum(0.0, n - 6) + 1e-8 * n ** 2


# -- the fit ---------------------------------------------------------------------------

def test_isotonic_is_the_pooled_monotone_fit():
    assert list(isotonic([1.0, 3.0, 2.0, 4.0])) == [1.0, 2.5, 2.5, 4.0]
    assert list(isotonic([3.0, 2.0, 1.0])) == [2.0, 2.0, 2.0]
    assert list(isotonic([1.0, 3.0, 2.0], weights=[1, 1, 3])) == [1.0, 2.25, 2.25]
    v = np.random.default_rng(0).normal(size=50).cumsum()
    fit = isotonic(v)
    assert np.all(np.diff(fit) >= 0) and fit.mean() == pytest.approx(v.mean())


def test_convex_curve_has_rising_slopes_and_keeps_convex_data():
    g = np.array([1, 2, 4, 8, 16, 32], dtype=float)
    v = np.array([1.0, 1.5, 1.6, 1.7, 3.0, 6.0])        # concave start, convex end
    c = convex_curve(g, v)
    slopes = np.diff(c) / np.diff(g)
    assert np.all(np.diff(slopes) >= -1e-12) and np.all(slopes >= -1e-12)
    assert np.max(np.abs(c / v - 1)) < 0.2                     # a concave start costs some fit
    # least squares: no small move along a feasible direction does better
    err = np.sum((c / v - 1) ** 2)
    for other in (np.interp(g, [1, 32], [c[0], c[-1]]), np.maximum(c, c[2]), c * 1.01, c * 0.99):
        mix = 0.9 * c + 0.1 * other                            # convex, non-decreasing as well
        assert np.sum((mix / v - 1) ** 2) >= err - 1e-12
    already = 28 * layer_compute(GRID)
    assert convex_curve(GRID, already) == pytest.approx(already, rel=1e-9)
    w = np.array([1 / 9, 1 / 4, 1.0])                        # falling data: a constant, relative least squares
    assert list(convex_curve([1, 2, 4], [3.0, 2.0, 1.0])) == pytest.approx([np.sum(w * [3, 2, 1]) / w.sum()] * 3)


@pytest.mark.parametrize("seed", range(20))
def test_fit_is_monotone_and_convex_where_the_data_allows(seed):
    rng = np.random.default_rng(seed)
    clean = 28 * layer_compute(GRID)
    noisy = clean * rng.normal(1.0, 0.02, len(GRID))
    fit = fit_curve(GRID, noisy, [0.02] * len(GRID))
    assert np.all(np.diff(fit) >= 0)
    slopes = np.diff(fit) / np.diff(GRID)
    assert np.all(np.diff(slopes) >= -1e-12)              # the data is convex up to noise: so is the fit
    assert np.max(np.abs(fit / clean - 1)) < 0.06


def test_a_real_step_is_kept_and_not_convexified_beyond_the_spread():
    g = [1, 2, 4, 8, 12, 16, 24, 32]
    v = [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.1]           # a kernel switch at n = 8
    fit = fit_curve(g, v, [0.01] * len(g))
    assert reject_spikes(g, v)[1] == []
    assert fit[3] == pytest.approx(2.0) and fit[2] == pytest.approx(1.0, rel=0.05)
    assert fit[3] - fit[2] > 0.9                          # the step stays a step
    assert np.all(np.diff(fit) >= 0)


@pytest.mark.parametrize("where", [0, 2, 5, 9])
def test_a_single_spike_is_rejected(where):
    clean = 28 * layer_compute(GRID)
    spiked = clean.copy()
    spiked[where] *= 3.0
    cleaned, rejected = reject_spikes(GRID, spiked, [0.02] * len(GRID))
    assert rejected == [where]
    assert cleaned[where] == pytest.approx(clean[where], rel=0.05)
    assert np.max(np.abs(fit_curve(GRID, spiked) / fit_curve(GRID, clean) - 1)) < 0.05
    # the old running maximum kept it for every larger n
    assert np.maximum.accumulate(spiked)[where + 1] > 2 * clean[where + 1]


def test_a_large_spread_tolerates_a_larger_bump():
    clean = 28 * layer_compute(GRID)
    bumped = clean.copy()
    bumped[2] *= 1.6
    assert reject_spikes(GRID, bumped, [0.01] * len(GRID))[1] == [2]
    assert reject_spikes(GRID, bumped, [0.2] * len(GRID))[1] == []     # 4 spreads = 80 %: within


def test_interpolate_uses_the_fit():
    grid = [1, 4, 16]
    assert list(interpolate(grid, [1.0, 2.0, 6.0], np.array([1.0, 4.0, 10.0, 16.0, 28.0]))) == \
        pytest.approx([1.0, 2.0, 4.0, 6.0, 10.0])
    spiked = interpolate(GRID, np.where(np.array(GRID) == 4, 3.0, 1.0) * layer_compute(GRID), np.array([8.0, 64.0]))
    assert spiked == pytest.approx(layer_compute([8, 64]), rel=1e-9)
    with pytest.raises(ValueError, match="spread"):
        interpolate(grid, [1.0, 2.0, 5.0], np.array([2.0]), spread=[0.1])


# -- the bar: an injected spike does not change the trees ---------------------------------

def synthetic_profile(io_s: float, spike_at: int | None = None, layers: int = 28) -> DeviceProfile:
    """A 1.5B-like profile: `layers` layers (io_s seconds of flash each; 0 = resident)
    and a head; compute x3 at n = spike_at when given (the whole pass was slow)."""
    grid = np.array(GRID)
    factor = np.where(grid == spike_at, 3.0, 1.0)
    stages = [Stage(f"layer.{i}", "layer", io_s, 1000 if io_s > 0 else 0, list(layer_compute(grid) * factor))
              for i in range(layers)]
    stages.append(Stage("head", "head", 0.0, 0, list((0.004 + 0.00003 * grid) * factor)))
    draft_grid = [1, 2, 4, 8, 16, 32, 64]
    return DeviceProfile(key={}, n_grid=list(GRID), stages=stages, embed_s=list(1e-5 * factor),
                         draft_grid=draft_grid, draft_s=[0.008 + 0.0001 * f for f in draft_grid],
                         iteration_overhead_s=0.001, prefetch_depth=2 if io_s > 0 else 0,
                         pass_spread=[0.02] * len(GRID), draft_spread=[0.02] * len(draft_grid))


def grown_size(verify_s: np.ndarray, draft_s: np.ndarray, overhead_s: float, accept: list[float],
               max_depth: int = 12) -> int:
    """Drive the native grower with a draft whose every node has the same ranked
    children (acceptance `accept` per rank); the selected tree's size."""
    max_nodes = len(verify_s) - 1
    g = TreeGrower(np.asarray(verify_s, dtype=np.float64), np.asarray(draft_s, dtype=np.float64), overhead_s,
                   max_nodes, max_depth)
    g.begin(7, [accept] * max_depth)
    k = len(accept)
    tokens = np.arange(10, 10 + k, dtype=np.int32)
    logprobs = np.log(np.asarray(accept, dtype=np.float32) / sum(accept))
    while nodes := g.next_expansion():
        for node in nodes:
            g.add_children(node, tokens, logprobs, np.asarray(accept, dtype=np.float64))
    return len(g.select()[0])


ACCEPT = ([0.8, 0.1, 0.05, 0.02], [0.6, 0.2, 0.08, 0.04], [0.4, 0.2, 0.1, 0.05], [0.3, 0.15, 0.1, 0.05],
          [0.2, 0.1, 0.05, 0.02], [0.1, 0.05, 0.02, 0.01])


def tree_sizes(model: CostModel, verify_s=None) -> list[int]:
    verify = model.verify_s(256) if verify_s is None else verify_s
    draft = model.draft_s(256)
    return [grown_size(verify, draft, model.iteration_overhead_s, a) for a in ACCEPT]


def test_a_spiked_profile_grows_the_same_trees_as_a_clean_one():
    """THE BAR of issue 14 item 1, on a resident (compute-bound) and a streamed
    (flash-bound) target: the spike is rejected, the fitted curves agree, and
    the grower picks identical tree sizes.  The old running maximum of the raw
    points, fed the same spiked profile, grows smaller trees (so this test
    would catch the old behaviour)."""
    for io_s in (0.0, 0.004):
        clean = CostModel(synthetic_profile(io_s))
        spiked_profile = synthetic_profile(io_s, spike_at=4)
        spiked = CostModel(spiked_profile)
        assert np.max(np.abs(spiked.verify_s(256) / clean.verify_s(256) - 1)) < 0.02
        sizes = tree_sizes(clean)
        assert tree_sizes(spiked) == sizes, io_s
        assert len(set(sizes)) >= 3, sizes                         # the scenarios span small to large trees
    # the running maximum (the old interpolation) on the resident spiked profile
    p = synthetic_profile(0.0, spike_at=4)
    n = np.arange(1, 257, dtype=np.float64)
    old = sum(np.interp(n, GRID, np.maximum.accumulate(s.compute_s)) for s in p.stages)
    old = old + np.interp(n, GRID, np.maximum.accumulate(p.embed_s))
    old_sizes = tree_sizes(spiked, verify_s=old)
    assert old_sizes != tree_sizes(CostModel(synthetic_profile(0.0)))
    assert all(o <= s for o, s in zip(old_sizes, tree_sizes(CostModel(synthetic_profile(0.0)))))


# -- measuring: repeats, outliers, validation (a fake timing source) ----------------------

class FakeTimer:
    """A stand-in for one timed forward: stage seconds from `layer_compute`, times
    `slow(n, call)` for the call-th run at n (1-based)."""

    def __init__(self, slow=lambda n, call: 1.0):
        self.slow = slow
        self.calls: dict[int, int] = {}

    def __call__(self, n: int) -> list[tuple[str, float]]:
        self.calls[n] = self.calls.get(n, 0) + 1
        f = self.slow(n, self.calls[n])
        c = float(layer_compute(n)) * f
        return [("embed", 1e-5 * f), ("layer.0", c), ("layer.1", c), ("head", 0.004 * f)]


def total(n: int) -> float:
    return 1e-5 + 2 * float(layer_compute(n)) + 0.004


def test_outlier_runs_are_dropped_and_the_spread_stored():
    run = FakeTimer(slow=lambda n, call: {2: 3.0, 4: 1.01, 5: 0.99}.get(call, 1.0))
    point = measure.measure_point(run, 16, 5)
    assert point.runs == 5 and point.rejected == 1
    assert point.total_s == pytest.approx(total(16))
    assert point.stages["layer.0"] == pytest.approx(float(layer_compute(16)))
    assert 0 < point.spread < 0.02
    assert measure.kept_runs([1.0, 1.0, 1.0, 1.0, 1.05]) == [True] * 5     # within the 2 % floor x 3


def test_an_unstable_point_gets_more_runs():
    noisy = FakeTimer(slow=lambda n, call: (0.7, 1.0, 1.3, 0.85, 1.15)[call % 5])
    point = measure.measure_point(noisy, 8, 5)
    assert point.runs == 10 and point.spread > measure.UNSTABLE_SPREAD


def test_validation_remeasures_a_point_that_disagrees(capsys):
    """n = 8 was measured while the machine was busy (all five runs 3x: no
    outlier among them, a small spread); the end-of-measurement check
    disagrees, the point is measured again and the record says so."""
    grid = [1, 2, 4, 8, 16, 32, 64]
    assert [grid[i] for i in measure.validation_indices(len(grid))] == [4, 8, 16]
    run = FakeTimer(slow=lambda n, call: 3.0 if n == 8 and call <= 5 else 1.0)
    lines = []
    points = measure.measure_curve(run, grid, 5, lines.append, "target")
    assert points[3].total_s == pytest.approx(3 * total(8)) and points[3].spread < 0.01
    records = measure.validate_curve(run, points, 5, lines.append, "target")
    by_n = {r["n"]: r for r in records}
    assert set(by_n) == {4, 8, 16}
    assert by_n[4]["agreed"] and by_n[4]["remeasured"] == 0 and by_n[16]["remeasured"] == 0
    r = by_n[8]
    assert r["agreed"] and r["remeasured"] == 1
    assert r["stored_s"] == pytest.approx(3 * total(8)) and r["final_s"] == pytest.approx(total(8))
    assert points[3].total_s == pytest.approx(total(8))                  # replaced in the curve
    assert any("n=8" in line and "measured again" in line for line in lines)
    assert r["tolerance"] == measure.VALIDATION_FLOOR


def test_validation_gives_up_after_bounded_retries():
    """A point that never settles (alternately slow and fast batches) is
    re-measured VALIDATION_RETRIES times and recorded as disagreeing."""
    # 4 runs per measurement, 3 per check: every measurement slow, every check fast
    run = FakeTimer(slow=lambda n, call: 2.0 if (call - 1) % 7 < 4 else 1.0)
    points = [measure.measure_point(run, 4, 4)]
    lines = []
    records = measure.validate_curve(run, points, 4, lines.append, "draft", "f")
    (r,) = records
    assert not r["agreed"] and r["remeasured"] == measure.VALIDATION_RETRIES
    assert len(r["checks"]) == measure.VALIDATION_RETRIES + 1
    assert "still disagrees" in lines[-1]


def test_stages_that_differ_between_runs_are_refused():
    runs = [[("embed", 1.0), ("head", 1.0)], [("embed", 1.0)]]
    with pytest.raises(ProfileError, match="different stages"):
        measure.summarise(4, runs)


# -- the profile file: new fields, version ----------------------------------------------

def test_profile_round_trips_with_spread_and_validation():
    p = synthetic_profile(0.02)
    p.validation = [{"curve": "target", "n": 8, "stored_s": 0.3, "checks": [0.1, 0.1], "tolerance": 0.1,
                     "remeasured": 1, "final_s": 0.1, "agreed": True}]
    p.rejected_runs = 2
    again = DeviceProfile.from_json(json.loads(json.dumps(p.to_json())))
    assert again == p and again.version == 2
    assert profile_spread(p) == pytest.approx(0.02)


@pytest.mark.parametrize("damage", ["short spread", "negative spread", "nan spread", "record off grid",
                                    "record without checks", "missing spread", "negative rejected"])
def test_malformed_new_fields_are_refused(damage):
    d = synthetic_profile(0.0).to_json()
    d["validation"] = [{"curve": "draft", "n": 4, "stored_s": 0.01, "checks": [0.01], "tolerance": 0.1,
                        "remeasured": 0, "final_s": 0.01, "agreed": True}]
    DeviceProfile.from_json(copy.deepcopy(d))                              # intact: accepted
    if damage == "short spread":
        d["pass_spread"] = d["pass_spread"][:-1]
    elif damage == "negative spread":
        d["draft_spread"][0] = -0.1
    elif damage == "nan spread":
        d["pass_spread"][3] = float("nan")
    elif damage == "record off grid":
        d["validation"][0]["n"] = 5
    elif damage == "record without checks":
        d["validation"][0]["checks"] = []
    elif damage == "missing spread":
        del d["pass_spread"]
    else:
        d["rejected_runs"] = -1
    with pytest.raises(ProfileError):
        DeviceProfile.from_json(d)


def test_a_version_1_profile_is_refused():
    d = synthetic_profile(0.0).to_json()
    d["version"] = 1
    for k in ("pass_spread", "draft_spread", "validation", "rejected_runs"):
        del d[k]
    with pytest.raises(ProfileError, match="version 1"):
        DeviceProfile.from_json(d)


# -- online drift per n-range ----------------------------------------------------------------

def feed(drift: CostDrift, ratios: dict[int, float], rounds: int, base: float = 0.1) -> None:
    for _ in range(rounds):
        for n, r in ratios.items():
            drift.observe(n, base, base * r)


def test_a_drift_in_one_range_changes_only_its_factors():
    drift = CostDrift(256, 0.02)
    feed(drift, {2: 1.0, 10: 1.5, 30: 1.0, 100: 1.0}, 6)
    f = drift.factors()
    assert f.shape == (256,)
    assert np.all(f[4:16] == pytest.approx(1.5)) and np.all(f[:4] == 1.0) and np.all(f[16:] == 1.0)
    rep = drift.report()
    assert rep["refits"] == 1 and rep["refit_log"][0]["range"] == "5-16"
    assert rep["refit_log"][0]["old"] == 1.0 and rep["refit_log"][0]["new"] == pytest.approx(1.5)
    by_range = {r["n"]: r for r in rep["ranges"]}
    assert set(by_range) == {"1-4", "5-16", "17-64", "65+"}
    r = by_range["5-16"]
    assert r["observations"] == 6 and r["realised_s_mean"] == pytest.approx(1.5 * r["predicted_s_mean"])
    assert by_range["1-4"]["factor"] == 1.0
    json.dumps(rep)


def test_no_refit_within_the_threshold_or_for_one_slow_pass():
    drift = CostDrift(64, 0.01)
    feed(drift, {8: 1.05}, 10)                                # 5 % < the 10 % floor
    drift.observe(8, 0.1, 0.5)                                # one slow pass: the median does not move
    assert drift.report()["refits"] == 0 and np.all(drift.factors() == 1.0)
    wide = CostDrift(64, 0.1)                                 # spread 10 %: threshold 30 %
    feed(wide, {8: 1.25}, 10)
    assert wide.report()["refits"] == 0 and wide.threshold == pytest.approx(0.3)


def test_unobserved_ranges_follow_a_machine_wide_drift():
    drift = CostDrift(256, 0.02)
    feed(drift, {3: 2.0}, MIN_OBSERVATIONS)
    f = drift.factors()
    assert np.all(f == pytest.approx(2.0))                    # only 1-4 observed: every range follows
    rep = drift.report()
    assert {r["range"] for r in rep["refit_log"]} == {"1-4", "all"}
    assert not {r["n"]: r for r in rep["ranges"]}["65+"]["own_factor"]


def test_refit_follows_a_second_drift_and_the_curve_stays_monotone():
    drift = CostDrift(32, 0.0)
    feed(drift, {2: 1.0, 20: 1.0}, 5)
    feed(drift, {2: 1.6, 20: 1.0}, 5)
    assert drift.factors()[0] == pytest.approx(1.6) and drift.factors()[25] == 1.0
    verify = np.linspace(0.1, 0.2, 32)
    corrected = drift.corrected(verify)
    assert np.all(np.diff(corrected) >= 0) and corrected[0] == pytest.approx(0.16)
    assert [r["n"] for r in drift.report()["ranges"]] == ["1-4", "5-16", "17-32"]


def test_drift_bad_input():
    with pytest.raises(LeverError):
        CostDrift(0, 0.01)
    with pytest.raises(LeverError):
        CostDrift(16, -1.0)
    drift = CostDrift(16, 0.01)
    with pytest.raises(LeverError):
        drift.observe(0, 0.1, 0.1)
    with pytest.raises(LeverError):
        drift.corrected(np.ones(17))
    drift.observe(4, 0.1, 0.0)                                # no time: ignored
    drift.observe(4, math.nan, 0.1)
    drift.observe(40, 0.1, 0.1)                               # past n_max: the last range
    rep = drift.report()
    assert rep["observations"] == 1 and rep["ranges"][-1]["observations"] == 1
