"""Process memory: RSS readings (`rss`), the `--memory-limit` planner (`plan`)
and running a command under a memory cgroup (`cgroup`). No torch."""
