"""`--memory-limit SIZE`: one memory limit for the whole process, split into parts.

    limit = runtime baseline            (RSS measured when the plan is made:
                                         interpreter, numpy, the native module)
          + draft weights + draft KV    (passed in, bytes)
          + target scratch              (passed in: activations, logits, buffers
                                         the store plan does not count)
          + safety margin               (max(MIN_MARGIN_BYTES, MARGIN_FRACTION * limit)
                                         unless given)
          + store budget                (what is left: the target store's DRAM budget,
                                         for `store.residency.plan_residency`)

The store budget must cover the store's minimum (`store_minimum`): the fixed
costs `plan_residency` charges (globals, the target's KV cache, embedding
rows: `residency.fixed_costs`; a KV cache counts its sliding-window layers
at the rows they hold, `residency.kv_layer_rows`, not at full length) and the ring of read buffers -- so the target
KV cache is counted there and must not be passed again as scratch.  With
`prefetch_depth="auto"` the minimum holds a ring of the least auto depth
(residency.MIN_AUTO_DEPTH slots); the extra slots auto buys come out of the
store budget, only from bytes no further extent can be pinned with, so the
residency plan's `used_bytes` (ring included) never exceeds the store budget. A limit below the sum
raises MemoryLimitError listing every part in MB. Make the plan before loading
any model: the baseline is this process's RSS at that moment.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import MemoryLimitError
from ..gguf.file import GGUFFile
from ..autoregressive import PREFILL_CHUNK
from ..store.residency import (AUTO_DEPTH, MIN_AUTO_DEPTH, fixed_costs, kv_bytes,  # noqa: F401 (kv_bytes: re-exported)
                               parse_prefetch_depth, plan_residency, slot_size)
from ..values import fmt_bytes, parse_size
from . import rss

MIN_MARGIN_BYTES = 32 << 20        # bytes: allocator slack, thread stacks, page tables
MARGIN_FRACTION = 0.05             # of the limit
_MARGIN_RULE = f"max({MIN_MARGIN_BYTES >> 20} MiB, {MARGIN_FRACTION:.0%} of the limit)"


def store_minimum(manifest, dtype_bytes: int = 2, kv_tokens: int = 2048, prefetch_depth: int | str = AUTO_DEPTH,
                  embed_cache_rows: int = 4096, kv_pass_rows: int = PREFILL_CHUNK) -> dict[str, int]:
    """The least DRAM (bytes, by part) `plan_residency` accepts for `manifest`
    with the same arguments: its fixed costs (`residency.fixed_costs`: globals,
    kv_cache, embedding_rows) plus a ring of `prefetch_depth` buffers (MIN_AUTO_DEPTH
    for "auto") of the largest extent (`residency.slot_size`) -- or, when pinning
    everything costs less, every extent ("weights")."""
    depth = parse_prefetch_depth(prefetch_depth)
    parts = dict(fixed_costs(manifest, dtype_bytes, kv_tokens, embed_cache_rows, kv_pass_rows))
    extents = manifest.layers + manifest.head_parts
    ring = (MIN_AUTO_DEPTH if depth == AUTO_DEPTH else depth) * slot_size(extents)
    everything = sum(e.length for e in extents)
    if everything <= ring:
        parts["weights"] = everything
    else:
        parts["ring"] = ring
    return parts


def gguf_weight_bytes(gguf, head_type: str = "stored") -> int:
    """Bytes of every tensor of a GGUF file (a path or a parsed `GGUFFile`), as
    stored (what resident weights occupy); head_type "q4_0": with the output
    head (a tied model's one table) at Q4_0's 18 bytes per 32 weights where
    that is smaller, as lever.model.native_loader loads it."""
    from ..model.native_loader import head_bytes_as_loaded
    g = gguf if isinstance(gguf, GGUFFile) else GGUFFile(gguf)
    head = g.tensors.get("output.weight") or g.tensors["token_embd.weight"]
    return sum(t.nbytes for t in g.tensors.values()) - head.nbytes + head_bytes_as_loaded(head, head_type)


def kv_layout_text(target: str, draft: str = "") -> str:
    """How the plan counts the KV caches' layers, from `residency.kv_note` of
    the target and the draft ('' where every layer keeps every row): e.g.
    'target KV: 3 layers x 32,768 rows + 15 sliding-window layers (window 512) x 1,536 rows'."""
    parts = [f"{who} KV: {note}" for who, note in (("target", target), ("draft", draft)) if note]
    return "; ".join(parts)


def default_margin(limit_bytes: int) -> int:
    """The safety margin for a limit, bytes: max(MIN_MARGIN_BYTES, MARGIN_FRACTION * limit)."""
    return max(MIN_MARGIN_BYTES, int(MARGIN_FRACTION * limit_bytes))


@dataclass
class MemoryPlan:
    """How one process-wide memory limit is spent; every field in bytes."""

    limit_bytes: int
    baseline_bytes: int
    draft_weight_bytes: int
    draft_kv_bytes: int
    target_minimum: dict[str, int]
    target_scratch_bytes: int
    margin_bytes: int
    margin_rule: str = "given"
    kv_tokens: int | None = None       # tokens the KV caches are sized for (named in the error), if known
    kv_layout: str = ""                # how the KV bytes count sliding-window layers ('' : every layer full)

    @classmethod
    def build(cls, limit, draft_weight_bytes: int = 0, draft_kv_bytes: int = 0,
              target_minimum: dict[str, int] | None = None, target_scratch_bytes: int = 0,
              margin_bytes: int | None = None, baseline_bytes: int | None = None,
              kv_tokens: int | None = None, kv_layout: str = "") -> "MemoryPlan":
        """A checked plan. `limit`: bytes or a size text ('1.5GiB', '900MB').
        `target_minimum`: the store's minimum by part (`store_minimum`), or for
        a fully resident target its weights + KV. `baseline_bytes`: default this
        process's RSS now. `kv_tokens`: the tokens the KV caches hold, for the
        error's hint; `kv_layout`: how the KV bytes count sliding-window layers
        (`kv_layout_text`), for the hint and the summary. Raises
        MemoryLimitError when the parts exceed the limit."""
        limit_bytes = parse_size(limit)
        plan = cls(limit_bytes,
                   rss.current_rss() if baseline_bytes is None else int(baseline_bytes),
                   int(draft_weight_bytes), int(draft_kv_bytes), dict(target_minimum or {}),
                   int(target_scratch_bytes),
                   default_margin(limit_bytes) if margin_bytes is None else int(margin_bytes),
                   _MARGIN_RULE if margin_bytes is None else "given",
                   None if kv_tokens is None else int(kv_tokens), kv_layout)
        plan.check()
        return plan

    @property
    def reserved_bytes(self) -> int:
        """Everything but the store: baseline, draft, target scratch and margin."""
        return (self.baseline_bytes + self.draft_weight_bytes + self.draft_kv_bytes
                + self.target_scratch_bytes + self.margin_bytes)

    @property
    def store_budget_bytes(self) -> int:
        """The target store's DRAM budget: the limit less everything reserved."""
        return self.limit_bytes - self.reserved_bytes

    @property
    def minimum_bytes(self) -> int:
        """The smallest limit this plan fits in (margin as planned)."""
        return self.reserved_bytes + sum(self.target_minimum.values())

    def parts(self) -> dict[str, int]:
        """Every planned part, bytes, in the order the limit is spent."""
        out = {"runtime_baseline": self.baseline_bytes, "draft_weights": self.draft_weight_bytes,
               "draft_kv": self.draft_kv_bytes, "target_scratch": self.target_scratch_bytes}
        out.update({f"target_{k}": v for k, v in self.target_minimum.items()})
        out["margin"] = self.margin_bytes
        return out

    def check(self) -> None:
        """MemoryLimitError naming the minimum and each part (MB) if they exceed the limit."""
        if self.limit_bytes >= self.minimum_bytes:
            return
        target = ", ".join(f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in self.target_minimum.items())
        raise MemoryLimitError(
            f"memory limit {fmt_bytes(self.limit_bytes)} is below this run's minimum of "
            f"{fmt_bytes(self.minimum_bytes)}: "
            f"runtime baseline {fmt_bytes(self.baseline_bytes)}, draft weights {fmt_bytes(self.draft_weight_bytes)}, "
            f"draft KV {fmt_bytes(self.draft_kv_bytes)}, target minimum "
            f"{fmt_bytes(sum(self.target_minimum.values()))} ({target or 'nothing'}), "
            f"target scratch {fmt_bytes(self.target_scratch_bytes)}, margin {fmt_bytes(self.margin_bytes)}"
            f"{self.context_hint()}")

    def context_hint(self) -> str:
        """'; ... --context N ...': how to lower the KV part of the minimum (the
        bytes the KV caches reserve now), or '' when this plan holds no KV cache."""
        target_kv = self.target_minimum.get("kv_cache", 0)
        kv = target_kv + self.draft_kv_bytes
        if kv <= 0:
            return ""
        tokens = f" for {self.kv_tokens:,} tokens" if self.kv_tokens else ""
        split = (f" (target {fmt_bytes(target_kv)}, draft {fmt_bytes(self.draft_kv_bytes)})"
                 if target_kv and self.draft_kv_bytes else "")
        layout = f", {self.kv_layout}" if self.kv_layout else ""
        return (f"; the KV caches reserve {fmt_bytes(kv)}{tokens}{split}{layout}: `--context N` (lever generate, "
                f"lever serve) sizes them for N tokens of prompt and output")

    def plan_store(self, manifest, **residency):
        """`plan_residency(manifest, store budget, **residency)`; pass the same
        keyword arguments given to `store_minimum`."""
        return plan_residency(manifest, self.store_budget_bytes, **residency)

    def summary(self) -> dict:
        """The plan as JSON values (bytes)."""
        return {"memory_limit_bytes": self.limit_bytes, "memory_minimum_bytes": self.minimum_bytes,
                "store_budget_bytes": self.store_budget_bytes,
                "headroom_bytes": self.limit_bytes - self.minimum_bytes,
                "planned_bytes": self.parts(), "margin_rule": self.margin_rule,
                **({"kv_layout": self.kv_layout} if self.kv_layout else {})}
