"""What `lever profile` measures: per-stage flash-read and compute times.

Units: every time is in seconds, every size in bytes, `n` counts tree tokens
of one target pass (root included) and `f` the frontier nodes of one draft
forward.  Lists named `*_s` are aligned with their grid.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..errors import ProfileError

VERSION = 1
DEFAULT_N_GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
DEFAULT_DRAFT_GRID = (1, 2, 4, 8, 16, 32, 64)
STAGE_KINDS = ("layer", "head")


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
                    created=str(d.get("created", "")), measure_s=float(d.get("measure_s", 0.0)))
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"malformed profile ({type(e).__name__}: {e})") from None
        p.validate()
        return p

    def validate(self) -> None:
        """ProfileError unless grids are increasing positive integers and every
        list matches its grid."""
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
        for s in self.stages:
            if s.kind not in STAGE_KINDS:
                raise ProfileError(f"profile: stage {s.name} has kind {s.kind!r} (expected layer or head)")
            if not s.io_s >= 0 or s.io_bytes < 0:
                raise ProfileError(f"profile: stage {s.name} has a negative read time or size")
        if self.prefetch_depth < 0 or not self.iteration_overhead_s >= 0:
            raise ProfileError("profile: negative prefetch depth or iteration overhead")


def check_grid(grid, name: str = "grid") -> list[int]:
    """`grid` as a list of strictly increasing positive ints; ProfileError otherwise."""
    try:
        out = [int(g) for g in grid]
    except (TypeError, ValueError):
        raise ProfileError(f"{name} must be a list of integers, got {grid!r}") from None
    if not out or out[0] < 1 or any(b <= a for a, b in zip(out, out[1:])) or any(o != g for o, g in zip(out, grid)):
        raise ProfileError(f"{name} must be strictly increasing positive integers, got {list(grid)}")
    return out
