"""The drafter interface and the static tree shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


import numpy as np

from ..sampling import SamplingParams
from ..tree import TokenTree


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


class Drafter(Protocol):
    def reset(self, prompt_ids: list[int], capacity: int | None = None) -> None:
        """Start a new sequence; the prompt's last token is the first root.
        capacity: KV rows a model drafter should allocate up front."""

    def draft_tree(self, root: int, shape: TreeShape, params: SamplingParams = SamplingParams(),
                   seed: int | None = None) -> TokenTree:
        """A tree rooted at `root` (node 0); under sampling a drafter may use the
        target's position-keyed noise (`seed`) to propose what the target will draw."""

    def draft_chain(self, root: int, k: int, params: SamplingParams,
                    seed: int | None) -> tuple[TokenTree, np.ndarray | None]:
        """A chain of `k` draft tokens and, for sampling, the draft distributions
        they were drawn from (float32 [k, vocab]); None when the draft has none.  seed:
        the sequence's sampling seed (position-keyed draws; None when greedy)."""

    def commit(self, tree: TokenTree, accepted: list[int], next_token: int) -> None:
        """The target accepted nodes `accepted` of the last draft and chose `next_token`."""
