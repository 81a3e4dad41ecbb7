"""`lever bench`: every decoding mode over the same fixed prompts, in one process.

The target (a flash store streamed under a DRAM budget, or an in-memory
model) and the drafter are loaded once.  For each prompt every mode runs in
turn (ar, chain:K, tree:N, ... and optionally the memory-resident target), so
that machine noise spreads evenly over the modes.  Per mode it reports
decode tokens/s, the ratio to ar, the mean accepted length (tokens emitted
per target pass), bytes read from flash per token, the time split (draft /
verify compute / I/O stall / accept) and the mean draft tree size; at
temperature 0 it checks that every mode produced exactly ar's tokens.
Output: a table on stdout, a JSON file and a PNG bar chart.

With --memory-cap SIZE each mode runs instead in its own child process
inside a memory cgroup of SIZE (`bench_capped`).

With --backend cpu-static|qnn the target's decoder layers run on static-shape
buckets (lever.npu; commands.static_backend): every mode that drafts with a
draft model drafts ahead (+ahead) unless --no-draft-ahead, and a `# backend`
line and per-mode `overlap` lines report bucket runs, split passes, padded
rows and how much drafting ran beside the target's passes.

The parts: bench_modes (mode specs), bench_setup (options, memory plan,
loading, warm-up), bench_runs (the timed runs, the check against ar),
bench_aggregate (per-mode totals), bench_report (printing, JSON),
bench_plot (PNG), bench_capped (--memory-cap).
"""

from __future__ import annotations

import argparse
import sys

from . import arg_types
from .bench_modes import MODE_HELP, TREE_DEPTH, TREE_TOPK, BenchMode, parse_mode, parse_modes
from .bench_report import machine_info
from .bench_setup import FULL, QUICK
from .limits import MAX_BENCH_PROMPTS
from .options import (add_backend_options, add_cache_dir, add_compute_options, add_draft, add_draft_head,
                      add_dram_budget, add_max_new_tokens, add_no_progress, add_probes, add_reader_options,
                      add_sampling_options, add_target_choice)

# parse_mode, parse_modes, BenchMode and machine_info are part of this module's API (bench/bench_remote.py)
__all__ = ["add_parser", "add_arguments", "run", "BenchMode", "parse_mode", "parse_modes", "machine_info"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark decoding modes over a fixed prompt set",
        description="Run ar, chain and tree speculative decoding over the same fixed prompts (one process, "
                    "modes interleaved per prompt); print a table and write JSON and a PNG chart.")
    add_arguments(p)
    p.set_defaults(run=run)


