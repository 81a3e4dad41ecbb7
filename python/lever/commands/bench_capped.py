"""`lever bench --memory-cap SIZE`: every mode in its own process, capped as a phone caps an app.

Each mode runs as a child `lever bench` (the same options, `--modes MODE`,
`--memory-limit SIZE` unless --memory-limit or --dram-budget is given, and
`--no-ar-reference` for the modes other than ar) inside a fresh memory cgroup
of SIZE -- RAM and page cache, no swap -- after the page cache is dropped
(`lever.memory.cgroup.run_capped`). The parent loads no model: it reads each
child's JSON, checks every mode's tokens against the ar child's (greedy, or
sampled with one seed: draws are keyed by position, so they must be equal),
and reports per mode tokens/s, the ratio to ar, the accepted length, the
cgroup's peak memory, major faults, whether the OOM killer struck, and the
mismatches. A child that is OOM-killed or fails is a row saying so (with its
last stderr line); the command then exits non-zero after writing NAME.json
and NAME.png. Sizes in bytes (MB = 10^6 in the table), times in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from ..errors import LeverError
from .bench_modes import BenchMode, parse_modes, with_probe_twins
from .bench_options import add_arguments
from .bench_setup import check_options, counts, default_out_dir, mode_texts

CHILD_TIMEOUT_S = 3 * 3600           # seconds one mode's child may run
# options the parent sets per child, never copied from its own command line
PER_CHILD = {"memory_cap", "modes", "out", "name", "no_progress", "no_ar_reference", "run", "command", "probes"}


def run_capped_bench(args: argparse.Namespace) -> int:
    """Run every mode in its own capped child; print the table, write NAME.json
    and NAME.png; LeverError (exit 2) when a child was OOM-killed or failed."""
    from ..memory.cgroup import find_controller
    from .bench_plot import plot_capped
    from .bench_report import write_outputs

    modes = capped_modes(args)
    ctl = find_controller()                           # no root / no controller: a clear error, nothing run
    cap = args.memory_cap
    limit = describe_limit(child_limit(args))
    print(f"# lever bench --memory-cap {cap / 1e6:,.0f} MB: each mode in its own process in a cgroup v{ctl.version} "
          f"memory cgroup ({ctl.parent}) capped at {cap / 1e6:,.1f} MB (RAM + page cache, no swap); page cache "
          f"dropped before each mode; children run with {limit}; modes: {' '.join(m.label for m in modes)}",
          flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lever-bench-cap-") as tmp:
        results = [run_child(args, m, Path(tmp)) for m in modes]
    compare_to_ar(results)
    print_capped(results)
    doc = capped_document(args, ctl, modes, limit, results, time.perf_counter() - t0)
    write_outputs(doc, Path(args.out) if args.out else default_out_dir(), args.name, plot_capped)
    failed = [r for r in results if not r["ok"]]
    if failed:
        raise LeverError(f"{len(failed)} of {len(results)} modes failed under the {cap / 1e6:,.1f} MB memory cap: "
                         + ", ".join(f"{r['mode']} ({r['error']})" for r in failed)
                         + "; see the table above")
    return 0


def capped_document(args, ctl, modes: list[BenchMode], limit: str, results: list[dict], wall_s: float) -> dict:
    """NAME.json of a capped bench: the cap (bytes), the cgroup, the options and every mode's result."""
    from ..api import DEFAULT_MODEL
    from .bench_report import machine_info

    n_prompts, new_tokens = counts(args)
    return {"benchmark": "lever bench --memory-cap", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "cap_bytes": args.memory_cap, "cgroup_version": ctl.version, "cgroup_parent": str(ctl.parent),
            "page_cache": "dropped before each mode", "child_memory_option": limit,
            "config": {"target": args.target_store or args.model or DEFAULT_MODEL, "draft": args.draft,
                       "modes": [m.label for m in modes], "prompts": n_prompts, "new_tokens": new_tokens,
                       "temperature": args.temperature, "seed": args.seed, "quick": args.quick},
            "machine": machine_info(), "wall_s": round(wall_s, 3), "results": results}


