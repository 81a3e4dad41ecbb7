"""Prompt lookup: draft the continuation of earlier occurrences of the newest
n-gram in the text so far (no model).  Strong on code and summaries, where
the output repeats the input; the only drafter for models without a smaller
sibling (SmolLM2-135M)."""

from __future__ import annotations

import numpy as np

from ..sampling import SamplingParams
from ..tree import TokenTree
from .base import TreeShape


class NgramDrafter:
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, branches: int = 4):
        self.max_ngram, self.min_ngram, self.branches = max_ngram, min_ngram, branches
        self.tokens: list[int] = []

    def reset(self, prompt_ids: list[int], capacity: int | None = None) -> None:
        self.tokens = list(prompt_ids)

    def _continuations(self, length: int, limit: int) -> list[list[int]]:
        """Up to `limit` distinct continuations of the longest matching suffix, newest first."""
        seq = np.asarray(self.tokens, dtype=np.int64)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            suffix = seq[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            starts = np.nonzero((windows == suffix).all(axis=1))[0][::-1] + n
            found, seen = [], set()
            for s in starts:
                cont = tuple(seq[s:s + length].tolist())
                if cont and cont not in seen:
                    seen.add(cont)
                    found.append(list(cont))
                    if len(found) == limit:
                        break
            if found:
                return found
        return []

    def draft_tree(self, root: int, shape: TreeShape, params: SamplingParams = SamplingParams(),
                   seed: int | None = None) -> TokenTree:
        """The continuations of earlier occurrences of the newest n-gram, merged
        into a tree (`params` and `seed` are not needed: nothing is sampled)."""
        tree = TokenTree(root)
        for cont in self._continuations(shape.depth, min(self.branches, shape.topk)):
            node = 0
            for tok in cont:
                child = tree.child_with_token(node, tok)
                if child < 0:
                    if len(tree) - 1 >= shape.budget:
                        break
                    child = tree.add(node, tok, 0.0)
                node = child
        return tree

    def draft_chain(self, root: int, k: int, params: SamplingParams,
                    seed: int | None) -> tuple[TokenTree, np.ndarray | None]:
        tree = TokenTree(root)
        conts = self._continuations(k, 1)
        for i, tok in enumerate(conts[0] if conts else []):
            tree.add(i, tok, 0.0)
        return tree, None

    def commit(self, tree: TokenTree, accepted: list[int], next_token: int) -> None:
        self.tokens.extend(tree.token(j) for j in accepted)
        self.tokens.append(next_token)
