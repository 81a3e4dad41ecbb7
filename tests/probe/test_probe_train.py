"""Early-exit probes, the Python side (lever.probe): features, traces, training,
evaluation, the probe file and `lever probe`.

1. Features: sibling ranks, lens margins, the lens score (numpy reference).
2. Training and evaluation on synthetic traces where the lens truly separates
   accepted-able nodes: the probe prunes more rejected nodes than the
   draft-only baseline at 99% recall; the threshold / recall arithmetic; the
   walk and the cost under pruning.
3. The probe file: round trip; corrupt, another version, another target's
   key -> one warning line and None; missing -> None silently; the key of a
   store and of a GGUF.
4. The recorder over a toy native target: the labels agree with the target
   (plain greedy decoding, fresh forwards), the recorded hidden states are the
   decoder's layer outputs, the lens is the numpy reference's.
5. `lever probe` errors and a train / report round trip.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lever.autoregressive import generate_tokens
from lever.cli import main
from lever.draft.base import TreeShape
from lever.draft.gain_cost import CostCurves, GainCostPolicy
from lever.draft.model_drafter import ModelDrafter
from lever.draft.policies import StaticTreePolicy
from lever.engine import SpecConfig
from lever.masks import causal_mask
from lever.model.native_loader import load_gguf_native
from lever.probe.evaluate import (LinearCost, TreeSet, evaluate, format_table, pruned_fraction, recall_at,
                                  relative_speed, threshold_at_recall)
from lever.probe.features import (FEATURES, group_margin, head_rows, lens_scores, node_features, rms_norm,
                                  sibling_ranks)
from lever.probe.store import ProbeModel, load_probe, probe_key_for, probe_path, save_probe
from lever.probe.traces import (META, NODE_FIELDS, POLICIES, TRACE_FORMAT, TRACE_VERSION, TREE_FIELDS,
                                default_layers, load_traces, record_traces, recorder_for)
from lever.probe.train import BASELINE, fit_logistic, split_prompts, train_scorers
from lever.sampling import SamplingParams
from lever.tree import TokenTree
from lever.verify.target_pass import TargetVerifier
from tiny_model import write_tiny_gguf

SIZES = dict(vocab=211, hidden=64, ff=128, heads=8, kv_heads=2, context=512)
KEY = "ab" * 32


# -- 1. features --------------------------------------------------------------------------

def small_tree() -> TokenTree:
    """root 0 -> 1 (-0.5), 2 (-1.0), 3 (-0.5); 1 -> 4 (-2.0), 5 (-0.1); 4 -> 6."""
    t = TokenTree(10)
    for parent, tok, lp in [(0, 11, -0.5), (0, 12, -1.0), (0, 13, -0.5), (1, 14, -2.0), (1, 15, -0.1), (4, 16, -0.3)]:
        t.add(parent, tok, lp)
    return t


def test_sibling_ranks_and_node_features():
    t = small_tree()
    assert sibling_ranks(t).tolist() == [0, 0, 2, 1, 1, 0, 0]      # ties to the lower index (1 before 3)
    lens = np.array([1.0, 3.0, 2.0, -1.0, 0.5, 7.0])
    f = node_features(t, lens)
    assert f.shape == (6, len(FEATURES)) and f.dtype == np.float64
    assert f[:, 0].tolist() == lens.tolist()
    assert f[:, 1].tolist() == [-2.0, 0.0, -1.0, -1.5, 0.0, 0.0]   # minus the best lens among siblings
    assert np.allclose(f[:, 2], [-0.5, -1.0, -0.5, -2.0, -0.1, -0.3])
    assert f[:, 3].tolist() == [0, 2, 1, 1, 0, 0]
    assert f[:, 4].tolist() == [1, 1, 1, 2, 2, 3]
    assert group_margin(np.array([]), np.array([], dtype=np.int64)).size == 0
    with pytest.raises(ValueError):
        node_features(t, lens[:3])


def test_lens_scores_is_normed_dot():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((5, 32)).astype(np.float32)
    rows = rng.standard_normal((5, 32)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)
    want = [np.dot(h[i] / np.sqrt(np.mean(h[i].astype(np.float64) ** 2) + 1e-6) * w, rows[i]) for i in range(5)]
    got = lens_scores(h, rows, w, 1e-6)
    assert got.dtype == np.float32 and np.allclose(got, want, rtol=1e-5)
    assert np.allclose(rms_norm(h, np.ones(32), 0.0).astype(np.float64).var(axis=1)
                       + rms_norm(h, np.ones(32), 0.0).mean(axis=1) ** 2, 1.0, rtol=1e-5)


# -- 2. training and evaluation on synthetic traces ---------------------------------------

def synthetic_tree(rng, tree_id: int, prompt: int, policy: int, separate: float):
    """One random tree's node fields: match drawn from the draft probability and a
    lens at slot 1 that carries the label (slot 0: noise)."""
    parents = [0]
    for j in range(1, 16):
        parents.append(int(rng.integers(0, j)) if j > 3 else 0)
    parents = np.array(parents[1:])
    depth = np.zeros(16, dtype=int)
    for j, p in enumerate(parents, start=1):
        depth[j] = depth[p] + 1
    logp = np.log(rng.uniform(0.05, 0.95, 15))
    match = rng.uniform(size=15) < 0.25 + 0.3 * np.exp(logp)
    # the accepted path: from the root, the lowest matching child, while any
    on_path, node = np.zeros(16, dtype=bool), 0
    while True:
        kids = [j for j in range(1, 16) if parents[j - 1] == node and match[j - 1]]
        if not kids:
            break
        node = kids[0]
        on_path[node] = True
    lens = np.stack([rng.standard_normal(15), separate * (2 * match - 1) + rng.standard_normal(15)], axis=1)
    ranks = np.zeros(15, dtype=int)
    for j in range(15):
        ranks[j] = sum(1 for k in range(15) if parents[k] == parents[j] and (logp[k] > logp[j] or
                                                                             (logp[k] == logp[j] and k < j)))
    return {"tree": np.full(15, tree_id), "prompt": np.full(15, prompt), "policy": np.full(15, policy),
            "node": np.arange(1, 16), "parent": parents, "token": rng.integers(0, 100, 15),
            "draft_logp": logp.astype(np.float32), "rank": ranks, "depth": depth[1:], "match": match,
            "accepted": on_path[1:], "hrow": np.zeros(15, dtype=int), "lens": lens.astype(np.float32)}


def write_synthetic_traces(d, n_prompts: int = 8, trees: int = 30, separate: float = 3.0, seed: int = 0,
                           key: str = KEY):
    """A trace directory as `lever probe record` writes it, from synthetic_tree."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    meta = {"format": TRACE_FORMAT, "version": TRACE_VERSION, "key": key, "target": "toy", "draft": "toy-draft",
            "n_layers": 8, "hidden_size": 4, "layers": [1, 4], "corpus": "synthetic", "new_tokens": 0,
            "policies": {}, "profile": None, "prompts": [], "complete": True}
    for p in range(n_prompts):
        nodes, tree_rows = [], []
        for t in range(trees):
            policy = t % 2
            tr = synthetic_tree(rng, t, p, policy, separate)
            nodes.append(tr)
            tree_rows.append((p, policy, 15, int(tr["accepted"].sum()), 0.002, 0.01 + 0.0005 * 16))
        shard = {f: np.concatenate([n[f] for n in nodes]) for f in NODE_FIELDS}
        shard["hidden"] = np.zeros((1, 2, 4), dtype=np.float16)
        for f, col in zip(TREE_FIELDS, zip(*tree_rows)):
            shard[f] = np.asarray(col)
        np.savez(d / f"prompt-{p:03d}.npz", **shard)
        meta["prompts"].append({"index": p, "id": f"p{p}", "category": "code", "shard": f"prompt-{p:03d}.npz",
                                "trees": trees, "nodes": 15 * trees, "tokens": 0})
    (d / META).write_text(json.dumps(meta))
    return d


