"""The end of a generation: no policy drafts tokens that could never be emitted.

An iteration emits its accepted path plus the target's own token, so with r
tokens left to generate a draft node deeper than r - 1 is drafted and
verified for nothing.  The engine hands each policy that room
(`policy.grow(..., room=r - 1)`) and every policy caps its depth with
`lever.draft.base.within`.

1. `within`, and each policy (chain, static tree, gain-cost) under a cap:
   no node deeper than the room, room 0 is the root alone, no cap (None)
   grows what it grew before.
2. The engine: the room it passes each iteration, the trees it verifies,
   the output (equal to target-only greedy decoding in every mode), and the
   draft nodes saved when the draft is the target itself (every path
   accepted, so each saved node is one the target would have verified and
   thrown away).
"""

from __future__ import annotations

import numpy as np
import pytest

from lever.autoregressive import generate_tokens
from lever.draft.base import TreeShape, within
from lever.draft.gain_cost import CostCurves, GainCostPolicy
from lever.draft.model_drafter import ModelDrafter
from lever.draft.ngram import NgramDrafter
from lever.draft.policies import ChainPolicy, StaticTreePolicy
from lever.engine import SpecConfig, run_speculative
from lever.model.native_loader import load_gguf_native
from lever.sampling import SamplingParams
from lever.verify.target_pass import TargetVerifier
from tiny_model import write_tiny_gguf

SIZES = dict(arch="llama", tied=False, matrix_type="F32", std=0.2, vocab=97, hidden=32, ff=64, heads=4,
             kv_heads=2, layers=2, context=256)
PROMPT = [5, 17, 60, 3, 9]
TEXT = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2]      # prompt lookup continues it for ever


def io_bound_policy() -> GainCostPolicy:
    """A gain-cost policy whose passes cost the same at any size (deep trees pay)."""
    costs = CostCurves.linear(0.05, 0.00001, 0.0001, 0.00001, overhead_s=0.0001)
    return GainCostPolicy(costs, max_nodes=24, max_depth=6, topk=3, adapt=False)


