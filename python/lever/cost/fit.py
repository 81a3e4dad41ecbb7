"""The fitted cost curve of one stage: measured medians -> a robust, monotone curve.

A profile stores raw medians per grid point and their relative spread
(`DeviceProfile.pass_spread`); the cost model fits each stage's curve when
it is built, so stored data is never rewritten.  `fit_curve` does, in order:

1. Spike rejection.  More tokens never cost less, so a point that is far
   above the next point is a measurement accident (the machine was busy
   while it was measured), not a feature of the curve.  Point i (0 < i <
   last) is an isolated spike when

       v[i] > (1 + t[i]) * max(chord[i], v[i+1])

   where chord[i] is the line through its two neighbours evaluated at
   grid[i], and t[i] = max(SPIKE_FLOOR, SPIKE_K * spread[i]).  The first
   point is a spike when v[0] > (1 + t[0]) * v[1]; the last (3 points or
   more) when it is above (1 + 4 t) times (twice, at the floor) the
   continuation of the points before it (their running maximum, extended
   with the steepest slope among them).  A spike is replaced by what its
   neighbours predict (the chord; v[1] for the first point; the
   continuation for the last).  The worst spike goes first and the test is repeated, at most
   len(grid) // 3 times (so a run of two busy points between clean ones is
   removed as well, but a curve that is mostly "spikes" is left alone).
   Real steps (a kernel switching at some n) are kept: the point after a
   step is as high as the step.  On fixed-shape backends (`fixed_shapes`:
   the grid is the compiled row buckets) the last point is never judged:
   the largest bucket may cost a real step more than the smaller ones'
   trend (a larger tile), and no point after it can tell.

2. Monotone: the least-squares non-decreasing sequence (isotonic
   regression, pool-adjacent-violators; a dip is pooled with what is before
   it).

3. Convex where the data allows: the least-squares (relative errors)
   curve through the step-1 values whose slopes between grid points are
   non-decreasing and non-negative (`convex_curve`, a small quadratic
   programme solved exactly).  Each point takes the convex value when it is
   within t_c = max(CONVEX_FLOOR, CONVEX_K * spread[i]) (relative) of the
   monotone one, else keeps the monotone value (e.g. at a real step); a
   running maximum then removes the small steps back down that mixing the
   two can leave (at most t_c).  Skipped for fixed-shape backends, whose
   curves are step functions.

Spread: relative (a robust standard deviation over the median, e.g. 0.03 =
3 %); None or an empty list means unknown, and only the floors apply.
Values are seconds, grids are token counts.
"""

from __future__ import annotations

import functools

import numpy as np

SPIKE_FLOOR = 0.25        # a spike is > 25 % above what its neighbours predict ...
SPIKE_K = 4.0             # ... and more than 4 spreads above it
LAST_POINT_TOLERANCE = 4  # the last point only when 4x as far above its continuation (2x at the floor)
CONVEX_FLOOR = 0.05       # the convex curve replaces a point it is within 5 % ...
CONVEX_K = 3.0            # ... or 3 spreads of


def fit_curve(grid, values, spread=None, convex: bool = True, last_point: bool = True) -> np.ndarray:
    """Fitted seconds at each grid point (float64 [len(grid)]); see the module doc.
    last_point: judge the last point a possible spike (False on fixed shapes).
    (Memoised: a cost model fits the same stage curves many times.)"""
    v = tuple(float(x) for x in values)
    s = _spread(spread, len(v))
    fitted = _fit_cached(tuple(float(x) for x in grid), v, tuple(s.tolist()), bool(convex), bool(last_point))
    return np.array(fitted)


