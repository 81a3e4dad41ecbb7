"""Held-out evidence for early-exit probes, and the threshold choice.

Recall is of the nodes the target would accept if the walk reached them
(label match); a node is pruned when its logit is below the threshold.
The table gives, on held-out prompts, the fraction of rejected nodes
(match == 0) each scorer prunes at the threshold that keeps 99%, 95% and 90%
of the match nodes, for "all" nodes (the static tree policy's trees) and
"lever" (the nodes lever's gain-cost trees contain).

Tokens per second: pruning a node drops its subtree from the layers after
the probe's layer k; the greedy walk then stops at the first pruned node of
its accepted path (the output stays exact, acceptance only shortens).  One
tree costs draft_s (as recorded) + the target pass: layers <= k over all n
rows, layers > k and the head over the surviving rows -- from the device
profile's per-stage compute curves and its read ring (lever.cost.cost_model),
or without a profile from a line fitted to the recorded pass seconds.
Speeds are relative to the same trees unpruned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cost.cost_model import interpolate, simulate_passes
from .traces import POLICIES, Traces
from .train import Fitted, feature_matrix

RECALLS = (0.99, 0.95, 0.90)
SUBSETS = {"all": POLICIES.index("tree"), "lever": POLICIES.index("lever")}
N_THRESHOLDS = 64


# -- recall and pruning at a threshold --------------------------------------------------

def threshold_at_recall(logits: np.ndarray, positive: np.ndarray, recall: float) -> float:
    """The largest threshold keeping (logit >= threshold) at least `recall` of the
    positive entries; -inf when there are none."""
    pos = np.sort(np.asarray(logits, dtype=np.float64)[np.asarray(positive, dtype=bool)])[::-1]
    if pos.size == 0:
        return -np.inf
    k = int(np.ceil(recall * pos.size - 1e-9))
    return float(pos[min(max(k, 1), pos.size) - 1])


def recall_at(logits: np.ndarray, positive: np.ndarray, threshold: float) -> float:
    """Fraction of positive entries kept (logit >= threshold); nan without positives."""
    positive = np.asarray(positive, dtype=bool)
    return float(np.mean(np.asarray(logits)[positive] >= threshold)) if positive.any() else float("nan")


def pruned_fraction(logits: np.ndarray, positive: np.ndarray, threshold: float) -> float:
    """Fraction of negative entries (rejected nodes) pruned (logit < threshold); nan without negatives."""
    negative = ~np.asarray(positive, dtype=bool)
    return float(np.mean(np.asarray(logits)[negative] < threshold)) if negative.any() else float("nan")


def pruning_precision(logits: np.ndarray, positive: np.ndarray, threshold: float) -> float:
    """Of the pruned entries, the fraction that were negative; nan when nothing is pruned."""
    pruned = np.asarray(logits) < threshold
    return float(np.mean(~np.asarray(positive, dtype=bool)[pruned])) if pruned.any() else float("nan")


# -- trees under pruning ---------------------------------------------------------------

@dataclass
class TreeSet:
    """The traced trees of some nodes, for the walk under pruning: per node its
    local tree index, the row of its parent (-1: the root) and depth; per tree
    its draft nodes and recorded draft seconds (untimed trees: the median)."""

    tree: np.ndarray            # int64 [N], 0..T-1
    parent_row: np.ndarray      # int64 [N]
    depth: np.ndarray           # int64 [N]
    accepted: np.ndarray        # bool [N]
    n_nodes: np.ndarray         # int64 [T], draft nodes (root excluded)
    draft_s: np.ndarray         # float64 [T]

    @classmethod
    def of(cls, traces: Traces, trees: np.ndarray) -> "TreeSet":
        """The trees of the tree mask `trees` (bool [T], over traces.trees) with all their nodes
        (trees without draft nodes too: a pass that emits one token)."""
        n = traces.nodes
        tree_ids = np.flatnonzero(trees)
        local_of = np.full(trees.size, -1, dtype=np.int64)
        local_of[tree_ids] = np.arange(tree_ids.size)
        rows = np.flatnonzero(local_of[n["tree"]] >= 0)
        local = local_of[n["tree"][rows]]
        start = np.zeros(tree_ids.size, dtype=np.int64)       # row (in `rows`) of each tree's node 1
        first = np.r_[True, local[1:] != local[:-1]] if rows.size else np.zeros(0, dtype=bool)
        start[local[first]] = np.flatnonzero(first)
        parent = n["parent"][rows].astype(np.int64)
        parent_row = np.where(parent >= 1, start[local] + parent - 1, -1)
        return cls(local.astype(np.int64), parent_row, n["depth"][rows].astype(np.int64),
                   n["accepted"][rows].astype(bool), traces.trees["tree_nodes"][tree_ids].astype(np.int64),
                   fill_untimed(traces.trees["tree_draft_s"][tree_ids]))

    def closure(self, keep_self: np.ndarray) -> np.ndarray:
        """bool [N]: kept iff the node and all its ancestors are kept by themselves."""
        keep = np.asarray(keep_self, dtype=bool).copy()
        for d in range(2, int(self.depth.max(initial=0)) + 1):
            at = self.depth == d
            keep[at] &= keep[self.parent_row[at]]
        return keep

    def walk(self, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(tokens emitted per tree: accepted surviving nodes + 1, surviving rows per
        tree: root + kept nodes), both int64 [T]; `keep` closed under ancestry."""
        t = self.n_nodes.size
        acc = np.bincount(self.tree, weights=(self.accepted & keep), minlength=t).astype(np.int64)
        alive = np.bincount(self.tree, weights=keep, minlength=t).astype(np.int64)
        return acc + 1, alive + 1


