"""Mode lever end to end: `lever generate` (the default with a draft model and a
store) and `lever bench`, on SmolLM2 drafting for itself. Greedy output equals
ar's token for token; the JSON carries the tree sizes and the predicted vs
realised figures; the profile and the calibration are cached and reused; the
errors a user can make are one clear line."""

import json

import pytest

from lever.cli import main
from lever.commands.bench import parse_mode
from lever.errors import LeverError
from lever.store.manifest import StoreManifest
from lever.store.residency import plan_residency

pytestmark = pytest.mark.real

PROMPT = "Write a Python function that returns the sum of a list."


def half_budget(store) -> int:
    """A budget that pins about half of the layers."""
    m = StoreManifest.load(store)
    for budget in range(50_000_000, 2_000_000_000, 5_000_000):
        try:
            if plan_residency(m, budget, kv_tokens=2048).pinned_layers >= m.config.n_layers // 2:
                return budget
        except LeverError:
            continue
    raise AssertionError("no budget pins half the layers")


def generate_json(args, capsys) -> tuple[dict, str]:
    assert main(["generate", *args, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


def test_generate_lever_is_the_default_and_exact(smol_store, smollm2_path, tmp_path, capsys):
    common = ["--target-store", str(smol_store), "--dram-budget", str(half_budget(smol_store)),
              "--prompt", PROMPT, "--max-new-tokens", "24", "--cache-dir", str(tmp_path)]
    ref, _ = generate_json([*common, "--mode", "ar"], capsys)
    # a capped reader makes the streamed half cost what it would on phone flash, so
    # drafting pays off whatever this machine's disk or page cache does
    common += ["--read-limit", "100MB/s"]
    out, err = generate_json([*common, "--draft", str(smollm2_path)], capsys)
    assert out["mode"] == "lever"
    assert out["token_ids"] == ref["token_ids"]
    lv = out["speculative"]["lever"]
    assert lv["iterations"] == out["speculative"]["iterations"] > 0
    assert sum(lv["tree_size"]["histogram"].values()) == lv["iterations"]
    assert lv["accepted_length"]["realised_mean"] == pytest.approx(out["speculative"]["mean_accepted_length"],
                                                                   abs=0.01)
    # drafts were made and accepted (how many pay off on this tiny store is the policy's call)
    assert lv["tree_size"]["max"] >= 1 and lv["accepted_length"]["realised_mean"] > 1
    assert lv["iteration_s"]["predicted_mean"] > 0 and lv["iteration_s"]["realised_mean"] > 0
    assert lv["calibration"]["observations"] > 0
    # a first run's calibration (no file, no shipped table for this pair) is never worse than raw q
    assert lv["calibration"]["ece_calibrated"] <= lv["calibration"]["ece_draft_prob"]
    profiles = tmp_path / "profiles"
    assert len(list(profiles.glob("calibration-*.json"))) == 1
    # one measured profile; the ring-depth tuner may add one derived from it for another
    # read-ring depth (lever.cost.ring_depth), keyed apart and only when it re-planned
    keyed = [json.loads(p.read_text())["key"] for p in profiles.glob("*.json")
             if not p.name.startswith("calibration")]
    derived = [k for k in keyed if "derived_from" in k]
    assert len(keyed) - len(derived) == 1
    assert len(derived) == ("profile: read ring" in err)
    assert "measured" in err
    # the second run finds the profile and starts from what the first one learnt
    out2, err2 = generate_json([*common, "--draft", str(smollm2_path)], capsys)
    assert "using the cached profile" in err2
    assert out2["token_ids"] == ref["token_ids"]
    assert out2["speculative"]["lever"]["calibration"]["observations"] > lv["calibration"]["observations"]


def test_generate_lever_in_memory_sampling(smollm2_path, tmp_path, capsys):
    """Mode lever on an in-memory target with sampling: runs, reports, and is
    reproducible for a seed (exactness of the sampling walk is tested in
    test_speculative.py)."""
    args = ["--model", str(smollm2_path), "--draft", str(smollm2_path), "--mode", "lever", "--prompt", PROMPT,
            "--max-new-tokens", "12", "--temperature", "0.8", "--seed", "3", "--cache-dir", str(tmp_path)]
    a, _ = generate_json(args, capsys)
    b, _ = generate_json(args, capsys)
    assert a["token_ids"] == b["token_ids"] and len(a["token_ids"]) == 12
    assert a["speculative"]["lever"]["iterations"] > 0


def test_bench_lever_mode(smollm2_path, tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(["bench", "--target", str(smollm2_path), "--draft", str(smollm2_path), "--modes", "ar", "tree:16",
               "lever", "lever:8", "--prompts", "2", "--new-tokens", "8", "--out", str(out), "--no-progress",
               "--cache-dir", str(tmp_path)])
    assert rc == 0
    data = json.loads((out / "bench.json").read_text())
    assert list(data["modes"]) == ["ar", "tree:16", "lever", "lever:8"]
    for label in ("lever", "lever:8"):
        a = data["modes"][label]
        # a resident target this small decodes about as fast alone: lever may decide not to draft
        assert a["mismatches"] == 0 and a["mean_accepted_length"] >= 1
        assert a["spec"]["mode"] == "lever"
        assert {"tree_size", "accepted_length", "iteration_s", "calibration"} <= set(a["lever"])
        assert a["lever"]["iterations"] == a["target_passes"]
    assert data["modes"]["lever:8"]["lever"]["tree_size"]["max"] <= 8
    assert data["modes"]["lever:8"]["spec"]["lever"]["max_nodes"] == 8
    printed = capsys.readouterr().out
    assert "# lever: tree nodes mean" in printed and "# lever:8: tree nodes mean" in printed


def test_lever_mode_specs():
    m = parse_mode("lever")
    assert (m.label, m.lever_nodes) == ("lever", 255)
    m = parse_mode("lever:64")
    assert (m.label, m.lever_nodes) == ("lever:64", 64)
    for bad in ("lever:0", "lever:x", "lever:4:4"):
        with pytest.raises(LeverError, match="bad mode spec"):
            parse_mode(bad)


def test_lever_needs_a_draft_model(smollm2_path, tmp_path, capsys):
    rc = main(["generate", "--model", str(smollm2_path), "--draft", "ngram", "--mode", "lever", "--prompt", "x",
               "--cache-dir", str(tmp_path)])
    assert rc == 2
    assert "lever: error: --mode lever needs a draft model" in capsys.readouterr().err
    rc = main(["bench", "--target", str(smollm2_path), "--draft", "ngram", "--modes", "lever", "--prompts", "1",
               "--new-tokens", "2", "--out", str(tmp_path / "o"), "--cache-dir", str(tmp_path), "--no-progress"])
    assert rc == 2
    assert "mode lever needs a draft model" in capsys.readouterr().err
