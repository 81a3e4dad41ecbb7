"""The tree policies over the one drafter primitive (lever.draft.base, lever.draft.policies).

1. StaticTreePolicy over a model drafter grows the tree a reference
   best-first search grows from fresh full forwards of the draft (no KV cache,
   no catch-up), greedy and sampled (rank 0 the position-keyed draw, with
   its parent's priority), before and after a commit that leaves tokens to
   catch up on.
2. Prompt lookup's `expand`: the continuations of the longest matching
   suffix with their log frequencies, newest first on ties, padded with
   NO_TOKEN; a chain follows it, a tree branches where the text did.
3. The Leviathan chain's q: the model's distributions, or one-hot rows for
   prompt lookup.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from lever.draft.base import NO_TOKEN, TreeShape
from lever.draft.model_drafter import ModelDrafter
from lever.draft.ngram import NgramDrafter
from lever.draft.policies import ChainPolicy, NoDraft, StaticTreePolicy
from lever.errors import LeverError
from lever.masks import causal_mask
from lever.model.native_loader import load_gguf_native
from lever.topk_head import top_k_ids
from lever.sampling import SamplingParams, log_softmax, processed_probs, sample_at
from tiny_model import write_tiny_gguf

PROMPT = [3, 17, 40, 3, 17, 99, 5]
SAMPLED = SamplingParams(temperature=0.9, top_k=20)


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("draft") / "draft.gguf", "llama", False, seed=4,
                           matrix_type="F32", vocab=120, hidden=32, ff=64, heads=4, kv_heads=2, layers=2,
                           context=256, std=0.3)
    return load_gguf_native(path, "float32")[0]


def last_logits(model, ids: list[int]) -> np.ndarray:
    """The draft's logits after `ids` (float32 [vocab]), from a fresh full forward."""
    t = len(ids)
    return model(np.array(ids, dtype=np.int64), np.arange(t), causal_mask(t, 0), model.new_cache(capacity=t))[-1]


def reference_best_first(model, text: list[int], shape: TreeShape, params: SamplingParams,
                         seed: int | None) -> list[tuple[int, int]]:
    """(parent, token) of each node after the root, by the rule StaticTreePolicy
    documents, written out step by step: expand the nodes added last, then
    add the `width` best candidates by priority (ties: parent, then token)."""
    nodes = [(-1, text[-1], 0.0, [])]                  # (parent, token, priority, path tokens after the root)
    candidates = []
    lo = 0
    for _ in range(shape.depth):
        hi = len(nodes)
        for node in range(lo, hi):
            seq = text + nodes[node][3]
            logits = last_logits(model, seq)
            logprobs = log_softmax(logits)
            top = top_k_ids(logprobs[None], shape.topk)[0].tolist()
            if not params.greedy:
                drawn = sample_at(logits, params, seed, len(seq))
                top = [drawn] + [t for t in top if t != drawn][:shape.topk - 1]
            for rank, tok in enumerate(top):
                coupled = rank == 0 and not params.greedy
                candidates.append((nodes[node][2] + (0.0 if coupled else float(logprobs[tok])), node, tok))
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        room = min(shape.width, shape.budget - (len(nodes) - 1))
        for priority, parent, tok in candidates[:room]:
            nodes.append((parent, tok, priority, nodes[parent][3] + [tok]))
        candidates = candidates[room:]
        lo = hi
        if len(nodes) - 1 >= shape.budget or lo == len(nodes):
            break
    return [(parent, tok) for parent, tok, _, _ in nodes[1:]]


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("shape", [TreeShape(12, 3, 4), TreeShape(9, 4, 2)], ids=str)
def test_static_tree_is_the_reference_best_first_tree(draft, params, shape):
    seed = None if params.greedy else 77
    drafter = ModelDrafter(draft)
    drafter.reset(PROMPT)
    policy = StaticTreePolicy(shape)
    text = list(PROMPT)
    for accept in (2, 0, 4, 1):                        # commits that leave 0 or more tokens to catch up on
        tree = policy.grow(drafter, text[-1], params, seed).tree
        got = [(tree.parent(i), tree.token(i)) for i in range(1, len(tree))]
        assert got == reference_best_first(draft, text, shape, params, seed), text
        assert len(tree) - 1 == shape.budget
        path = tree.path(int(np.argmax(tree.depths())))[1:1 + accept]
        next_token = (tree.token(path[-1]) + 1) % 120 if path else 11
        drafter.commit(tree, path, next_token)
        text += [tree.token(j) for j in path] + [next_token]