def fill_untimed(draft_s: np.ndarray) -> np.ndarray:
    """Draft seconds with the untimed (nan) trees given the median of the timed ones (0 if none)."""
    d = np.asarray(draft_s, dtype=np.float64).copy()
    timed = np.isfinite(d)
    d[~timed] = np.median(d[timed]) if timed.any() else 0.0
    return d


# -- pass cost ---------------------------------------------------------------------------

class ProfileCost:
    """Pass seconds from a device profile: stages after layer k run the surviving rows."""

    def __init__(self, model):
        self.model = model
        p = model.profile
        self.layer_of = [int(s.name.split(".")[1]) if s.kind == "layer" else None for s in p.stages]
        self.label = "device profile"

    def pass_s(self, n: np.ndarray, n_surv: np.ndarray, layer: int) -> np.ndarray:
        p = self.model.profile
        full = self.model.stage_compute_s(n)
        surv = self.model.stage_compute_s(n_surv)
        compute = [f if (i is not None and i <= layer) else s for f, s, i in zip(full, surv, self.layer_of)]
        ring = simulate_passes([s.io_s for s in p.stages], compute, [s.streamed for s in p.stages],
                               p.prefetch_depth)
        embed = interpolate(p.n_grid, p.embed_s, np.asarray(n, dtype=np.float64), p.fixed_shapes, p.pass_spread)
        return (ring + embed) * self.model.verify_factor


class LinearCost:
    """Pass seconds = fixed + per_row * rows, split evenly over the decoder layers
    and the head (fitted to the recorded pass seconds when there is no profile;
    traces of one tree size only: all per-row, no fixed part)."""

    def __init__(self, fixed_s: float, per_row_s: float, n_layers: int):
        self.fixed_s, self.per_row_s, self.n_layers = float(fixed_s), float(per_row_s), int(n_layers)
        self.label = f"linear fit ({self.fixed_s * 1e3:.2f} ms + {self.per_row_s * 1e3:.3f} ms/row)"

    @classmethod
    def fit(cls, traces: Traces) -> "LinearCost":
        n = traces.trees["tree_nodes"].astype(np.float64) + 1
        s = traces.trees["tree_pass_s"].astype(np.float64)
        if n.size >= 2 and np.ptp(n) > 0:
            slope, fixed = np.polyfit(n, s, 1)
        else:                          # one tree size: assume the pass is all per-row compute
            slope, fixed = (float(np.mean(s / n)) if s.size else 0.0), 0.0
        return cls(max(fixed, 0.0), max(slope, 0.0), traces.meta.get("n_layers", 1))

    def pass_s(self, n: np.ndarray, n_surv: np.ndarray, layer: int) -> np.ndarray:
        parts = self.n_layers + 1                    # decoder layers + head
        before = min(layer + 1, self.n_layers)
        rows = (before * np.asarray(n, dtype=np.float64) + (parts - before) * np.asarray(n_surv, dtype=np.float64))
        return self.fixed_s + self.per_row_s * rows / parts


def relative_speed(trees: TreeSet, keep_self: np.ndarray, layer: int, cost) -> dict:
    """Tokens per second with pruning (keep_self: nodes kept by the probe itself)
    relative to none, with the rows saved and tokens lost per tree."""
    keep = trees.closure(keep_self)
    n_full = trees.n_nodes + 1
    tokens0 = trees.accepted.astype(np.int64)
    tok_full = np.bincount(trees.tree, weights=tokens0, minlength=n_full.size) + 1
    tok, n_surv = trees.walk(keep)
    t_full = trees.draft_s + cost.pass_s(n_full, n_full, layer)
    t_pruned = trees.draft_s + cost.pass_s(n_full, n_surv, layer)
    speed_full = tok_full.sum() / max(t_full.sum(), 1e-12)
    speed = tok.sum() / max(t_pruned.sum(), 1e-12)
    return {"relative_tokens_per_s": float(speed / speed_full) if speed_full > 0 else float("nan"),
            "rows_pruned_per_pass": float(np.mean(n_full - n_surv)) if n_full.size else 0.0,
            "rows_per_pass": float(np.mean(n_full)) if n_full.size else 0.0,
            "tokens_lost_per_pass": float(np.mean(tok_full - tok)) if n_full.size else 0.0}


