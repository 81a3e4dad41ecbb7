"""One client's sequence on a verifier server: its KV cache (in a
`TargetVerifier`), its round counter and its last answer.

A session's methods run on the server's single compute thread, one at a
time, so a retried round that arrives while the first copy is still queued
finds the first one's answer stored and is replayed, never committed twice.
Its prefill is resumable: `prefill_step` runs one chunk of the prompt, so
the server can queue other sessions' rounds between the chunks.  A round is
`check_round` (replay or refusal, nothing changed), the verification, then
`commit_round`; a batching server (lever.remote.batcher) runs the
verification of several sessions' rounds as one target pass in between.
"""

from __future__ import annotations

import time

import numpy as np

from ..tree import TokenTree
from ..verify.target_pass import TargetVerifier, Verdict
from .protocol import OpenRequest, ProtocolError, RoundRequest


class VerifierSession:
    """`capacity`: tokens this session may hold (prompt + generated + a tree)."""

    def __init__(self, session_id: str, target, request: OpenRequest, capacity: int, max_tree_nodes: int):
        self.id = session_id
        self.open_id = request.open_id
        self.capacity = capacity
        self.verifier = TargetVerifier(target, request.params, capacity=capacity + max_tree_nodes + 2,
                                       seed=request.seed)
        self.next_round = 0
        self.last: tuple[int, str, dict] | None = None   # (round, tree digest, answer)
        self.last_used = time.monotonic()
        self.busy = 0                                      # requests of this session in flight
        self.prompt_tokens = len(request.prompt)
        self.emitted = 0                                   # tokens committed by rounds
        self.prefill_s = 0.0                               # seconds of prefill chunks so far
        self._prompt = request.prompt
        self._chunks = None
        # the server's bookkeeping of the open (event loop side)
        self.prefill = None                                # the asyncio task prefilling this session
        self.waiters: list = []                            # open requests waiting for the prefill
        self.answered = False                              # an open's answer was sent

    def prefill_step(self, chunk_tokens: int) -> bool:
        """Prefill the next `chunk_tokens` prompt tokens (one target forward);
        True once the whole prompt is in and the session can verify rounds."""
        t0 = time.perf_counter()
        if self._chunks is None:
            self._chunks = self.verifier.start_chunks(self._prompt, chunk_tokens)
        done = next(self._chunks, None) is None
        self.prefill_s += time.perf_counter() - t0
        return done

    @property
    def seed(self) -> int:
        return self.verifier.seed

    @property
    def position(self) -> int:
        return self.verifier.position

    def answer_round(self, req: RoundRequest) -> dict:
        """Verify one round (or replay the stored answer of a retried one)."""
        checked = self.check_round(req)
        if isinstance(checked, dict):
            return checked
        return self.commit_round(req, self.verifier.verify(checked))

    def check_round(self, req: RoundRequest) -> dict | TokenTree:
        """The stored answer of a retried round (a dict), or the tree this round
        verifies; ProtocolError for a round out of order, a tree of another
        root, a malformed tree or one over the session's room.  Changes nothing."""
        if self.last is not None and req.round == self.last[0]:
            if req.digest() != self.last[1]:
                raise ProtocolError(409, "round_conflict", f"round {req.round} was already answered for a "
                                                           f"different tree")
            return {**self.last[2], "replayed": True}
        if req.round != self.next_round:
            raise ProtocolError(409, "round_conflict", f"expected round {self.next_round}, got {req.round}")
        if req.tokens[0] != self.verifier.root:
            raise ProtocolError(409, "root_mismatch", f"the tree's root is token {req.tokens[0]} but the "
                                                      f"session's root is {self.verifier.root}")
        try:
            tree = TokenTree.from_arrays(np.asarray(req.tokens, dtype=np.int32),
                                         np.asarray(req.parents, dtype=np.int32))
        except ValueError as e:
            raise ProtocolError(422, "bad_tree", str(e)) from None
        needed = self.position + 1 + tree.max_depth()
        if needed > self.capacity:
            raise ProtocolError(422, "context_limit", f"this round would take the session to {needed} tokens, over "
                                                      f"its limit of {self.capacity}")
        return tree

    def commit_round(self, req: RoundRequest, verdict: Verdict) -> dict:
        """Record the verdict of round `req` (the verifier has committed it) and
        return its answer, stored for a retry."""
        self.emitted += len(verdict.accepted) + 1
        answer = {"round": req.round, "accepted": verdict.accepted, "next": verdict.next_token,
                  "position": self.position, "server_s": round(verdict.verify_s + verdict.accept_s, 6),
                  "calls": self.verifier.calls, "replayed": False}
        self.last = (req.round, req.digest(), answer)
        self.next_round += 1
        return answer
