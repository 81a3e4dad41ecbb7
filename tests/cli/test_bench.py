"""`lever bench` and its prompt set: a quick run on SmolLM2 in memory and from a
flash store (JSON with every mode, PNG, greedy outputs identical to ar), the
shipped prompts, the errors a user can make, the memory options, and
--memory-cap (every mode in its own capped process; needs root and a memory
cgroup controller, else those tests are skipped)."""

import json

import pytest

from lever.bench_prompts import load_prompts, prompt_set, versions
from lever.cli import main
from lever.commands.bench import parse_mode, parse_modes
from lever.errors import DramBudgetError, LeverError
from lever.store.manifest import StoreManifest
from lever.store.residency import plan_residency
from lever.values import parse_size
from tiny_model import needs_cgroup

pytestmark = pytest.mark.real

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODE_KEYS = {"mode", "runs", "generated_tokens", "decode_s", "tokens_per_s", "ratio_vs_ar", "target_passes",
             "mean_accepted_length", "draft_tokens", "accepted_draft_tokens", "acceptance_rate", "mean_tree_size",
             "bytes_read", "bytes_read_per_token", "time_split_s", "per_category", "mismatches",
             "mismatches_near_tie", "spec", "prefill_s"}
ROW_KEYS = {"prompt_id", "category", "mode", "prompt_tokens", "new_tokens", "decode_s", "tokens_per_s",
            "mean_accepted_length", "bytes_read", "time_split_s", "token_ids"}


def minimum_budget(store, **kw) -> int:
    with pytest.raises(DramBudgetError) as e:
        plan_residency(StoreManifest.load(store), 0, **kw)
    return parse_size(str(e.value).split("minimum of ")[1].split(" MB")[0].replace(",", "") + "MB") + 10**6


def check_outputs(out, capsys, modes, n_prompts, new_tokens, streamed):
    data = json.loads((out / "bench.json").read_text())
    assert list(data["modes"]) == modes
    assert {"config", "machine", "target", "prompts", "modes", "resident", "runs"} <= set(data)
    assert data["config"]["new_tokens"] == new_tokens and data["config"]["prompts"] == n_prompts
    for label, a in data["modes"].items():
        assert MODE_KEYS <= set(a), MODE_KEYS - set(a)
        assert set(a["time_split_s"]) == {"draft", "verify_compute", "io_stall", "accept"}
        assert a["runs"] == n_prompts and a["tokens_per_s"] > 0
        assert a["mismatches"] == 0, f"{label} differs from ar: {[r.get('divergence') for r in data['runs']]}"
        assert a["mean_accepted_length"] >= 1.0
        assert (a["bytes_read_per_token"] > 0) == streamed
    assert data["modes"]["ar"]["mean_accepted_length"] == 1.0 and data["modes"]["ar"]["ratio_vs_ar"] == 1.0
    assert data["modes"]["tree:16"]["mean_tree_size"] > 0
    assert len(data["runs"]) == n_prompts * (len(modes) + (1 if streamed else 0))
    for row in data["runs"]:
        assert ROW_KEYS <= set(row)
        assert 1 <= row["new_tokens"] <= new_tokens
        if row["mode"] != "ar":
            assert row["matches_ar"] is True
    # the same prompts for every mode, and identical greedy tokens
    by_prompt = {}
    for row in data["runs"]:
        by_prompt.setdefault(row["prompt_id"], set()).add(tuple(row["token_ids"]))
    assert len(by_prompt) == n_prompts and all(len(v) == 1 for v in by_prompt.values())
    png = (out / "bench.png").read_bytes()
    assert len(png) > 1000 and png.startswith(PNG_MAGIC)
    assert data["memory"]["peak_rss_bytes"] > 0
    assert all(a["memory"]["peak_rss_bytes_after"] > 0 for a in data["modes"].values())
    printed = capsys.readouterr().out
    assert "[memory: " in printed
    for label in modes:
        assert any(line.startswith(label + " ") for line in printed.splitlines()), printed
    assert "resident" in printed and "bench.json" in printed
    return data