# -- the whole evaluation ----------------------------------------------------------------

def threshold_grid(logits: np.ndarray, n: int = N_THRESHOLDS) -> np.ndarray:
    """Candidate thresholds: -inf (no pruning) and quantiles of `logits` up to the 90th."""
    if logits.size == 0:
        return np.array([-np.inf])
    return np.r_[-np.inf, np.unique(np.quantile(logits, np.linspace(0.0, 0.9, n)))]


def recall_table(traces: Traces, scorers: list[Fitted], held: np.ndarray) -> list[dict]:
    """Per scorer and subset ("all", "lever"): held-out nodes, match nodes, and the
    fraction of rejected nodes pruned at each of RECALLS."""
    rows = []
    match = traces.nodes["match"].astype(bool)
    policy = traces.nodes["policy"]
    for s in scorers:
        logits = s.logits(feature_matrix(traces, _slot(traces, s)))
        for subset, code in SUBSETS.items():
            m = held & (policy == code)
            row = {"scorer": s.name, "subset": subset, "nodes": int(m.sum()), "match": int(match[m].sum())}
            for r in RECALLS:
                t = threshold_at_recall(logits[m], match[m], r)
                row[f"pruned@{r:g}"] = pruned_fraction(logits[m], match[m], t)
            rows.append(row)
    return rows


def _slot(traces: Traces, s: Fitted) -> int | None:
    return None if s.layer is None else traces.layers.index(s.layer)


def speed_policy(traces: Traces) -> str:
    """The trees the speed is judged on: lever's when it drafted any node (what
    runs), else the static tree's ("all")."""
    return "lever" if (traces.nodes["policy"] == SUBSETS["lever"]).any() else "all"


