"""Verifying a draft tree with the target in this process: one target pass
over [root + draft nodes], the exact acceptance rule, cache compaction.

`TargetVerifier` is the scorer of the speculative loop (lever.engine) and,
on the server side of edge-cloud mode, of every remote session
(lever.remote.session).  It owns the target's KV cache for one sequence:
the cache holds every committed token except the newest one, the *root*.

Sampling draws the target's token at each position from (the sequence's
seed, the position) alone (lever.sampling.sample_at), so the text depends
only on the seed and the prompt -- the same here and on a verifier server,
after a server restart, and in plain decoding.  (The Leviathan baseline's
uniforms come from a numpy generator seeded per round from (seed, root position).)
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..autoregressive import PREFILL_CHUNK, PrefillPace, chunk_size, prefill_chunk
from ..errors import LeverError
from ..model.streamed_decoder import StreamedDecoder
from ..sampling import SamplingParams, head_for, resolve_seed
from ..tree import TokenTree
from .rules import verify_chain_leviathan, verify_greedy, verify_position_draws


@dataclass
class Verdict:
    """The outcome of verifying one tree.  Seconds are wall time; bytes are bytes."""

    accepted: list[int]          # accepted tree nodes, root excluded, root to leaf
    next_token: int              # the target's own token after the accepted path
    verify_s: float = 0.0        # the whole verification as the loop saw it (a remote round trip included)
    stall_s: float = 0.0         # part of it spent waiting on flash (a streamed target)
    bytes_read: int = 0          # flash bytes read for it
    accept_s: float = 0.0        # acceptance rule + cache compaction


def round_seed(seed: int, position: int) -> int:
    """The seed of the round whose root sits at `position` (a 63-bit int)."""
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def io_counters(target) -> tuple[float, int]:
    """(stall seconds, flash bytes used) so far, for a flash-streamed target; zeros otherwise.
    Bytes are those the passes used (lever.model.streamed_decoder.StreamStats.bytes_used), not
    those the reader has landed: the ring prefetches the next pass's extents, and reads
    landing between two verify calls would otherwise belong to neither."""
    stats = getattr(target, "stats", None)
    if stats is None or not hasattr(stats, "bytes_used"):
        return 0.0, 0
    return stats.stall_s, stats.bytes_used


def surviving_tree(tree: TokenTree, survivors) -> tuple[TokenTree, np.ndarray | None]:
    """The tree the rule walks when a pass kept only the nodes `survivors` (int64
    ids, increasing, root first, closed under ancestry; None: every node):
    (the surviving subtree, its node -> original id map, or None when nothing
    was pruned).  Out rows come in survivor order, the subtree's node order."""
    if survivors is None or len(survivors) == len(tree):
        return tree, None
    keep = np.zeros(len(tree), dtype=bool)
    keep[np.asarray(survivors, dtype=np.int64)] = True
    sub, old_to_new = tree.subtree_prune(keep)
    if len(sub) != len(survivors):
        raise LeverError(f"pruning kept {len(survivors)} nodes of a tree but not all their ancestors")
    return sub, np.asarray(survivors, dtype=np.int64)


