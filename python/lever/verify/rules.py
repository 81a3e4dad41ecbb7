"""Acceptance rules of speculative decoding, each exact in its own sense.

- `verify_greedy`: the target's argmax at each node; output identical to
  target-only greedy decoding.
- `verify_sampling_walk`: sample y ~ p_v (the target's processed
  distribution) at each visited node, descend while y is a child.  Every
  emitted token is a draw from the target given the tokens before it, so
  the output has exactly the target's distribution -- for any tree.
- `verify_chain_leviathan`: the conventional rule for a chain drafted by
  sampling from q: accept x with probability min(1, p(x)/q(x)), on rejection
  draw from norm(max(0, p - q)); exact when q is the distribution the chain
  was drawn from.

Logits are float32 [n_nodes, vocab] in the tree's node order.  Each rule
returns (accepted node indices, next token).
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams, processed_probs
from ..tree import TokenTree


def verify_greedy(tree: TokenTree, logits: torch.Tensor) -> tuple[list[int], int]:
    return tree.walk(logits.argmax(-1).numpy())


def verify_sampling_walk(tree: TokenTree, logits: torch.Tensor, params: SamplingParams,
                         generator: torch.Generator) -> tuple[list[int], int]:
    accepted, node = [], 0
    while True:
        y = int(torch.multinomial(processed_probs(logits[node], params), 1, generator=generator))
        child = tree.child_with_token(node, y)
        if child < 0:
            return accepted, y
        accepted.append(child)
        node = child


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