def part(traces: Traces, held: bool, held_prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(node mask, tree mask) of the speed policy's trees of the held-out (held) or training prompts."""
    code = SUBSETS[speed_policy(traces)]
    n, t = traces.nodes, traces.trees
    nodes = (np.isin(n["prompt"], held_prompts) == held) & (n["policy"] == code)
    trees = (np.isin(t["tree_prompt"], held_prompts) == held) & (t["tree_policy"] == code)
    return nodes, trees


def sweep(traces: Traces, scorer: Fitted, mask: np.ndarray, tree_mask: np.ndarray, cost,
          thresholds: np.ndarray) -> dict:
    """Per threshold, on the nodes of `mask` (all the nodes of the trees of
    `tree_mask`): recall, rejected pruned, precision of pruning and relative
    tokens/s (layer: the scorer's; the baseline is costed as if it pruned
    before the first layer, i.e. all layers on surviving rows)."""
    match = traces.nodes["match"].astype(bool)[mask]
    logits = scorer.logits(feature_matrix(traces, _slot(traces, scorer))[mask])
    trees = TreeSet.of(traces, tree_mask)
    layer = scorer.layer if scorer.layer is not None else -1
    out = {"threshold": thresholds, "recall": [], "pruned": [], "precision": [], "speed": [], "rows_pruned": [],
           "tokens_lost": [], "survive": []}
    for t in thresholds:
        out["recall"].append(recall_at(logits, match, t))
        out["pruned"].append(pruned_fraction(logits, match, t))
        out["precision"].append(pruning_precision(logits, match, t))
        s = relative_speed(trees, logits >= t, layer, cost)
        out["speed"].append(s["relative_tokens_per_s"])
        out["rows_pruned"].append(s["rows_pruned_per_pass"])
        out["tokens_lost"].append(s["tokens_lost_per_pass"])
        drafted = s["rows_per_pass"] - 1.0                 # draft nodes per pass (the root is never pruned)
        out["survive"].append(1.0 - s["rows_pruned_per_pass"] / drafted if drafted > 0 else 1.0)
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def choose_threshold(train_sweep: dict, min_recall: float) -> int:
    """Index of the threshold with the best training speed among those whose
    training recall is >= min_recall (index 0, no pruning, always qualifies)."""
    ok = np.nan_to_num(train_sweep["recall"], nan=1.0) >= min_recall - 1e-12
    ok[0] = True
    speed = np.where(ok, np.nan_to_num(train_sweep["speed"], nan=-np.inf), -np.inf)
    return int(np.argmax(speed))


def evaluate(traces: Traces, scorers: list[Fitted], held: np.ndarray, cost, min_recall: float = 0.99) -> dict:
    """The table, per scorer the threshold chosen on training prompts (best
    training speed with training recall >= min_recall, and the best with no
    recall floor) with its held-out recall, rejected pruned and speed, and the
    held-out sweeps (for the plot).  The chosen probe: the layer whose training
    speed at its default threshold is best (the baseline is not a probe)."""
    held_prompts = np.unique(traces.nodes["prompt"][held])
    train_nodes, train_trees = part(traces, False, held_prompts)
    test_nodes, test_trees = part(traces, True, held_prompts)
    report = {"table": recall_table(traces, scorers, held), "cost": cost.label, "min_recall": min_recall,
              "speed_subset": speed_policy(traces),
              "held_out_prompts": sorted(int(p) for p in held_prompts), "scorers": {}, "sweeps": {}}
    for s in scorers:
        slot_logits = s.logits(feature_matrix(traces, _slot(traces, s)))
        grid = threshold_grid(slot_logits[train_nodes])
        train = sweep(traces, s, train_nodes, train_trees, cost, grid)
        test = sweep(traces, s, test_nodes, test_trees, cost, grid)
        entry = {"layer": s.layer, "weights": s.weights.tolist()}
        for label, floor in (("default", min_recall), ("best", 0.0)):
            i = choose_threshold(train, floor)
            entry[label] = {"threshold": _f(grid[i]), "train_recall": _f(train["recall"][i]),
                            "train_speed": _f(train["speed"][i]),
                            "recall": _f(test["recall"][i]), "pruned": _f(test["pruned"][i]),
                            "speed": _f(test["speed"][i]), "rows_pruned_per_pass": _f(test["rows_pruned"][i]),
                            "tokens_lost_per_pass": _f(test["tokens_lost"][i]),
                            "survive": _f(test["survive"][i])}
        report["scorers"][s.name] = entry
        report["sweeps"][s.name] = {k: [_f(v) for v in test[k]] for k in test}
    probes = [name for name, e in report["scorers"].items() if e["layer"] is not None]
    report["chosen"] = (max(probes, key=lambda k: report["scorers"][k]["default"]["train_speed"] or 0.0)
                        if probes else None)
    return report


def _f(x) -> float | None:
    """A float for JSON: None for nan and +-inf (a threshold of None prunes nothing)."""
    x = float(x)
    return x if np.isfinite(x) else None


def format_table(report: dict) -> str:
    """The held-out table and the threshold choices, as text lines."""
    lines = ["# held-out prompts " + ", ".join(map(str, report["held_out_prompts"]))
             + f"; rejected nodes pruned at the threshold keeping 99/95/90% of match nodes"]
    lines.append(f"{'scorer':<10} {'subset':<6} {'nodes':>7} {'match':>7} "
                 + " ".join(f"{f'@{r:.0%}':>7}" for r in RECALLS))
    for row in report["table"]:
        lines.append(f"{row['scorer']:<10} {row['subset']:<6} {row['nodes']:>7} {row['match']:>7} "
                     + " ".join(_pct(row[f'pruned@{r:g}']) for r in RECALLS))
    lines.append(f"# threshold chosen on training prompts by tokens/s ({report['cost']}) on "
                 f"{report['speed_subset']} trees; held-out results (rows-: rows pruned per pass, "
                 f"tok-: tokens lost per pass, tok/s: relative to no pruning)")
    lines.append(f"{'scorer':<10} {'choice':<8} {'thresh':>8} {'recall':>7} {'pruned':>7} {'rows-':>6} "
                 f"{'tok-':>6} {'tok/s':>7}")
    for name, e in report["scorers"].items():
        for label in ("default", "best"):
            c = e[label]
            lines.append(f"{name:<10} {label:<8} {_num(c['threshold'], 8, 3, 'none')} {_pct(c['recall'])} "
                         f"{_pct(c['pruned'])} {_num(c['rows_pruned_per_pass'], 6, 1)} {_num(c['tokens_lost_per_pass'], 6, 2)} "
                         f"{_num(c['speed'], 6, 3)}x")
    if report.get("chosen"):
        lines.append(f"probe: {report['chosen']} (default threshold: training recall >= {report['min_recall']:.0%})")
    return "\n".join(lines)


def _pct(x) -> str:
    return f"{'-':>7}" if x is None or not np.isfinite(x) else f"{x:>7.1%}"


def _num(x, width: int, digits: int, missing: str = "-") -> str:
    return f"{missing:>{width}}" if x is None else f"{x:>{width}.{digits}f}"
