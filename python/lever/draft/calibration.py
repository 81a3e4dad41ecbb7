"""Calibrated acceptance: P(node accepted | parent accepted) for draft tree nodes.

A draft node has three features: its draft probability q (given its parent),
its depth (1 = a child of the root) and its rank among its draft siblings
(0 = the draft's own choice).  The raw estimate is q itself; calibration
learns, from verification outcomes, how far the acceptance of a kind of node
is from its q and moves the estimate by that much -- only with evidence, and
only where the move has paid off so far.

Rule (every sum runs over the trials learnt so far; a trial is one child of
an accepted node, the root included, accepted or not):

* bias of a q bin:   b_bin  = (accepted - sum q) / (trials + S)
  bias of a cell:    b_cell = (accepted - sum q + S * b_bin) / (trials + S)
  (cell = q bin x depth bucket x rank bucket; S pseudo-observations shrink a
  cell towards its q bin and a q bin towards no correction at all), giving
  the candidates  p_bin = clip(q + b_bin)  and  p_cell = clip(q + b_cell).
* guard: each q bin and each cell keeps the online track record of its
  candidate against the raw q: the log-likelihood ratio
  sum log P_p(y) - log P_q(y) over its past trials (nats), each candidate
  evaluated *before* that trial was learnt.  The estimate is p_bin where
  the bin's record exceeds LOG_EVIDENCE, refined to p_cell where the cell's
  record does too, else q.  While q is right, the exponential of a record is a likelihood
  ratio with mean 1, so a given bin or cell ever reaches e^LOG_EVIDENCE =
  1000 with probability at most about 1/1000 (Ville's inequality): a
  calibrated draft keeps its raw q.

So a cold calibration predicts exactly q, and a cell leaves q only after the
correction has beaten q on that cell's (or bin's) own past outcomes; a
correction that stops paying (another domain, another user) loses its record
and the estimate falls back to q.  A shipped table (lever.mode_lever) starts a
user with such a calibration learnt offline, its counts capped and its
records clamped (`as_prior`) so that the user's own observations refine it
quickly and turn a correction off that does not pay for them.

`child_accept(depth, rank)` is what an expansion is predicted to add before
the draft has run: the mean observed acceptance of a rank-r child at a
depth, shrunk to CHILD_PRIOR (a typical acceptance of the draft's rank-r
choice), so that a cold start still expands the draft's top choices; it
never enters the ECE, which is about the estimates of drafted nodes.

Calibration error is the expected calibration error (ECE, 10 equal-width
bins of the prediction) of the estimates made *before* each outcome was
learnt, next to the ECE of the raw draft probability q over the same
trials, so the report shows what calibration bought.
"""

from __future__ import annotations

import numpy as np