def add_arguments(p) -> None:
    """Every `lever bench` option (also read back by bench_capped to build a child's command line)."""
    add_target_choice(p)
    add_draft(p, default="ngram", note="default ngram")
    add_draft_head(p)
    add_dram_budget(p)
    p.add_argument("--memory-cap", type=arg_types.size, default=None, metavar="SIZE",
                   help="run each mode in its own process inside a memory cgroup of SIZE (RAM + page cache, "
                        "no swap), as a phone caps an app, each under --memory-limit SIZE unless --memory-limit "
                        "or --dram-budget is given; reports each mode's peak, major faults and any OOM kill "
                        "(needs root and a memory cgroup controller)")
    p.add_argument("--no-ar-reference", action="store_true",
                   help="do not add ar as the reference when --modes lacks it (no check against ar, no ratio); "
                        "what --memory-cap gives each non-ar child")
    p.add_argument("--modes", nargs="+", default=None, metavar="MODE",
                   help=f"modes to compare, each {MODE_HELP}; tree:N = node budget N, topk {TREE_TOPK}, "
                        f"depth {TREE_DEPTH}; lever = the gain-cost policy (default: {' '.join(FULL['modes'])}, "
                        f"plus lever with a draft model; ar is always included)")
    add_probes(p, default="off",
               help="on: every drafting mode also runs as its +probes twin (early-exit pruning with the "
                    "probe of `lever probe train`), side by side; auto: so when the target's probe was found "
                    "worth running; off: modes run as written (default)")
    p.add_argument("--prompts", type=arg_types.integer(1, MAX_BENCH_PROMPTS), default=None, metavar="N",
                   help=f"first N prompts of the set (default {FULL['prompts']})")
    p.add_argument("--prompt-set", type=arg_types.name, default="v1", metavar="VERSION",
                   help="prompt set version (default v1)")
    p.add_argument("--categories", type=arg_types.name, nargs="+", default=None, metavar="CAT",
                   help="only prompts of these categories (code, math, prose)")
    add_max_new_tokens(p, default=None, old="--new-tokens",
                       help=f"tokens generated per prompt at most (exactly, with --ignore-eos) "
                            f"(default {FULL['new_tokens']})")
    add_sampling_options(p, top=False, seed_default=0)    # temperature 0: modes are checked against ar
    add_compute_options(p)
    add_reader_options(p)
    p.add_argument("--drop-caches", action="store_true",
                   help="drop the OS page cache once before the first timed run (needs root; reported)")
    p.add_argument("--resident", action="store_true",
                   help="also measure the memory-resident target in ar mode (the store fully loaded), "
                        "the reference for the flash gap")
    p.add_argument("--quick", action="store_true",
                   help=f"a smoke run: {QUICK['prompts']} prompts, {QUICK['new_tokens']} tokens, modes "
                        f"{' '.join(QUICK['modes'])} (explicit options still win)")
    p.add_argument("--out", type=arg_types.directory, default=None, metavar="DIR",
                   help="where to write NAME.json and NAME.png (default bench/results in a Lever checkout, "
                        "else ./lever-bench-results)")
    p.add_argument("--name", type=arg_types.file_stem, default="bench",
                   help="file name stem of the outputs (default bench)")
    add_cache_dir(p)
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly --max-new-tokens tokens per prompt (do not stop at end-of-sequence)")
    add_no_progress(p)
    p.add_argument("--no-plot", action="store_true",
                   help="write the JSON only, no PNG (the children of --memory-cap: importing matplotlib "
                        "would add to the measured process)")
    add_backend_options(p)
    p.add_argument("--no-draft-ahead", action="store_true",
                   help="on a static backend, run the modes as written: without it every mode that drafts with a "
                        "draft model drafts ahead (+ahead) while the target's layers run on the NPU")


def run(args: argparse.Namespace) -> int:
    if args.memory_cap is not None:
        from .bench_capped import run_capped_bench
        return run_capped_bench(args)
    cleanup: list = []
    try:
        return _run(args, cleanup)
    finally:
        for close in cleanup:
            close()


def _run(args: argparse.Namespace, cleanup: list) -> int:
    """Set up, run every mode on every prompt, check against ar, report."""
    from ..mode_lever import save_calibration
    from .bench_aggregate import summarize
    from .bench_plot import plot
    from .bench_report import (io_share_label, print_ahead, print_backend, print_checks, print_header, print_lever,
                               print_probes, print_table, result_document, write_outputs)
    from .bench_runs import check_against_ar, mode_runs, timed_runs
    from .bench_setup import load_draft, load_target, plan_bench, warm_up
    from .generate import kernel_info
    from .memory_limit import print_memory_line

    b = plan_bench(args)
    load_target(args, b, cleanup)
    load_draft(args, b)
    warm_up(args, b)
    kernels = kernel_info(args.kernels, b.target, b.drafter)
    print_header(args, b, kernels)
    runs = mode_runs(b)
    before = b.layers.report() if b.layers is not None else None
    rows, raw, bench_s, memory = timed_runs(b, runs, progress=not args.no_progress)
    checks = check_against_ar(b, runs, raw, rows)
    aggregates, resident_agg = summarize(b, runs, raw, checks, memory, resident_asked=args.resident)
    print_table(aggregates, resident_agg, b.streamed)
    print_lever(aggregates)
    print_ahead(aggregates)
    print_probes(aggregates, io_share_label(b))
    backend = print_backend(args, b, aggregates, rows, before)
    for pol in b.policies:
        save_calibration(pol)
    print_checks(b.params, checks)
    result = result_document(args, b, kernels, aggregates, resident_agg, rows, bench_s)
    result["backend"] = backend
    result["config"].update(backend=args.backend, buckets=args.buckets, contexts=args.contexts, soc=args.soc,
                            npu_profile=next((pol.npu_profile for pol in b.policies if pol.npu_profile), None))
    write_outputs(result, b.out_dir, args.name, None if args.no_plot else plot)
    print_memory_line(b.memory, sys.stdout)
    return 0
