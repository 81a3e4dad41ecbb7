"""The shapes of draft trees, written once: a static tree's (`TreeShape`, mode
tree) and mode lever's limits (`LeverLimits`, the gain-cost policy's).  Plain
values, importing nothing of Lever's, so that the run configuration
(lever.config), the drafters and policies (lever.draft) and the command-line
options all take them from here.  Sizes are counted in draft tokens (nodes,
root excluded); depths in tokens past the root."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeShape:
    """A static tree policy: up to `budget` draft nodes (root excluded), grown in
    `depth` draft steps of `width` = ceil(budget / depth) nodes each, chosen by
    draft path probability among the top-`topk` children of the nodes so far.
    No node is deeper than `depth`."""

    budget: int = 32
    topk: int = 4
    depth: int = 8

    def __post_init__(self) -> None:
        if self.budget < 1 or self.topk < 1 or self.depth < 1:
            raise ValueError(f"tree budget, topk and depth must be >= 1, got {self}")

    @property
    def width(self) -> int:
        """Nodes added per draft step."""
        return -(-self.budget // self.depth)


@dataclass(frozen=True)
class LeverLimits:
    """Mode lever's tree limits: `max_nodes` draft nodes per tree at most,
    `max_depth` the deepest draft node, `topk` children the draft offers per
    expanded node.  The defaults are mode lever's everywhere (options, the
    run configuration, the policy)."""

    max_nodes: int = 255
    max_depth: int = 12
    topk: int = 4
