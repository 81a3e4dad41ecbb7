"""Acceptance rules of speculative decoding, each exact in its own sense.

- `verify_greedy`: the target's argmax at each node; output identical to
  target-only greedy decoding.
- `verify_position_draws`: the sampling rule of every mode.  At each
  visited node the target's token is drawn with the position-keyed
  Gumbel-max draw of lever.sampling.sample_at; descend while it is a child.
  Every emitted token is the very token plain sampling with the same seed
  draws at that position, so the output has exactly the target's
  distribution -- for any tree -- and equals plain decoding's text.
- `verify_chain_leviathan`: the conventional rule for a chain drafted by
  sampling from q: accept x with probability min(1, p(x)/q(x)), on rejection
  draw from norm(max(0, p - q)); exact in distribution when q is the
  distribution the chain was drawn from, but its draws depend on the draft,
  so it does not reproduce plain sampling's text.  Kept as the baseline of
  conventional speculative decoding (`SpecConfig(rule="leviathan")`).

Inputs are numpy: the target's argmax ids int64 [n_nodes] (greedy: the
target's forward ran with head="argmax", so no [n_nodes, vocab] logits
exist) or its logits float32 [n_nodes, vocab], in the tree's node order.
Each rule returns (accepted node indices, next token).
"""

from __future__ import annotations

import numpy as np

from ..sampling import SamplingParams, processed_probs, sample_at
from ..tree import TokenTree


def verify_greedy(tree: TokenTree, target_tokens: np.ndarray) -> tuple[list[int], int]:
    """The greedy walk given the target's argmax id at each node (int64 [n_nodes])."""
    return tree.walk(np.asarray(target_tokens, dtype=np.int64))


def verify_position_draws(tree: TokenTree, logits: np.ndarray, params: SamplingParams, seed: int,
                          root_position: int) -> tuple[list[int], int]:
    """Walk from the root: at node v draw the target's token at its position
    (`sample_at`, keyed by (seed, root_position + depth(v) + 1)) and descend
    while the draw is a child of v."""
    accepted, node, depth = [], 0, 0
    while True:
        y = sample_at(logits[node], params, seed, root_position + depth + 1)
        child = tree.child_with_token(node, y)
        if child < 0:
            return accepted, y
        accepted.append(child)
        node, depth = child, depth + 1


def verify_chain_leviathan(tree: TokenTree, logits: np.ndarray, draft_probs: np.ndarray,
                           params: SamplingParams, rng: np.random.Generator) -> tuple[list[int], int]:
    """`tree` is a chain 0 -> 1 -> ... -> k whose node i+1 was drawn from
    draft_probs[i] (float32 [k, vocab]); rng: the round's generator."""
    accepted = []
    for i in range(len(tree) - 1):
        x = tree.token(i + 1)
        p = processed_probs(logits[i], params)
        q = np.asarray(draft_probs[i], dtype=np.float32)
        if rng.random() * float(q[x]) < float(p[x]):            # u < p/q, q[x] > 0
            accepted.append(i + 1)
            continue
        residual = np.maximum(p - q, 0)
        total = float(residual.sum(dtype=np.float64))
        return accepted, draw(residual if total > 0 else p, rng)
    return accepted, draw(processed_probs(logits[len(tree) - 1], params), rng)


def draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    """A token drawn with probability proportional to `weights` [vocab] (>= 0,
    not all zero): the first index whose cumulative weight exceeds u * total,
    so a zero-weight token is never drawn."""
    cumulative = np.cumsum(weights, dtype=np.float64)
    i = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return i if i < len(cumulative) else int(np.flatnonzero(weights)[-1])    # u * total rounded up to total
