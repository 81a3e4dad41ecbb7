"""The early-exit probe's features of a draft tree node (numpy reference).

For node j >= 1 of a tree (lever.tree.TokenTree) whose parent's hidden state
after decoder layer k is h (float32 [hidden]):

- ``lens``: the logit lens on j's own token, dot(rms_norm(h) * norm_w, e_j),
  with norm_w the target's final norm weight and e_j the output head's row of
  j's token (the embedding row of a tied model), dequantised: n dot products,
  never a full-vocabulary head;
- ``lens_margin``: lens - the largest lens among j's siblings (j included),
  so 0 for the sibling the lens likes best and negative for the others;
- ``draft_logp``: the draft's log-probability of j given its parent
  (``tree.logprob(j)``, natural log);
- ``sibling_rank``: j's rank among its siblings by draft log-probability
  (0 = best, ties to the lower index);
- ``depth``: ``tree.depth(j)`` (1 for a child of the root).

The native scorer (`lever._native.probe_scores`, used by lever.probe.prune)
computes the same numbers; these functions are its reference.
Features come as float64 [n - 1, len(FEATURES)], row i = node i + 1.
"""

from __future__ import annotations

import numpy as np

from ..quant import block_size, dequantize, type_size

FEATURES = ("lens", "lens_margin", "draft_logp", "sibling_rank", "depth")
N_FEATURES = len(FEATURES)
DRAFT_FEATURES = ("draft_logp", "sibling_rank", "depth")     # the draft-probability-only baseline


def sibling_groups(tree) -> np.ndarray:
    """int64 [n]: the sibling group of each node, its parent's index (-1 for the root)."""
    return np.asarray(tree.parents(), dtype=np.int64)


def group_ranks(groups: np.ndarray, logp: np.ndarray) -> np.ndarray:
    """int64 [m]: each entry's rank within its group by `logp` (0 = largest; ties
    to the lower position)."""
    groups = np.asarray(groups, dtype=np.int64)
    m = groups.shape[0]
    if m == 0:
        return np.zeros(0, dtype=np.int64)
    pos = np.arange(m)
    order = np.lexsort((pos, -np.asarray(logp, dtype=np.float64), groups))
    g = groups[order]
    starts = np.r_[True, g[1:] != g[:-1]]
    first = np.maximum.accumulate(np.where(starts, pos, 0))
    ranks = np.empty(m, dtype=np.int64)
    ranks[order] = pos - first
    return ranks


def sibling_ranks(tree) -> np.ndarray:
    """int64 [n]: each node's rank among its siblings by draft log-probability
    (0 = best, ties to the lower index); 0 for the root."""
    ranks = np.zeros(len(tree), dtype=np.int64)
    ranks[1:] = group_ranks(sibling_groups(tree)[1:], np.asarray(tree.logprobs())[1:])
    return ranks


def group_margin(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """values - the largest value of each entry's group (float64 [m])."""
    values = np.asarray(values, dtype=np.float64)
    groups = np.asarray(groups, dtype=np.int64)
    if values.size == 0:
        return values.copy()
    uniq, inverse = np.unique(groups, return_inverse=True)
    best = np.full(uniq.size, -np.inf)
    np.maximum.at(best, inverse, values)
    return values - best[inverse]


def node_features(tree, lens: np.ndarray) -> np.ndarray:
    """float64 [n - 1, 5] (FEATURES) of nodes 1..n-1; lens: float [n - 1], node j's lens at row j - 1."""
    n = len(tree)
    lens = np.asarray(lens, dtype=np.float64).reshape(-1)
    if lens.shape[0] != n - 1:
        raise ValueError(f"lens has {lens.shape[0]} entries for a tree of {n - 1} draft nodes")
    out = np.empty((n - 1, N_FEATURES), dtype=np.float64)
    out[:, 0] = lens
    out[:, 1] = group_margin(lens, sibling_groups(tree)[1:])
    out[:, 2] = np.asarray(tree.logprobs(), dtype=np.float64)[1:]
    out[:, 3] = sibling_ranks(tree)[1:]
    out[:, 4] = np.asarray(tree.depths(), dtype=np.float64)[1:]
    return out


def rms_norm(h: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    """float32 [m, H]: h / sqrt(mean(h^2) + eps) * norm_w (row-wise; float64 inside)."""
    h = np.asarray(h, dtype=np.float64)
    scale = 1.0 / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + float(eps))
    return (h * scale * np.asarray(norm_w, dtype=np.float64)).astype(np.float32)


def lens_scores(hidden_parent: np.ndarray, rows: np.ndarray, norm_w: np.ndarray, eps: float) -> np.ndarray:
    """float32 [m]: dot(rms_norm(hidden_parent[i]) * norm_w, rows[i]) for each i.
    hidden_parent: float32 [m, H], the parent's hidden state of each node;
    rows: float32 [m, H], the dequantised head rows of the nodes' tokens."""
    h = np.atleast_2d(np.asarray(hidden_parent, dtype=np.float32))
    rows = np.atleast_2d(np.asarray(rows, dtype=np.float32))
    if h.shape != rows.shape:
        raise ValueError(f"hidden states {h.shape} and head rows {rows.shape} differ in shape")
    normed = rms_norm(h, norm_w, eps).astype(np.float64)
    return np.einsum("ij,ij->i", normed, rows.astype(np.float64)).astype(np.float32)


def head_rows(weights, tokens: np.ndarray) -> np.ndarray:
    """float32 [m, H]: the output head's rows of `tokens`, dequantised, from a
    weight source with `head_rows(ids) -> (uint8 rows as stored, ggml type)`
    (lever.model.native_loader.ResidentWeights, lever.model.streamed_decoder.StreamedWeights)."""
    ids = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1)
    raw, qtype = weights.head_rows(ids)
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(len(ids), -1)
    if len(ids) == 0:
        return np.zeros((0, 0), dtype=np.float32)
    return dequantize(raw.reshape(-1), qtype, _elements(raw, qtype)).reshape(len(ids), -1)


def _elements(raw: np.ndarray, qtype: int) -> tuple[int]:
    """The element count the bytes of `raw` encode as `qtype`, as a 1-D shape."""
    return (raw.size // type_size(qtype) * block_size(qtype),)