def capped_modes(args) -> list[BenchMode]:
    """The modes to run, ar always among them (the reference), and the options
    checked before any child starts."""
    if args.resident:
        raise LeverError("--resident cannot be combined with --memory-cap: the resident reference holds the "
                         "whole store in DRAM; run it without a cap")
    if args.memory_limit is not None and args.memory_limit > args.memory_cap:
        raise LeverError(f"--memory-limit {args.memory_limit / 1e6:,.1f} MB is above --memory-cap "
                         f"{args.memory_cap / 1e6:,.1f} MB: each child would plan for more than its cgroup allows")
    if args.probes == "auto":
        raise LeverError("--probes auto cannot be combined with --memory-cap (each mode runs in a child of its "
                         "own): use --probes on, or name the +probes modes")
    from .bench_setup import with_static_defaults
    from .static_backend import check_backend_args

    check_backend_args(args, kernels=args.kernels, probes=args.probes)
    modes, _ = parse_modes(mode_texts(args))
    modes, _ = with_static_defaults(args, modes)     # +ahead on a static backend, labelled as the children run them
    if args.probes == "on":             # each +probes twin runs in a child of its own
        modes = with_probe_twins(modes)
    check_options(args, modes)
    return modes


def child_limit(args) -> list[str]:
    """The memory option each child runs with: the one given, else --memory-limit CAP (bytes)."""
    if args.dram_budget is not None:
        return ["--dram-budget", str(args.dram_budget)]
    return ["--memory-limit", str(args.memory_limit if args.memory_limit is not None else args.memory_cap)]


def describe_limit(option: list[str]) -> str:
    """'--memory-limit 600.0 MB' for ['--memory-limit', '600000000']."""
    return f"{option[0]} {int(option[1]) / 1e6:,.1f} MB"


def child_command(args, mode: BenchMode, out_dir: Path) -> list[str]:
    """argv of the child that runs `mode`: this command's options (those that
    differ from the defaults) less the per-child ones, then the child's own."""
    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    defaults = vars(parser.parse_args([]))
    argv = [sys.executable, "-m", "lever.cli", "bench"]
    for action in parser._actions:
        dest = action.dest
        value = getattr(args, dest)
        if (dest in PER_CHILD or not action.option_strings or value == defaults.get(dest)
                or action.help == argparse.SUPPRESS):          # a hidden alias: its option passes it on
            continue
        flag = action.option_strings[0]
        if action.nargs == 0:                          # a flag (store_true)
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    argv += child_limit(args)
    argv += ["--modes", mode.label, "--out", str(out_dir), "--name", child_stem(mode), "--no-progress", "--no-plot"]
    return argv + ([] if mode.label == "ar" else ["--no-ar-reference"])


def child_stem(mode: BenchMode) -> str:
    """The child's output file stem: the mode label with ':' as '_'."""
    return mode.label.replace(":", "_")


def run_child(args, mode: BenchMode, out_dir: Path) -> dict:
    """Run one mode's child under the cap; its result row (see `result_row`)."""
    from ..memory.cgroup import run_capped

    if not args.no_progress:
        print(f"lever bench: {mode.label} under the cap ...", file=sys.stderr, flush=True)
    cmd = child_command(args, mode, out_dir)
    run = run_capped(cmd, args.memory_cap, drop_caches=True, timeout_s=CHILD_TIMEOUT_S)
    path = out_dir / f"{child_stem(mode)}.json"
    child = json.loads(path.read_text()) if run.rc == 0 and path.is_file() else None
    return result_row(mode.label, run, child)


def last_line(text: str) -> str:
    """The last non-empty line of a child's output ('' if none)."""
    lines = [x.strip() for x in text.splitlines() if x.strip()]
    return lines[-1] if lines else ""


