"""The static tree policies: no draft (mode ar), a chain (mode chain) and a
best-first tree of fixed shape (mode tree).  Each grows its tree with the
drafter primitive `expand` (lever.draft.base.Drafter) and learns nothing."""

from __future__ import annotations

import heapq

import numpy as np

from ..errors import LeverError
from ..sampling import SamplingParams
from ..tree import TokenTree
from .base import NO_TOKEN, Drafter, Grown, TreeShape, within


class StaticPolicy:
    """What the policies that learn nothing share: `observe` and `report` do nothing."""

    max_nodes = 0
    max_depth = 0
    observed = 0

    def observe(self, grown: Grown, accepted: list[int], verify_s: float, iteration_s: float) -> None:
        pass

    def report(self, since: int = 0) -> None:
        return None


class NoDraft(StaticPolicy):
    """Mode ar: no draft nodes; the target decodes one token per pass."""

    def grow(self, drafter: Drafter | None, root: int, params: SamplingParams = SamplingParams(),
             seed: int | None = None, room: int | None = None) -> Grown:
        return Grown(TokenTree(root))


class ChainPolicy(StaticPolicy):
    """Mode chain: `k` draft tokens, each the draft's own choice after the one
    before (its argmax when greedy, else its position-keyed draw with the
    target's seed, so a draft close to the target proposes the very token the
    target will draw).  Stops early where the drafter has no continuation.

    rule "leviathan" (sampling only): also the draft distributions q of the
    chain's tokens (`Grown.draft_probs`, float32 [k, vocab]) for the
    conventional min(1, p/q) rule; a drafter without distributions (prompt
    lookup) gets one-hot rows of width `vocab_size` (the target's vocabulary)."""

    def __init__(self, k: int, rule: str = "exact", vocab_size: int = 0):
        if k < 1:
            raise LeverError(f"--draft-len must be >= 1, got {k}")
        self.k, self.rule, self.vocab_size = k, rule, vocab_size
        self.max_nodes = self.max_depth = k

    def grow(self, drafter: Drafter, root: int, params: SamplingParams = SamplingParams(),
             seed: int | None = None, room: int | None = None) -> Grown:
        with_probs = self.rule == "leviathan" and not params.greedy
        drafter.begin_tree()
        tree = TokenTree(root)
        probs = []
        for node in range(within(self.k, room)):
            e = drafter.expand(tree, [node], 1, params, seed, with_probs=with_probs)
            token = int(e.tokens[0, 0])
            if token == NO_TOKEN:
                break
            tree.add(node, token, float(e.logprobs[0, 0]))
            if with_probs:
                probs.append(e.probs[0] if e.probs is not None else self._one_hot(token))
        draft_probs = np.stack(probs).astype(np.float32, copy=False) if probs else None
        return Grown(tree, draft_probs)

    def _one_hot(self, token: int) -> np.ndarray:
        """q of a token drafted deterministically: one-hot (float32 [vocab_size])."""
        if self.vocab_size <= token:
            raise LeverError(f"rule leviathan with this drafter needs the target's vocabulary size "
                             f"(got {self.vocab_size}, drafted token {token})")
        q = np.zeros(self.vocab_size, dtype=np.float32)
        q[token] = 1.0
        return q


class StaticTreePolicy(StaticPolicy):
    """Mode tree: best-first growth in `shape.depth` draft steps of `shape.width`
    nodes each, at most `shape.budget` nodes.

    Every expanded node offers `shape.topk` children as candidates; each step
    adds the best remaining candidates by priority, then expands them as one
    batch.  A candidate's priority is its draft path log-probability, except
    under sampling for rank 0 (the draft's own position-keyed draw), which
    takes its parent's priority: the path the target is most likely to draw
    itself comes first.  The nodes added by the last step are not expanded."""

    def __init__(self, shape: TreeShape):
        self.shape = shape
        self.max_nodes, self.max_depth = shape.budget, shape.depth

    def grow(self, drafter: Drafter, root: int, params: SamplingParams = SamplingParams(),
             seed: int | None = None, room: int | None = None) -> Grown:
        shape = self.shape
        drafter.begin_tree()
        tree = TokenTree(root)
        priority = [0.0]                                          # per tree node
        candidates: list[tuple[float, int, int, float]] = []    # (-priority, parent, token, logprob)
        lo = 0
        for _ in range(within(shape.depth, room)):
            hi = len(tree)
            nodes = list(range(lo, hi))
            e = drafter.expand(tree, nodes, shape.topk, params, seed)
            for row, node in enumerate(nodes):
                for rank, (lp, tok) in enumerate(zip(e.logprobs[row].tolist(), e.tokens[row].tolist())):
                    if tok == NO_TOKEN:
                        break
                    coupled = rank == 0 and not params.greedy        # the draft's own draw
                    heapq.heappush(candidates, (-(priority[node] + (0.0 if coupled else lp)), node, tok, lp))
            room = min(shape.width, shape.budget - (len(tree) - 1))
            for _ in range(min(room, len(candidates))):
                key, parent, tok, lp = heapq.heappop(candidates)
                tree.add(parent, tok, lp)
                priority.append(-key)
            lo = hi
            if len(tree) - 1 >= shape.budget or lo == len(tree):
                break
        return Grown(tree)
