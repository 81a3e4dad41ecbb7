"""Early-exit pruning keeps speculative decoding exact (lever.probe.prune).

1. Greedy: with a probe pruning after an early layer, every drafting mode
   (chain, tree, lever) emits exactly target-only greedy decoding's tokens,
   on random-weight native pairs (tied and untied heads, F32 and Q8_0), and
   the probe really prunes (some nodes, never all of them).
2. Sampling: the position-keyed draws over pruned trees give target-only
   sampling's text draw for draw, and the joint distribution of the first
   tokens fits the exact (enumerated) target distribution in a chi-square test.
3. Deliberately broken pruning fails: committing the cache rows of the
   surviving subtree's indices instead of the original nodes' (a pruned
   node's unwritten KV kept) makes greedy output differ; dropping a node
   without its subtree is refused.
4. The pass hooks themselves: statistics, online recall, errors.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import lever.verify.target_pass as target_pass
from lever.autoregressive import generate_tokens
from lever.draft.base import TreeShape
from lever.draft.model_drafter import ModelDrafter
from lever.engine import SpecConfig, speculative_generate
from lever.errors import LeverError
from lever.probe.prune import ProbePruner
from lever.probe.store import ProbeModel
from lever.sampling import SamplingParams
from test_speculative import (N_SAMPLES, P_THRESHOLD, SAMPLE_PARAMS, SAMPLE_TOKENS, chi_square, exact_joint,
                              lever_spec, random_prompts)
from tiny_model import native_pair

NEW_TOKENS = 20
SIZES = dict(vocab=211, hidden=64, ff=128, heads=8, kv_heads=2, context=512, layers=4)
PAIRS = [("llama", False, "Q8_0", "float32", 0.2, 0.15), ("qwen2", True, "F32", "bfloat16", 0.2, 0.1)]
# a probe leaning on the draft's log-probability, with the lens terms in: prunes a
# node below roughly draft probability 0.2 unless the target's lens says otherwise
WEIGHTS = [0.0, 0.05, 0.05, 1.0, 0.0, 0.0]
THRESHOLD = float(np.log(0.2))


def modes() -> dict[str, SpecConfig]:
    """Fresh specs (mode lever's policy learns) of every drafting mode."""
    return {"chain4": SpecConfig("chain", draft_len=4),
            "tree16x4x6": SpecConfig("tree", tree=TreeShape(budget=16, topk=4, depth=6)),
            "lever": lever_spec()}


def pruner_for(target, layer: int = 1, weights=WEIGHTS, threshold=THRESHOLD) -> ProbePruner:
    return ProbePruner(ProbeModel(layer=layer, weights=np.asarray(weights), threshold=threshold, key="test"), target)


def with_pruner(spec: SpecConfig, pruner) -> SpecConfig:
    from dataclasses import replace
    return replace(spec, pruner=pruner)


@pytest.fixture(scope="module", params=PAIRS, ids=lambda p: f"{p[0]}-{'tied' if p[1] else 'untied'}-{p[2]}")
def pair(request, tmp_path_factory):
    arch, tied, mtype, dtype, std, noise = request.param
    return native_pair(tmp_path_factory.mktemp("probe-pair"), arch, tied, seed=5, noise=noise, dtype=dtype,
                       matrix_type=mtype, std=std, **SIZES)


def greedy_runs(target, draft, prompts, pruner):
    """{mode: [(tokens, stats) per prompt]} with `pruner` on every target pass."""
    out = {}
    for name, spec in modes().items():
        out[name] = [speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS,
                                          spec=with_pruner(spec, pruner)) for ids in prompts]
    return out


def test_greedy_with_probes_is_token_identical(pair):
    target, draft = pair
    prompts = random_prompts(target.config.vocab_size, 6, seed=3)
    refs = [generate_tokens(target, ids, NEW_TOKENS).token_ids for ids in prompts]
    for layer in (0, 2):
        pruner = pruner_for(target, layer=layer)
        for name, runs in greedy_runs(target, draft, prompts, pruner).items():
            for i, ((result, stats), ref) in enumerate(zip(runs, refs)):
                assert result.token_ids == ref, f"{name} layer {layer} prompt {i}"
                assert stats.probes is not None and stats.probes.passes == stats.iterations
        s = pruner.stats
        print(f"layer {layer}: {s.to_json()}")
        assert 0 < s.pruned < s.nodes, "the probe must prune some nodes but not all, or this test means little"
        assert s.row_layers_saved == s.pruned * (target.config.n_layers - 1 - layer)


