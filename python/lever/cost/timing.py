"""Timing one forward: what the full measurement (lever.cost.measure) and the
quick estimate (lever.cost.quick) share -- random token trees run after a
context of random tokens and truncated away again, a timed forward as a
`Run`, the per-iteration walk and KV compaction, and the progress printer.
Times are seconds; trees and contexts are counted in tokens.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Callable

import numpy as np

from ..masks import causal_mask
from ..tree import TokenTree

OVERHEAD_NODES = 32          # tree size of the iteration-overhead measurement
OVERHEAD_REPEATS = 20
COMPACT_REPEATS = 3          # cache compactions timed per model (each after an untimed tree forward)

# one timed forward over n tree tokens -> [(stage name, seconds)] in pass order
Run = Callable[[int], list[tuple[str, float]]]


def printer(progress: bool):
    """say(line): a progress line on stderr when `progress`, else nothing."""
    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr, flush=True)
    return say


def random_tree(n: int, vocab: int, rng: np.random.Generator) -> TokenTree:
    """A random valid token tree of `n` nodes (root included), distinct tokens
    (a vocabulary smaller than n repeats tokens, never among siblings)."""
    tokens = rng.choice(vocab, size=n, replace=False) if n <= vocab else rng.integers(0, vocab, n)
    tree = TokenTree(int(tokens[0]))
    for i in range(1, n):
        parent = int(rng.integers(0, i))
        if n > vocab:           # another parent and token until no sibling has it
            used = {tree.token(c) for c in tree.children(parent)}
            while int(tokens[i]) in used:
                parent = int(rng.integers(0, i))
                used = {tree.token(c) for c in tree.children(parent)}
                tokens[i] = rng.integers(0, vocab)
        tree.add(parent, int(tokens[i]), -1.0)
    return tree


def tree_forward(model, tree: TokenTree, cache, keep: bool = False) -> None:
    """One forward of `tree` after the cached rows, with the head a greedy
    verification uses (the argmax of every node: the whole head is computed,
    no [nodes, vocab] logits are kept); its rows are truncated away again
    unless `keep`."""
    n_cached = cache.length
    model(tree.tokens().astype(np.int64), tree.positions(n_cached), tree.mask(n_cached), cache, head="argmax")
    if not keep:
        cache.truncate(n_cached)


def context_cache(model, ctx: int, extra: int, rng: np.random.Generator):
    """A fresh cache holding `ctx` random tokens, with room for `extra` more."""
    cache = model.new_cache(capacity=ctx + extra)
    tokens = rng.integers(0, model.config.vocab_size, ctx).astype(np.int64)
    model(tokens, np.arange(ctx, dtype=np.int64), causal_mask(ctx, 0), cache,
          logits_rows=np.array([ctx - 1], dtype=np.int64), head="argmax")
    return cache


def timed_stages(model, tree: TokenTree, cache) -> list[tuple[str, float]]:
    model.stage_times = []
    try:
        tree_forward(model, tree, cache)
        return model.stage_times
    finally:
        model.stage_times = None


def target_run(model, cache, rng) -> Run:
    """One timed target forward of a random n-node tree: its per-stage compute seconds."""
    vocab = model.config.vocab_size
    return lambda n: timed_stages(model, random_tree(n, vocab, rng), cache)


def forward_run(model, cache, rng) -> Run:
    """One timed whole forward of a random f-node tree: [("forward", seconds)]."""
    vocab = model.config.vocab_size

    def run(f: int) -> list[tuple[str, float]]:
        tree = random_tree(f, vocab, rng)
        t0 = time.perf_counter()
        tree_forward(model, tree, cache)
        return [("forward", time.perf_counter() - t0)]
    return run


def tree_walk_seconds(tree: TokenTree, ctx: int) -> tuple[float, np.ndarray]:
    """(median seconds of an iteration's array and walk work on `tree` --
    making its tokens / positions / mask arrays, walking it along its
    deepest path, the compaction indices -- over OVERHEAD_REPEATS runs,
    the rows that walk keeps, for timing the KV compaction)."""
    choice = deepest_path_choice(tree)
    samples = []
    for _ in range(OVERHEAD_REPEATS):
        t0 = time.perf_counter()
        tree.tokens().astype(np.int64), tree.positions(ctx), tree.mask(ctx)
        accepted, _ = tree.walk(choice)
        tree.compaction_indices(ctx, accepted)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), tree.compaction_indices(ctx, tree.walk(choice)[0])


def deepest_path_choice(tree: TokenTree) -> np.ndarray:
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


def compact_seconds(model, cache, tree: TokenTree, keep: np.ndarray) -> float:
    """Median seconds of compacting `cache` (its context rows, then `tree`'s rows
    from an untimed forward) to the rows `keep`, over COMPACT_REPEATS runs."""
    n_cached = cache.length
    samples = []
    for _ in range(COMPACT_REPEATS):
        tree_forward(model, tree, cache, keep=True)
        t0 = time.perf_counter()
        cache.compact(keep)
        samples.append(time.perf_counter() - t0)
        cache.truncate(n_cached)
    return statistics.median(samples)