def test_probe_beats_baseline_when_the_lens_separates(tmp_path):
    traces = load_traces(write_synthetic_traces(tmp_path / "tr"))
    held = split_prompts(traces.nodes["prompt"])
    assert set(np.unique(traces.nodes["prompt"][held])) == {3, 7}
    scorers = train_scorers(traces, ~held)
    assert [s.name for s in scorers] == [BASELINE, "layer 1", "layer 4"]
    report = evaluate(traces, scorers, held, LinearCost(0.001, 0.001, 8), min_recall=0.99)
    table = {(r["scorer"], r["subset"]): r for r in report["table"]}
    for subset in ("all", "lever"):
        probe, base, noise = (table[(name, subset)]["pruned@0.99"] for name in ("layer 4", BASELINE, "layer 1"))
        assert probe > base + 0.2, (probe, base)
        assert noise < probe
    assert report["chosen"] == "layer 4"
    best = report["scorers"]["layer 4"]["best"]
    assert best["speed"] >= 1.0 and best["rows_pruned_per_pass"] > 0
    assert report["scorers"]["layer 4"]["default"]["train_recall"] >= 0.99
    text = format_table(report)
    assert "layer 4" in text and "@99%" in text


def test_fit_logistic_raw_space():
    rng = np.random.default_rng(1)
    x = np.c_[rng.normal(5, 3, 4000), rng.normal(-2, 0.5, 4000), np.full(4000, 7.0)]
    logit = 0.5 + 0.8 * (x[:, 0] - 5) - 2.0 * (x[:, 1] + 2)
    y = rng.uniform(size=4000) < 1 / (1 + np.exp(-logit))
    w = fit_logistic(x, y, l2=1e-6)
    assert w.shape == (4,) and w[3] == 0.0                     # a constant column gets no weight
    assert np.allclose(w[1:3], [0.8, -2.0], rtol=0.15)
    pred = w[0] + x @ w[1:]
    assert np.corrcoef(pred, logit)[0, 1] > 0.99