def test_pruning_only_shortens_acceptance(pair):
    """Per prompt and mode, pruning never adds accepted tokens: a pruned node
    counts as rejected, nothing else changes (greedy, same trees in mode tree)."""
    target, draft = pair
    prompts = random_prompts(target.config.vocab_size, 4, seed=4)
    spec = SpecConfig("tree", tree=TreeShape(budget=16, topk=4, depth=6))
    for ids in prompts:
        _, free = speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS, spec=spec)
        pruner = pruner_for(target)
        _, pruned = speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS, spec=with_pruner(spec, pruner))
        assert pruned.iterations >= free.iterations
        assert pruner.stats.misses <= pruner.stats.pruned


def test_a_threshold_that_prunes_nothing_changes_nothing(pair):
    target, draft = pair
    ids = random_prompts(target.config.vocab_size, 1, seed=8)[0]
    spec = SpecConfig("tree", tree=TreeShape(budget=16, topk=4, depth=6))
    a, sa = speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS, spec=spec)
    pruner = pruner_for(target, threshold=-1e30)
    b, sb = speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS, spec=with_pruner(spec, pruner))
    assert a.token_ids == b.token_ids and sa.tree_sizes == sb.tree_sizes and sa.accepted == sb.accepted
    assert pruner.stats.pruned == 0 and pruner.stats.misses == 0 and pruner.stats.online_recall == 1.0


# --- 2. sampling ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def sample_pair(tmp_path_factory):
    """A 20-token-vocabulary 2-layer native pair (layer 0 can prune)."""
    return native_pair(tmp_path_factory.mktemp("probe-sample"), "llama", False, seed=137, noise=0.2,
                       vocab=20, hidden=32, ff=64, heads=4, kv_heads=2, layers=2, context=128, std=0.2)


SAMPLE_PROMPT = [15, 7, 1, 9, 15, 7]
SAMPLE_SPEC = SpecConfig("tree", tree=TreeShape(budget=6, topk=3, depth=2))


def test_sampling_with_probes_reproduces_plain_sampling(sample_pair):
    target, draft = sample_pair
    pruner = pruner_for(target, layer=0, threshold=float(np.log(0.3)))
    for seed in range(20):
        params = SamplingParams(seed=seed, **SAMPLE_PARAMS)
        ref = generate_tokens(target, SAMPLE_PROMPT, 8, params).token_ids
        got, _ = speculative_generate(target, ModelDrafter(draft), SAMPLE_PROMPT, 8, params,
                                      with_pruner(SAMPLE_SPEC, pruner))
        assert got.token_ids == ref, f"seed {seed}"
    assert 0 < pruner.stats.pruned < pruner.stats.nodes


def test_sampling_with_probes_matches_exact_target_distribution(sample_pair):
    target, draft = sample_pair
    exact = exact_joint(target, SAMPLE_PROMPT, SamplingParams(**SAMPLE_PARAMS), SAMPLE_TOKENS)
    pruner = pruner_for(target, layer=0, threshold=float(np.log(0.3)))
    spec = with_pruner(SAMPLE_SPEC, pruner)
    counts = Counter()
    for s in range(N_SAMPLES):
        result, _ = speculative_generate(target, ModelDrafter(draft), SAMPLE_PROMPT, SAMPLE_TOKENS,
                                         SamplingParams(seed=500_000 + s, **SAMPLE_PARAMS), spec)
        counts[tuple(result.token_ids)] += 1
    pvalue, stat, dof, impossible = chi_square(counts, exact, N_SAMPLES)
    print(f"sampling with probes: chi2 {stat:.1f} dof {dof} p-value {pvalue:.4f}; {pruner.stats.to_json()}")
    assert not impossible
    assert pvalue > P_THRESHOLD, f"chi2 {stat:.1f} with {dof} dof, p-value {pvalue:.2e}"
    assert pruner.stats.pruned > 0


