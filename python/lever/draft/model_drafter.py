"""A draft model resident in DRAM that grows the tree level by level.

Each step is one batched forward of the draft over some tree nodes (with the
tree's attention mask, appended to the draft's own KV cache): the static
policy (`draft_tree`) forwards the nodes added last and keeps the best
candidates of the pool by draft path probability (under sampling, the
draft's own position-keyed draw first); the gain-cost policy
(lever.draft.gain_cost) chooses the nodes itself and calls `expand`.
Draft KV rows are assigned in forward order (`self._rows`: node -> row after
the committed rows); a node attends to the committed rows and to the rows of
its ancestors.  After verification the cache is compacted to the accepted
path (no recomputation).

Catching up is lazy: committed tokens the draft has not seen (an accepted
leaf it never expanded, or the roots of iterations where no draft ran) wait
in `pending` and go into the draft's next forward, together with the root,
as one batch.  So an accepted leaf costs no forward of its own, and while the
gain-cost policy chooses not to draft at all (e.g. a resident target that
decodes faster alone), the draft costs nothing.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..autoregressive import prefill
from ..model.topk_head import top_k_ids
from ..sampling import SamplingParams, log_softmax, processed_probs, sample_at
from ..tree import TokenTree
from .base import TreeShape

__all__ = ["ModelDrafter", "top_k_ids"]


class ModelDrafter:
    def __init__(self, model, path=None):
        self.model = model
        self.path = path             # where the draft model was loaded from (profile and calibration keys)
        self.cache = None
        self._committed = 0          # rows before the current tree: cached + pending
        self.pending: list[int] = [] # committed tokens not yet in the draft cache (root excluded)
        self._rows: dict[int, int] = {}   # drafted-tree node -> its row after the committed rows
        self._order: list[int] = []       # drafted-tree nodes in row order
        self._tree_rows: list[int] | None = None   # row of each verified-tree node (-1: none)

    @property
    def n_cached(self) -> int:
        return self.cache.length

    def reset(self, prompt_ids: list[int], capacity: int | None = None) -> None:
        """Start a sequence: prefill all but the prompt's last token.  capacity:
        KV rows to allocate up front (prompt + new tokens + one iteration's
        draft rows, as the engine computes it); the cache still grows between
        forwards if a run needs more."""
        self.cache = self.model.new_cache(capacity=capacity or len(prompt_ids) + 512)
        if len(prompt_ids) > 1:
            prefill(self.model, prompt_ids[:-1], self.cache, head="argmax")
        self.pending = []
        self.start_tree()

    # -- forwarding tree nodes ---------------------------------------------------------

    def start_tree(self) -> None:
        """Forget the rows of the previous tree (they must have been compacted away)."""
        self._committed = self.cache.length + len(self.pending)
        self._rows, self._order, self._tree_rows = {}, [], None

    def _forward(self, tree: TokenTree, nodes: list[int], **head):
        """Run `nodes` of `tree` (each one's ancestors already run) through the draft,
        appending their rows, after any pending tokens (the first forward of a
        tree); returns the nodes' logits float32 [len(nodes), vocab], or what
        the model's `head` keywords ask for (head="topk", topk=K: ids, logprobs)."""
        for i in nodes:
            self._rows[i] = len(self._order)
            self._order.append(i)
        n = self._committed
        ancestors = tree.mask(0)                           # [size, size]: j is an ancestor of i (or i)
        mask = np.ones((len(nodes), n + len(self._order)), dtype=bool)
        mask[:, n:] = ancestors[np.ix_(nodes, self._order)]
        positions = n + tree.depths()[nodes].astype(np.int64)
        tokens = tree.tokens()[nodes].astype(np.int64)
        p = len(self.pending)
        if p:                                              # catch up: causal rows before the tree's
            cached = n - p
            catch_up = np.zeros((p, mask.shape[1]), dtype=bool)
            for i in range(p):
                catch_up[i, :cached + i + 1] = True
            mask = np.concatenate([catch_up, mask])
            positions = np.concatenate([np.arange(cached, n), positions])
            tokens = np.concatenate([np.asarray(self.pending, dtype=np.int64), tokens])
            self.pending = []
        return self.model(tokens, positions, mask, self.cache, logits_rows=np.arange(p, len(tokens), dtype=np.int64),
                          **head)

    def expand(self, tree: TokenTree, nodes: list[int], topk: int, params: SamplingParams = SamplingParams(),
               seed: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """One draft forward over `nodes`: `topk` next tokens each (int32
        [len(nodes), topk]) with their draft log-probs (float32, same shape).
        Rank 0 is the draft's own choice: its argmax when greedy, else its
        position-keyed draw (`sample_at` with the target's `seed`, the token
        the target draws if the two agree); then the draft's top tokens, largest
        log-prob first, equal log-probs in token order (`top_k_ids`).

        Greedy asks the model for head="topk" (no [len(nodes), vocab] logits
        are made): the same ids in the same order as `top_k_ids` of the
        logits, log-probs equal to `log_softmax`'s within float32 rounding
        (lever.model.topk_head).  Sampling needs each full row for the draw."""
        if params.greedy:
            top_tok, top_lp = self._forward(tree, nodes, head="topk", topk=topk)
            return top_tok.astype(np.int32), top_lp.astype(np.float32)
        logits = self._forward(tree, nodes)
        logprobs = log_softmax(logits)
        top_tok = top_k_ids(logprobs, topk)
        for row, node in enumerate(nodes):
            drawn = sample_at(logits[row], params, seed, self._committed + int(tree.depth(node)) + 1)
            top_tok[row] = [drawn] + [t for t in top_tok[row].tolist() if t != drawn][:top_tok.shape[1] - 1]
        top_lp = np.take_along_axis(logprobs, top_tok, axis=-1)
        return top_tok.astype(np.int32), top_lp.astype(np.float32)

    def use_tree(self, tree: TokenTree, drafted_index: np.ndarray) -> None:
        """The tree to verify is a subtree of the drafted one: node i of it is
        drafted node drafted_index[i] (so `commit` finds the draft rows)."""
        self._tree_rows = [self._rows.get(int(j), -1) for j in drafted_index]

    # -- static policies ---------------------------------------------------------------

    def draft_tree(self, root: int, shape: TreeShape, params: SamplingParams = SamplingParams(),
                   seed: int | None = None) -> TokenTree:
        """Best-first growth in `shape.depth` draft steps of `shape.width` nodes each.

        Every forwarded node offers `shape.topk` tokens (`expand`) as
        candidates; each step adds the best remaining candidates by priority,
        then runs them through the draft as one batch.  A candidate's priority
        is its draft path log-probability, except under sampling for the
        draft's own position-keyed draw (rank 0 of `expand`), which takes its
        parent's priority: the path the target is most likely to draw itself
        comes first.
        """
        self.start_tree()
        tree = TokenTree(root)
        priority = [0.0]                                          # per tree node
        candidates: list[tuple[float, int, int, float]] = []    # (-priority, parent, token, logprob)
        lo = 0
        for _ in range(shape.depth):
            hi = len(tree)
            nodes = list(range(lo, hi))
            top_tok, top_lp = self.expand(tree, nodes, shape.topk, params, seed)
            for row, node in enumerate(nodes):
                for rank, (lp, tok) in enumerate(zip(top_lp[row].tolist(), top_tok[row].tolist())):
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
        return tree

    def draft_chain(self, root: int, k: int, params: SamplingParams,
                    seed: int | None) -> tuple[TokenTree, np.ndarray | None]:
        """A chain of `k` draft tokens: the draft's argmax when greedy, else the
        draft's own position-keyed draw (`sample_at` with the target's `seed`),
        so a draft close to the target proposes the very token the target will
        draw.  Returns the draft distributions q too (float32 [k, vocab]) when sampling."""
        self.start_tree()
        tree = TokenTree(root)
        probs = []
        for i in range(k):
            if params.greedy:                                  # the argmax, with no [1, vocab] logits
                ids, lps = self._forward(tree, [i], head="topk", topk=1)
                tok, lp = int(ids[0, 0]), float(lps[0, 0])
            else:
                logits = self._forward(tree, [i])[0]
                tok = sample_at(logits, params, seed, self._committed + i + 1)
                q = processed_probs(logits, params)
                probs.append(q)
                lp = float(np.log(q[tok]))
            tree.add(i, tok, lp)
        return tree, (np.stack(probs) if probs else None)

    # -- after verification -------------------------------------------------------------

    def commit(self, tree: TokenTree, accepted: list[int], next_token: int) -> None:
        """Keep the draft rows of the root and the accepted path; the path's nodes
        that never ran through the draft (at most a suffix) become pending."""
        rows = self._tree_rows if self._tree_rows is not None else [self._rows.get(i, -1) for i in range(len(tree))]
        path = [0] + list(accepted)
        keep = [rows[j] for j in path if rows[j] >= 0]
        missing = [j for j in path if rows[j] < 0]
        if missing and path[-len(missing):] != missing:
            raise RuntimeError("draft rows missing inside the accepted path")
        if self._order:
            n = self._committed
            self.cache.compact(np.concatenate([np.arange(n, dtype=np.int64), n + np.asarray(keep, dtype=np.int64)]))
        self.pending.extend(tree.token(j) for j in missing)
        self.start_tree()
