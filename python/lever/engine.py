"""The speculative decode loop: grow a draft tree, verify it in one target pass, commit.

State between iterations: the target's KV cache holds every committed token
except the newest one, the *root*.  An iteration has the tree policy grow a
tree under the root with the drafter (`policy.grow`, lever.draft.base), runs
the target once over [root + draft nodes] with the tree mask, applies the
exact acceptance rule, compacts the target cache to root + accepted path,
tells the drafter (`commit`) and the policy (`observe`), and emits the
accepted tokens plus the target's own next token.  The policy is told the
room left (`max_new_tokens` minus the tokens emitted, minus the target's
own token): it grows no node deeper, since no deeper one could be emitted.

The mode names the policy (`SpecConfig.tree_policy`, from the mode registry
lever.modes): "ar" no draft, "chain"
a chain, "tree" a static best-first tree (lever.draft.policies), "lever" the
gain-cost policy carried in `SpecConfig.policy`
(lever.draft.gain_cost.GainCostPolicy), which sizes each tree by expected
tokens per second and learns from every verification.

`SpecConfig.draft_ahead` runs each verification in a worker thread while a
draft model continues its own path where it leaves the tree
(lever.draft.ahead); the next tree reuses those draft rows when the target
accepts that path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .draft.ahead import MAX_FORWARDS, WIDTH, AheadStats, DraftAhead
from .draft.base import Drafter, TreePolicy
from .errors import LeverError
from .modes import MODES
from .autoregressive import GenerationResult, check_context, kv_tokens
from .sampling import SamplingParams
from .shapes import TreeShape
from .verify.target_pass import TargetVerifier

RULES = ("exact", "leviathan")


@dataclass(frozen=True)
class SpecConfig:
    """mode: ar | chain | tree | lever; draft_len: chain length k; tree: the static
    tree shape; policy: the GainCostPolicy of mode lever; rule: "exact" (the
    greedy walk, or under sampling the position-keyed draws that reproduce
    plain sampling's text) or "leviathan" (mode chain only: the conventional
    min(1, p/q) rule, exact in distribution but not draw for draw).
    draft_ahead: while the target verifies a tree, let a draft model draft
    ahead along its own path past the tree (lever.draft.ahead; worth it when a
    pass stalls on flash or on the network; prompt lookup never drafts ahead).
    pruner: None, or the early-exit pass hook of the target's passes
    (lever.probe.prune.ProbePruner; a target in this process only)."""

    mode: str = "tree"
    draft_len: int = 4
    tree: TreeShape = TreeShape()
    policy: object = field(default=None, compare=False)
    rule: str = "exact"
    draft_ahead: bool = False
    pruner: object = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise LeverError(f"unknown mode {self.mode!r} (choose from {', '.join(MODES)})")
        if self.rule not in RULES or (self.rule == "leviathan" and self.mode != "chain"):
            raise LeverError(f"rule {self.rule!r} is not available in mode {self.mode} "
                             f"(rules: exact; leviathan with mode chain)")
        if self.pruner is not None and self.rule == "leviathan":
            raise LeverError("early-exit probes need the exact rule (the Leviathan rule cannot verify a pruned chain)")
        if self.draft_len < 1:
            raise LeverError(f"--draft-len must be >= 1, got {self.draft_len}")
        if self.mode == "lever" and self.policy is None:
            raise LeverError("mode lever needs a gain-cost policy (a device profile and a draft model)")

    def tree_policy(self, vocab_size: int = 0) -> TreePolicy:
        """The policy that grows each iteration's tree in this mode. vocab_size: the
        target's vocabulary (the one-hot q of the Leviathan rule over a chain
        from a drafter without distributions)."""
        return MODES[self.mode].policy(self, vocab_size)

    @property
    def max_depth(self) -> int:
        """The deepest draft node (tokens past the root)."""
        return self.tree_policy().max_depth

    @property
    def max_tree_nodes(self) -> int:
        """Draft nodes per tree at most."""
        return self.tree_policy().max_nodes


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
    draft_io_s: float | None = 0.0        # seconds of drafting during which the flash reader was busy
                                          # (the next pass's reads hidden under the draft); None: unknown
    ahead: AheadStats | None = None       # drafting ahead during verification (None: off); draft_s
                                          # excludes it (it runs beside verify_s)
    iteration_s: float = 0.0              # wall seconds of the iterations (grow + verify + commit), the
                                          # time draft_s, verify_s and accept_s (and drafting ahead) share
    tree_sizes: list[int] = field(default_factory=list)
    policy: dict | None = None            # the tree policy's report() (mode lever: GainCostPolicy's)
    probes: object = None                 # early-exit pruning over this run (lever.probe.prune.PruneStats;
                                          # None: no pruner)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target pass (accepted drafts + the target's own token)."""
        return (self.accepted + self.iterations) / self.iterations if self.iterations else 0.0

    @property
    def draft_hidden_share(self) -> float | None:
        """Share of the drafting time during which the flash reader was streaming
        the next pass (0 when nothing streams; None when the verifier cannot tell)."""
        if self.draft_io_s is None:
            return None
        return round(min(1.0, self.draft_io_s / self.draft_s), 4) if self.draft_s > 0 else 0.0

    def overlap(self) -> dict:
        """Draft and target side by side, measured structurally: see `overlap_json`."""
        return overlap_json(self.iteration_s, self.draft_s, self.ahead.drafting_s if self.ahead else 0.0,
                            self.verify_s, self.accept_s)

    def to_json(self, new_tokens: int) -> dict:
        return {
            "iterations": self.iterations, "target_passes": self.iterations,
            "mean_accepted_length": round(self.mean_accepted_length, 3),
            "draft_tokens": self.draft_nodes, "accepted_draft_tokens": self.accepted,
            "acceptance_rate": round(self.accepted / self.draft_nodes, 4) if self.draft_nodes else None,
            "mean_tree_size": round(sum(self.tree_sizes) / len(self.tree_sizes), 2) if self.tree_sizes else 0,
            "bytes_read": self.bytes_read,
            "bytes_read_per_token": self.bytes_read / new_tokens if new_tokens else None,
            "draft_hidden_under_io": self.draft_hidden_share,
            "time_split_s": {"draft": round(self.draft_s, 4),
                             "verify_compute": round(self.verify_s - self.stall_s, 4),
                             "io_stall": round(self.stall_s, 4), "accept": round(self.accept_s, 4)},
            **({"draft_ahead": self.ahead.to_json()} if self.ahead is not None else {}),
            "overlap": self.overlap(),
            **({"lever": self.policy} if self.policy is not None else {}),
            **({"probes": self.probes.to_json()} if self.probes is not None else {}),
        }


