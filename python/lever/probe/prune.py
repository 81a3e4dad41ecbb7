"""Early-exit pruning during verification: `ProbePruner`, the pass hook that
scores every draft node after layer k and drops the unlikely ones (with their
subtrees) from layers k+1..L.

After layer `probe.layer` of a tree pass, the native core scores each draft
node j from its parent's hidden state h (`_native.probe_scores`): the lens
score -- j's row of the output head dotted with the final-normed h, n dot
products, never a full-vocabulary head -- its margin to its best sibling,
and the draft's own log-probability, sibling rank and depth, combined by the
probe's logistic weights.  A node whose logit is under the probe's
threshold, and every node below it, leaves the pass (`_native.prune_closure`,
`NativeModel.keep_rows`): the surviving rows go on through the remaining
layers alone, their keys and values landing in their original cache rows.

Exactness: a surviving row's numbers are the full model's, bit for bit
(rows are independent in every kernel), and a pruned node counts as
rejected (lever.verify.target_pass.surviving_tree), so the greedy walk and
the sampling walk over the survivors are the same rules over a smaller
tree.  Pruning can only shorten acceptance; `PruneStats` counts by how much:
a *miss* is a pruned node that the walk would have taken (the target's
token where the walk stopped is a pruned child's token), so online recall =
accepted / (accepted + misses) over the accepted path, measured for free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields, replace

import numpy as np

from .. import _native
from ..tree import TokenTree
from .features import sibling_ranks


@dataclass
class PruneStats:
    """Counters over the passes a `ProbePruner` watched; seconds are wall time."""

    passes: int = 0
    unscored: int = 0            # of those, passes not scored: pruning would not pay (see ProbePruner.pays)
    nodes: int = 0               # draft nodes scored (the root is never scored)
    pruned: int = 0              # draft nodes dropped, subtrees included
    row_layers: int = 0          # rows x decoder layers the passes would have run
    row_layers_saved: int = 0    # of those, skipped by pruning
    score_s: float = 0.0         # head rows + native scoring + closure
    accepted: int = 0            # draft nodes accepted
    misses: int = 0              # pruned nodes the walk would have taken next

    @property
    def compute_saved(self) -> float:
        """Share of the passes' decoder-layer rows that pruning skipped (0..1)."""
        return self.row_layers_saved / self.row_layers if self.row_layers else 0.0

    @property
    def online_recall(self) -> float | None:
        """accepted / (accepted + misses): the share of path nodes the probe kept."""
        total = self.accepted + self.misses
        return self.accepted / total if total else None

    def copy(self) -> "PruneStats":
        return replace(self)

    def since(self, earlier: "PruneStats") -> "PruneStats":
        """The counts added after the snapshot `earlier` (a `copy()`)."""
        return PruneStats(*(getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)))

    def to_json(self) -> dict:
        return {"passes": self.passes, "unscored": self.unscored, "nodes": self.nodes, "pruned": self.pruned,
                "pruned_per_pass": round(self.pruned / self.passes, 3) if self.passes else 0.0,
                "compute_saved": round(self.compute_saved, 4), "score_ms_per_pass":
                    round(1e3 * self.score_s / self.passes, 4) if self.passes else 0.0,
                "accepted": self.accepted, "misses": self.misses,
                "online_recall": None if self.online_recall is None else round(self.online_recall, 4)}


class ProbePruner:
    """The pass hook of `TargetVerifier` (see its docstring) that prunes with `probe`
    (a lever.probe.store.ProbeModel) on the target `decoder` (a NativeDecoder:
    its weight source gives the head rows, its config the norm and layers).
    threshold: the logit under which a node is pruned (default the probe's).
    pays: None, or `pays(n) -> bool` for a pass over n tree tokens: False leaves
    the pass unscored and whole (lever.probe.choice.pruning_pays: when the
    cost model says the pass would not get faster -- an I/O-bound pass only
    loses the pruned nodes' acceptance)."""

    def __init__(self, probe, decoder, threshold: float | None = None, pays=None):
        n_layers = decoder.config.n_layers
        if not 0 <= probe.layer < n_layers - 1:
            raise ValueError(f"probe layer {probe.layer} is outside 0..{n_layers - 2} of a {n_layers}-layer target")
        self.probe, self.decoder = probe, decoder
        self.threshold = float(probe.threshold if threshold is None else threshold)
        self.weights = np.ascontiguousarray(probe.weights, dtype=np.float64)
        self.pays = pays
        self.stats = PruneStats()
        self._tree: TokenTree | None = None
        self._survivors: np.ndarray | None = None

    def begin(self, tree: TokenTree, n_cached: int):
        """Fetch what scoring needs before the pass; the layer hook, or None for a tree
        with nothing to score (the root alone)."""
        self._tree, self._survivors = tree, None
        n = len(tree)
        if n <= 1:
            return None
        if self.pays is not None and not self.pays(n):
            self.stats.unscored += 1
            return None
        t0 = time.perf_counter()
        self._parents = tree.parents().astype(np.int64)          # node 0's is -1
        parents = self._parents[1:]
        self._args = (parents, parents,
                      *self.decoder.weights.head_rows(tree.tokens().astype(np.int64)[1:]),
                      self.decoder.weights.norm, float(self.decoder.config.rms_norm_eps),
                      tree.logprobs()[1:].astype(np.float32),
                      sibling_ranks(tree)[1:].astype(np.float32),
                      tree.depths()[1:].astype(np.float32))
        self.stats.score_s += time.perf_counter() - t0
        return self._after_layer

    def _after_layer(self, layer: int, x: np.ndarray):
        """The layer hook: after the probe's layer, the live rows to keep (None: all)."""
        if layer != self.probe.layer:
            return None
        t0 = time.perf_counter()
        n = len(self._tree)
        lens = np.empty(n - 1, dtype=np.float32)
        logits = np.empty(n - 1, dtype=np.float32)
        _native.probe_scores(x, *self._args, self.weights, lens, logits)
        keep_self = np.concatenate([[True], logits >= self.threshold])
        keep = _native.prune_closure(self._parents, keep_self)
        self._survivors = np.flatnonzero(keep).astype(np.int64)
        self.stats.score_s += time.perf_counter() - t0
        return self._survivors

    def finish(self, out) -> np.ndarray | None:
        """The nodes that survived the pass (None: all: the tree was not scored)."""
        tree, s = self._tree, self.stats
        n, n_layers = len(tree), self.decoder.config.n_layers
        survivors = self._survivors
        kept = n if survivors is None else len(survivors)
        s.passes += 1
        s.nodes += n - 1
        s.pruned += n - kept
        s.row_layers += n * n_layers
        s.row_layers_saved += (n - kept) * (n_layers - 1 - self.probe.layer)
        return survivors

    def verdict(self, accepted: list[int], next_token: int) -> None:
        """Count the accepted nodes and a miss when the walk stopped at a pruned child."""
        tree = self._tree
        self.stats.accepted += len(accepted)
        if self._survivors is None:
            return
        last = accepted[-1] if accepted else 0
        child = tree.child_with_token(last, next_token)
        if child >= 0 and child not in set(self._survivors.tolist()):
            self.stats.misses += 1