def test_chain_is_the_drafts_own_choice_with_its_distributions(draft):
    """Greedy: the argmax chain; sampled with rule leviathan: the position-keyed
    draws, and q = the processed distributions they were drawn from."""
    for params, seed in ((SamplingParams(), None), (SAMPLED, 5)):
        drafter = ModelDrafter(draft)
        drafter.reset(PROMPT)
        grown = ChainPolicy(4, rule="leviathan").grow(drafter, PROMPT[-1], params, seed)
        chain = grown.tree.tokens()[1:].tolist()
        assert len(chain) == 4 and grown.tree.max_depth() == 4
        seq = list(PROMPT)
        for i, tok in enumerate(chain):
            logits = last_logits(draft, seq)
            want = int(np.argmax(logits)) if params.greedy else sample_at(logits, params, seed, len(seq))
            assert tok == want
            if not params.greedy:
                np.testing.assert_allclose(grown.draft_probs[i], processed_probs(logits, params), atol=1e-6)
            seq.append(tok)
        assert (grown.draft_probs is None) == params.greedy


# --- prompt lookup ---------------------------------------------------------------------

def lookup(text: list[int]) -> NgramDrafter:
    d = NgramDrafter()
    d.reset(text)
    return d


def children(d: NgramDrafter, tree, node: int, topk: int = 3) -> list[tuple[int, float]]:
    e = d.expand(tree, [node], topk)
    assert e.probs is None and e.tokens.dtype == np.int32 and e.logprobs.dtype == np.float32
    return [(t, round(float(lp), 5)) for t, lp in zip(e.tokens[0].tolist(), e.logprobs[0].tolist())]


def test_lookup_children_are_continuations_by_frequency():
    from lever.tree import TokenTree

    # [1, 2] was followed by 5, 6, 5: 5 first (2 of 3), then 6; the third slot is padding
    d = lookup([1, 2, 5, 1, 2, 6, 1, 2, 5, 9, 1, 2])
    tree = TokenTree(2)
    assert children(d, tree, 0) == [(5, round(math.log(2 / 3), 5)), (6, round(math.log(1 / 3), 5)),
                                    (NO_TOKEN, -math.inf)]
    # the longest suffix wins: [7, 1, 2] was followed by 3, then (newer) by 4: a tie, newest first
    d = lookup([7, 1, 2, 3, 7, 1, 2, 4, 7, 1, 2])
    tree = TokenTree(2)
    assert children(d, tree, 0) == [(4, round(math.log(0.5), 5)), (3, round(math.log(0.5), 5)),
                                    (NO_TOKEN, -math.inf)]
    four, three = tree.add(0, 4, 0.0), tree.add(0, 3, 0.0)
    assert children(d, tree, four)[0] == (7, 0.0) and children(d, tree, three)[0] == (7, 0.0)
    assert children(lookup([1, 2, 3]), TokenTree(3), 0)[0][0] == NO_TOKEN       # nothing repeats
    assert lookup([1]).expand(TokenTree(1), [0], 2).tokens.tolist() == [[NO_TOKEN, NO_TOKEN]]


def test_policies_over_prompt_lookup():
    text = [7, 1, 2, 3, 8, 7, 1, 2, 4, 9, 7, 1, 2]
    chain = ChainPolicy(5).grow(lookup(text), text[-1]).tree
    assert chain.tokens()[1:].tolist() == [4, 9, 7, 1, 2]             # the newest occurrence, re-matched
    tree = StaticTreePolicy(TreeShape(budget=8, topk=2, depth=4)).grow(lookup(text), text[-1]).tree
    branches = {tuple(tree.tokens()[tree.path(i)].tolist()[1:]) for i in tree.leaves()}
    assert (4, 9, 7, 1) in branches and (3, 8, 7, 1) in branches, branches
    assert ChainPolicy(3).grow(lookup([1, 2, 3]), 3).tree.tokens().tolist() == [3]    # no continuation: no draft
    assert len(NoDraft().grow(None, 5).tree) == 1


def test_leviathan_q_of_prompt_lookup_is_one_hot():
    text = [7, 1, 2, 3, 7, 1, 2]
    grown = ChainPolicy(2, rule="leviathan", vocab_size=10).grow(lookup(text), 2, SAMPLED, 3)
    assert grown.tree.tokens()[1:].tolist() == [3, 7]
    assert grown.draft_probs.shape == (2, 10) and grown.draft_probs.dtype == np.float32
    assert grown.draft_probs[0, 3] == grown.draft_probs[1, 7] == 1.0 and grown.draft_probs.sum() == 2.0
    assert ChainPolicy(2, rule="leviathan", vocab_size=10).grow(lookup(text), 2).draft_probs is None   # greedy
    with pytest.raises(LeverError, match="vocabulary"):
        ChainPolicy(2, rule="leviathan").grow(lookup(text), 2, SAMPLED, 3)
