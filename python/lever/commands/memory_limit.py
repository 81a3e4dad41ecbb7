"""--memory-limit / --dram-budget in the commands: one call before anything loads.

`plan_memory(args, ...)` turns the two options into the target's DRAM budget:
with --memory-limit it plans the whole process (lever.memory.run_plan) and
sets `args.dram_budget` to what the target store may use; otherwise
--dram-budget (default 600MB) is the target's budget and nothing else is
bounded.  It returns the plan (None without --memory-limit), which
`lever.memory.run_plan.memory_report` reports next to the run's peak RSS.
"""

from __future__ import annotations

from ..memory.run_plan import memory_report, model_file, plan_run
from .options import DEFAULT_DRAM_BUDGET


def plan_memory(args, *, target_store=None, target_name: str | None = None, draft: str | None = None,
                kv_tokens: int, tree_rows: int, sampling: bool):
    """Set args.dram_budget (bytes) and return the MemoryPlan (or None).

    target_store: the streamed target's store directory, or target_name: an
    in-memory target (model name or GGUF path); draft: the --draft value (a
    model name/path, 'ngram' or None); kv_tokens: KV rows of every sequence
    together; tree_rows: rows of the largest pass; sampling: logits rows are
    kept.  Uses args.memory_limit, args.dram_budget, args.dtype,
    args.prefetch_depth, args.cache_dir and, with a draft, args.draft_head."""
    if args.memory_limit is None:
        if args.dram_budget is None:
            args.dram_budget = DEFAULT_DRAM_BUDGET
        return None
    target_path = None if target_store else model_file(target_name, args.cache_dir)
    plan, budget = plan_run(args.memory_limit, target_store=target_store, target_path=target_path,
                            draft_path=model_file(draft, args.cache_dir), kv_tokens=kv_tokens,
                            tree_rows=tree_rows, sampling=sampling, dtype=args.dtype,
                            prefetch_depth=args.prefetch_depth,
                            draft_head=args.draft_head if draft else "stored")
    args.dram_budget = budget
    return plan


def print_memory_line(plan, file) -> None:
    """One stderr line: planned limit and the peak RSS reached (MB)."""
    rep = memory_report(plan)
    peak = rep["peak_rss_bytes"] / 1e6
    if plan is None:
        print(f"[memory: peak RSS {peak:,.1f} MB]", file=file)
    else:
        print(f"[memory: limit {plan.limit_bytes / 1e6:,.1f} MB, target budget {plan.store_budget_bytes / 1e6:,.1f} MB, "
              f"peak RSS {peak:,.1f} MB{'' if rep['within_limit'] else ' -- OVER THE LIMIT'}]", file=file)
