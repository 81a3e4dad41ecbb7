"""Draft ahead (lever.draft.ahead): the draft continues its own path past the
tree while the target verifies it, and the next tree reuses those rows.

1. Exactness: greedy output equals target-only decoding in modes chain,
   tree and lever; sampled output equals the same run without draft ahead
   (same seed).  The verifier is slowed down so that the ahead chain runs.
2. Reuse: with the draft = the target every path is accepted, so every tree
   after the first takes its expansions from the rows drafted ahead.
3. Bookkeeping: after every commit the draft cache holds the committed rows
   (bit for bit a fresh forward's) and, after a match, only the preloaded
   rows of the new root and the chain below it; every expansion (served from
   those rows or not) equals a fresh drafter's, reset on the committed tokens.
4. Over a flash-streamed target whose reads are rate-limited (a real I/O
   stall, no test hooks): exact, and the ahead drafting hides under the pass.
5. Prompt lookup never drafts ahead; a verifier error still reaches the caller.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from lever.autoregressive import generate_tokens
from lever.draft.ahead import MAX_FORWARDS
from lever.draft.base import TreeShape
from lever.draft.gain_cost import CostCurves, GainCostPolicy
from lever.draft.model_drafter import ModelDrafter
from lever.draft.ngram import NgramDrafter
from lever.engine import SpecConfig, run_speculative
from lever.errors import LeverError
from lever.masks import causal_mask
from lever.memory.plan import store_minimum
from lever.model.native_loader import load_gguf_native
from lever.model.streamed_decoder import StreamedDecoder
from lever.sampling import SamplingParams
from lever.store.convert import convert
from lever.store.manifest import StoreManifest
from lever.verify.target_pass import TargetVerifier
from tiny_model import write_tiny_gguf
from waiting import deadline

SIZES = dict(arch="llama", tied=False, matrix_type="F32", std=0.2, vocab=211, hidden=64, ff=128, heads=8,
             kv_heads=2, context=512)
NEW_TOKENS = 24
PROMPTS = [[5, 17, 99, 3], [42], [7, 7, 150, 33, 2, 90, 11, 64]]
SAMPLED = SamplingParams(temperature=0.8, seed=11)


def lever_spec() -> SpecConfig:
    """Mode lever with I/O-bound synthetic costs (trees of several levels pay off)."""
    costs = CostCurves.linear(0.05, 0.0005, 0.002, 0.0002, overhead_s=0.001)
    return SpecConfig("lever", policy=GainCostPolicy(costs, max_nodes=16, max_depth=5, topk=3, adapt=False))


SPECS = {
    "chain": lambda: SpecConfig("chain", draft_len=3),
    "tree": lambda: SpecConfig("tree", tree=TreeShape(budget=12, topk=3, depth=4)),
    "lever": lever_spec,
}


@pytest.fixture(scope="module")
def pair_files(tmp_path_factory):
    """(target, draft) GGUF paths: a random target and a noisy copy of it."""
    d = tmp_path_factory.mktemp("ahead")
    return (write_tiny_gguf(d / "target.gguf", seed=10, **SIZES),
            write_tiny_gguf(d / "draft.gguf", seed=10, noise=0.05, noise_seed=11, **SIZES))


@pytest.fixture(scope="module")
def pair(pair_files):
    """(target, draft) on the native decoder."""
    return tuple(load_gguf_native(path, "float32")[0] for path in pair_files)


class AheadDone:
    """Set once a tree's drafting ahead has run all its forwards."""

    def __init__(self, enabled: bool = True):
        self.event = threading.Event()
        self.calls = 0
        self.enabled = enabled        # False: the verifier does not wait (no draft ahead)


class CountingDrafter(ModelDrafter):
    """A model drafter that signals when the ahead chain of the current tree is complete."""

    def __init__(self, model, done: AheadDone):
        super().__init__(model)
        self.done = done

    def extend_ahead(self, tree, width, params=SamplingParams(), seed=None):
        ran = super().extend_ahead(tree, width, params, seed)
        self.done.calls += 1
        if not ran or self.done.calls == MAX_FORWARDS:
            self.done.event.set()
        return ran

    def commit(self, tree, accepted, next_token):
        super().commit(tree, accepted, next_token)
        self.done.calls = 0
        self.done.event.clear()


