"""Attention masks of the model protocol (numpy, no torch).

A mask is a numpy bool array [n_new, n_cached + n_new]: True where a new
token may attend to a cached row (first n_cached columns) or to a new token
(last n_new columns).  Tree masks come from `TokenTree.mask`.
"""

from __future__ import annotations

import numpy as np


def causal_mask(n_new: int, n_cached: int) -> np.ndarray:
    """Bool mask [n_new, n_cached + n_new]: every token sees the cache and the tokens before it."""
    return np.tri(n_new, n_cached + n_new, k=n_cached, dtype=bool)