# --- 3. broken pruning must fail -------------------------------------------------------

def test_committing_subtree_indices_keeps_pruned_kv_and_is_caught(pair, monkeypatch):
    """A verifier that walks the surviving subtree but compacts the cache by the
    subtree's own indices commits the rows of other (often pruned, so never
    written past the probe layer) nodes: the output must differ from target-only."""
    target, draft = pair
    prompts = random_prompts(target.config.vocab_size, 6, seed=3)
    refs = [generate_tokens(target, ids, NEW_TOKENS).token_ids for ids in prompts]
    real = target_pass.surviving_tree

    def broken(tree, survivors):
        sub, _ = real(tree, survivors)
        return sub, None                       # accepted ids not mapped back to the original nodes

    # prune every draft's first choice: the accepted path runs through later siblings,
    # whose subtree index is lower than their own
    first_choices = pruner_for(target, weights=[-0.5, 0, 0, 0, 1.0, 0], threshold=0.0)
    spec = with_pruner(SpecConfig("tree", tree=TreeShape(budget=16, topk=4, depth=6)), first_choices)
    ok = [speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS, spec=spec)[0].token_ids
          for ids in prompts]
    assert ok == refs and first_choices.stats.accepted > 0
    monkeypatch.setattr(target_pass, "surviving_tree", broken)
    try:
        got = [speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS, spec=spec)[0].token_ids
               for ids in prompts]
    except ValueError as e:                    # the cache refuses rows that are no path from the root
        assert "not a path from the root" in str(e)
    else:
        assert got != refs, "a verifier that commits pruned nodes' KV rows went undetected"


def test_dropping_a_node_but_not_its_subtree_is_refused(pair, monkeypatch):
    import lever.probe.prune as prune

    target, draft = pair

    class NoClosure:
        def __getattr__(self, name):
            return getattr(prune._native_module, name)

        @staticmethod
        def prune_closure(parents, keep_self):
            return np.asarray(keep_self, dtype=bool)       # children of a pruned node stay

    monkeypatch.setattr(prune, "_native_module", prune._native, raising=False)
    monkeypatch.setattr(prune, "_native", NoClosure())
    ids = random_prompts(target.config.vocab_size, 1, seed=3)[0]
    spec = with_pruner(SpecConfig("tree", tree=TreeShape(budget=16, topk=4, depth=6)), pruner_for(target))
    with pytest.raises(LeverError, match="not all their ancestors"):
        for seed in range(4):
            speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS, spec=spec)


# --- 4. hooks and errors ---------------------------------------------------------------

def test_probe_layer_must_leave_layers_to_prune(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="probe layer"):
        pruner_for(target, layer=target.config.n_layers - 1)


def test_leviathan_rule_refuses_a_pruner(pair):
    target, _ = pair
    with pytest.raises(LeverError, match="exact rule"):
        SpecConfig("chain", draft_len=2, rule="leviathan", pruner=pruner_for(target))


def test_logits_rows_and_a_pruning_hook_do_not_mix(pair):
    target, _ = pair
    cache = target.new_cache(8)
    with pytest.raises(ValueError, match="logits_rows"):
        target.forward(np.array([1, 2]), np.array([0, 1]), np.tril(np.ones((2, 2), dtype=bool)), cache,
                       logits_rows=[1], layer_hook=lambda i, x: None)


def test_online_recall_counts_a_pruned_node_the_walk_wanted(pair):
    """With a probe that prunes every draft node, every pass whose target token
    was drafted is a miss, and acceptance is that of ar."""
    target, draft = pair
    ids = random_prompts(target.config.vocab_size, 1, seed=3)[0]
    ref = generate_tokens(target, ids, NEW_TOKENS).token_ids
    pruner = pruner_for(target, threshold=1e30)
    result, stats = speculative_generate(target, ModelDrafter(draft), ids, NEW_TOKENS,
                                         spec=with_pruner(SpecConfig("chain", draft_len=4), pruner))
    assert result.token_ids == ref
    assert stats.accepted == 0 and pruner.stats.pruned == pruner.stats.nodes
    assert pruner.stats.misses > 0 and pruner.stats.online_recall == 0.0