class WaitingVerifier:
    """A target verifier whose passes last until the drafter has drafted ahead
    all it may (a long I/O stall, made deterministic); waiting.deadline(10) s at most."""

    def __init__(self, target, params: SamplingParams, done: AheadDone):
        self.inner = TargetVerifier(target, params, capacity=512)
        self.done = done

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def verify(self, tree, draft_probs=None):
        if self.done.enabled:
            self.done.event.wait(timeout=deadline(10))
        return self.inner.verify(tree, draft_probs)


def run(target, draft, prompt, spec: SpecConfig, params: SamplingParams = SamplingParams(), drafter=None):
    """(token ids, stats) of a run whose verifications wait for the ahead chain."""
    drafter = drafter or CountingDrafter(draft, AheadDone())
    done = drafter.done if isinstance(drafter, CountingDrafter) else AheadDone()
    done.enabled = spec.draft_ahead and drafter.has_probabilities
    result, stats = run_speculative(WaitingVerifier(target, params, done), drafter, prompt, NEW_TOKENS, params, spec)
    return result.token_ids, stats


# --- 1. exactness ----------------------------------------------------------------

@pytest.mark.parametrize("mode", list(SPECS))
def test_greedy_is_target_only_decoding(pair, mode):
    target, draft = pair
    forwards = 0
    for prompt in PROMPTS:
        ref = generate_tokens(target, prompt, NEW_TOKENS).token_ids
        got, stats = run(target, draft, prompt, dataclasses.replace(SPECS[mode](), draft_ahead=True))
        assert got == ref, f"{mode} prompt {prompt}"
        forwards += stats.ahead.forwards
        assert stats.ahead.forwards == MAX_FORWARDS * stats.iterations
    assert forwards > 0


@pytest.mark.parametrize("mode", list(SPECS))
def test_sampling_equals_the_run_without_draft_ahead(pair, mode):
    target, draft = pair
    reused = 0
    for prompt in PROMPTS:
        off, _ = run(target, draft, prompt, SPECS[mode](), SAMPLED)
        on, stats = run(target, draft, prompt, dataclasses.replace(SPECS[mode](), draft_ahead=True), SAMPLED)
        assert on == off, f"{mode} prompt {prompt}"
        reused += stats.ahead.reused_nodes
    print(f"{mode} sampled: {reused} expansions reused")


# --- 2. reuse --------------------------------------------------------------------

@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", list(SPECS))
def test_reused_every_iteration_when_the_draft_is_the_target(pair, mode, params):
    """Every path is accepted and the next root is the draft's own choice, so
    each tree after the first takes its root and the chain below it from the
    rows drafted ahead: the chain's expansions cost no forward."""
    target, _ = pair
    spec = dataclasses.replace(SPECS[mode](), draft_ahead=True)
    got, stats = run(target, target, PROMPTS[0], spec, params)
    ref, _ = run(target, target, PROMPTS[0], SPECS[mode](), params)
    assert got == ref
    a = stats.ahead
    print(f"{mode}: {stats.iterations} iterations, {stats.to_json(len(got))['draft_ahead']}")
    # a tree with no draft node (the last iteration, when one token is left) has nothing to reuse
    assert a.reused_iterations == sum(1 for n in stats.tree_sizes[1:] if n > 0)
    assert a.reused_iterations >= stats.iterations - 2
    assert a.reused_nodes > a.reused_iterations            # deeper than the root
    assert 0.0 <= a.hidden_share <= 1.0 and a.drafting_s > 0


