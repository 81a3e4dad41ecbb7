"""Calibrated acceptance: P(node accepted | parent accepted) for draft tree nodes.

A draft node has three features: its draft probability q (given its parent),
its depth (1 = a child of the root) and its rank among its draft siblings
(0 = the draft's top token).  The estimate is a table over
(q bin, depth bucket, rank bucket), each cell shrunk towards a coarser one:

    cell estimate  = (accepted + S * q-bin estimate) / (trials + S)
    q-bin estimate = (accepted + S * prior(q))       / (trials + S)

with S pseudo-observations and prior(q, rank) = (q + CHILD_PRIOR[rank]) / 2:
half a perfectly calibrated draft, half a typical acceptance of the draft's
rank-r choice.  The second half keeps the top choices worth trying when the
draft is unsure but right (a draft that is wrong there learns it within a
few iterations); without it a tree that is never drafted never learns.
It starts from the prior and learns online from verification outcomes: every
child of a node the target accepted (the root included) is one trial,
accepted or not.

`child_accept(depth, rank)` is what an expansion is predicted to add before
the draft has run: the mean observed acceptance of a rank-r child at a depth,
shrunk to a prior table.

Calibration error is the expected calibration error (ECE, 10 equal-width
bins of the prediction) of the predictions made *before* each outcome was
learnt, next to the ECE of the raw draft probability q, so the report shows
what calibration bought.
"""

from __future__ import annotations

import numpy as np

Q_EDGES = np.array([0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0 + 1e-9])
MAX_DEPTH_BUCKET = 6          # depths >= 6 share a bucket
MAX_RANK_BUCKET = 3           # ranks >= 3 share a bucket
SHRINK = 8.0                  # pseudo-observations towards the coarser estimate
CHILD_PRIOR = (0.55, 0.12, 0.05, 0.03, 0.02, 0.01, 0.01, 0.01)   # rank-r child acceptance before data
ECE_BINS = 10
_CHILD_PRIOR = np.array(CHILD_PRIOR)
VERSION = 1


def _q_bin(q: np.ndarray) -> np.ndarray:
    return np.clip(np.searchsorted(Q_EDGES, q, side="right") - 1, 0, len(Q_EDGES) - 2)


def _depth_bucket(depth: np.ndarray) -> np.ndarray:
    return np.clip(depth, 1, MAX_DEPTH_BUCKET) - 1


def _rank_bucket(rank: np.ndarray) -> np.ndarray:
    return np.clip(rank, 0, MAX_RANK_BUCKET)


