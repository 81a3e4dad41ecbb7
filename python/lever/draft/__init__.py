"""Drafters: propose token trees (or chains) for the target to verify.

Every drafter keeps its own view of the committed text under the engine's
convention: all committed tokens except the last one (the *root*, the
target's newest token) have been seen; `draft_*` is handed the root.
"""
