"""Prompt lookup: draft the continuations of earlier occurrences of the newest
n-gram in the text so far (no model).  Strong on code and summaries, where
the output repeats the input; the only drafter for models without a smaller
sibling (SmolLM2-135M).

The drafter primitive (lever.draft.base.Drafter): the children of a tree
node are the distinct tokens that followed the earlier occurrences of the
longest suffix (max_ngram tokens down to min_ngram) of the text + the node's
path that occurs before, each with log(count / occurrences); rank 0 is the
most frequent, ties broken by the newest occurrence.  So a chain follows the
newest matching occurrence while it keeps matching, and a tree branches where
earlier occurrences went different ways."""

from __future__ import annotations

import numpy as np

from ..sampling import SamplingParams
from ..tree import TokenTree
from .base import NO_TOKEN, Expansion


class NgramDrafter:
    has_probabilities = False           # its log-probs are continuation frequencies, not a model's
    catch_up_tokens = 0                 # it reads the text directly: nothing to catch up on

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.tokens: list[int] = []     # the committed text, root included
        self._text: np.ndarray | None = None        # self.tokens as an int64 array (None: to rebuild)

    def reset(self, prompt_ids: list[int], capacity: int | None = None, pace=None) -> None:
        """Start a sequence (no prefill: `pace` is not needed)."""
        self.tokens = list(prompt_ids)
        self._text = None

    def begin_tree(self) -> None:
        pass

    def expand(self, tree: TokenTree, nodes: list[int], topk: int, params: SamplingParams = SamplingParams(),
               seed: int | None = None, with_probs: bool = False) -> Expansion:
        """Up to `topk` continuations of each node's text (see the module doc);
        nothing is sampled, so `params` and `seed` play no part, and there are
        no distributions (`probs` is None)."""
        if self._text is None:
            self._text = np.asarray(self.tokens, dtype=np.int64)
        tokens = np.full((len(nodes), topk), NO_TOKEN, dtype=np.int32)
        logprobs = np.full((len(nodes), topk), -np.inf, dtype=np.float32)
        for row, node in enumerate(nodes):
            path = [tree.token(i) for i in tree.path(node)[1:]]              # the root is the text's last token
            found = self.continuations(np.concatenate([self._text, np.asarray(path, dtype=np.int64)]))[:topk]
            for rank, (token, logprob) in enumerate(found):
                tokens[row, rank], logprobs[row, rank] = token, logprob
        return Expansion(tokens, logprobs)

    def continuations(self, seq: np.ndarray) -> list[tuple[int, float]]:
        """(token, log frequency) of what followed the earlier occurrences of the
        longest matching suffix of `seq`, most frequent first (ties: newest first)."""
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            starts = np.nonzero((windows == seq[-n:]).all(axis=1))[0]
            if not len(starts):
                continue
            following = seq[starts + n][::-1].tolist()                      # newest occurrence first
            counts: dict[int, int] = {}
            for token in following:
                counts[token] = counts.get(token, 0) + 1                    # dict order: newest first
            ranked = sorted(counts.items(), key=lambda kv: -kv[1])          # stable: ties stay newest first
            return [(token, float(np.log(c / len(following)))) for token, c in ranked]
        return []

    def use_tree(self, tree: TokenTree, drafted_index: np.ndarray) -> None:
        pass

    def commit(self, tree: TokenTree, accepted: list[int], next_token: int) -> None:
        self.tokens.extend(tree.token(j) for j in accepted)
        self.tokens.append(next_token)
        self._text = None