class AcceptanceCalibration:
    """Online-calibrated acceptance probabilities (see module doc)."""

    def __init__(self):
        nq, nd, nr = len(Q_EDGES) - 1, MAX_DEPTH_BUCKET, MAX_RANK_BUCKET + 1
        self.q_sum = np.zeros(nq)                     # sum of q per q bin (for the prior)
        self.q_trials = np.zeros(nq)
        self.q_accepted = np.zeros(nq)
        self.cell_trials = np.zeros((nq, nd, nr))
        self.cell_accepted = np.zeros((nq, nd, nr))
        n_ranks = len(CHILD_PRIOR)
        self.child_trials = np.zeros((nd, n_ranks))
        self.child_accepted = np.zeros((nd, n_ranks))
        self.ece_calibrated = np.zeros((ECE_BINS, 3))  # per prediction bin: count, sum pred, sum outcome
        self.ece_raw = np.zeros((ECE_BINS, 3))

    # -- prediction ---------------------------------------------------------------

    def predict(self, q, depth, rank) -> np.ndarray:
        """Calibrated P(accepted | parent accepted), float64 like `q`.
        q: draft probabilities in [0, 1]; depth >= 1; rank >= 0 (arrays or scalars)."""
        q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0)
        depth, rank = np.asarray(depth), np.asarray(rank)
        qb, db, rb = _q_bin(q), _depth_bucket(depth), _rank_bucket(rank)
        prior = 0.5 * (q + _CHILD_PRIOR[np.minimum(rank, len(_CHILD_PRIOR) - 1)])
        coarse = (self.q_accepted[qb] + SHRINK * prior) / (self.q_trials[qb] + SHRINK)
        return (self.cell_accepted[qb, db, rb] + SHRINK * coarse) / (self.cell_trials[qb, db, rb] + SHRINK)

    def child_accept(self, max_depth: int, width: int) -> list[list[float]]:
        """[depth-1][rank]: predicted acceptance of a node's rank-r child at each
        depth 1..max_depth, before the draft has proposed it."""
        prior = np.array([CHILD_PRIOR[min(r, len(CHILD_PRIOR) - 1)] for r in range(width)])
        rows = []
        for d in range(1, max_depth + 1):
            db = min(d, MAX_DEPTH_BUCKET) - 1
            w = min(width, len(CHILD_PRIOR))
            est = prior.copy()
            est[:w] = (self.child_accepted[db, :w] + SHRINK * prior[:w]) / (self.child_trials[db, :w] + SHRINK)
            rows.append(est.tolist())
        return rows

    # -- learning -------------------------------------------------------------------

    def update(self, q, depth, rank, accepted) -> None:
        """Learn from trials: node features and whether each node was accepted
        (given its parent was). The ECE counters see the prediction first."""
        q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0).ravel()
        depth, rank = np.asarray(depth).ravel(), np.asarray(rank).ravel()
        outcome = np.asarray(accepted, dtype=np.float64).ravel()
        if q.size == 0:
            return
        _add_ece(self.ece_calibrated, self.predict(q, depth, rank), outcome)
        _add_ece(self.ece_raw, q, outcome)
        qb, db, rb = _q_bin(q), _depth_bucket(depth), _rank_bucket(rank)
        np.add.at(self.q_trials, qb, 1.0)
        np.add.at(self.q_accepted, qb, outcome)
        np.add.at(self.q_sum, qb, q)
        np.add.at(self.cell_trials, (qb, db, rb), 1.0)
        np.add.at(self.cell_accepted, (qb, db, rb), outcome)
        ranked = rank < self.child_trials.shape[1]
        np.add.at(self.child_trials, (db[ranked], rank[ranked]), 1.0)
        np.add.at(self.child_accepted, (db[ranked], rank[ranked]), outcome[ranked])

    @property
    def observations(self) -> int:
        return int(self.q_trials.sum())

    def calibration_error(self) -> dict:
        """ECE of the online calibrated predictions and of the raw draft probability."""
        return {"observations": self.observations,
                "ece_calibrated": _ece(self.ece_calibrated), "ece_draft_prob": _ece(self.ece_raw)}

    # -- persistence ----------------------------------------------------------------

    def to_json(self) -> dict:
        return {"version": VERSION, "q_edges": Q_EDGES.tolist(),
                **{name: getattr(self, name).tolist() for name in _ARRAYS}}

    @classmethod
    def from_json(cls, data: dict) -> "AcceptanceCalibration":
        """Raises ValueError if `data` is not a calibration of this layout."""
        cal = cls()
        if data.get("version") != VERSION or data.get("q_edges") != Q_EDGES.tolist():
            raise ValueError("calibration of another version or layout")
        for name in _ARRAYS:
            arr = np.asarray(data[name], dtype=np.float64)
            if arr.shape != getattr(cal, name).shape or not np.all(np.isfinite(arr)) or (arr < 0).any():
                raise ValueError(f"calibration field {name} is malformed")
            setattr(cal, name, arr)
        return cal


_ARRAYS = ("q_sum", "q_trials", "q_accepted", "cell_trials", "cell_accepted", "child_trials",
           "child_accepted", "ece_calibrated", "ece_raw")


def _add_ece(table: np.ndarray, pred: np.ndarray, outcome: np.ndarray) -> None:
    b = np.clip((pred * ECE_BINS).astype(int), 0, ECE_BINS - 1)
    np.add.at(table[:, 0], b, 1.0)
    np.add.at(table[:, 1], b, pred)
    np.add.at(table[:, 2], b, outcome)


def _ece(table: np.ndarray) -> float | None:
    n = table[:, 0].sum()
    if n == 0:
        return None
    used = table[:, 0] > 0
    gap = np.abs(table[used, 1] - table[used, 2])     # |sum pred - sum outcome| per bin
    return float(gap.sum() / n)
