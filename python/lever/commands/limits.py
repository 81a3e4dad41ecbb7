"""The accepted ranges of the `lever` commands' numeric options, defined once.

A value outside its range is refused with one clear line (see arg_types),
never clamped: each bound is far beyond any useful setting and exists so
that a typo cannot make a run take hours or allocate gigabytes.
"""

from __future__ import annotations

# Tokens to generate (per run or per bench prompt). Every supported model's
# context is far smaller; the context check names the real limit.
MAX_NEW_TOKENS = 1 << 20

# Tokens a KV cache may be sized for (--context): 128 Ki, the longest context
# of the supported model families (Qwen2.5 with its long-context scaling); a
# store's own context caps it further. At 2 bytes per element that is about
# 3.8 GB of KV for the 1.5B target, so a typo cannot ask for terabytes.
MAX_CONTEXT_TOKENS = 1 << 17

# Draft trees: nodes per tree (static --tree-budget, mode lever's
# --lever-max-nodes, a bench tree:N / lever:N, profile's --max-n tree tokens
# per pass), depth in levels, children per node, chain length in tokens.
# A 100,000-node tree took 150 s and 7.4 GB for one pass; 1024 nodes is four
# times the largest tree the cost model is measured on (256).
MAX_TREE_NODES = 1024
MAX_TREE_DEPTH = 64
MAX_TREE_TOPK = 64
MAX_DRAFT_LEN = 64

# Read buffers in flight ahead of the computing layer (each holds one layer).
MAX_PREFETCH_DEPTH = 16

# Chunk reads (1 MiB each) the flash reader keeps in flight (--read-queue-depth).
# Phone UFS queues hold 32 commands, NVMe queues far more; 256 MiB in flight is
# beyond any of them.
MAX_READ_QUEUE_DEPTH = 256

# Sizes in bytes (--dram-budget): at least one byte, at most 16 TiB.
MAX_SIZE_BYTES = 1 << 44

# Read-bandwidth cap in bytes/s (--read-limit): 0 (no cap) or from 10 MB/s
# to 1 TB/s. The cap also paces loading the pinned layers, so at the floor a
# 1.1 GB store takes about two minutes to open; 1 byte/s would take decades.
# Phone flash reads 100 MB/s (eMMC) to several GB/s (UFS).
MIN_READ_RATE = 10e6
MAX_READ_RATE = 1e12

# Characters a numeric option's text may have (a 400-digit size is a typo).
MAX_NUMBER_CHARS = 64

# Bytes a prompt (from --prompt-file or stdin) may have: 16 MiB, far beyond
# any supported model's context.
MAX_PROMPT_BYTES = 16 << 20

# Edge-cloud: extra milliseconds charged per target call, and seconds to keep
# retrying an unanswered request (at most a day each).
MAX_CALL_COST_MS = 86_400_000.0
MAX_RETRY_DEADLINE_S = 86_400.0

# Prompts of a bench prompt set to run.
MAX_BENCH_PROMPTS = 10_000

# `lever serve-verifier`: sessions open at once (and session rounds batched in
# one pass), and seconds an unused session stays open (a week).
MAX_SESSIONS = 4096
MAX_IDLE_TTL_S = 7 * 86400.0
