"""The acceptance calibration starts right: never worse calibrated than the raw
draft probability q (the bar: replayed recorded traces of the real
qwen2.5-coder-0.5b drafting for qwen2.5-coder-1.5b, ECE after every
iteration), corrects a miscalibrated draft only with evidence, and starts a
user from the table shipped for the pair (keyed by the GGUFs' SHA-256 and
the sampling setting), refined in the user's own file."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from lever.draft import calibration as C
from lever.draft.calibration import AcceptanceCalibration
from lever.draft.gain_cost import CostCurves, GainCostPolicy
from lever.gguf import registry
from lever.mode_lever import (SHIPPED_FORMAT, SHIPPED_MAX_TRIALS, load_calibration, model_sha256, sampling_key,
                          save_calibration, shipped_calibration, shipped_tables_dir)
from lever.sampling import SamplingParams

TRACES = sorted((Path(__file__).resolve().parents[1] / "data").glob("calibration_trace_*.npz"))
GREEDY, SAMPLED = SamplingParams(), SamplingParams(temperature=0.7)


def ece(pred: np.ndarray, outcome: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error over equal-width bins of the prediction."""
    b = np.clip((pred * bins).astype(int), 0, bins - 1)
    gap = sum(abs(pred[b == k].sum() - outcome[b == k].sum()) for k in range(bins))
    return gap / len(pred)


def iterations(trace):
    it = trace["iteration"]
    for idx in np.split(np.arange(it.size), np.flatnonzero(np.diff(it)) + 1):
        yield trace["q"][idx].astype(np.float64), trace["depth"][idx], trace["rank"][idx], trace["accepted"][idx]


def replay_checking_ece(trace, cal: AcceptanceCalibration) -> tuple[float, float]:
    """Feed `trace` iteration by iteration; after every iteration the ECE of the
    estimates made so far (each before its outcome was learnt) must not
    exceed that of the raw q. Returns the final (calibrated, raw) ECE."""
    preds, raws, outcomes = [], [], []
    for i, (q, depth, rank, accepted) in enumerate(iterations(trace)):
        preds.append(cal.predict(q, depth, rank))
        raws.append(q)
        outcomes.append(accepted.astype(np.float64))
        cal.update(q, depth, rank, accepted)
        p, r, y = np.concatenate(preds), np.concatenate(raws), np.concatenate(outcomes)
        e_cal, e_raw = ece(p, y), ece(r, y)
        assert e_cal <= e_raw + 1e-12, f"iteration {i}: calibrated ECE {e_cal:.4f} > raw {e_raw:.4f}"
    # the class's own report is the same figure
    report = cal.calibration_error()
    if report["observations"] == len(y):
        assert report["ece_calibrated"] == pytest.approx(e_cal) and report["ece_draft_prob"] == pytest.approx(e_raw)
    return e_cal, e_raw


# -- the bar -----------------------------------------------------------------------------

def test_recorded_traces_are_real():
    assert len(TRACES) >= 2
    for path in TRACES:
        t = np.load(path)
        assert "qwen2.5-coder-0.5b -> qwen2.5-coder-1.5b" in str(t["label"])
        assert np.unique(t["iteration"]).size >= 100 and t["q"].size >= 500
        assert 0 < t["accepted"].mean() < 1


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_cold_calibration_never_worse_than_raw_on_recorded_trace(path):
    replay_checking_ece(np.load(path), AcceptanceCalibration())


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_shipped_start_never_worse_than_raw_on_recorded_trace(path):
    """A user of the registered pair starts from the shipped table (learnt on
    other prompts); on the bench-prompt trace it must not be worse than raw q either."""
    sampling = GREEDY if "greedy" in path.stem else SAMPLED
    d, t = registry.KNOWN_MODELS["qwen2.5-coder-0.5b"], registry.KNOWN_MODELS["qwen2.5-coder-1.5b"]
    start = shipped_calibration(d.sha256, t.sha256, sampling)
    assert start is not None, f"no shipped table for the registered pair, {sampling_key(sampling)}"
    replay_checking_ece(np.load(path), start)


