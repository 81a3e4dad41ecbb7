"""`lever bench` output: the header lines, the table, the lever lines, the
JSON document and its files (sizes in bytes unless a column says MB, times
in seconds).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from ..atomic_write import write_atomic
from .bench_modes import RESIDENT


def machine_info() -> dict:
    """The machine and software versions (torch's only when the torch reference is loaded)."""
    from .. import __version__
    torch = sys.modules.get("torch")
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        pass
    return {"machine": platform.machine(), "platform": platform.platform(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "memory_bytes": mem, "python": platform.python_version(),
            "numpy": np.__version__, "lever": __version__,
            **({"torch": torch.__version__, "torch_threads": torch.get_num_threads()} if torch else {})}


def print_header(args, b, kernels: dict) -> None:
    """The target, the prompts and modes, the page cache and the store's raw read rate."""
    t, m = b.target, b.manifest
    reader = t.report()["reader"] if b.streamed else None
    header = (f"# lever bench: target={b.target_name}"
              + (f" ({m.storage}, {m.weight_layout} layout, {m.weights_bytes / 1e6:,.0f} MB; "
                 f"budget {b.budget / 1e6:,.0f} MB, "
                 f"{t.plan.pinned_layers}/{m.config.n_layers} layers pinned, ring {t.plan.prefetch_depth} slots, "
                 f"{t.plan.streamed_bytes_per_pass / 1e6:,.1f} MB streamed per pass; "
                 f"reader {reader['backend']} direct={reader['direct']} queue depth {reader['queue_depth']}, "
                 f"{reader['huge_page_bytes'] / 2**20:,.0f} of {reader['slot_buffer_bytes'] / 2**20:,.0f} MiB "
                 f"of slots on huge pages)"
                 if b.streamed else " (in memory)")
              + f" draft={args.draft if b.needs_draft else '-'} dtype={b.run.config.target.dtype}"
              + f" kernels={kernels['mode']} ({kernels['isa']}"
              + (f"; draft weights {kernels['draft_resident_weight_bytes'] / 2**20:,.0f} MiB in DRAM"
                 if "draft_resident_weight_bytes" in kernels else "") + ")")
    cats = {c: sum(p["category"] == c for p in b.prompts) for c in dict.fromkeys(p["category"] for p in b.prompts)}
    print(header, flush=True)
    print(f"# prompts: {len(b.prompts)} of set {args.prompt_set} ("
          + ", ".join(f"{c} {n}" for c, n in cats.items()) + f"), {b.new_tokens} new tokens, temperature "
          f"{args.temperature:g}; modes: {' '.join(m.label for m in b.modes)}"
          + (" (ar added as the reference)" if b.ar_added else "")
          + (f" + {RESIDENT}" if args.resident else ""), flush=True)
    print(f"# page cache: {b.page_cache}", flush=True)
    if b.streamed:
        print(f"# read ring: {t.plan.prefetch_depth} slots, {t.plan.depth_rule} (one plan for every mode)", flush=True)
    if b.raw_read_bps:
        print(f"# raw sequential read of the store: {b.raw_read_bps / 2**30:.2f} GiB/s; the I/O bound of a mode is "
              f"its bytes read per token at that rate (column I/O tok/s: the most tokens/s the flash allows)",
              flush=True)


def io_share_label(b) -> str:
    """The I/O setting of a bench in words: all streamed, k/L layers pinned, or resident."""
    if not b.streamed:
        return "in memory"
    plan, n_layers = b.target.plan, b.manifest.config.n_layers
    if not plan.streamed:
        return "resident (every extent pinned)"
    if plan.pinned_layers == 0:
        return "all streamed"
    return f"{plan.pinned_layers}/{n_layers} layers pinned"


def _fmt_mismatch(a: dict) -> str:
    if a["mode"] == "ar":
        return "(reference)"
    if a.get("mismatches") is None:
        return "-"
    m, tie = a["mismatches"], a["mismatches_near_tie"]
    return f"{m}" + (f" ({tie} tie)" if tie else "")


def print_table(aggregates: dict, resident: dict | None, streamed: bool) -> None:
    head = (f"{'mode':<14}{'tok/s':>9}{'vs ar':>8}{'acc.len':>9}{'tree':>7}{'MB/tok':>9}{'I/O tok/s':>10}"
            f"{'draft s':>9}{'hidden':>7}{'verify s':>10}{'stall s':>9}{'accept s':>10}  mismatches")
    print(head)
    print("-" * len(head))
    lines = list(aggregates.values())
    if resident is not None and not resident.get("same_as_ar"):
        lines.append(resident)
    for a in lines:
        ts = a["time_split_s"]
        flash = streamed and a["mode"] != RESIDENT and a["bytes_read_per_token"] is not None
        mb = f"{a['bytes_read_per_token'] / 1e6:9.2f}" if flash else f"{'-':>9}"
        bound = a.get("io_bound_tokens_per_s")
        io = f"{bound:10.1f}" if flash and bound else f"{'-':>10}"
        ratio = f"{a['ratio_vs_ar']:7.2f}x" if a["ratio_vs_ar"] is not None else f"{'-':>8}"
        share = a.get("draft_hidden_under_io")
        hidden = f"{100 * share:6.0f}%" if flash and share is not None and ts["draft"] > 0 else f"{'-':>7}"
        print(f"{a['mode']:<14}{a['tokens_per_s']:9.2f}{ratio}{a['mean_accepted_length']:9.2f}"
              f"{a['mean_tree_size']:7.1f}{mb}{io}{ts['draft']:9.2f}{hidden}{ts['verify_compute']:10.2f}{ts['io_stall']:9.2f}"
              f"{ts['accept']:10.2f}  {_fmt_mismatch(a)}")
    if resident is not None and resident.get("same_as_ar"):
        print(f"{RESIDENT:<14}= ar (the --target model is memory-resident)")
    sys.stdout.flush()


def print_lever(aggregates: dict) -> None:
    """One line per lever mode: tree sizes, predicted vs realised length and time."""
    for a in aggregates.values():
        lv = a.get("lever")
        if not lv or not lv.get("iterations"):
            continue
        ts, al, it = lv["tree_size"], lv["accepted_length"], lv["iteration_s"]
        hist = " ".join(f"{k}:{v}" for k, v in ts["histogram"].items())
        cal = lv["calibration"]
        print(f"# {a['mode']}: tree nodes mean {ts['mean']:.1f} p50 {ts['p50']:.0f} p90 {ts['p90']:.0f} max {ts['max']} "
              f"[{hist}]; accepted length predicted {al['predicted_mean']:.2f} realised {al['realised_mean']:.2f}; "
              f"iteration predicted {it['predicted_mean'] * 1e3:.0f} ms realised {it['realised_mean'] * 1e3:.0f} ms; "
              f"policy {lv['grow_us_mean']:.0f} us/iteration; calibration ECE {cal['ece_calibrated'] or 0:.3f} "
              f"(draft prob {cal['ece_draft_prob'] or 0:.3f}, {cal['observations']} observations, "
              f"{lv['calibration_observations_at_start']} at start); profile I/O share at n=1 "
              f"{100 * lv['io_share_n1']:.0f}%; draft credit under I/O "
              f"{lv['cost_correction']['hidden_draft_s'].get('8', 0.0) * 1e3:.0f} ms at n=8; cost drift refits "
              f"{lv['cost_drift']['refits']}", flush=True)


def print_ahead(aggregates: dict) -> None:
    """One line per mode that drafted ahead: forwards, reuse, what ran beside the verification."""
    for a in aggregates.values():
        da = a.get("draft_ahead")
        if da:
            print(f"# {a['mode']}: drafted ahead {da['forwards']} forwards ({da['drafting_s']:.2f} s, "
                  f"{100 * da['hidden_share']:.0f}% beside the target's pass); the next tree reused them in "
                  f"{da['reused_iterations']} of {da['iterations']} iterations ({da['reused_nodes']} expansions)",
                  flush=True)


def print_backend(args, b, aggregates: dict, rows: list[dict], before: dict | None) -> dict:
    """On a static backend: the `# backend ...` line over the timed runs (bucket
    runs, split passes, padded rows), each mode's bucket counters into its
    aggregate, and per drafting mode one `# MODE: overlap: ...` line (the
    iterations' wall seconds against draft + verify seconds; also on the native
    backend for +ahead modes).  Returns the bench JSON's "backend" entry."""
    from .static_backend import backend_json, backend_line, counters_since, overlap_line, summed_counters

    info = backend_json(args, b.layers)
    if b.layers is not None:
        info["timed_runs"] = counters_since(b.layers.report(), before)
        for label, a in aggregates.items():
            mine = [r["backend"] for r in rows if r["mode"] == label and "backend" in r]
            if mine:
                a["backend"] = summed_counters(mine)
        print(backend_line({**info, **info["timed_runs"]}), flush=True)
        if b.ahead_added:
            print(f"# {args.backend}: drafting modes draft ahead by default (+ahead; --no-draft-ahead runs them "
                  f"as written)", flush=True)
    for a in aggregates.values():
        ov = a.get("overlap")
        if ov and ov["iteration_s"] > 0 and ov["draft_s"] > 0 and (b.layers is not None or a.get("draft_ahead")):
            print(overlap_line(ov, prefix=f"# {a['mode']}: "), flush=True)
    return info


def print_probes(aggregates: dict, io_share: str) -> None:
    """One line per +probes mode: rows pruned per pass, compute saved, accepted length
    lost, online recall and net tokens/s against the mode without probes."""
    for a in aggregates.values():
        pr = a.get("probes")
        if not pr:
            continue
        vs = pr.get("vs_without")
        recall = "n/a" if pr["online_recall"] is None else f"{pr['online_recall']:.3f}"
        against = (f"{vs['tokens_per_s_ratio']:.3f}x {vs['mode']} (accepted length lost {vs['accepted_length_lost']:+.3f})"
                   if vs and vs["tokens_per_s_ratio"] is not None else "no run without probes")
        unscored = (f" ({pr['unscored']} of {pr['passes']} passes not scored: pruning would not pay)"
                    if pr.get("unscored") else "")
        print(f"# probes {a['mode']} [{io_share}]{unscored}: {pr['pruned_per_pass']:.2f} rows pruned per pass of "
              f"{a['mean_tree_size'] + 1:.1f}, {100 * pr['compute_saved']:.1f}% of layer rows skipped, scoring "
              f"{pr['score_ms_per_pass']:.2f} ms/pass, online recall {recall}, {a['tokens_per_s']:.2f} tok/s = "
              f"{against}", flush=True)


def print_checks(params, checks: dict[str, list[dict]]) -> None:
    """The sampled-check note, and a warning for runs that differ from ar without a near-tie."""
    if not params.greedy:
        print(f"# temperature {params.temperature:g}, seed {params.seed}: position-keyed draws, so every mode's "
              f"text is checked against ar's", flush=True)
    bugs = [label for label, divs in checks.items() for d in divs if not d.get("near_tie")]
    if bugs:
        print(f"# WARNING: {len(bugs)} run(s) differ from ar without a near-tie ({', '.join(sorted(set(bugs)))}): "
              f"a bug in the speculative path", flush=True)


def result_document(args, b, kernels: dict, aggregates: dict, resident_agg: dict | None, rows: list[dict],
                    bench_s: float) -> dict:
    """The JSON document of one bench (config, machine, target, timing, prompts,
    modes, resident, runs, memory)."""
    from ..memory.run_plan import memory_report
    from .bench_setup import sweep_extent

    t, m = b.target, b.manifest
    return {
        "benchmark": "lever bench",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "config": {"target": b.target_name, "target_kind": "store" if b.streamed else "model",
                   "draft": args.draft if b.needs_draft else None, "dram_budget_bytes": b.budget,
                   "memory_limit_bytes": args.memory_limit,
                   "modes": [x.label for x in b.modes], "ar_added": b.ar_added, "resident": args.resident,
                   "prompt_set": args.prompt_set, "categories": args.categories, "prompts": len(b.prompts),
                   "new_tokens": b.new_tokens, "ignore_eos": args.ignore_eos,
                   "temperature": args.temperature, "seed": args.seed, "raw_read_bytes_per_s": b.raw_read_bps,
                   "raw_read_extent_bytes": sweep_extent(b.memory) if b.streamed else None,
                   "dtype": b.run.config.target.dtype, "reader": args.reader, "read_queue_depth": args.read_queue_depth,
                   "prefetch_depth": args.prefetch_depth,
                   "drop_caches": args.drop_caches, "page_cache": b.page_cache, "quick": args.quick,
                   "kernels": kernels, "probes": b.probes, "io_setting": io_share_label(b),
                   "chat_template": True},
        "machine": machine_info(),
        "target": ({"store": str(b.store), "storage": m.storage, "weight_layout": m.weight_layout,
                    "store_format_version": m.format_version, "weights_bytes": m.weights_bytes,
                    "n_layers": m.config.n_layers, "reader": t.report()["reader"],
                    "residency": t.plan.summary()} if b.streamed
                   else {"path": str(b.loaded.path), "n_layers": t.config.n_layers}),
        "timing_s": {"load": round(b.load_s, 3), "bench": round(bench_s, 3)},
        "prompts": [{"id": p["id"], "category": p["category"], "source": p["source"], "prompt_tokens": len(i)}
                    for p, i in zip(b.prompts, b.ids)],
        "modes": aggregates,
        "resident": resident_agg,
        "runs": rows,
        "memory": memory_report(b.memory),
    }


def write_outputs(result: dict, out_dir: Path, name: str, plot) -> None:
    """NAME.json and (with matplotlib, unless `plot` is None) NAME.png drawn by
    `plot(result, path)` in out_dir; prints what was written, and without
    matplotlib (the plot extra) one line saying what to install."""
    from ..plotting import PlotUnavailableError
    json_path, png_path = out_dir / f"{name}.json", out_dir / f"{name}.png"
    write_atomic(json_path, json.dumps(result, indent=1))     # SaveError (one line naming it) if it cannot
    wrote = [str(json_path)]
    try:
        if plot is not None:
            plot(result, png_path)
            wrote.append(str(png_path))
    except PlotUnavailableError as e:
        print(f"# PNG skipped: {e}", flush=True)
    print(f"# wrote {' and '.join(wrote)}", flush=True)
