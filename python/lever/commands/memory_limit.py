"""The one stderr line a command prints about memory: the --memory-limit
plan (lever.runtime.plan_memory makes it) and the peak RSS reached."""

from __future__ import annotations

from ..memory.run_plan import memory_report


def print_memory_line(plan, file) -> None:
    """One stderr line: planned limit and the peak RSS reached (MB)."""
    rep = memory_report(plan)
    peak = rep["peak_rss_bytes"] / 1e6
    if plan is None:
        print(f"[memory: peak RSS {peak:,.1f} MB]", file=file)
    else:
        print(f"[memory: limit {plan.limit_bytes / 1e6:,.1f} MB, target budget {plan.store_budget_bytes / 1e6:,.1f} MB, "
              f"peak RSS {peak:,.1f} MB{'' if rep['within_limit'] else ' -- OVER THE LIMIT'}]", file=file)