# -- the rule ----------------------------------------------------------------------------

def synthetic(true_accept, iterations=400, per=6, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(iterations):
        q = np.where(rng.random(per) < 0.4, rng.beta(8, 1, per), rng.beta(0.5, 3, per))
        yield q, rng.integers(1, 8, per), rng.integers(0, 4, per), rng.random(per) < true_accept(q)


def test_cold_estimate_is_raw_q():
    cal = AcceptanceCalibration()
    q = np.array([0.0, 0.01, 0.3, 0.77, 1.0])
    assert np.array_equal(cal.predict(q, np.array([1, 2, 3, 9, 1]), np.array([0, 1, 2, 5, 0])), q)


@pytest.mark.parametrize("seed", range(3))
def test_a_calibrated_draft_keeps_raw_q(seed):
    """Outcomes drawn with probability q: no correction ever passes the guard."""
    cal = AcceptanceCalibration()
    for q, depth, rank, y in synthetic(lambda q: q, seed=seed):
        assert np.array_equal(cal.predict(q, depth, rank), q)
        cal.update(q, depth, rank, y)


@pytest.mark.parametrize("truth", [lambda q: 0.8 * q, lambda q: q ** 2, np.sqrt], ids=["0.8q", "q^2", "sqrt"])
def test_a_miscalibrated_draft_is_corrected(truth):
    cal = AcceptanceCalibration()
    for q, depth, rank, y in synthetic(truth, seed=1):
        cal.update(q, depth, rank, y)
    e = cal.calibration_error()
    assert e["ece_calibrated"] < 0.75 * e["ece_draft_prob"]
    q, depth, rank, _ = next(synthetic(truth, per=2000, seed=7))         # nodes like those it learnt from
    p = cal.predict(q, depth, rank)
    assert np.abs(p - truth(q)).mean() < 0.6 * np.abs(q - truth(q)).mean()


def test_a_shipped_correction_that_does_not_pay_for_a_user_falls_back_to_q():
    """A table learnt where the draft is overconfident, used as a shipped start
    (`as_prior`) by a user for whom q is right: back to q within a few hundred iterations."""
    table = AcceptanceCalibration()
    for q, depth, rank, y in synthetic(lambda q: 0.7 * q, iterations=2000, seed=2):
        table.update(q, depth, rank, y)
    cal = table.as_prior(SHIPPED_MAX_TRIALS)
    q = np.array([0.6, 0.85, 0.97])
    depth, rank = np.full(3, 2), np.zeros(3, dtype=int)
    assert (cal.predict(q, depth, rank) < q - 0.1).all()             # the table's correction, from the start
    for q_, d_, r_, y in synthetic(lambda q: q, iterations=400, seed=3):
        cal.update(q_, d_, r_, y)
    assert np.abs(cal.predict(q, depth, rank) - q).max() < 0.02


def test_cold_child_accept_still_expands():
    """Before any data the grower is told the draft's top choices are worth trying."""
    rows = AcceptanceCalibration().child_accept(max_depth=4, width=6)
    assert len(rows) == 4 and all(len(r) == 6 for r in rows)
    assert rows[0][:4] == pytest.approx(list(C.CHILD_PRIOR[:4]))
    assert all(r[0] >= 0.5 and r[0] > r[1] > r[2] for r in rows)


def test_as_prior_caps_counts_and_keeps_estimates():
    cal = AcceptanceCalibration()
    for q, depth, rank, y in synthetic(lambda q: 0.6 * q, iterations=2000, seed=4):
        cal.update(q, depth, rank, y)
    prior = cal.as_prior(50)
    assert prior.q_trials.max() <= 50 + 1e-9 and prior.cell_trials.max() <= 50 + 1e-9
    assert prior.q_evidence.max() <= C.PRIOR_EVIDENCE and prior.observations < cal.observations
    assert prior.calibration_error()["ece_calibrated"] is None
    q = np.array([0.5, 0.9])
    assert prior.predict(q, np.array([1, 1]), np.array([0, 0])) == pytest.approx(
        cal.predict(q, np.array([1, 1]), np.array([0, 0])), abs=0.05)


def test_json_round_trip_and_old_layout_rejected():
    cal = AcceptanceCalibration()
    for q, depth, rank, y in synthetic(lambda q: 0.8 * q, iterations=50):
        cal.update(q, depth, rank, y)
    back = AcceptanceCalibration.from_json(json.loads(json.dumps(cal.to_json())))
    for name in C._ARRAYS:
        assert np.array_equal(getattr(back, name), getattr(cal, name))
    old = {**cal.to_json(), "version": 1}
    with pytest.raises(ValueError):
        AcceptanceCalibration.from_json(old)
    bad = cal.to_json()
    bad["cell_trials"][0][0][0] = -1.0
    with pytest.raises(ValueError):
        AcceptanceCalibration.from_json(bad)


# -- shipped tables and the user's file --------------------------------------------------------

DRAFT_SHA, TARGET_SHA = "a" * 64, "b" * 64


def write_table(directory: Path, name="pair__greedy.json", draft=DRAFT_SHA, target=TARGET_SHA, params=GREEDY,
                truth=lambda q: 0.7 * q) -> AcceptanceCalibration:
    cal = AcceptanceCalibration()
    for q, depth, rank, y in synthetic(truth, iterations=800, seed=5):
        cal.update(q, depth, rank, y)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps({"format": SHIPPED_FORMAT, "draft_sha256": draft,
                                              "target_sha256": target, "sampling": sampling_key(params),
                                              "calibration": cal.to_json()}))
    return cal


