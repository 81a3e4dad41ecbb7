"""Batched verification: the trees of several sequences scored in ONE target
pass, each sequence attending only its own KV cache and its own tree (a
block-diagonal mask), each answered exactly as if it ran alone.

- `verify_batch(verifiers, trees)`: one pass over the trees of several
  `TargetVerifier`s of one target (`NativeDecoder.forward_batch`), then each
  verifier's own acceptance rule and commit (`TargetVerifier.prepare` /
  `decide`, the very steps of a solo `verify`).  The native kernels are
  row-invariant, so every verdict is bitwise the solo one.
- `TreeBatcher`: the verifier server's gatherer (lever.remote.server).  The
  first round to arrive opens a window of `window_s` seconds; the rounds of
  other sessions arriving within it (at most `max_trees`, one per session)
  go into the same pass.  The pass starts before the window closes once
  every open session has a round queued (no other one could join: a lone
  client never waits).  While a batched pass runs, new rounds wait and go
  into the next one as soon as it ends (their window has passed by then), so
  a busy server batches more.  A session's second round in the queue (a
  retry) waits for the next pass, so it is replayed, never committed twice.

Units: seconds are seconds; trees are counted per session round.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ..errors import LeverError
from ..verify.target_pass import Verdict


def batching_unsupported(model) -> str | None:
    """Why `model` cannot run several sequences in one pass (None: it can).
    The native decoder can, resident or streamed from flash; the torch
    reference and the static-shape backends (ONNX Runtime, QNN) cannot."""
    if not hasattr(model, "forward_batch"):
        return f"the target {type(model).__name__} has no batched pass (use the native kernels, --kernels native)"
    layers = getattr(model, "layers", None)
    if layers is not None and not hasattr(layers, "begin_segments"):
        return f"the {getattr(layers, 'backend', 'static')} backend cannot run several sequences in one pass"
    return None


def verify_batch(verifiers, trees) -> list:
    """Verify trees[i] for verifiers[i] (distinct `TargetVerifier`s of one
    target, no pass hooks) in one target pass, and commit each outcome.

    Returns one outcome per verifier: its `Verdict` (verify_s: the shared
    pass's seconds; accept_s: its own rule and commit), or the exception its
    own step raised (a tree of the wrong root, a failed rule): a bad tree of
    one sequence leaves the others alone.  A failure of the pass itself
    concerns every sequence in it and is raised (their caches are as before
    the pass: rows are committed only at its end)."""
    if len(verifiers) != len(trees):
        raise ValueError(f"{len(verifiers)} verifiers but {len(trees)} trees")
    if not verifiers:
        return []
    target = verifiers[0].target
    if any(v.target is not target for v in verifiers):
        raise LeverError("a batched pass runs one target: every verifier must share it")
    if len({id(v) for v in verifiers}) != len(verifiers):
        raise LeverError("a verifier appears twice in one batched pass (one tree per sequence)")
    if any(v.pass_hook is not None for v in verifiers):
        raise LeverError("a batched pass cannot run pass hooks (early-exit probes): verify those alone")
    reason = batching_unsupported(target)
    if reason is not None:
        raise LeverError(reason)
    outcomes: list = [None] * len(verifiers)
    inputs = {}
    for i, (v, tree) in enumerate(zip(verifiers, trees)):
        try:
            inputs[i] = v.prepare(tree)
        except Exception as e:  # noqa: BLE001 -- this sequence's own failure, reported as its outcome
            outcomes[i] = e
    if not inputs:
        return outcomes
    idx = list(inputs)
    t0 = time.perf_counter()
    got = target.forward_batch([(inputs[i].tokens, inputs[i].positions, inputs[i].mask, verifiers[i].cache)
                                for i in idx], head=[inputs[i].head for i in idx])
    outs = dict(zip(idx, got))
    pass_s = time.perf_counter() - t0
    for i, p in inputs.items():
        try:
            verdict: Verdict = verifiers[i].decide(p, outs[i])
        except Exception as e:  # noqa: BLE001 -- as above
            outcomes[i] = e
            continue
        verdict.verify_s = pass_s
        outcomes[i] = verdict
    return outcomes


@dataclass
class PassStats:
    """Tree passes of a verifier server (/v1/metrics): `passes` target passes
    run over trees, `trees` session rounds scored in them, `batched_rounds`
    rounds scored in a pass with at least one other session's tree."""

    passes: int = 0
    trees: int = 0
    batched_rounds: int = 0
    largest: int = 0                     # trees in the largest pass

    def record(self, trees: int) -> None:
        if trees < 1:
            return
        self.passes += 1
        self.trees += trees
        self.batched_rounds += trees if trees > 1 else 0
        self.largest = max(self.largest, trees)

    def to_json(self) -> dict:
        return {"target_passes": self.passes, "batched_rounds": self.batched_rounds,
                "trees_per_pass": round(self.trees / self.passes, 4) if self.passes else None,
                "largest_pass_trees": self.largest}


@dataclass
class Waiting:
    """A round waiting for a pass: its session, its request, the future its
    answer goes to, and when it arrived (time.monotonic seconds)."""

    session: object
    request: object
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class TreeBatcher:
    """Gathers rounds into passes on the event loop (see the module doc).

    window_s: seconds the first waiting round holds the pass open for others
    (> 0); max_trees: rounds per pass at most (>= 1); run_batch: a coroutine
    function taking the list of `Waiting` of one pass, which must resolve
    every one's future (the server's: one compute job, then each answer);
    open_sessions: None, or a function returning how many sessions could send
    a round now (the pass starts as soon as each has one queued)."""

    def __init__(self, window_s: float, max_trees: int, run_batch, open_sessions=None):
        if not window_s > 0:
            raise ValueError(f"the batch window must be > 0 seconds, got {window_s}")
        if max_trees < 1:
            raise ValueError(f"max_trees must be >= 1, got {max_trees}")
        self.window_s, self.max_trees, self.run_batch = window_s, max_trees, run_batch
        self.open_sessions = open_sessions
        self.queue: list[Waiting] = []
        self._timer: asyncio.TimerHandle | None = None
        self._running = False

    def submit(self, session, request) -> asyncio.Future:
        """Queue a round; the future gets its answer (or its error)."""
        future = asyncio.get_running_loop().create_future()
        self.queue.append(Waiting(session, request, future))
        self._schedule()
        return future

    def _ready(self) -> int:
        """Rounds that could go into the next pass (one per session)."""
        return len({id(w.session) for w in self.queue})

    def _schedule(self) -> None:
        if self._running or not self.queue:
            return
        full = self.max_trees if self.open_sessions is None else min(self.max_trees, max(1, self.open_sessions()))
        if self._ready() >= full:
            self._flush()
            return
        if self._timer is None:
            delay = self.queue[0].arrived + self.window_s - time.monotonic()
            if delay <= 0:
                self._flush()
            else:
                self._timer = asyncio.get_running_loop().call_later(delay, self._window_closed)

    def _window_closed(self) -> None:
        self._timer = None
        if not self._running and self.queue:
            self._flush()

    def _take(self) -> list[Waiting]:
        """The next pass's rounds: the oldest round of each session, oldest first,
        at most max_trees; the others stay queued."""
        batch, seen, rest = [], set(), []
        for w in self.queue:
            if len(batch) < self.max_trees and id(w.session) not in seen:
                batch.append(w)
                seen.add(id(w.session))
            else:
                rest.append(w)
        self.queue = rest
        return batch

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch = self._take()
        self._running = True
        task = asyncio.ensure_future(self._run(batch))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _run(self, batch: list[Waiting]) -> None:
        try:
            await self.run_batch(batch)
        except BaseException as e:  # noqa: BLE001 -- every waiter hears it; none is left hanging
            for w in batch:
                if not w.future.done():
                    w.future.set_exception(e)
            if not isinstance(e, Exception):
                raise
        finally:
            self._running = False
            self._schedule()


__all__ = ["PassStats", "TreeBatcher", "Waiting", "batching_unsupported", "verify_batch"]
