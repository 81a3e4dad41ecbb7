"""Greedy drafting asks the draft model for head="topk" (lever.topk_head)
and never for [rows, vocab] logits, with the trees and chains the logits path
(log_softmax + top_k_ids) gives."""

import numpy as np
import pytest

from lever.draft.base import TreeShape
from lever.draft.model_drafter import ModelDrafter, top_k_ids
from lever.draft.policies import ChainPolicy, StaticTreePolicy
from lever.model.native_loader import load_gguf_native
from lever.sampling import SamplingParams, log_softmax
from tiny_model import write_tiny_gguf

PROMPT = [1, 5, 9, 33, 2, 700, 2999, 41]


class Recording:
    """The draft model, recording the head of every forward."""

    def __init__(self, model):
        self.model, self.heads = model, []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, *args, head="logits", **kwargs):
        self.heads.append(head)
        return self.model(*args, head=head, **kwargs)


class LogitsPath(Recording):
    """head="topk" answered the way expand did before it: from the logits, by
    log_softmax and top_k_ids."""

    def __call__(self, *args, head="logits", topk=None, **kwargs):
        if head != "topk":
            return super().__call__(*args, head=head, **kwargs)
        logprobs = log_softmax(super().__call__(*args, **kwargs))
        ids = top_k_ids(logprobs, topk)
        return ids, np.take_along_axis(logprobs, ids, axis=-1)


@pytest.fixture(scope="module")
def draft(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("draft") / "draft.gguf", "llama", True, vocab=3000)
    return load_gguf_native(path, "float32")[0]


def trees_and_chains(model) -> list:
    drafter = ModelDrafter(model)
    drafter.reset(PROMPT)
    out = []
    for root in (PROMPT[-1], 17):
        tree = StaticTreePolicy(TreeShape(budget=12, topk=4, depth=3)).grow(drafter, root, SamplingParams()).tree
        out.append([(tree.token(i), tree.parent(i), tree.logprob(i)) for i in range(len(tree))])
        drafter.commit(tree, [1], tree.token(2))
    grown = ChainPolicy(4).grow(drafter, 5, SamplingParams(), None)
    chain = grown.tree
    assert grown.draft_probs is None
    out.append([(chain.token(i), chain.parent(i), chain.logprob(i)) for i in range(len(chain))])
    return out


def test_greedy_drafts_use_the_topk_head_and_match_the_logits_path(draft):
    new, old = Recording(draft), LogitsPath(draft)
    got, want = trees_and_chains(new), trees_and_chains(old)
    assert "logits" not in new.heads and "topk" in new.heads
    for g, w in zip(got, want):
        assert [t[:2] for t in g] == [t[:2] for t in w]            # the same tokens, in the same order
        np.testing.assert_allclose([t[2] for t in g], [t[2] for t in w], rtol=0, atol=2e-6)