def test_bench_in_memory_target(smollm2_path, tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(["bench", "--target", str(smollm2_path), "--draft", "ngram", "--quick", "--prompts", "2",
               "--new-tokens", "8", "--resident", "--out", str(out), "--no-progress"])
    assert rc == 0
    data = check_outputs(out, capsys, ["ar", "chain:4", "tree:16"], 2, 8, streamed=False)
    assert data["config"]["target_kind"] == "model" and data["resident"]["same_as_ar"] is True
    assert [p["category"] for p in data["prompts"]] == ["code", "math"]


def test_bench_sampled_modes_equal_ar(smollm2_path, tmp_path, capsys):
    """Sampling is keyed by position: with one seed every mode's sampled text is
    ar's, and the bench checks it token for token as it does greedy output."""
    out = tmp_path / "res"
    rc = main(["bench", "--target", str(smollm2_path), "--draft", "smollm2-135m", "--quick", "--prompts", "2",
               "--new-tokens", "8", "--temperature", "0.9", "--seed", "11", "--resident", "--out", str(out),
               "--no-progress"])
    assert rc == 0
    data = check_outputs(out, capsys, ["ar", "chain:4", "tree:16", "lever"], 2, 8, streamed=False)
    assert data["config"]["temperature"] == 0.9


def test_bench_streamed_target(smol_store, tmp_path, capsys):
    out = tmp_path / "res"
    budget = minimum_budget(smol_store)
    rc = main(["bench", "--target-store", str(smol_store), "--dram-budget", str(budget), "--draft", "ngram",
               "--quick", "--prompts", "2", "--new-tokens", "8", "--modes", "chain:4", "tree:16", "tree:8:2:4",
               "--resident", "--drop-caches", "--out", str(out)])
    assert rc == 0
    # ar is added as the reference when not asked for
    data = check_outputs(out, capsys, ["ar", "chain:4", "tree:16", "tree:8:2:4"], 2, 8, streamed=True)
    assert data["config"]["ar_added"] is True and data["config"]["target_kind"] == "store"
    assert data["config"]["page_cache"].startswith(("dropped", "could not drop"))
    res = data["resident"]
    assert res["same_as_ar"] is False and res["mismatches"] == 0 and res["bytes_read"] == 0
    # streamed ar reads every streamed byte once per token; speculation reads less per token
    ar = data["modes"]["ar"]
    per_pass = data["target"]["residency"]["streamed_bytes_per_pass"]
    assert 0 < per_pass <= ar["bytes_read_per_token"] < per_pass * 1.1
    # the I/O lower bound: bytes per token at the store's measured raw read rate
    raw = data["config"]["raw_read_bytes_per_s"]
    assert raw > 0 and ar["io_bound_tokens_per_s"] == pytest.approx(raw / ar["bytes_read_per_token"], rel=1e-3)
    assert data["modes"]["tree:8:2:4"]["spec"]["tree"] == {"budget": 8, "topk": 2, "depth": 4}


@pytest.mark.parametrize("dtype", ["bf16", "FP32"])
def test_bench_resident_takes_every_dtype_spelling(smol_store, tmp_path, capsys, dtype):
    """--resident builds a second decoder of the store: it gets the dtype's one name too."""
    out = tmp_path / "res"
    rc = main(["bench", "--target-store", str(smol_store), "--dram-budget", str(minimum_budget(smol_store)),
               "--draft", "ngram", "--modes", "ar", "--prompts", "1", "--new-tokens", "4", "--resident",
               "--dtype", dtype, "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((out / "bench.json").read_text())
    assert data["config"]["dtype"] == {"bf16": "bfloat16", "FP32": "float32"}[dtype]
    assert data["resident"]["mismatches"] == 0


def test_bench_resident_in_memory_target_takes_a_dtype_spelling(smollm2_path, tmp_path, capsys):
    """Issue 35's reproducer: --resident with --dtype fp32 and an in-memory --target runs."""
    out = tmp_path / "res"
    rc = main(["bench", "--resident", "--dtype", "fp32", "--target", str(smollm2_path), "--draft", str(smollm2_path),
               "--prompts", "1", "--new-tokens", "4", "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((out / "bench.json").read_text())
    assert data["config"]["dtype"] == "float32" and data["resident"]["same_as_ar"] is True


def test_verify_counts_the_bytes_its_pass_used(smol_store):
    """A verify counts exactly the streamed extents of its own pass (plus its embedding
    reads), wherever the ring's prefetches land: here, with settle() between the calls,
    the next pass's first extents all land outside the measured windows (counting reads
    as they landed lost them: bench's ar was once 64 KiB/token under per_pass)."""
    from lever.sampling import SamplingParams
    from lever.model.streamed_decoder import StreamedDecoder
    from lever.tree import TokenTree
    from lever.verify.target_pass import TargetVerifier

    model = StreamedDecoder(smol_store, minimum_budget(smol_store), "bfloat16")
    try:
        per_pass = model.plan.streamed_bytes_per_pass
        assert per_pass > 0
        verifier = TargetVerifier(model, SamplingParams(), capacity=64)
        verifier.start(list(range(1, 9)))
        for _ in range(4):
            model.settle()
            embedded = model.stats.embedding_bytes
            verdict = verifier.verify(TokenTree(verifier.root))
            assert verdict.bytes_read == per_pass + model.stats.embedding_bytes - embedded
        assert model.report()["bytes_used"] == model.stats.passes * per_pass + model.stats.embedding_bytes
    finally:
        model.close()


def test_prompt_set():
    prompts = load_prompts()
    assert len(prompts) >= 24
    assert {p["category"] for p in prompts} == {"code", "math", "prose"}
    assert len({p["id"] for p in prompts}) == len(prompts)
    for p in prompts:
        assert set(p) == {"id", "category", "source", "text"} and p["text"].strip()
        assert p["source"] == "written" or "==" in p["source"]
    counts = {c: sum(p["category"] == c for p in prompts) for c in ("code", "math", "prose")}
    assert counts["code"] >= 8 and counts["math"] >= 6 and counts["prose"] >= 5
    assert all(p["text"].startswith("Complete the following Python function:\n\n") for p in prompts
               if p["category"] == "code")
    data = prompt_set("v1")
    assert data["version"] == "v1" and data["note"] and "v1" in versions()
    # the first prompts are a mix, filters and limits work
    assert {p["category"] for p in load_prompts(limit=3)} == {"code", "math", "prose"}
    assert [p["category"] for p in load_prompts(categories=["math"], limit=4)] == ["math"] * 4
    with pytest.raises(LeverError, match="no benchmark prompt set 'v99'"):
        load_prompts("v99")
    with pytest.raises(LeverError, match="unknown prompt category 'poetry'"):
        load_prompts(categories=["poetry"])


def test_mode_specs():
    assert parse_mode("ar").spec.mode == "ar"
    m = parse_mode("chain:6")
    assert (m.label, m.spec.mode, m.spec.draft_len) == ("chain:6", "chain", 6)
    m = parse_mode("tree:32")
    assert m.label == "tree:32" and (m.spec.tree.budget, m.spec.tree.topk, m.spec.tree.depth) == (32, 4, 8)
    m = parse_mode("tree:16:2:5")
    assert m.label == "tree:16:2:5" and (m.spec.tree.budget, m.spec.tree.topk, m.spec.tree.depth) == (16, 2, 5)
    assert parse_mode("tree:16:4:8").label == "tree:16"
    modes, added = parse_modes(["tree:16", "chain:4,tree:16"])
    assert [m.label for m in modes] == ["ar", "tree:16", "chain:4"] and added


@pytest.mark.parametrize("spec", ["bogus", "chain", "chain:0", "tree:16:4", "tree:x", "ar:2", "tree:8:2:0"])
def test_bad_mode_spec_is_one_clear_line(spec, capsys):
    with pytest.raises(LeverError, match="bad mode spec"):
        parse_mode(spec)
    # the command fails before loading anything
    assert main(["bench", "--modes", "ar", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lever: error: bad mode spec") and "\n" not in err and "tree:N" in err


def test_missing_store_is_one_clear_line(tmp_path, capsys):
    assert main(["bench", "--target-store", str(tmp_path / "nope"), "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such store directory" in err and "lever convert" in err and "\n" not in err


# -- memory options ----------------------------------------------------------------

def test_memory_limit_below_the_minimum_lists_the_parts(smollm2_path, lever_cache, tmp_path, capsys):
    rc = main(["bench", "--target", str(smollm2_path), "--draft", "ngram", "--modes", "ar", "--prompts", "1",
               "--new-tokens", "4", "--memory-limit", "60MB", "--cache-dir", str(lever_cache),
               "--out", str(tmp_path), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "memory limit 60.0 MB is below this run's minimum" in err and "\n" not in err
    for part in ("runtime baseline", "draft weights", "draft KV", "target minimum", "weights", "kv cache",
                 "target scratch", "margin"):
        assert part in err, part
    assert not (tmp_path / "bench.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["--memory-limit", "1GB", "--dram-budget", "1GB"], "argument --dram-budget: not allowed with argument --memory-limit"),
    (["--target-store", "{tmp}", "--kernels", "torch"], "--kernels torch runs in-memory models only"),
    (["--memory-cap", "1GB", "--resident"], "--resident cannot be combined with --memory-cap"),
    (["--memory-cap", "1GB", "--modes", "lever"], "mode lever needs a draft model"),
    (["--memory-cap", "1GB", "--memory-limit", "2GB"], "--memory-limit 2,000.0 MB is above --memory-cap"),
])
def test_refused_before_anything_loads(argv, message, tmp_path, capsys):
    assert main(["bench", *[a.format(tmp=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


# -- --memory-cap ----------------------------------------------------------------



def capped(smollm2_path, lever_cache, out, cap):
    return main(["bench", "--target", str(smollm2_path), "--draft", "ngram", "--modes", "ar", "tree:4",
                 "--prompts", "1", "--new-tokens", "4", "--memory-cap", cap, "--cache-dir", str(lever_cache),
                 "--out", str(out), "--name", "capped", "--no-progress"])


@needs_cgroup
def test_memory_cap_every_mode_in_its_own_capped_process(smollm2_path, lever_cache, tmp_path, capsys):
    assert capped(smollm2_path, lever_cache, tmp_path, "1GB") == 0
    printed = capsys.readouterr().out
    data = json.loads((tmp_path / "capped.json").read_text())
    assert data["cap_bytes"] == 10**9 and data["cgroup_version"] in (1, 2)
    assert data["config"]["prompts"] == 1 and data["config"]["new_tokens"] == 4
    assert [r["mode"] for r in data["results"]] == ["ar", "tree:4"]
    for r in data["results"]:
        assert r["ok"] and r["error"] is None and r["tokens_per_s"] > 0 and r["mismatches"] == 0
        assert 0 < r["cgroup"]["peak_bytes"] <= 10**9 and not r["cgroup"]["oom_killed"]
        plan = r["memory"]["plan"]                      # each child planned its memory under the cap
        assert plan["memory_limit_bytes"] == 10**9 and r["memory"]["within_limit"]
        assert len(r["token_ids"]) == 1
    ar, tree = data["results"]
    assert tree["token_ids"] == ar["token_ids"] and ar["ratio_vs_ar"] == 1.0
    assert tree["aggregate"]["mismatches"] is None           # the child ran no ar of its own
    assert (tmp_path / "capped.png").read_bytes().startswith(PNG_MAGIC)
    assert "--memory-cap 1,000 MB" in printed and "cgroup v" in printed
    assert "page cache dropped before each mode" in printed
    rows = {line.split()[0]: line for line in printed.splitlines() if line.startswith(("ar ", "tree:4 "))}
    assert "(reference)" in rows["ar"] and rows["tree:4"].split()[-1] == "0" and " no " in rows["tree:4"]


@needs_cgroup
def test_memory_cap_too_small_reports_each_mode_and_fails(smollm2_path, lever_cache, tmp_path, capsys):
    assert capped(smollm2_path, lever_cache, tmp_path, "60MB") == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()[-1]
    assert err.startswith("lever: error: 2 of 2 modes failed under the 60.0 MB memory cap: ar (")
    data = json.loads((tmp_path / "capped.json").read_text())
    for r in data["results"]:
        assert not r["ok"] and r["error"] and r["tokens_per_s"] is None
        assert r["cgroup"]["oom_killed"] or r["cgroup"]["stderr_last_line"].startswith("lever: error:")
    assert captured.out.count("FAILED: ") == 2