def test_stats_json(pair):
    target, draft = pair
    got, stats = run(target, draft, PROMPTS[0], dataclasses.replace(SPECS["chain"](), draft_ahead=True))
    j = stats.to_json(len(got))["draft_ahead"]
    assert set(j) == {"forwards", "nodes", "reused_iterations", "reused_nodes", "drafting_s", "overrun_s",
                      "hidden_share"}
    assert j["forwards"] == stats.ahead.forwards > 0 and j["nodes"] >= j["forwards"]
    _, off = run(target, draft, PROMPTS[0], SPECS["chain"]())
    assert off.ahead is None and "draft_ahead" not in off.to_json(NEW_TOKENS)


# --- 3. bookkeeping --------------------------------------------------------------

def fresh_kv(model, ids):
    cache = model.new_cache(capacity=len(ids))
    model(np.array(ids, dtype=np.int64), np.arange(len(ids)), causal_mask(len(ids), 0), cache)
    return [cache.layer_rows(layer) for layer in range(cache.n_layers)]


def assert_rows_equal_fresh(model, cache, start: int, ids: list[int], label: str):
    """Rows start..len(ids)-1 of `cache` are bit for bit those of a fresh causal pass over ids."""
    for layer, (k_ref, v_ref) in enumerate(fresh_kv(model, ids)):
        k, v = cache.layer_rows(layer)
        for name, got, ref in (("K", k, k_ref), ("V", v, v_ref)):
            assert np.array_equal(got[:, start:len(ids)], ref[:, start:len(ids)]), f"{label}: layer {layer} {name}"


class CheckedDrafter(CountingDrafter):
    """After each commit: the cache holds the committed rows (minus the pending
    ones) then only the preloaded rows, all as a fresh pass makes them.  Each
    expansion equals that of a fresh drafter reset on the committed tokens
    and given the same calls."""

    def __init__(self, model, done: AheadDone):
        super().__init__(model, done)
        self.committed: list[int] = []
        self.shadow: ModelDrafter | None = None
        self.matched = self.mismatched = self.compared = 0

    def reset(self, prompt_ids, capacity=None):
        super().reset(prompt_ids, capacity)
        self.committed = list(prompt_ids)

    def begin_tree(self):
        super().begin_tree()
        self.shadow = ModelDrafter(self.model)
        self.shadow.reset(self.committed)

    def expand(self, tree, nodes, topk, params=SamplingParams(), seed=None, with_probs=False):
        got = super().expand(tree, nodes, topk, params, seed, with_probs)
        ref = self.shadow.expand(tree, nodes, topk, params, seed, with_probs)
        assert np.array_equal(got.tokens, ref.tokens), f"expansion of {nodes}: {got.tokens} vs {ref.tokens}"
        np.testing.assert_allclose(got.logprobs, ref.logprobs, rtol=0, atol=1e-4)
        self.compared += len(nodes)
        return got

    def commit(self, tree, accepted, next_token):
        super().commit(tree, accepted, next_token)
        self.committed += [tree.token(j) for j in accepted] + [next_token]
        rows = self.committed[:-1]
        cached = len(rows) - self.catch_up_tokens
        preloaded = self.preloaded_paths
        assert self.cache.length == cached + len(preloaded)
        assert_rows_equal_fresh(self.model, self.cache, 0, rows[:cached], "committed rows")
        if preloaded:
            self.matched += 1
            assert self.catch_up_tokens == 0
            chain = list(preloaded[-1])                  # the new root, then the chain below it
            assert preloaded == [tuple(chain[:i]) for i in range(len(chain) + 1)]
            assert_rows_equal_fresh(self.model, self.cache, cached, rows + [next_token] + chain, "preloaded rows")
        else:
            self.mismatched += 1


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("mode", list(SPECS))
def test_draft_cache_after_match_and_mismatch(pair, mode, params):
    target, draft = pair
    matched = mismatched = 0
    for prompt in PROMPTS:
        drafter = CheckedDrafter(draft, AheadDone())
        got, stats = run(target, draft, prompt, dataclasses.replace(SPECS[mode](), draft_ahead=True), params,
                         drafter=drafter)
        assert len(got) == NEW_TOKENS and drafter.compared > 0
        matched += drafter.matched
        mismatched += drafter.mismatched
        assert drafter.reused_ahead == stats.ahead.reused_nodes
    print(f"{mode}: {matched} commits kept rows drafted ahead, {mismatched} did not")
    assert matched > 0 and mismatched > 0


