"""A draft model resident in DRAM, expanding tree nodes in batched forwards.

The drafter primitive `expand` (lever.draft.base.Drafter) is one batched
forward of the draft over some tree nodes (with the tree's attention mask,
appended to the draft's own KV cache); the tree policies
(lever.draft.policies, lever.draft.gain_cost) choose which nodes.
Draft KV rows are assigned in forward order (`self._rows`: node -> row after
the committed rows); a node attends to the committed rows and to the rows of
its ancestors.  After verification the cache is compacted to the accepted
path (no recomputation).

Catching up is lazy: committed tokens the draft has not seen (an accepted
leaf it never expanded, or the roots of iterations where no draft ran) wait
in `_pending` (`catch_up_tokens` of them) and go into the draft's next
forward, together with the root, as one batch.  So an accepted leaf costs
no forward of its own, and while the gain-cost policy chooses not to draft
at all (e.g. a resident target that decodes faster alone), the draft costs
nothing.

Drafting ahead (lever.draft.ahead, `extend_ahead`): while the target verifies
a tree, the draft continues its own path where it leaves the tree (the node
E reached from the root by rank-0 children: the draft's argmax, or its
position-keyed draw under sampling -- the path the target accepts when it
agrees with the draft): it runs E (unless it ran), E's top children that
are not in the tree, and the rank-0 chain below the first of them, in a
copy of the tree, appending their rows.  If the accepted path ends at E and
the target's next token is one of those children, `commit` keeps the rows
of that child (the next
root) and of the chain below it: they are *preloaded* rows of the next
tree, at its first rows, known by their tokens below the root
(`_preloaded_keys`) and with their logits kept, and its `expand` of a node
with those tokens maps the node to the row and ranks the kept logits
instead of running a forward.  Rows of preloaded nodes the next tree never
expands attend to nothing of it (`_order` marks them -1) and are dropped at
its commit, with every other row off the accepted path.
"""

from __future__ import annotations

import numpy as np

from ..autoregressive import prefill
from ..topk_head import top_k_ids
from ..sampling import SamplingParams, log_softmax, processed_probs, sample_at
from ..tree import TokenTree
from .base import Expansion

__all__ = ["ModelDrafter", "top_k_ids"]


class _AheadTree:
    """What the drafter drafts ahead of one verified tree: `tree` is a copy of
    it (same node indices) plus the nodes drafted ahead (index `first` on),
    below `node`, where the draft's own path leaves the verified tree;
    logits: float32 [vocab] of every node run ahead (`node` too, if it ran
    ahead); frontier: the nodes the next ahead forward runs."""

    def __init__(self, verified: TokenTree, node: int):
        self.verified, self.node = verified, node
        self.tree = TokenTree.from_arrays(verified.tokens(), verified.parents(), verified.logprobs())
        self.first = len(verified)
        self.logits: dict[int, np.ndarray] = {}
        self.frontier: list[int] = []


