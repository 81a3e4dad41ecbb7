"""Masked attention by the native core: each query row computed on its own.

`attend` replaces torch's scaled_dot_product_attention in the decoder.  A
row's output depends only on its query and the keys/values its mask lets it
see (visited in order, masked ones skipped), never on how many other rows are
in the pass.  With the row-independent quantised matmuls this makes a
verification pass over a token tree give each token exactly the logits it
would get if the target decoded it alone, which is what lets speculative
decoding reproduce the target's greedy output token for token.
"""

from __future__ import annotations

import math

import torch

from .. import _native
from .linear import numpy_view


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           scale: float | None = None) -> torch.Tensor:
    """softmax(scale * q k^T, masked) v for q [heads, T, d], k/v [kv_heads, L, d]
    (kv_heads divides heads) and a bool mask [T, L]; scale: what the queries
    are multiplied by (default 1 / sqrt(d)).  Returns [T, heads * d] in q's dtype."""
    heads, t, d = q.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty(t, heads * d, dtype=q.dtype)
    _native.attention(numpy_view(q), numpy_view(k), numpy_view(v), mask.contiguous().numpy(),
                      1.0 / math.sqrt(d) if scale is None else float(scale), numpy_view(out))
    return out