def test_shipped_table_is_found_by_hashes_and_sampling(tmp_path):
    full = write_table(tmp_path)
    start = shipped_calibration(DRAFT_SHA, TARGET_SHA, GREEDY, tables_dir=tmp_path)
    assert start is not None and start.q_trials.max() <= SHIPPED_MAX_TRIALS + 1e-9
    q = np.array([0.8])
    assert start.predict(q, [2], [0]) == pytest.approx(full.predict(q, [2], [0]), abs=0.02)
    assert start.predict(q, [2], [0])[0] < 0.7            # the table's correction is used from the start
    assert shipped_calibration(TARGET_SHA, DRAFT_SHA, GREEDY, tables_dir=tmp_path) is None     # another pair
    assert shipped_calibration(DRAFT_SHA, "c" * 64, GREEDY, tables_dir=tmp_path) is None
    assert shipped_calibration(DRAFT_SHA, TARGET_SHA, SAMPLED, tables_dir=tmp_path) is None     # sampling
    assert shipped_calibration(None, TARGET_SHA, GREEDY, tables_dir=tmp_path) is None
    assert shipped_calibration(DRAFT_SHA, TARGET_SHA, GREEDY, tables_dir=tmp_path / "none") is None


@pytest.mark.parametrize("damage", ["truncated", "old layout", "bad array"])
def test_a_corrupt_or_stale_shipped_table_is_never_used(tmp_path, capsys, damage):
    write_table(tmp_path)
    path = tmp_path / "pair__greedy.json"
    data = json.loads(path.read_text())
    if damage == "truncated":
        path.write_text(path.read_text()[:200])
    elif damage == "old layout":
        data["calibration"]["version"] = 1
        path.write_text(json.dumps(data))
    else:
        data["calibration"]["q_trials"] = [float("nan")] * len(data["calibration"]["q_trials"])
        path.write_text(json.dumps(data))
    assert shipped_calibration(DRAFT_SHA, TARGET_SHA, GREEDY, tables_dir=tmp_path) is None
    assert "ignoring the shipped calibration pair__greedy.json" in capsys.readouterr().err


