"""The DRAM budget: which extents of a store stay pinned in memory, which are
streamed from flash every pass, and what the fixed costs are.

Fixed costs (bytes): the final norm, the KV cache for `kv_tokens` tokens
(its sliding-window layers at the rows they really hold: `kv_layer_rows`),
a cache of embedding rows, and -- unless everything is pinned -- a ring of
`prefetch_depth` read buffers as large as the largest streamed extent
(`slot_size`: from 2 MiB up, rounded up to whole 2 MiB pages, which the
reader backs with transparent huge pages; lever.store.flash_reader).
Pinned extents are kept in their stored (possibly quantised) form and are
used exactly like streamed ones: in place, by the native decoder (which
multiplies the kernel block types and dense F32/F16/BF16 matrices directly,
so no dequantisation workspace is needed).

Pinning order: the head parts, then decoder layers from the last one down.
Pinning the tail of the pass lets the reader fetch the first streamed layers
of the next pass while the pinned tail computes.

Ring depth (`prefetch_depth`): an integer is taken as given; "auto" (the
default) pins with a ring of MIN_AUTO_DEPTH slots, then spends the budget
left after pinning on more slots:

    depth = MIN_AUTO_DEPTH + leftover // slot_bytes,
            capped at max(MIN_AUTO_DEPTH, streamed extents) and MAX_PREFETCH_DEPTH

A slot beyond the streamed extents would hold a copy of an extent for the
pass after next, which the one pass that follows a draft cannot use.

The leftover is always less than one slot: pinning stops at the first
extent e (in pin order) with base + pinned + e + MIN_AUTO_DEPTH * max(rest)
> budget, and the slot is max(e, rest), so leftover < e <= slot_bytes.  So
with greedy pinning auto's ring is MIN_AUTO_DEPTH slots at every budget that
streams something (the formula states the rule; it never takes a pin away).

Trading a pinned layer for a slot (left out of auto on purpose): the layer's
read is added to every pass (+ its read seconds), its compute moves from the
pinned tail into the streamed part, and the extra slot lets the reader fill
up to one more extent's read of time it would otherwise idle -- the pinned
tail's compute and the draft's time beyond the reads the ring already holds.
The ring simulation (lever.cost.cost_model, `simulate_passes(gap_s=...)`)
gives: while the reader idles for more than a read per pass, each trade saves
about the traded layer's compute seconds; once the ring covers the idle time
(depth x read ~ pinned-tail compute + draft), each further trade costs about
a read.  A trade pays only when flash-bound with idle reader time, gains
little (a layer's compute), loses a whole read when overdone, and needs
measured read and compute seconds that the plan, made before any profile,
does not have.  So the plan alone never makes it; an integer --prefetch-depth
makes it explicitly, and in mode lever `auto` makes it once the profile is
measured (lever.cost.ring_depth: every depth simulated under the same
budget, the fastest taken).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import _native
from ..autoregressive import PREFILL_CHUNK
from ..errors import DramBudgetError
from ..values import fmt_bytes
from .manifest import Extent, StoreManifest

AUTO_DEPTH = "auto"
MIN_AUTO_DEPTH = 2                # slots: one extent computing while the next one is read
MAX_PREFETCH_DEPTH = 16           # slots at most (auto's cap; the CLI's range)


def parse_prefetch_depth(text: str | int) -> int | str:
    """'auto' or an integer 1..MAX_PREFETCH_DEPTH (read buffers in the ring); DramBudgetError otherwise."""
    if isinstance(text, str) and text.strip().lower() == AUTO_DEPTH:
        return AUTO_DEPTH
    try:
        depth = int(str(text).strip(), 10)
    except ValueError:
        depth = None
    if isinstance(text, bool) or depth is None or not 1 <= depth <= MAX_PREFETCH_DEPTH:
        raise DramBudgetError(f"prefetch depth must be 'auto' or an integer from 1 to {MAX_PREFETCH_DEPTH}, "
                              f"got {text!r}")
    return depth


@dataclass
class ResidencyPlan:
    """What stays in DRAM; all sizes in bytes."""

    budget: int
    pinned: list[Extent]
    streamed: list[Extent]            # in pass order
    prefetch_depth: int               # read buffers in the ring (0 when nothing is streamed)
    slot_bytes: int                   # size of each read buffer
    fixed: dict[str, int] = field(default_factory=dict)
    depth_rule: str = ""              # why the ring has prefetch_depth slots
    kv_pass_rows: int = PREFILL_CHUNK  # rows of the largest pass the KV cache was sized for

    @property
    def pinned_bytes(self) -> int:
        return sum(e.length for e in self.pinned)

    @property
    def ring_bytes(self) -> int:
        return self.prefetch_depth * self.slot_bytes

    @property
    def used_bytes(self) -> int:
        return sum(self.fixed.values()) + self.pinned_bytes + self.ring_bytes

    @property
    def streamed_bytes_per_pass(self) -> int:
        return sum(e.length for e in self.streamed)

    @property
    def pinned_layers(self) -> int:
        return sum(1 for e in self.pinned if e.kind == "layer")

    def summary(self) -> dict:
        return {"dram_budget_bytes": self.budget, "dram_planned_bytes": self.used_bytes,
                "pinned_bytes": self.pinned_bytes, "ring_bytes": self.ring_bytes,
                "prefetch_depth": self.prefetch_depth, "prefetch_depth_rule": self.depth_rule,
                "slot_bytes": self.slot_bytes, "unused_bytes": self.budget - self.used_bytes,
                "fixed_bytes": dict(self.fixed), "pinned_layers": self.pinned_layers,
                "pinned_extents": [e.name for e in self.pinned],
                "streamed_extents": len(self.streamed),
                "streamed_bytes_per_pass": self.streamed_bytes_per_pass}


def slot_size(extents: list[Extent]) -> int:
    """Bytes of memory one read buffer for the largest of `extents` takes (see the
    module doc; counted so whether or not the kernel gives huge pages)."""
    return _native.slot_memory_bytes(max(e.length for e in extents))


def pass_order(m: StoreManifest) -> list[Extent]:
    """Extents in the order one forward pass uses them (globals excluded)."""
    return m.layers + m.head_parts


def _pin_order(m: StoreManifest) -> list[Extent]:
    return list(reversed(m.head_parts)) + list(reversed(m.layers))


def kv_layer_windows(config) -> list[int]:
    """The window a KV cache keeps per layer of `config` (ModelConfig), in tokens:
    `sliding_window` on its sliding-window ("l") layers, 0 (every row) on the others."""
    return [config.sliding_window if config.kind(i) == "l" else 0 for i in range(config.n_layers)]


def window_rows(window: int, tokens: int, pass_rows: int = PREFILL_CHUNK) -> int:
    """Rows a KV cache of `tokens` rows allocates for each sliding-window layer of
    `window` tokens W (csrc/model/kv_cache.h) when its passes have at most
    `pass_rows` rows T: it keeps K = W - 1 + max(W, KVCache.MIN_ROLLBACK) rows
    below a pass (what the pass sees, and what a compaction may go back to)
    in K + W + 1 rows to start, grown to K + W + T by a pass that does not
    fit them (T > W + 1, after more than K + W + 1 - T rows); never more than
    `tokens`.  An upper bound, reached by a long enough sequence."""
    t = max(1, pass_rows)
    keep = window - 1 + max(window, _native.KVCache.MIN_ROLLBACK)
    rows = keep + window + (t if keep + t > keep + window + 1 else 1)
    return min(max(1, tokens), rows)


def kv_layer_rows(config, tokens: int, pass_rows: int = PREFILL_CHUNK) -> list[int]:
    """Rows a KV cache of `tokens` rows allocates per layer of `config`: every row
    on a full layer, `window_rows` on a sliding-window layer (the largest window
    of the model: its windowed layers share one allocation size)."""
    windows = kv_layer_windows(config)
    local = window_rows(max(windows), tokens, pass_rows) if any(windows) else 0
    return [local if w else max(1, tokens) for w in windows]


def kv_bytes(config, tokens: int, dtype_bytes: int = 2, pass_rows: int = PREFILL_CHUNK) -> int:
    """Bytes of a KV cache of `tokens` rows for a model of `config` (ModelConfig),
    keys and values of `dtype_bytes` per element, with passes of at most
    `pass_rows` rows (`kv_layer_rows`: sliding-window layers hold their last rows only)."""
    return sum(kv_layer_rows(config, tokens, pass_rows)) * 2 * config.n_kv_heads * config.head_dim * dtype_bytes


def kv_note(config, tokens: int, pass_rows: int = PREFILL_CHUNK) -> str:
    """How `kv_bytes` counts the layers of `config`: '' when every layer keeps
    every row, else e.g. '3 layers x 32,768 rows + 15 sliding-window layers
    (window 512) x 1,536 rows'."""
    rows = kv_layer_rows(config, tokens, pass_rows)
    windows = kv_layer_windows(config)
    n_local = sum(1 for w in windows if w)
    if not n_local:
        return ""
    local = f"{n_local} sliding-window layers (window {max(windows):,}) x {max(r for r, w in zip(rows, windows) if w):,} rows"
    n_full = len(windows) - n_local
    return f"{n_full} layers x {max(1, tokens):,} rows + {local}" if n_full else local


