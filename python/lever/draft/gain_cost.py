"""The gain-cost drafting policy (`--mode lever`; README, "Design").

Each iteration the native `TreeGrower` (csrc/tree/grow_tree.h) sizes the
tree by expected accepted tokens per second: it picks which nodes the draft
expands next, this module expands them (the drafter primitive,
lever.draft.base.Drafter) and hands the children back
with their calibrated acceptance probabilities, and the grower selects the
tree that maximises (1 + sum of path probabilities) / (draft + verify +
overhead seconds), with the verify cost curve and draft cost from the
device profile (`lever.cost`).

Drafting while the flash reader streams the next pass costs less than its
seconds: the cost model's `hidden_draft_curve(n)` (the reads the prefetch
ring can do while the target is idle, per pass size n: a pass that waits on
flash gains, a compute-bound one does not) is a credit, and the grower
charges max(0, draft seconds - credit(n)).

After verification `observe` teaches the calibration the outcome of every
child of an accepted node and follows the realised target-pass seconds
against the prediction per range of tree sizes (`lever.cost.drift.CostDrift`:
a range's correction is refitted when it drifts beyond the profile's
measurement spread); the draft curve and the per-iteration host work follow
a running ratio / mean.

The prediction a pass is held against is the pass *after* this tree's
drafting: verify(n) - min(D, credit(n)), D the realised seconds of the
drafting before it, since the reads the ring did meanwhile are not waited
for again.  Its correction then scales both curves the grower prices a pass
with (verify and credit), so realised and predicted iterations agree: held
against the back-to-back pass alone, a pass that the draft's reads sped up
would look cheaper than the profile says, and the credit would be counted
twice (the tree grown too large for what it costs).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from ..errors import LeverError
from ..sampling import SamplingParams
from ..shapes import LeverLimits
from ..cost.drift import CostDrift
from .base import NO_TOKEN, Drafter, Grown, within
from .calibration import AcceptanceCalibration

CORRECTION_RATE = 0.2          # weight of the newest realised/predicted ratio (in log space)


@dataclass
class Prediction:
    """What the policy predicted of one grown tree (`Grown.prediction`; seconds, tokens)."""

    q: np.ndarray                  # draft probability of each node given its parent (root: 1)
    rank: np.ndarray               # rank among its draft siblings (root: 0)
    expected_tokens: float         # predicted tokens emitted (accepted + the target's own)
    predicted_s: float             # predicted iteration seconds
    predicted_draft_s: float
    predicted_verify_s: float
    grow_s: float                  # host seconds in the policy (grower + calibration), draft forwards excluded
    forward_s: float               # realised seconds of the draft forwards while growing
    pool_size: int                 # nodes the draft proposed


@dataclass
class LeverRecord:
    """Predicted vs realised, per iteration."""

    tree_sizes: list[int] = field(default_factory=list)
    predicted_tokens: list[float] = field(default_factory=list)
    realised_tokens: list[int] = field(default_factory=list)
    predicted_s: list[float] = field(default_factory=list)
    realised_s: list[float] = field(default_factory=list)
    grow_s: list[float] = field(default_factory=list)


class GainCostPolicy:
    """Grows each tree to maximise expected tokens per second (see module doc).

    cost: a `lever.cost.cost_model.CostModel` (verify_s(n), draft_s(f),
    iteration_overhead_s). max_nodes: draft nodes per tree at most; max_depth:
    deepest node; topk: children the draft offers per expanded node.
    adapt: rescale the cost curves online by realised / predicted seconds.
    pruning: None, or a lever.cost.pruning.PruneForecast: the target's passes
    are pruned early (lever.probe), so a pass over n tokens costs what the
    forecast's surviving rows cost in the layers after the probe; the
    curves follow the forecast as it learns.
    """

    SURVIVE_STEP = 0.02        # re-read the cost curves when the forecast moved this much

    def __init__(self, cost, calibration: AcceptanceCalibration | None = None,
                 max_nodes: int = LeverLimits.max_nodes, max_depth: int = LeverLimits.max_depth,
                 topk: int = LeverLimits.topk, adapt: bool = True, pruning=None):
        if max_nodes < 1 or max_depth < 1 or topk < 1:
            raise LeverError(f"lever policy needs max_nodes, max_depth and topk >= 1, "
                             f"got {max_nodes}, {max_depth}, {topk}")
        self.cost = cost
        self.calibration = calibration or AcceptanceCalibration()
        self.max_nodes, self.max_depth, self.topk, self.adapt = max_nodes, max_depth, topk, adapt
        self._overhead_s = float(cost.iteration_overhead_s)
        self.draft_factor = 1.0
        self.pruning = pruning
        self._read_cost()
        self.record = LeverRecord()

    def _read_cost(self) -> None:
        """Take the cost curves (again). A cost model that learns by itself (a
        remote verifier's, lever.remote.cost) bumps its `revision`; its verify
        curve then replaces the online correction."""
        self._read_curves()
        self.drift = CostDrift(self.max_nodes + 1, self.cost.spread)
        self._cost_revision = getattr(self.cost, "revision", None)

    def _read_curves(self) -> None:
        """The verify, draft and hidden-draft curves of the cost model, pruned by
        the forecast when there is one (lever.cost.pruning)."""
        cost = self.cost if self.pruning is None else self.pruning.cost(self.cost)
        self._survive = None if self.pruning is None else self.pruning.survive
        self._verify_s = np.asarray(cost.verify_s(self.max_nodes + 1), dtype=np.float64)
        self._draft_s = np.asarray(cost.draft_s(max(self.max_nodes + 1, 1)), dtype=np.float64)
        self._hidden_draft_s = np.asarray(cost.hidden_draft_curve(self.max_nodes + 1), dtype=np.float64)

    # -- one iteration ----------------------------------------------------------------

    def _catch_up_s(self, pending: int) -> float:
        """Extra draft seconds of expanding the root when `pending` committed tokens
        must go through the draft first (in the same forward)."""
        if pending <= 0:
            return 0.0
        curve = self._draft_s
        f = pending + 1
        at = curve[f - 1] if f <= len(curve) else curve[-1] + (curve[-1] - curve[-2]) * (f - len(curve))
        return max(0.0, float(at - curve[0])) * self.draft_factor

    def verify_curve(self) -> np.ndarray:
        """Predicted seconds of a target pass over n = 1..max_nodes+1 tree tokens:
        the cost model's curve with the online drift correction per n-range."""
        return self.drift.corrected(self._verify_s) if self.adapt else self._verify_s

    def hidden_curve(self) -> np.ndarray:
        """Predicted draft seconds the ring hides before a pass over n = 1..max_nodes+1
        tree tokens: the cost model's credit times the pass's drift factor."""
        if not self.adapt:
            return self._hidden_draft_s
        return self._hidden_draft_s * self.drift.factors()[:len(self._hidden_draft_s)]

    def grower(self, max_depth: int | None = None) -> "_native.TreeGrower":
        """A native grower over the current cost curves; max_depth: deepest node
        (default: the policy's own)."""
        return _native.TreeGrower(self.verify_curve(), self._draft_s * self.draft_factor,
                                  self._overhead_s, self.max_nodes,
                                  self.max_depth if max_depth is None else max_depth,
                                  hidden_draft_s=self.hidden_curve())

    def grow(self, drafter: Drafter, root: int, params: SamplingParams = SamplingParams(),
             seed: int | None = None, room: int | None = None) -> Grown:
        """Grow a tree under `root` with `drafter` (one with draft probabilities,
        `has_probabilities`).  params, seed: the sequence's sampling, so that
        the draft's rank-0 child is its own position-keyed draw.  room: draft
        tokens the generation can still use (lever.draft.base.within; None: no
        cap).  The grown tree's `prediction` is a `Prediction`."""
        if not drafter.has_probabilities:
            raise LeverError("mode lever needs a draft model (prompt lookup has no probabilities to calibrate)")
        if getattr(self.cost, "revision", None) != self._cost_revision:
            self._read_cost()
        elif self.pruning is not None and abs(self.pruning.survive - self._survive) > self.SURVIVE_STEP:
            self._read_curves()
        grower = self.grower(within(self.max_depth, room))
        t_grow = time.perf_counter()
        drafter.begin_tree()
        grower.begin(root, self.calibration.child_accept(self.max_depth, self.topk),
                     self._catch_up_s(drafter.catch_up_tokens))
        ranks = np.arange(self.topk)
        forward_s = 0.0
        while True:
            nodes = grower.next_expansion()
            if not nodes:
                break
            pool = grower.pool
            t0 = time.perf_counter()
            e = drafter.expand(pool, nodes, self.topk, params, seed)
            forward_s += time.perf_counter() - t0
            depths = pool.depths()[nodes] + 1
            accept = self.calibration.predict(np.exp(e.logprobs.astype(np.float64)), depths[:, None], ranks[None, :])
            for row, node in enumerate(nodes):
                k = int(np.count_nonzero(e.tokens[row] != NO_TOKEN))       # children offered (a prefix)
                grower.add_children(node, e.tokens[row, :k], e.logprobs[row, :k], accept[row, :k])
        tree, pool_index, expected, predicted_s = grower.select()
        drafter.use_tree(tree, pool_index)
        grow_s = time.perf_counter() - t_grow - forward_s
        n = len(tree)
        verify_s = float(self.verify_curve()[n - 1])
        q = np.exp(grower.pool.logprobs()[pool_index].astype(np.float64))
        q[0] = 1.0
        rank = np.array([grower.rank(int(i)) for i in pool_index])
        return Grown(tree, prediction=Prediction(
            q=q, rank=rank, expected_tokens=float(expected), predicted_s=float(predicted_s),
            predicted_draft_s=float(grower.draft_spent_s), predicted_verify_s=verify_s,
            grow_s=grow_s, forward_s=forward_s, pool_size=len(grower.pool)))

    def observe(self, grown: Grown, accepted: list[int], verify_s: float, iteration_s: float) -> None:
        """Learn from one verification: `accepted` tree nodes; realised seconds of
        the target pass and of the whole iteration (draft, verify, accept, commit)."""
        tree, p = grown.tree, grown.prediction
        accepted_set = set(accepted)
        trials = [c for v in [0] + list(accepted) for c in tree.children(v)]
        if trials:
            idx = np.asarray(trials)
            self.calibration.update(p.q[idx], tree.depths()[idx], p.rank[idx],
                                    np.array([c in accepted_set for c in trials]))
        if self.adapt:
            n = min(len(tree), len(self._verify_s))
            drafted_s = p.forward_s + p.grow_s               # the target idle, the ring reading
            after_gap = self._verify_s[n - 1] - min(drafted_s, self._hidden_draft_s[n - 1])
            self.drift.observe(n, float(after_gap), verify_s)
            if p.predicted_draft_s > 0 and p.forward_s > 0:
                self.draft_factor = _blend(self.draft_factor, p.forward_s, p.predicted_draft_s)
            rest = iteration_s - verify_s - p.forward_s      # host work, commit's catch-up forward
            if rest > 0:
                self._overhead_s += CORRECTION_RATE * (rest - self._overhead_s)
        r = self.record
        r.tree_sizes.append(len(tree) - 1)
        r.predicted_tokens.append(p.expected_tokens)
        r.realised_tokens.append(len(accepted) + 1)
        r.predicted_s.append(p.predicted_s)
        r.realised_s.append(iteration_s)
        r.grow_s.append(p.grow_s)

    # -- reporting ----------------------------------------------------------------------

    @property
    def observed(self) -> int:
        """Iterations observed so far (the `since` of `report`)."""
        return len(self.record.tree_sizes)

    def report(self, since: int = 0) -> dict:
        """Tree sizes, predicted vs realised accepted length and iteration seconds
        over the iterations from number `since` on (the calibration error is
        over everything it has learnt)."""
        r = self.record
        sizes = np.asarray(r.tree_sizes[since:])
        if not sizes.size:
            return {"iterations": 0}
        r = LeverRecord(*(getattr(r, f)[since:] for f in LeverRecord.__dataclass_fields__))
        return {
            "iterations": len(sizes),
            "tree_size": {"mean": round(float(sizes.mean()), 2), "min": int(sizes.min()),
                          "p50": float(np.percentile(sizes, 50)), "p90": float(np.percentile(sizes, 90)),
                          "max": int(sizes.max()), "histogram": _histogram(sizes)},
            "accepted_length": {"predicted_mean": round(float(np.mean(r.predicted_tokens)), 3),
                                "realised_mean": round(float(np.mean(r.realised_tokens)), 3)},
            "iteration_s": {"predicted_mean": round(float(np.mean(r.predicted_s)), 5),
                            "realised_mean": round(float(np.mean(r.realised_s)), 5)},
            "grow_us_mean": round(float(np.mean(r.grow_s)) * 1e6, 1),
            "cost_correction": {"draft": round(self.draft_factor, 4), "overhead_s": round(self._overhead_s, 5),
                                "hidden_draft_s": {str(n): round(float(self._hidden_draft_s[n - 1]), 5)
                                                   for n in (1, 8, 16, 32) if n <= len(self._hidden_draft_s)}},
            "cost_drift": self.drift.report(),
            **({"pruning_survive": round(self.pruning.survive, 4)} if self.pruning is not None else {}),
            "calibration": self.calibration.calibration_error(),
        }


def _blend(factor: float, realised: float, predicted: float) -> float:
    """Move the correction factor towards realised / (predicted / factor), in log space."""
    if realised <= 0 or predicted <= 0:
        return factor
    base = predicted / factor                       # the uncorrected prediction
    target = realised / base
    return math.exp((1 - CORRECTION_RATE) * math.log(factor) + CORRECTION_RATE * math.log(target))


def _histogram(sizes: np.ndarray) -> dict[str, int]:
    """Counts of tree sizes in power-of-two buckets: '0', '1', '2-3', '4-7', ..."""
    out: dict[str, int] = {}
    for s in sizes.tolist():
        if s < 2:
            key = str(s)
        else:
            lo = 1 << (int(s).bit_length() - 1)
            key = f"{lo}-{2 * lo - 1}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: int(kv[0].split("-")[0])))


@dataclass(frozen=True)
class CostCurves:
    """Explicit cost curves with the interface of lever.cost.cost_model.CostModel
    (for tests and synthetic benchmarks): verify_curve[n-1] seconds of a target
    pass over n tokens, draft_curve[f-1] of a draft forward over f nodes; past
    their ends they are extended linearly from the last two points."""

    verify_curve: tuple[float, ...]
    draft_curve: tuple[float, ...]
    iteration_overhead_s: float = 0.0
    hidden_s: float = 0.0             # draft seconds hidden under the next pass's reads
    spread: float = 0.0               # relative measurement spread of the verify curve

    @classmethod
    def linear(cls, verify_fixed_s: float, verify_per_token_s: float, draft_fixed_s: float,
               draft_per_node_s: float, overhead_s: float = 0.0, n_max: int = 256) -> "CostCurves":
        """verify(n) = fixed + per_token * n; draft(f) = fixed + per_node * f."""
        n = np.arange(1, n_max + 1)
        return cls(tuple(verify_fixed_s + verify_per_token_s * n), tuple(draft_fixed_s + draft_per_node_s * n),
                   overhead_s)

    def verify_s(self, n_max: int) -> np.ndarray:
        return _extend(self.verify_curve, n_max)

    def draft_s(self, f_max: int) -> np.ndarray:
        return _extend(self.draft_curve, f_max)

    def hidden_draft_curve(self, n_max: int) -> np.ndarray:
        return np.full(n_max, self.hidden_s)


def _extend(curve: tuple[float, ...], n: int) -> np.ndarray:
    c = np.asarray(curve, dtype=np.float64)
    if n <= len(c):
        return c[:n].copy()
    step = c[-1] - c[-2] if len(c) > 1 else 0.0
    return np.concatenate([c, c[-1] + step * np.arange(1, n - len(c) + 1)])
