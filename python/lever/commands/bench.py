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
bench_plot (PNG), bench_capped (--memory-cap), bench_options (the options).
"""

from __future__ import annotations

import argparse
import sys

from .bench_modes import BenchMode, parse_mode, parse_modes
from .bench_options import add_arguments
from .bench_report import machine_info

# parse_mode, parse_modes, BenchMode and machine_info are part of this module's API (bench/bench_remote.py)
__all__ = ["add_parser", "add_arguments", "run", "BenchMode", "parse_mode", "parse_modes", "machine_info"]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "bench", help="benchmark decoding modes over a fixed prompt set",
        description="Run ar, chain and tree speculative decoding over the same fixed prompts (one process, "
                    "modes interleaved per prompt); print a table and write JSON and a PNG chart.")
    add_arguments(p)
    p.set_defaults(run=run)


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
