"""`lever bench` mode specs: 'ar', 'chain:K', 'tree:N[:TOPK:DEPTH]', 'lever[:N]', each
drafting one optionally with '+ahead' (draft ahead while the target verifies)
and/or '+probes' (early-exit pruning of the target's passes, lever.probe).

A BenchMode is a label and the engine configuration it runs; `parse_modes`
reads --modes (ar is the reference and is added unless asked not to).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LeverError
from .limits import MAX_DRAFT_LEN, MAX_TREE_DEPTH, MAX_TREE_NODES, MAX_TREE_TOPK

TREE_TOPK, TREE_DEPTH = 4, 8
RESIDENT = "resident"
MODE_HELP = "ar | chain:K | tree:N[:TOPK:DEPTH] | lever[:N], drafting ones with an optional +ahead and/or +probes"
AHEAD = "+ahead"
PROBES = "+probes"
LEVER = "lever"


@dataclass(frozen=True)
class BenchMode:
    """One benchmarked decoding mode: its label ('tree:32') and engine configuration."""

    label: str
    spec: object                     # lever.engine.SpecConfig (mode lever: set once the policy is built)
    lever_nodes: int = 0             # mode lever: draft nodes per tree at most
    draft_ahead: bool = False        # the draft extends the tree being verified (SpecConfig.draft_ahead)
    probes: bool = False             # the target's passes are pruned early (SpecConfig.pruner, set once loaded)

    @property
    def base_label(self) -> str:
        """The label of the same mode without probes ('lever' for 'lever+probes')."""
        return self.label.removesuffix(PROBES) if self.probes else self.label

    @property
    def max_draft(self) -> int:
        """Draft tokens per iteration at most (the engine's cache headroom)."""
        return self.lever_nodes if self.lever_nodes else self.spec.max_tree_nodes

    @property
    def uses_draft(self) -> bool:
        """Whether the mode drafts (every mode but ar)."""
        return bool(self.lever_nodes) or self.spec.mode != "ar"


def parse_mode(text: str) -> BenchMode:
    """A mode spec (`parse_base_mode`), then optionally '+ahead' (a drafting mode
    drafting ahead while the target verifies) and '+probes' (early-exit pruning
    of the target's tree passes), in that order."""
    from dataclasses import replace

    base = text.strip().lower()
    probes = base.endswith(PROBES)
    base = base.removesuffix(PROBES)
    ahead = base.endswith(AHEAD)
    m = parse_base_mode(base.removesuffix(AHEAD))
    for on, suffix in ((ahead, AHEAD), (probes, PROBES)):
        if on and not m.uses_draft:
            raise LeverError(f"bad mode spec {text!r}: {suffix} needs a drafting mode (chain, tree or lever)")
    if probes and m.spec is not None and m.spec.rule != "exact":
        raise LeverError(f"bad mode spec {text!r}: {PROBES} needs the exact rule")
    if ahead:
        spec = replace(m.spec, draft_ahead=True) if m.spec is not None else None
        m = BenchMode(m.label + AHEAD, spec, m.lever_nodes, draft_ahead=True)
    if probes:
        m = BenchMode(m.label + PROBES, m.spec, m.lever_nodes, m.draft_ahead, probes=True)
    return m


def parse_base_mode(text: str) -> BenchMode:
    """'ar', 'chain:K', 'tree:N' (node budget N, topk 4, depth 8), 'tree:N:TOPK:DEPTH',
    or 'lever' / 'lever:N' (the gain-cost policy, at most N draft nodes, default 255);
    each number within the limits of lever.commands.limits."""
    from ..shapes import TreeShape
    from ..engine import SpecConfig

    parts = text.strip().lower().split(":")
    bad = LeverError(f"bad mode spec {text!r}: expected {MODE_HELP} with positive integers "
                     f"(e.g. ar, chain:4, tree:32, tree:32:4:8)")
    kind, nums = parts[0], parts[1:]
    try:
        values = [int(v) for v in nums if len(v) <= 16]
    except ValueError:
        raise bad from None
    if len(values) < len(nums) or any(v < 1 for v in values):
        raise bad
    if kind == "ar" and not values:
        return BenchMode("ar", SpecConfig("ar"))
    if kind == LEVER and len(values) <= 1:
        from ..shapes import LeverLimits
        nodes = values[0] if values else LeverLimits.max_nodes
        _check_limits(text, [("draft nodes", nodes, MAX_TREE_NODES)])
        return BenchMode(LEVER if not values else f"{LEVER}:{nodes}", None, lever_nodes=nodes)
    if kind == "chain" and len(values) == 1:
        _check_limits(text, [("chain length", values[0], MAX_DRAFT_LEN)])
        return BenchMode(f"chain:{values[0]}", SpecConfig("chain", draft_len=values[0]))
    if kind == "tree" and len(values) in (1, 3):
        budget, topk, depth = (values + [TREE_TOPK, TREE_DEPTH])[:3]
        _check_limits(text, [("tree nodes", budget, MAX_TREE_NODES), ("topk", topk, MAX_TREE_TOPK),
                             ("depth", depth, MAX_TREE_DEPTH)])
        label = f"tree:{budget}" if (topk, depth) == (TREE_TOPK, TREE_DEPTH) else f"tree:{budget}:{topk}:{depth}"
        return BenchMode(label, SpecConfig("tree", tree=TreeShape(budget, topk, depth)))
    raise bad


def _check_limits(text: str, values: list[tuple[str, int, int]]) -> None:
    """LeverError naming the first (what, value, limit) whose value exceeds its limit."""
    for what, value, limit in values:
        if value > limit:
            raise LeverError(f"bad mode spec {text!r}: {what} at most {limit}, got {value}")


def parse_modes(texts: list[str], add_ar: bool = True) -> tuple[list[BenchMode], bool]:
    """Modes in the order given, duplicates dropped; ar first-class and, with
    `add_ar`, always present (it is the reference). Returns (modes, whether ar was added)."""
    modes, seen = [], set()
    for text in texts:
        for piece in text.replace(",", " ").split():
            m = parse_mode(piece)
            if m.label not in seen:
                seen.add(m.label)
                modes.append(m)
    if not modes:
        raise LeverError(f"--modes is empty (expected {MODE_HELP})")
    added = add_ar and "ar" not in seen
    if added:
        modes.insert(0, parse_mode("ar"))
    return modes, added


def spec_json(m: BenchMode) -> dict:
    """The JSON `spec` object of a mode: its engine mode, chain length or tree shape."""
    s = m.spec
    return {"mode": s.mode, "draft_ahead": s.draft_ahead, "draft_len": s.draft_len if s.mode == "chain" else None,
            "tree": ({"budget": s.tree.budget, "topk": s.tree.topk, "depth": s.tree.depth}
                     if s.mode == "tree" else None)}


def with_probe_twins(modes: list[BenchMode]) -> list[BenchMode]:
    """`modes` with, after each drafting mode without probes, its +probes twin (unless listed)."""
    labels = {m.label for m in modes}
    out = []
    for m in modes:
        out.append(m)
        twin = m.label + PROBES
        if m.uses_draft and not m.probes and twin not in labels and (m.spec is None or m.spec.rule == "exact"):
            out.append(parse_mode(twin))
            labels.add(twin)
    return out
