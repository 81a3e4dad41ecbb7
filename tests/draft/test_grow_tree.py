"""The native gain-cost growth (csrc/tree/grow_tree.h) and the calibration.

- Optimality: on synthetic candidate trees with known acceptance probabilities
  and a verify cost curve (no draft cost), the grower's tree has the largest
  expected tokens per second of all trees of up to 7 draft nodes, found by
  brute-force enumeration.
- Monotonicity: more I/O per pass (a constant added to the verify curve)
  never gives a smaller tree; a cost curve with bucket edges never gives a
  tree just past an edge.
- Calibration converges to a known acceptance curve and beats the raw draft
  probability; it round-trips through JSON and refuses malformed state.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from lever._native import TreeGrower
from lever.draft.base import Expansion
from lever.draft.calibration import AcceptanceCalibration
from lever.draft.gain_cost import CostCurves, GainCostPolicy


# --- synthetic candidate universes ------------------------------------------------

class Universe:
    """A candidate tree: node 0 is the root; children[i] lists (token, accept) in
    rank order, accept = P(child accepted | i accepted)."""

    def __init__(self, rng: np.random.Generator, width: int, depth: int):
        self.parent, self.depth, self.accept, self.children = [-1], [0], [1.0], [[]]
        frontier = [0]
        for d in range(1, depth + 1):
            nxt = []
            for u in frontier:
                raw = np.sort(rng.dirichlet(np.ones(width + 1)))[::-1][:width]
                for r, a in enumerate(raw):
                    v = len(self.parent)
                    self.parent.append(u)
                    self.depth.append(d)
                    self.accept.append(float(a))
                    self.children.append([])
                    self.children[u].append(v)
                    nxt.append(v)
            frontier = nxt

    def path_prob(self, v: int) -> float:
        p = 1.0
        while v > 0:
            p *= self.accept[v]
            v = self.parent[v]
        return p


def grow(universe: Universe, verify_s, draft_s, max_nodes: int, max_depth: int, child_accept,
         overhead_s: float = 0.0, root_extra_s: float = 0.0, **grower_kw):
    """Drive a TreeGrower with the universe as the draft; returns (grower, selection,
    pool index -> universe node).  grower_kw: e.g. hidden_draft_s."""
    g = TreeGrower(np.asarray(verify_s, dtype=np.float64), np.asarray(draft_s, dtype=np.float64), overhead_s,
                   max_nodes, max_depth, **grower_kw)
    g.begin(7, child_accept, root_extra_s)
    pool_to_universe = {0: 0}
    while True:
        nodes = g.next_expansion()
        if not nodes:
            break
        for node in nodes:
            u = pool_to_universe[node]
            kids = universe.children[u]
            before = len(g.pool)
            g.add_children(node, np.arange(len(kids), dtype=np.int32) + 10,
                           np.log(np.full(len(kids), 0.25, dtype=np.float32)),
                           np.array([universe.accept[k] for k in kids]))
            for i in range(before, len(g.pool)):
                pool_to_universe[i] = kids[g.rank(i)]
    return g, g.select(), pool_to_universe


def brute_force(universe: Universe, verify_s, max_nodes: int) -> float:
    """Best (1 + sum of path probs) / verify_s[n-1] over every parent-closed set
    of at most max_nodes draft nodes (enumerated by growing from the root)."""
    probs = [universe.path_prob(v) for v in range(len(universe.parent))]
    best = 1.0 / verify_s[0]
    seen = set()

    def extend(chosen: frozenset, frontier: frozenset):
        nonlocal best
        if chosen in seen:
            return
        seen.add(chosen)
        gain = 1.0 + sum(probs[v] for v in chosen)
        best = max(best, gain / verify_s[len(chosen)])
        if len(chosen) == max_nodes:
            return
        for v in frontier:
            extend(chosen | {v}, (frontier - {v}) | frozenset(universe.children[v]))

    extend(frozenset(), frozenset(universe.children[0]))
    return best


def random_verify_curve(rng, n: int) -> np.ndarray:
    """Non-decreasing seconds for n = 1..n: a flat I/O floor with random
    compute steps (some zero, some large), so the optimum is anywhere."""
    steps = rng.choice([0.0, 0.05, 0.2, 0.6], size=n - 1, p=[0.3, 0.3, 0.2, 0.2]) * rng.random(n - 1)
    return 1.0 + np.concatenate([[0.0], np.cumsum(steps)])


# --- optimality -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(40))
def test_growth_matches_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    universe = Universe(rng, width=int(rng.integers(2, 4)), depth=int(rng.integers(2, 4)))
    max_nodes = 7
    verify_s = random_verify_curve(rng, max_nodes + 1)
    optimistic = [[1.0] * 3] * 4                 # no draft cost: every expansion that could help is made
    g, (tree, pool_index, expected, predicted_s), to_universe = grow(
        universe, verify_s, [0.0] * 8, max_nodes, 4, optimistic)
    ratio = expected / predicted_s
    best = brute_force(universe, verify_s, max_nodes)
    assert ratio == pytest.approx(best, rel=1e-12), (seed, ratio, best, len(tree))
    # the reported gain is the tree's own: 1 + sum of its nodes' path probabilities
    own = 1.0 + sum(universe.path_prob(to_universe[int(p)]) for p in pool_index[1:])
    assert expected == pytest.approx(own, rel=1e-12)
    assert predicted_s == pytest.approx(verify_s[len(tree) - 1])
    # a valid tree: parents before children, tokens of the universe
    parents = tree.parents()
    assert all(parents[i] < i for i in range(1, len(tree)))


def test_flat_cost_takes_everything_and_steep_cost_takes_nothing():
    rng = np.random.default_rng(1)
    universe = Universe(rng, width=3, depth=2)             # 3 + 9 nodes
    n = len(universe.parent)
    _, (tree, *_), _ = grow(universe, np.ones(n), [0.0] * n, n, 2, [[1.0] * 3] * 2)
    assert len(tree) == n                                   # free nodes: all of them
    _, (tree, *_), _ = grow(universe, 1.0 + 10.0 * np.arange(n), [0.0] * n, n, 2, [[1.0] * 3] * 2)
    assert len(tree) == 1                                   # each node costs 10x a pass: none


def test_draft_cost_can_stop_growth():
    """An expensive draft forward is not run when the predicted children cannot pay for it."""
    rng = np.random.default_rng(2)
    universe = Universe(rng, width=3, depth=3)
    verify = np.ones(64)
    g, (tree, *_), _ = grow(universe, verify, [100.0] * 64, 63, 3, [[0.5, 0.2, 0.1]] * 3)
    assert g.expansions == 0 and len(tree) == 1
    g, (tree, *_), _ = grow(universe, verify, [0.01] * 64, 63, 3, [[0.5, 0.2, 0.1]] * 3)
    assert g.expansions >= 2 and len(tree) > 4


def test_root_catch_up_cost_is_charged():
    """The draft forward that expands the root also feeds the tokens the draft
    missed (root_extra_s): a large backlog makes drafting not pay at all."""
    g = TreeGrower(np.ones(64), np.full(64, 0.01), 0.0, 63, 3)
    g.begin(7, [[0.5, 0.2, 0.1]] * 3, 0.05)
    assert g.next_expansion() == [0]
    assert g.draft_spent_s == pytest.approx(0.06)
    g.begin(7, [[0.5, 0.2, 0.1]] * 3, 100.0)
    assert g.next_expansion() == [] and g.draft_spent_s == 0.0
    with pytest.raises(ValueError, match="root_extra_s"):
        g.begin(7, [[0.5]], -1.0)


# --- monotonicity and bucket edges ----------------------------------------------------

def realistic_case(seed: int):
    rng = np.random.default_rng(seed)
    universe = Universe(rng, width=4, depth=6)
    compute = 0.004 * np.arange(1, 257) ** 1.1              # seconds of compute at n tokens
    draft = 0.015 + 0.0004 * np.arange(1, 257)
    return universe, compute, draft


@pytest.mark.parametrize("seed", range(12))
def test_more_io_never_shrinks_the_tree(seed):
    universe, compute, draft = realistic_case(seed)
    table = [[0.55, 0.12, 0.05, 0.03]] * 6
    sizes = []
    for io in (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2):
        verify = np.maximum(io, compute) + 0.2 * compute    # a pass: max(I/O, compute) + a serial part
        _, (tree, *_), _ = grow(universe, verify, draft, 255, 6, table)
        sizes.append(len(tree))
    assert sizes == sorted(sizes), sizes
    assert sizes[-1] > sizes[0], sizes


BUCKETS = (1, 8, 16, 32, 64, 128)


def bucketed(n_max: int) -> np.ndarray:
    """A static-shape backend: the cost of n tokens is that of the smallest bucket >= n."""
    per_bucket = {b: 0.3 + 0.004 * b for b in BUCKETS}
    return np.array([per_bucket[min(b for b in BUCKETS if b >= n)] for n in range(1, n_max + 1)])


@pytest.mark.parametrize("seed", range(12))
def test_bucket_edge_is_never_just_passed(seed):
    rng = np.random.default_rng(seed)
    universe = Universe(rng, width=4, depth=5)
    verify = bucketed(128)
    for draft_cost in (0.0, 0.002):
        _, (tree, *_), _ = grow(universe, verify, [draft_cost] * 128, 127, 5, [[1.0] * 4] * 5)
        n = len(tree)
        assert n in BUCKETS, (draft_cost, n)


# --- bad input ---------------------------------------------------------------------------

def test_bad_grower_input():
    with pytest.raises(ValueError, match="verify_s is empty"):
        TreeGrower(np.zeros(0), np.ones(2), 0.0, 4, 2)
    with pytest.raises(ValueError, match="positive"):
        TreeGrower(np.array([1.0, -1.0]), np.ones(2), 0.0, 4, 2)
    with pytest.raises(ValueError, match="non-negative"):
        TreeGrower(np.ones(4), np.array([np.nan]), 0.0, 4, 2)
    with pytest.raises(ValueError, match=">= 0"):
        TreeGrower(np.ones(4), np.ones(4), 0.0, -1, 2)
    g = TreeGrower(np.ones(8), np.zeros(8), 0.0, 7, 3)
    g.begin(5, [[1.0, 1.0]])
    with pytest.raises(ValueError, match="was not returned"):
        g.add_children(0, np.array([1], np.int32), np.zeros(1, np.float32), np.ones(1))
    assert g.next_expansion() == [0]
    with pytest.raises(ValueError, match="were not fed"):
        g.next_expansion()
    with pytest.raises(ValueError, match="same length"):
        g.add_children(0, np.array([1, 2], np.int32), np.zeros(1, np.float32), np.ones(2))
    with pytest.raises(ValueError, match="already has a child"):
        g.add_children(0, np.array([1, 1], np.int32), np.zeros(2, np.float32), np.ones(2))
    with pytest.raises(IndexError):
        g.path_prob(99)


# --- calibration -----------------------------------------------------------------------

def true_acceptance(q, depth, rank):
    """A known, mis-calibrated draft: over-confident at high q, worse when deep."""
    return np.clip(0.85 * q ** 1.4 * 0.93 ** (depth - 1) + 0.05 * (rank == 0), 0, 1)


def synthetic_trials(rng, n):
    q = rng.beta(0.6, 0.9, n)
    depth = rng.integers(1, 7, n)
    rank = rng.integers(0, 4, n)
    accepted = rng.random(n) < true_acceptance(q, depth, rank)
    return q, depth, rank, accepted


def test_calibration_converges_to_the_true_acceptance_curve():
    rng = np.random.default_rng(0)
    cal = AcceptanceCalibration()
    q0, d0, r0, _ = synthetic_trials(np.random.default_rng(1), 4000)
    err_before = np.abs(cal.predict(q0, d0, r0) - true_acceptance(q0, d0, r0)).mean()
    for _ in range(40):
        cal.update(*synthetic_trials(rng, 1000))
    err_after = np.abs(cal.predict(q0, d0, r0) - true_acceptance(q0, d0, r0)).mean()
    report = cal.calibration_error()
    print(f"calibration: mean |error| {err_before:.3f} -> {err_after:.3f}; {report}")
    assert err_after < 0.04 < err_before
    assert report["observations"] == 40_000
    assert report["ece_calibrated"] < 0.02 < report["ece_draft_prob"]
    # the expansion table learns the rank-0 child's mean acceptance at depth 1
    q, d, r, acc = synthetic_trials(np.random.default_rng(3), 200_000)
    sel = (d == 1) & (r == 0)
    assert cal.child_accept(1, 4)[0][0] == pytest.approx(acc[sel].mean(), abs=0.03)


def test_calibration_round_trips_and_refuses_malformed_state():
    cal = AcceptanceCalibration()
    cal.update(*synthetic_trials(np.random.default_rng(4), 500))
    back = AcceptanceCalibration.from_json(cal.to_json())
    q, d, r, _ = synthetic_trials(np.random.default_rng(5), 50)
    assert np.array_equal(back.predict(q, d, r), cal.predict(q, d, r))
    bad = cal.to_json()
    bad["cell_trials"] = [[1.0]]
    with pytest.raises(ValueError, match="cell_trials"):
        AcceptanceCalibration.from_json(bad)
    with pytest.raises(ValueError, match="version"):
        AcceptanceCalibration.from_json({**cal.to_json(), "version": 99})


# --- the policy with a stand-in draft ----------------------------------------------------

class TableDrafter:
    """A draft whose top-k children are fixed by a universe (no model)."""

    has_probabilities = True
    catch_up_tokens = 0

    def __init__(self, universe: Universe, q_of):
        self.u, self.q_of = universe, q_of
        self.map = {}

    def begin_tree(self):
        self.map = {0: 0}

    def expand(self, pool, nodes, topk, params=None, seed=None, with_probs=False):
        toks, lps = [], []
        for node in nodes:
            kids = self.u.children[self.map[node]][:topk]
            for r, k in enumerate(kids):
                self.map[len(pool) + len([x for x in toks for _ in x]) + r] = k   # provisional
            toks.append([10 + r for r in range(len(kids))])
            lps.append([math.log(self.q_of(k)) for k in kids])
        return Expansion(np.array(toks, dtype=np.int32), np.array(lps, dtype=np.float32))

    def use_tree(self, tree, index):
        self.tree = tree


def test_policy_grows_larger_trees_when_io_bound():
    """End to end through GainCostPolicy (Python side + native grower): the mean
    tree grows with the I/O floor of the pass, and the report carries the
    predicted and realised figures."""
    rng = np.random.default_rng(9)
    universe = Universe(rng, width=4, depth=8)
    sizes = {}
    for io in (0.0, 0.5, 2.0):
        compute = 0.004 * np.arange(1, 257)
        costs = CostCurves(tuple(np.maximum(io, compute) + 0.01), tuple(0.01 + 0.0002 * np.arange(1, 257)))
        policy = GainCostPolicy(costs, max_nodes=255, max_depth=8, topk=4, adapt=False)
        drafter = TableDrafter(universe, q_of=lambda k: max(universe.accept[k], 1e-6))
        grown = policy.grow(drafter, root=3)
        sizes[io] = len(grown.tree)
        p = grown.prediction
        assert p.expected_tokens >= 1.0 and p.predicted_s > 0 and grown.draft_probs is None
        policy.observe(grown, [], verify_s=p.predicted_verify_s, iteration_s=p.predicted_s)
        rep = policy.report()
        assert rep["iterations"] == 1 and rep["tree_size"]["max"] == sizes[io] - 1
    assert sizes[0.0] < sizes[0.5] < sizes[2.0], sizes


class SlowTableDrafter(TableDrafter):
    """A TableDrafter whose every forward takes `forward_s` seconds (the target idles)."""

    def __init__(self, universe: Universe, q_of, forward_s: float):
        super().__init__(universe, q_of)
        self.forward_s = forward_s

    def expand(self, pool, nodes, topk, params=None, seed=None, with_probs=False):
        time.sleep(self.forward_s)
        return super().expand(pool, nodes, topk, params, seed, with_probs)


def test_a_pass_the_drafts_reads_sped_up_is_not_drift():
    """A pass is held against the profile's pass after this tree's drafting,
    verify(n) - min(drafted seconds, credit(n)): passes exactly that fast refit
    nothing (held against verify(n) alone they would look 17 % fast and
    the credit would count twice); passes 1.5x slower scale both curves the
    grower prices a pass with, verify and credit, by 1.5."""
    rng = np.random.default_rng(3)
    universe = Universe(rng, width=4, depth=8)
    credit = 0.05
    costs = CostCurves(tuple(0.3 + 0.004 * np.arange(1, 257)), tuple(0.01 + 0.0002 * np.arange(1, 257)),
                       hidden_s=credit, spread=0.01)
    policy = GainCostPolicy(costs, max_nodes=31, max_depth=8, topk=4)
    q_of = lambda k: max(universe.accept[k], 1e-6)                            # noqa: E731

    def iterate(slower: float) -> int:
        grown = policy.grow(SlowTableDrafter(universe, q_of, forward_s=0.03), root=3)
        p, n = grown.prediction, len(grown.tree)
        drafted = p.forward_s + p.grow_s
        assert drafted > credit                                               # the whole credit is used
        after_gap = costs.verify_curve[n - 1] - credit
        policy.observe(grown, [], verify_s=slower * after_gap, iteration_s=drafted + slower * after_gap)
        return n

    sizes = [iterate(1.0) for _ in range(6)]
    assert policy.drift.refits == 0 and np.all(policy.drift.factors() == 1.0)
    assert np.allclose(policy.hidden_curve(), credit)
    sizes += [iterate(1.5) for _ in range(6)]
    assert policy.drift.refits >= 1
    n = sizes[-1]
    factor = policy.drift.factors()[n - 1]
    assert factor == pytest.approx(1.5, rel=0.02)
    assert policy.hidden_curve()[n - 1] == pytest.approx(credit * factor)
    assert policy.verify_curve()[n - 1] == pytest.approx(costs.verify_curve[n - 1] * factor)