@pytest.mark.real
def test_smollm2_drafting_for_itself_reuses_the_ahead_rows(smollm2_path):
    """A real model: greedy and sampled output unchanged, and most trees after
    the first start from the rows drafted ahead (the ahead chain extends the
    tree's likeliest path: an iteration whose accepted path ends elsewhere
    reuses nothing, which depends on the model's numbers, not on timing)."""
    model = load_gguf_native(smollm2_path, "float32")[0]
    prompt = [1, 504, 3458, 282, 4649, 314]
    spec = dataclasses.replace(SPECS["tree"](), draft_ahead=True)
    for params in (SamplingParams(), SAMPLED):
        ref, _ = run(model, model, prompt, SPECS["tree"](), params)
        got, stats = run(model, model, prompt, spec, params)
        assert got == ref
        assert stats.ahead.reused_iterations >= max(1, (stats.iterations - 1) * 2 // 3), stats.ahead
        assert stats.ahead.reused_nodes > stats.ahead.reused_iterations


# --- 4. a streamed target ------------------------------------------------------------

@pytest.mark.parametrize("mode", ["chain", "lever"])
def test_streamed_target_hides_the_ahead_drafting(pair, pair_files, tmp_path, mode):
    target, draft = pair
    store = convert(str(pair_files[0]), tmp_path / "store", progress=False)
    m = StoreManifest.load(store)
    budget = sum(store_minimum(m, dtype_bytes=4, kv_tokens=128).values())
    # a pass stalls ~50 ms on its reads: some 20 times the ahead drafting of a pass on an idle machine, so
    # that it still hides the drafting when the machine is loaded (hidden_share is a ratio of durations)
    rate = 2 * max(e.length for e in m.layers) / 0.05
    streamed = StreamedDecoder(store, budget, "float32", kv_tokens=128, max_read_bytes_per_s=rate)
    try:
        assert streamed.plan.streamed
        ref = generate_tokens(target, PROMPTS[2], NEW_TOKENS).token_ids
        verifier = TargetVerifier(streamed, SamplingParams(), capacity=128)
        result, stats = run_speculative(verifier, ModelDrafter(draft), PROMPTS[2], NEW_TOKENS, SamplingParams(),
                                        dataclasses.replace(SPECS[mode](), draft_ahead=True))
    finally:
        streamed.close()
    assert result.token_ids == ref
    a = stats.ahead
    print(f"streamed {mode}: {stats.iterations} passes, stall {stats.stall_s:.3f} s, {a.to_json()}")
    assert a.forwards >= stats.iterations and a.hidden_share > 0.5


# --- 5. the rest -----------------------------------------------------------------

def test_prompt_lookup_does_not_draft_ahead(pair):
    target, _ = pair
    prompt = [3, 4, 5, 6, 3, 4, 5]
    ref = generate_tokens(target, prompt, NEW_TOKENS).token_ids
    got, stats = run(target, None, prompt, dataclasses.replace(SPECS["chain"](), draft_ahead=True),
                     drafter=NgramDrafter())
    assert got == ref and stats.ahead is None


class FailingVerifier(WaitingVerifier):
    def verify(self, tree, draft_probs=None):
        if self.inner.calls == 2:
            raise LeverError("the verifier went away")
        return super().verify(tree, draft_probs)


def test_a_verifier_error_reaches_the_caller(pair):
    target, draft = pair
    done = AheadDone()
    verifier = FailingVerifier(target, SamplingParams(), done)
    spec = dataclasses.replace(SPECS["chain"](), draft_ahead=True)
    with pytest.raises(LeverError, match="went away") as e:
        run_speculative(verifier, CountingDrafter(draft, done), PROMPTS[0], NEW_TOKENS, SamplingParams(), spec)
    assert len(e.value.partial_result.token_ids) >= 2
