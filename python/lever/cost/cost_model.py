"""Predicted seconds of one target pass, one draft forward and one iteration's
host work, from a measured `DeviceProfile` (README, "Design").

Compute per stage is interpolated over the profile's grid: measurements are
first made non-decreasing in n (a running maximum: more tokens never cost
less, so a dip is measurement noise, e.g. the reader's checksum threads
sharing the cores), then piecewise linear in n, extrapolated linearly (never downwards) past the last grid point; on
fixed-shape backends a step function (the cost of the smallest grid point
>= n; past the largest, whole runs of it plus the step cost of the rest).

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

SIMULATED_PASSES = 3
SUMMARY_N = (1, 16, 64, 256)


def interpolate(grid, values, n: np.ndarray, fixed_shapes: bool = False) -> np.ndarray:
    """Seconds at each n (float64 array) from measurements `values` at `grid` points."""
    g = np.asarray(grid, dtype=np.float64)
    v = np.maximum.accumulate(np.asarray(values, dtype=np.float64))
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
                    prefetch_depth: int, passes: int = SIMULATED_PASSES) -> np.ndarray:
    """Duration (seconds) of the last of `passes` back-to-back passes through the
    ring described in the module doc.  io_s: read seconds per stage (used
    where `streamed`); compute_s: per stage, seconds as arrays of one shape
    (e.g. one entry per n).  Returns an array of that shape."""
    shape = np.shape(compute_s[0])
    zero = np.zeros(shape)
    slots_free = deque([zero] * max(1, prefetch_depth))      # release times, in read order
    reader_free = zero
    compute_end = zero
    pass_end = [zero]
    for _ in range(passes):
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

    def _compute(self, n: np.ndarray) -> list[np.ndarray]:
        p = self.profile
        return [interpolate(p.n_grid, s.compute_s, n, p.fixed_shapes) for s in p.stages]

    def _embed(self, n: np.ndarray) -> np.ndarray:
        p = self.profile
        return interpolate(p.n_grid, p.embed_s, n, p.fixed_shapes)

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
        return interpolate(p.draft_grid, p.draft_s, f, p.fixed_shapes) * self.draft_factor

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
