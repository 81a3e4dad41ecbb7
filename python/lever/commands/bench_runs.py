"""`lever bench` timed runs: for each prompt every mode in turn (so machine
noise spreads evenly over the modes), then each mode's tokens checked against
ar's. Times in seconds, sizes in bytes.
"""

from __future__ import annotations

import sys
import time

from .bench_modes import RESIDENT, parse_mode
from .bench_aggregate import divergence

FLASH_RUN_KEYS = ("passes", "bytes_read", "io_busy_s", "stall_s", "dequant_s", "compute_s")


def mode_runs(b) -> list[tuple[str, object, object]]:
    """(label, model, BenchMode) of every timed mode, the resident reference last."""
    runs = [(m.label, b.target, m) for m in b.modes]
    if b.resident is not None:
        runs.append((RESIDENT, b.resident, parse_mode("ar")))
    return runs


def timed_runs(b, runs: list, progress: bool) -> tuple[list[dict], dict[str, list], float, dict[str, dict]]:
    """Every (prompt, mode) run: (rows, raw results by label as (prompt, ids,
    result, stats), the seconds it all took, and each label's memory after its
    last run: the process's RSS and peak RSS, bytes)."""
    from tqdm import tqdm

    from ..memory import rss

    rows: list[dict] = []
    raw: dict[str, list] = {label: [] for label, _, _ in runs}
    memory: dict[str, dict] = {}
    bar = tqdm(total=len(b.prompts) * len(runs), desc="lever bench", unit="run", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    t_bench = time.perf_counter()
    try:
        for p, prompt_ids in zip(b.prompts, b.ids):
            for label, model, m in runs:
                bar.set_postfix_str(f"{p['id']} {label}")
                row, result, stats = run_one(b, p, prompt_ids, label, model, m)
                rows.append(row)
                raw[label].append((p, prompt_ids, result, stats))
                snap = rss.snapshot()
                memory[label] = {"rss_bytes_after": snap.rss_bytes, "peak_rss_bytes_after": snap.peak_rss_bytes}
                bar.update(1)
    finally:
        bar.close()
    return rows, raw, time.perf_counter() - t_bench, memory


def run_one(b, p: dict, prompt_ids: list[int], label: str, model, m) -> tuple[dict, object, object]:
    """One timed generation of prompt `p` in mode `m`: (its JSON row, result, stats)."""
    from ..engine import speculative_generate

    if b.streamed:
        b.target.reset_stats()
    layers = getattr(model, "layers", None) if getattr(b, "layers", None) is not None else None
    before = layers.report() if hasattr(layers, "report") else None
    if model is b.target:                  # the run's target, through the run's verifier
        result, stats = b.run.speculate(prompt_ids, b.new_tokens, b.params, m.spec, stop_ids=b.stop_ids)
    else:                                  # --resident: the pinned-store reference decoder beside it
        result, stats = speculative_generate(model, None, prompt_ids, b.new_tokens, b.params, m.spec,
                                             stop_ids=b.stop_ids)
    n = len(result.token_ids)
    row = {"prompt_id": p["id"], "category": p["category"], "mode": label,
           "prompt_tokens": len(prompt_ids), "new_tokens": n, "stop_reason": result.stop_reason,
           "prefill_s": round(result.prefill_s, 4), "decode_s": round(result.decode_s, 4),
           "tokens_per_s": round(n / result.decode_s, 3) if result.decode_s else None,
           **stats.to_json(n), "token_ids": result.token_ids}
    if b.streamed and model is b.target:
        rep = b.target.report()
        row["flash_run"] = {k: rep[k] for k in FLASH_RUN_KEYS}
    if before is not None:
        from .static_backend import counters_since
        row["backend"] = counters_since(layers.report(), before)
    return row, result, stats


def check_against_ar(b, runs: list, raw: dict[str, list], rows: list[dict]) -> dict[str, list[dict]]:
    """Token-for-token check of every mode against ar, with a near-tie diagnosis
    (sampling is keyed by position, so sampled runs of one seed must equal ar's
    too). Marks each row `matches_ar` (and `divergence`); returns each checked
    label's divergences. Without an ar run nothing is checked ({})."""
    if "ar" not in raw:
        return {}
    ar_tokens = {p["id"]: r.token_ids for p, _, r, _ in raw["ar"]}
    checks: dict[str, list[dict]] = {}
    for label, _, _ in runs:
        if label == "ar":
            continue
        checks[label] = []
        for (p, prompt_ids, r, _), row in zip(raw[label], [x for x in rows if x["mode"] == label]):
            ref = ar_tokens[p["id"]]
            row["matches_ar"] = r.token_ids == ref
            if r.token_ids != ref:
                row["divergence"] = divergence(b.target, prompt_ids, ref, r.token_ids, b.params)
                checks[label].append(row["divergence"])
    return checks
