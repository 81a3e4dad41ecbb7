"""The speculative decode loop: draft, verify in one target pass, commit.

State between iterations: the target's KV cache holds every committed token
except the newest one, the *root*.  An iteration drafts a tree under the
root (mode "tree"), a chain (mode "chain") or nothing (mode "ar"), runs the
target once over [root + draft nodes] with the tree mask, applies the exact
acceptance rule, compacts the target cache to root + accepted path, tells the
drafter, and emits the accepted tokens plus the target's own next token.
Mode "lever" sizes each tree by the gain-cost policy
(lever.draft.gain_cost.GainCostPolicy, carried in `SpecConfig.policy`), which
also learns from every verification.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .draft.base import Drafter, TreeShape
from .errors import LeverError
from .autoregressive import GenerationResult, check_context
from .sampling import SamplingParams
from .tree import TokenTree
from .verify.target_pass import TargetVerifier

MODES = ("ar", "chain", "tree", "lever")
RULES = ("exact", "leviathan")


@dataclass(frozen=True)
class SpecConfig:
    """mode: ar | chain | tree | lever; draft_len: chain length k; tree: the static
    tree shape; policy: the GainCostPolicy of mode lever; rule: "exact" (the
    greedy walk, or under sampling the position-keyed draws that reproduce
    plain sampling's text) or "leviathan" (mode chain only: the conventional
    min(1, p/q) rule, exact in distribution but not draw for draw)."""

    mode: str = "tree"
    draft_len: int = 4
    tree: TreeShape = TreeShape()
    policy: object = field(default=None, compare=False)
    rule: str = "exact"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise LeverError(f"unknown mode {self.mode!r} (choose from {', '.join(MODES)})")
        if self.rule not in RULES or (self.rule == "leviathan" and self.mode != "chain"):
            raise LeverError(f"rule {self.rule!r} is not available in mode {self.mode} "
                             f"(rules: exact; leviathan with mode chain)")
        if self.draft_len < 1:
            raise LeverError(f"--draft-len must be >= 1, got {self.draft_len}")
        if self.mode == "lever" and self.policy is None:
            raise LeverError("mode lever needs a gain-cost policy (a device profile and a draft model)")

    @property
    def max_depth(self) -> int:
        if self.mode == "lever":
            return self.policy.max_depth
        return {"ar": 0, "chain": self.draft_len, "tree": self.tree.depth}[self.mode]

    @property
    def max_tree_nodes(self) -> int:
        """Draft nodes per tree at most."""
        if self.mode == "lever":
            return self.policy.max_nodes
        return {"ar": 0, "chain": self.draft_len, "tree": self.tree.budget}[self.mode]


@dataclass
class SpecStats:
    """Per-run counters; times in seconds, bytes in bytes."""

    iterations: int = 0
    draft_nodes: int = 0                  # draft tokens sent to the target
    accepted: int = 0                     # draft tokens the target accepted
    draft_s: float = 0.0
    verify_s: float = 0.0                 # target passes (compute + I/O stall)
    stall_s: float = 0.0                  # part of verify_s spent waiting on flash
    accept_s: float = 0.0                 # acceptance rule + cache compaction
    bytes_read: int = 0
    tree_sizes: list[int] = field(default_factory=list)
    policy: dict | None = None            # mode lever: GainCostPolicy.report()

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target pass (accepted drafts + the target's own token)."""
        return (self.accepted + self.iterations) / self.iterations if self.iterations else 0.0

    def to_json(self, new_tokens: int) -> dict:
        return {
            "iterations": self.iterations, "target_passes": self.iterations,
            "mean_accepted_length": round(self.mean_accepted_length, 3),
            "draft_tokens": self.draft_nodes, "accepted_draft_tokens": self.accepted,
            "acceptance_rate": round(self.accepted / self.draft_nodes, 4) if self.draft_nodes else None,
            "mean_tree_size": round(sum(self.tree_sizes) / len(self.tree_sizes), 2) if self.tree_sizes else 0,
            "bytes_read": self.bytes_read,
            "bytes_read_per_token": self.bytes_read / new_tokens if new_tokens else None,
            "time_split_s": {"draft": round(self.draft_s, 4),
                             "verify_compute": round(self.verify_s - self.stall_s, 4),
                             "io_stall": round(self.stall_s, 4), "accept": round(self.accept_s, 4)},
            **({"lever": self.policy} if self.policy is not None else {}),
        }