class TargetVerifier:
    """One sequence's target state: `start(prompt_ids)` prefills, then each
    `verify(tree)` scores a tree under the root and commits its outcome.

    params: the sampling settings (temperature 0 = greedy); seed: the base of
    the per-round seeds (params.seed, else a random one); capacity: KV rows
    to allocate (prompt + new tokens + the largest tree + 2).

    pass_hook: None, or an object that watches (and may prune) every tree
    pass: `begin(tree, n_cached)` returns the pass's layer hook
    (`NativeDecoder.forward`'s layer_hook) or None, and `finish(out)` returns
    the int64 ids of the tree nodes that survived the pass (None: all), and
    `verdict(accepted, next_token)` hears the outcome (original node ids).  A
    pruned node counts as rejected: the rule runs on the surviving subtree,
    whose rows carry the full model's outputs, so the result stays exact
    (lever.probe.prune.ProbePruner prunes; lever.probe.traces records)."""

    def __init__(self, target, params: SamplingParams, capacity: int, seed: int | None = None,
                 pass_hook=None):
        self.target, self.params = target, params
        self.pass_hook = pass_hook
        base = seed if seed is not None else params.seed
        self.seed = int(base) if base is not None else resolve_seed(params)
        self.cache = target.new_cache(capacity=capacity)
        self.root: int | None = None
        self.calls = 0               # target passes over trees (prefill excluded)

    def io_busy_s(self) -> float:
        """Cumulative seconds the target's flash reader has had a read in flight
        (`StreamedDecoder.io_busy_s`; 0.0 for a resident target).  Sample it
        around the draft's interval: (busy after - busy before) / draft seconds
        is the share of drafting hidden under the ring's prefetch of the next pass."""
        if isinstance(self.target, StreamedDecoder):
            return self.target.io_busy_s()
        return 0.0

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    @property
    def tree_rows_take_context(self) -> bool:
        """Every row of a tree pass needs context room (a static-shape target)."""
        return bool(getattr(self.target, "tree_rows_take_context", False))

    @property
    def max_context(self) -> int:
        """Tokens a sequence may hold (prompt, new tokens and a tree's depth)."""
        return self.target.config.max_context

    @property
    def position(self) -> int:
        """The root's position: committed tokens before it."""
        return self.cache.length

    def start(self, prompt_ids: list[int]) -> None:
        """Prefill the prompt in one call (see `start_chunks` for a resumable one)."""
        for _ in self.start_chunks(prompt_ids):
            pass

    def start_chunks(self, prompt_ids: list[int], chunk_tokens: "PrefillPace | int" = PREFILL_CHUNK) -> Iterator[int]:
        """Prefill the prompt one forward of at most `chunk_tokens` tokens per
        step (or of the size a `PrefillPace` gives before each step); yields
        the prompt tokens prefilled so far after each step, so a server can
        run other sessions' rounds between the chunks.  The sequence is ready
        (`root` set) once the iterator is exhausted."""
        if not prompt_ids:
            raise LeverError("the prompt is empty (0 tokens)")
        if isinstance(chunk_tokens, int) and chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        self.root = None
        self.cache.truncate(0)
        body = list(prompt_ids[:-1])
        start = 0
        while start < len(body):
            piece = body[start:start + chunk_size(chunk_tokens, start, len(body))]
            prefill_chunk(self.target, piece, start, self.cache, head="argmax")
            start += len(piece)
            yield start
        self.root = int(prompt_ids[-1])

    def verify(self, tree: TokenTree, draft_probs: np.ndarray | None = None) -> Verdict:
        """Score `tree` (node 0 = the root), apply the exact rule and commit.
        Greedy asks the target for its argmax ids only (head="argmax").
        draft_probs: for a chain drawn by sampling, q of each drafted token's
        position (float32 [k, vocab]) -- the conventional Leviathan rule, asked for by
        `SpecConfig(rule="leviathan")`; otherwise the rule is the greedy walk
        or the position-keyed draws, which need no draft distribution."""
        t0 = time.perf_counter()
        p = self.prepare(tree)
        stall0, bytes0 = io_counters(self.target)
        hook = self.pass_hook
        layer_hook = hook.begin(tree, p.n_cached) if hook is not None else None
        hooked = {"layer_hook": layer_hook} if layer_hook is not None else {}   # the native decoder's hook
        out = self.target(p.tokens, p.positions, p.mask, self.cache, head=p.head, **hooked)
        survivors = hook.finish(out) if hook is not None else None
        stall1, bytes1 = io_counters(self.target)
        t1 = time.perf_counter()
        verdict = self.decide(p, out, draft_probs, survivors)
        verdict.verify_s, verdict.stall_s, verdict.bytes_read = t1 - t0, stall1 - stall0, bytes1 - bytes0
        return verdict

    def prepare(self, tree: TokenTree) -> "PassInput":
        """The target pass that scores `tree` (node 0 = the root) after the
        committed tokens: its inputs, for `self.target` or for a batched pass
        over several sequences (lever.remote.batcher.verify_batch).  Nothing
        is changed; LeverError before `start` or for a tree of another root."""
        if self.root is None:
            raise LeverError("TargetVerifier.verify before start")
        if tree.token(0) != self.root:
            raise LeverError(f"the tree's root is token {tree.token(0)}, but the sequence's root is {self.root}")
        n = self.cache.length
        return PassInput(tree, n, tree.tokens().astype(np.int64), tree.positions(n), tree.mask(n),
                         head_for(self.params))

    def decide(self, p: "PassInput", out, draft_probs: np.ndarray | None = None, survivors=None) -> Verdict:
        """After the pass `p` (prepared by `prepare`) ran, with output `out`:
        the exact rule, the commit (cache compaction, the new root) and the
        verdict.  survivors: the tree nodes a pass hook kept (None: all).
        The verdict's verify_s is 0 here (the caller knows the pass's
        seconds); accept_s is this step's."""
        t1 = time.perf_counter()
        tree, n = p.tree, p.n_cached
        hook = self.pass_hook
        scored, old_ids = surviving_tree(tree, survivors)
        if self.params.greedy:
            accepted, next_token = verify_greedy(scored, out)
        elif draft_probs is not None:
            if old_ids is not None:
                raise LeverError("the Leviathan rule cannot verify a pruned chain (run it without probes)")
            rng = np.random.default_rng(round_seed(self.seed, n))
            accepted, next_token = verify_chain_leviathan(tree, out, draft_probs, self.params, rng)
        else:
            accepted, next_token = verify_position_draws(scored, out, self.params, self.seed, n)
        if old_ids is not None:
            accepted = [int(old_ids[j]) for j in accepted]
        if hook is not None:
            hook.verdict(accepted, int(next_token))
        self.cache.compact(tree.compaction_indices(n, accepted))
        self.root = int(next_token)
        self.calls += 1
        return Verdict(accepted, int(next_token), accept_s=time.perf_counter() - t1)


@dataclass
class PassInput:
    """One tree's target pass, as `TargetVerifier.prepare` makes it: the tree, the
    committed rows before it (`n_cached`), its int64 tokens and positions [T],
    its bool mask [T, n_cached + T] and the head to ask for ("argmax" greedy,
    else "logits")."""

    tree: TokenTree
    n_cached: int
    tokens: np.ndarray
    positions: np.ndarray
    mask: np.ndarray
    head: str
