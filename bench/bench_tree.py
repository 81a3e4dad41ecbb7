"""Microbenchmarks: native TokenTree (lever._native.TokenTree) per-iteration work.

    pytest bench/bench_tree.py --benchmark-only

A fixed random 256-node tree (8 root children, depth <= 8) with n_cached=512.
Variants:

  build-add         TokenTree(root) + 255 add() calls from Python
  build-arrays      TokenTree.from_arrays on int32 numpy arrays
  mask+positions    mask(512) ([256, 768] bool) + positions(512)
  numpy-mask+pos    the same with numpy from the parents array (a baseline)
  walk              walk() with int64 targets accepting a depth-8 path
  walk+compaction   walk() + compaction_indices(512, accepted)
  iteration         build-arrays + mask+positions + walk + compaction

Medians in microseconds are printed in a summary table at the end.
"""

from __future__ import annotations

import numpy as np
import pytest

from lever._native import TokenTree

N_NODES = 256
N_CACHED = 512
MAX_DEPTH = 8
VARIANTS = ["build-add", "build-arrays", "mask+positions", "numpy-mask+pos", "walk",
            "walk+compaction", "iteration"]

_results: dict[str, float] = {}  # variant -> median seconds


def _random_tree():
    rng = np.random.default_rng(0)
    tokens, parents, depths = [1], [-1], [0]
    used: list[set] = [set()]
    while len(tokens) < N_NODES:
        i = len(tokens)
        if i <= 8:
            p = 0
        else:
            open_nodes = [v for v in range(1, i) if depths[v] < MAX_DEPTH]
            p = open_nodes[int(rng.integers(len(open_nodes)))]
        t = int(rng.integers(0, 32000))
        while t in used[p]:
            t += 1
        used[p].add(t)
        used.append(set())
        tokens.append(t)
        parents.append(p)
        depths.append(depths[p] + 1)
    logprobs = (-rng.exponential(1.0, N_NODES)).astype(np.float32)
    return (np.array(tokens, np.int32), np.array(parents, np.int32), logprobs,
            np.array(depths, np.int64))


TOKENS, PARENTS, LOGPROBS, DEPTHS = _random_tree()
_DEEP = int(np.argmax(DEPTHS))


def _targets_to_deepest() -> np.ndarray:
    targets = np.zeros(N_NODES, np.int64)
    node = _DEEP
    while PARENTS[node] != -1:
        targets[PARENTS[node]] = TOKENS[node]
        node = PARENTS[node]
    targets[_DEEP] = 32001  # no child carries it: the walk stops here
    return targets


TARGETS = _targets_to_deepest()


def _build_add():
    tree = TokenTree(int(TOKENS[0]), N_NODES)
    tokens, parents, logprobs = TOKENS.tolist(), PARENTS.tolist(), LOGPROBS.tolist()
    for i in range(1, N_NODES):
        tree.add(parents[i], tokens[i], logprobs[i])
    return tree


def _numpy_mask_positions(parents: np.ndarray, depths: np.ndarray, n_cached: int):
    n = len(parents)
    mask = np.zeros((n, n_cached + n), dtype=bool)
    mask[:, :n_cached] = True
    tree_part = mask[:, n_cached:]
    tree_part[0, 0] = True
    for i in range(1, n):
        tree_part[i] = tree_part[parents[i]]
        tree_part[i, i] = True
    return mask, n_cached + depths


def _iteration():
    tree = TokenTree.from_arrays(TOKENS, PARENTS, LOGPROBS)
    mask = tree.mask(N_CACHED)
    positions = tree.positions(N_CACHED)
    accepted, next_token = tree.walk(TARGETS)
    rows = tree.compaction_indices(N_CACHED, accepted)
    return mask, positions, rows, next_token


class _Summary:
    """pytest plugin printing the timing table after the run."""

    def pytest_terminal_summary(self, terminalreporter):
        if not _results:
            return
        tr = terminalreporter
        tr.section(f"TokenTree ({N_NODES} nodes, depth {int(DEPTHS.max())}, n_cached={N_CACHED})")
        tr.write_line(f"{'variant':18} {'median us':>10}")
        for variant in VARIANTS:
            if variant in _results:
                tr.write_line(f"{variant:18} {_results[variant] * 1e6:10.2f}")


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("lever-tree-summary"):
        pm.register(_Summary(), "lever-tree-summary")
    yield


@pytest.mark.parametrize("variant", VARIANTS)
def test_tree(benchmark, variant):
    benchmark.group = "token-tree"
    benchmark.name = variant
    tree = TokenTree.from_arrays(TOKENS, PARENTS, LOGPROBS)
    if variant == "build-add":
        result = benchmark(_build_add)
        np.testing.assert_array_equal(result.parents(), PARENTS)
    elif variant == "build-arrays":
        result = benchmark(TokenTree.from_arrays, TOKENS, PARENTS, LOGPROBS)
        assert len(result) == N_NODES
    elif variant == "mask+positions":
        mask, pos = benchmark(lambda: (tree.mask(N_CACHED), tree.positions(N_CACHED)))
        ref_mask, ref_pos = _numpy_mask_positions(PARENTS, DEPTHS, N_CACHED)
        np.testing.assert_array_equal(mask, ref_mask)
        np.testing.assert_array_equal(pos, ref_pos)
    elif variant == "numpy-mask+pos":
        mask, _ = benchmark(_numpy_mask_positions, PARENTS, DEPTHS, N_CACHED)
        assert mask.shape == (N_NODES, N_CACHED + N_NODES)
    elif variant == "walk":
        accepted, next_token = benchmark(tree.walk, TARGETS)
        assert accepted == tree.path(_DEEP)[1:] and next_token == 32001
    elif variant == "walk+compaction":
        def run():
            accepted, _ = tree.walk(TARGETS)
            return tree.compaction_indices(N_CACHED, accepted)
        rows = benchmark(run)
        assert len(rows) == N_CACHED + 1 + int(DEPTHS.max())
    else:
        _, _, rows, _ = benchmark(_iteration)
        assert len(rows) == N_CACHED + 1 + int(DEPTHS.max())
    stats = getattr(benchmark, "stats", None)
    if stats is not None:  # None under --benchmark-disable
        _results[variant] = stats.stats.median
        benchmark.extra_info["median_us"] = stats.stats.median * 1e6
