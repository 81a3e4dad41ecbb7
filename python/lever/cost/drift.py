"""Online drift of realised target-pass seconds against the profile, per n-range.

The profile is measured once; at run time the machine may be busier (or
quieter), and not uniformly: a small pass is bound by flash or memory
bandwidth, a large one by arithmetic, and something else running on the
cores slows the second far more than the first.  One scalar correction for
the whole curve would then mis-price either small or large trees, so the
ratio realised / predicted is followed separately per range of tree sizes
n (DRIFT_RANGES: 1-4, 5-16, 17-64, 65+, cut at n_max).

Per range the RECENT latest log ratios are kept; their median is the
range's current level (one slow pass, a page fault or a GC pause, does not
move it).  The factor the policy applies changes only by a "refit": when
the level has left the applied factor by more than the threshold,
max(DRIFT_FLOOR, DRIFT_K x spread) with `spread` the profile's relative
measurement spread, after at least MIN_OBSERVATIONS observations of that
range, the factor is set to the level and the refit is recorded (count,
observation number, range, old and new factor).  Between refits the curve
the policy sees stays fixed, so the tree sizes do not jitter with every
pass.  A range with fewer than MIN_OBSERVATIONS observations of its own
(large trees may be rare) follows the same rule applied to all
observations together, so a machine-wide slowdown still reaches it.

`factors()` is a step function over n (each n gets its range's factor);
`corrected(verify_s)` multiplies a verify curve by it and keeps the result
non-decreasing in n (a slower small range must not make a larger tree look
cheaper than a smaller one).  Seconds throughout; ratios are unitless.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import numpy as np

from ..errors import LeverError

DRIFT_RANGES = ((1, 4), (5, 16), (17, 64), (65, None))   # inclusive n-ranges (None: up to n_max)
RECENT = 5                  # latest log ratios kept per range (their median is the level)
MIN_OBSERVATIONS = 3        # observations of a range before it refits on its own
DRIFT_FLOOR = 0.10          # a level must leave the factor by more than 10 % ...
DRIFT_K = 3.0               # ... and 3 measurement spreads to refit
REFIT_LOG = 20              # refits kept in the report (the newest)


class _Track:
    """Realised / predicted of one n-range (or of all observations)."""

    def __init__(self, name: str):
        self.name = name
        self.recent: deque[float] = deque(maxlen=RECENT)   # log(realised / predicted)
        self.observations = 0
        self.since_refit = 0
        self.factor = 1.0
        self.predicted_sum = 0.0
        self.realised_sum = 0.0

    def add(self, predicted_s: float, realised_s: float) -> None:
        self.recent.append(math.log(realised_s / predicted_s))
        self.observations += 1
        self.since_refit += 1
        self.predicted_sum += predicted_s
        self.realised_sum += realised_s

    @property
    def level(self) -> float:
        """exp(median of the recent log ratios); 1.0 before any observation."""
        return math.exp(statistics.median(self.recent)) if self.recent else 1.0

    def drifted(self, threshold: float) -> bool:
        return (self.since_refit >= MIN_OBSERVATIONS
                and abs(math.log(self.level / self.factor)) > math.log1p(threshold))

    def summary(self) -> dict:
        n = self.observations
        return {"n": self.name, "observations": n,
                "predicted_s_mean": round(self.predicted_sum / n, 6) if n else None,
                "realised_s_mean": round(self.realised_sum / n, 6) if n else None,
                "recent_ratio": round(self.level, 4), "factor": round(self.factor, 4)}


class CostDrift:
    """Per-n-range correction of the profile's verify seconds; see the module doc.

    n_max: largest tree (tokens per pass, root included) the factors cover.
    spread: the profile's relative measurement spread (e.g. 0.03), which sets
    the refit threshold.
    """

    def __init__(self, n_max: int, spread: float):
        if int(n_max) < 1:
            raise LeverError(f"CostDrift needs n_max >= 1, got {n_max}")
        if not 0 <= spread < math.inf:
            raise LeverError(f"CostDrift needs a spread >= 0, got {spread}")
        self.n_max = int(n_max)
        self.threshold = max(DRIFT_FLOOR, DRIFT_K * float(spread))
        self.bounds = [(lo, min(hi or self.n_max, self.n_max)) for lo, hi in DRIFT_RANGES if lo <= self.n_max]
        self.ranges = [_Track(f"{lo}-{hi}" if hi > lo else str(lo)) for lo, hi in self.bounds]
        if DRIFT_RANGES[-1][1] is None and self.bounds[-1][0] == DRIFT_RANGES[-1][0]:
            self.ranges[-1].name = f"{self.bounds[-1][0]}+"
        self.all = _Track("all")
        self.refits = 0
        self.refit_log: deque[dict] = deque(maxlen=REFIT_LOG)

    def _range_of(self, n: int) -> int:
        n = min(n, self.n_max)
        return next(i for i, (lo, hi) in enumerate(self.bounds) if lo <= n <= hi)

    def observe(self, n: int, predicted_s: float, realised_s: float) -> None:
        """One target pass over n tree tokens: the profile's uncorrected prediction
        and the realised seconds.  Passes with a non-positive or non-finite time
        are ignored; n above n_max counts in the last range."""
        if int(n) < 1:
            raise LeverError(f"a target pass has at least 1 token, got n={n}")
        if not (0 < predicted_s < math.inf and 0 < realised_s < math.inf):
            return
        track = self.ranges[self._range_of(int(n))]
        for t in (track, self.all):
            t.add(float(predicted_s), float(realised_s))
        for t in (self.all, track):
            if t.drifted(self.threshold):
                self._refit(t)

    def _refit(self, track: _Track) -> None:
        old, new = track.factor, track.level
        track.factor = new
        track.since_refit = 0
        self.refits += 1
        self.refit_log.append({"observation": self.all.observations, "range": track.name,
                               "old": round(old, 4), "new": round(new, 4)})

    def range_factors(self) -> list[float]:
        """The factor applied to each range: its own once it has MIN_OBSERVATIONS
        observations, else that of all observations together."""
        return [t.factor if t.observations >= MIN_OBSERVATIONS else self.all.factor for t in self.ranges]

    def factors(self) -> np.ndarray:
        """float64 [n_max]: entry n-1 multiplies the profile's verify seconds at n."""
        out = np.empty(self.n_max)
        for (lo, hi), f in zip(self.bounds, self.range_factors()):
            out[lo - 1:hi] = f
        return out

    def corrected(self, verify_s) -> np.ndarray:
        """verify_s (seconds, [n] for n = 1..len, at most n_max) times the factors,
        made non-decreasing in n."""
        v = np.asarray(verify_s, dtype=np.float64)
        if v.ndim != 1 or len(v) > self.n_max:
            raise LeverError(f"CostDrift covers n = 1..{self.n_max}, got a curve of shape {v.shape}")
        return np.maximum.accumulate(v * self.factors()[:len(v)])

    def report(self) -> dict:
        """Per n-range predicted vs realised seconds, recent ratio and applied
        factor; the threshold; the refits (count and the newest)."""
        factors = self.range_factors()
        ranges = []
        for t, f in zip(self.ranges, factors):
            ranges.append({**t.summary(), "factor": round(f, 4), "own_factor": t.observations >= MIN_OBSERVATIONS})
        return {"threshold": round(self.threshold, 4), "observations": self.all.observations,
                "ranges": ranges, "all": self.all.summary(), "refits": self.refits,
                "refit_log": list(self.refit_log)}


def profile_spread(profile) -> float:
    """The typical relative spread of a profile's pass measurements (the median
    over its n grid); 0.0 when it has none recorded, and for a quick profile
    (lever.cost.quick): the spread of its few one-layer timings says how
    repeatable they were, not how far the whole-pass estimate built from them
    may be off, so its passes refit at the threshold's floor (DRIFT_FLOOR)."""
    if getattr(profile, "quick", False):
        return 0.0
    return float(statistics.median(profile.pass_spread)) if profile.pass_spread else 0.0
