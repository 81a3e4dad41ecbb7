"""Same seed, same text, in every mode; long runs in every mode.

1. Sampling is keyed by position (lever.sampling.sample_at): for one seed,
   modes ar, chain (model and prompt-lookup drafts), tree and lever emit
   exactly the tokens of plain sampling, on 30 prompts, with drafts that are
   really accepted; another seed changes the text.  A divergence is allowed
   only at a measured near-tie of the Gumbel-max scores (the tree pass and
   the one-token pass may round a logit differently).
2. 2,000 new tokens in every mode, greedy and sampled: the KV caches are
   sized for the whole run up front and the output equals plain decoding's.

The models are a native random pair (tests/tiny_model.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from lever.autoregressive import generate_tokens
from lever.draft.base import TreeShape
from lever.draft.model_drafter import ModelDrafter
from lever.draft.ngram import NgramDrafter
from lever.draft.policies import StaticTreePolicy
from lever.engine import SpecConfig, speculative_generate
from lever.sampling import SamplingParams, position_noise, processed_logits
from test_speculative import NATIVE_SIZES, check_greedy, full_logits, lever_spec, random_prompts
from tiny_model import native_pair

SCORE_TIE = 1e-3        # a sampled divergence is accepted only below this Gumbel-max score gap

MODES = {
    "chain-model": (SpecConfig("chain", draft_len=4), "model"),
    "chain-ngram": (SpecConfig("chain", draft_len=4), "ngram"),
    "tree-model": (SpecConfig("tree", tree=TreeShape(budget=12, topk=3, depth=4)), "model"),
    "tree-ngram": (SpecConfig("tree", tree=TreeShape(budget=12, topk=3, depth=4)), "ngram"),
    "lever": (lever_spec(max_nodes=12, max_depth=4), "model"),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A native random Llama target (context 2,560) and a noisy copy of it as the draft."""
    sizes = {**NATIVE_SIZES, "context": 2560}
    return native_pair(tmp_path_factory.mktemp("seeded"), "llama", False, seed=21, noise=0.15, std=0.08,
                       matrix_type="Q8_0", **sizes)


def make_drafter(kind, draft):
    return ModelDrafter(draft) if kind == "model" else NgramDrafter()


def check_sampled(target, prompt, got, ref, params, seed, label):
    """`got` must equal `ref` (plain sampling), up to a divergence at a near-tie
    of the Gumbel-max scores of a fresh full forward."""
    for i, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            row = full_logits(target, prompt + ref[:i])[-1]
            scores = processed_logits(row, params).astype(np.float64) + position_noise(seed, len(prompt) + i,
                                                                                       row.shape[-1])
            gap = abs(float(scores[a] - scores[b]))
            assert gap < SCORE_TIE, f"{label}: token {i}: {a} vs plain {b}, score gap {gap:.2e} is not a tie"
            return
    assert len(got) == len(ref), f"{label}: {len(got)} tokens vs plain {len(ref)}"


@pytest.mark.parametrize("mode", list(MODES))
def test_same_seed_same_text_in_every_mode(pair, mode):
    target, draft = pair
    spec, kind = MODES[mode]
    accepted = 0
    for i, prompt in enumerate(random_prompts(target.config.vocab_size, 30, seed=5)):
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=1000 + i)
        ref = generate_tokens(target, prompt, 12, params)
        result, stats = speculative_generate(target, make_drafter(kind, draft), prompt, 12, params, spec)
        assert result.seed == ref.seed == params.seed
        check_sampled(target, prompt, result.token_ids, ref.token_ids, params, params.seed, f"{mode} prompt {i}")
        accepted += stats.accepted
    print(f"{mode}: {accepted} draft tokens accepted over 30 prompts")
    if kind == "model":     # prompt lookup rarely guesses this random model's samples
        assert accepted > 0, f"{mode}: no draft token was ever accepted, so the test shows nothing"


def test_another_seed_changes_the_text(pair):
    target, _ = pair
    prompt = [3, 1, 4, 1, 5]
    texts = {tuple(generate_tokens(target, prompt, 16, SamplingParams(temperature=1.0, seed=s)).token_ids)
             for s in range(5)}
    assert len(texts) == 5


def test_unseeded_runs_report_their_seed(pair):
    """Without a seed a random one is drawn and reported; reusing it reproduces the text."""
    target, draft = pair
    prompt = [7, 7, 2, 9]
    first, _ = speculative_generate(target, ModelDrafter(draft), prompt, 12, SamplingParams(temperature=0.9),
                                    SpecConfig("chain", draft_len=3))
    again = generate_tokens(target, prompt, 12, SamplingParams(temperature=0.9, seed=first.seed))
    assert first.seed is not None and first.token_ids == again.token_ids


