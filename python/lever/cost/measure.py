"""Measuring a DeviceProfile on this device (see `lever.cost.profile`).

Target compute per stage comes from the decoder's `stage_times` hook (which
excludes waiting on flash); flash read times come from synchronous O_DIRECT
reads of each streamed extent; the draft is timed per whole forward.  Every
timed forward runs a random token tree of n nodes over a `context_tokens`
context and is truncated away afterwards, so the context stays the same.
Times are seconds.
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import datetime, timezone

import numpy as np

from ..errors import ProfileError
from ..masks import causal_mask
from ..tree import TokenTree
from .device_profile import DEFAULT_DRAFT_GRID, DEFAULT_N_GRID, DeviceProfile, Stage, check_grid

IO_READS = 3                 # synchronous reads per streamed extent (median)
OVERHEAD_NODES = 32          # tree size of the iteration-overhead measurement
OVERHEAD_REPEATS = 20
COMPACT_REPEATS = 3          # cache compactions timed per model (each after an untimed tree forward)


def measure_settings(n_grid=DEFAULT_N_GRID, draft_grid=DEFAULT_DRAFT_GRID, context_tokens: int = 128,
                     repeats: int = 2) -> dict:
    """The measurement parameters, checked, as the JSON part of a cache key."""
    if int(context_tokens) < 1:
        raise ProfileError(f"context_tokens must be >= 1, got {context_tokens}")
    if int(repeats) < 1:
        raise ProfileError(f"repeats must be >= 1, got {repeats}")
    return {"n_grid": check_grid(n_grid, "n_grid"), "draft_grid": check_grid(draft_grid, "draft_grid"),
            "context_tokens": int(context_tokens), "repeats": int(repeats)}


def measure_profile(target, draft_model, key: dict, n_grid=DEFAULT_N_GRID, draft_grid=DEFAULT_DRAFT_GRID,
                    context_tokens: int = 128, repeats: int = 2, progress: bool = True) -> DeviceProfile:
    """Measure `target` (a model in DRAM or a `StreamedDecoder`) and `draft_model`
    (a model in DRAM) on this device; `key` is stored in the profile as is.

    Per grid point n the target runs `repeats` forwards of a random n-node
    tree (after one warm-up) and each stage keeps its median compute time;
    the draft likewise per frontier size.  Progress lines go to stderr.
    Models speak the numpy model protocol (lever.model.loading) and have the
    `stage_times` hook.
    """
    cfg = measure_settings(n_grid, draft_grid, context_tokens, repeats)
    n_grid, draft_grid, ctx, repeats = cfg["n_grid"], cfg["draft_grid"], cfg["context_tokens"], cfg["repeats"]
    say = _printer(progress)
    t_start = time.perf_counter()
    rng = np.random.default_rng(0)
    streamed = hasattr(target, "plan")
    io = _measure_io(target, say) if streamed else {}
    target_cache = _context_cache(target, ctx, max(n_grid[-1], OVERHEAD_NODES), rng)
    times = _measure_target(target, target_cache, n_grid, repeats, rng, say)
    draft_s = forward_seconds(draft_model, draft_grid, ctx, repeats, rng, say)
    overhead = _measure_overhead(target, target_cache, draft_model, ctx, rng)
    say(f"profile: iteration overhead {overhead * 1e3:.2f} ms (a {OVERHEAD_NODES}-node tree)")
    stages = _stages(target, times, io, len(n_grid))
    return DeviceProfile(key=key, n_grid=n_grid, stages=stages, embed_s=times["embed"],
                         draft_grid=draft_grid, draft_s=draft_s, iteration_overhead_s=overhead,
                         prefetch_depth=target.plan.prefetch_depth if streamed else 0, fixed_shapes=False,
                         created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                         measure_s=time.perf_counter() - t_start)


def _printer(progress: bool):
    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)
    return say


# -- flash ------------------------------------------------------------------------

def _measure_io(target, say) -> dict[str, tuple[float, int]]:
    """{extent name: (median seconds of a synchronous O_DIRECT read, bytes)} of the
    streamed extents; the prefetch ring is idle while they are timed."""
    from ..store.flash_reader import aligned_empty

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
    say(f"profile: flash reads: {len(out)} streamed extents, {total_b / 1e6:,.1f} MB in {total_s * 1e3:,.1f} ms "
        f"({total_b / total_s / 2**30 if total_s else 0:.2f} GiB/s)")
    return out


# -- compute ----------------------------------------------------------------------

def random_tree(n: int, vocab: int, rng: np.random.Generator) -> TokenTree:
    """A random valid token tree of `n` nodes (root included), distinct tokens."""
    tokens = rng.choice(vocab, size=n, replace=False) if n <= vocab else rng.integers(0, vocab, n)
    tree = TokenTree(int(tokens[0]))
    for i in range(1, n):
        tree.add(int(rng.integers(0, i)), int(tokens[i]), -1.0)
    return tree


def _tree_forward(model, tree: TokenTree, cache, keep: bool = False) -> None:
    """One forward of `tree` after the cached rows, with the head a greedy
    verification uses (the argmax of every node: the whole head is computed,
    no [nodes, vocab] logits are kept); its rows are truncated away again
    unless `keep`."""
    n_cached = cache.length
    model(tree.tokens().astype(np.int64), tree.positions(n_cached), tree.mask(n_cached), cache, head="argmax")
    if not keep:
        cache.truncate(n_cached)


def _context_cache(model, ctx: int, extra: int, rng: np.random.Generator):
    """A fresh cache holding `ctx` random tokens, with room for `extra` more."""
    cache = model.new_cache(capacity=ctx + extra)
    tokens = rng.integers(0, model.config.vocab_size, ctx).astype(np.int64)
    model(tokens, np.arange(ctx, dtype=np.int64), causal_mask(ctx, 0), cache,
          logits_rows=np.array([ctx - 1], dtype=np.int64), head="argmax")
    return cache


def _timed_stages(model, tree: TokenTree, cache) -> list[tuple[str, float]]:
    model.stage_times = []
    try:
        _tree_forward(model, tree, cache)
        return model.stage_times
    finally:
        model.stage_times = None


def _measure_target(model, cache, n_grid: list[int], repeats: int, rng, say) -> dict[str, list[float]]:
    """{stage name: median compute seconds per n_grid point}, stages in pass
    order; `cache` holds the context (room for n_grid[-1] more rows)."""
    vocab = model.config.vocab_size
    _tree_forward(model, random_tree(n_grid[0], vocab, rng), cache)          # warm-up
    out: dict[str, list[float]] = {}
    for k, n in enumerate(n_grid):
        runs = [_timed_stages(model, random_tree(n, vocab, rng), cache) for _ in range(repeats)]
        names = [name for name, _ in runs[0]]
        for i, name in enumerate(names):
            out.setdefault(name, []).append(statistics.median(run[i][1] for run in runs))
        total = sum(v[-1] for v in out.values())
        say(f"profile: target n={n:<4d} ({k + 1}/{len(n_grid)}) compute {total * 1e3:9.1f} ms")
    return out


def forward_seconds(model, grid: list[int], ctx: int, repeats: int, rng, say, label: str = "draft") -> list[float]:
    """Median seconds of one forward of `model` over a random f-node tree after
    `ctx` context tokens, per grid point f (the draft curve of a profile; a
    verifier server's published verify curve)."""
    vocab = model.config.vocab_size
    cache = _context_cache(model, ctx, grid[-1], rng)
    _tree_forward(model, random_tree(grid[0], vocab, rng), cache)            # warm-up
    out = []
    for f in grid:
        samples = []
        for _ in range(repeats):
            tree = random_tree(f, vocab, rng)
            t0 = time.perf_counter()
            _tree_forward(model, tree, cache)
            samples.append(time.perf_counter() - t0)
        out.append(statistics.median(samples))
        say(f"profile: {label} f={f:<4d} {out[-1] * 1e3:9.1f} ms")
    return out


def _measure_overhead(target, target_cache, draft_model, ctx: int, rng) -> float:
    """Seconds of one iteration's host work for an OVERHEAD_NODES-node tree:
    the median of making the tokens / positions / mask arrays and walking the
    tree over the target's argmax ids (OVERHEAD_REPEATS runs), plus the median
    seconds of compacting the target's and the draft's KV caches to the
    accepted path.  (The argmax itself is the target's head: a pass stage.)
    `target_cache` holds `ctx` context rows."""
    n = OVERHEAD_NODES
    tree = random_tree(n, target.config.vocab_size, rng)
    choice = _deepest_path_choice(tree)
    samples = []
    for _ in range(OVERHEAD_REPEATS):
        t0 = time.perf_counter()
        tree.tokens().astype(np.int64), tree.positions(ctx), tree.mask(ctx)
        accepted, _ = tree.walk(choice)
        tree.compaction_indices(ctx, accepted)
        samples.append(time.perf_counter() - t0)
    keep = tree.compaction_indices(ctx, tree.walk(choice)[0])
    draft_cache = _context_cache(draft_model, ctx, n, rng)
    return statistics.median(samples) + sum(_compact_seconds(model, cache, tree, keep)
                                            for model, cache in ((target, target_cache), (draft_model, draft_cache)))


def _deepest_path_choice(tree: TokenTree) -> np.ndarray:
    """Target tokens per node (int64 [n]) that lead the walk from the root to the deepest node."""
    deepest = max(range(len(tree)), key=tree.depth)
    path = [deepest]
    while tree.parent(path[-1]) > 0:
        path.append(tree.parent(path[-1]))
    choice = np.zeros(len(tree), dtype=np.int64)
    node = 0
    for child in reversed(path):
        choice[node] = tree.token(child)
        node = child
    return choice


def _compact_seconds(model, cache, tree: TokenTree, keep: np.ndarray) -> float:
    """Median seconds of compacting `cache` (its context rows, then `tree`'s rows
    from an untimed forward) to the rows `keep`, over COMPACT_REPEATS runs."""
    n_cached = cache.length
    samples = []
    for _ in range(COMPACT_REPEATS):
        _tree_forward(model, tree, cache, keep=True)
        t0 = time.perf_counter()
        cache.compact(keep)
        samples.append(time.perf_counter() - t0)
        cache.truncate(n_cached)
    return statistics.median(samples)


# -- assembling the stages ----------------------------------------------------------

def _stages(target, times: dict[str, list[float]], io: dict, n_points: int) -> list[Stage]:
    """Stages in pass order.  A streamed store's head is one stage per head part
    (each is its own extent), sharing the measured head time by rows."""
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
