"""`lever bench` per-mode totals: tokens/s, accepted length, bytes read, the
time split, the ratio to ar and the I/O bound, and the diagnosis of a run
that differs from ar. Sizes in bytes, times in seconds.
"""

from __future__ import annotations

import numpy as np

from ..engine import overlap_json
from .bench_modes import LEVER, RESIDENT, spec_json


def aggregate(label: str, runs: list, divergences: list[dict] | None, is_ar: bool) -> dict:
    """Totals over all prompts of one mode (tokens/s = total tokens / total decode time).
    divergences: the runs that differ from ar; None when the mode was not checked
    (mismatches None)."""
    def totals(sel: list) -> dict:
        gen = sum(len(r.token_ids) for _, _, r, _ in sel)
        dec = sum(r.decode_s for _, _, r, _ in sel)
        passes = sum(s.iterations for *_, s in sel)
        return {"generated_tokens": gen, "decode_s": round(dec, 4),
                "tokens_per_s": round(gen / dec, 3) if dec else 0.0, "target_passes": passes,
                "mean_accepted_length": round(gen / passes, 3) if passes else 0.0}

    stats = [s for *_, s in runs]
    sizes = [n for s in stats for n in s.tree_sizes]
    draft_nodes, accepted = sum(s.draft_nodes for s in stats), sum(s.accepted for s in stats)
    t = totals(runs)
    bytes_read = sum(s.bytes_read for s in stats)
    out = {
        "mode": label, "runs": len(runs), **t,
        "prefill_s": round(sum(r.prefill_s for _, _, r, _ in runs), 4),
        "draft_tokens": draft_nodes, "accepted_draft_tokens": accepted,
        "acceptance_rate": round(accepted / draft_nodes, 4) if draft_nodes else None,
        "mean_tree_size": round(sum(sizes) / len(sizes), 3) if sizes else 0.0,
        "bytes_read": bytes_read,
        "bytes_read_per_token": bytes_read / t["generated_tokens"] if t["generated_tokens"] else None,
        "time_split_s": {"draft": round(sum(s.draft_s for s in stats), 4),
                         "verify_compute": round(sum(s.verify_s - s.stall_s for s in stats), 4),
                         "io_stall": round(sum(s.stall_s for s in stats), 4),
                         "accept": round(sum(s.accept_s for s in stats), 4)},
        "draft_hidden_under_io": _hidden_share(stats),
        "overlap": overlap_json(*(sum(getattr(s, k) for s in stats) for k in ("iteration_s", "draft_s")),
                                sum(s.ahead.drafting_s for s in stats if s.ahead is not None),
                                sum(s.verify_s for s in stats), sum(s.accept_s for s in stats)),
        **({"draft_ahead": _ahead_totals(stats)} if any(s.ahead is not None for s in stats) else {}),
        **({"probes": _probe_totals(stats)} if any(s.probes is not None for s in stats) else {}),
        "per_category": {c: totals([x for x in runs if x[0]["category"] == c])
                         for c in dict.fromkeys(x[0]["category"] for x in runs)},
    }
    if is_ar:
        out["mismatches"] = out["mismatches_near_tie"] = 0
    elif divergences is None:
        out["mismatches"] = out["mismatches_near_tie"] = None
    else:
        out["mismatches"] = len(divergences)
        out["mismatches_near_tie"] = sum(1 for d in divergences if d.get("near_tie"))
    return out


def _hidden_share(stats: list) -> float | None:
    """Share of the drafting seconds during which the flash reader streamed the
    next pass (None when a verifier could not tell)."""
    if any(s.draft_io_s is None for s in stats):
        return None
    draft = sum(s.draft_s for s in stats)
    return round(min(1.0, sum(s.draft_io_s for s in stats) / draft), 4) if draft > 0 else 0.0


def _ahead_totals(stats: list) -> dict:
    """Draft-ahead counters summed over the runs (lever.draft.ahead.AheadStats)."""
    from ..draft.ahead import AheadStats
    total = AheadStats()
    for s in (s.ahead for s in stats if s.ahead is not None):
        for name in AheadStats.__dataclass_fields__:
            setattr(total, name, getattr(total, name) + getattr(s, name))
    return {**total.to_json(), "iterations": sum(s.iterations for s in stats)}


def _probe_totals(stats: list) -> dict:
    """Early-exit pruning counters summed over the runs (lever.probe.prune.PruneStats)."""
    from ..probe.prune import PruneStats
    total = PruneStats()
    for s in (s.probes for s in stats if s.probes is not None):
        total = PruneStats(*(getattr(total, f) + getattr(s, f) for f in PruneStats.__dataclass_fields__))
    return total.to_json()