LONG = 2000


@pytest.fixture(scope="module")
def long_references(pair):
    target, _ = pair
    prompt = [11, 12, 13, 14, 15, 11, 12]
    greedy = generate_tokens(target, prompt, LONG, SamplingParams()).token_ids
    sampled = generate_tokens(target, prompt, LONG, SamplingParams(temperature=0.9, seed=4)).token_ids
    assert len(greedy) == len(sampled) == LONG
    return prompt, greedy, sampled


class CacheLog:
    """A model that remembers every KV cache it makes, with the capacity it was made with."""

    def __init__(self, model):
        self.model, self.made = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def new_cache(self, capacity=256):
        cache = self.model.new_cache(capacity)
        self.made.append((cache, cache.capacity))
        return cache

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def grown(self) -> list[tuple[int, int, int]]:
        """(rows made with, rows now, rows used) of every cache that grew or is over-full."""
        return [(rows, c.capacity, c.length) for c, rows in self.made if c.capacity != rows or c.length > rows]


@pytest.mark.parametrize("mode", ["ar", *MODES])
def test_2000_tokens_in_every_mode(pair, long_references, mode):
    """No cache grows during a forward: every KV cache the run makes is
    allocated once, at a size that holds the whole run."""
    target, draft = pair
    prompt, greedy, sampled = long_references
    spec, kind = MODES.get(mode, (SpecConfig("ar"), None))
    logged = CacheLog(target), CacheLog(draft)
    for params, ref in ((SamplingParams(), greedy), (SamplingParams(temperature=0.9, seed=4), sampled)):
        drafter = make_drafter(kind, logged[1]) if kind else None
        result, _ = speculative_generate(logged[0], drafter, prompt, LONG, params, spec)
        assert len(result.token_ids) == LONG
        if params.greedy:
            check_greedy(target, prompt, result.token_ids, ref, f"{mode} greedy", [])
        else:
            check_sampled(target, prompt, result.token_ids, ref, params, 4, f"{mode} sampled")
    assert len(logged[0].made) == 2 and len(logged[1].made) == (2 if kind == "model" else 0)
    grown = logged[0].grown() + logged[1].grown()
    assert not grown, f"{mode}: KV caches grew mid-run (rows made with, rows now, rows used): {grown}"


def test_a_cache_grown_inside_a_forward_stays_usable(pair):
    """The audit's crash: a drafter cache sized too small grows inside the
    (inference-mode) forward, and compaction afterwards must still work."""
    _, draft = pair
    drafter = ModelDrafter(draft)
    prompt = [1, 2, 3, 4]
    drafter.reset(prompt, capacity=4)
    root = prompt[-1]
    policy = StaticTreePolicy(TreeShape(budget=4, topk=2, depth=2))
    for _ in range(6):
        tree = policy.grow(drafter, root).tree
        drafter.commit(tree, [1] if len(tree) > 1 else [], 5)      # compaction outside inference mode
        root = 5
    assert drafter.cache.capacity > 4


class UncoupledDrafter(ModelDrafter):
    """Drafts by draft probability alone, ignoring the target's noise: its
    children are the draft's top tokens (rank 0 its argmax)."""

    def expand(self, tree, nodes, topk, params=SamplingParams(), seed=None, with_probs=False):
        return super().expand(tree, nodes, topk)


@pytest.mark.parametrize("mode", ["tree", "lever"])
def test_drafts_coupled_to_the_targets_noise_are_accepted_more(pair, mode):
    """Under sampling a drafted node's first child is the draft's own
    position-keyed draw: more draft tokens are accepted than with the
    draft's top-k children alone, and the text is the same."""
    target, draft = pair
    accepted = {"coupled": 0, "uncoupled": 0}
    for i, prompt in enumerate(random_prompts(target.config.vocab_size, 30, seed=8)):
        params = SamplingParams(temperature=1.0, seed=3000 + i)
        texts = []
        for name, drafter in (("coupled", ModelDrafter(draft)), ("uncoupled", UncoupledDrafter(draft))):
            spec = (SpecConfig("tree", tree=TreeShape(budget=6, topk=2, depth=3)) if mode == "tree"
                    else lever_spec(max_nodes=6, max_depth=3, topk=2))
            result, stats = speculative_generate(target, drafter, prompt, 12, params, spec)
            accepted[name] += stats.accepted
            texts.append(result.token_ids)
        assert texts[0] == texts[1], f"prompt {i}: coupling changed the text"
    print(f"{mode}: draft tokens accepted over 30 prompts: {accepted}")
    assert accepted["coupled"] > 1.2 * accepted["uncoupled"], accepted