SPECS = {
    "chain": lambda: SpecConfig("chain", draft_len=4),
    "tree": lambda: SpecConfig("tree", tree=TreeShape(budget=12, topk=3, depth=4)),
    "lever": lambda: SpecConfig("lever", policy=io_bound_policy()),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, draft): a random target and a noisy copy of it, native decoder."""
    d = tmp_path_factory.mktemp("end")
    paths = (write_tiny_gguf(d / "target.gguf", seed=3, **SIZES),
             write_tiny_gguf(d / "draft.gguf", seed=3, noise=0.05, noise_seed=4, **SIZES))
    return tuple(load_gguf_native(p, "float32")[0] for p in paths)


def lookup(text=TEXT) -> NgramDrafter:
    d = NgramDrafter()
    d.reset(text)
    return d


def max_depth(tree) -> int:
    return int(tree.depths().max()) if len(tree) else 0


# --- 1. the policies under a cap ------------------------------------------------------

def test_within_caps_depth_at_the_room():
    assert within(5, None) == 5
    assert within(5, 9) == 5
    assert within(5, 2) == 2
    assert within(5, 0) == 0
    assert within(5, -3) == 0


@pytest.mark.parametrize("room", [None, 0, 1, 2, 3])
def test_chain_stops_at_the_room(room):
    tree = ChainPolicy(5).grow(lookup(), TEXT[-1], room=room).tree
    assert len(tree) - 1 == (5 if room is None else room)
    assert tree.tokens()[1:].tolist() == [3, 4, 5, 6, 7][:len(tree) - 1]       # the same chain, cut


@pytest.mark.parametrize("room", [0, 1, 2])
def test_static_tree_grows_no_node_deeper_than_the_room(pair, room):
    target, draft = pair
    shape = TreeShape(budget=12, topk=3, depth=4)
    drafter = ModelDrafter(draft)
    drafter.reset(PROMPT)
    free = StaticTreePolicy(shape).grow(drafter, PROMPT[-1]).tree
    drafter.reset(PROMPT)
    capped = StaticTreePolicy(shape).grow(drafter, PROMPT[-1], room=room).tree
    assert len(free) - 1 == shape.budget and max_depth(free) > room
    assert max_depth(capped) <= room
    # the capped tree is the free one's first `room` steps of `width` nodes each
    n = 1 + room * shape.width
    assert capped.tokens().tolist() == free.tokens()[:n].tolist()
    assert [capped.parent(i) for i in range(1, len(capped))] == [free.parent(i) for i in range(1, n)]


@pytest.mark.parametrize("room", [0, 1, 2])
def test_gain_cost_grows_no_node_deeper_than_the_room(pair, room):
    _, draft = pair
    drafter = ModelDrafter(draft)
    drafter.reset(PROMPT)
    policy = io_bound_policy()
    free = policy.grow(drafter, PROMPT[-1]).tree
    assert max_depth(free) > 2                       # I/O-bound: without a cap it grows deep
    drafter.reset(PROMPT)
    grown = policy.grow(drafter, PROMPT[-1], room=room)
    assert max_depth(grown.tree) <= room
    assert (len(grown.tree) == 1) == (room == 0)
    policy.observe(grown, [], verify_s=0.05, iteration_s=0.06)      # a root-only tree is learnt from too
    assert policy.report()["iterations"] == 1


# --- 2. the engine -------------------------------------------------------------------

class RoomLog:
    """Wraps a tree policy and records the room it is given and the tree it grows."""

    def __init__(self, policy):
        self.policy, self.rooms, self.depths, self.accepted = policy, [], [], []
        self.max_nodes, self.max_depth = policy.max_nodes, policy.max_depth

    def grow(self, drafter, root, params=SamplingParams(), seed=None, room=None):
        grown = self.policy.grow(drafter, root, params, seed, room=room)
        self.rooms.append(room)
        self.depths.append(max_depth(grown.tree))
        return grown

    def observe(self, grown, accepted, verify_s, iteration_s):
        self.accepted.append(len(accepted))
        self.policy.observe(grown, accepted, verify_s, iteration_s)

    @property
    def observed(self):
        return self.policy.observed

    def report(self, since=0):
        return self.policy.report(since)


def run_logged(target, drafter, mode, new_tokens):
    log = RoomLog(SPECS[mode]().tree_policy())
    spec = SpecConfig("lever", policy=log)                # the engine runs whatever policy mode lever carries
    result, stats = run_speculative(TargetVerifier(target, SamplingParams(), capacity=256), drafter, PROMPT,
                                    new_tokens, SamplingParams(), spec)
    return result, stats, log


@pytest.mark.parametrize("mode", ["chain", "tree", "lever"])
@pytest.mark.parametrize("new_tokens", [1, 2, 7, 13])
def test_the_engine_passes_the_room_left_and_stays_exact(pair, mode, new_tokens):
    target, draft = pair
    ref = generate_tokens(target, PROMPT, new_tokens, SamplingParams()).token_ids
    result, stats, log = run_logged(target, ModelDrafter(draft), mode, new_tokens)
    assert result.token_ids == ref
    emitted = np.cumsum([0] + [a + 1 for a in log.accepted])       # tokens emitted before each iteration
    assert emitted[-1] == new_tokens                                 # the last iteration was not cut
    assert log.rooms == [new_tokens - int(e) - 1 for e in emitted[:-1]]
    assert all(d <= r for d, r in zip(log.depths, log.rooms))
    assert log.rooms[-1] >= 0 and (new_tokens > 1 or stats.tree_sizes == [0])


@pytest.mark.parametrize("mode", ["chain", "tree", "lever"])
def test_no_node_is_drafted_past_the_end_when_every_path_is_accepted(pair, mode):
    """Draft = target: every drafted node on the draft's path is accepted, so
    the generation ends exactly at max_new_tokens and the last tree is cut to
    the room left; without the cap it would draft a full-depth tree there."""
    target, _ = pair
    new_tokens = 7
    result, stats, log = run_logged(target, ModelDrafter(target), mode, new_tokens)
    assert len(result.token_ids) == new_tokens
    assert log.rooms[0] == new_tokens - 1
    last = log.depths[-1]
    assert last == log.rooms[-1] < log.policy.max_depth
