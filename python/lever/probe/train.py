"""Training early-exit probes on recorded traces (numpy only).

A probe is a logistic model of P(match) -- the target's argmax at a node's
parent is the node's token -- over FEATURES (lever.probe.features), one per
candidate layer; the baseline uses the draft features alone (draft_logp,
sibling_rank, depth: what the tree policy already knows).  Fitting
standardises the features, runs Newton's method (IRLS) with an L2 penalty on
the slopes, and folds the standardisation back into raw-feature weights, so
every model is a weight vector [1 + len(FEATURES)] (unused features 0).

The split is by prompt: prompts whose index is HELD_OUT_EVERY - 1 modulo
HELD_OUT_EVERY are held out (the corpus alternates code, math, prose, so
the held-out part holds all three).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import LeverError
from .features import DRAFT_FEATURES, FEATURES, N_FEATURES, group_margin
from .traces import Traces

HELD_OUT_EVERY = 4
L2 = 1e-2
BASELINE = "draft"


@dataclass
class Fitted:
    """One trained scorer: name ("layer 14" or BASELINE), its layer (None for the
    baseline) and raw-feature weights float64 [1 + len(FEATURES)]."""

    name: str
    layer: int | None
    weights: np.ndarray

    def logits(self, x: np.ndarray) -> np.ndarray:
        return self.weights[0] + np.asarray(x, dtype=np.float64) @ self.weights[1:]


def split_prompts(prompt_index: np.ndarray, every: int = HELD_OUT_EVERY) -> np.ndarray:
    """bool [m]: True where the entry's prompt is held out (index % every == every - 1).
    With fewer than `every` prompts, the last prompt is held out."""
    prompt_index = np.asarray(prompt_index, dtype=np.int64)
    n_prompts = int(prompt_index.max()) + 1 if prompt_index.size else 0
    if n_prompts < 2:
        raise LeverError(f"training a probe needs traces of at least 2 prompts (one held out), got {n_prompts}")
    if n_prompts < every:
        return prompt_index == n_prompts - 1
    return prompt_index % every == every - 1


def feature_matrix(traces: Traces, layer_slot: int | None) -> np.ndarray:
    """float64 [N, len(FEATURES)] of every traced node; layer_slot: the index of a
    recorded layer for the lens columns (None: zeros, the baseline's matrix)."""
    n = traces.nodes
    x = np.zeros((traces.n_nodes, N_FEATURES), dtype=np.float64)
    if layer_slot is not None:
        lens = n["lens"][:, layer_slot].astype(np.float64)
        groups = n["tree"].astype(np.int64) * 1024 + n["parent"].astype(np.int64)
        x[:, 0] = lens
        x[:, 1] = group_margin(lens, groups)
    x[:, 2] = n["draft_logp"]
    x[:, 3] = n["rank"]
    x[:, 4] = n["depth"]
    return x


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = L2, iters: int = 50, tol: float = 1e-9) -> np.ndarray:
    """Weights [1 + d] (intercept first) of a logistic regression of y (bool [m])
    on x (float [m, d]) in x's raw space.  Columns are standardised for the fit
    (a constant column gets weight 0); l2 penalises the standardised slopes
    (per example: the penalty is l2 * m / 2 * |w|^2)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    m, d = x.shape
    if m == 0:
        raise LeverError("no training examples")
    mu, sd = x.mean(axis=0), x.std(axis=0)
    live = sd > 1e-12
    z = np.zeros_like(x)
    z[:, live] = (x[:, live] - mu[live]) / sd[live]
    a = np.hstack([np.ones((m, 1)), z])
    w = np.zeros(d + 1)
    p_mean = min(max(y.mean(), 1e-6), 1 - 1e-6)
    w[0] = np.log(p_mean / (1 - p_mean))
    penalty = np.full(d + 1, l2 * m)
    penalty[0] = 0.0
    penalty[1:][~live] = 1.0 + l2 * m          # pins the weight of a constant column at 0
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-np.clip(a @ w, -40, 40)))
        grad = a.T @ (p - y) + penalty * w
        h = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty + 1e-9)
        step = np.linalg.solve(h, grad)
        w -= step
        if np.max(np.abs(step)) < tol:
            break
    raw = np.zeros(d + 1)
    raw[1:][live] = w[1:][live] / sd[live]
    raw[0] = w[0] - np.sum(raw[1:] * mu)
    return raw


def train_scorers(traces: Traces, train_mask: np.ndarray, l2: float = L2) -> list[Fitted]:
    """The baseline and one probe per recorded layer, fitted on the nodes of `train_mask`."""
    y = traces.nodes["match"].astype(bool)[train_mask]
    draft_cols = [FEATURES.index(f) for f in DRAFT_FEATURES]
    x0 = feature_matrix(traces, None)[train_mask][:, draft_cols]
    w0 = fit_logistic(x0, y, l2)
    weights = np.zeros(N_FEATURES + 1)
    weights[0] = w0[0]
    weights[1 + np.array(draft_cols)] = w0[1:]
    out = [Fitted(BASELINE, None, weights)]
    for slot, layer in enumerate(traces.layers):
        x = feature_matrix(traces, slot)[train_mask]
        out.append(Fitted(f"layer {layer}", int(layer), fit_logistic(x, y, l2)))
    return out