def compare_probes(modes: list, aggregates: dict) -> None:
    """For each +probes mode, its tokens/s ratio and accepted length lost against
    the same mode without probes, when that ran too (into its "probes" entry)."""
    for m in modes:
        a, base = aggregates.get(m.label), aggregates.get(m.base_label)
        if not m.probes or a is None or "probes" not in a or base is None or base is a:
            continue
        a["probes"]["vs_without"] = {
            "mode": m.base_label,
            "tokens_per_s_ratio": round(a["tokens_per_s"] / base["tokens_per_s"], 4) if base["tokens_per_s"] else None,
            "accepted_length_lost": round(base["mean_accepted_length"] - a["mean_accepted_length"], 3),
            "mean_tree_size_without": base["mean_tree_size"]}


def summarize(b, runs: list, raw: dict[str, list], checks: dict[str, list[dict]], memory: dict[str, dict],
              resident_asked: bool) -> tuple[dict, dict | None]:
    """(aggregates by mode label, the resident reference's or None): each with
    its ratio to ar, I/O bound, spec, lever report and memory after its runs.
    resident_asked: --resident (an in-memory target is its own resident reference)."""
    aggregates = {label: aggregate(label, raw[label], checks.get(label), label == "ar") for label, _, _ in runs}
    ar_tps = aggregates["ar"]["tokens_per_s"] if "ar" in aggregates else None
    bps = b.raw_read_bps
    for a in aggregates.values():
        a["ratio_vs_ar"] = round(a["tokens_per_s"] / ar_tps, 4) if ar_tps else None
        per_token = a["bytes_read_per_token"]
        a["io_lower_bound_s_per_token"] = per_token / bps if bps and per_token else None
        a["io_bound_tokens_per_s"] = round(bps / per_token, 2) if bps and per_token else None
    for m in b.modes:
        a = aggregates[m.label]
        a["spec"] = spec_json(m)
        if m.spec.mode == LEVER:
            pol = m.spec.policy
            a["spec"]["lever"] = {"max_nodes": pol.max_nodes, "max_depth": pol.max_depth, "topk": pol.topk}
            a["lever"] = {**pol.report(), "calibration_observations_at_start":
                          b.calibration_start[b.policies.index(pol)],
                          "io_share_n1": round(pol.cost.io_share(1), 4),
                          "profile_pass_s": pol.cost.summary()["pass_s"]}
    compare_probes(b.modes, aggregates)
    for label, a in aggregates.items():
        a["memory"] = memory.get(label)
    resident_agg = aggregates.pop(RESIDENT, None)
    if resident_asked and resident_agg is None and "ar" in aggregates:   # an in-memory --target is resident
        resident_agg = {**aggregates["ar"], "mode": RESIDENT, "same_as_ar": True}
    if resident_agg is not None:
        resident_agg.setdefault("same_as_ar", False)
    return aggregates, resident_agg


def divergence(model, prompt_ids: list[int], ref: list[int], got: list[int], params) -> dict:
    """Where `got` first differs from ar's `ref`, and whether the two tokens
    were a near-tie there: greedy, both logits within ~2 bf16 ulps of the top
    logit; sampled, their Gumbel-max scores (processed logits + the
    position's noise) within the same margin scaled by 1/temperature."""
    from ..autoregressive import kv_tokens, prefill
    from ..sampling import position_noise, processed_logits

    i = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
    out = {"index": i, "ar_token": ref[i] if i < len(ref) else None, "token": got[i] if i < len(got) else None}
    if out["ar_token"] is None or out["token"] is None:
        out["near_tie"] = False
        return out
    cache = model.new_cache(capacity=kv_tokens(prompt_tokens=len(prompt_ids), new_tokens=i + 1))
    logits = prefill(model, list(prompt_ids) + ref[:i], cache).astype(np.float32)
    tol = 2.0 ** -6 * max(1.0, abs(float(logits.max())))
    if not params.greedy:
        tol /= params.temperature
        logits = processed_logits(logits, params).astype(np.float64) + position_noise(
            params.seed, len(prompt_ids) + i, logits.shape[-1])
    top = float(logits.max())
    a, b = float(logits[ref[i]]), float(logits[got[i]])
    out.update(ar_logit=a, logit=b, top_logit=top, tolerance=tol, near_tie=top - min(a, b) <= tol)
    return out