def failure(run, child) -> str | None:
    """What went wrong with a child, in a few words (None when it succeeded)."""
    if run.oom_killed:
        return "OOM-killed" + (f" by signal {-run.rc}" if run.rc < 0 else f", exit {run.rc}")
    if run.timed_out:
        return f"timed out after {CHILD_TIMEOUT_S} s"
    if run.rc < 0:
        return f"killed by signal {-run.rc}"
    if run.rc != 0:
        return f"exit {run.rc}"
    if child is None:
        return "no JSON written"
    return None


def result_row(label: str, run, child: dict | None) -> dict:
    """One mode's JSON result: success, the cgroup's figures (bytes, seconds),
    and from the child's JSON its aggregate, memory plan/report, DRAM budget
    and the tokens of each prompt."""
    error = failure(run, child)
    agg = child["modes"][label] if child else None
    return {
        "mode": label, "ok": error is None, "error": error,
        "tokens_per_s": agg["tokens_per_s"] if agg else None,
        "mean_accepted_length": agg["mean_accepted_length"] if agg else None,
        "ratio_vs_ar": None, "mismatches": None,
        "cgroup": {"rc": run.rc, "oom_killed": run.oom_killed, "peak_bytes": run.peak_bytes,
                   "major_faults": run.major_faults, "wall_s": round(run.wall_s, 3), "timed_out": run.timed_out,
                   "limit_bytes": run.limit_bytes, "version": run.cgroup_version,
                   "stderr_last_line": last_line(run.stderr_tail)},
        "dram_budget_bytes": child["config"]["dram_budget_bytes"] if child else None,
        "memory": child["memory"] if child else None,
        "aggregate": agg,
        "token_ids": ({r["prompt_id"]: r["token_ids"] for r in child["runs"] if r["mode"] == label}
                      if child else None),
    }


def _last_stderr(line: str) -> str:
    return f"; last stderr line: {line}" if line else ""


def compare_to_ar(results: list[dict]) -> None:
    """Set each row's ratio_vs_ar and mismatches (prompts whose tokens differ
    from the ar child's); both stay None when ar or the mode failed."""
    ar = next(r for r in results if r["mode"] == "ar")
    if not ar["ok"]:
        return
    for r in results:
        if not r["ok"]:
            continue
        r["ratio_vs_ar"] = round(r["tokens_per_s"] / ar["tokens_per_s"], 4) if ar["tokens_per_s"] else None
        r["mismatches"] = sum(r["token_ids"].get(pid) != ids for pid, ids in ar["token_ids"].items())


def print_capped(results: list[dict]) -> None:
    """The table: one row per mode; a failed mode's row ends with what went wrong."""
    head = (f"{'mode':<14}{'tok/s':>9}{'vs ar':>8}{'acc.len':>9}{'peak MB':>10}{'maj.faults':>12}{'OOM kill':>10}"
            f"  mismatches")
    print(head)
    print("-" * len(head))
    for r in results:
        cg = r["cgroup"]
        tps = f"{r['tokens_per_s']:9.2f}" if r["ok"] else f"{'-':>9}"
        ratio = f"{r['ratio_vs_ar']:7.2f}x" if r["ratio_vs_ar"] is not None else f"{'-':>8}"
        acc = f"{r['mean_accepted_length']:9.2f}" if r["ok"] else f"{'-':>9}"
        mism = ("(reference)" if r["mode"] == "ar" and r["ok"] else
                "-" if r["mismatches"] is None else str(r["mismatches"]))
        print(f"{r['mode']:<14}{tps}{ratio}{acc}{cg['peak_bytes'] / 1e6:10.1f}{cg['major_faults']:12d}"
              f"{'yes' if cg['oom_killed'] else 'no':>10}  {mism}" + ("" if r["ok"] else f"  FAILED: {r['error']}"
                                                                 + _last_stderr(cg["stderr_last_line"])))
    bad = [r["mode"] for r in results if r["mismatches"]]
    if bad:
        print(f"# WARNING: tokens differ from ar's in {', '.join(bad)}", flush=True)
    sys.stdout.flush()
