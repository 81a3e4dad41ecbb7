"""Draft ahead: draft while the target verifies.

A streamed target's pass is mostly an I/O stall (and a remote verifier's a
network round trip), during which a core is free.  `DraftAhead.verify` runs
the verification in a worker thread and meanwhile has the drafter extend the
tree under verification where the draft's own path (its argmax, or its
position-keyed draw, at every node from the root) leaves the tree, at node
E (`AheadDrafter.extend_ahead`, lever.draft.base): E, its top `width`
children not in the tree in one forward, then the rank-0 chain below the
first child, one node per forward, until the verification is done or
`max_forwards` forwards have run.  When the target accepts the path to E
(as it does wherever it agrees with the draft) and its next token is one
of those children, the drafter keeps their rows and the next tree's
expansions of them cost no forward (`reused_ahead`).

Exactness is untouched: the verification never sees the nodes drafted
ahead, and the drafter keeps them in its own copy of the tree.  The native
forwards release the GIL, and the native thread pool runs a second caller's
parallel work on the calling thread, so the draft forward and the target
pass run side by side.
"""

from __future__ import annotations

import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..sampling import SamplingParams
from .base import AheadDrafter, Grown

MAX_FORWARDS = 8      # draft forwards ahead per verification at most
WIDTH = 4             # children of E run ahead (the next root is one of them if any)


@dataclass
class AheadStats:
    """Drafting ahead over a run; seconds are wall time."""

    forwards: int = 0              # draft forwards run ahead
    nodes: int = 0                 # tree nodes they ran
    drafting_s: float = 0.0        # seconds of those forwards (beside the verification)
    overrun_s: float = 0.0         # part of it after the verification had finished (on the critical path)
    reused_iterations: int = 0     # trees that took at least one expansion from rows drafted ahead
    reused_nodes: int = 0          # expansions served from rows drafted ahead (no forward)

    @property
    def hidden_share(self) -> float:
        """Share of the ahead drafting that ran while the verification was in flight."""
        return round(1.0 - self.overrun_s / self.drafting_s, 4) if self.drafting_s > 0 else 0.0

    def to_json(self) -> dict:
        return {"forwards": self.forwards, "nodes": self.nodes,
                "reused_iterations": self.reused_iterations, "reused_nodes": self.reused_nodes,
                "drafting_s": round(self.drafting_s, 4), "overrun_s": round(self.overrun_s, 4),
                "hidden_share": self.hidden_share}


class DraftAhead:
    """Verifies each tree in a worker thread while `drafter` drafts ahead
    (see the module doc).  params, seed: the sequence's sampling (the chain
    ahead follows the draft's position-keyed draws).  `close` ends the worker."""

    def __init__(self, verifier, drafter: AheadDrafter, params: SamplingParams, seed: int | None,
                 max_forwards: int = MAX_FORWARDS, width: int = WIDTH):
        if max_forwards < 1 or width < 1:
            raise ValueError(f"draft ahead needs max_forwards and width >= 1, got {max_forwards}, {width}")
        self.verifier, self.drafter, self.params, self.seed = verifier, drafter, params, seed
        self.max_forwards, self.width = max_forwards, width
        self.stats = AheadStats()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lever-verify")

    def verify(self, grown: Grown):
        """`verifier.verify(grown.tree, grown.draft_probs)`, drafting ahead meanwhile."""
        job = self._worker.submit(_timed_verify, self.verifier, grown)
        end = time.perf_counter()
        try:
            for _ in range(self.max_forwards):
                if job.done():
                    break
                t0 = time.perf_counter()
                ran = self.drafter.extend_ahead(grown.tree, self.width, self.params, self.seed)
                end = time.perf_counter()
                if not ran:
                    break
                self.stats.forwards += 1
                self.stats.nodes += ran
                self.stats.drafting_s += end - t0
        finally:                        # the verification is always joined, even if drafting ahead failed
            futures.wait([job])
        verdict, verified_at = job.result()
        self.stats.overrun_s += max(0.0, end - verified_at)
        return verdict

    def grew(self, reused_nodes: int) -> None:
        """The tree just grown took `reused_nodes` expansions from rows drafted ahead."""
        if reused_nodes:
            self.stats.reused_iterations += 1
            self.stats.reused_nodes += reused_nodes

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def _timed_verify(verifier, grown: Grown):
    """(the verdict, the perf_counter second the verification finished)."""
    verdict = verifier.verify(grown.tree, grown.draft_probs)
    return verdict, time.perf_counter()
