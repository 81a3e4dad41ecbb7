"""Drafters and the tree policies that grow draft trees with them.

A drafter (lever.draft.base.Drafter: a draft model, or prompt lookup) offers
one primitive, `expand`: the top children of some tree nodes with their
log-probs.  A tree policy (none, chain, static tree: lever.draft.policies;
gain-cost: lever.draft.gain_cost) decides which nodes to expand and which
tree to verify.  Every drafter keeps its own view of the committed text under
the engine's convention: all committed tokens except the last one (the
*root*, the target's newest token) have been seen; the policy is handed the root.
"""
