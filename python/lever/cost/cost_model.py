"""Predicted seconds of one target pass, one draft forward and one iteration's
host work, from a measured `DeviceProfile` (README, "Design").

Compute per stage is interpolated over the profile's grid: the stored medians
are first fitted (`lever.cost.fit.fit_curve`: isolated spikes rejected, then
non-decreasing in n, and convex where that stays within the measured spread
-- more tokens never cost less, so a dip or a lone spike is measurement
noise, e.g. the machine busy while one point was measured), then piecewise
linear in n, extrapolated linearly (never downwards) past the last grid
point; on fixed-shape backends a step function (the cost of the smallest
grid point >= n; past the largest, whole runs of it plus the step cost of
the rest).  The draft curve is never a step function: the draft runs on the
CPU whatever runs the target.

Flash reads and compute are combined by simulating the prefetch ring
(`simulate_passes`): one reader reads the streamed extents one after another
in pass order, cyclically into the next pass; a read needs a free ring slot
(`prefetch_depth` of them; a slot is freed when the stage that used it has
computed); a stage computes once its read is done and the stage before it
has computed; pinned stages need no read.  So while a pinned tail computes,
the next pass's first streamed extents are already arriving.  Three passes
are simulated back to back and the last one's duration (the steady state)
is the prediction, plus the embedding lookup.

Limits of the ring: with one slot every read waits for the stage before it,
so a pass costs Σ(IO + C); with no streamed stage it costs Σ C.  The design's
Σ max(IO_ℓ, C_ℓ) is the case where each read overlaps exactly the compute
of the stage before it (uniform layers, two slots); a deeper ring lets a
read borrow slack from several stages and tends to max(Σ IO, Σ C) -- pure
flash bandwidth when I/O-bound.  Units: seconds, bytes; n counts tree tokens
of a pass (root included), f the nodes of one draft forward.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .device_profile import DeviceProfile
from .drift import profile_spread
from .fit import fit_curve

SIMULATED_PASSES = 3
SUMMARY_N = (1, 16, 64, 256)


def interpolate(grid, values, n: np.ndarray, fixed_shapes: bool = False, spread=None) -> np.ndarray:
    """Seconds at each n (float64 array) from measured medians `values` at `grid`
    points, fitted first (`fit_curve`; spread: their relative spread per point,
    None = unknown; on fixed shapes no convex step, and the largest bucket is
    never taken for a spike)."""
    g = np.asarray(grid, dtype=np.float64)
    v = fit_curve(g, values, spread, convex=not fixed_shapes, last_point=not fixed_shapes)
    n = np.asarray(n, dtype=np.float64)
    if fixed_shapes:
        whole, rest = np.divmod(n, g[-1])
        step = v[np.minimum(np.searchsorted(g, rest, side="left"), len(g) - 1)]
        return whole * v[-1] + np.where(rest > 0, step, 0.0)
    out = np.interp(n, g, v)
    if len(g) >= 2:
        slope = max(0.0, (v[-1] - v[-2]) / (g[-1] - g[-2]))
        out = np.where(n > g[-1], v[-1] + slope * (n - g[-1]), out)
    return out


def simulate_passes(io_s: list[float], compute_s: list[np.ndarray], streamed: list[bool],
                    prefetch_depth: int, passes: int = SIMULATED_PASSES, gap_s: float = 0.0) -> np.ndarray:
    """Duration (seconds) of the last of `passes` passes through the ring described
    in the module doc.  io_s: read seconds per stage (used where `streamed`);
    compute_s: per stage, seconds as arrays of one shape (e.g. one entry per n).
    gap_s: seconds the target is idle before each pass (the draft growing the
    next tree): compute waits, the reader keeps filling free slots; the
    duration counts the gap.  Returns an array of that shape."""
    shape = np.shape(compute_s[0])
    zero = np.zeros(shape)
    slots_free = deque([zero] * max(1, prefetch_depth))      # release times, in read order
    reader_free = zero
    compute_end = zero
    pass_end = [zero]
    for _ in range(passes):
        compute_end = compute_end + gap_s
        for io, c, is_streamed in zip(io_s, compute_s, streamed):
            start = compute_end
            if is_streamed:
                read_end = np.maximum(reader_free, slots_free.popleft()) + io
                reader_free = read_end
                start = np.maximum(start, read_end)
            compute_end = start + c
            if is_streamed:
                slots_free.append(compute_end)
        pass_end.append(compute_end)
    return pass_end[-1] - pass_end[-2]


def hidden_credit_s(io_s: list[float], compute_s: list[np.ndarray], streamed: list[bool],
                    prefetch_depth: int, gap_s: float) -> np.ndarray:
    """Seconds of an idle gap of `gap_s` before each pass that the ring hides:
    back-to-back iteration + gap - iteration with the gap (`simulate_passes`),
    in [0, gap_s].  It grows with the gap up to about the read seconds of the
    extents that fit in the slots the pass leaves free."""
    back_to_back = simulate_passes(io_s, compute_s, streamed, prefetch_depth)
    with_gap = simulate_passes(io_s, compute_s, streamed, prefetch_depth, gap_s=gap_s)
    return np.clip(back_to_back + gap_s - with_gap, 0.0, gap_s)


class CostModel:
    """Predictions from a `DeviceProfile`, optionally scaled by online correction
    factors (`scaled`): verify_factor multiplies target passes, draft_factor
    draft forwards."""

    def __init__(self, profile: DeviceProfile, verify_factor: float = 1.0, draft_factor: float = 1.0):
        profile.validate()
        if not (verify_factor > 0 and draft_factor > 0):
            raise ValueError(f"scale factors must be > 0, got {verify_factor}, {draft_factor}")
        self.profile = profile
        self.verify_factor = float(verify_factor)
        self.draft_factor = float(draft_factor)

    # -- target ------------------------------------------------------------------

    def stage_compute_s(self, n: np.ndarray) -> list[np.ndarray]:
        """Per stage, in pass order: compute seconds at each n (the profile's fit)."""
        return self._compute(np.asarray(n, dtype=np.float64))

    def _compute(self, n: np.ndarray) -> list[np.ndarray]:
        p = self.profile
        return [interpolate(p.n_grid, s.compute_s, n, p.fixed_shapes, p.pass_spread) for s in p.stages]

    def _embed(self, n: np.ndarray) -> np.ndarray:
        p = self.profile
        return interpolate(p.n_grid, p.embed_s, n, p.fixed_shapes, p.pass_spread)

    def verify_s(self, n_max: int) -> np.ndarray:
        """float64 [n_max]: entry n-1 = predicted seconds of one target pass over n tree tokens."""
        n = np.arange(1, int(n_max) + 1, dtype=np.float64)
        p = self.profile
        ring = simulate_passes([s.io_s for s in p.stages], self._compute(n), [s.streamed for s in p.stages],
                               p.prefetch_depth)
        return (ring + self._embed(n)) * self.verify_factor

    def compute_s(self, n_max: int) -> np.ndarray:
        """float64 [n_max]: the pass's pure compute (no flash wait), Σ C + embedding."""
        n = np.arange(1, int(n_max) + 1, dtype=np.float64)
        return (np.sum(self._compute(n), axis=0) + self._embed(n)) * self.verify_factor

    @property
    def io_floor_s(self) -> float:
        """Seconds to read one pass's streamed extents back to back: no pass is faster."""
        return sum(s.io_s for s in self.profile.stages if s.streamed) * self.verify_factor

    def hidden_draft_curve(self, n_max: int) -> np.ndarray:
        """float64 [n_max]: entry n-1 = seconds of draft time the prefetch ring hides
        before a pass over n tree tokens.  While the draft grows the next tree
        the reader fills the free slots with the next pass's first streamed
        extents, so that pass stalls less; a pass that waits on flash gains, a
        compute-bound one does not.  The credit of a long gap (`hidden_credit_s`
        with a gap of twice a pass's reads, where it has saturated); 0.0 when
        nothing is streamed.  A draft of D seconds then costs max(0, D - credit)."""
        p = self.profile
        streamed = [s.streamed for s in p.stages]
        n = np.arange(1, int(n_max) + 1, dtype=np.float64)
        if not any(streamed):
            return np.zeros(len(n))
        io = [s.io_s for s in p.stages]
        gap = 2.0 * sum(t for t, on in zip(io, streamed) if on)
        return hidden_credit_s(io, self._compute(n), streamed, p.prefetch_depth, gap) * self.verify_factor

    def hidden_draft_s(self, n_max: int = 64) -> float:
        """The least of `hidden_draft_curve` over passes of n = 1..n_max tree tokens
        (seconds): draft time hidden whatever the tree."""
        return float(np.min(self.hidden_draft_curve(n_max)))

    @property
    def spread(self) -> float:
        """The profile's typical relative spread of a pass measurement (unitless)."""
        return profile_spread(self.profile)

    def io_share(self, n: int = 1) -> float:
        """Fraction of a pass over n tokens spent stalled on flash: (pass - pure compute) / pass."""
        total = float(self.verify_s(n)[n - 1])
        pure = float(self.compute_s(n)[n - 1])
        return max(0.0, total - pure) / total if total > 0 else 0.0

    # -- draft and host ------------------------------------------------------------

    def draft_s(self, f_max: int) -> np.ndarray:
        """float64 [f_max]: entry f-1 = predicted seconds of one draft forward over f nodes."""
        p = self.profile
        f = np.arange(1, int(f_max) + 1, dtype=np.float64)
        # the draft runs on the CPU's native kernels whatever runs the target: never a step function
        return interpolate(p.draft_grid, p.draft_s, f, False, p.draft_spread) * self.draft_factor

    @property
    def iteration_overhead_s(self) -> float:
        """Seconds of host work per iteration (masks, acceptance walk, cache compaction)."""
        return self.profile.iteration_overhead_s

    # -- derived -------------------------------------------------------------------

    def scaled(self, verify_factor: float, draft_factor: float) -> "CostModel":
        """The same profile with the target and draft predictions multiplied further."""
        return CostModel(self.profile, self.verify_factor * verify_factor, self.draft_factor * draft_factor)

    def summary(self) -> dict:
        """Pass seconds at a few n, I/O per pass, streamed stages, I/O share, draft seconds."""
        p = self.profile
        verify = self.verify_s(max(SUMMARY_N))
        draft = self.draft_s(p.draft_grid[-1])
        return {"pass_s": {n: float(verify[n - 1]) for n in SUMMARY_N},
                "io_bytes_per_pass": p.io_bytes_per_pass,
                "io_floor_s": self.io_floor_s,
                "stages": len(p.stages),
                "streamed_stages": sum(s.streamed for s in p.stages),
                "prefetch_depth": p.prefetch_depth,
                "io_share": {1: self.io_share(1), 64: self.io_share(64)},
                "draft_s": {f: float(draft[f - 1]) for f in p.draft_grid},
                "iteration_overhead_s": self.iteration_overhead_s}