def overlap_json(iteration_s: float, draft_s: float, ahead_s: float, verify_s: float, accept_s: float) -> dict:
    """How much of the drafting ran beside the target's passes (seconds, summed
    over iterations): the iterations' wall seconds against the serial sum of
    their parts -- drafting (`draft_s`, the tree's growth and commit, plus
    `ahead_s`, drafting ahead while the target verifies), the target's passes
    (`verify_s`) and acceptance (`accept_s`).  hidden_s = serial - wall (at
    least 0) ran concurrently; share = hidden_s over the drafting seconds (1:
    all drafting hidden under the passes); ratio = serial / wall (1: nothing
    overlapped).  Without drafting ahead nothing runs side by side, so
    hidden_s is about 0."""
    drafting = draft_s + ahead_s
    serial = drafting + verify_s + accept_s
    hidden = max(0.0, serial - iteration_s)
    return {"iteration_s": round(iteration_s, 4), "draft_s": round(drafting, 4), "verify_s": round(verify_s, 4),
            "accept_s": round(accept_s, 4), "serial_s": round(serial, 4), "hidden_s": round(hidden, 4),
            "share": round(min(1.0, hidden / drafting), 4) if drafting > 0 else 0.0,
            "ratio": round(serial / iteration_s, 4) if iteration_s > 0 else None}


def tree_room(model, spec: SpecConfig) -> tuple[int, str]:
    """(context tokens a tree needs beyond the committed ones, what they are):
    its depth, or its rows on a static-shape target (`tree_rows_take_context`,
    lever.npu: a split tree's later chunks see the earlier rows as past)."""
    if getattr(model, "tree_rows_take_context", False):
        return spec.max_tree_nodes, "the draft tree's rows (a static-shape backend)"
    return spec.max_depth, "the draft tree's depth"


def speculative_generate(target, drafter: Drafter | None, prompt_ids: list[int], max_new_tokens: int,
                         params: SamplingParams = SamplingParams(), spec: SpecConfig = SpecConfig(),
                         stop_ids: frozenset[int] = frozenset(),
                         on_token=None) -> tuple[GenerationResult, SpecStats]:
    """Generate with the target's exact output, using `drafter` to propose tokens."""
    check_context(len(prompt_ids), max_new_tokens, target.config.max_context, *tree_room(target, spec))
    verifier = TargetVerifier(target, params, capacity=verifier_capacity(len(prompt_ids), max_new_tokens, spec),
                              pass_hook=spec.pruner)
    return run_speculative(verifier, drafter, prompt_ids, max_new_tokens, params, spec, stop_ids, on_token)


def verifier_capacity(prompt_tokens: int, max_new_tokens: int, spec: SpecConfig) -> int:
    """KV rows (tokens) a target verifier needs for one generation: the prompt,
    the new tokens and the largest tree of `spec`."""
    return kv_tokens(prompt_tokens=prompt_tokens, new_tokens=max_new_tokens, extra=spec.max_tree_nodes + 2)


