"""The drafting interface: one drafter primitive (expand tree nodes into their
top children) and the tree policies that grow a tree with it.

    policy.grow(drafter, root, params, seed, room) -> Grown     # begin_tree, expand..., [use_tree]
    verifier.verify(grown.tree, grown.draft_probs)
    drafter.commit(tree, accepted, next_token)
    policy.observe(grown, accepted, verify_s, iteration_s)

With draft ahead (lever.draft.ahead) the verification runs in a worker
thread while the drafter continues its own path where it leaves the tree
(`AheadDrafter.extend_ahead`).

Policies: lever.draft.policies (none, chain, static tree) and
lever.draft.gain_cost (the gain-cost tree of mode lever).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import numpy as np

from ..sampling import SamplingParams
from ..shapes import TreeShape  # noqa: F401  (the policies' shape, imported from here by callers)
from ..tree import TokenTree

NO_TOKEN = -1        # pads a row of `Expansion.tokens` when a node has fewer children than asked for


@dataclass
class Expansion:
    """The children a drafter offers for some tree nodes, one row per node.

    tokens: int32 [nodes, topk], rank 0 first: the draft's own choice (a model's
    argmax when greedy, its position-keyed draw under sampling; prompt lookup's
    most frequent continuation), then the rest by log-prob, largest first;
    a node with fewer children pads its row with NO_TOKEN (and -inf log-probs).
    logprobs: float32 [nodes, topk], natural log of each child's draft
    probability given its node.
    probs: float32 [nodes, vocab], the distributions the children were drawn
    from (processed by the sampling settings), only when asked for with
    `with_probs` and the drafter has them (a model); else None."""

    tokens: np.ndarray
    logprobs: np.ndarray
    probs: Optional[np.ndarray] = None


class Drafter(Protocol):
    """What every tree policy may use of a drafter, and all of it.

    Convention: the drafter has seen every committed token except the newest
    one, the *root*, which the engine hands to the policy."""

    has_probabilities: bool
    """True when `Expansion.logprobs` are a model's draft probabilities (worth
    calibrating into acceptance probabilities); False for prompt lookup, whose
    are frequencies of continuations in the text."""

    def reset(self, prompt_ids: list[int], capacity: int | None = None, pace=None) -> None:
        """Start a new sequence; the prompt's last token is the first root.
        capacity: KV rows a model drafter should allocate up front.  pace:
        None, or the lever.autoregressive.PrefillPace of a model drafter's
        prefill (the engine passes it only when it has one)."""

    @property
    def catch_up_tokens(self) -> int:
        """Committed tokens (root excluded) the drafter has not run yet: its next
        `expand` runs them first, in the same forward (0 for prompt lookup)."""

    def begin_tree(self) -> None:
        """Start a new tree (under the current root): forget the previous one's nodes."""

    def expand(self, tree: TokenTree, nodes: list[int], topk: int, params: SamplingParams = SamplingParams(),
               seed: int | None = None, with_probs: bool = False) -> Expansion:
        """The top `topk` children of each of `nodes` of `tree` (a tree begun with
        `begin_tree`, every node's ancestors expanded before it). params, seed:
        the sequence's sampling (rank 0 under sampling is the draft's
        position-keyed draw with the target's `seed`). with_probs: also return
        the full distributions, for the Leviathan rule."""

    def use_tree(self, tree: TokenTree, drafted_index: np.ndarray) -> None:
        """The tree to verify is a subtree of the grown one: its node i is grown
        node drafted_index[i] (so `commit` finds what was expanded). Without
        this call the verified tree is the grown tree itself."""

    def commit(self, tree: TokenTree, accepted: list[int], next_token: int) -> None:
        """The target accepted nodes `accepted` of `tree` and chose `next_token` (the next root)."""


class AheadDrafter(Drafter, Protocol):
    """A drafter that can draft ahead (lever.draft.ahead): while the target
    verifies a tree, continue the draft's own path where it leaves the tree
    with draft forwards of its own, and serve the next tree's expansions
    from them when the target accepts that path.  Every drafter with `has_probabilities` (a
    draft model) is one; prompt lookup has nothing to gain from it."""

    reused_ahead: int
    """Expansions (nodes) served from rows drafted ahead, over the sequence so far."""

    def extend_ahead(self, tree: TokenTree, width: int, params: SamplingParams = SamplingParams(),
                     seed: int | None = None) -> int:
        """One draft forward ahead of `tree`, the tree under verification (not
        modified; the drafter extends its own copy), at the node E where the
        draft's own path (rank-0 children from the root) leaves the tree: the
        first runs E (unless it has run), the next E's top `width` children
        that are not in the tree, each later one the rank-0 child of the node
        before.  `commit` keeps the rows below the target's next root when the
        accepted path ends at E, and the next tree's `expand` of a node drafted
        ahead costs no forward.  Returns the nodes forwarded (0: nothing left)."""


def within(depth: int, room: int | None) -> int:
    """The deepest draft node a policy may grow (tokens past the root): its own
    `depth`, capped by `room`, the draft tokens the generation can still use
    (None: no cap).  An iteration emits the accepted path plus the target's
    own token, so with r tokens left to generate a node deeper than r - 1
    can never be emitted: drafting it and verifying it is wasted work."""
    return depth if room is None else max(0, min(depth, room))


@dataclass
class Grown:
    """One tree grown by a policy, for one verification.

    tree: the draft tree under the root (node 0).
    draft_probs: for the Leviathan rule over a sampled chain, q of each drafted
    token's position (float32 [k, vocab]); else None.
    prediction: what the policy predicted of this tree, read back by its
    `observe` (the gain-cost policy's lever.draft.gain_cost.Prediction; None
    for the static policies)."""

    tree: TokenTree
    draft_probs: Optional[np.ndarray] = None
    prediction: object = None


class TreePolicy(Protocol):
    """Decides the tree of each iteration, by growing it with a drafter."""

    max_nodes: int        # draft nodes per tree at most (root excluded)
    max_depth: int        # deepest draft node

    def grow(self, drafter: Drafter | None, root: int, params: SamplingParams = SamplingParams(),
             seed: int | None = None, room: int | None = None) -> Grown:
        """A tree under `root` (drafter: None only for a policy that never drafts).
        room: draft tokens the generation can still use (max_new_tokens minus
        the tokens emitted, minus the target's own next token); no node is
        deeper (`within`).  None: no cap."""

    def observe(self, grown: Grown, accepted: list[int], verify_s: float, iteration_s: float) -> None:
        """Learn from one verification: the accepted nodes of `grown.tree`, the
        realised seconds of the target pass and of the whole iteration."""

    @property
    def observed(self) -> int:
        """Iterations observed so far (the `since` of `report`)."""

    def report(self, since: int = 0) -> dict | None:
        """What the policy learnt over the iterations from number `since` on (None: nothing)."""
