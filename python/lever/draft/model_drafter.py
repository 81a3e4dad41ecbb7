"""A draft model resident in DRAM that grows the tree level by level.

Each step is one batched forward of the draft over the nodes added last
(with the tree's attention mask, appended to the draft's own KV cache); their
top-k tokens join a pool of candidates, and the best candidates of the pool
by draft path probability become the next nodes.  Nodes are forwarded in
index order, so node i lives in draft cache row n_cached + i.
After verification the cache is compacted to the accepted path (no
recomputation); only an accepted leaf, never run through the draft, is fed.
"""

from __future__ import annotations

import heapq

import torch

from ..generate import prefill
from ..model.decoder import causal_mask
from ..sampling import SamplingParams, processed_probs
from ..tree import TokenTree
from .base import TreeShape


class ModelDrafter:
    def __init__(self, model):
        self.model = model
        self.cache = None
        self._forwarded = 0          # tree nodes of the last draft that have draft KV rows

    @property
    def n_cached(self) -> int:
        return self.cache.length

    def reset(self, prompt_ids: list[int]) -> None:
        self.cache = self.model.new_cache(capacity=len(prompt_ids) + 512)
        if len(prompt_ids) > 1:
            prefill(self.model, prompt_ids[:-1], self.cache)
        self._forwarded = 0

    def _forward_nodes(self, tree: TokenTree, lo: int, hi: int) -> torch.Tensor:
        """Run tree nodes [lo, hi) through the draft; returns their logits."""
        n = self.n_cached - lo                   # committed rows (before any tree row)
        mask = torch.from_numpy(tree.mask(n)[lo:hi, : n + hi])
        positions = torch.from_numpy(tree.positions(n)[lo:hi])
        tokens = torch.from_numpy(tree.tokens()[lo:hi]).long()
        logits = self.model(tokens, positions, mask, self.cache)
        self._forwarded = hi
        return logits

    def draft_tree(self, root: int, shape: TreeShape) -> TokenTree:
        """Best-first growth in `shape.depth` draft steps of `shape.width` nodes each.

        Every forwarded node offers its top-k tokens as candidates; each step
        adds the best remaining candidates by draft path log-probability
        (from any level), then runs them through the draft as one batch.
        """
        tree = TokenTree(root)
        self._forwarded = 0
        candidates: list[tuple[float, int, int, float]] = []    # (-path logprob, parent, token, logprob)
        lo = 0
        for _ in range(shape.depth):
            hi = len(tree)
            logprobs = torch.log_softmax(self._forward_nodes(tree, lo, hi), dim=-1)
            top_lp, top_tok = torch.topk(logprobs, shape.topk, dim=-1)
            for row in range(hi - lo):
                base = tree.path_logprob(lo + row)
                for lp, tok in zip(top_lp[row].tolist(), top_tok[row].tolist()):
                    heapq.heappush(candidates, (-(base + lp), lo + row, tok, lp))
            room = min(shape.width, shape.budget - (len(tree) - 1))
            for _ in range(min(room, len(candidates))):
                _, parent, tok, lp = heapq.heappop(candidates)
                tree.add(parent, tok, lp)
            lo = hi
            if len(tree) - 1 >= shape.budget or lo == len(tree):
                break
        return tree

    def draft_chain(self, root: int, k: int, params: SamplingParams,
                    generator: torch.Generator) -> tuple[TokenTree, torch.Tensor | None]:
        tree = TokenTree(root)
        self._forwarded = 0
        probs = []
        for i in range(k):
            logits = self._forward_nodes(tree, i, i + 1)[0]
            if params.greedy:
                tok = int(logits.argmax())
                lp = float(torch.log_softmax(logits, -1)[tok])
            else:
                q = processed_probs(logits, params)
                tok = int(torch.multinomial(q, 1, generator=generator))
                probs.append(q)
                lp = float(torch.log(q[tok]))
            tree.add(i, tok, lp)
        return tree, (torch.stack(probs) if probs else None)

    def commit(self, tree: TokenTree, accepted: list[int], next_token: int) -> None:
        n = self.n_cached - self._forwarded
        have = [j for j in accepted if j < self._forwarded]
        missing = [j for j in accepted if j >= self._forwarded]
        if self._forwarded:
            self.cache.compact(torch.from_numpy(tree.compaction_indices(n, have)))
        else:                                    # nothing was forwarded: feed the root too
            missing = [0] + missing
        for j in missing:                       # a path suffix the draft has not seen
            pos = self.cache.length
            self.model(torch.tensor([tree.token(j)]), torch.tensor([pos]), causal_mask(1, pos), self.cache)
        self._forwarded = 0