class ModelDrafter:
    """A draft model's drafter (lever.draft.base.Drafter); `model` is of the numpy
    protocol (lever.model.loading), `path` where it was loaded from."""

    has_probabilities = True

    def __init__(self, model, path=None):
        self.model = model
        self.path = path             # where the draft model was loaded from (profile and calibration keys)
        self.cache = None
        self._committed = 0          # rows before the current tree: cached + pending
        self._pending: list[int] = []     # committed tokens not yet in the draft cache (root excluded)
        self._rows: dict[int, int] = {}   # drafted-tree node -> its row after the committed rows
        self._order: list[int] = []       # drafted-tree nodes in row order
        self._tree_rows: list[int] | None = None   # row of each verified-tree node (-1: none)
        self._offered: dict[int, np.ndarray] = {}  # drafted-tree node -> the child tokens its expand offered
        self._drafted_index: np.ndarray | None = None   # use_tree's: verified node -> drafted node
        self._ahead: _AheadTree | None = None      # drafting ahead of the tree under verification
        self._preloaded_logits: list[np.ndarray] = []   # per preloaded row (the first rows of the tree)
        self._preloaded_keys: dict[tuple[int, ...], int] = {}   # tokens below the root -> preloaded row
        self.reused_ahead = 0        # expansions served from preloaded rows (nodes), this sequence

    @property
    def n_cached(self) -> int:
        return self.cache.length

    @property
    def preloaded_paths(self) -> list[tuple[int, ...]]:
        """The tokens below the root of each preloaded row (rows drafted ahead
        that `commit` kept for the current tree), in row order ([] if none)."""
        return sorted(self._preloaded_keys, key=self._preloaded_keys.get)

    @property
    def catch_up_tokens(self) -> int:
        """Committed tokens the next forward runs first (root excluded)."""
        return len(self._pending)

    def reset(self, prompt_ids: list[int], capacity: int | None = None, pace=None) -> None:
        """Start a sequence: prefill all but the prompt's last token.  capacity:
        KV rows to allocate up front (prompt + new tokens + one iteration's
        draft rows, as the engine computes it); the cache still grows between
        forwards if a run needs more.  pace: None, or the
        lever.autoregressive.PrefillPace that sizes (and may stop) the chunks."""
        self.cache = self.model.new_cache(capacity=capacity or len(prompt_ids) + 512)
        if len(prompt_ids) > 1:
            prefill(self.model, prompt_ids[:-1], self.cache, head="argmax",
                    **({"pace": pace} if pace is not None else {}))
        self._pending = []
        self._drop_preloaded()
        self.reused_ahead = 0
        self.begin_tree()

    def truncate(self, length: int) -> None:
        """Forget every committed token after the first `length` (root excluded):
        the cache keeps `length` rows and nothing is pending (benchmarks that
        hold the context fixed)."""
        self.cache.truncate(length)
        self._pending = []
        self._drop_preloaded()
        self.begin_tree()

    def _drop_preloaded(self) -> None:
        self._preloaded_logits, self._preloaded_keys = [], {}

    # -- forwarding tree nodes ---------------------------------------------------------

    def begin_tree(self) -> None:
        """Forget the rows of the previous tree (they must have been compacted
        away), all but the rows drafted ahead that `commit` preloaded."""
        preloaded = len(self._preloaded_logits)
        self._committed = self.cache.length - preloaded + len(self._pending)
        self._rows, self._order, self._tree_rows = {}, [-1] * preloaded, None
        self._offered, self._drafted_index, self._ahead = {}, None, None

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
        order = np.asarray(self._order, dtype=np.int64)
        known = np.nonzero(order >= 0)[0]                  # rows of this tree's nodes (-1: a preloaded row unused)
        mask = np.zeros((len(nodes), n + len(order)), dtype=bool)
        mask[:, :n] = True
        mask[:, n + known] = ancestors[np.ix_(nodes, order[known])]
        positions = n + tree.depths()[nodes].astype(np.int64)
        tokens = tree.tokens()[nodes].astype(np.int64)
        p = len(self._pending)
        if p:                                              # catch up: causal rows before the tree's
            cached = n - p
            catch_up = np.zeros((p, mask.shape[1]), dtype=bool)
            for i in range(p):
                catch_up[i, :cached + i + 1] = True
            mask = np.concatenate([catch_up, mask])
            positions = np.concatenate([np.arange(cached, n), positions])
            tokens = np.concatenate([np.asarray(self._pending, dtype=np.int64), tokens])
            self._pending = []
        return self.model(tokens, positions, mask, self.cache, logits_rows=np.arange(p, len(tokens), dtype=np.int64),
                          **head)

    def expand(self, tree: TokenTree, nodes: list[int], topk: int, params: SamplingParams = SamplingParams(),
               seed: int | None = None, with_probs: bool = False) -> Expansion:
        """One draft forward over `nodes`: `topk` next tokens each (int32
        [len(nodes), topk]) with their draft log-probs (float32, same shape).
        Rank 0 is the draft's own choice: its argmax when greedy, else its
        position-keyed draw (`sample_at` with the target's `seed`, the token
        the target draws if the two agree); then the draft's top tokens, largest
        log-prob first, equal log-probs in token order (`top_k_ids`).
        with_probs: also the rows' distributions (float32 [len(nodes), vocab]):
        under sampling the ones the draws are made from (`processed_probs`),
        greedy one-hot on the argmax.

        Greedy asks the model for head="topk" (no [len(nodes), vocab] logits
        are made): the same ids in the same order as `top_k_ids` of the
        logits, log-probs equal to `log_softmax`'s within float32 rounding
        (lever.topk_head).  Sampling needs each full row for the draw.
        Nodes drafted ahead (preloaded rows) are ranked from their kept
        logits, without a forward."""
        hits = self._preloaded_hits(tree, nodes)
        runs = [i for i in nodes if i not in hits]
        parts = []
        if runs:
            parts.append((runs, self._expand_forward(tree, runs, topk, params, seed, with_probs)))
        if hits:
            logits = np.stack([self._preloaded_logits[hits[i]] for i in hits])
            parts.append((list(hits), self._ranked(tree, list(hits), logits, topk, params, seed, with_probs)))
            self.reused_ahead += len(hits)
        e = parts[0][1] if len(parts) == 1 else _merged(nodes, parts)
        for row, node in enumerate(nodes):
            self._offered[node] = e.tokens[row]
        return e

    def _preloaded_hits(self, tree: TokenTree, nodes: list[int]) -> dict[int, int]:
        """The nodes of `nodes` drafted ahead -> their preloaded rows, now mapped to them."""
        if not self._preloaded_keys:
            return {}
        hits = {}
        for node in nodes:
            row = self._preloaded_keys.get(_key(tree, node))
            if row is not None and self._order[row] < 0:
                hits[node] = row
                self._rows[node], self._order[row] = row, node
        return hits

    def _expand_forward(self, tree: TokenTree, nodes: list[int], topk: int, params: SamplingParams,
                        seed: int | None, with_probs: bool) -> Expansion:
        """`expand` by one draft forward over `nodes`."""
        if params.greedy:
            top_tok, top_lp = self._forward(tree, nodes, head="topk", topk=topk)
            top_tok = top_tok.astype(np.int32)
            probs = None
            if with_probs:
                probs = np.zeros((len(nodes), self.model.config.vocab_size), dtype=np.float32)
                probs[np.arange(len(nodes)), top_tok[:, 0]] = 1.0
            return Expansion(top_tok, top_lp.astype(np.float32), probs)
        return self._ranked(tree, nodes, self._forward(tree, nodes), topk, params, seed, with_probs)

    def _ranked(self, tree: TokenTree, nodes: list[int], logits: np.ndarray, topk: int, params: SamplingParams,
                seed: int | None, with_probs: bool) -> Expansion:
        """The `expand` of `nodes` from their logits (float32 [len(nodes), vocab])."""
        logprobs = log_softmax(logits)
        top_tok = top_k_ids(logprobs, topk)
        if not params.greedy:
            for row, node in enumerate(nodes):
                drawn = sample_at(logits[row], params, seed, self._committed + int(tree.depth(node)) + 1)
                top_tok[row] = [drawn] + [t for t in top_tok[row].tolist() if t != drawn][:top_tok.shape[1] - 1]
        top_lp = np.take_along_axis(logprobs, top_tok, axis=-1)
        probs = None
        if with_probs and params.greedy:
            probs = np.zeros((len(nodes), self.model.config.vocab_size), dtype=np.float32)
            probs[np.arange(len(nodes)), top_tok[:, 0]] = 1.0
        elif with_probs:
            probs = np.stack([processed_probs(row, params) for row in logits])
        return Expansion(top_tok.astype(np.int32), top_lp.astype(np.float32), probs)

    def use_tree(self, tree: TokenTree, drafted_index: np.ndarray) -> None:
        """The tree to verify is a subtree of the grown one: node i of it is
        grown node drafted_index[i] (so `commit` finds the draft rows)."""
        self._tree_rows = [self._rows.get(int(j), -1) for j in drafted_index]
        self._drafted_index = np.asarray(drafted_index, dtype=np.int64)

    # -- drafting ahead (while the target verifies) -----------------------------------------

    def extend_ahead(self, tree: TokenTree, width: int, params: SamplingParams = SamplingParams(),
                     seed: int | None = None) -> int:
        """One draft forward ahead of `tree` (the tree under verification, not
        modified), where the draft's own path leaves it at node E: first E
        (unless it ran), then its top `width` children not in the tree, then
        one rank-0 child per forward down the first of them.  Returns the nodes
        forwarded (0: nothing left, or the draft's context is full)."""
        a = self._ahead
        if a is None or a.verified is not tree:
            a = self._begin_ahead(tree, width, params, seed)
        nodes = a.frontier
        if not nodes or self._committed + int(a.tree.depth(nodes[0])) >= self.model.config.max_context:
            return 0
        logits = self._forward(a.tree, nodes)
        a.logits.update(zip(nodes, logits))
        if nodes[0] == a.node:
            a.frontier = self._ahead_children(a, logits[0], width, params, seed)
        else:
            e = self._ranked(a.tree, nodes[:1], logits[:1], 1, params, seed, False)
            a.frontier = [a.tree.add(nodes[0], int(e.tokens[0, 0]), float(e.logprobs[0, 0]))]
        return len(nodes)

    def _begin_ahead(self, tree: TokenTree, width: int, params: SamplingParams, seed: int | None) -> _AheadTree:
        """Re-key the rows by the verified tree's nodes (a subtree of the grown
        one), find where the draft's own path leaves the tree, and start there."""
        rows = self._verified_rows(tree)
        drafted = self._drafted_index if self._drafted_index is not None else np.arange(len(tree))
        offered = {i: self._offered[j] for i, j in enumerate(drafted.tolist()) if j in self._offered}
        self._rows, self._order = {}, [-1] * len(self._order)
        for i, row in enumerate(rows):
            if row >= 0:
                self._rows[i], self._order[row] = row, i
        self._tree_rows, self._drafted_index, self._offered = None, None, offered
        node = 0
        while node in offered and (child := tree.child_with_token(node, int(offered[node][0]))) >= 0:
            node = child
        a = self._ahead = _AheadTree(tree, node)
        if node not in self._rows:
            a.frontier = [node]
        elif node in offered:
            fresh = [int(t) for t in offered[node] if t >= 0 and tree.child_with_token(node, int(t)) < 0]
            a.frontier = [a.tree.add(node, t) for t in fresh[:width]]
        else:                                              # a preloaded row the tree never expanded
            a.frontier = self._ahead_children(a, self._preloaded_logits[self._rows[node]], width, params, seed)
        return a

    def _ahead_children(self, a: _AheadTree, logits: np.ndarray, width: int, params: SamplingParams,
                        seed: int | None) -> list[int]:
        """Add to the ahead tree the top `width` children of `a.node` (logits
        float32 [vocab]) that the verified tree does not have; returns them."""
        k = width + a.tree.num_children(a.node)
        e = self._ranked(a.tree, [a.node], logits[None], k, params, seed, False)
        fresh = [(int(t), float(lp)) for t, lp in zip(e.tokens[0], e.logprobs[0])
                 if a.tree.child_with_token(a.node, int(t)) < 0][:width]
        return [a.tree.add(a.node, t, lp) for t, lp in fresh]

    # -- after verification -------------------------------------------------------------

    def commit(self, tree: TokenTree, accepted: list[int], next_token: int) -> None:
        """Keep the draft rows of the root and the accepted path; the path's nodes
        that never ran through the draft (at most a suffix) become pending.  If
        the path ends at the node drafted ahead of and `next_token` is one of the
        children run ahead, that child's rows and the chain below it stay as the
        next tree's preloaded rows (see the module doc)."""
        rows = self._verified_rows(tree)
        path = [0] + list(accepted)
        keep = [rows[j] for j in path if rows[j] >= 0]
        missing = [j for j in path if rows[j] < 0]
        if missing and path[-len(missing):] != missing:
            raise RuntimeError("draft rows missing inside the accepted path")
        ahead = self._ahead_kept(tree, path[-1], next_token) if not missing else []
        if self._order:
            n = self._committed
            kept = keep + [self._rows[s] for s in ahead]
            self.cache.compact(np.concatenate([np.arange(n, dtype=np.int64), n + np.asarray(kept, dtype=np.int64)]))
        self._pending.extend(tree.token(j) for j in missing)
        self._drop_preloaded()
        if ahead:
            a = self._ahead
            below = int(a.tree.depth(ahead[0])) + 1        # path entries down to the new root
            self._preloaded_logits = [a.logits[s] for s in ahead]
            self._preloaded_keys = {tuple(a.tree.token(i) for i in a.tree.path(s)[below:]): row
                                    for row, s in enumerate(ahead)}
        self.begin_tree()

    def _verified_rows(self, tree: TokenTree) -> list[int]:
        """The draft row of each node of the verified `tree` (-1: none), a node
        the tree never expanded but drafted ahead included."""
        if self._tree_rows is not None:
            rows = list(self._tree_rows)
        else:
            rows = [self._rows.get(i, -1) for i in range(len(tree))]
        if self._preloaded_keys:
            for i, row in enumerate(rows):
                if row < 0:
                    rows[i] = self._preloaded_keys.get(_key(tree, i), -1)
        return rows

    def _ahead_kept(self, tree: TokenTree, last: int, next_token: int) -> list[int]:
        """The nodes drafted ahead that stay (the new root, then the chain below
        it, in row order) when the accepted path ends at `last` and the target
        chose `next_token`; empty unless `last` is the node drafted ahead of."""
        a = self._ahead
        if a is None or a.verified is not tree or a.node != last:
            return []
        root = a.tree.child_with_token(last, next_token)
        if root < a.first or root not in self._rows:
            return []
        return [s for s in self._order if s >= a.first and a.tree.is_ancestor(root, s)]


def _key(tree: TokenTree, node: int) -> tuple[int, ...]:
    """A node's tokens below the root (the root itself: ())."""
    return tuple(tree.token(i) for i in tree.path(node)[1:])


def _merged(nodes: list[int], parts: list[tuple[list[int], Expansion]]) -> Expansion:
    """One Expansion with a row per node of `nodes`, from the parts' rows."""
    where = {node: (e, row) for part_nodes, e in parts for row, node in enumerate(part_nodes)}
    rows = [where[node] for node in nodes]
    tokens = np.stack([e.tokens[row] for e, row in rows])
    logprobs = np.stack([e.logprobs[row] for e, row in rows])
    probs = None
    if all(e.probs is not None for _, e in parts):
        probs = np.stack([e.probs[row] for e, row in rows])
    return Expansion(tokens, logprobs, probs)