def test_user_file_first_then_shipped_then_cold(tmp_path, capsys):
    write_table(tmp_path / "tables")
    start = lambda: shipped_calibration(DRAFT_SHA, TARGET_SHA, GREEDY, tables_dir=tmp_path / "tables")
    user = tmp_path / "profiles" / "calibration-x.json"
    # no user file: the shipped start
    policy = GainCostPolicy(CostCurves.linear(0.01, 0.001, 0.001, 0.0001), load_calibration(user, start))
    policy.calibration_path = user
    shipped_n = policy.calibration.observations
    assert 0 < shipped_n
    # the user's observations refine it and go to the user's file, not the table
    table_before = (tmp_path / "tables" / "pair__greedy.json").read_bytes()
    for q, depth, rank, y in synthetic(lambda q: 0.7 * q, iterations=30, seed=9):
        policy.calibration.update(q, depth, rank, y)
    assert save_calibration(policy) == user
    assert (tmp_path / "tables" / "pair__greedy.json").read_bytes() == table_before
    again = load_calibration(user, start)
    assert again.observations == shipped_n + 180
    assert again.calibration_error()["observations"] == shipped_n + 180
    # a corrupt user file: warning, then the shipped start again
    user.write_text("{")
    assert load_calibration(user, start).observations == shipped_n
    assert "ignoring the calibration" in capsys.readouterr().err
    # no user file and no table: cold
    assert load_calibration(tmp_path / "nothing.json", lambda: None).observations == 0
    assert load_calibration(tmp_path / "nothing.json").observations == 0


def test_the_wheel_ships_a_table_per_sampling_for_the_registered_pair():
    """lever/data/calibration/ is package data (importlib.resources), each table
    valid and keyed by the registry's SHA-256 of the two GGUFs."""
    d, t = registry.KNOWN_MODELS["qwen2.5-coder-0.5b"], registry.KNOWN_MODELS["qwen2.5-coder-1.5b"]
    tables = [e for e in shipped_tables_dir().iterdir() if e.name.endswith(".json")]
    found = set()
    for entry in tables:
        data = json.loads(entry.read_text(encoding="utf-8"))
        assert data["format"] == SHIPPED_FORMAT
        AcceptanceCalibration.from_json(data["calibration"])
        assert (data["draft_sha256"], data["target_sha256"]) == (d.sha256, t.sha256)
        assert data["trials"] >= 1000 and data["prompts"].startswith("lever/data/calibration_prompts_v1.json")
        found.add(json.dumps(data["sampling"], sort_keys=True))
    assert {json.dumps(sampling_key(p), sort_keys=True) for p in (GREEDY, SAMPLED)} <= found


def test_calibration_prompts_are_disjoint_from_the_bench_set():
    import importlib.resources
    from lever.bench_prompts import load_prompts, versions
    cal = json.loads(importlib.resources.files("lever").joinpath("data", "calibration_prompts_v1.json")
                     .read_text(encoding="utf-8"))
    texts = {p["text"] for p in cal["prompts"]}
    assert len(texts) == len(cal["prompts"]) >= 20
    assert {p["category"] for p in cal["prompts"]} == {"code", "math", "prose"}
    for v in versions():
        assert not texts & {p["text"] for p in load_prompts(v)}
    assert "calibration_prompts_v1" not in " ".join(versions())


def test_model_sha256_of_files(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + bytes(60))
    assert model_sha256(f, tmp_path) is None                       # not the size of a registered model
    digest = hashlib.sha256(f.read_bytes()).hexdigest()
    entry = registry.ModelEntry("tiny", "", "draft", "llama", (), size=64, sha256=digest, install="")
    monkeypatch.setattr(registry, "KNOWN_MODELS", {"tiny": entry})
    assert model_sha256(f, tmp_path) == digest                     # the size of one: hashed
    assert model_sha256(tmp_path / "missing.gguf", tmp_path) is None


@pytest.mark.real
def test_model_sha256_of_a_store_is_its_source_ggufs(smollm2_path, tmp_path):
    """A flash store records its source GGUF's path (lever.store.convert); while
    that GGUF is there, the store is keyed by its SHA-256, so a store of a
    registered model finds the model's shipped table."""
    from lever.store.convert import convert
    store = convert(str(smollm2_path), tmp_path / "store", progress=False)
    assert model_sha256(store) == registry.KNOWN_MODELS["smollm2-135m"].sha256 == model_sha256(smollm2_path)
