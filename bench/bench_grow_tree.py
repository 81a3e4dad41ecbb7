"""Microbenchmark: what deciding a tree costs (the native TreeGrower and the policy).

    python bench/bench_grow_tree.py [--repeats 300] [--out bench/results]

A synthetic draft offers 4 children per expanded node with Dirichlet-random
probabilities; the verify curve is I/O-bound (flat 0.35 s plus a small
per-token slope, the shape of the streamed 1.5B target), so the tree grows to
the 256-token cap. Variants, medians over `--repeats` trees:

  native          begin + every next_expansion / add_children + select, the
                  children fed from precomputed arrays (the C++ decision alone)
  policy          GainCostPolicy.grow with a table drafter: the grower plus
                  calibration lookups and the Python loop, no model forward

Prints microseconds per tree and the share of the predicted iteration time,
and writes grow_tree.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from lever._native import TreeGrower
from lever.draft.base import Expansion
from lever.draft.gain_cost import CostCurves, GainCostPolicy

TOPK, MAX_NODES, MAX_DEPTH = 4, 255, 12


def costs() -> CostCurves:
    n = np.arange(1, 257)
    return CostCurves(tuple(0.35 + 0.00002 * n), tuple(0.002 + 0.00005 * n), 0.002)


class SyntheticDraft:
    """Children of any node: 4 tokens with probabilities from a fixed random stream."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self.probs = np.sort(rng.dirichlet(np.full(TOPK + 1, 1.0), size=4096)[:, :TOPK], axis=1)[:, ::-1].copy()
        self.tokens = np.arange(TOPK, dtype=np.int32) + 100
        self.i = 0

    def next(self) -> np.ndarray:
        self.i = (self.i + 1) % len(self.probs)
        return self.probs[self.i]

    # the drafter interface GainCostPolicy uses (lever.draft.base.Drafter)
    has_probabilities = True
    catch_up_tokens = 0

    def begin_tree(self):
        pass

    def expand(self, pool, nodes, topk, params=None, seed=None, with_probs=False):
        p = np.stack([self.next() for _ in nodes])
        return Expansion(np.tile(self.tokens, (len(nodes), 1)), np.log(np.maximum(p, 1e-9)).astype(np.float32))

    def use_tree(self, tree, index):
        pass


def run_native(c: CostCurves, draft: SyntheticDraft, table) -> tuple[float, int, float]:
    g = TreeGrower(c.verify_s(MAX_NODES + 1), c.draft_s(MAX_NODES + 1), c.iteration_overhead_s, MAX_NODES, MAX_DEPTH)
    lp_cache = {}
    t0 = time.perf_counter()
    g.begin(1, table)
    while True:
        nodes = g.next_expansion()
        if not nodes:
            break
        for node in nodes:
            p = draft.next()
            key = id(p)
            lp = lp_cache.get(key)
            if lp is None:
                lp = lp_cache[key] = np.log(p).astype(np.float32)
            g.add_children(node, draft.tokens, lp, p)
    tree, _, _, predicted_s = g.select()
    return time.perf_counter() - t0, len(tree), predicted_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args()
    c = costs()
    table = [[0.8, 0.3, 0.1, 0.05]] * MAX_DEPTH
    draft = SyntheticDraft(0)
    native = [run_native(c, draft, table) for _ in range(args.repeats)]
    policy = GainCostPolicy(c, max_nodes=MAX_NODES, max_depth=MAX_DEPTH, topk=TOPK, adapt=False)
    pol = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        grown = policy.grow(draft, root=1)
        pol.append((time.perf_counter() - t0, len(grown.tree), grown.prediction.predicted_s))
    rows = []
    for name, runs in (("native", native), ("policy", pol)):
        sec = np.median([r[0] for r in runs])
        nodes = int(np.median([r[1] for r in runs]))
        iteration = float(np.median([r[2] for r in runs]))
        rows.append({"variant": name, "median_us": round(sec * 1e6, 1), "tree_tokens": nodes,
                     "predicted_iteration_s": round(iteration, 4), "share_of_iteration": sec / iteration})
    print(f"# grow_tree: {args.repeats} trees, topk {TOPK}, cap {MAX_NODES + 1} tokens, depth <= {MAX_DEPTH}")
    for r in rows:
        print(f"{r['variant']:8s} {r['median_us']:9.1f} us per tree   tree {r['tree_tokens']:4d} tokens   "
              f"iteration {r['predicted_iteration_s'] * 1e3:7.1f} ms   share {100 * r['share_of_iteration']:.3f}%")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grow_tree.json").write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1))
    print(f"wrote {out / 'grow_tree.json'}")


if __name__ == "__main__":
    main()
