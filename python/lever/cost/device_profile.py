"""What `lever profile` measures: per-stage flash-read and compute times.

Units: every time is in seconds, every size in bytes, `n` counts tree tokens
of one target pass (root included) and `f` the frontier nodes of one draft
forward.  Lists named `*_s` and `*_spread` are aligned with their grid.

Stored times are the raw per-point medians (outlier runs rejected); the cost
model fits its curves to them when it is built (`lever.cost.fit`), so a
better fit never needs a file rewritten.  A spread is relative: a robust
standard deviation of the repeats (1.4826 x their median absolute deviation)
over their median, e.g. 0.03 for 3 %; an empty spread list means unknown
(synthetic profiles).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import ProfileError

VERSION = 2                       # 2: spreads, validation, rejected runs; medians of >= 5 runs
# Tree tokens per pass measured: past 128 a pass is compute-bound and grows
# linearly, which the fit extrapolates (measuring 192 and 256 took most of the
# profile's time for trees that never pay on a phone-class CPU).
DEFAULT_N_GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DEFAULT_DRAFT_GRID = (1, 2, 4, 8, 16, 32, 64)
STAGE_KINDS = ("layer", "head")
BACKENDS = ("native", "cpu-static", "qnn", "npu-profile")     # DeviceProfile.backend


@dataclass
class Stage:
    """One step of a target pass, in pass order.

    name:      "layer.N", or "head" / "head.K" (a part of the output head).
    io_s:      seconds to read its extent from flash (O_DIRECT); 0.0 when the
               extent is pinned in DRAM or the model is resident.
    io_bytes:  bytes read from flash per pass; 0 when pinned / resident.
    compute_s: seconds of dequantisation + arithmetic, one per `n_grid` point.
    """

    name: str
    kind: str
    io_s: float
    io_bytes: int
    compute_s: list[float]

    @property
    def streamed(self) -> bool:
        """True when the stage is read from flash every pass."""
        return self.io_bytes > 0 or self.io_s > 0


@dataclass
class DeviceProfile:
    """Measured costs of one (target, draft, backend, machine) combination; see module doc."""

    key: dict
    n_grid: list[int]
    stages: list[Stage]
    embed_s: list[float]
    draft_grid: list[int]
    draft_s: list[float]
    iteration_overhead_s: float       # host work per iteration: mask/positions, argmax, walk, compaction
    prefetch_depth: int               # ring slots of the streamed target (0: nothing streamed)
    fixed_shapes: bool = False        # compute is a step function over n_grid (static-shape backends)
    created: str = ""                 # ISO 8601 time of the measurement
    measure_s: float = 0.0            # seconds the measurement took
    pass_spread: list[float] = field(default_factory=list)    # per n_grid point: relative spread of the pass compute
    draft_spread: list[float] = field(default_factory=list)   # per draft_grid point: of the draft forward
    validation: list[dict] = field(default_factory=list)      # the end-of-measurement re-checks (lever.cost.measure)
    rejected_runs: int = 0            # timed runs dropped as outliers
    backend: str = "native"           # what ran the target's layers: native (the CPU kernels of
                                      # `kernels` in the key), cpu-static, qnn, or npu-profile (a
                                      # device's measured figures, lever.cost.npu_profile)
    simulated: bool = False           # the times are of a simulated NPU (qnn's HTP simulator on a
                                      # non-ARM host): never a phone's speed
    quick: bool = False               # estimated by lever.cost.quick (one layer per layout, a few
                                      # reads per extent size), not measured pass by pass
    read_bytes: int = 0               # bytes read from flash while measuring (0: not counted)
    version: int = field(default=VERSION)

    @property
    def io_bytes_per_pass(self) -> int:
        return sum(s.io_bytes for s in self.stages)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "DeviceProfile":
        """Rebuild a profile from `to_json()`; ProfileError if it is of another
        version or inconsistent (grids, list lengths, stage kinds)."""
        if not isinstance(d, dict) or d.get("version") != VERSION:
            got = d.get("version") if isinstance(d, dict) else None
            raise ProfileError(f"profile version {got!r} is not {VERSION}")
        try:
            stages = [Stage(str(s["name"]), str(s["kind"]), float(s["io_s"]), int(s["io_bytes"]),
                            [float(x) for x in s["compute_s"]]) for s in d["stages"]]
            p = cls(key=dict(d["key"]), n_grid=[int(n) for n in d["n_grid"]], stages=stages,
                    embed_s=[float(x) for x in d["embed_s"]], draft_grid=[int(f) for f in d["draft_grid"]],
                    draft_s=[float(x) for x in d["draft_s"]],
                    iteration_overhead_s=float(d["iteration_overhead_s"]),
                    prefetch_depth=int(d["prefetch_depth"]), fixed_shapes=bool(d["fixed_shapes"]),
                    created=str(d.get("created", "")), measure_s=float(d.get("measure_s", 0.0)),
                    pass_spread=[float(x) for x in d["pass_spread"]],
                    draft_spread=[float(x) for x in d["draft_spread"]],
                    validation=[dict(r) for r in d["validation"]], rejected_runs=int(d["rejected_runs"]),
                    backend=str(d.get("backend", "native")), simulated=bool(d.get("simulated", False)),
                    quick=bool(d.get("quick", False)), read_bytes=int(d.get("read_bytes", 0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"malformed profile ({type(e).__name__}: {e})") from None
        p.validate()
        return p

    def validate(self) -> None:
        """ProfileError unless grids are increasing positive integers, every
        list matches its grid (a spread list may be empty: unknown), and the
        validation records name grid points."""
        for name, grid in (("n_grid", self.n_grid), ("draft_grid", self.draft_grid)):
            check_grid(grid, name)
        if not self.stages:
            raise ProfileError("profile has no stages")
        aligned = [("embed_s", self.embed_s, self.n_grid), ("draft_s", self.draft_s, self.draft_grid)]
        aligned += [(f"{s.name}.compute_s", s.compute_s, self.n_grid) for s in self.stages]
        for name, values, grid in aligned:
            if len(values) != len(grid):
                raise ProfileError(f"profile: {name} has {len(values)} entries for a grid of {len(grid)}")
            if any(not v >= 0 for v in values):
                raise ProfileError(f"profile: {name} has a negative or NaN time")
        for name, values, grid in (("pass_spread", self.pass_spread, self.n_grid),
                                   ("draft_spread", self.draft_spread, self.draft_grid)):
            if values and len(values) != len(grid):
                raise ProfileError(f"profile: {name} has {len(values)} entries for a grid of {len(grid)}")
            if any(not 0 <= v < float("inf") for v in values):
                raise ProfileError(f"profile: {name} has a negative, infinite or NaN spread")
        for r in self.validation:
            _check_validation_record(r, {"target": self.n_grid, "draft": self.draft_grid})
        if self.rejected_runs < 0 or self.read_bytes < 0:
            raise ProfileError("profile: negative count of rejected runs or bytes read")
        for s in self.stages:
            if s.kind not in STAGE_KINDS:
                raise ProfileError(f"profile: stage {s.name} has kind {s.kind!r} (expected layer or head)")
            if not s.io_s >= 0 or s.io_bytes < 0:
                raise ProfileError(f"profile: stage {s.name} has a negative read time or size")
        if self.backend not in BACKENDS:
            raise ProfileError(f"profile: backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.prefetch_depth < 0 or not self.iteration_overhead_s >= 0:
            raise ProfileError("profile: negative prefetch depth or iteration overhead")


def _check_validation_record(r, grids: dict) -> None:
    """ProfileError unless `r` is a record of lever.cost.measure.validate_curve for a grid point."""
    def seconds(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < float("inf")
    ok = (isinstance(r, dict) and r.get("curve") in tuple(grids) and r.get("n") in grids[r["curve"]]
          and all(seconds(r.get(k)) for k in ("stored_s", "final_s", "tolerance"))
          and isinstance(r.get("checks"), list) and r["checks"] and all(seconds(c) for c in r["checks"])
          and isinstance(r.get("remeasured"), int) and r["remeasured"] >= 0 and isinstance(r.get("agreed"), bool))
    if not ok:
        raise ProfileError(f"profile: malformed validation record {r!r}")


def check_grid(grid, name: str = "grid") -> list[int]:
    """`grid` as a list of strictly increasing positive ints; ProfileError otherwise."""
    try:
        out = [int(g) for g in grid]
    except (TypeError, ValueError):
        raise ProfileError(f"{name} must be a list of integers, got {grid!r}") from None
    if not out or out[0] < 1 or any(b <= a for a, b in zip(out, out[1:])) or any(o != g for o, g in zip(out, grid)):
        raise ProfileError(f"{name} must be strictly increasing positive integers, got {list(grid)}")
    return out