def run_speculative(verifier, drafter: Drafter | None, prompt_ids: list[int], max_new_tokens: int,
                    params: SamplingParams = SamplingParams(), spec: SpecConfig = SpecConfig(),
                    stop_ids: frozenset[int] = frozenset(),
                    on_token=None, pace=None) -> tuple[GenerationResult, SpecStats]:
    """The speculative loop over any verifier: a `TargetVerifier` (the target in
    this process) or a `lever.remote.client.RemoteVerifier` (a verifier server).
    `verifier.start(prompt_ids)` prefills; `verifier.verify(tree, draft_probs)`
    returns a `Verdict` and commits it.  A LeverError raised mid-run (by
    `on_token` too: how `lever serve` stops a cancelled run) carries what was
    generated so far in its `partial_result` attribute and the run's counters
    in `partial_stats`.  pace: None, or a lever.autoregressive.PrefillPace
    that sizes the prefill chunks of the target (a verifier with
    `start_chunks`) and of a model drafter, and may stop the prefill between
    two chunks by raising (how `lever serve` cancels a prefill)."""
    if spec.mode != "ar" and drafter is None:
        raise LeverError(f"mode {spec.mode} needs a drafter (--draft)")
    check_context(len(prompt_ids), max_new_tokens, verifier.max_context, *tree_room(verifier, spec))
    result, stats = GenerationResult(prompt_ids=list(prompt_ids)), SpecStats()
    if max_new_tokens <= 0:
        return result, stats
    policy = spec.tree_policy(verifier.vocab_size)
    first_record = policy.observed
    probes_before = spec.pruner.stats.copy() if spec.pruner is not None else None
    ahead = None
    t_start = time.perf_counter()
    try:
        prefill_target(verifier, prompt_ids, pace)
        seed = verifier.seed            # the drafter draws sampled drafts with the target's noise
        result.seed = None if params.greedy else seed
        if drafter is not None:
            drafter.reset(prompt_ids, capacity=kv_tokens(prompt_tokens=len(prompt_ids), new_tokens=max_new_tokens,
                                                         extra=drafter_rows(spec) + 2),
                          **({"pace": pace} if pace is not None else {}))
        if spec.draft_ahead and drafter is not None and drafter.has_probabilities:
            ahead = DraftAhead(verifier, drafter, params, seed)
            stats.ahead = ahead.stats
        result.prefill_s = time.perf_counter() - t_start
        t_decode = time.perf_counter()
        root = prompt_ids[-1]
        while True:
            t0, busy0 = time.perf_counter(), verifier.io_busy_s()
            reused0 = drafter.reused_ahead if ahead else 0
            room = max_new_tokens - len(result.token_ids) - 1    # draft tokens the generation can still use
            grown = policy.grow(drafter, root, params, seed, room=room)
            tree = grown.tree
            t1, busy1 = time.perf_counter(), verifier.io_busy_s()
            if ahead:
                ahead.grew(drafter.reused_ahead - reused0)
                verdict = ahead.verify(grown)
            else:
                verdict = verifier.verify(tree, grown.draft_probs)
            accepted, next_token = verdict.accepted, verdict.next_token
            t3, busy3 = time.perf_counter(), verifier.io_busy_s()
            if drafter is not None:
                drafter.commit(tree, accepted, next_token)
            t4, busy4 = time.perf_counter(), verifier.io_busy_s()
            stats.iterations += 1
            stats.draft_nodes += len(tree) - 1
            stats.accepted += len(accepted)
            stats.tree_sizes.append(len(tree) - 1)
            stats.iteration_s += t4 - t0
            stats.draft_s += (t1 - t0) + (t4 - t3)
            if busy0 is None or stats.draft_io_s is None:
                stats.draft_io_s = None
            else:
                stats.draft_io_s += (busy1 - busy0) + (busy4 - busy3)
            stats.verify_s += verdict.verify_s
            stats.stall_s += verdict.stall_s
            stats.bytes_read += verdict.bytes_read
            stats.accept_s += verdict.accept_s
            policy.observe(grown, accepted, verify_s=verdict.verify_s, iteration_s=t4 - t0)
            if any(result.emit(tok, max_new_tokens, stop_ids, on_token)
                   for tok in [tree.token(j) for j in accepted] + [next_token]):
                break
            root = next_token
        result.decode_s = time.perf_counter() - t_decode
    except LeverError as e:
        e.partial_result, e.partial_stats = result, stats
        raise
    finally:
        if ahead:
            ahead.close()
        stats.policy = policy.report(since=first_record)
        if probes_before is not None:
            stats.probes = spec.pruner.stats.since(probes_before)
    return result, stats


def prefill_target(verifier, prompt_ids: list[int], pace=None) -> None:
    """`verifier.start(prompt_ids)`, or with a `pace` (lever.autoregressive.
    PrefillPace) its chunks one by one (`start_chunks`; a verifier without
    them, e.g. a remote one, prefills in one call)."""
    chunks = getattr(verifier, "start_chunks", None)
    if pace is None or chunks is None:
        verifier.start(prompt_ids)
        return
    for _ in chunks(prompt_ids, pace):
        pass


def drafter_rows(spec: SpecConfig) -> int:
    """Draft KV rows one iteration may add on top of the committed tokens: the
    nodes the drafter forwards (the root and at most max_tree_nodes others;
    mode lever expands only nodes among the first max_nodes of its pool),
    and with draft ahead the rows drafted ahead (kept into the next tree too)."""
    ahead = 2 * (WIDTH + MAX_FORWARDS) if spec.draft_ahead else 0
    return spec.max_tree_nodes + 1 + ahead

