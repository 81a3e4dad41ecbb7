"""`lever profile`: measure the cost model of a target / draft pair on this
device (per-stage flash-read and compute seconds, draft forward seconds,
per-iteration host work), cache it, and print a summary."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import LeverError
from ..extras import install_hint
from . import arg_types
from .limits import MAX_TREE_NODES
from ..memory.run_plan import memory_report
from .memory_limit import print_memory_line
from .options import (add_backend_options, add_cache_dir, add_compute_options, add_context, add_draft, add_draft_head,
                      add_dram_budget, add_no_progress, add_probes, add_reader_options, add_target_choice)

# KV rows a streamed target budgets for, as `lever generate` does for short
# runs, so the profile sees the residency (pinned layers) of a real run
PROFILE_KV_TOKENS = 2048


def step_function_line(model, buckets) -> str:
    """The pass cost the tree policy prices on fixed shapes: one value per row
    bucket, held for every tree size up to it (milliseconds)."""
    edges = [int(b) for b in buckets]
    verify = model.verify_s(max(edges))
    steps, low = [], 1
    for b in edges:
        steps.append(f"n={low}..{b} {verify[b - 1] * 1e3:,.1f} ms" if low < b else f"n={b} {verify[b - 1] * 1e3:,.1f} ms")
        low = b + 1
    return "pass per bucket (the step function the tree policy prices): " + ", ".join(steps)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "profile", help="measure this device's cost model for a target and draft (cached)",
        description="Measure per-layer flash-read and compute times of the target, draft forward times and "
                    "per-iteration host work on this device; cache them per (models, store, backend, machine) "
                    "and print the predicted pass times.")
    add_target_choice(p)
    add_draft(p, required=True, note="a draft model: 'ngram' has nothing to measure")
    add_draft_head(p)
    add_dram_budget(p)
    add_compute_options(p)
    add_reader_options(p)
    p.add_argument("--max-n", type=arg_types.integer(1, MAX_TREE_NODES), default=256, metavar="N",
                   help=f"largest tree (tokens per target pass) to measure, 1..{MAX_TREE_NODES} (default 256; "
                        f"a static backend measures its row buckets instead)")
    p.add_argument("--force", action="store_true", help="measure again even if a cached profile exists")
    add_probes(p, default="auto",
               help="also predict passes pruned early by the target's probe (`lever probe train`) at its "
                    "held-out survival: on, off, or auto = when a probe exists and was found worth running "
                    "(default auto)")
    add_cache_dir(p)
    p.add_argument("--json", action="store_true", help="print the profile as JSON instead of the table")
    p.add_argument("--plot", type=arg_types.output_file, default=None, metavar="PATH",
                   help=f"also write a PNG of pass and draft times (needs matplotlib: {install_hint('plot')})")
    add_no_progress(p)
    add_backend_options(p)
    add_context(p, offered=False)
    p.set_defaults(run=run)


def n_grid_up_to(max_n: int) -> list[int]:
    """The default grid of tree sizes, cut at max_n (max_n itself included)."""
    from ..cost.profile import DEFAULT_N_GRID
    if max_n < 1:
        raise LeverError(f"--max-n must be >= 1, got {max_n}")
    grid = [n for n in DEFAULT_N_GRID if n < max_n]
    return grid + [max_n]


def run(args: argparse.Namespace) -> int:
    from ..config import RunConfig
    from ..cost.cost_model import CostModel
    from ..cost.profile import DEFAULT_DRAFT_GRID, load_or_measure, profile_key, profile_path
    from ..runtime import build, kv_rule
    from .static_backend import check_backend_args

    checks = check_backend_args(args, kernels=args.kernels, probes=args.probes)
    if args.plot:                 # before a minute of measuring, not after it
        from ..plotting import require_matplotlib
        require_matplotlib("lever profile --plot")
    if args.draft == "ngram":
        raise LeverError("lever profile needs a draft model (--draft NAME, e.g. qwen2.5-coder-0.5b): "
                         "'ngram' runs no forward pass, so there is nothing to measure")
    n_grid = n_grid_up_to(args.max_n)
    config = RunConfig.from_args(args)
    progress = config.progress
    run = build(config, tree_rows=args.max_n, sampling=False,
                kv=kv_rule(new_tokens=0, prompt_tokens=PROFILE_KV_TOKENS), load_draft=False)
    memory, loaded = run.memory, run.loaded
    target = loaded.model
    # a static backend measures its row buckets (lever.cost.profile.measure_defaults): a step function
    grid = {} if config.backend.static else {"n_grid": n_grid}
    npu_info = None
    try:
        run.load_draft()
        draft = run.drafter
        key = profile_key(target, draft.model, target_id=loaded.path, draft_id=draft.path,
                          kernels=config.target.kernels, reader_backend=config.reader.backend,
                          read_limit_bytes_per_s=config.reader.read_limit, dtype=config.target.dtype)
        def measured():
            return load_or_measure(target, draft.model, key, cache_dir=args.cache_dir, force=args.force,
                                   progress=progress, draft_grid=DEFAULT_DRAFT_GRID, **grid)

        if checks.npu_profile is not None:
            from ..cost.timing import printer
            profile, npu_info = checks.npu_profile.device_profile(target, PROFILE_KV_TOKENS, host=measured,
                                                                  say=printer(progress))
        else:
            profile = measured()
        from ..probe.choice import probe_forecast
        forecast = probe_forecast(run.pruner(checks.probes))
    finally:
        run.close()
    model = CostModel(profile)
    path = profile_path(profile.key, args.cache_dir) if npu_info is None else None
    if args.plot:
        from ..cost.plot import plot_cost_model
        plot_cost_model(model, args.plot, title=f"{loaded.path.name} + {draft.path.name}")
    pruned = forecast.cost(model) if forecast is not None else None
    if args.json:
        print(json.dumps({**profile.to_json(), "memory": memory_report(memory),
                          **({"probes": pruned_summary(pruned)} if pruned is not None else {}),
                          **({"npu_profile": npu_info} if npu_info is not None else {})}, indent=1))
    else:
        print_table(model, loaded.path.name, draft.path.name)
        if pruned is not None:
            print_pruned(pruned)
        if npu_info is not None:
            print(f"profile: from --npu-profile {npu_info['file']} ({npu_info['device']}, SoC {npu_info['soc_model']}), "
                  f"context bucket {npu_info['context']}: {npu_info['context_rule']}"
                  + (f"; from this host: {', '.join(npu_info['from_host'])}" if npu_info["from_host"] else "")
                  + " (not cached)")
        else:
            print(f"profile: {path}" + ("" if path.is_file() else " (not saved)"))
        if args.plot:
            print(f"plot: {args.plot}")
        print_memory_line(memory, sys.stdout)
    sys.stdout.flush()
    return 0


def print_table(model, target_name: str, draft_name: str) -> None:
    """Per-stage read and compute ms, predicted pass ms, draft ms per frontier."""
    import numpy as np

    from ..cost.cost_model import SUMMARY_N, interpolate

    p = model.profile
    cols = (1, 64, 256)
    if p.fixed_shapes:
        print(f"# backend {p.backend}: static shapes, row buckets {','.join(map(str, p.n_grid))} (the pass cost is a "
              f"step function)" + ("; SIMULATED HTP on this host: these timings are not NPU speed"
                                    if p.simulated else ""))
    print(f"# target {target_name}, draft {draft_name}; {len(p.stages)} stages, "
          f"{sum(s.streamed for s in p.stages)} streamed ({p.io_bytes_per_pass / 1e6:,.1f} MB/pass), "
          f"prefetch depth {p.prefetch_depth}; measured {p.created} in {p.measure_s:.1f} s"
          + (f", {p.read_bytes / 1e6:,.0f} MB read from flash" if p.read_bytes else ""))
    print(f"{'stage':<10} {'read MB':>8} {'io ms':>8} " + " ".join(f"{f'C(n={n}) ms':>12}" for n in cols))
    for s in p.stages:
        c = interpolate(p.n_grid, s.compute_s, np.array(cols, dtype=float), p.fixed_shapes, p.pass_spread)
        print(f"{s.name:<10} {s.io_bytes / 1e6:>8.1f} {s.io_s * 1e3:>8.2f} "
              + " ".join(f"{x * 1e3:>12.2f}" for x in c))
    e = interpolate(p.n_grid, p.embed_s, np.array(cols, dtype=float), p.fixed_shapes, p.pass_spread)
    print(f"{'embed':<10} {0:>8.1f} {0:>8.2f} " + " ".join(f"{x * 1e3:>12.2f}" for x in e))
    verify, compute = model.verify_s(max(SUMMARY_N)), model.compute_s(max(SUMMARY_N))
    print("pass (predicted): " + ", ".join(
        f"n={n} {verify[n - 1] * 1e3:,.1f} ms (compute {compute[n - 1] * 1e3:,.1f})" for n in SUMMARY_N))
    if p.fixed_shapes:
        print(step_function_line(model, p.n_grid))
    print(f"flash floor {model.io_floor_s * 1e3:,.1f} ms/pass; I/O share at n=1 {model.io_share(1):.0%}, "
          f"n=64 {model.io_share(64):.0%}"
          + (f" (n > {max(p.n_grid)} extrapolated)" if max(p.n_grid) < max(SUMMARY_N) else ""))
    draft = model.draft_s(max(p.draft_grid))
    print("draft forward: " + ", ".join(f"f={f} {draft[f - 1] * 1e3:.1f} ms" for f in p.draft_grid))
    print(f"iteration overhead {model.iteration_overhead_s * 1e3:.2f} ms")
    print_spread_and_validation(p)


def pruned_summary(pruned) -> dict:
    """Predicted pass seconds with early-exit pruning (a PrunedCostModel)."""
    from ..cost.cost_model import SUMMARY_N
    verify = pruned.verify_s(max(SUMMARY_N))
    return {"after_layer": pruned.after_layer, "survive": pruned.survive,
            "pass_s": {n: float(verify[n - 1]) for n in SUMMARY_N}}


def print_pruned(pruned) -> None:
    """The pass curve when the probe prunes after its layer at its held-out survival."""
    from ..cost.cost_model import SUMMARY_N
    verify = pruned.verify_s(max(SUMMARY_N))
    print(f"pass with probes (pruned after layer {pruned.after_layer}, {pruned.survive:.0%} of draft rows "
          f"surviving): " + ", ".join(f"n={n} {verify[n - 1] * 1e3:,.1f} ms" for n in SUMMARY_N))


def print_spread_and_validation(p) -> None:
    """The measured spread per grid point and what the end-of-measurement check found."""
    if p.pass_spread:
        print("spread (robust SD / median): pass " + ", ".join(
            f"n={n} {s:.1%}" for n, s in zip(p.n_grid, p.pass_spread))
            + "; draft " + ", ".join(f"f={f} {s:.1%}" for f, s in zip(p.draft_grid, p.draft_spread))
            + f"; {p.rejected_runs} outlier run{'' if p.rejected_runs == 1 else 's'} dropped")
    for r in p.validation:
        var = "n" if r["curve"] == "target" else "f"
        verdict = "ok" if r["agreed"] else "DISAGREES"
        redo = f", measured again {r['remeasured']}x ({r['stored_s'] * 1e3:.1f} ms before)" if r["remeasured"] else ""
        print(f"validation {r['curve']} {var}={r['n']}: {verdict}, {r['final_s'] * 1e3:.1f} ms, check "
              f"{r['checks'][-1] * 1e3:.1f} ms (tolerance {r['tolerance']:.0%}){redo}")