Q_EDGES = np.array([0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0 + 1e-9])
MAX_DEPTH_BUCKET = 6          # depths >= 6 share a bucket
MAX_RANK_BUCKET = 3           # ranks >= 3 share a bucket
SHRINK = 8.0                  # pseudo-observations towards the coarser estimate
CHILD_PRIOR = (0.55, 0.12, 0.05, 0.03, 0.02, 0.01, 0.01, 0.01)   # rank-r child acceptance before data
LOG_EVIDENCE = float(np.log(1000.0))   # nats of likelihood ratio over q before a correction is used
PRIOR_EVIDENCE = 1.5 * LOG_EVIDENCE     # the most record a shipped table passes on (as_prior)
LL_FLOOR = 1e-4               # probabilities in the log-likelihood are kept in [LL_FLOOR, 1 - LL_FLOOR]
ECE_BINS = 10
_CHILD_PRIOR = np.array(CHILD_PRIOR)
VERSION = 2


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
        self.q_sum = np.zeros(nq)                     # sum of q per q bin
        self.q_trials = np.zeros(nq)
        self.q_accepted = np.zeros(nq)
        self.q_evidence = np.zeros(nq)                # track record of p_bin over q (log-likelihood ratio)
        self.cell_q_sum = np.zeros((nq, nd, nr))
        self.cell_trials = np.zeros((nq, nd, nr))
        self.cell_accepted = np.zeros((nq, nd, nr))
        self.cell_evidence = np.zeros((nq, nd, nr))   # track record of p_cell over q
        n_ranks = len(CHILD_PRIOR)
        self.child_trials = np.zeros((nd, n_ranks))
        self.child_accepted = np.zeros((nd, n_ranks))
        self.ece_calibrated = np.zeros((ECE_BINS, 3))  # per prediction bin: count, sum pred, sum outcome
        self.ece_raw = np.zeros((ECE_BINS, 3))

    # -- prediction ---------------------------------------------------------------

    def _candidates(self, q, depth, rank):
        """q clipped, its (q bin, depth, rank) indices and the candidates p_bin, p_cell."""
        q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0)
        depth, rank = np.asarray(depth), np.asarray(rank)
        qb, db, rb = _q_bin(q), _depth_bucket(depth), _rank_bucket(rank)
        cell = (qb, db, rb)
        b_bin = (self.q_accepted[qb] - self.q_sum[qb]) / (self.q_trials[qb] + SHRINK)
        b_cell = ((self.cell_accepted[cell] - self.cell_q_sum[cell] + SHRINK * b_bin)
                  / (self.cell_trials[cell] + SHRINK))
        return q, qb, cell, np.clip(q + b_bin, 0.0, 1.0), np.clip(q + b_cell, 0.0, 1.0)

    def predict(self, q, depth, rank) -> np.ndarray:
        """Calibrated P(accepted | parent accepted), float64 like `q`.
        q: draft probabilities in [0, 1]; depth >= 1; rank >= 0 (arrays or scalars)."""
        q, qb, cell, p_bin, p_cell = self._candidates(q, depth, rank)
        use_bin = self.q_evidence[qb] > LOG_EVIDENCE
        use_cell = use_bin & (self.cell_evidence[cell] > LOG_EVIDENCE)
        return np.where(use_cell, p_cell, np.where(use_bin, p_bin, q))

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
        (given its parent was). The ECE counters and the guards' track records
        see the predictions made before this update."""
        q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0).ravel()
        depth, rank = np.asarray(depth).ravel(), np.asarray(rank).ravel()
        outcome = np.asarray(accepted, dtype=np.float64).ravel()
        if q.size == 0:
            return
        _add_ece(self.ece_calibrated, self.predict(q, depth, rank), outcome)
        _add_ece(self.ece_raw, q, outcome)
        q, qb, cell, p_bin, p_cell = self._candidates(q, depth, rank)
        raw = _log_likelihood(q, outcome)
        np.add.at(self.q_evidence, qb, _log_likelihood(p_bin, outcome) - raw)
        np.add.at(self.cell_evidence, cell, _log_likelihood(p_cell, outcome) - raw)
        np.add.at(self.q_trials, qb, 1.0)
        np.add.at(self.q_accepted, qb, outcome)
        np.add.at(self.q_sum, qb, q)
        np.add.at(self.cell_trials, cell, 1.0)
        np.add.at(self.cell_accepted, cell, outcome)
        np.add.at(self.cell_q_sum, cell, q)
        db = cell[1]
        ranked = rank < self.child_trials.shape[1]
        np.add.at(self.child_trials, (db[ranked], rank[ranked]), 1.0)
        np.add.at(self.child_accepted, (db[ranked], rank[ranked]), outcome[ranked])

    @property
    def observations(self) -> int:
        return int(round(self.q_trials.sum()))

    def calibration_error(self) -> dict:
        """ECE of the online calibrated predictions and of the raw draft probability."""
        return {"observations": self.observations,
                "ece_calibrated": _ece(self.ece_calibrated), "ece_draft_prob": _ece(self.ece_raw)}

    def as_prior(self, max_trials: float) -> "AcceptanceCalibration":
        """A copy to start a user from (a shipped table): the same estimates and
        guards, but every q bin, cell and child counter scaled down to at most
        `max_trials` trials, so that as many of the user's own trials weigh as
        much as the table; the guards' records clamped to PRIOR_EVIDENCE (a few
        trials against a correction turn it off); the ECE counters start empty
        (they report the user's run)."""
        cal = AcceptanceCalibration()
        for trials, fields in _COUNTERS:
            n = getattr(self, trials)
            scale = np.minimum(1.0, max_trials / np.maximum(n, 1e-300))
            for name in fields:
                setattr(cal, name, getattr(self, name) * scale)
        cal.q_evidence = np.minimum(self.q_evidence, PRIOR_EVIDENCE)
        cal.cell_evidence = np.minimum(self.cell_evidence, PRIOR_EVIDENCE)
        return cal

    # -- persistence ----------------------------------------------------------------

    def to_json(self) -> dict:
        return {"version": VERSION, "q_edges": Q_EDGES.tolist(),
                **{name: getattr(self, name).tolist() for name in _ARRAYS}}

    @classmethod
    def from_json(cls, data: dict) -> "AcceptanceCalibration":
        """Raises ValueError if `data` is not a calibration of this layout."""
        cal = cls()
        if not isinstance(data, dict) or data.get("version") != VERSION or data.get("q_edges") != Q_EDGES.tolist():
            raise ValueError("calibration of another version or layout")
        for name in _ARRAYS:
            arr = np.asarray(data[name], dtype=np.float64)
            signed = name in _SIGNED
            if (arr.shape != getattr(cal, name).shape or not np.all(np.isfinite(arr))
                    or (not signed and (arr < 0).any())):
                raise ValueError(f"calibration field {name} is malformed")
            setattr(cal, name, arr)
        return cal


# counters that scale together (as_prior): the trials field first
_COUNTERS = (("q_trials", ("q_trials", "q_accepted", "q_sum")),
             ("cell_trials", ("cell_trials", "cell_accepted", "cell_q_sum")),
             ("child_trials", ("child_trials", "child_accepted")))
_ARRAYS = ("q_sum", "q_trials", "q_accepted", "q_evidence", "cell_q_sum", "cell_trials", "cell_accepted",
           "cell_evidence", "child_trials", "child_accepted", "ece_calibrated", "ece_raw")
_SIGNED = ("q_evidence", "cell_evidence")


def _log_likelihood(p: np.ndarray, outcome: np.ndarray) -> np.ndarray:
    """log P(outcome) under acceptance probability p (nats; p kept off 0 and 1)."""
    p = np.clip(p, LL_FLOOR, 1.0 - LL_FLOOR)
    return np.where(outcome > 0.5, np.log(p), np.log1p(-p))


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
