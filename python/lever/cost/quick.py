"""A quick device profile: what mode lever needs on a first run, estimated in
seconds instead of measured for a minute (`lever profile` still measures
everything; see lever.cost.measure).

The full measurement times whole target passes for every tree size n of its
grid, each pass streaming every layer from flash: about a minute and some
80 GB of reads for a 1.5B store.  But a pass is a sequence of stages that
cost alike -- every decoder layer of one tensor layout (names, block types,
shapes) does the same arithmetic, every streamed extent of one size takes
the same read -- so this module times one representative of each kind and
prices the rest from it:

- flash: IO_READS synchronous O_DIRECT reads of each distinct streamed
  extent size (different extents of that size, round robin over the sizes),
  the median priced to every extent of that size.  If that would read more
  than one pass's worth (a store whose extents all differ in size), every
  streamed extent is read once instead.
- compute: per layer layout, ONE layer (a pinned one when there is one, so
  nothing extra is read) runs alone over a context of `context_tokens`
  tokens for every n of the grid, `repeats` times (the median; outliers
  dropped as in the full measurement, but no extra runs and no validation),
  and every layer of that layout gets its curve.  The head: the largest
  head part of each block type, timed with the argmax a greedy verification
  uses, priced to every part by its rows (plus the final norm).  The
  embedding lookup and pass set-up are timed per n.
- the draft (in DRAM) the same way, layer layout by layout, over the draft
  grid (a draft forward is the sum of its stages; past the grid the cost
  model extrapolates linearly); a draft not on the native layers is timed
  by whole forwards.  The per-iteration host work as in the full
  measurement, the KV-cache compactions on rows committed without a
  forward.

Timed alone, a layer's weights are as fresh in the caches as in a pass that
has just read them (on the 2-core development VM, a layer computed right
after an O_DIRECT read of its bytes took the same time as one computed
again and again from the same buffer), so the estimate is not biased low
for that reason; what it does not see is a busy machine during long
passes, which the drift follows.

The result is a `DeviceProfile` like a measured one (so the cost model and
the policy take it as is) with `quick` set and `{"quick": true, ...}` in the
measurement settings of its key, so it never stands for a full measurement
and an explicit `lever profile` (another key) measures everything.  Mode
lever's realised pass seconds correct it at run time (lever.cost.drift; for
a quick profile the drift threshold is its floor, see `profile_spread`).

Bytes read while estimating: at most one pass's worth for the reads, plus
the representative layers and head parts that are not pinned (a few
extents), plus embedding rows: about half a pass for the 1.5B store, against
a few dozen passes for the full measurement.  `DeviceProfile.read_bytes`
records it.  Units: seconds, bytes; n counts tree tokens per pass.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime, timezone

import numpy as np

from .. import _native
from ..errors import ProfileError
from ..masks import causal_mask
from ..store.flash_reader import aligned_empty
from ..values import fmt_bytes
from .cost_model import CostModel
from .device_profile import DEFAULT_DRAFT_GRID, DeviceProfile, Stage
from .measure import IO_READS, PointTimes, ReadCounter, measure_curve, measure_point, measure_settings, warm_up
from .timing import (COMPACT_REPEATS, OVERHEAD_NODES, compact_seconds, context_cache, forward_run, printer,
                     random_tree, tree_walk_seconds)

QUICK_N_GRID = (1, 2, 4, 8, 16, 32, 64)         # tree tokens per pass; compute grows linearly past 32,
                                                 # so the cost model's extrapolation from 32..64 prices
                                                 # larger trees (within 5 % at 128 for the 1.5B store)
QUICK_DRAFT_GRID = (1, 2, 4, 8, 16, 32)          # frontier nodes per draft forward; linear past 32
QUICK_REPEATS = 3                                # timed runs per grid point (median, outliers dropped)
QUICK_CONTEXT_TOKENS = 128


def quick_supported(target) -> bool:
    """Whether `target`'s layers can be run one at a time here: a decoder of the
    native core (lever.model.native_decoder: resident or streamed) whose layers
    run on the native CPU runner.  A static-shape backend (lever.npu) or the
    torch reference is measured in full."""
    layers = getattr(target, "layers", None)
    weights = getattr(target, "weights", None)
    return (getattr(layers, "backend", None) == "native" and not getattr(layers, "fixed_shapes", True)
            and hasattr(target, "native") and hasattr(weights, "layouts") and hasattr(weights, "head_parts"))


def quick_settings(n_grid=QUICK_N_GRID, draft_grid=QUICK_DRAFT_GRID, context_tokens: int = QUICK_CONTEXT_TOKENS,
                   repeats: int = QUICK_REPEATS) -> dict:
    """The measurement settings of a quick profile, as the "measure" part of its key."""
    return {"quick": True, **measure_settings(n_grid, draft_grid, context_tokens, repeats)}


def estimate_profile(target, draft_model, key: dict, n_grid=QUICK_N_GRID, draft_grid=QUICK_DRAFT_GRID,
                     context_tokens: int = QUICK_CONTEXT_TOKENS, repeats: int = QUICK_REPEATS,
                     progress: bool = True) -> DeviceProfile:
    """A quick profile of `target` (see `quick_supported`) and `draft_model` (a model
    in DRAM); `key` is stored as is.  One progress line before, one after
    (lever_policy prints the second with the cache path) go to stderr."""
    if not quick_supported(target):
        raise ProfileError("the quick profile needs a target on the native CPU layers")
    cfg = measure_settings(n_grid, draft_grid, context_tokens, repeats)
    n_grid, draft_grid, ctx, repeats = cfg["n_grid"], cfg["draft_grid"], cfg["context_tokens"], cfg["repeats"]
    say = printer(progress)
    t_start = time.perf_counter()
    streamed = hasattr(target, "plan")
    if streamed:
        target.settle()                  # the ring's reads in flight are the next pass's, not ours
    counter = ReadCounter(target)
    groups = layer_groups(target)
    say(f"profile: measuring this device (flash reads, one layer's compute per layer type: "
        f"{len(groups)} of {len(target.weights.layouts)} layers, the draft) ...")
    rng = np.random.default_rng(0)
    stages, embed_s, spread, rejected = estimate_target_stages(target, n_grid, ctx, repeats, rng)
    if quick_supported(draft_model):          # its layers one at a time too (it is in DRAM: no reads)
        d_stages, d_embed, draft_spread, d_rejected = estimate_target_stages(draft_model, draft_grid, ctx,
                                                                             repeats, rng)
        draft_s = [sum(s.compute_s[k] for s in d_stages) + d_embed[k] for k in range(len(draft_grid))]
        draft_cache = draft_model.new_cache(capacity=ctx + OVERHEAD_NODES)
        _commit(draft_model, draft_cache, None, np.arange(ctx, dtype=np.int64), causal_mask(ctx, 0))
    else:                                     # whole forwards, as the full measurement times them
        draft_cache = context_cache(draft_model, ctx, draft_grid[-1], rng)
        run_draft = forward_run(draft_model, draft_cache, rng)
        warm_up(run_draft, draft_grid)
        points = measure_curve(run_draft, draft_grid, repeats, lambda _: None, "draft", "f")
        draft_s, draft_spread = [p.total_s for p in points], [p.spread for p in points]
        d_rejected = sum(p.rejected for p in points)
    overhead = _quick_overhead(target, draft_model, draft_cache, ctx, rng)
    return DeviceProfile(key=key, n_grid=n_grid, stages=stages, embed_s=embed_s, draft_grid=draft_grid,
                         draft_s=draft_s, iteration_overhead_s=overhead,
                         prefetch_depth=target.plan.prefetch_depth if streamed else 0, fixed_shapes=False,
                         created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         measure_s=time.perf_counter() - t_start, pass_spread=spread,
                         draft_spread=draft_spread, validation=[], rejected_runs=rejected + d_rejected,
                         backend="native",
                         simulated=False, quick=True, read_bytes=counter.bytes)


def estimate_target_stages(target, n_grid: list[int], ctx: int, repeats: int,
                           rng: np.random.Generator) -> tuple[list[Stage], list[float], list[float], int]:
    """(stages in pass order, embedding seconds per n, relative spread per n, runs
    dropped as outliers) of `target`, from the reads and representative
    forwards of the module doc."""
    streamed = hasattr(target, "plan")
    buf = aligned_empty(max((e.length for e in target.plan.streamed), default=0)) if streamed else None
    io = estimate_io(target, buf) if streamed else {}
    cache = target.new_cache(capacity=ctx + n_grid[-1])
    points: list[PointTimes] = []
    layer_curve: dict[int, list[float]] = {}
    for members in layer_groups(target):
        i = _representative(target, members)
        weights = _layer_bytes(target, i, buf)
        _fill_layer(target, weights, i, cache, ctx, rng)
        run = _layer_run(target, weights, i, cache, rng, n_grid[-1])
        _warm(run, n_grid, first=not points)
        pts = [measure_point(run, n, repeats, extend=False) for n in n_grid]
        points += pts
        for member in members:
            layer_curve[member] = [p.total_s for p in pts]
    head_pts = _head_curves(target, n_grid, repeats, buf, rng)
    embed_run = _embed_run(target, cache, rng)
    _warm(embed_run, n_grid, first=False)
    embed_pts = [measure_point(embed_run, n, repeats, extend=False) for n in n_grid]
    points += [p for _, pts in head_pts.values() for p in pts]
    cfg = target.config
    layers = [Stage(f"layer.{i}", "layer", *io.get(f"layer.{i}", (0.0, 0)), layer_curve[i])
              for i in range(len(target.weights.layouts))]
    norm = [statistics.median(pts[k].stages["norm"] for _, pts in head_pts.values()) for k in range(len(n_grid))]
    names = _head_names(target)
    heads = []
    for (first, end, qtype), name in zip(target.weights.head_parts, names):
        rows_rep, pts = head_pts[qtype]
        share = (end - first) / rows_rep
        curve = [p.stages["part"] * share + nm * (end - first) / cfg.vocab_size for p, nm in zip(pts, norm)]
        heads.append(Stage(name, "head", *io.get(name, (0.0, 0)), curve))
    if len(heads) > 1 and names == ["head"] * len(heads):      # a resident head in parts: one stage
        heads = [Stage("head", "head", 0.0, 0, [sum(h.compute_s[k] for h in heads) for k in range(len(n_grid))])]
    spread = [max(p.spread for p in points if p.n == n) for n in n_grid]
    rejected = sum(p.rejected for p in points + embed_pts)
    return layers + heads, [p.total_s for p in embed_pts], spread, rejected


def estimate_pass_seconds(target, grid, context_tokens: int = QUICK_CONTEXT_TOKENS,
                          repeats: int = QUICK_REPEATS) -> list[float]:
    """Predicted seconds of one pass of `target` (see `quick_supported`) over n tree
    tokens, back to back, for each n of `grid`: the quick estimate of its
    stages through the cost model's read ring (a verifier server's published
    curve, lever.commands.serve_verifier)."""
    grid = measure_settings(grid, DEFAULT_DRAFT_GRID, context_tokens, repeats)["n_grid"]
    stages, embed_s, spread, _ = estimate_target_stages(target, grid, int(context_tokens), int(repeats),
                                                        np.random.default_rng(0))
    profile = DeviceProfile(key={}, n_grid=grid, stages=stages, embed_s=embed_s, draft_grid=[1], draft_s=[0.0],
                            iteration_overhead_s=0.0, prefetch_depth=getattr(getattr(target, "plan", None),
                                                                             "prefetch_depth", 0),
                            pass_spread=spread, quick=True)
    verify = CostModel(profile).verify_s(grid[-1])
    return [float(verify[n - 1]) for n in grid]


def _warm(run, grid: list[int], first: bool) -> None:
    """Untimed runs before timing: the largest grid point where the pass's buffers
    are not sized yet (`first`; lever.cost.measure.warm_up), else the smallest
    (the representative's weights and code path, cheaply)."""
    if first:
        warm_up(run, grid)
    else:
        run(grid[0])


# -- flash -------------------------------------------------------------------------

def estimate_io(target, buf: np.ndarray) -> dict[str, tuple[float, int]]:
    """{streamed extent name: (read seconds, bytes)}: the median of IO_READS reads per
    distinct extent size, or each extent read once when that would read more
    than a pass (module doc).  The prefetch ring is idle while reads are timed."""
    extents = target.plan.streamed
    if not extents:
        return {}
    target.settle()
    sizes: dict[int, list] = {}
    for e in extents:
        sizes.setdefault(e.length, []).append(e)
    picks = {length: [group[int(round(k))] for k in np.linspace(0, len(group) - 1, IO_READS)]
             for length, group in sizes.items()}
    if sum(length * len(p) for length, p in picks.items()) > sum(e.length for e in extents):
        picks = {length: list(group) for length, group in sizes.items()}
    samples: dict[int, list[float]] = {length: [] for length in picks}
    for k in range(max(len(p) for p in picks.values())):          # round robin over the sizes
        for length, p in picks.items():
            if k < len(p):
                e = p[k]
                t0 = time.perf_counter()
                target.reader.read(e.offset, e.length, buf[:e.length], list(e.chunk_crc32c), e.name)
                samples[length].append(time.perf_counter() - t0)
    return {e.name: (statistics.median(samples[e.length]), e.length) for e in extents}


# -- compute -----------------------------------------------------------------------

def layer_groups(target) -> list[list[int]]:
    """Decoder layer indices grouped by tensor layout (names, block types and shapes:
    the same arithmetic), in order of their first layer."""
    groups: dict[tuple, list[int]] = {}
    for i, layout in enumerate(target.weights.layouts):
        signature = tuple((name, int(qtype), tuple(shape)) for name, _, qtype, shape in layout.entries)
        groups.setdefault(signature, []).append(i)
    return list(groups.values())


def _pinned(target, name: str):
    """The DRAM copy of a streamed target's extent `name` when the plan pins it, else None."""
    return target.weights.pinned_extent(name)


def _representative(target, members: list[int]) -> int:
    """The layer of a group to run: a pinned one when there is one (nothing to read)."""
    if hasattr(target, "plan"):
        pinned = [i for i in members if _pinned(target, f"layer.{i}") is not None]
        if pinned:
            return pinned[0]
    return members[0]


def _extent_bytes(target, e, buf: np.ndarray) -> np.ndarray:
    """The bytes of a streamed target's extent `e`: pinned, or read into `buf`."""
    pinned = _pinned(target, e.name)
    if pinned is not None:
        return pinned
    out = buf[:e.length]
    target.reader.read(e.offset, e.length, out, list(e.chunk_crc32c), e.name)
    return out


def _layer_bytes(target, i: int, buf) -> np.ndarray:
    if hasattr(target, "plan"):
        return _extent_bytes(target, target.manifest.layers[i], buf)
    data, release = target.weights.layer(i)            # resident: DRAM, release is a no-op
    release()
    return data


def _head_part_bytes(target, k: int, buf) -> np.ndarray:
    if hasattr(target, "plan"):
        e = target.manifest.head_parts[k]
        t = e.tensors[0]
        return _extent_bytes(target, e, buf)[t.offset:t.offset + t.nbytes]
    data, release = target.weights.head_part(k)
    release()
    return data


def _head_names(target) -> list[str]:
    """Stage names of the head parts: the store's extent names, else "head" each."""
    manifest = getattr(target, "manifest", None)
    if manifest is None:
        return ["head"] * len(target.weights.head_parts)
    return [e.name for e in manifest.head_parts]


def _embedded(target, tokens) -> np.ndarray:
    x = np.empty((len(tokens), target.config.hidden_size), dtype=np.float32)
    target.weights.embed(target.native, np.asarray(tokens, dtype=np.int64), x)
    return x


def _commit(model, cache, x, positions, mask, layers=()) -> None:
    """One pass of the rows `x` over `cache` through the decoder layers `layers`
    only ((index, layout, bytes)), committing the rows: the other layers'
    cache rows are left as they are (their values play no part in timing)."""
    model.native.begin_pass(positions, np.ascontiguousarray(mask), cache)
    for i, layout, data in layers:
        model.native.layer(x, layout, data, cache, i)
    model.native.end_pass(cache)


def _fill_layer(target, weights, i: int, cache, ctx: int, rng) -> None:
    """Give layer i the keys and values of the `ctx` context rows: the cache is cut
    back to nothing, and the context runs through layer i alone."""
    cache.truncate(0)
    x = _embedded(target, rng.integers(0, target.config.vocab_size, ctx))
    _commit(target, cache, x, np.arange(ctx, dtype=np.int64), causal_mask(ctx, 0),
            [(i, target.weights.layouts[i], weights)])


def _layer_run(target, weights, i: int, cache, rng, n_max: int):
    """Timed forward of decoder layer i alone over a random n-node tree after the
    cached context: [("layer", seconds)].  Its input rows are embedded tokens
    (looked up once: the arithmetic does not depend on which)."""
    vocab, layout, native = target.config.vocab_size, target.weights.layouts[i], target.native
    rows = _embedded(target, rng.integers(0, vocab, n_max))

    def run(n: int) -> list[tuple[str, float]]:
        tree = random_tree(n, vocab, rng)
        n_cached = cache.length
        x = rows[:n].copy()
        native.begin_pass(tree.positions(n_cached), np.ascontiguousarray(tree.mask(n_cached)), cache)
        t0 = time.perf_counter()
        native.layer(x, layout, weights, cache, i)
        seconds = time.perf_counter() - t0
        native.end_pass(cache)
        cache.truncate(n_cached)
        return [("layer", seconds)]
    return run


def _embed_run(target, cache, rng):
    """Timed embedding lookup + pass set-up of a random n-node tree (the "embed"
    stage of a pass): [("embed", seconds)]."""
    vocab, native = target.config.vocab_size, target.native

    def run(n: int) -> list[tuple[str, float]]:
        tree = random_tree(n, vocab, rng)
        n_cached = cache.length
        tokens, positions, mask = tree.tokens().astype(np.int64), tree.positions(n_cached), tree.mask(n_cached)
        t0 = time.perf_counter()
        x = _embedded(target, tokens)
        native.begin_pass(positions, np.ascontiguousarray(mask), cache)
        seconds = time.perf_counter() - t0
        native.end_pass(cache)
        cache.truncate(n_cached)
        del x
        return [("embed", seconds)]
    return run


def _head_curves(target, n_grid: list[int], repeats: int, buf, rng) -> dict[int, tuple[int, list[PointTimes]]]:
    """{block type: (rows of its representative part, the part's PointTimes per n)},
    stages "norm" (the final norm over n rows) and "part" (that part's argmax)."""
    parts = target.weights.head_parts
    hidden = target.config.hidden_size
    out = {}
    for qtype in dict.fromkeys(q for _, _, q in parts):
        rep = max((j for j, p in enumerate(parts) if p[2] == qtype), key=lambda j: parts[j][1] - parts[j][0])
        first, end, _ = parts[rep]
        data = _head_part_bytes(target, rep, buf)

        def run(n: int, data=data, first=first, end=end, qtype=qtype) -> list[tuple[str, float]]:
            x = rng.standard_normal((n, hidden)).astype(np.float32)
            h = np.empty_like(x)
            best, ids = np.full(n, -np.inf, dtype=np.float32), np.zeros(n, dtype=np.int64)
            t0 = time.perf_counter()
            target.native.rms_norm(x, target.weights.norm, h)
            t1 = time.perf_counter()
            _native.argmax_update(h, data, qtype, end - first, first, best, ids)
            return [("norm", t1 - t0), ("part", time.perf_counter() - t1)]
        _warm(run, n_grid, first=True)
        out[qtype] = (end - first, [measure_point(run, n, repeats, extend=False) for n in n_grid])
    return out


# -- host work ---------------------------------------------------------------------

def _quick_overhead(target, draft_model, draft_cache, ctx: int, rng) -> float:
    """Seconds of one iteration's host work for an OVERHEAD_NODES-node tree, as
    lever.cost.measure's: making the arrays and walking the tree, plus compacting
    both KV caches to the accepted path, whose tree rows are committed without
    a forward where the model is native (the copy costs the same whatever the
    rows hold)."""
    n = OVERHEAD_NODES
    tree = random_tree(n, target.config.vocab_size, rng)
    total, keep = tree_walk_seconds(tree, ctx)
    target_cache = target.new_cache(capacity=ctx + n)
    _commit(target, target_cache, None, np.arange(ctx, dtype=np.int64), causal_mask(ctx, 0))
    for model, cache in ((target, target_cache), (draft_model, draft_cache)):
        total += _compact_seconds(model, cache, tree, keep)
    return total


def _compact_seconds(model, cache, tree, keep: np.ndarray) -> float:
    """Median seconds of compacting `cache` (its context rows, then `tree`'s rows) to
    the rows `keep`: the tree's rows committed without a forward on a native
    model, else by one (lever.cost.measure)."""
    if not quick_supported(model):
        return compact_seconds(model, cache, tree, keep)
    n_cached = cache.length
    samples = []
    for _ in range(COMPACT_REPEATS):
        _commit(model, cache, None, tree.positions(n_cached), tree.mask(n_cached))
        t0 = time.perf_counter()
        cache.compact(keep)
        samples.append(time.perf_counter() - t0)
        cache.truncate(n_cached)
    return statistics.median(samples)


def describe(profile: DeviceProfile, target) -> str:
    """What a quick profile read, for the progress line: bytes and passes' worth."""
    pass_bytes = _pass_bytes(target)
    worth = f", {profile.read_bytes / pass_bytes:.2f} passes' worth" if pass_bytes else ""
    return f"{fmt_bytes(profile.read_bytes)} read from flash{worth}"


def _pass_bytes(target) -> int:
    """Bytes of the store's weights a pass streams when nothing is pinned: its
    layers and head parts (0 for a target in DRAM)."""
    manifest = getattr(target, "manifest", None)
    if manifest is None or not hasattr(target, "plan"):
        return 0
    return sum(e.length for e in manifest.layers + manifest.head_parts)
