"""What could any logit-lens probe buy?  An upper bound from recorded traces.

Lever's probe scores a node with n dot products (its token's head row against
the parent's hidden state after layer k) because a full-vocabulary head at
layer k costs about as much as the real head.  This experiment pays that
price offline: for every traced node it computes the *exact* logit lens of
the parent's recorded hidden state over the whole vocabulary (final norm +
output head, the native kernels), and takes the node token's lens
log-probability and rank.  A logistic model on those plus the draft features
(probability, sibling rank, depth) is fitted on the training prompts and
evaluated on the held-out ones exactly as `lever probe train` evaluates its
probes: the fraction of rejected nodes pruned at 99 / 95 / 90% recall of
the accepted-able nodes, for all nodes of the static tree and for the nodes
of lever's trees, next to the draft-only baseline; and the tokens/s the best
threshold would give under the device profile *without* charging the full
head's cost (so it is an upper bound).

    python bench/probe_full_lens.py --traces DIR --target qwen2.5-coder-1.5b [--json OUT]

The target must be the model the traces were recorded from (an in-memory
copy of the store's model: the same weights).  Takes minutes (one full head
per parent row and recorded layer).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from lever import _native
from lever.probe.evaluate import (RECALLS, SUBSETS, TreeSet, pruned_fraction, recall_at, relative_speed,
                                  threshold_at_recall)
from lever.probe.train import fit_logistic, split_prompts
from lever.probe.traces import load_traces

CHUNK = 64                 # parent rows per head call


def full_lens(decoder, hidden: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log-probability, rank) of tokens[i] under the logit lens of hidden[i]
    (float32 [m, H]): softmax over the whole vocabulary of head(final_norm(h))."""
    w = decoder.weights
    first, end, qtype = w.head_parts[0]
    logp = np.empty(len(tokens), dtype=np.float64)
    rank = np.empty(len(tokens), dtype=np.int64)
    for s in range(0, len(tokens), CHUNK):
        h = np.ascontiguousarray(hidden[s:s + CHUNK], dtype=np.float32)
        normed = np.empty_like(h)
        decoder.native.rms_norm(h, w.norm, normed)
        logits = np.empty((h.shape[0], end - first), dtype=np.float32)
        _native.linear(normed, w.head, qtype, end - first, logits)
        tok = tokens[s:s + CHUNK]
        at = logits[np.arange(len(tok)), tok].astype(np.float64)
        top = logits.max(axis=1, keepdims=True).astype(np.float64)
        lse = top[:, 0] + np.log(np.exp(logits.astype(np.float64) - top).sum(axis=1))
        logp[s:s + CHUNK] = at - lse
        rank[s:s + CHUNK] = (logits > logits[np.arange(len(tok)), tok][:, None]).sum(axis=1)
    return logp, rank


def lens_columns(traces, decoder, slot: int) -> np.ndarray:
    """float64 [N, 3]: lens log-prob, is-top-1 and log(1 + rank) of every node at recorded layer `slot`."""
    n = traces.nodes
    out = np.zeros((traces.n_nodes, 3))
    for p in traces.meta["prompts"]:
        sel = np.flatnonzero(n["prompt"] == p["index"])
        if sel.size == 0:
            continue
        hidden = traces.hidden(p["shard"])[:, slot, :]
        logp, rank = full_lens(decoder, hidden[n["hrow"][sel]].astype(np.float32), n["token"][sel].astype(np.int64))
        out[sel] = np.c_[logp, rank == 0, np.log1p(rank)]
        print(f"  layer slot {slot}: prompt {p['index']} ({sel.size} nodes)", file=sys.stderr, flush=True)
    return out


def draft_columns(traces) -> np.ndarray:
    n = traces.nodes
    return np.c_[n["draft_logp"], n["rank"], n["depth"]].astype(np.float64)


def evaluate_scorer(traces, x: np.ndarray, held: np.ndarray, layer: int, cost) -> dict:
    """Fit on training prompts; held-out pruning at each recall per subset, and the
    best relative tokens/s on lever's trees over thresholds with >= 99% recall."""
    n = traces.nodes
    match = n["match"].astype(bool)
    w = fit_logistic(x[~held], match[~held])
    logits = w[0] + x @ w[1:]
    out = {}
    for subset, code in SUBSETS.items():
        m = held & (n["policy"] == code)
        out[subset] = {f"pruned@{r:g}": pruned_fraction(logits[m], match[m],
                                                        threshold_at_recall(logits[m], match[m], r))
                       for r in RECALLS}
    code = SUBSETS["lever"]
    held_prompts = np.unique(n["prompt"][held])
    tm = np.isin(traces.trees["tree_prompt"], held_prompts) & (traces.trees["tree_policy"] == code)
    nm = held & (n["policy"] == code)
    trees = TreeSet.of(traces, tm)
    best = (1.0, None)
    for t in np.quantile(logits[nm], np.linspace(0, 0.6, 31)):
        if recall_at(logits[nm], match[nm], t) >= 0.99:
            s = relative_speed(trees, logits[nm] >= t, layer, cost)["relative_tokens_per_s"]
            best = max(best, (s, float(t)), key=lambda b: b[0])
    out["lever_speed_at_99"] = best[0]
    return out


def main() -> int:
    from lever.api import load
    from lever.commands.probe import cost_for

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", required=True)
    ap.add_argument("--target", required=True, help="the traced target, in memory (name or GGUF path)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    traces = load_traces(args.traces)
    decoder = load(args.target, dtype="bfloat16").model
    held = split_prompts(traces.nodes["prompt"])
    cost = cost_for(traces, None)
    results = {"draft": evaluate_scorer(traces, draft_columns(traces), held, -1, cost)}
    for slot, layer in enumerate(traces.layers):
        x = np.c_[lens_columns(traces, decoder, slot), draft_columns(traces)]
        results[f"full lens {layer}"] = evaluate_scorer(traces, x, held, layer, cost)
    print("# exact full-vocabulary logit lens + draft features (upper bound of a lens probe); held-out prompts")
    print(f"{'scorer':<14} {'subset':<6} " + " ".join(f"{f'@{r:.0%}':>7}" for r in RECALLS))
    for name, r in results.items():
        for subset in SUBSETS:
            print(f"{name:<14} {subset:<6} " + " ".join(f"{100 * r[subset][f'pruned@{x:g}']:>6.1f}%" for x in RECALLS))
    print("# best tokens/s on lever's held-out trees at >= 99% recall, full head not charged: "
          + ", ".join(f"{name} {r['lever_speed_at_99']:.3f}x" for name, r in results.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