def test_threshold_and_recall_math():
    logits = np.array([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    pos = np.array([1, 1, 0, 1, 0, 1, 0, 0], dtype=bool)
    assert threshold_at_recall(logits, pos, 1.0) == 0.0
    assert threshold_at_recall(logits, pos, 0.75) == 2.0
    assert threshold_at_recall(logits, pos, 0.5) == 4.0
    assert threshold_at_recall(logits, np.zeros(8, dtype=bool), 0.99) == -np.inf
    assert recall_at(logits, pos, 2.0) == 0.75
    assert pruned_fraction(logits, pos, 2.0) == 0.75              # 1, -1, -2 of the rejected 3, 1, -1, -2
    assert pruned_fraction(logits, pos, -np.inf) == 0.0


def test_walk_and_cost_under_pruning(tmp_path):
    """One tree: root -> 1 (accepted) -> 2 (accepted); root -> 3 -> 4 (rejected)."""
    trees = TreeSet(tree=np.zeros(4, dtype=np.int64), parent_row=np.array([-1, 0, -1, 2]),
                    depth=np.array([1, 2, 1, 2]), accepted=np.array([1, 1, 0, 0], dtype=bool),
                    n_nodes=np.array([4]), draft_s=np.array([0.0]))
    keep = trees.closure(np.array([1, 1, 0, 1], dtype=bool))       # 4 goes with its parent 3
    assert keep.tolist() == [True, True, False, False]
    tokens, rows = trees.walk(keep)
    assert tokens.tolist() == [3] and rows.tolist() == [3]
    cost = LinearCost(0.0, 1.0, n_layers=3)                       # seconds = rows, split over 3 layers + head
    r = relative_speed(trees, np.array([1, 1, 0, 1], dtype=bool), layer=0, cost=cost)
    # unpruned: 5 rows everywhere = 5 s; pruned after layer 0: (5 + 3 * 3) / 4 = 3.5 s; 3 tokens both
    assert r["relative_tokens_per_s"] == pytest.approx(5 / 3.5)
    assert r["rows_pruned_per_pass"] == 2 and r["tokens_lost_per_pass"] == 0
    lost = relative_speed(trees, np.array([1, 0, 1, 1], dtype=bool), layer=2, cost=cost)
    assert lost["tokens_lost_per_pass"] == 1


# -- 3. the probe file -------------------------------------------------------------------------

def a_probe(key: str = KEY) -> ProbeModel:
    return ProbeModel(layer=9, weights=np.array([0.5, 1.0, 2.0, 0.3, -0.2, -0.1]), threshold=-1.25, key=key,
                      target="qwen15", recall=0.991, metrics={"pruned": 0.4, "curve": [1, 2]})


def test_probe_round_trip(tmp_path):
    p = a_probe()
    path = save_probe(p, tmp_path)
    assert path == probe_path(KEY, tmp_path) == tmp_path / "probes" / f"probe-{KEY[:16]}.json"
    q = load_probe(KEY, tmp_path)
    assert q.layer == 9 and q.threshold == -1.25 and q.key == KEY and q.target == "qwen15"
    assert np.array_equal(q.weights, p.weights) and q.recall == 0.991 and q.metrics == p.metrics
    x = np.array([[1.0, 0.0, -0.5, 1, 2], [-3.0, -1.0, -2.0, 3, 5]])
    assert np.allclose(q.logits(x), p.weights[0] + x @ p.weights[1:])
    assert q.keep(x).tolist() == [True, False]


def _one_warning(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lever: warning:") and "lever probe train" in err[0], err
    return err[0]


def test_probe_missing_corrupt_stale(tmp_path, capsys):
    assert load_probe(KEY, tmp_path) is None
    assert capsys.readouterr().err == ""
    path = save_probe(a_probe(), tmp_path)
    good = json.loads(path.read_text())

    path.write_text("{not json")
    assert load_probe(KEY, tmp_path) is None
    _one_warning(capsys)

    edited = dict(good, threshold=-5.0)                            # content changed, checksum not
    path.write_text(json.dumps(edited))
    assert load_probe(KEY, tmp_path) is None
    assert "checksum" in _one_warning(capsys)

    other = a_probe()
    other_json = other.to_json()
    other_json["version"] = 99
    path.write_text(json.dumps(other_json))
    assert load_probe(KEY, tmp_path) is None
    assert "version" in _one_warning(capsys)

    stale_key = KEY[:16] + "cd" * 24                               # same file name, another target
    save_probe(a_probe(stale_key), tmp_path)
    assert load_probe(KEY, tmp_path) is None
    assert "another target" in _one_warning(capsys)


# -- 4. the recorder over a toy native target --------------------------------------------------

@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(target path, target, draft): a random untied Q8_0 target and a noisy copy as its draft."""
    d = tmp_path_factory.mktemp("probe-toy")
    common = dict(arch="llama", tied=False, seed=10, matrix_type="Q8_0", std=0.2, **SIZES)
    tpath = write_tiny_gguf(d / "target.gguf", **common)
    dpath = write_tiny_gguf(d / "draft.gguf", noise=0.15, noise_seed=11, **common)
    return tpath, load_gguf_native(tpath, "float32")[0], load_gguf_native(dpath, "float32")[0]


def toy_lever_spec() -> SpecConfig:
    costs = CostCurves.linear(0.05, 0.0005, 0.002, 0.0002, overhead_s=0.001)
    return SpecConfig("lever", policy=GainCostPolicy(costs, max_nodes=24, max_depth=6, topk=4, adapt=False))


def fresh(target, ids, layer):
    """(argmax of the last row, hidden state after `layer` of the last row) of a fresh forward over ids."""
    seen = {}

    def hook(i, x):
        if i == layer:
            seen["h"] = x[-1].copy()
        return None

    t = len(ids)
    logits = target(np.array(ids, dtype=np.int64), np.arange(t), causal_mask(t, 0), target.new_cache(t),
                    layer_hook=hook)
    return int(np.argmax(logits[-1])), seen["h"]


def test_recorder_labels_and_hidden_states(toy):
    _, target, draft = toy
    layers = [0, 1]
    rec = recorder_for(target, layers)
    prompt = [3, 17, 42, 8, 99, 5]
    verifier = TargetVerifier(target, SamplingParams(), capacity=64, pass_hook=rec)
    verifier.start(prompt)
    drafter = ModelDrafter(draft)
    drafter.reset(prompt, capacity=64)
    rec.start(0, "tree")
    tree = StaticTreePolicy(TreeShape(budget=12, topk=3, depth=4)).grow(drafter, prompt[-1]).tree
    verdict = verifier.verify(tree)
    shard = rec.take(target.config.hidden_size)
    n = len(tree)
    assert shard["node"].tolist() == list(range(1, n)) and shard["tree_nodes"].tolist() == [n - 1]
    assert shard["tree_accepted"].tolist() == [len(verdict.accepted)]
    assert np.flatnonzero(shard["accepted"]).tolist() == [j - 1 for j in verdict.accepted]
    assert shard["hidden"].dtype == np.float16 and shard["hidden"].shape[1:] == (2, target.config.hidden_size)
    rows = head_rows(target.weights, shard["token"])
    for r in range(n - 1):
        j, p = r + 1, int(shard["parent"][r])
        path = prompt + [tree.token(k) for k in tree.path(p)[1:]] if p else prompt
        for slot, layer in enumerate(layers):
            argmax, h = fresh(target, path, layer)
            assert np.allclose(shard["hidden"][shard["hrow"][r], slot], h, rtol=2e-3, atol=2e-3)
            want = lens_scores(h[None], rows[r:r + 1], target.weights.norm, target.config.rms_norm_eps)[0]
            assert shard["lens"][r, slot] == pytest.approx(want, rel=1e-3, abs=1e-3)
        assert bool(shard["match"][r]) == (argmax == tree.token(j)), f"node {j}"
    assert shard["rank"].tolist() == sibling_ranks(tree)[1:].tolist()
    assert shard["depth"].tolist() == list(tree.depths()[1:])


def test_record_traces_matches_greedy(toy, tmp_path):
    tpath, target, draft = toy
    prompts = [{"id": f"p{i}", "category": "code", "ids": [3 + i, 17, 42, 8, 99 - i, 5]} for i in range(3)]
    specs = {"tree": SpecConfig("tree", tree=TreeShape(budget=16, topk=4, depth=5)), "lever": toy_lever_spec()}
    meta = record_traces(target, ModelDrafter(draft), prompts, tmp_path / "tr", layers=[1, 0], new_tokens=24,
                         specs=specs, key=probe_key_for(target, tpath), target_name="toy", progress=False)
    assert meta["complete"] and meta["layers"] == [0, 1] and len(meta["prompts"]) == 3
    traces = load_traces(tmp_path / "tr")
    n, t = traces.nodes, traces.trees
    assert set(np.unique(n["policy"]).tolist()) == {0, 1} and set(POLICIES) == {"tree", "lever"}
    assert n["node"].size == t["tree_nodes"].sum()
    assert np.all(n["match"][n["accepted"]])                           # accepted => match
    acc = np.bincount(n["tree"], weights=n["accepted"], minlength=t["tree_nodes"].size)
    assert acc.astype(int).tolist() == t["tree_accepted"].tolist()
    for i, p in enumerate(prompts):       # tokens per run = accepted + one per pass = 24 (no stop ids)
        for code in (0, 1):
            trees = (t["tree_prompt"] == i) & (t["tree_policy"] == code)
            emitted = int(t["tree_accepted"][trees].sum() + trees.sum())
            assert emitted >= 24 and emitted - int(t["tree_accepted"][trees][-1]) - 1 < 24
        # the accepted path's tokens are target-only greedy decoding
        ref = generate_tokens(target, p["ids"], 24).token_ids
        sel = (n["prompt"] == i) & (n["policy"] == 0)
        got, trees_i = [], np.flatnonzero((t["tree_prompt"] == i) & (t["tree_policy"] == 0))
        for tree_id in trees_i:
            on = sel & (n["tree"] == tree_id) & n["accepted"]
            got += n["token"][on].tolist() + [None]             # None: the target's own token
        assert [g for g, r in zip(got, ref) if g is not None] == [r for g, r in zip(got, ref) if g is not None]
    assert traces.hidden(meta["prompts"][0]["shard"]).shape[1:] == (2, target.config.hidden_size)
    lean = record_traces(target, ModelDrafter(draft), prompts[:1], tmp_path / "lean", layers=[0], new_tokens=8,
                         specs={"tree": specs["tree"]}, key="k", target_name="toy", progress=False, keep_hidden=False)
    lean_traces = load_traces(tmp_path / "lean")
    assert not lean["hidden"] and lean_traces.hidden(lean["prompts"][0]["shard"]).shape[0] == 0
    assert np.all(lean_traces.nodes["hrow"] == -1) and lean_traces.nodes["lens"].shape[1] == 1


def test_default_layers_and_store_key(toy, tmp_path):
    from lever.store.convert import convert
    from lever.model.streamed_decoder import StreamedDecoder

    assert default_layers(28) == [7, 9, 14, 21] and default_layers(2) == [0] and default_layers(1) == [0]
    tpath, target, _ = toy
    key = probe_key_for(target, tpath)
    assert len(key) == 64 and key == probe_key_for(target, tpath)
    store = convert(str(tpath), tmp_path / "store", progress=False)
    manifest_sha = json.loads((store / "manifest.json").read_text())["manifest_sha256"]
    streamed = StreamedDecoder(store, 64 << 20, "float32", kv_tokens=64)
    try:
        assert probe_key_for(streamed) == manifest_sha == probe_key_for(target, store)
        ids = np.array([5, 9, 200])
        assert np.array_equal(head_rows(streamed.weights, ids), head_rows(target.weights, ids))
    finally:
        streamed.close()
    with pytest.raises(Exception, match="target_id"):
        probe_key_for(target)


# -- 5. the command ----------------------------------------------------------------------------

def test_cli_train_and_report(tmp_path, capsys):
    d = write_synthetic_traces(tmp_path / "tr", n_prompts=4, trees=16)
    cache = tmp_path / "cache"
    assert main(["probe", "train", "--traces", str(d), "--cache-dir", str(cache), "--no-plot"]) == 0
    out = capsys.readouterr().out
    assert "layer 4" in out and "probe:" in out
    probe = load_probe(KEY, cache)
    assert probe is not None and probe.layer in (1, 4) and probe.key == KEY
    report = json.loads((d / "report.json").read_text())
    assert report["probe_path"] == str(probe_path(KEY, cache))
    assert main(["probe", "report", "--traces", str(d)]) == 0
    assert "layer 4" in capsys.readouterr().out


def test_cli_plot(tmp_path, capsys):
    d = write_synthetic_traces(tmp_path / "tr", n_prompts=4, trees=6)
    assert main(["probe", "train", "--traces", str(d), "--cache-dir", str(tmp_path / "c")]) == 0
    png = (d / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["probe", "train", "--traces", "{d}/none"], "no such trace directory"),
    (["probe", "train", "--traces", "{d}"], "meta.json is missing"),
    (["probe", "report", "--traces", "{d}/none"], "no such trace directory"),
    (["probe", "record", "--draft", "ngram", "--out", "{d}/o"], "needs a draft model"),
    (["probe", "record", "--draft", "x", "--out", "{d}/o", "--layers", "a,b"], "expected layer numbers"),
    (["probe", "train", "--traces", "{d}", "--recall", "2"], "expected a recall"),
    (["probe"], "required"),
])
def test_cli_errors(tmp_path, capsys, argv, message):
    assert main([a.replace("{d}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lever: error:") and message in err[0], err


def test_cli_damaged_traces(tmp_path, capsys):
    d = write_synthetic_traces(tmp_path / "tr", n_prompts=3, trees=4)
    (d / "prompt-001.npz").write_bytes(b"garbage")
    assert main(["probe", "train", "--traces", str(d), "--no-plot"]) == 2
    assert "cannot read the shard" in capsys.readouterr().err
    (d / META).write_text(json.dumps({"format": TRACE_FORMAT, "version": 7}))
    assert main(["probe", "train", "--traces", str(d)]) == 2
    assert "version 7" in capsys.readouterr().err
    write_synthetic_traces(tmp_path / "tr2", n_prompts=3, trees=4)
    assert main(["probe", "report", "--traces", str(tmp_path / "tr2")]) == 2
    assert "no report.json yet" in capsys.readouterr().err


def test_store_verdict():
    from lever.commands.probe import store_verdict

    def report(threshold, speed):
        return {"chosen": "layer 9", "scorers": {"layer 9": {"default": {"threshold": threshold, "speed": speed}}}}

    assert store_verdict(report(-1.0, 1.1), "gain") is None
    assert "prunes nothing" in store_verdict(report(None, 1.0), "gain")
    assert "does not beat" in store_verdict(report(-1.0, 0.99), "gain")
    assert store_verdict(report(None, 1.0), "always") is None
    assert store_verdict({"chosen": None}, "always") is not None