def fixed_costs(m: StoreManifest, dtype_bytes: int, kv_tokens: int, embed_cache_rows: int,
                kv_pass_rows: int = PREFILL_CHUNK) -> dict[str, int]:
    """Bytes that do not depend on what is pinned: the final norm (globals), the KV
    cache for `kv_tokens` tokens of `dtype_bytes` per element and passes of at
    most `kv_pass_rows` rows (`kv_bytes`), and a cache of `embed_cache_rows`
    embedding rows in their stored form.  Every matrix is used in place from
    its buffer: no dequantisation workspace."""
    t = m.embedding_parts[0].tensors[0]
    return {
        "globals": m.globals.length,
        "kv_cache": kv_bytes(m.config, kv_tokens, dtype_bytes, kv_pass_rows),
        "embedding_rows": embed_cache_rows * (t.nbytes // t.shape[0]),
    }


def plan_residency(m: StoreManifest, budget: int, dtype_bytes: int = 2, kv_tokens: int = 2048,
                   prefetch_depth: int | str = AUTO_DEPTH, embed_cache_rows: int = 4096,
                   kv_pass_rows: int = PREFILL_CHUNK) -> ResidencyPlan:
    """Pin as many extents as `budget` bytes allow, then size the ring (module doc);
    raise DramBudgetError below the minimum.  dtype_bytes: bytes per KV cache
    element; prefetch_depth: read buffers in the ring, or "auto"; kv_pass_rows:
    rows of the largest pass (prefill chunk or tree), which sizes the KV
    cache's sliding-window layers (`kv_bytes`)."""
    depth = parse_prefetch_depth(prefetch_depth)
    auto = depth == AUTO_DEPTH
    floor = MIN_AUTO_DEPTH if auto else depth
    fixed = fixed_costs(m, dtype_bytes, kv_tokens, embed_cache_rows, kv_pass_rows)
    base = sum(fixed.values())
    order = _pin_order(m)
    everything = base + sum(e.length for e in order)
    if budget >= everything:
        return ResidencyPlan(budget, order, [], 0, 0, fixed, "nothing streamed: every extent is pinned", kv_pass_rows)
    minimum = base + floor * slot_size(order)
    if budget < minimum:
        parts = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in fixed.items())
        note = kv_note(m.config, kv_tokens, kv_pass_rows)
        raise DramBudgetError(
            f"DRAM budget {fmt_bytes(budget)} is below this store's minimum of {fmt_bytes(minimum)} "
            f"({parts}, {floor} read buffers {fmt_bytes(minimum - base)}; "
            f"KV cache sized for {kv_tokens:,} tokens{f' ({note})' if note else ''}: `--context N` "
            f"(lever generate, lever serve) sizes it for N tokens of prompt and output)")
    pinned: list[Extent] = []
    for i, e in enumerate(order):
        rest = order[i + 1:]
        ring = floor * slot_size(rest) if rest else 0
        if base + sum(p.length for p in pinned) + e.length + ring > budget:
            break
        pinned.append(e)
    pinned_names = {e.name for e in pinned}
    streamed = [e for e in pass_order(m) if e.name not in pinned_names]
    slot_bytes = slot_size(streamed)
    if not auto:
        return ResidencyPlan(budget, pinned, streamed, depth, slot_bytes, fixed, f"given: {depth}", kv_pass_rows)
    leftover = budget - base - sum(e.length for e in pinned) - floor * slot_bytes
    cap = min(max(MIN_AUTO_DEPTH, len(streamed)), MAX_PREFETCH_DEPTH)
    depth = min(floor + leftover // slot_bytes, cap)
    rule = (f"auto: {MIN_AUTO_DEPTH} + {depth - floor} slots of {fmt_bytes(slot_bytes)} from the "
            f"{fmt_bytes(leftover)} left after pinning (cap {cap}: {len(streamed)} streamed extents, "
            f"at most {MAX_PREFETCH_DEPTH})")
    return ResidencyPlan(budget, pinned, streamed, depth, slot_bytes, fixed, rule, kv_pass_rows)
