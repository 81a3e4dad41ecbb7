"""Measuring a DeviceProfile on this device (see `lever.cost.profile`).

Target compute per stage comes from the decoder's `stage_times` hook (which
excludes waiting on flash); flash read times come from synchronous O_DIRECT
reads of each streamed extent; the draft is timed per whole forward.  Every
timed forward runs a random token tree of n nodes over a `context_tokens`
context and is truncated away afterwards, so the context stays the same.

Robustness (issue 14): each model first runs untimed forwards (the
largest grid point, which sizes every buffer, then the smallest; on a
static-shape backend every row bucket once).  Each grid
point is then timed `repeats` times (default 5).  A run whose total (the
pass's compute over all stages; the draft forward) lies more than
OUTLIER_K robust standard deviations from the median of the runs is dropped
(robust SD = 1.4826 x the median absolute deviation, at least OUTLIER_FLOOR
of the median), and each stage keeps its median over the remaining runs.
The spread stored per point is the robust SD of the kept totals over their
median.  A point still spread by more than UNSTABLE_SPREAD gets `repeats`
more runs, once.  At the end, VALIDATION_POINTS grid points spread over
each grid are timed again (VALIDATION_REPEATS runs); when the check's
median differs from the stored one by more than max(VALIDATION_FLOOR,
VALIDATION_K x spread), the point is measured again from scratch and
checked again, at most VALIDATION_RETRIES times; of two disagreeing
measurements the faster is kept (another process on the cores only ever
slows a run; what the machine gives at run time is followed online, see
lever.cost.drift).  Progress lines and the profile's `validation` records
say what happened.

Grid: the default n grid goes to 128 tokens; larger trees are priced by the
fit's linear extrapolation (a pass that large is compute-bound).  With 5
repeats that is about 5 x Σ pass(n) over the grid: on this repository's
2-core x86 test machine about 2 minutes for the 1.5B target streamed from
flash.  Times are seconds.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from ..errors import ProfileError
from ..store.flash_reader import aligned_empty
from ..values import fmt_bytes
from .backend import simulated_npu, static_layers, target_backend
from .device_profile import DEFAULT_DRAFT_GRID, DEFAULT_N_GRID, DeviceProfile, Stage, check_grid
from .timing import (OVERHEAD_NODES, Run, compact_seconds, context_cache, forward_run, printer, random_tree,
                     target_run, tree_walk_seconds)

IO_READS = 3                 # synchronous reads per streamed extent (median)

DEFAULT_REPEATS = 5          # timed runs per grid point
OUTLIER_K = 3.0              # a run this many robust SDs from the median is dropped ...
OUTLIER_FLOOR = 0.02         # ... the robust SD counted as at least 2 % of the median
MAD_SCALE = 1.4826           # median absolute deviation -> standard deviation (normal data)
UNSTABLE_SPREAD = 0.10       # a point spread more than 10 % gets `repeats` more runs, once
VALIDATION_POINTS = 3        # grid points re-checked at the end, per curve
VALIDATION_REPEATS = 3       # runs of one check
VALIDATION_FLOOR = 0.10      # a check agrees within max(10 %, ...
VALIDATION_K = 3.0           # ... 3 spreads) of the stored median
VALIDATION_RETRIES = 2       # re-measurements of a disagreeing point at most

@dataclass
class PointTimes:
    """The timed runs of one grid point, summarised."""

    n: int
    stages: dict[str, float]    # median seconds per stage over the kept runs, in pass order
    total_s: float              # median of the kept runs' totals (seconds)
    spread: float               # robust SD of the kept totals / their median
    runs: int                   # runs timed
    rejected: int               # of them dropped as outliers


def measure_settings(n_grid=DEFAULT_N_GRID, draft_grid=DEFAULT_DRAFT_GRID, context_tokens: int = 128,
                     repeats: int = DEFAULT_REPEATS) -> dict:
    """The measurement parameters, checked, as the JSON part of a cache key."""
    if int(context_tokens) < 1:
        raise ProfileError(f"context_tokens must be >= 1, got {context_tokens}")
    if int(repeats) < 1:
        raise ProfileError(f"repeats must be >= 1, got {repeats}")
    return {"n_grid": check_grid(n_grid, "n_grid"), "draft_grid": check_grid(draft_grid, "draft_grid"),
            "context_tokens": int(context_tokens), "repeats": int(repeats)}


def measure_profile(target, draft_model, key: dict, n_grid=DEFAULT_N_GRID, draft_grid=DEFAULT_DRAFT_GRID,
                    context_tokens: int = 128, repeats: int = DEFAULT_REPEATS,
                    progress: bool = True) -> DeviceProfile:
    """Measure `target` (a model in DRAM or a `StreamedDecoder`) and `draft_model`
    (a model in DRAM) on this device; `key` is stored in the profile as is.

    Warm-up, `repeats` runs per grid point with outliers dropped, per-stage
    medians, the spread, and an end-of-measurement validation: see the
    module doc.  Progress lines go to stderr.  Models speak the numpy model
    protocol (lever.model.loading) and have the `stage_times` hook.
    """
    cfg = measure_settings(n_grid, draft_grid, context_tokens, repeats)
    n_grid, draft_grid, ctx, repeats = cfg["n_grid"], cfg["draft_grid"], cfg["context_tokens"], cfg["repeats"]
    say = printer(progress)
    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    streamed = hasattr(target, "plan")
    if streamed:
        target.settle()              # the ring's reads in flight are the next pass's, not the measurement's
    counter = ReadCounter(target)
    io = _measure_io(target, say) if streamed else {}
    fixed = static_layers(target) is not None
    target_cache = context_cache(target, ctx, max(n_grid[-1], OVERHEAD_NODES), rng)
    run_target = target_run(target, target_cache, rng)
    warm_up(run_target, n_grid, every=fixed)
    target_points = measure_curve(run_target, n_grid, repeats, say, "target", "n", "compute ")
    draft_cache = context_cache(draft_model, ctx, draft_grid[-1], rng)
    run_draft = forward_run(draft_model, draft_cache, rng)
    warm_up(run_draft, draft_grid)
    draft_points = measure_curve(run_draft, draft_grid, repeats, say, "draft", "f")
    validation = (validate_curve(run_target, target_points, repeats, say, "target", "n")
                  + validate_curve(run_draft, draft_points, repeats, say, "draft", "f"))
    overhead = _measure_overhead(target, target_cache, draft_model, ctx, rng)
    say(f"profile: iteration overhead {overhead * 1e3:.2f} ms (a {OVERHEAD_NODES}-node tree)")
    times = {name: [p.stages[name] for p in target_points] for name in target_points[0].stages}
    stages = pass_stages(target, times, io, len(n_grid))
    return DeviceProfile(key=key, n_grid=n_grid, stages=stages, embed_s=times["embed"],
                         draft_grid=draft_grid, draft_s=[p.total_s for p in draft_points],
                         iteration_overhead_s=overhead,
                         prefetch_depth=target.plan.prefetch_depth if streamed else 0, fixed_shapes=fixed,
                         created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         measure_s=time.perf_counter() - t_start,
                         pass_spread=[p.spread for p in target_points],
                         draft_spread=[p.spread for p in draft_points], validation=validation,
                         rejected_runs=sum(p.rejected for p in target_points + draft_points),
                         backend=target_backend(target), simulated=simulated_npu(target),
                         read_bytes=counter.bytes)


class ReadCounter:
    """Bytes a target read from flash since this was made: its reader's (extents)
    plus the embedding rows read on demand; 0 for a target in DRAM."""

    def __init__(self, target):
        self.target = target
        self.start = self._now()

    def _now(self) -> int:
        reader = getattr(self.target, "reader", None)
        stats = getattr(self.target, "stats", None)
        return (int(reader.stats()["bytes_read"]) if reader is not None else 0) \
            + int(getattr(stats, "embedding_bytes", 0))

    @property
    def bytes(self) -> int:
        return self._now() - self.start


# -- repeats, outliers, validation ----------------------------------------------------

def warm_up(run: Run, grid: list[int], every: bool = False) -> None:
    """Untimed forwards before timing: the largest grid point (every buffer at its
    largest size), then the smallest; with `every` (a static-shape backend's row
    buckets) each point once, so that every bucket's session is made (a qnn
    context binary compiled or loaded) before anything is timed."""
    for n in (grid if every else [grid[-1], grid[0]]):
        run(n)


def kept_runs(totals: list[float]) -> list[bool]:
    """Which runs to keep: those within OUTLIER_K robust SDs of the median total."""
    m = statistics.median(totals)
    sd = max(MAD_SCALE * statistics.median(abs(t - m) for t in totals), OUTLIER_FLOOR * m)
    return [abs(t - m) <= OUTLIER_K * sd for t in totals]


def relative_spread(values: list[float]) -> float:
    """Robust SD (1.4826 x median absolute deviation) over the median; 0 for one value."""
    m = statistics.median(values)
    if m <= 0:
        return 0.0
    return MAD_SCALE * statistics.median(abs(v - m) for v in values) / m


def summarise(n: int, runs: list[list[tuple[str, float]]]) -> PointTimes:
    """Drop the outlier runs and take medians (see the module doc)."""
    names = [name for name, _ in runs[0]]
    if any([name for name, _ in r] != names for r in runs):
        raise ProfileError(f"the timed runs at n={n} recorded different stages")
    totals = [sum(s for _, s in r) for r in runs]
    keep = kept_runs(totals)
    kept = [r for r, k in zip(runs, keep) if k]
    kept_totals = [t for t, k in zip(totals, keep) if k]
    stages = {name: statistics.median(r[i][1] for r in kept) for i, name in enumerate(names)}
    return PointTimes(n=n, stages=stages, total_s=statistics.median(kept_totals),
                      spread=relative_spread(kept_totals), runs=len(runs), rejected=len(runs) - len(kept))


def measure_point(run: Run, n: int, repeats: int, extend: bool = True) -> PointTimes:
    """`repeats` timed runs at n (and as many again, once, when `extend` and the
    kept runs are spread more than UNSTABLE_SPREAD), summarised."""
    runs = [run(n) for _ in range(repeats)]
    point = summarise(n, runs)
    if extend and point.spread > UNSTABLE_SPREAD:
        runs += [run(n) for _ in range(repeats)]
        point = summarise(n, runs)
    return point


def _point_line(label: str, var: str, point: PointTimes, what: str = "") -> str:
    notes = [f"spread {point.spread:.1%}", f"{point.runs} runs"]
    if point.rejected:
        notes.append(f"{point.rejected} outlier{'s' if point.rejected > 1 else ''} dropped")
    return f"{label} {var}={point.n:<4d} {what}{point.total_s * 1e3:9.1f} ms ({', '.join(notes)})"


def measure_curve(run: Run, grid: list[int], repeats: int, say, label: str, var: str = "n",
                  what: str = "") -> list[PointTimes]:
    """One `PointTimes` per grid point; a progress line each."""
    points = []
    for k, n in enumerate(grid):
        points.append(measure_point(run, n, repeats))
        say(f"profile: {_point_line(label, var, points[-1], what)} [{k + 1}/{len(grid)}]")
    return points


def validation_indices(points: int) -> list[int]:
    """VALIDATION_POINTS indices spread over a grid of `points` (all when it is that small)."""
    if points <= VALIDATION_POINTS:
        return list(range(points))
    inner = np.linspace(0, points - 1, VALIDATION_POINTS + 2)[1:-1]
    return sorted({int(round(x)) for x in inner})


def validate_curve(run: Run, points: list[PointTimes], repeats: int, say, curve: str,
                   var: str = "n") -> list[dict]:
    """Re-check a few points (see the module doc); a point that disagrees is
    measured again and replaced in `points`.  Returns one record per checked
    point: curve, n, stored_s (the first median), checks (each check's
    median), tolerance (relative), remeasured (times), final_s, agreed."""
    records = []
    for i in validation_indices(len(points)):
        point = points[i]
        rec = {"curve": curve, "n": point.n, "stored_s": point.total_s, "checks": [], "tolerance": 0.0,
               "remeasured": 0, "final_s": point.total_s, "agreed": False}
        for attempt in range(VALIDATION_RETRIES + 1):
            check = measure_point(run, point.n, VALIDATION_REPEATS, extend=False).total_s
            tol = max(VALIDATION_FLOOR, VALIDATION_K * point.spread)
            rec["checks"].append(check)
            rec["tolerance"] = tol
            if abs(check - point.total_s) <= tol * point.total_s:
                rec["agreed"] = True
                break
            verdict = (f"profile: validation {curve} {var}={point.n}: stored {point.total_s * 1e3:.1f} ms, "
                       f"check {check * 1e3:.1f} ms (beyond {tol:.0%})")
            if attempt == VALIDATION_RETRIES:
                say(f"{verdict}: still disagrees after {attempt} re-measurements; keeping the faster")
                break
            again = measure_point(run, point.n, repeats)
            if again.total_s < point.total_s:        # contention only slows a run: keep the faster
                point = points[i] = again
            rec["remeasured"] += 1
            say(f"{verdict}: measured again -> {again.total_s * 1e3:.1f} ms (spread {again.spread:.1%}); "
                f"keeping {point.total_s * 1e3:.1f} ms")
        rec["final_s"] = point.total_s
        if rec["agreed"]:
            say(f"profile: validation {curve} {var}={point.n}: ok (check {rec['checks'][-1] * 1e3:.1f} ms, "
                f"stored {point.total_s * 1e3:.1f} ms, within {rec['tolerance']:.0%})")
        records.append(rec)
    return records


# -- flash ------------------------------------------------------------------------

def _measure_io(target, say) -> dict[str, tuple[float, int]]:
    """{extent name: (median seconds of a synchronous O_DIRECT read, bytes)} of the
    streamed extents; the prefetch ring is idle while they are timed."""
    extents = target.plan.streamed
    if not extents:
        return {}
    target.settle()
    buf = aligned_empty(max(e.length for e in extents))
    out = {}
    for e in extents:
        samples = []
        for _ in range(IO_READS):
            t0 = time.perf_counter()
            target.reader.read(e.offset, e.length, buf[:e.length], list(e.chunk_crc32c), e.name)
            samples.append(time.perf_counter() - t0)
        out[e.name] = (statistics.median(samples), e.length)
    total_s = sum(s for s, _ in out.values())
    total_b = sum(b for _, b in out.values())
    say(f"profile: flash reads: {len(out)} streamed extents, {fmt_bytes(total_b)} in {total_s * 1e3:,.1f} ms "
        f"({total_b / total_s / 2**30 if total_s else 0:.2f} GiB/s)")
    return out


# -- compute ----------------------------------------------------------------------

def forward_seconds(model, grid: list[int], ctx: int, repeats: int, rng, say, label: str = "draft") -> list[float]:
    """Median seconds of one forward of `model` over a random f-node tree after
    `ctx` context tokens, per grid point f (the draft curve of a profile; a
    verifier server's published verify curve); warm-up and outlier runs
    dropped as in `measure_profile`, no validation."""
    cache = context_cache(model, ctx, grid[-1], rng)
    run = forward_run(model, cache, rng)
    warm_up(run, grid)
    return [p.total_s for p in measure_curve(run, grid, repeats, say, label, "f")]


def _measure_overhead(target, target_cache, draft_model, ctx: int, rng) -> float:
    """Seconds of one iteration's host work for an OVERHEAD_NODES-node tree:
    the median of making the tokens / positions / mask arrays and walking the
    tree over the target's argmax ids (OVERHEAD_REPEATS runs), plus the median
    seconds of compacting the target's and the draft's KV caches to the
    accepted path.  (The argmax itself is the target's head: a pass stage.)
    `target_cache` holds `ctx` context rows."""
    tree = random_tree(OVERHEAD_NODES, target.config.vocab_size, rng)
    walk_s, keep = tree_walk_seconds(tree, ctx)
    draft_cache = context_cache(draft_model, ctx, OVERHEAD_NODES, rng)
    return walk_s + sum(compact_seconds(model, cache, tree, keep)
                                            for model, cache in ((target, target_cache), (draft_model, draft_cache)))


# -- assembling the stages ----------------------------------------------------------

def pass_stages(target, times: dict[str, list[float]], io: dict, n_points: int) -> list[Stage]:
    """Stages in pass order from per-stage compute times (`times`: stage name ->
    seconds at each of the `n_points` grid points; "embed", "head" and every
    "layer.<i>") and flash reads (`io`: extent name -> (seconds, bytes)).  A
    streamed store's head is one stage per head part (each is its own extent),
    sharing the measured head time by rows.  Used by `measure_profile` and by
    lever.cost.npu_profile (a device's measured bucket times)."""
    missing = [k for k in ("embed", "head") if k not in times]
    if missing:
        raise ProfileError(f"the target recorded no {', '.join(missing)} time (stage_times hook missing?)")
    layers = [Stage(name, "layer", *io.get(name, (0.0, 0)), times[name])
              for name in times if name.startswith("layer.")]
    head = times["head"]
    manifest = getattr(target, "manifest", None)
    if manifest is None:
        return layers + [Stage("head", "head", 0.0, 0, head)]
    vocab = target.config.vocab_size
    parts = []
    for e in manifest.head_parts:
        share = (e.rows[1] - e.rows[0]) / vocab
        parts.append(Stage(e.name, "head", *io.get(e.name, (0.0, 0)), [h * share for h in head]))
    return layers + parts
