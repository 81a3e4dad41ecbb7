"""`lever bench`'s options, defined once: the command's parser and
bench_capped (which rebuilds a child's command line from them) both take
them from here."""

from __future__ import annotations

from . import arg_types
from .bench_modes import MODE_HELP, TREE_DEPTH, TREE_TOPK
from .bench_setup import FULL, QUICK
from .limits import MAX_BENCH_PROMPTS
from .options import (add_backend_options, add_cache_dir, add_compute_options, add_context, add_draft, add_draft_head,
                      add_dram_budget, add_max_new_tokens, add_no_progress, add_probes, add_reader_options,
                      add_sampling_options, add_target_choice)


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
    add_context(p, offered=False)
    p.add_argument("--no-draft-ahead", action="store_true",
                   help="on a static backend, run the modes as written: without it every mode that drafts with a "
                        "draft model drafts ahead (+ahead) while the target's layers run on the NPU")