def speculative_generate(target, drafter: Drafter | None, prompt_ids: list[int], max_new_tokens: int,
                         params: SamplingParams = SamplingParams(), spec: SpecConfig = SpecConfig(),
                         stop_ids: frozenset[int] = frozenset(),
                         on_token=None) -> tuple[GenerationResult, SpecStats]:
    """Generate with the target's exact output, using `drafter` to propose tokens."""
    check_context(len(prompt_ids), max_new_tokens + spec.max_depth, target.config.max_context)
    verifier = TargetVerifier(target, params, capacity=len(prompt_ids) + max_new_tokens + spec.max_tree_nodes + 2)
    return run_speculative(verifier, drafter, prompt_ids, max_new_tokens, params, spec, stop_ids, on_token)


def run_speculative(verifier, drafter: Drafter | None, prompt_ids: list[int], max_new_tokens: int,
                    params: SamplingParams = SamplingParams(), spec: SpecConfig = SpecConfig(),
                    stop_ids: frozenset[int] = frozenset(),
                    on_token=None) -> tuple[GenerationResult, SpecStats]:
    """The speculative loop over any verifier: a `TargetVerifier` (the target in
    this process) or a `lever.remote.client.RemoteVerifier` (a verifier server).
    `verifier.start(prompt_ids)` prefills; `verifier.verify(tree, draft_probs)`
    returns a `Verdict` and commits it.  A LeverError raised mid-run carries
    what was generated so far in its `partial_result` attribute."""
    if spec.mode != "ar" and drafter is None:
        raise LeverError(f"mode {spec.mode} needs a drafter (--draft)")
    check_context(len(prompt_ids), max_new_tokens + spec.max_depth, verifier.max_context)
    result, stats = GenerationResult(prompt_ids=list(prompt_ids)), SpecStats()
    if max_new_tokens <= 0:
        return result, stats
    first_record = len(spec.policy.record.tree_sizes) if spec.mode == "lever" else 0
    t_start = time.perf_counter()
    try:
        verifier.start(prompt_ids)
        seed = verifier.seed            # the drafter draws sampled chains with the target's noise
        result.seed = None if params.greedy else seed
        if drafter is not None:
            drafter.reset(prompt_ids, capacity=len(prompt_ids) + max_new_tokens + drafter_rows(spec) + 2)
        result.prefill_s = time.perf_counter() - t_start
        t_decode = time.perf_counter()
        root = prompt_ids[-1]
        while True:
            t0 = time.perf_counter()
            draft_probs, grown = None, None
            if spec.mode == "lever":
                grown = spec.policy.draft(drafter, root, params, seed)
                tree = grown.tree
            elif spec.mode == "tree":
                tree = drafter.draft_tree(root, spec.tree, params, seed)
            elif spec.mode == "chain":
                tree, draft_probs = drafter.draft_chain(root, spec.draft_len, params, seed)
                if spec.rule != "leviathan" or params.greedy:
                    draft_probs = None
                elif draft_probs is None:                        # a deterministic draft: q is one-hot
                    draft_probs = one_hot_draft_probs(tree, verifier.vocab_size)
            else:
                tree = TokenTree(root)
            t1 = time.perf_counter()
            verdict = verifier.verify(tree, draft_probs)
            accepted, next_token = verdict.accepted, verdict.next_token
            t3 = time.perf_counter()
            if drafter is not None:
                drafter.commit(tree, accepted, next_token)
            t4 = time.perf_counter()
            stats.iterations += 1
            stats.draft_nodes += len(tree) - 1
            stats.accepted += len(accepted)
            stats.tree_sizes.append(len(tree) - 1)
            stats.draft_s += (t1 - t0) + (t4 - t3)
            stats.verify_s += verdict.verify_s
            stats.stall_s += verdict.stall_s
            stats.bytes_read += verdict.bytes_read
            stats.accept_s += verdict.accept_s
            if grown is not None:
                spec.policy.observe(grown, accepted, verify_s=verdict.verify_s, iteration_s=t4 - t0)
            if any(result.emit(tok, max_new_tokens, stop_ids, on_token)
                   for tok in [tree.token(j) for j in accepted] + [next_token]):
                break
            root = next_token
        result.decode_s = time.perf_counter() - t_decode
    except LeverError as e:
        e.partial_result = result
        raise
    finally:
        if spec.mode == "lever":
            stats.policy = spec.policy.report(since=first_record)
    return result, stats


def drafter_rows(spec: SpecConfig) -> int:
    """Draft KV rows one iteration may add on top of the committed tokens: the
    nodes the drafter forwards (the root and at most max_tree_nodes others;
    mode lever expands only nodes among the first max_nodes of its pool)."""
    return spec.max_tree_nodes + 1


def one_hot_draft_probs(tree: TokenTree, vocab_size: int) -> np.ndarray:
    """q of a chain drafted deterministically: one-hot on each drafted token (float32 [k, vocab])."""
    probs = np.zeros((len(tree) - 1, vocab_size), dtype=np.float32)
    probs[np.arange(len(tree) - 1), tree.tokens()[1:].astype(np.int64)] = 1.0
    return probs