@functools.lru_cache(maxsize=4096)
def _fit_cached(grid: tuple, values: tuple, spread: tuple, convex: bool, last_point: bool = True) -> tuple:
    g = np.asarray(grid, dtype=np.float64)
    s = np.asarray(spread, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    cleaned, _ = reject_spikes(g, v, s, last_point)
    mono = isotonic(cleaned)
    if not convex or len(g) < 3:
        return tuple(mono.tolist())
    cvx = convex_curve(g, cleaned)
    tol = np.maximum(CONVEX_FLOOR, CONVEX_K * s)
    mixed = np.where(np.abs(cvx - mono) <= tol * mono, cvx, mono)
    return tuple(np.maximum.accumulate(mixed).tolist())


def reject_spikes(grid, values, spread=None, last_point: bool = True) -> tuple[np.ndarray, list[int]]:
    """(values with isolated spikes replaced, indices replaced); step 1 of the module doc.
    last_point: the last point may be judged a spike (not on fixed shapes)."""
    g = np.asarray(grid, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64).copy()
    s = _spread(spread, len(v))
    tol = np.maximum(SPIKE_FLOOR, SPIKE_K * s)
    rejected: list[int] = []
    for _ in range(len(v) // 3):
        worst, worst_excess, worst_value = -1, 1.0, 0.0
        for i in range(len(v)):
            if i in rejected or (i == len(v) - 1 and not last_point):
                continue
            predicted, bound = _neighbour_prediction(g, v, i)
            if predicted is None:
                continue
            limit = 1.0 + (LAST_POINT_TOLERANCE if i == len(v) - 1 else 1.0) * tol[i]
            excess = v[i] / (limit * bound) if bound > 0 else (np.inf if v[i] > 0 else 0.0)
            if excess > worst_excess:
                worst, worst_excess, worst_value = i, excess, predicted
        if worst < 0:
            break
        v[worst] = worst_value
        rejected.append(worst)
    return v, sorted(rejected)


def _neighbour_prediction(g: np.ndarray, v: np.ndarray, i: int) -> tuple[float | None, float]:
    """(what the neighbours of point i predict for it, the value it must stay
    within a tolerance of); (None, 0) when it cannot be judged."""
    last = len(v) - 1
    if last < 1:
        return None, 0.0
    if i == 0:
        return float(v[1]), float(v[1])
    if i == last:
        if last < 2:
            return None, 0.0
        before = np.maximum.accumulate(v[:i])
        slope = float(np.max(np.diff(before) / np.diff(g[:i])))
        ahead = float(before[-1] + slope * (g[i] - g[i - 1]))
        return ahead, ahead
    chord = float(v[i - 1] + (v[i + 1] - v[i - 1]) * (g[i] - g[i - 1]) / (g[i + 1] - g[i - 1]))
    return chord, max(chord, float(v[i + 1]))


def isotonic(values, weights=None) -> np.ndarray:
    """The weighted least-squares non-decreasing fit (pool-adjacent-violators)."""
    v = np.asarray(values, dtype=np.float64)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=np.float64)
    means: list[float] = []
    totals: list[float] = []
    counts: list[int] = []
    for x, wx in zip(v, w):
        means.append(float(x))
        totals.append(float(wx))
        counts.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m, t, c = means.pop(), totals.pop(), counts.pop()
            total = totals[-1] + t
            means[-1] = (means[-1] * totals[-1] + m * t) / total if total > 0 else (means[-1] + m) / 2
            totals[-1] = total
            counts[-1] += c
    return np.repeat(np.asarray(means), counts)


def convex_curve(grid, values) -> np.ndarray:
    """The convex, non-decreasing curve closest to `values` in relative least
    squares: minimises sum(((x - v) / v)^2) subject to non-decreasing slopes
    (x[i+1] - x[i]) / (grid[i+1] - grid[i]) and a first slope >= 0.  (Points
    at or near 0 are weighted as 1e-3 of the largest value.)"""
    g = np.asarray(grid, dtype=np.float64)
    v = np.asarray(values, dtype=np.float64)
    if len(v) < 3 or not np.max(v) > 0:
        return v.copy()
    scale = np.maximum(v, 1e-3 * np.max(v))
    # rows: first slope >= 0, then slope[j+1] - slope[j] >= 0 (x = scale * y)
    slope = np.zeros((len(v) - 1, len(v)))
    for j in range(len(v) - 1):
        slope[j, j], slope[j, j + 1] = -1.0 / (g[j + 1] - g[j]), 1.0 / (g[j + 1] - g[j])
    rows = np.vstack([slope[:1], np.diff(slope, axis=0)]) * scale
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    # min ||y - v/scale||^2 s.t. rows @ y >= 0; dual: y = v/scale + rows.T @ lam, lam = nnls(rows.T, -v/scale)
    target = v / scale
    lam = _nnls(rows.T, -target)
    return scale * (target + rows.T @ lam)


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| over x >= 0 (Lawson-Hanson active set; small problems)."""
    n = a.shape[1]
    x = np.zeros(n)
    active = np.zeros(n, dtype=bool)              # the positive set
    tol = 1e-12 * max(1.0, float(np.abs(a).max()) * float(np.abs(b).max()))
    for _ in range(3 * n + 3):
        w = a.T @ (b - a @ x)
        if active.all() or np.max(np.where(active, -np.inf, w)) <= tol:
            break
        active[int(np.argmax(np.where(active, -np.inf, w)))] = True
        while True:
            z = np.zeros(n)
            z[active] = np.linalg.lstsq(a[:, active], b, rcond=None)[0]
            if np.all(z[active] > tol):
                x = z
                break
            bad = active & (z <= tol)
            alpha = float(np.min(x[bad] / (x[bad] - z[bad])))
            x = x + alpha * (z - x)
            active &= x > tol
            x[~active] = 0.0
    return x


def _spread(spread, n: int) -> np.ndarray:
    if spread is None or len(spread) == 0:
        return np.zeros(n)
    s = np.asarray(spread, dtype=np.float64)
    if s.shape != (n,):
        raise ValueError(f"spread has {s.size} entries for {n} points")
    return s
