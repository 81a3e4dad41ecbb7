"""The cost of a target pass under early-exit pruning (lever.probe.prune).

A probe after decoder layer k drops the draft nodes it scores as unlikely,
with their subtrees, so layers k+1..L and the output head run on the
surviving rows only.  `PrunedCostModel` predicts such a pass from the same
`DeviceProfile`: stages up to layer k compute n rows, later ones
1 + survive * (n - 1) (the root always survives), flash reads unchanged.
`PruneForecast` learns `survive` -- the share of draft nodes that survive --
from the pruner's running counters, starting from the probe's held-out
estimate, so the gain-cost tree grows larger when pruning makes big trees
cheaper.  Units: seconds; n counts a pass's tree tokens, root included.
"""

from __future__ import annotations

import numpy as np

from .cost_model import CostModel, interpolate

PRIOR_NODES = 64            # weight of the probe's held-out survival, in draft nodes


def stage_layer(name: str) -> int | None:
    """The decoder layer of a profile stage ("layer.N"); None for the head."""
    kind, _, index = name.partition(".")
    return int(index) if kind == "layer" else None


class PrunedCostModel(CostModel):
    """`CostModel` of passes pruned after layer `after_layer`, `survive` (0..1) of
    the draft rows going on to the later layers and the head."""

    def __init__(self, base: CostModel, after_layer: int, survive: float):
        super().__init__(base.profile, base.verify_factor, base.draft_factor)
        if not 0.0 <= survive <= 1.0:
            raise ValueError(f"survive must be within 0..1, got {survive}")
        self.after_layer, self.survive = int(after_layer), float(survive)

    def _compute(self, n: np.ndarray) -> list[np.ndarray]:
        p = self.profile
        pruned_n = 1.0 + self.survive * (n - 1.0)
        out = []
        for s in p.stages:
            layer = stage_layer(s.name)
            rows = n if layer is not None and layer <= self.after_layer else pruned_n
            out.append(interpolate(p.n_grid, s.compute_s, rows, p.fixed_shapes, p.pass_spread))
        return out

    def scaled(self, verify_factor: float, draft_factor: float) -> "PrunedCostModel":
        base = CostModel(self.profile, self.verify_factor * verify_factor, self.draft_factor * draft_factor)
        return PrunedCostModel(base, self.after_layer, self.survive)


class PruneForecast:
    """The share of draft nodes expected to survive pruning: the probe's held-out
    estimate `prior_survive`, worth PRIOR_NODES nodes, updated by `stats` (a
    lever.probe.prune.PruneStats the pruner keeps counting)."""

    def __init__(self, stats, after_layer: int, prior_survive: float):
        self.stats, self.after_layer = stats, int(after_layer)
        self.prior_survive = float(min(1.0, max(0.0, prior_survive)))

    @property
    def survive(self) -> float:
        s = self.stats
        kept = s.nodes - s.pruned
        return (self.prior_survive * PRIOR_NODES + kept) / (PRIOR_NODES + s.nodes)

    def cost(self, base: CostModel) -> PrunedCostModel:
        """`base` with passes pruned at the current expected survival."""
        return PrunedCostModel(base, self.after_layer, self.survive)
