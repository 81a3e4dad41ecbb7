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

Logits are float32 [n_nodes, vocab] in the tree's node order.  Each rule
returns (accepted node indices, next token).
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams, processed_probs, sample_at
from ..tree import TokenTree


def verify_greedy(tree: TokenTree, logits: torch.Tensor) -> tuple[list[int], int]:
    return tree.walk(logits.argmax(-1).numpy())


def verify_position_draws(tree: TokenTree, logits: torch.Tensor, params: SamplingParams, seed: int,
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


def verify_chain_leviathan(tree: TokenTree, logits: torch.Tensor, draft_probs: torch.Tensor,
                           params: SamplingParams, generator: torch.Generator) -> tuple[list[int], int]:
    """`tree` is a chain 0 -> 1 -> ... -> k whose node i+1 was drawn from draft_probs[i]."""
    accepted = []
    for i in range(len(tree) - 1):
        x = tree.token(i + 1)
        p = processed_probs(logits[i], params)
        q = draft_probs[i]
        if float(torch.rand((), generator=generator)) * float(q[x]) < float(p[x]):   # u < p/q, q[x] > 0
            accepted.append(i + 1)
            continue
        residual = (p - q).clamp_min(0)
        total = float(residual.sum())
        dist = residual / total if total > 0 else p
        return accepted, int(torch.multinomial(dist, 1, generator=generator))
    last = len(tree) - 1
    return accepted, int(torch.multinomial(processed_probs(logits[last], params), 1, generator=generator))
